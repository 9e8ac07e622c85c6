// y[M, N] = x[M, K] · w[N, K]^T on F32, BF16 and F16 weights with 512-bit FMAs.
//
// Every output of the two panel paths is one chain of FMAs over K in order, as in the AVX2
// panel path, so all three give the same bits and the choice between them is free.
// * Grouped rows (K >= 1024, with M >= 32 or K a multiple of 1024; ops/avx512/row_groups.h):
//   the rows of x are regrouped once per call, sixteen rows to a group and each group
//   transposed ([K, 16]), so one vector holds value k of sixteen rows. A panel of 12 weight
//   rows x 256 values of K is converted to f32 as stored ([12, 256], 12 KB, stays in L1; no
//   transpose), then every tile of up to two groups sweeps it: per K step two loads of x,
//   one broadcast per weight row and two FMAs per weight row into up to 24 accumulators held
//   in zmm registers, which hold outputs for 16 rows of one column each and go to y,
//   transposed, once the column tile is done.
//   Converting the weights this way costs a load and a store per sixteen values, about a
//   quarter of what a transposed panel costs (measured on Zen 4, one thread, F16 N = K =
//   4096: 57 -> 90 GFLOP/s at M = 96, 80% of the FMA peak of 112). Rows of x go through in
//   blocks of about 1 MB (M = 512, K = 2048: four blocks of 128) that stay in L2 while
//   every column tile sweeps them; each weight byte is read and converted once per block.
// * Row tiles (fewer rows, or short K, as polestar-tiny's): a panel of 32 weight rows x 128
//   values of K is converted to f32 in transposed order ([K-chunk, 32], 16 KB; BF16 and F16
//   transposed in zmm, F32 by the AVX2 packer of ops/avx2/float_formats.h), then every tile
//   of up to 12 rows of x sweeps it: per K step two panel loads, one broadcast of x per row
//   and two FMAs per row into up to 24 accumulators. Tiles take the rows dealt out evenly
//   (M = 20: 10 10, M = 8: one tile of 8), so no shape ends in a tile too short to cover
//   the FMA latency. A last panel of 16 or fewer weight rows runs one vector of outputs per
//   row; columns past N are masked off.
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

#include "ops/avx2/avx2.h"
#include "ops/avx2/float_formats.h"
#include "ops/avx512/avx512.h"
#include "ops/avx512/row_groups.h"

namespace polestar::avx512 {
namespace {

using avx2::Bf16Format;
using avx2::F16Format;
using avx2::F32Format;

// Row tiles: a panel of weights transposed to f32, swept by tiles of x rows (few rows).
constexpr int kPanelCols = 32;        // weight rows per panel: two vectors of outputs
constexpr int kTileRows = 12;         // x rows per tile: 24 accumulators + 2 panel + 1 broadcast
constexpr int64_t kPanelDepth = 128;  // K values per panel: 16 KB of f32
constexpr int64_t kRowBlockBytes = 1 << 20;  // x rows per panel sweep: at most ~1 MB of them
constexpr int kDotMaxRows = 6;  // measured: the dot path is ahead up to M = 6, the panel from 8
// Grouped rows for K >= 1024, from 32 rows, or from 7 rows where K is a multiple of 1024;
// row tiles otherwise. Measured on Zen 4 (one thread, GFLOP/s, row tiles / grouped): F16
// 2048 x 2048 at M = 8 33 / 37, 16 51 / 74, 24 57 / 58, 32 65 / 79, 96 62 / 92; F16 2048 x
// 5632 at M = 16 66 / 62, 24 63 / 51, 32 69 / 76, 48 79 / 85; F32 384 x 128 (polestar-tiny)
// at M = 8 67 / 41, 32 96 / 87, 48 101 / 91. Row tiles read x in place, and rows a multiple
// of 4 KB apart fall into the same sets of the 8-way L1, which costs them up to a third
// there; elsewhere the regrouping of x and y and the idle lanes of partial groups cost the
// grouped rows more than cheap weight conversion saves until M = 32, and at short K always.
constexpr int kGroupedMinRows = 32;
constexpr int64_t kGroupedMinDepth = 1024;

bool Grouped(int64_t m, int64_t k) {
  return k >= kGroupedMinDepth && (m >= kGroupedMinRows || k % 1024 == 0);
}

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

// Asks for bytes [offset, offset + bytes) of weight rows [n_begin, n_end), which the next
// panel will read, while the tiles work on this one, so filling it does not wait on memory.
void PrefetchRows(const WeightView& w, int64_t n_begin, int64_t n_end, int64_t offset,
                  int64_t bytes) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    const char* row = reinterpret_cast<const char*>(w.Row(n)) + offset;
    for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(row + at, _MM_HINT_T0);
  }
}

