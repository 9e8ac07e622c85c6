// y[M, N] = x[M, K] · w[N, K]^T on F32, BF16 and F16 weights with 512-bit FMAs.
//
// * Panel (M > kDotMaxRows): the rows of x are regrouped once per call, sixteen rows to a
//   group and each group transposed ([K, 16]), so one vector holds value k of sixteen rows.
//   A panel of 12 weight rows x 256 values of K is converted to f32 as stored ([12, 256],
//   12 KB, stays in L1; no transpose), then every tile of up to two groups sweeps it: per K
//   step two loads of x, one broadcast per weight row and two FMAs per weight row into up to
//   24 accumulators held in zmm registers, which hold outputs for 16 rows of one column each
//   and go to y, transposed, once the column tile is done. Converting the weights this way
//   costs a load and a store per sixteen values, about a quarter of what a transposed panel
//   of weights costs, and the regrouping of x is paid once for all N columns (measured on
//   Zen 4, one thread, F16 N = K = 4096: 57 -> 90 GFLOP/s at M = 96, 80% of the FMA peak
//   at 112). Rows of x go through in blocks of about 1 MB (M = 512, K = 2048: four blocks
//   of 128) that stay in L2 while every column tile sweeps them; each weight byte is read
//   and converted once per block. Every output is one chain of FMAs over K in order, as in
//   the AVX2 panel path, so the two give the same bits.
// * Dot (M <= kDotMaxRows): too few rows to pay for packing; each group of 4 to 8 weight
//   rows (about 24 accumulators) is converted sixteen values at a time (the tail of K by
//   masked loads) and dotted with every x row. Bound by memory and L2 bandwidth.
//
// BF16 weights are widened to f32 and multiplied in f32 here; with reduced activation
// precision on AVX512_BF16 they take ops/bf16_matmul.h instead.
//
// GCC 12's AVX-512 intrinsics build their "undefined" vectors from self-initialised
// variables (GCC bug 105593), which -Wuninitialized reports inside the header; the
// diagnostic pragmas apply by source location, so they must surround its first inclusion.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "ops/avx2/avx2.h"
#include "ops/avx2/float_formats.h"
#include "ops/avx512/avx512.h"

namespace polestar::avx512 {
namespace {

using avx2::Bf16Format;
using avx2::F16Format;
using avx2::F32Format;

constexpr int kTileCols = 12;    // weight rows per tile: 12 broadcasts per K step
constexpr int kGroupRows = 16;   // rows of x per vector, one in each lane
constexpr int kTileGroups = 2;   // groups of x rows per tile: 24 accumulators + 2 x + 1 broadcast
constexpr int64_t kDepth = 256;  // K values per panel: 12 KB of f32 weights, stays in L1
constexpr int64_t kRowBlockBytes = 1 << 20;  // x rows per panel sweep: at most ~1 MB of them
constexpr int kDotMaxRows = 6;  // measured: the dot path is ahead up to M = 6, the panel from 8

// Sixteen consecutive values of one row as f32; lanes outside `mask` read nothing and are 0.
inline __m512 Load16(F32Format, const uint8_t* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
inline __m512 Load16(Bf16Format, const uint8_t* p, __mmask16 mask) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}
inline __m512 Load16(F16Format, const uint8_t* p, __mmask16 mask) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}

// The first `count` of 16 lanes (count <= 0: none, >= 16: all).
inline __mmask16 FirstLanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(count, 0)) - 1);
}

// panel[c * kDepth + kk] = w[n0 + c][k0 + kk] as f32, for c < cols and kk < depth: each
// weight row converted as it is stored, sixteen values per instruction, with no transpose.
template <typename Format>
void Convert(const WeightView& w, int64_t n0, int cols, int64_t k0, int64_t depth, float* panel) {
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = w.Row(n0 + c) + Format::kBytes * k0;
    float* out = panel + c * kDepth;
    for (int64_t kk = 0; kk < depth; kk += 16) {
      const __mmask16 mask = FirstLanes(depth - kk);
      _mm512_mask_storeu_ps(out + kk, mask, Load16(Format{}, row + Format::kBytes * kk, mask));
    }
  }
}

