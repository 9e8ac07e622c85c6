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
#include <cstring>

#include "base/error.h"
#include "ops/avx512/row_groups.h"
#include "ops/bf16_matmul.h"

namespace polestar::avx512 {
namespace {

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

// BF16 weights for GroupedColumns (ops/avx512/row_groups.h), on words of two values: a
// panel row is the weight row's bytes as stored, the last word of an odd K completed with
// zero.
struct PairOps {
  using Element = uint32_t;
  using XVec = __m512bh;
  using WVec = __m512bh;
  using Acc = __m512;
  static constexpr int64_t kDepth = 256;  // pairs per panel: 12 KB of words, stays in L1

  static Acc Zero() { return _mm512_setzero_ps(); }
  static Acc LoadY(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreY(float* p, Acc a) { _mm512_storeu_ps(p, a); }
  static XVec LoadX(const uint32_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static WVec Broadcast(uint32_t w) { return (__m512bh)_mm512_set1_epi32(int(w)); }
  static Acc MulAdd(Acc acc, XVec x, WVec w) { return _mm512_dpbf16_ps(acc, x, w); }

  const WeightView& w;
  void Fill(int64_t n0, int cols, int64_t q0, int64_t depth, uint32_t* panel) const {
    const int64_t whole = std::clamp<int64_t>(w.cols / 2 - q0, 0, depth);  // both values inside
    for (int c = 0; c < cols; ++c) {
      const uint8_t* row = w.Row(n0 + c);
      uint32_t* out = panel + c * kDepth;
      std::memcpy(out, row + 4 * q0, size_t(4 * whole));
      for (int64_t qq = whole; qq < depth; ++qq) out[qq] = WordOf(row, q0 + qq, w.cols);
    }
  }
  void Prefetch(int64_t n0, int64_t q0, int64_t n_end) const {
    const int64_t bytes = 4 * std::min(kDepth, (w.cols + 1) / 2 - q0);
    for (int64_t n = n0; n < std::min<int64_t>(n0 + kTileCols, n_end); ++n) {
      const char* row = reinterpret_cast<const char*>(w.Row(n)) + 4 * q0;
      for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(row + at, _MM_HINT_T0);
    }
  }
};

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
    GroupedColumns(PairOps{w}, x.words.data() + i0 * x.pairs, std::min(max_rows, x.rows - i0),
                   x.pairs, n_begin, n_end, y + i0 * ldy, ldy);
  }
}

}  // namespace polestar::avx512
