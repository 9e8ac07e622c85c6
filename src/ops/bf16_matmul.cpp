// Built with -ffp-contract=off: the twin's additions are the explicit std::fma calls alone.
#include "ops/bf16_matmul.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/parallel.h"
#include "ops/reference.h"

namespace polestar {
namespace {

// A BF16 value as vdpbf16ps reads it: widened to fp32, values below FLT_MIN read as zero.
float WidenFlushed(uint32_t bf16) {
  if ((bf16 & 0x7f80u) == 0) bf16 &= 0x8000u;
  return std::bit_cast<float>(bf16 << 16);
}

// One of vdpbf16ps's additions: sum + a * b rounded once (the product is exact), a result
// below FLT_MIN flushed to a zero of its sign.
float AddProduct(float sum, float a, float b) {
  const float result = std::fma(a, b, sum);
  return std::fpclassify(result) == FP_SUBNORMAL ? std::copysign(0.0f, result) : result;
}

}  // namespace

void Bf16Activations::Reshape(int64_t m, int64_t k) {
  rows = m;
  cols = k;
  pairs = (k + 1) / 2;
  words.resize(size_t(m * pairs));
}

uint16_t RoundToBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return uint16_t((bits >> 16) | 0x40u);  // quiet, sign and payload kept
  if ((bits & 0x7f800000u) == 0) return uint16_t((bits >> 16) & 0x8000u);  // zero, subnormal
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // nearest even (may be inf)
}

void RoundToBf16(const float* x, int64_t m, int64_t k, Bf16Activations* out) {
  out->Reshape(m, k);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    uint32_t* words = out->words.data() + i * out->pairs;
    for (int64_t q = 0; q < out->pairs; ++q) {
      const uint32_t high = 2 * q + 1 < k ? RoundToBf16(row[2 * q + 1]) : 0u;
      words[q] = RoundToBf16(row[2 * q]) | high << 16;
    }
  }
}

void Bf16DotColumns(const Bf16Activations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
                    float* y, int64_t ldy) {
  PS_CHECK(w.dtype == DType::kBF16 && x.cols == w.cols);
  for (int64_t n = n_begin; n < n_end; ++n) {
    std::vector<uint16_t> weights(size_t(w.cols) + 1, 0);  // [K + 1]: rows may be unaligned
    std::memcpy(weights.data(), w.Row(n), size_t(2 * w.cols));
    for (int64_t i = 0; i < x.rows; ++i) {
      const uint32_t* words = x.words.data() + i * x.pairs;
      float sum = 0.0f;
      for (int64_t q = 0; q < x.pairs; ++q) {
        sum = AddProduct(sum, WidenFlushed(words[q] >> 16), WidenFlushed(weights[2 * q + 1]));
        sum = AddProduct(sum, WidenFlushed(words[q] & 0xffffu), WidenFlushed(weights[2 * q]));
      }
      y[i * ldy + (n - n_begin)] = sum;
    }
  }
}

bool Bf16MatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias) {
  if (w.dtype != DType::kBF16) return false;
  // Rounded once per call (serially: a small part of the products' work), then read by
  // every thread; kept per calling thread so steady decoding allocates nothing.
  thread_local Bf16Activations rounded;
  avx512::RoundToBf16(x, m, w.cols, &rounded);
  const Bf16Activations& xb = rounded;
  // Threads take whole 32-row panels of w (the kernel's), so each packs its own weights.
  constexpr int64_t kPanel = 32;
  const int64_t panels = (w.rows + kPanel - 1) / kPanel;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(kPanel * w.cols * m, 1));
  ParallelFor(panels, grain, [&](int64_t p_begin, int64_t p_end) {
    const int64_t n_begin = p_begin * kPanel, n_end = std::min(p_end * kPanel, w.rows);
    avx512::Bf16DotColumns(xb, w, n_begin, n_end, y + n_begin, w.rows);
  });
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) reference::AddInPlace(y + i * w.rows, bias, w.rows);
  }
  return true;
}

}  // namespace polestar
