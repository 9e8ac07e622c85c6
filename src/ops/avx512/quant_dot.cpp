// AVX-512 VNNI integer matrix products for block-quantised weights (see ops/quant.h), with
// vpdpbusd (u8 x s8, four products summed straight into int32, no int16 stage to saturate).
//   Q8_0 / Q4_0: lane r of a register is activation row r of a group of 16 and each weight's
//   four levels are broadcast to all lanes, so eight vpdpbusd leave every lane with a whole
//   block's integer sum, and one conversion, product and FMA scale 16 rows' blocks (512
//   products) at once. (Scaling each register's two half-blocks on its own, as the AVX2
//   scheme does, costs a conversion, a product and an FMA per 64 products: the Q8_0 path
//   was slower than F16's FMAs.) One to three rows put blocks in the lanes instead, with the
//   same float steps, so a row's outputs have the same bits at any M.
//   K-quants: the same row lanes, per 4 values one vpdpbusd; each 16-value group's sum is
//   scaled by its group's scale in integer (vpdpwssd for Q4_K, whose sums fit in int16,
//   vpmulld otherwise) and the mins enter as one vpdpwssd per two groups against the rows'
//   group sums, so a super-block's sums are exact int32 and take two FMAs (see below).
//   One to three rows put values in the lanes instead, with the same float steps.
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

constexpr int kLanes = 16;  // rows of activations per register in the row-lane kernels

float LoadF16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// --- K-quants ---
// A super-block's integer sums for activation row r and weight row c, exact in int32:
//   T = sum over groups g of scale_g * (sum of level * q over the group's 16 values)
//   S = sum over groups g of min_g * (sum of q over the group)
// (|T| <= 256 * 63 * 127 * 128 < 2^31, |S| <= 256 * 127 * 4096 < 2^31), and the float steps
// every K-quant path runs per super-block b, in order, from acc = 0:
//   acc = fma(float(T), d_b * dx_rb, acc);  acc = fma(-float(S), dmin_b * dx_rb, acc)
// so a row's outputs have the same bits on either path below and at any M.

// A Q4_K / Q5_K / Q6_K row (see KQuantMultipliers).
struct KQuantRow {
  std::vector<uint8_t> levels;     // [K] unsigned levels
  std::vector<int32_t> scales;     // [K / 16]: each group's scale
  std::vector<int32_t> min_pairs;  // [K / 32]: the mins of groups 2p and 2p + 1, int16 halves
  std::vector<float> d, dmin;      // [K / 256]
};

void Unpack(DType type, const uint8_t* row, int64_t k, KQuantRow* out) {
  out->levels.resize(size_t(k));
  out->scales.resize(size_t(k / 16));
  out->min_pairs.resize(size_t(k / 32));
  out->d.resize(size_t(k / 256));
  out->dmin.resize(size_t(k / 256));
  avx2::WeightLevels(type, row, k, out->levels.data());
  for (int64_t b = 0; b < k / 256; ++b) {
    const KQuantMultipliers mul = KQuantMultipliersOf(type, row + b * BlockBytes(type));
    for (int g = 0; g < 16; ++g) out->scales[size_t(16 * b + g)] = mul.scales[g];
    std::memcpy(&out->min_pairs[size_t(8 * b)], mul.mins, sizeof(mul.mins));
    out->d[size_t(b)] = mul.d;
    out->dmin[size_t(b)] = mul.dmin;
  }
}

// Q4_K's group sums fit in int16 (|.| <= 16 * 15 * 127), so vpdpwssd applies the scale in
// one instruction (the sum is its own low int16, and the scale's high int16 is 0); Q5_K's
// and Q6_K's take vpmulld and an add.
inline __m512i AddScaled(bool sums_fit_int16, __m512i total, __m512i sums, __m512i scale) {
  return sums_fit_int16 ? _mm512_dpwssd_epi32(total, sums, scale)
                        : _mm512_add_epi32(total, _mm512_mullo_epi32(sums, scale));
}

// K-quant activations regrouped for the row-lane kernel: lane l of a vector is row 16 g + l.
struct KQuantLaneActivations {
  int64_t groups = 0, words = 0, blocks = 0;  // ceil(M / 16), K / 4, K / 256
  std::vector<int8_t> levels;                 // [groups, words, 16, 4]
  std::vector<int32_t> sum_pairs;             // [groups, K / 32, 16]: group sums 2p, 2p + 1
  std::vector<float> scales;                  // [groups, blocks, 16]
};

// The activation rows' word j (values 4j..4j+3) of the 16 rows of a group side by side:
// levels[((g * words + j) * 16 + l) * 4 ...]; rows past M are zero.
void RegroupLevels(const QuantizedActivations& x, std::vector<int8_t>* levels) {
  const int64_t groups = (x.rows + kLanes - 1) / kLanes, words = x.cols / 4;
  levels->assign(size_t(groups * words * kLanes * 4), 0);
  for (int64_t i = 0; i < x.rows; ++i) {
    const int8_t* row = &x.q[size_t(i * x.cols)];
    int8_t* dst = &(*levels)[size_t(((i / kLanes) * words * kLanes + i % kLanes) * 4)];
    for (int64_t j = 0; j < words; ++j) std::memcpy(dst + j * kLanes * 4, row + 4 * j, 4);
  }
}

