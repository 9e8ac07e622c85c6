// AVX-512 VNNI integer matrix products for block-quantised weights (see ops/quant.h): the
// AVX2 kernels' scheme at twice the width, with vpdpbusd (u8 x s8, four products summed
// straight into int32, no int16 stage to saturate) in place of maddubs + madd. Weight rows
// are unpacked once per call (levels by avx2::WeightLevels) and run against 4 activation
// rows at a time. Compiled with POLESTAR_AVX512_FLAGS.
//
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() values that its
// -Wmaybe-uninitialized reports once inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "ops/quant.h"

namespace polestar::avx512 {
namespace {

float LoadF16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// Lanes 0-7 hold s[0], lanes 8-15 s[1] (or 0 when `pair` is false: s[1] is not read).
__m512 PairScales(const float* s, bool pair) {
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  // _mm_loadl_epi64 reads through an unaligned type: the pair need not be 8-byte aligned.
  const __m128 two = pair ? _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)))
                          : _mm_load_ss(s);
  return _mm512_permutexvar_ps(halves, _mm512_zextps128_ps512(two));
}

// 64 bytes from p, or 32 and zeros above when `pair` is false.
__m512i LoadBlocks(const void* p, bool pair) {
  return pair ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);
}

// A Q8_0 / Q4_0 row: signed levels (Q8_0's bytes, Q4_0's nibbles - 8) and block scales.
// vpdpbusd wants one unsigned operand: the kernel offsets the activation levels by 128
// (x + 128 in [1, 255]) and starts each sum at -128 * (the sum of the lane's four levels).
struct Levels32Row {
  std::vector<int8_t> levels;        // [K]
  std::vector<int32_t> corrections;  // [K / 4]: -128 * (sum of each four levels), exact
  std::vector<float> scales;         // [K / 32]
};

void Unpack(DType type, const uint8_t* row, int64_t k, Levels32Row* out) {
  out->levels.resize(size_t(k));
  out->corrections.resize(size_t(k / 4));
  out->scales.resize(size_t(k / 32));
  avx2::WeightLevels(type, row, k, reinterpret_cast<uint8_t*>(out->levels.data()));
  const __m256i offset = _mm256_set1_epi8(char(0x80));
  for (int64_t j = 0; j < k; j += 32) {
    const __m256i levels =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&out->levels[size_t(j)]));
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), offset, levels);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out->corrections[size_t(j / 4)]),
                        _mm256_sub_epi32(_mm256_setzero_si256(), sums));
  }
  for (int64_t b = 0; b < k / 32; ++b) out->scales[size_t(b)] = LoadF16(row + b * BlockBytes(type));
}

// A Q4_K / Q5_K / Q6_K row (see KQuantMultipliers). The mins enter as floats: per group
// dmin * min against scale * (sum of the group's activation levels), one FMA of 16 lanes per
// super-block and pair of rows, instead of an integer product, a conversion and a scaling.
struct KQuantRow {
  std::vector<uint8_t> levels;     // [K] unsigned levels
  std::vector<int32_t> scales;     // [K / 16]: each group's scale as uint16 bits in an int32,
                                   // so vpdpwssd's high int16 factor is 0 (see Tile)
  std::vector<float> scaled_mins;  // [K / 16]: dmin * min
  std::vector<float> d;            // [K / 256]
};

void Unpack(DType type, const uint8_t* row, int64_t k, KQuantRow* out) {
  out->levels.resize(size_t(k));
  out->scales.resize(size_t(k / 16));
  out->scaled_mins.resize(size_t(k / 16));
  out->d.resize(size_t(k / 256));
  avx2::WeightLevels(type, row, k, out->levels.data());
  for (int64_t b = 0; b < k / 256; ++b) {
    const KQuantMultipliers mul = KQuantMultipliersOf(type, row + b * BlockBytes(type));
    for (int g = 0; g < 16; ++g) {
      out->scales[size_t(16 * b + g)] = int32_t(uint16_t(mul.scales[g]));
      out->scaled_mins[size_t(16 * b + g)] = mul.dmin * float(mul.mins[g]);
    }
    out->d[size_t(b)] = mul.d;
  }
}

// --- register tiles: kRows activation rows against kCols unpacked weight rows,
// y[r * ldy + c]; every (r, c) pair runs the same operations in every tile shape. ---

template <int kRows, int kCols>
void Tile(const QuantizedActivations& x, int64_t i0, const Levels32Row* w, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 32;
  const int8_t* xq = &x.q[size_t(i0 * k)];
  const float* x_scales = &x.scales[size_t(i0 * blocks)];
  const __m512i offset = _mm512_set1_epi8(char(0x80));
  __m512 acc[kRows][kCols];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; b += 2) {  // two blocks per register
    const bool pair = b + 1 < blocks;
    __m512i levels[kCols], corrections[kCols];
    __m512 w_scales[kCols];
    for (int c = 0; c < kCols; ++c) {
      levels[c] = LoadBlocks(&w[c].levels[size_t(32 * b)], pair);
      corrections[c] = LoadBlocks(&w[c].corrections[size_t(8 * b)], pair);
      w_scales[c] = PairScales(&w[c].scales[size_t(b)], pair);
    }
    for (int r = 0; r < kRows; ++r) {
      // x + 128 as unsigned bytes (x never -128); a missing second block reads as 0 + 128
      // against zero levels and corrections, adding nothing.
      const __m512i xv = _mm512_xor_si512(LoadBlocks(xq + r * k + 32 * b, pair), offset);
      const __m512 x_scale = PairScales(x_scales + r * blocks + b, pair);
      for (int c = 0; c < kCols; ++c) {
        const __m512 dots = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corrections[c], xv, levels[c]));
        acc[r][c] = _mm512_fmadd_ps(dots, _mm512_mul_ps(w_scales[c], x_scale), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
  }
}

