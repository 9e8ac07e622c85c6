// AVX-512 VNNI integer matrix products for block-quantised weights (see ops/quant.h), with
// vpdpbusd (u8 x s8, four products summed straight into int32, no int16 stage to saturate).
//   Q8_0 / Q4_0: lane r of a register is activation row r of a group of 16 and each weight's
//   four levels are broadcast to all lanes, so eight vpdpbusd leave every lane with a whole
//   block's integer sum, and one conversion, product and FMA scale 16 rows' blocks (512
//   products) at once. (Scaling each register's two half-blocks on its own, as the AVX2
//   scheme does, costs a conversion, a product and an FMA per 64 products: the Q8_0 path
//   was slower than F16's FMAs.) One to three rows put blocks in the lanes instead, with the
//   same float steps, so a row's outputs have the same bits at any M.
//   K-quants: the AVX2 kernels' scheme at twice the width, 4 activation rows against 2
//   weight rows, with the groups' scales applied in integer.
// Weight rows are unpacked once per call (levels by avx2::WeightLevels). Compiled with
// POLESTAR_AVX512_FLAGS.
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

// --- K-quants: kRows activation rows against kCols unpacked weight rows, y[r * ldy + c];
// every (r, c) pair runs the same operations in every tile shape. ---

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

// Activation rows per tile and weight rows per tile, measured: at 4 x 4 the 16 accumulators
// and 4 x 2 level and scale registers spill (about 12% slower at M = 96 than 4 x 2).
constexpr int kTileRows = 4, kTileCols = 2;

template <int kRows>
void TileOfRows(int cols, const QuantizedActivations& x, int64_t i0, const KQuantRow* w, float* y,
                int64_t ldy) {
  if (cols == 2) {
    Tile<kRows, 2>(x, i0, w, y, ldy);
  } else {
    Tile<kRows, 1>(x, i0, w, y, ldy);
  }
}

// Weight rows kTileCols at a time are unpacked once, then run against every activation row.
void KQuantColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                   int64_t n_end, float* y, int64_t ldy) {
  KQuantRow rows[kTileCols];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols) {
    const int cols = int(std::min<int64_t>(kTileCols, n_end - n0));
    for (int c = 0; c < cols; ++c) Unpack(w.dtype, w.Row(n0 + c), w.cols, &rows[c]);
    float* y_tile = y + (n0 - n_begin);
    for (int64_t i0 = 0; i0 < x.rows; i0 += kTileRows) {
      float* y_rows = y_tile + i0 * ldy;
      switch (std::min<int64_t>(kTileRows, x.rows - i0)) {
        case 4:
          TileOfRows<4>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 3:
          TileOfRows<3>(cols, x, i0, rows, y_rows, ldy);
          break;
        case 2:
          TileOfRows<2>(cols, x, i0, rows, y_rows, ldy);
          break;
        default:
          TileOfRows<1>(cols, x, i0, rows, y_rows, ldy);
          break;
      }
    }
  }
}

// --- Q8_0 / Q4_0: 16 activation rows per register (see the top of the file) ---
// The weight is the unsigned operand (level + 128); each lane's sum starts at -128 * (the
// sum of its row's levels in the block), so it is exact.
constexpr int kLanes = 16;

// Activation levels regrouped for the row-lane kernel: word j (values 4j..4j+3) of the 16
// rows of a group side by side; rows past M are zero and scale 0.
struct RowLaneActivations {
  int64_t groups = 0, words = 0, blocks = 0;  // ceil(M / 16), K / 4, K / 32
  std::vector<int8_t> levels;                 // [groups, words, 16, 4]
  std::vector<int32_t> offsets;               // [groups, blocks, 16]: -128 * (block sum)
  std::vector<float> scales;                  // [groups, blocks, 16]
};

void Regroup(const QuantizedActivations& x, RowLaneActivations* out) {
  out->groups = (x.rows + kLanes - 1) / kLanes;
  out->words = x.cols / 4;
  out->blocks = x.cols / 32;
  out->levels.assign(size_t(out->groups * out->words * kLanes * 4), 0);
  out->offsets.assign(size_t(out->groups * out->blocks * kLanes), 0);
  out->scales.assign(size_t(out->groups * out->blocks * kLanes), 0.0f);
  for (int64_t i = 0; i < x.rows; ++i) {
    const int64_t g = i / kLanes, lane = i % kLanes;
    const int8_t* row = &x.q[size_t(i * x.cols)];
    int8_t* dst = &out->levels[size_t((g * out->words * kLanes + lane) * 4)];
    for (int64_t j = 0; j < out->words; ++j) std::memcpy(dst + j * kLanes * 4, row + 4 * j, 4);
    for (int64_t b = 0; b < out->blocks; ++b) {
      int32_t sum = 0;
      for (int v = 0; v < 32; ++v) sum += row[32 * b + v];
      const size_t at = size_t((g * out->blocks + b) * kLanes + lane);
      out->offsets[at] = -128 * sum;
      out->scales[at] = x.scales[size_t(i * out->blocks + b)];
    }
  }
}