void Regroup(const QuantizedActivations& x, KQuantLaneActivations* out) {
  out->groups = (x.rows + kLanes - 1) / kLanes;
  out->words = x.cols / 4;
  out->blocks = x.cols / 256;
  RegroupLevels(x, &out->levels);
  const int64_t pairs = x.cols / 32;
  out->sum_pairs.assign(size_t(out->groups * pairs * kLanes), 0);
  out->scales.assign(size_t(out->groups * out->blocks * kLanes), 0.0f);
  for (int64_t i = 0; i < x.rows; ++i) {
    const int64_t g = i / kLanes, lane = i % kLanes;
    for (int64_t p = 0; p < pairs; ++p) {
      std::memcpy(&out->sum_pairs[size_t((g * pairs + p) * kLanes + lane)],
                  &x.group_sums[size_t(i * x.cols / 16 + 2 * p)], 4);
    }
    for (int64_t b = 0; b < out->blocks; ++b) {
      out->scales[size_t((g * out->blocks + b) * kLanes + lane)] =
          x.scales[size_t(i * out->blocks + b)];
    }
  }
}

// y[r * ldy + c] for the rows of group g and kCols weight rows: per 4 values one vpdpbusd of
// the weights' broadcast levels against 16 rows' levels, per 16 values the group's scale,
// per 32 one vpdpwssd of the mins against the rows' group sums.
template <int kCols, bool kSumsFitInt16>
void KQuantLaneTile(const KQuantLaneActivations& x, int64_t g, int64_t rows, const KQuantRow* w,
                    float* y, int64_t ldy) {
  const int8_t* x_levels = &x.levels[size_t(g * x.words * kLanes * 4)];
  const int32_t* x_pairs = &x.sum_pairs[size_t(g * (x.words / 8) * kLanes)];
  const float* x_scales = &x.scales[size_t(g * x.blocks * kLanes)];
  __m512 acc[kCols];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i scaled[kCols], mins[kCols];  // T and S of each lane's row
    for (int c = 0; c < kCols; ++c) scaled[c] = mins[c] = _mm512_setzero_si512();
    for (int64_t group = 16 * b; group < 16 * b + 16; ++group) {
      __m512i sums[kCols];
      for (auto& sum : sums) sum = _mm512_setzero_si512();
      for (int64_t j = 4 * group; j < 4 * group + 4; ++j) {
        const __m512i xv = _mm512_loadu_si512(x_levels + j * kLanes * 4);
        for (int c = 0; c < kCols; ++c) {
          int32_t four;
          std::memcpy(&four, &w[c].levels[size_t(4 * j)], 4);
          sums[c] = _mm512_dpbusd_epi32(sums[c], _mm512_set1_epi32(four), xv);
        }
      }
      for (int c = 0; c < kCols; ++c) {
        scaled[c] = AddScaled(kSumsFitInt16, scaled[c], sums[c],
                              _mm512_set1_epi32(w[c].scales[size_t(group)]));
      }
    }
    for (int64_t p = 8 * b; p < 8 * b + 8; ++p) {
      const __m512i xs = _mm512_loadu_si512(x_pairs + p * kLanes);
      for (int c = 0; c < kCols; ++c) {
        mins[c] = _mm512_dpwssd_epi32(mins[c], xs, _mm512_set1_epi32(w[c].min_pairs[size_t(p)]));
      }
    }
    const __m512 dx = _mm512_loadu_ps(x_scales + b * kLanes);
    for (int c = 0; c < kCols; ++c) {
      const float d = w[c].d[size_t(b)], dmin = w[c].dmin[size_t(b)];
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[c]), _mm512_mul_ps(_mm512_set1_ps(d), dx),
                               acc[c]);
      acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[c]),
                                _mm512_mul_ps(_mm512_set1_ps(dmin), dx), acc[c]);
    }
  }
  for (int c = 0; c < kCols; ++c) {
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, acc[c]);
    for (int64_t r = 0; r < rows; ++r) y[r * ldy + c] = lanes[r];
  }
}

template <bool kSumsFitInt16>
void KQuantLaneTileOf(int cols, const KQuantLaneActivations& x, int64_t g, int64_t rows,
                      const KQuantRow* w, float* y, int64_t ldy) {
  switch (cols) {
    case 4:
      return KQuantLaneTile<4, kSumsFitInt16>(x, g, rows, w, y, ldy);
    case 3:
      return KQuantLaneTile<3, kSumsFitInt16>(x, g, rows, w, y, ldy);
    case 2:
      return KQuantLaneTile<2, kSumsFitInt16>(x, g, rows, w, y, ldy);
    default:
      return KQuantLaneTile<1, kSumsFitInt16>(x, g, rows, w, y, ldy);
  }
}