// Asks for the weights the next Convert will read ([kTileCols rows from n0, kDepth values
// from k0]) while the tiles work on this panel, so the conversion does not wait on memory.
template <typename Format>
void Prefetch(const WeightView& w, int64_t n0, int64_t k0, int64_t n_end) {
  const int64_t bytes = Format::kBytes * std::min(kDepth, w.cols - k0);
  for (int64_t n = n0; n < std::min(n0 + kTileCols, n_end); ++n) {
    const char* row = reinterpret_cast<const char*>(w.Row(n)) + Format::kBytes * k0;
    for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(row + offset, _MM_HINT_T0);
  }
}

// The rows of x in groups of 16, each group transposed: xt[g * ldg + kk * 16 + l] = x[16 g + l]
// [kk] (ldg = 16 K), lanes past M zero. A tile then loads sixteen rows' value kk as one vector.
void GroupRows(const float* x, int64_t m, int64_t k, float* xt) {
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  for (int64_t g = 0; g < groups; ++g) {
    float* out = xt + g * kGroupRows * k;
    const int64_t lanes = std::min<int64_t>(kGroupRows, m - g * kGroupRows);
    for (int64_t l = 0; l < lanes; ++l) {
      const float* row = x + (g * kGroupRows + l) * k;
      for (int64_t kk = 0; kk < k; ++kk) out[kk * kGroupRows + l] = row[kk];
    }
    for (int64_t l = lanes; l < kGroupRows; ++l) {
      for (int64_t kk = 0; kk < k; ++kk) out[kk * kGroupRows + l] = 0.0f;
    }
  }
}

// yt[C, 16 V] (+)= panel[C, depth] · xt[16 V, depth]^T: C weight rows (panel rows kDepth
// apart) against V groups of 16 rows of x (groups ldg apart, as GroupRows lays them out);
// output c of group v is yt[c * ldyt + 16 v + lane]. Per K step: V loads of x, C broadcasts
// of a weight, V x C FMAs into accumulators held in zmm registers (the loops unroll
// completely). Each output is one chain of FMAs over K in order, as in the AVX2 panel path.
template <int V, int C>
void PanelTile(const float* xt, int64_t ldg, const float* panel, int64_t depth, float* yt,
               int64_t ldyt, bool accumulate) {
  static_assert(V >= 1 && V <= kTileGroups && C >= 1 && C <= kTileCols);
  __m512 acc[C][V];
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      acc[c][v] = accumulate ? _mm512_loadu_ps(yt + c * ldyt + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < depth; ++kk) {
    __m512 xv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_ps(xt + v * ldg + kk * kGroupRows);
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) {
      const __m512 a = _mm512_set1_ps(panel[c * kDepth + kk]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[c][v] = _mm512_fmadd_ps(xv[v], a, acc[c][v]);
    }
  }
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(yt + c * ldyt + 16 * v, acc[c][v]);
  }
}

using PanelTileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

template <int V, int... C>
constexpr auto TilesOf(std::integer_sequence<int, C...>) {
  return std::array<PanelTileFn, kTileCols + 1>{nullptr, PanelTile<V, C + 1>...};
}
// kTiles[V - 1][C]: the tile of V groups of x rows and C weight rows.
constexpr std::array<PanelTileFn, kTileCols + 1> kTiles[kTileGroups] = {
    TilesOf<1>(std::make_integer_sequence<int, kTileCols>()),
    TilesOf<2>(std::make_integer_sequence<int, kTileCols>())};

