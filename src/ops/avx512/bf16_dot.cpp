// BF16 weights times BF16-rounded activations on AVX512_BF16 (ops/bf16_matmul.h has the
// numeric contract). The layout of ops/avx512/matmul.cpp's panel path, on pairs of values:
//
// * The rows of x are regrouped once per call, sixteen rows to a group, word-major: word
//   q * 16 + l of a group holds values 2q and 2q + 1 of its row l, so one vector holds one
//   pair of sixteen rows, as vdpbf16ps wants an operand.
// * A panel is 12 weight rows x 256 pairs of K (12 KB), copied as stored: words of a row
//   are its pairs already, so there is no conversion and no transpose.
// * Every tile of up to two groups sweeps the panel: per pair, two loads of x, one broadcast
//   of each weight row's word and two vdpbf16ps per weight row into up to 24 accumulators,
//   each adding 2 x 16 products; they go to y, transposed, once the column tile is done.
//   Rows of x go through in blocks of about 1 MB that stay in L2 while every column tile
//   sweeps them.
// * There is no dot path for few rows: every output is one chain of vdpbf16ps over its
//   pairs in order, whatever M is, so a row's outputs have the same bits alone and in any
//   batch (and equal the scalar twin's: the products of a pair are exact, and the
//   instruction adds them in the same order whichever operand holds the weights).
//
// GCC 12's AVX-512 intrinsics trip -Wuninitialized inside the header (see matmul.cpp).
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
#include <cstring>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ops/avx512/row_groups.h"
#include "ops/bf16_matmul.h"

namespace polestar::avx512 {
namespace {

constexpr int kTileCols = 12;                // weight rows per tile: 12 broadcasts per pair
constexpr int kTileGroups = 2;               // groups of x rows per tile: 24 accumulators
constexpr int64_t kDepthPairs = 256;         // pairs per panel: 12 KB of words, stays in L1
constexpr int64_t kRowBlockBytes = 1 << 20;  // x rows per column-tile sweep: at most ~1 MB

// The first `count` of 16 lanes (count <= 0: none, >= 16: all).
inline __mmask16 FirstLanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(count, 0)) - 1);
}

// Word `q` of a BF16 row of k values: values 2q and 2q + 1 (0 past k).
inline uint32_t WordOf(const uint8_t* row, int64_t q, int64_t k) {
  uint16_t low, high = 0;
  std::memcpy(&low, row + 4 * q, 2);
  if (2 * q + 1 < k) std::memcpy(&high, row + 4 * q + 2, 2);
  return uint32_t(low) | uint32_t(high) << 16;
}

// panel[c * kDepthPairs + qq] = word q0 + qq of weight row n0 + c, for c < cols and
// qq < depth: the row's bytes as stored, the last word of an odd K completed with zero.
void Copy(const WeightView& w, int64_t n0, int cols, int64_t q0, int64_t depth, uint32_t* panel) {
  const int64_t whole = std::clamp<int64_t>(w.cols / 2 - q0, 0, depth);  // both values in the row
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = w.Row(n0 + c);
    uint32_t* out = panel + c * kDepthPairs;
    std::memcpy(out, row + 4 * q0, size_t(4 * whole));
    for (int64_t qq = whole; qq < depth; ++qq) out[qq] = WordOf(row, q0 + qq, w.cols);
  }
}

// Asks for the weights the next Copy will read while the tiles work on this panel.
void Prefetch(const WeightView& w, int64_t n0, int64_t q0, int64_t n_end) {
  const int64_t bytes = 4 * std::min(kDepthPairs, (w.cols + 1) / 2 - q0);
  for (int64_t n = n0; n < std::min<int64_t>(n0 + kTileCols, n_end); ++n) {
    const char* row = reinterpret_cast<const char*>(w.Row(n)) + 4 * q0;
    for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(row + offset, _MM_HINT_T0);
  }
}

// yt[C, 16 V] (+)= panel[C, depth pairs] · xt[16 V, depth pairs]^T: C weight rows (panel rows
// kDepthPairs words apart) against V groups of x rows (ldg words apart); output c of group v
// is yt[c * ldyt + 16 v + lane]. The loops over C and V unroll completely.
template <int V, int C>
void PanelTile(const uint32_t* xt, int64_t ldg, const uint32_t* panel, int64_t depth, float* yt,
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
  for (int64_t qq = 0; qq < depth; ++qq) {
    __m512bh xv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      xv[v] = (__m512bh)_mm512_loadu_si512(xt + v * ldg + qq * kGroupRows);
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(int(panel[c * kDepthPairs + qq]));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[c][v] = _mm512_dpbf16_ps(acc[c][v], xv[v], b);
    }
  }
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(yt + c * ldyt + 16 * v, acc[c][v]);
  }
}

using PanelTileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t,
                             bool);

template <int V, int... C>
constexpr auto TilesOf(std::integer_sequence<int, C...>) {
  return std::array<PanelTileFn, kTileCols + 1>{nullptr, PanelTile<V, C + 1>...};
}
// kTiles[V - 1][C]: the tile of V groups of x rows and C weight rows.
constexpr std::array<PanelTileFn, kTileCols + 1> kTiles[kTileGroups] = {
    TilesOf<1>(std::make_integer_sequence<int, kTileCols>()),
    TilesOf<2>(std::make_integer_sequence<int, kTileCols>())};

// Rows [i_begin, i_begin + m) of x against columns [n_begin, n_end).
void PanelColumns(const Bf16Activations& x, int64_t i_begin, int64_t m, const WeightView& w,
                  int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const int64_t ldg = kGroupRows * x.pairs, ldyt = kGroupRows * groups;
  alignas(64) uint32_t panel[kTileCols * kDepthPairs];  // [kTileCols, kDepthPairs]
  // Kept per thread, so steady decoding allocates nothing.
  thread_local std::vector<uint32_t> xt;  // [groups, pairs, 16]: x by GroupRows
  thread_local std::vector<float> yt;     // [kTileCols, groups * 16]: a column tile's outputs
  xt.resize(size_t(groups * ldg));
  yt.resize(size_t(kTileCols * ldyt));
  GroupRows(x.words.data() + i_begin * x.pairs, m, x.pairs, xt.data());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols) {
    const int cols = int(std::min<int64_t>(kTileCols, n_end - n0));
    for (int64_t q0 = 0; q0 < x.pairs; q0 += kDepthPairs) {
      const int64_t depth = std::min(kDepthPairs, x.pairs - q0);
      Copy(w, n0, cols, q0, depth, panel);
      const bool last = q0 + depth >= x.pairs;
      Prefetch(w, last ? n0 + kTileCols : n0, last ? 0 : q0 + depth, n_end);
      for (int64_t g = 0; g < groups; g += kTileGroups) {
        const int64_t v = std::min<int64_t>(kTileGroups, groups - g);
        kTiles[v - 1][size_t(cols)](xt.data() + g * ldg + q0 * kGroupRows, ldg, panel, depth,
                                    yt.data() + g * kGroupRows, ldyt, q0 > 0);
      }
    }
    StoreColumnTile(yt.data(), ldyt, m, cols, y + i_begin * ldy + (n0 - n_begin), ldy);
  }
}

}  // namespace

void RoundToBf16(const float* x, int64_t m, int64_t k, Bf16Activations* out) {
  out->Reshape(m, k);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    auto* values = reinterpret_cast<uint16_t*>(out->words.data() + i * out->pairs);
    if (k % 2 != 0) values[k] = 0;  // the high half of the last word
    for (int64_t j = 0; j < k; j += 16) {
      const __mmask16 mask = FirstLanes(k - j);
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, row + j));
      _mm256_mask_storeu_epi16(values + j, mask, (__m256i)rounded);
    }
  }
}

void Bf16DotColumns(const Bf16Activations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
                    float* y, int64_t ldy) {
  PS_CHECK(w.dtype == DType::kBF16 && x.cols == w.cols);
  if (x.rows <= 0 || n_end <= n_begin) return;
  if (x.pairs == 0) {
    for (int64_t i = 0; i < x.rows; ++i)
      std::fill(y + i * ldy, y + i * ldy + (n_end - n_begin), 0.0f);
    return;
  }
  // Blocks are whole groups of 16 rows but the last.
  const int64_t max_rows =
      std::max<int64_t>(4 * kGroupRows, kRowBlockBytes / (4 * x.pairs) / kGroupRows * kGroupRows);
  for (int64_t i0 = 0; i0 < x.rows; i0 += max_rows) {
    PanelColumns(x, i0, std::min(max_rows, x.rows - i0), w, n_begin, n_end, y, ldy);
  }
}

}  // namespace polestar::avx512