// --- Row tiles (where Grouped says no) ---

// Loads eight 16-bit values at byte_offset of rows lanes[L][q] (q < 8) into 128-bit lane L
// of r[q] and transposes within each lane: out[kk] holds in lane L value kk of the rows
// lanes[L][0..7]. The network of avx2::LoadTranspose16 on four lanes instead of two.
inline void LoadTranspose32(const uint8_t* const lanes[4][8], int64_t byte_offset, __m512i out[8]) {
  __m512i r[8];
  for (int q = 0; q < 8; ++q) {
    auto load = [&](int lane) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes[lane][q] + byte_offset));
    };
    r[q] = _mm512_inserti32x4(_mm512_castsi128_si512(load(0)), load(1), 1);
    r[q] = _mm512_inserti32x4(_mm512_inserti32x4(r[q], load(2), 2), load(3), 3);
  }
  __m512i lo[4], hi[4];  // pairs of rows interleaved: values 0-3 / 4-7
  for (int p = 0; p < 4; ++p) {
    lo[p] = _mm512_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
    hi[p] = _mm512_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
  }
  const __m512i u0 = _mm512_unpacklo_epi32(lo[0], lo[1]), u1 = _mm512_unpackhi_epi32(lo[0], lo[1]);
  const __m512i u2 = _mm512_unpacklo_epi32(lo[2], lo[3]), u3 = _mm512_unpackhi_epi32(lo[2], lo[3]);
  const __m512i u4 = _mm512_unpacklo_epi32(hi[0], hi[1]), u5 = _mm512_unpackhi_epi32(hi[0], hi[1]);
  const __m512i u6 = _mm512_unpacklo_epi32(hi[2], hi[3]), u7 = _mm512_unpackhi_epi32(hi[2], hi[3]);
  out[0] = _mm512_unpacklo_epi64(u0, u2);
  out[1] = _mm512_unpackhi_epi64(u0, u2);
  out[2] = _mm512_unpacklo_epi64(u1, u3);
  out[3] = _mm512_unpackhi_epi64(u1, u3);
  out[4] = _mm512_unpacklo_epi64(u4, u6);
  out[5] = _mm512_unpackhi_epi64(u4, u6);
  out[6] = _mm512_unpacklo_epi64(u5, u7);
  out[7] = _mm512_unpackhi_epi64(u5, u7);
}