constexpr int kKQuantLaneCols = 4;

void KQuantLaneColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                       int64_t n_end, float* y, int64_t ldy) {
  // Regrouped per call and thread: M * K bytes, against N * M * K products.
  thread_local KQuantLaneActivations regrouped;
  Regroup(x, &regrouped);
  const bool sums_fit_int16 = w.dtype == DType::kQ4_K;
  KQuantRow rows[kKQuantLaneCols];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kKQuantLaneCols) {
    const int cols = int(std::min<int64_t>(kKQuantLaneCols, n_end - n0));
    for (int c = 0; c < cols; ++c) Unpack(w.dtype, w.Row(n0 + c), w.cols, &rows[c]);
    for (int64_t g = 0; g < regrouped.groups; ++g) {
      const int64_t rows_here = std::min<int64_t>(kLanes, x.rows - g * kLanes);
      float* y_tile = y + g * kLanes * ldy + (n0 - n_begin);
      if (sums_fit_int16) {
        KQuantLaneTileOf<true>(cols, regrouped, g, rows_here, rows, y_tile, ldy);
      } else {
        KQuantLaneTileOf<false>(cols, regrouped, g, rows_here, rows, y_tile, ldy);
      }
    }
  }
}

// One to three activation rows: lanes hold values instead of rows (most row lanes would
// idle). Per 64 values one vpdpbusd gives four-product sums, lane j in group j / 4, and one
// vpdpwssd scales them by their groups' scales (a four-product sum fits in int16); a lane
// sum gives T exactly, 16 scalar products S, and the float steps run as the row-lane
// kernel's, in scalar.
constexpr int64_t kKQuantValueLaneMaxRows = 3;

void KQuantValueLaneColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                            int64_t n_end, float* y, int64_t ldy) {
  const int64_t k = x.cols, blocks = k / 256;
  // Lane j of a 64-value chunk covers values 4j..4j+3, in group j / 4 of the chunk.
  const __m512i group_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i low_half = _mm512_set1_epi32(0xffff);
  KQuantRow row;
  for (int64_t n = n_begin; n < n_end; ++n) {
    Unpack(w.dtype, w.Row(n), k, &row);
    for (int64_t r = 0; r < x.rows; ++r) {
      const int8_t* xq = &x.q[size_t(r * k)];
      const int16_t* x_sums = &x.group_sums[size_t(r * k / 16)];
      __m128 acc = _mm_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        __m512i scaled = _mm512_setzero_si512();
        for (int64_t j = 256 * b; j < 256 * b + 256; j += 64) {
          const __m512i four = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                   _mm512_loadu_si512(&row.levels[size_t(j)]),
                                                   _mm512_loadu_si512(xq + j));
          // The scale in each lane's low int16, 0 above it (a negative scale's high half
          // would multiply the four-product sum's sign bits).
          const __m512i scales = _mm512_and_si512(
              low_half, _mm512_permutexvar_epi32(
                            group_of_lane,
                            _mm512_zextsi128_si512(_mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(&row.scales[size_t(j / 16)])))));
          scaled = _mm512_dpwssd_epi32(scaled, four, scales);
        }
        int16_t mins[16];
        std::memcpy(mins, &row.min_pairs[size_t(8 * b)], sizeof(mins));
        int32_t min_sum = 0;
        for (int g = 0; g < 16; ++g) min_sum += int32_t(mins[g]) * x_sums[16 * b + g];
        const float dx = x.scales[size_t(r * blocks + b)];
        acc = _mm_fmadd_ss(_mm_set_ss(float(_mm512_reduce_add_epi32(scaled))),
                           _mm_set_ss(row.d[size_t(b)] * dx), acc);
        acc = _mm_fnmadd_ss(_mm_set_ss(float(min_sum)), _mm_set_ss(row.dmin[size_t(b)] * dx), acc);
      }
      y[r * ldy + (n - n_begin)] = _mm_cvtss_f32(acc);
    }
  }
}

// --- Q8_0 / Q4_0: 16 activation rows per register (see the top of the file) ---
// The weight is the unsigned operand (level + 128); each lane's sum starts at -128 * (the
// sum of its row's levels in the block), so it is exact.

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
  RegroupLevels(x, &out->levels);
  out->offsets.assign(size_t(out->groups * out->blocks * kLanes), 0);
  out->scales.assign(size_t(out->groups * out->blocks * kLanes), 0.0f);
  for (int64_t i = 0; i < x.rows; ++i) {
    const int64_t g = i / kLanes, lane = i % kLanes;
    const int8_t* row = &x.q[size_t(i * x.cols)];
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
  } else if (x.rows <= kKQuantValueLaneMaxRows) {
    KQuantValueLaneColumns(x, w, n_begin, n_end, y, ldy);
  } else {
    KQuantLaneColumns(x, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx512
