// y[M, N] = x[M, K] · w[N, K]^T on weights in their stored type.
//
// Two paths, by M:
// * Panel (M > kDotMaxRows): a panel of 16 weight rows x 256 values of K is converted to
//   f32 in transposed order ([K-chunk, 16], 16 KB, stays in L1), then every 6-row tile of
//   x sweeps it: per K step two panel loads, six broadcasts of x, twelve FMAs into
//   accumulators held in registers. Each weight byte is read and converted once per call.
// * Dot (M <= kDotMaxRows): too few rows to pay for packing; each group of four weight rows
//   is converted eight values at a time and dotted with every x row. Memory bound.
//
// The storage type enters only through a Format (Load8 / Pack16x8); a new type adds one
// Format and one case in MatMulColumns, and until then runs on the scalar twin.
#include <algorithm>
#include <cstring>

#include "ops/avx2/avx2.h"
#include "ops/avx2/simd.h"
#include "ops/reference.h"

namespace polestar::avx2 {
namespace {

constexpr int kPanelCols = 16;   // weight rows per panel: two vectors of outputs
constexpr int kTileRows = 6;     // x rows per tile: 12 accumulators + 2 panel + 1 broadcast
constexpr int64_t kDepth = 256;  // K values per panel: 16 KB of f32
constexpr int64_t kDotMaxRows = 3;
constexpr int kDotCols = 4;  // weight rows per dot tile

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
// out[kk * 16 + j] = row j, value k + kk).
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
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out) {
    for (int half = 0; half < 2; ++half) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = Load8(rows[8 * half + j] + 4 * k);
      Transpose8x8(r);
      for (int kk = 0; kk < 8; ++kk) _mm256_store_ps(out + kk * kPanelCols + 8 * half, r[kk]);
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
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out) {
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
      _mm256_store_ps(out + kk * kPanelCols,
                      _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, t[kk])));
      _mm256_store_ps(out + kk * kPanelCols + 8,
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
  static void Pack16x8(const uint8_t* const rows[16], int64_t k, float* out) {
    __m256i t[8];
    LoadTranspose16(rows, rows + 8, 2 * k, t);
    for (int kk = 0; kk < 8; ++kk) {
      _mm256_store_ps(out + kk * kPanelCols, _mm256_cvtph_ps(_mm256_castsi256_si128(t[kk])));
      _mm256_store_ps(out + kk * kPanelCols + 8,
                      _mm256_cvtph_ps(_mm256_extracti128_si256(t[kk], 1)));
    }
  }
};

// panel[kk * 16 + j] = w[n0 + j][k0 + kk] for kk < depth, j < cols; zero for j >= cols.
template <typename Format>
void Pack(const WeightView& w, int64_t n0, int cols, int64_t k0, int64_t depth, float* panel) {
  const uint8_t* rows[kPanelCols];
  for (int j = 0; j < kPanelCols; ++j) rows[j] = w.Row(n0 + std::min(j, cols - 1));
  int64_t kk = 0;
  if (cols == kPanelCols) {
    for (; kk + 8 <= depth; kk += 8) Format::Pack16x8(rows, k0 + kk, panel + kk * kPanelCols);
  }
  for (; kk < depth; ++kk) {
    for (int j = 0; j < kPanelCols; ++j) {
      panel[kk * kPanelCols + j] =
          j < cols ? Format::Load1(rows[j] + Format::kBytes * (k0 + kk)) : 0.0f;
    }
  }
}

// Asks for the weights the next Pack will read ([16 rows from n0, kDepth values from k0])
// while the tiles work on this panel, so the pack does not wait on memory.
template <typename Format>
void Prefetch(const WeightView& w, int64_t n0, int64_t k0, int64_t n_end) {
  const int64_t bytes = Format::kBytes * std::min(kDepth, w.cols - k0);
  for (int64_t n = n0; n < std::min(n0 + kPanelCols, n_end); ++n) {
    const char* row = reinterpret_cast<const char*>(w.Row(n)) + Format::kBytes * k0;
    for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(row + offset, _MM_HINT_T0);
  }
}