// A Q8_0 / Q4_0 row as the row-lane kernel broadcasts it: level + 128 as unsigned bytes.
struct UnsignedLevelsRow {
  std::vector<uint8_t> levels;  // [K]
  std::vector<float> scales;    // [K / 32]
};

void Unpack(DType type, const uint8_t* row, int64_t k, UnsignedLevelsRow* out) {
  out->levels.resize(size_t(k));
  out->scales.resize(size_t(k / 32));
  avx2::WeightLevels(type, row, k, out->levels.data());
  const __m256i offset = _mm256_set1_epi8(char(0x80));
  for (int64_t j = 0; j < k; j += 32) {
    uint8_t* levels = &out->levels[size_t(j)];
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(levels),
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<__m256i*>(levels)), offset));
  }
  for (int64_t b = 0; b < k / 32; ++b) out->scales[size_t(b)] = LoadF16(row + b * BlockBytes(type));
}

// y[r * ldy + c] for the rows of group g and kCols weight rows.
template <int kCols>
void RowLaneTile(const RowLaneActivations& x, int64_t g, int64_t rows, const UnsignedLevelsRow* w,
                 float* y, int64_t ldy) {
  const int8_t* x_levels = &x.levels[size_t(g * x.words * kLanes * 4)];
  const int32_t* x_offsets = &x.offsets[size_t(g * x.blocks * kLanes)];
  const float* x_scales = &x.scales[size_t(g * x.blocks * kLanes)];
  __m512 acc[kCols];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.blocks; ++b) {
    const __m512i offsets = _mm512_loadu_si512(x_offsets + b * kLanes);
    __m512i sums[kCols];
    for (auto& s : sums) s = offsets;
    for (int64_t j = 8 * b; j < 8 * b + 8; ++j) {
      const __m512i xv = _mm512_loadu_si512(x_levels + j * kLanes * 4);
      for (int c = 0; c < kCols; ++c) {
        int32_t four;
        std::memcpy(&four, &w[c].levels[size_t(4 * j)], 4);
        sums[c] = _mm512_dpbusd_epi32(sums[c], _mm512_set1_epi32(four), xv);
      }
    }
    const __m512 scales = _mm512_loadu_ps(x_scales + b * kLanes);
    for (int c = 0; c < kCols; ++c) {
      acc[c] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[c]),
                          _mm512_mul_ps(scales, _mm512_set1_ps(w[c].scales[size_t(b)])), acc[c]);
    }
  }
  for (int c = 0; c < kCols; ++c) {
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, acc[c]);
    for (int64_t r = 0; r < rows; ++r) y[r * ldy + c] = lanes[r];
  }
}

constexpr int kRowLaneCols = 4;

void RowLaneColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                    int64_t n_end, float* y, int64_t ldy) {
  // Regrouped per call and thread: M * K bytes, against N * M * K products.
  thread_local RowLaneActivations regrouped;
  Regroup(x, &regrouped);
  UnsignedLevelsRow rows[kRowLaneCols];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kRowLaneCols) {
    const int cols = int(std::min<int64_t>(kRowLaneCols, n_end - n0));
    for (int c = 0; c < cols; ++c) Unpack(w.dtype, w.Row(n0 + c), w.cols, &rows[c]);
    for (int64_t g = 0; g < regrouped.groups; ++g) {
      const int64_t rows_here = std::min<int64_t>(kLanes, x.rows - g * kLanes);
      float* y_tile = y + g * kLanes * ldy + (n0 - n_begin);
      switch (cols) {
        case 4:
          RowLaneTile<4>(regrouped, g, rows_here, rows, y_tile, ldy);
          break;
        case 3:
          RowLaneTile<3>(regrouped, g, rows_here, rows, y_tile, ldy);
          break;
        case 2:
          RowLaneTile<2>(regrouped, g, rows_here, rows, y_tile, ldy);
          break;
        default:
          RowLaneTile<1>(regrouped, g, rows_here, rows, y_tile, ldy);
          break;
      }
    }
  }
}

