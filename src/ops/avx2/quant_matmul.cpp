// AVX2 kernels for block-quantised weights. A few weight rows at a time are dequantised
// into an L1/L2-resident fp32 tile (bit-identical to the scalar DequantizeValues: the same
// multiply and subtract, no fused rounding) and multiplied with every input row by a 4 x 2
// register-blocked FMA kernel, so each weight byte is read once per matmul and the
// dequantisation cost is shared by all M inputs. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "ops/quant.h"

namespace polestar::avx2 {
namespace {

float LoadF16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// Eight signed / unsigned bytes (the low 8 of `bytes`) to eight floats.
__m256 I8ToF32(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }
__m256 U8ToF32(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

// out[32] = scale * q - offset for 32 unsigned levels in a 256-bit register.
void StoreAffine32(__m256i levels, float scale, float offset, float* out) {
  const __m256 vs = _mm256_set1_ps(scale), vo = _mm256_set1_ps(offset);
  const __m128i lo = _mm256_castsi256_si128(levels), hi = _mm256_extracti128_si256(levels, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int p = 0; p < 4; ++p) {
    _mm256_storeu_ps(out + 8 * p, _mm256_sub_ps(_mm256_mul_ps(vs, U8ToF32(parts[p])), vo));
  }
}

// out[16] = scale * q for 16 signed levels in a 128-bit register.
void StoreScaled16(__m128i levels, float scale, float* out) {
  const __m256 vs = _mm256_set1_ps(scale);
  _mm256_storeu_ps(out, _mm256_mul_ps(vs, I8ToF32(levels)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(vs, I8ToF32(_mm_srli_si128(levels, 8))));
}

void ScaleMinK4(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *min = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

void DequantizeQ8_0(const uint8_t* block, float* out) {
  const __m256 d = _mm256_set1_ps(LoadF16(block));
  for (int p = 0; p < 4; ++p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * p));
    _mm256_storeu_ps(out + 8 * p, _mm256_mul_ps(I8ToF32(q), d));
  }
}

void DequantizeQ4_0(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
  const __m128i nibble = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, nibble), eight);
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble), eight);
  // The scalar form is float(q) * d; multiplication commutes exactly.
  StoreScaled16(lo, d, out);
  StoreScaled16(hi, d, out + 16);
}

void DequantizeQ4_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block), dmin = LoadF16(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int chunk = 0; chunk < 4; ++chunk) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * chunk));
    uint8_t sc, m;
    ScaleMinK4(2 * chunk, scales, &sc, &m);
    StoreAffine32(_mm256_and_si256(packed, nibble), d * sc, dmin * m, out + 64 * chunk);
    ScaleMinK4(2 * chunk + 1, scales, &sc, &m);
    StoreAffine32(_mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble), d * sc, dmin * m,
                  out + 64 * chunk + 32);
  }
}

void DequantizeQ5_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block), dmin = LoadF16(block + 2);
  const uint8_t* scales = block + 4;
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
  const uint8_t* qs = block + 48;
  const __m256i nibble = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  for (int chunk = 0; chunk < 4; ++chunk) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * chunk));
    for (int half = 0; half < 2; ++half) {
      const __m256i bit = _mm256_set1_epi8(char(1 << (2 * chunk + half)));
      const __m256i high =
          _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
      const __m256i low = half == 0 ? _mm256_and_si256(packed, nibble)
                                    : _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      uint8_t sc, m;
      ScaleMinK4(2 * chunk + half, scales, &sc, &m);
      StoreAffine32(_mm256_or_si256(low, high), d * sc, dmin * m, out + 64 * chunk + 32 * half);
    }
  }
}

void DequantizeQ6_K(const uint8_t* block, float* out) {
  const float d = LoadF16(block + 208);
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const __m256i nibble = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  const __m256i bias = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = block + 64 * half;
    const uint8_t* qh_bytes = block + 128 + 32 * half;
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh_bytes));
    // Four groups of 32 values: low/high nibble of ql0/ql1, each with two bits of qh.
    const __m256i groups[4] = {
        _mm256_or_si256(_mm256_and_si256(ql0, nibble),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2)),
        _mm256_or_si256(_mm256_and_si256(ql1, nibble),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nibble),
                        _mm256_and_si256(qh, top2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nibble),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2)),
    };
    const int8_t* sc = scales + 8 * half;
    float* o = out + 128 * half;
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_sub_epi8(groups[g], bias);
      StoreScaled16(_mm256_castsi256_si128(q), d * float(sc[2 * g]), o + 32 * g);
      StoreScaled16(_mm256_extracti128_si256(q, 1), d * float(sc[2 * g + 1]), o + 32 * g + 16);
    }
  }
}

using BlockDequantizer = void (*)(const uint8_t*, float*);

BlockDequantizer DequantizerFor(DType type) {
  switch (type) {
    case DType::kQ8_0:
      return DequantizeQ8_0;
    case DType::kQ4_0:
      return DequantizeQ4_0;
    case DType::kQ4_K:
      return DequantizeQ4_K;
    case DType::kQ5_K:
      return DequantizeQ5_K;
    case DType::kQ6_K:
      return DequantizeQ6_K;
    default:
      return nullptr;
  }
}

float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r * ldy + c] = x_r · w_c for kRows input rows (ldx apart) and kCols weight rows (K
// apart); K is a multiple of 8.
template <int kRows, int kCols>
void DotTile(const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy) {
  __m256 acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < k; j += 8) {
    __m256 wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = _mm256_loadu_ps(w + c * k + j);
    for (int r = 0; r < kRows; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + j);
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = HorizontalSum(acc[r][c]);
  }
}

template <int kCols>
void DotRows(const float* x, int64_t m, const float* w, int64_t k, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) DotTile<4, kCols>(x + i * k, k, w, k, y + i * ldy, ldy);
  for (; i < m; ++i) DotTile<1, kCols>(x + i * k, k, w, k, y + i * ldy, ldy);
}

}  // namespace

void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out) {
  const BlockDequantizer fn = DequantizerFor(type);
  PS_CHECK(fn != nullptr && n % BlockSize(type) == 0);
  const int block_size = BlockSize(type), block_bytes = BlockBytes(type);
  for (int64_t b = 0; b < n / block_size; ++b) fn(src + b * block_bytes, out + b * block_size);
}

void QuantMatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin,
                        int64_t n_end, float* y, int64_t ldy) {
  constexpr int64_t kTileRows = 8;  // weight rows dequantised together
  const int64_t k = w.cols;
  std::vector<float> tile(static_cast<size_t>(kTileRows * k));  // [kTileRows, K]
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, n_end - n0);
    for (int64_t r = 0; r < rows; ++r)
      avx2::DequantizeValues(w.dtype, w.Row(n0 + r), k, &tile[r * k]);
    float* y_tile = y + (n0 - n_begin);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) DotRows<2>(x, m, &tile[r * k], k, y_tile + r, ldy);
    if (r < rows) DotRows<1>(x, m, &tile[r * k], k, y_tile + r, ldy);
  }
}

}  // namespace polestar::avx2
