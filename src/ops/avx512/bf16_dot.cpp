// BF16 weights times BF16-rounded activations on AVX512_BF16 (ops/bf16_matmul.h has the
// numeric contract). The layout of ops/avx512/matmul.cpp's panel path, on pairs of values:
//
// * A panel is 32 weight rows x 128 pairs of K (256 values, 16 KB), stored pair-major:
//   word p * 32 + j holds values 2p and 2p + 1 of row j, as vdpbf16ps wants one lane of an
//   operand. Packing moves 32-bit words only (4 x 4 transposes in each 128-bit lane), with
//   no conversion: the weights go in as stored.
// * Every tile of up to 12 rows of x sweeps the panel: per pair, two panel loads, one
//   broadcast of the row's word and two vdpbf16ps per row into up to 24 accumulators, each
//   adding 2 x 16 products. Rows are dealt out evenly among the tiles, and rows of x go
//   through in blocks of about 1 MB that stay in L2 while every panel sweeps them.
// * There is no dot path for few rows: every output is one chain of vdpbf16ps over its
//   pairs in order, whatever M is, so a row's outputs have the same bits alone and in any
//   batch (and equal the scalar twin's). At M = 1 packing costs more than the products; the
//   decoders here run blocks of rows.
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

#include "base/error.h"
#include "ops/bf16_matmul.h"

namespace polestar::avx512 {
namespace {

constexpr int kPanelCols = 32;               // weight rows per panel: two vectors of outputs
constexpr int kTileRows = 12;                // x rows per tile: 24 accumulators
constexpr int64_t kDepthPairs = 128;         // pairs per panel: 16 KB of words
constexpr int64_t kRowBlockBytes = 1 << 20;  // x rows per panel sweep: at most ~1 MB of them

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

// Words q0..q0+3 of 16 rows into panel order: out[qq * 32 + j] = word q0 + qq of rows[j].
// Lane g of r[q] holds row 4g + q; the two unpack levels transpose each lane's 4 x 4 words,
// so vector t[qq] lists word qq of rows 0-15 in order.
inline void Pack16x4(const uint8_t* const rows[16], int64_t q0, uint32_t* out) {
  __m512i r[4];
  for (int q = 0; q < 4; ++q) {
    auto load = [&](int lane) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 * lane + q] + 4 * q0));
    };
    r[q] = _mm512_inserti32x4(_mm512_castsi128_si512(load(0)), load(1), 1);
    r[q] = _mm512_inserti32x4(_mm512_inserti32x4(r[q], load(2), 2), load(3), 3);
  }
  const __m512i a0 = _mm512_unpacklo_epi32(r[0], r[1]), a1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i a2 = _mm512_unpacklo_epi32(r[2], r[3]), a3 = _mm512_unpackhi_epi32(r[2], r[3]);
  _mm512_store_si512(out, _mm512_unpacklo_epi64(a0, a2));
  _mm512_store_si512(out + kPanelCols, _mm512_unpackhi_epi64(a0, a2));
  _mm512_store_si512(out + 2 * kPanelCols, _mm512_unpacklo_epi64(a1, a3));
  _mm512_store_si512(out + 3 * kPanelCols, _mm512_unpackhi_epi64(a1, a3));
}

// panel[qq * 32 + j] = word q0 + qq of weight row n0 + j for qq < depth, j < cols; zero
// for j >= cols.
void Pack(const WeightView& w, int64_t n0, int cols, int64_t q0, int64_t depth, uint32_t* panel) {
  const uint8_t* rows[kPanelCols];
  for (int j = 0; j < kPanelCols; ++j) rows[j] = w.Row(n0 + std::min(j, cols - 1));
  const int64_t whole_words = w.cols / 2;  // words with both values inside a row
  int64_t qq = 0;
  if (cols == kPanelCols) {
    for (; qq + 4 <= depth && q0 + qq + 4 <= whole_words; qq += 4) {
      Pack16x4(rows, q0 + qq, panel + qq * kPanelCols);
      Pack16x4(rows + 16, q0 + qq, panel + qq * kPanelCols + 16);
    }
  }
  for (; qq < depth; ++qq) {
    for (int j = 0; j < kPanelCols; ++j) {
      panel[qq * kPanelCols + j] = j < cols ? WordOf(rows[j], q0 + qq, w.cols) : 0u;
    }
  }
}