// y[R, 16] (+)= x[R, depth] · panel[depth, 16]; rows of x are ldx apart, of y ldy apart.
// The accumulators are named variables rather than an array: GCC keeps an array of vectors
// on the stack here, which costs a store per FMA.
template <int R>
void PanelTile(const float* x, int64_t ldx, const float* panel, int64_t depth, float* y,
               int64_t ldy, bool accumulate) {
  static_assert(R >= 1 && R <= kTileRows);
  auto init = [&](int r, int half) {
    return accumulate ? _mm256_loadu_ps(y + r * ldy + 8 * half) : _mm256_setzero_ps();
  };
  __m256 c00 = init(0, 0), c01 = init(0, 1);
  __m256 c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if constexpr (R > 1) c10 = init(1, 0), c11 = init(1, 1);
  if constexpr (R > 2) c20 = init(2, 0), c21 = init(2, 1);
  if constexpr (R > 3) c30 = init(3, 0), c31 = init(3, 1);
  if constexpr (R > 4) c40 = init(4, 0), c41 = init(4, 1);
  if constexpr (R > 5) c50 = init(5, 0), c51 = init(5, 1);
  const float* x0 = x;
  for (int64_t kk = 0; kk < depth; ++kk, ++x0, panel += kPanelCols) {
    const __m256 b0 = _mm256_load_ps(panel);
    const __m256 b1 = _mm256_load_ps(panel + 8);
    __m256 a = _mm256_broadcast_ss(x0);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    if constexpr (R > 1) {
      a = _mm256_broadcast_ss(x0 + ldx);
      c10 = _mm256_fmadd_ps(a, b0, c10);
      c11 = _mm256_fmadd_ps(a, b1, c11);
    }
    if constexpr (R > 2) {
      a = _mm256_broadcast_ss(x0 + 2 * ldx);
      c20 = _mm256_fmadd_ps(a, b0, c20);
      c21 = _mm256_fmadd_ps(a, b1, c21);
    }
    if constexpr (R > 3) {
      a = _mm256_broadcast_ss(x0 + 3 * ldx);
      c30 = _mm256_fmadd_ps(a, b0, c30);
      c31 = _mm256_fmadd_ps(a, b1, c31);
    }
    if constexpr (R > 4) {
      a = _mm256_broadcast_ss(x0 + 4 * ldx);
      c40 = _mm256_fmadd_ps(a, b0, c40);
      c41 = _mm256_fmadd_ps(a, b1, c41);
    }
    if constexpr (R > 5) {
      a = _mm256_broadcast_ss(x0 + 5 * ldx);
      c50 = _mm256_fmadd_ps(a, b0, c50);
      c51 = _mm256_fmadd_ps(a, b1, c51);
    }
  }
  auto store = [&](int r, __m256 lo, __m256 hi) {
    _mm256_storeu_ps(y + r * ldy, lo);
    _mm256_storeu_ps(y + r * ldy + 8, hi);
  };
  store(0, c00, c01);
  if constexpr (R > 1) store(1, c10, c11);
  if constexpr (R > 2) store(2, c20, c21);
  if constexpr (R > 3) store(3, c30, c31);
  if constexpr (R > 4) store(4, c40, c41);
  if constexpr (R > 5) store(5, c50, c51);
}

template <int R>
void PanelTileCols(const float* x, int64_t ldx, const float* panel, int64_t depth, float* y,
                   int64_t ldy, bool accumulate, int cols) {
  if (cols == kPanelCols) {
    PanelTile<R>(x, ldx, panel, depth, y, ldy, accumulate);
    return;
  }
  // The last panel of a matrix whose N is not a multiple of 16 goes through a full tile.
  alignas(32) float tile[R][kPanelCols] = {};
  for (int r = 0; r < R && accumulate; ++r) std::copy(y + r * ldy, y + r * ldy + cols, tile[r]);
  PanelTile<R>(x, ldx, panel, depth, &tile[0][0], kPanelCols, accumulate);
  for (int r = 0; r < R; ++r) std::copy(tile[r], tile[r] + cols, y + r * ldy);
}

using PanelTileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                             int);
constexpr PanelTileFn kTiles[kTileRows + 1] = {nullptr,          PanelTileCols<1>, PanelTileCols<2>,
                                               PanelTileCols<3>, PanelTileCols<4>, PanelTileCols<5>,
                                               PanelTileCols<6>};

