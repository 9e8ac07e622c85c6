// The float weight types (F32, BF16, F16) converted to f32 with AVX2 + F16C: the matrix
// products of ops/avx2/ and ops/avx512/ both pack their weight panels with these.
//
// Everything here has internal linkage on purpose: the two folders are compiled with
// different instruction sets, and an inline function with external linkage would leave one
// copy for the linker to pick, possibly the AVX-512 one for the AVX2 caller.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "base/dtype.h"

namespace polestar::avx2 {
namespace {  // NOLINT(google-build-namespaces): see above

// Transposes the 8x8 block r[row][col] -> r[col][row].
inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Loads eight 16-bit values at k..k+7 of rows lane0[j] (low lane) and lane1[j] (high lane)
// for j < 8 and transposes within each lane: out[kk] holds value kk of the eight low-lane
// rows in its low lane and of the eight high-lane rows in its high lane.
inline void LoadTranspose16(const uint8_t* const lane0[8], const uint8_t* const lane1[8],
                            int64_t byte_offset, __m256i out[8]) {
  __m256i r[8];
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(lane1[j] + byte_offset),
                               reinterpret_cast<const __m128i*>(lane0[j] + byte_offset));
  }
  __m256i lo[4], hi[4];  // pairs of rows interleaved: values 0-3 / 4-7
  for (int p = 0; p < 4; ++p) {
    lo[p] = _mm256_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
    hi[p] = _mm256_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
  }
  const __m256i u0 = _mm256_unpacklo_epi32(lo[0], lo[1]), u1 = _mm256_unpackhi_epi32(lo[0], lo[1]);
  const __m256i u2 = _mm256_unpacklo_epi32(lo[2], lo[3]), u3 = _mm256_unpackhi_epi32(lo[2], lo[3]);
  const __m256i u4 = _mm256_unpacklo_epi32(hi[0], hi[1]), u5 = _mm256_unpackhi_epi32(hi[0], hi[1]);
  const __m256i u6 = _mm256_unpacklo_epi32(hi[2], hi[3]), u7 = _mm256_unpackhi_epi32(hi[2], hi[3]);
  out[0] = _mm256_unpacklo_epi64(u0, u2);
  out[1] = _mm256_unpackhi_epi64(u0, u2);
  out[2] = _mm256_unpacklo_epi64(u1, u3);
  out[3] = _mm256_unpackhi_epi64(u1, u3);
  out[4] = _mm256_unpacklo_epi64(u4, u6);
  out[5] = _mm256_unpackhi_epi64(u4, u6);
  out[6] = _mm256_unpacklo_epi64(u5, u7);
  out[7] = _mm256_unpackhi_epi64(u5, u7);
}

// Each Format converts its type to f32 two ways: eight consecutive values of one row
// (Load8, dot path) and 16 rows x 8 values into panel order (Pack16x8, panel path:
// out[kk * stride + j] = row j, value k + kk; out and stride keep 32-byte alignment).
struct F32Format {
  static constexpr int kBytes = 4;
  static float Load1(const uint8_t* p) {
    float value;
    std::memcpy(&value, p, 4);
    return value;
  }
  static __m256 Load8(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out, int64_t stride) {
    for (int half = 0; half < 2; ++half) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = Load8(rows[8 * half + j] + 4 * k);
      Transpose8x8(r);
      for (int kk = 0; kk < 8; ++kk) _mm256_store_ps(out + kk * stride + 8 * half, r[kk]);
    }
  }
};

struct Bf16Format {
  static constexpr int kBytes = 2;
  static float Load1(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return Bf16ToF32(bits);
  }
  static __m256 Load8(const uint8_t* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out, int64_t stride) {
    // Interleaving zeros below a lane's values 0-3 (unpacklo) widens them to f32, so the
    // low lane must hold rows 0-3, 8-11 and the high lane rows 4-7, 12-15 for the two
    // halves to come out as rows 0-7 and 8-15.
    const uint8_t* const lane0[8] = {rows[0], rows[1], rows[2],  rows[3],
                                     rows[8], rows[9], rows[10], rows[11]};
    const uint8_t* const lane1[8] = {rows[4],  rows[5],  rows[6],  rows[7],
                                     rows[12], rows[13], rows[14], rows[15]};
    __m256i t[8];
    LoadTranspose16(lane0, lane1, 2 * k, t);
    const __m256i zero = _mm256_setzero_si256();
    for (int kk = 0; kk < 8; ++kk) {
      _mm256_store_ps(out + kk * stride, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, t[kk])));
      _mm256_store_ps(out + kk * stride + 8,
                      _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, t[kk])));
    }
  }
};

struct F16Format {
  static constexpr int kBytes = 2;
  static float Load1(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return F16ToF32(bits);
  }
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out, int64_t stride) {
    __m256i t[8];
    LoadTranspose16(rows, rows + 8, 2 * k, t);
    for (int kk = 0; kk < 8; ++kk) {
      _mm256_store_ps(out + kk * stride, _mm256_cvtph_ps(_mm256_castsi256_si128(t[kk])));
      _mm256_store_ps(out + kk * stride + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(t[kk], 1)));
    }
  }
};

}  // namespace
}  // namespace polestar::avx2
