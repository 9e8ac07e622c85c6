#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "ops/avx2/avx2.h"
#include "ops/isa.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {

void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  if (IsaSupported(Isa::kAvx2)) {
    avx2::DequantizeRow(w, n, out);
  } else {
    reference::DequantizeRow(w, n, out);
  }
}

RopeTable::RopeTable(int head_dim_, int rotary_dim_, int max_positions, float theta)
    : head_dim(head_dim_), rotary_dim(rotary_dim_) {
  PS_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim);
  const int half = rotary_dim / 2;
  cos.resize(size_t(max_positions) * half);
  sin.resize(size_t(max_positions) * half);
  for (int f = 0; f < half; ++f) {
    const float inv_freq = 1.0f / std::pow(theta, float(2 * f) / float(rotary_dim));
    for (int p = 0; p < max_positions; ++p) {
      const float angle = float(p) * inv_freq;
      cos[size_t(p) * half + f] = std::cos(angle);
      sin[size_t(p) * half + f] = std::sin(angle);
    }
  }
}

namespace {

void Rotate(float* x, std::span<const int> positions, int heads, const RopeTable& table,
            bool interleaved, float direction) {
  const int head_dim = table.head_dim;
  const int half = table.rotary_dim / 2;
  for (size_t i = 0; i < positions.size(); ++i) {
    PS_CHECK(size_t(positions[i]) * half < table.cos.size());
    const float* cos_row = &table.cos[size_t(positions[i]) * half];
    const float* sin_row = &table.sin[size_t(positions[i]) * half];
    for (int h = 0; h < heads; ++h) {
      float* xh = x + (int64_t(i) * heads + h) * head_dim;
      for (int f = 0; f < half; ++f) {
        const float cos_a = cos_row[f];
        const float sin_a = direction * sin_row[f];
        float* a = interleaved ? &xh[2 * f] : &xh[f];
        float* b = interleaved ? &xh[2 * f + 1] : &xh[f + half];
        const float x0 = *a, x1 = *b;
        *a = x0 * cos_a - x1 * sin_a;
        *b = x1 * cos_a + x0 * sin_a;
      }
    }
  }
}

}  // namespace

void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
               bool interleaved) {
  Rotate(x, positions, heads, table, interleaved, 1.0f);
}

void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
              bool interleaved) {
  Rotate(x, positions, heads, table, interleaved, -1.0f);
}

void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
               float* weights) {
  const int experts = spec.experts, k = spec.top_k;
  PS_CHECK(experts > 0 && k > 0 && k <= experts);
  std::vector<float> scores(static_cast<size_t>(experts));  // [E] one row's score + bias
  std::vector<int> order(static_cast<size_t>(experts));     // [E] expert indices, best first
  for (int64_t r = 0; r < m; ++r) {
    const float* row = logits + r * experts;
    // Softmax as torch computes it in fp32: exp(x - max) / sum.
    float max = row[0];
    for (int e = 1; e < experts; ++e) max = std::max(max, row[e]);
    float sum = 0.0f;
    for (int e = 0; e < experts; ++e) {
      scores[size_t(e)] = std::exp(row[e] - max);
      sum += scores[size_t(e)];
    }
    for (int e = 0; e < experts; ++e) {
      scores[size_t(e)] /= sum;
      if (spec.bias != nullptr) scores[size_t(e)] += spec.bias[e];
    }
    for (int e = 0; e < experts; ++e) order[size_t(e)] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return scores[size_t(a)] > scores[size_t(b)] ||
             (scores[size_t(a)] == scores[size_t(b)] && a < b);
    });
    float total = 0.0f;
    for (int i = 0; i < k; ++i) total += scores[size_t(order[size_t(i)])];
    for (int i = 0; i < k; ++i) {
      const int e = order[size_t(i)];
      chosen[r * k + i] = e;
      const float weight = spec.normalize ? scores[size_t(e)] / total : scores[size_t(e)];
      weights[r * k + i] = weight * spec.scaling;
    }
  }
}

void ScaleAddRows(const float* src, std::span<const float> scales, float* dst,
                  std::span<const int> dst_rows, int64_t width) {
  PS_CHECK(scales.size() == dst_rows.size());
  for (size_t i = 0; i < dst_rows.size(); ++i) {
    const float scale = scales[i];
    const float* from = src + int64_t(i) * width;
    float* to = dst + int64_t(dst_rows[i]) * width;
    for (int64_t j = 0; j < width; ++j) to[j] += scale * from[j];
  }
}

}  // namespace polestar