// 32 rows x 8 values into panel order: out[kk * 32 + j] = row j, value k + kk. The 16-bit
// types transpose in zmm (half the shuffles per value of the AVX2 packer); F32, which the
// models here do not store their large matrices in, uses the AVX2 packer twice.
inline void Pack32x8(F32Format, const uint8_t* const rows[32], int64_t k, float* out) {
  F32Format::Pack16x8(rows, k, out, kPanelCols);
  F32Format::Pack16x8(rows + 16, k, out + 16, kPanelCols);
}
inline void Pack32x8(Bf16Format, const uint8_t* const rows[32], int64_t k, float* out) {
  // Interleaving zeros below a lane's values 0-3 (unpacklo) widens them to f32, so lane L
  // must hold rows 4L..4L+3 first and 16+4L..16+4L+3 after them, for the two halves to
  // come out as rows 0-15 and 16-31.
  const uint8_t* lanes[4][8];
  for (int lane = 0; lane < 4; ++lane) {
    for (int q = 0; q < 4; ++q) {
      lanes[lane][q] = rows[4 * lane + q];
      lanes[lane][q + 4] = rows[16 + 4 * lane + q];
    }
  }
  __m512i t[8];
  LoadTranspose32(lanes, 2 * k, t);
  const __m512i zero = _mm512_setzero_si512();
  for (int kk = 0; kk < 8; ++kk) {
    _mm512_store_ps(out + kk * kPanelCols, _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, t[kk])));
    _mm512_store_ps(out + kk * kPanelCols + 16,
                    _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, t[kk])));
  }
}
inline void Pack32x8(F16Format, const uint8_t* const rows[32], int64_t k, float* out) {
  const uint8_t* lanes[4][8];  // lane L: rows 8L..8L+7, so each 256-bit half is 16 rows in order
  for (int lane = 0; lane < 4; ++lane) {
    for (int q = 0; q < 8; ++q) lanes[lane][q] = rows[8 * lane + q];
  }
  __m512i t[8];
  LoadTranspose32(lanes, 2 * k, t);
  for (int kk = 0; kk < 8; ++kk) {
    _mm512_store_ps(out + kk * kPanelCols, _mm512_cvtph_ps(_mm512_castsi512_si256(t[kk])));
    _mm512_store_ps(out + kk * kPanelCols + 16,
                    _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t[kk], 1)));
  }
}

// panel[kk * 32 + j] = w[n0 + j][k0 + kk] for kk < depth, j < cols; zero for j >= cols.
template <typename Format>
void Pack(const WeightView& w, int64_t n0, int cols, int64_t k0, int64_t depth, float* panel) {
  const uint8_t* rows[kPanelCols];
  for (int j = 0; j < kPanelCols; ++j) rows[j] = w.Row(n0 + std::min(j, cols - 1));
  int64_t kk = 0;
  if (cols == kPanelCols) {
    for (; kk + 8 <= depth; kk += 8) Pack32x8(Format{}, rows, k0 + kk, panel + kk * kPanelCols);
  }
  for (; kk < depth; ++kk) {
    for (int j = 0; j < kPanelCols; ++j) {
      panel[kk * kPanelCols + j] =
          j < cols ? Format::Load1(rows[j] + Format::kBytes * (k0 + kk)) : 0.0f;
    }
  }
}

// y[R, 16 V] (+)= x[R, depth] · panel[depth, 16 V] (panel rows kPanelCols apart); rows of x
// are ldx apart, of y ldy apart. Only the lanes in mask[v] of output vector v are read and
// written. The loops over R and V unroll completely, so the accumulators live in registers.
template <int R, int V>
void RowTile(const float* x, int64_t ldx, const float* panel, int64_t depth, float* y, int64_t ldy,
             bool accumulate, const __mmask16 mask[2]) {
  static_assert(R >= 1 && R <= kTileRows && (V == 1 || V == 2));
  __m512 acc[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      acc[r][v] =
          accumulate ? _mm512_maskz_loadu_ps(mask[v], y + r * ldy + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < depth; ++kk, panel += kPanelCols) {
    __m512 b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = _mm512_load_ps(panel + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + kk]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + r * ldy + 16 * v, mask[v], acc[r][v]);
  }
}

using RowTileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                           const __mmask16*);

template <int V, int... R>
constexpr auto RowTilesOf(std::integer_sequence<int, R...>) {
  return std::array<RowTileFn, kTileRows + 1>{nullptr, RowTile<R + 1, V>...};
}
// kRowTiles[V - 1][R]: the tile of R rows and V output vectors.
constexpr std::array<RowTileFn, kTileRows + 1> kRowTiles[2] = {
    RowTilesOf<1>(std::make_integer_sequence<int, kTileRows>()),
    RowTilesOf<2>(std::make_integer_sequence<int, kTileRows>())};