// --- Q8_0 / Q4_0 for one to three activation rows: 16 blocks per register ---
// With so few rows most row lanes would idle, so lanes hold blocks instead: vpdpbusd over
// the weight's and the row's bytes in storage order gives four-product sums, which a
// transpose-and-add tree turns into 16 blocks' exact sums. The float steps then run as the
// row-lane kernel's, block after block (scalar FMAs in block order), so every output has
// exactly the row-lane kernel's bits.
constexpr int64_t kBlockLaneMaxRows = 3;

// d[t]: four-product sums of blocks 2t (lanes 0-7) and 2t + 1 (lanes 8-15). Lane j of the
// result: block j's sum.
__m512i BlockSums(const __m512i d[8]) {
  // Per 128-bit chunk q, f[h] holds [S(d[4h], q), S(d[4h+1], q), S(d[4h+2], q), S(d[4h+3], q)],
  // S(v, q) the sum of v's lanes 4q..4q+3.
  __m512i f[2];
  for (int h = 0; h < 2; ++h) {
    __m512i e[2];
    for (int i = 0; i < 2; ++i) {
      const __m512i a = d[4 * h + 2 * i], b = d[4 * h + 2 * i + 1];
      e[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    f[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(e[0], e[1]), _mm512_unpackhi_epi64(e[0], e[1]));
  }
  // Blocks 2t and 2t + 1 of d[t] are its chunks 0 + 1 and 2 + 3.
  const __m512i sums = _mm512_add_epi32(_mm512_shuffle_i32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // sums: [blocks 0 2 4 6, 1 3 5 7, 8 10 12 14, 9 11 13 15] -> block order.
  const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  return _mm512_permutexvar_epi32(order, sums);
}

void BlockLaneColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                      int64_t n_end, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 32;
  // Per activation row and block: -128 * (the sum of its levels), as the row-lane offsets.
  std::vector<int32_t> offsets(size_t(x.rows * blocks));  // [M, K / 32]
  for (int64_t i = 0; i < x.rows * blocks; ++i) {
    int32_t sum = 0;
    for (int v = 0; v < 32; ++v) sum += x.q[size_t(32 * i + v)];
    offsets[size_t(i)] = -128 * sum;
  }
  UnsignedLevelsRow row;
  for (int64_t n = n_begin; n < n_end; ++n) {
    Unpack(w.dtype, w.Row(n), k, &row);
    for (int64_t r = 0; r < x.rows; ++r) {
      const int8_t* xq = &x.q[size_t(r * k)];
      __m128 acc = _mm_setzero_ps();
      for (int64_t b0 = 0; b0 < blocks; b0 += kLanes) {
        const int count = int(std::min<int64_t>(kLanes, blocks - b0));
        __m512i d[8];
        for (int t = 0; t < 8; ++t) {
          // Blocks b0 + 2t and b0 + 2t + 1; those past the row are zeros.
          const int present = std::clamp(count - 2 * t, 0, 2);
          d[t] = _mm512_setzero_si512();
          if (present == 0) continue;
          const __mmask64 mask = present == 2 ? ~0ull : 0xFFFFFFFFull;
          const int64_t at = 32 * (b0 + 2 * t);
          d[t] = _mm512_dpbusd_epi32(d[t], _mm512_maskz_loadu_epi8(mask, row.levels.data() + at),
                                     _mm512_maskz_loadu_epi8(mask, xq + at));
        }
        const __mmask16 lanes = __mmask16((1u << count) - 1);
        const __m512i sums = _mm512_add_epi32(
            BlockSums(d), _mm512_maskz_loadu_epi32(lanes, &offsets[size_t(r * blocks + b0)]));
        alignas(64) float dots[kLanes], scales[kLanes];
        _mm512_store_ps(dots, _mm512_cvtepi32_ps(sums));
        _mm512_store_ps(
            scales, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, &x.scales[size_t(r * blocks + b0)]),
                                  _mm512_maskz_loadu_ps(lanes, &row.scales[size_t(b0)])));
        for (int j = 0; j < count; ++j) {
          acc = _mm_fmadd_ss(_mm_set_ss(dots[j]), _mm_set_ss(scales[j]), acc);
        }
      }
      y[r * ldy + (n - n_begin)] = _mm_cvtss_f32(acc);
    }
  }
}

}  // namespace

void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy) {
  PS_CHECK(x.cols == w.cols && x.block == ActivationBlock(w.dtype));
  if (BlockSize(w.dtype) == 32 && x.rows <= kBlockLaneMaxRows) {
    BlockLaneColumns(x, w, n_begin, n_end, y, ldy);
  } else if (BlockSize(w.dtype) == 32) {
    RowLaneColumns(x, w, n_begin, n_end, y, ldy);
  } else {
    KQuantColumns(x, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx512
