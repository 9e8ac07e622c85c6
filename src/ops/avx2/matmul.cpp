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
#include <cmath>
#include <cstring>

#include "ops/avx2/avx2.h"
#include "ops/avx2/float_formats.h"
#include "ops/avx2/simd.h"
#include "ops/reference.h"

namespace polestar::avx2 {
namespace {

constexpr int kPanelCols = 16;   // weight rows per panel: two vectors of outputs
constexpr int kTileRows = 6;     // x rows per tile: 12 accumulators + 2 panel + 1 broadcast
constexpr int64_t kDepth = 256;  // K values per panel: 16 KB of f32
constexpr int64_t kDotMaxRows = 3;
constexpr int kDotCols = 4;  // weight rows per dot tile

// panel[kk * 16 + j] = w[n0 + j][k0 + kk] for kk < depth, j < cols; zero for j >= cols.
template <typename Format>
void Pack(const WeightView& w, int64_t n0, int cols, int64_t k0, int64_t depth, float* panel) {
  const uint8_t* rows[kPanelCols];
  for (int j = 0; j < kPanelCols; ++j) rows[j] = w.Row(n0 + std::min(j, cols - 1));
  int64_t kk = 0;
  if (cols == kPanelCols) {
    for (; kk + 8 <= depth; kk += 8)
      Format::Pack16x8(rows, k0 + kk, panel + kk * kPanelCols, kPanelCols);
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
    // One reduction for every tile width (HorizontalSum adds the lanes in another order): a
    // column rounds the same in a tile of four and in a tail tile of one, wherever a range
    // of columns begins or ends.
    float sums[C];
    if constexpr (C == 4) {
      _mm_storeu_ps(sums, HorizontalSum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
      static_assert(C == 1);
      const __m256 zero = _mm256_setzero_ps();
      sums[0] = _mm_cvtss_f32(HorizontalSum4(acc[r][0], zero, zero, zero));
    }
    for (int64_t t = kk; t < k; ++t) {
      for (int c = 0; c < C; ++c) {
        // Fused explicitly, so no tile width is left to the compiler's contraction choice.
        sums[c] = std::fma(x[r * k + t], Format::Load1(row + c * row_bytes + Format::kBytes * t),
                           sums[c]);
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

int64_t DotPathMaxRows(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      return kDotMaxRows;
    default:
      return 0;
  }
}

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