template <int kRows, int kCols>
void Tile(const QuantizedActivations& x, int64_t i0, const KQuantRow* w, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 256;
  const int8_t* xq = &x.q[size_t(i0 * k)];
  const float* x_scales = &x.scales[size_t(i0 * blocks)];
  const int16_t* x_sums = &x.group_sums[size_t(i0 * k / 16)];
  // Lane j of a 64-value chunk covers values 4j..4j+3, in group j / 4.
  const __m512i group_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[kRows][kCols];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i dots[kRows][kCols];
    for (auto& row : dots) {
      for (auto& d : row) d = _mm512_setzero_si512();
    }
    for (int chunk = 0; chunk < 4; ++chunk) {
      const size_t j = size_t(256 * b + 64 * chunk);
      __m512i levels[kCols], scales[kCols];
      for (int c = 0; c < kCols; ++c) {
        levels[c] = _mm512_loadu_si512(&w[c].levels[j]);
        scales[c] = _mm512_permutexvar_epi32(
            group_of_lane, _mm512_zextsi128_si512(_mm_loadu_si128(
                               reinterpret_cast<const __m128i*>(&w[c].scales[j / 16]))));
      }
      for (int r = 0; r < kRows; ++r) {
        const __m512i xv = _mm512_loadu_si512(xq + r * k + j);
        for (int c = 0; c < kCols; ++c) {
          // A lane's four products: |.| <= 4 * 63 * 127 = 32004, so it is its own low int16
          // and vpdpwssd's (low * scale + high * 0) applies the group's scale exactly.
          const __m512i four = _mm512_dpbusd_epi32(_mm512_setzero_si512(), levels[c], xv);
          dots[r][c] = _mm512_dpwssd_epi32(dots[r][c], four, scales[c]);
        }
      }
    }
    __m512 d[kCols], scaled_mins[kCols];
    for (int c = 0; c < kCols; ++c) {
      d[c] = _mm512_set1_ps(w[c].d[size_t(b)]);
      scaled_mins[c] = _mm512_loadu_ps(&w[c].scaled_mins[size_t(16 * b)]);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512 dx = _mm512_set1_ps(x_scales[r * blocks + b]);
      const __m512 scaled_sums = _mm512_mul_ps(
          dx, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(x_sums + r * (k / 16) + 16 * b)))));
      for (int c = 0; c < kCols; ++c) {
        acc[r][c] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r][c]), _mm512_mul_ps(d[c], dx), acc[r][c]);
        acc[r][c] = _mm512_fnmadd_ps(scaled_sums, scaled_mins[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
  }
}

// Activation rows per tile, and weight rows per tile by row kind, measured: 4 x 4 for the
// 32-blocks; 4 x 2 for the K-quants, whose 16 accumulators and 4 x 2 level and scale
// registers at 4 x 4 spill (about 12% slower at M = 96).
constexpr int kTileRows = 4;
template <class Row>
constexpr int kTileCols = std::is_same_v<Row, KQuantRow> ? 2 : 4;

template <class Row, int kRows>
void TileOfRows(int cols, const QuantizedActivations& x, int64_t i0, const Row* w, float* y,
                int64_t ldy) {
  switch (cols) {
    case 4:
      Tile<kRows, 4>(x, i0, w, y, ldy);
      break;
    case 3:
      Tile<kRows, 3>(x, i0, w, y, ldy);
      break;
    case 2:
      Tile<kRows, 2>(x, i0, w, y, ldy);
      break;
    default:
      Tile<kRows, 1>(x, i0, w, y, ldy);
      break;
  }
}

// Weight rows kTileCols at a time are unpacked once, then run against every activation row.
template <class Row>
void Columns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
             float* y, int64_t ldy) {
  Row rows[kTileCols<Row>];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols<Row>) {
    const int cols = int(std::min<int64_t>(kTileCols<Row>, n_end - n0));
    for (int c = 0; c < cols; ++c) Unpack(w.dtype, w.Row(n0 + c), w.cols, &rows[c]);
    float* y_tile = y + (n0 - n_begin);
    for (int64_t i0 = 0; i0 < x.rows; i0 += kTileRows) {
      float* y_rows = y_tile + i0 * ldy;
      switch (std::min<int64_t>(kTileRows, x.rows - i0)) {
        case 4:
          TileOfRows<Row, 4>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 3:
          TileOfRows<Row, 3>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 2:
          TileOfRows<Row, 2>(cols, x, i0, rows, y_rows, ldy);
          break;
        default:
          TileOfRows<Row, 1>(cols, x, i0, rows, y_rows, ldy);
          break;
      }
    }
  }
}

}  // namespace

void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy) {
  PS_CHECK(x.cols == w.cols && x.block == ActivationBlock(w.dtype));
  if (BlockSize(w.dtype) == 32) {
    Columns<Levels32Row>(x, w, n_begin, n_end, y, ldy);
  } else {
    Columns<KQuantRow>(x, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx512