// Asks for the weights the next Pack will read while the tiles work on this panel.
void Prefetch(const WeightView& w, int64_t n0, int64_t q0, int64_t n_end) {
  const int64_t bytes = 4 * std::min(kDepthPairs, (w.cols + 1) / 2 - q0);
  for (int64_t n = n0; n < std::min<int64_t>(n0 + kPanelCols, n_end); ++n) {
    const char* row = reinterpret_cast<const char*>(w.Row(n)) + 4 * q0;
    for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(row + offset, _MM_HINT_T0);
  }
}

// y[R, 16 V] (+)= x[R, depth words] · panel[depth, 16 V] (panel rows kPanelCols words
// apart); rows of x are ldx words apart, of y ldy floats apart. Only the lanes in mask[v]
// of output vector v are read and written.
template <int R, int V>
void PanelTile(const uint32_t* x, int64_t ldx, const uint32_t* panel, int64_t depth, float* y,
               int64_t ldy, bool accumulate, const __mmask16 mask[2]) {
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
  for (int64_t qq = 0; qq < depth; ++qq, panel += kPanelCols) {
    __m512bh b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_load_si512(panel + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(x[r * ldx + qq]));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + r * ldy + 16 * v, mask[v], acc[r][v]);
  }
}

using PanelTileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t,
                             bool, const __mmask16*);

template <int V, int... R>
constexpr auto TilesOf(std::integer_sequence<int, R...>) {
  return std::array<PanelTileFn, kTileRows + 1>{nullptr, PanelTile<R + 1, V>...};
}
// kTiles[V - 1][R]: the tile of R rows and V output vectors.
constexpr std::array<PanelTileFn, kTileRows + 1> kTiles[2] = {
    TilesOf<1>(std::make_integer_sequence<int, kTileRows>()),
    TilesOf<2>(std::make_integer_sequence<int, kTileRows>())};

// Rows [i_begin, i_begin + m) of x against columns [n_begin, n_end).
void PanelColumns(const Bf16Activations& x, int64_t i_begin, int64_t m, const WeightView& w,
                  int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  alignas(64) uint32_t panel[kDepthPairs * kPanelCols];  // [kDepthPairs, 32]
  const uint32_t* x_rows = x.words.data() + i_begin * x.pairs;
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kPanelCols) {
    const int cols = int(std::min<int64_t>(kPanelCols, n_end - n0));
    const __mmask16 mask[2] = {FirstLanes(cols), FirstLanes(cols - 16)};
    const auto& tile_fns = kTiles[cols > 16 ? 1 : 0];
    float* y_panel = y + i_begin * ldy + (n0 - n_begin);
    for (int64_t q0 = 0; q0 < x.pairs; q0 += kDepthPairs) {
      const int64_t depth = std::min(kDepthPairs, x.pairs - q0);
      Pack(w, n0, cols, q0, depth, panel);
      const bool last = q0 + depth >= x.pairs;
      Prefetch(w, last ? n0 + kPanelCols : n0, last ? 0 : q0 + depth, n_end);
      for (int64_t t = 0, i0 = 0; t < tiles; ++t) {
        const int64_t rows = m / tiles + (t < m % tiles ? 1 : 0);
        tile_fns[size_t(rows)](x_rows + i0 * x.pairs + q0, x.pairs, panel, depth,
                               y_panel + i0 * ldy, ldy, q0 > 0, mask);
        i0 += rows;
      }
    }
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
  const int64_t max_rows = std::max<int64_t>(4 * kTileRows, kRowBlockBytes / (4 * x.pairs));
  const int64_t blocks = (x.rows + max_rows - 1) / max_rows;
  for (int64_t b = 0, i0 = 0; b < blocks; ++b) {
    const int64_t rows = x.rows / blocks + (b < x.rows % blocks ? 1 : 0);
    PanelColumns(x, i0, rows, w, n_begin, n_end, y, ldy);
    i0 += rows;
  }
}

}  // namespace polestar::avx512