template <typename Format>
void RowTileColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                    float* y, int64_t ldy) {
  const int64_t k = w.cols;
  alignas(64) float panel[kPanelDepth * kPanelCols];  // [kPanelDepth, 32]
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kPanelCols) {
    const int cols = int(std::min<int64_t>(kPanelCols, n_end - n0));
    const __mmask16 mask[2] = {FirstLanes(cols), FirstLanes(cols - 16)};
    const auto& tile_fns = kRowTiles[cols > 16 ? 1 : 0];
    float* y_panel = y + (n0 - n_begin);
    for (int64_t k0 = 0; k0 < k; k0 += kPanelDepth) {
      const int64_t depth = std::min(kPanelDepth, k - k0);
      Pack<Format>(w, n0, cols, k0, depth, panel);
      // The next Pack's weights, while the tiles work on this panel.
      const bool last = k0 + depth >= k;
      const int64_t next_n0 = last ? n0 + kPanelCols : n0, next_k0 = last ? 0 : k0 + depth;
      PrefetchRows(w, next_n0, std::min(next_n0 + kPanelCols, n_end), Format::kBytes * next_k0,
                   Format::kBytes * std::min(kPanelDepth, k - next_k0));
      for (int64_t t = 0, i0 = 0; t < tiles; ++t) {
        const int64_t rows = m / tiles + (t < m % tiles ? 1 : 0);
        tile_fns[size_t(rows)](x + i0 * k + k0, k, panel, depth, y_panel + i0 * ldy, ldy, k0 > 0,
                               mask);
        i0 += rows;
      }
    }
  }
}

// --- Grouped rows (ops/avx512/row_groups.h) ---

// Float weights for GroupedColumns: each panel row converted to f32 as it is stored, sixteen
// values per instruction, with no transpose.
template <typename Format>
struct FloatOps {
  using Element = float;
  using XVec = __m512;
  using WVec = __m512;
  using Acc = __m512;
  static constexpr int64_t kDepth = 256;  // K values per panel: 12 KB of f32, stays in L1

  static Acc Zero() { return _mm512_setzero_ps(); }
  static Acc LoadY(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreY(float* p, Acc a) { _mm512_storeu_ps(p, a); }
  static XVec LoadX(const float* p) { return _mm512_loadu_ps(p); }
  static WVec Broadcast(float w) { return _mm512_set1_ps(w); }
  static Acc MulAdd(Acc acc, XVec x, WVec w) { return _mm512_fmadd_ps(x, w, acc); }

  const WeightView& w;
  void Fill(int64_t n0, int cols, int64_t k0, int64_t depth, float* panel) const {
    for (int c = 0; c < cols; ++c) {
      const uint8_t* row = w.Row(n0 + c) + Format::kBytes * k0;
      float* out = panel + c * kDepth;
      for (int64_t kk = 0; kk < depth; kk += 16) {
        const __mmask16 mask = FirstLanes(depth - kk);
        _mm512_mask_storeu_ps(out + kk, mask, Load16(Format{}, row + Format::kBytes * kk, mask));
      }
    }
  }
  void Prefetch(int64_t n0, int64_t k0, int64_t n_end) const {
    PrefetchRows(w, n0, std::min<int64_t>(n0 + kTileCols, n_end), Format::kBytes * k0,
                 Format::kBytes * std::min(kDepth, w.cols - k0));
  }
};

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
  } else if (!Grouped(m, w.cols)) {
    RowTileColumns<Format>(x, m, w, n_begin, n_end, y, ldy);
  } else {
    // Every column tile sweeps all of its rows of x: a row block's x ([rows, K]) must stay
    // in L2, or each tile streams it from L3 again (M = 512, K = 2048: 4 MB per 12 weight
    // rows). Blocks are whole groups of 16 rows but the last.
    const int64_t max_rows =
        std::max<int64_t>(4 * kGroupRows, kRowBlockBytes / (4 * w.cols) / kGroupRows * kGroupRows);
    for (int64_t i0 = 0; i0 < m; i0 += max_rows) {
      const int64_t rows = std::min(max_rows, m - i0);
      GroupedColumns(FloatOps<Format>{w}, x + i0 * w.cols, rows, w.cols, n_begin, n_end,
                     y + i0 * ldy, ldy);
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