template <typename Format>
void PanelColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                  float* y, int64_t ldy) {
  const int64_t k = w.cols;
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const int64_t ldg = kGroupRows * k, ldyt = kGroupRows * groups;
  alignas(64) float panel[kTileCols * kDepth];  // [kTileCols, kDepth]
  // Kept per thread (x's at most about 1 MB, a row block's), so steady decoding allocates
  // nothing; filling them costs about 1/N of the products' work.
  thread_local std::vector<float> xt;  // [groups, K, 16]: x by GroupRows
  thread_local std::vector<float> yt;  // [kTileCols, groups * 16]: one column tile's outputs
  xt.resize(size_t(groups * ldg));
  yt.resize(size_t(kTileCols * ldyt));
  GroupRows(x, m, k, xt.data());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols) {
    const int cols = int(std::min<int64_t>(kTileCols, n_end - n0));
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, k - k0);
      Convert<Format>(w, n0, cols, k0, depth, panel);
      Prefetch<Format>(w, k0 + depth < k ? n0 : n0 + kTileCols, k0 + depth < k ? k0 + depth : 0,
                       n_end);
      for (int64_t g = 0; g < groups; g += kTileGroups) {
        const int64_t v = std::min<int64_t>(kTileGroups, groups - g);
        kTiles[v - 1][size_t(cols)](xt.data() + g * ldg + k0 * kGroupRows, ldg, panel, depth,
                                    yt.data() + g * kGroupRows, ldyt, k0 > 0);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int c = 0; c < cols; ++c) y[i * ldy + (n0 - n_begin) + c] = yt[size_t(c * ldyt + i)];
    }
  }
}

// y[R, C] = x[R, K] · rows[C, K]^T for C weight rows starting at `row`, row_bytes apart.
template <typename Format, int R, int C>
void DotTile(const float* x, int64_t k, const uint8_t* row, int64_t row_bytes, float* y,
             int64_t ldy) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  auto step = [&](int64_t kk, __mmask16 mask) {
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * k + kk);
    for (int c = 0; c < C; ++c) {
      const __m512 wv = Load16(Format{}, row + c * row_bytes + Format::kBytes * kk, mask);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  };
  int64_t kk = 0;
  for (; kk + 16 <= k; kk += 16) step(kk, 0xffff);
  if (kk < k) step(kk, FirstLanes(k - kk));
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
  }
}

// Weight rows per dot tile of R x rows: about 24 accumulators, each weight load shared by R FMAs.
constexpr int DotCols(int r) { return std::min(8, 24 / r); }

template <typename Format, int R>
void DotColumnsRows(const float* x, const WeightView& w, int64_t n_begin, int64_t n_end, float* y,
                    int64_t ldy) {
  constexpr int kCols = DotCols(R);
  int64_t n = n_begin;
  for (; n + kCols <= n_end; n += kCols) {
    DotTile<Format, R, kCols>(x, w.cols, w.Row(n), w.row_bytes, y + (n - n_begin), ldy);
  }
  for (; n < n_end; ++n)
    DotTile<Format, R, 1>(x, w.cols, w.Row(n), w.row_bytes, y + (n - n_begin), ldy);
}

template <typename Format, int... R>
void DotColumns(std::integer_sequence<int, R...>, const float* x, int64_t m, const WeightView& w,
                int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  ((m == R + 1 ? DotColumnsRows<Format, R + 1>(x, w, n_begin, n_end, y, ldy) : void()), ...);
}

template <typename Format>
void Columns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
             float* y, int64_t ldy) {
  if (m <= kDotMaxRows) {
    DotColumns<Format>(std::make_integer_sequence<int, kDotMaxRows>(), x, m, w, n_begin, n_end, y,
                       ldy);
  } else if (w.cols == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n_end - n_begin), 0.0f);
  } else {
    // Every column tile sweeps all of its rows of x: a row block's x ([rows, K]) must stay
    // in L2, or each tile streams it from L3 again (M = 512, K = 2048: 4 MB per 12 weight
    // rows). Blocks are whole groups of 16 rows but the last.
    const int64_t max_rows =
        std::max<int64_t>(4 * kGroupRows, kRowBlockBytes / (4 * w.cols) / kGroupRows * kGroupRows);
    for (int64_t i0 = 0; i0 < m; i0 += max_rows) {
      const int64_t rows = std::min(max_rows, m - i0);
      PanelColumns<Format>(x + i0 * w.cols, rows, w, n_begin, n_end, y + i0 * ldy, ldy);
    }
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
      return avx2::DotPathMaxRows(type);
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
      return avx2::MatMulColumns(x, m, w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx512
