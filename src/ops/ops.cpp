#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {

void MatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias) {
  if (QuantMatMul(x, m, w, y, bias)) return;  // block-quantised weights (ops/quant.h)
  // Columns of the output are independent; split them across threads in chunks that keep
  // each thread's slice of w contiguous.
  const int64_t grain = std::max<int64_t>(16, 4096 / std::max<int64_t>(w.cols, 1));
  ParallelFor(w.rows, grain, [&](int64_t n_begin, int64_t n_end) {
    reference::MatMulColumns(x, m, w, n_begin, n_end, y + n_begin, w.rows);
  });
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) AddInPlace(y + i * w.rows, bias, w.rows);
  }
}

void DequantizeRow(const WeightView& w, int64_t n, float* out) { reference::DequantizeRow(w, n, out); }

void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * c;
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < c; ++j) sum_sq += xi[j] * xi[j];
    const float inv = 1.0f / std::sqrt(sum_sq / float(c) + eps);
    float* oi = out + i * c;
    for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * inv * weight[j];
  }
}

RopeTable::RopeTable(int head_dim_, int max_positions, float theta) : head_dim(head_dim_) {
  const int half = head_dim / 2;
  cos.resize(size_t(max_positions) * half);
  sin.resize(size_t(max_positions) * half);
  for (int f = 0; f < half; ++f) {
    const float inv_freq = 1.0f / std::pow(theta, float(2 * f) / float(head_dim));
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
  const int half = head_dim / 2;
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

void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
               int kv_heads, int head_dim, float* out, float* probs) {
  PS_CHECK(kv_heads > 0 && heads % kv_heads == 0);
  const int64_t q_stride = int64_t(heads) * head_dim;
  ParallelFor(m, 1, [&](int64_t begin, int64_t end) {
    reference::Attention(q + begin * q_stride, end - begin, k, v, l, heads, kv_heads, head_dim,
                         out + begin * q_stride,
                         probs == nullptr ? nullptr : probs + begin * heads * l);
  });
}

void SiluMul(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void SoftmaxRow(float* x, int64_t n) {
  float max_value = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_value = std::max(max_value, x[i]);
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    total += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= total;
}

}  // namespace polestar