template <typename Format>
void PanelColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                  float* y, int64_t ldy) {
  const int64_t k = w.cols;
  alignas(32) float panel[kDepth * kPanelCols];  // [kDepth, 16]
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kPanelCols) {
    const int cols = int(std::min<int64_t>(kPanelCols, n_end - n0));
    float* y_panel = y + (n0 - n_begin);
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, k - k0);
      Pack<Format>(w, n0, cols, k0, depth, panel);
      Prefetch<Format>(w, k0 + depth < k ? n0 : n0 + kPanelCols, k0 + depth < k ? k0 + depth : 0,
                       n_end);
      // Rows are dealt out evenly (M = 32: 6 6 5 5 5 5, not 6 6 6 6 6 2): a tile of fewer
      // than four rows has too few accumulators to cover the FMA latency.
      const int64_t tiles = (m + kTileRows - 1) / kTileRows;
      for (int64_t t = 0, i0 = 0; t < tiles; ++t) {
        const int64_t rows = m / tiles + (t < m % tiles ? 1 : 0);
        const float* xi = x + i0 * k + k0;
        float* yi = y_panel + i0 * ldy;
        const bool accumulate = k0 > 0;
        i0 += rows;
        kTiles[rows](xi, k, panel, depth, yi, ldy, accumulate, cols);
      }
    }
  }
}

// y[R, C] = x[R, K] · rows[C, K]^T for C weight rows starting at `row`, row_bytes apart.
template <typename Format, int R, int C>
void DotTile(const float* x, int64_t k, const uint8_t* row, int64_t row_bytes, float* y,
             int64_t ldy) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * k + kk);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = Format::Load8(row + c * row_bytes + Format::kBytes * kk);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float sums[C];
    if constexpr (C == 4) {
      _mm_storeu_ps(sums, HorizontalSum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
      for (int c = 0; c < C; ++c) sums[c] = HorizontalSum(acc[r][c]);
    }
    for (int64_t t = kk; t < k; ++t) {
      for (int c = 0; c < C; ++c) {
        sums[c] += x[r * k + t] * Format::Load1(row + c * row_bytes + Format::kBytes * t);
      }
    }
    for (int c = 0; c < C; ++c) y[r * ldy + c] = sums[c];
  }
}

template <typename Format, int R>
void DotColumnsRows(const float* x, const WeightView& w, int64_t n_begin, int64_t n_end, float* y,
                    int64_t ldy) {
  int64_t n = n_begin;
  for (; n + kDotCols <= n_end; n += kDotCols) {
    DotTile<Format, R, kDotCols>(x, w.cols, w.Row(n), w.row_bytes, y + (n - n_begin), ldy);
  }
  for (; n < n_end; ++n)
    DotTile<Format, R, 1>(x, w.cols, w.Row(n), w.row_bytes, y + (n - n_begin), ldy);
}

template <typename Format>
void DotColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                float* y, int64_t ldy) {
  switch (m) {
    case 1:
      DotColumnsRows<Format, 1>(x, w, n_begin, n_end, y, ldy);
      break;
    case 2:
      DotColumnsRows<Format, 2>(x, w, n_begin, n_end, y, ldy);
      break;
    default:
      DotColumnsRows<Format, 3>(x, w, n_begin, n_end, y, ldy);
      break;
  }
  static_assert(kDotMaxRows == 3);
}

template <typename Format>
void Columns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
             float* y, int64_t ldy) {
  if (m <= kDotMaxRows) {
    DotColumns<Format>(x, m, w, n_begin, n_end, y, ldy);
  } else if (w.cols == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n_end - n_begin), 0.0f);
  } else {
    PanelColumns<Format>(x, m, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace

void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  if (m <= 0 || n_end <= n_begin) return;
  switch (w.dtype) {
    case DType::kF32:
      return Columns<F32Format>(x, m, w, n_begin, n_end, y, ldy);
    case DType::kBF16:
      return Columns<Bf16Format>(x, m, w, n_begin, n_end, y, ldy);
    case DType::kF16:
      return Columns<F16Format>(x, m, w, n_begin, n_end, y, ldy);
    default:
      return reference::MatMulColumns(x, m, w, n_begin, n_end, y, ldy);
  }
}

void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  const uint8_t* row = w.Row(n);
  int64_t k = 0;
  switch (w.dtype) {
    case DType::kBF16:
      for (; k + 8 <= w.cols; k += 8) _mm256_storeu_ps(out + k, Bf16Format::Load8(row + 2 * k));
      for (; k < w.cols; ++k) out[k] = Bf16Format::Load1(row + 2 * k);
      return;
    case DType::kF16:
      for (; k + 8 <= w.cols; k += 8) _mm256_storeu_ps(out + k, F16Format::Load8(row + 2 * k));
      for (; k < w.cols; ++k) out[k] = F16Format::Load1(row + 2 * k);
      return;
    default:
      return reference::DequantizeRow(w, n, out);
  }
}

}  // namespace polestar::avx2
