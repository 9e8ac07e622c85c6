#include "ops/reference.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "ops/quant.h"

namespace polestar::reference {

float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  const uint8_t* row = w.Row(n);
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, row, size_t(w.cols) * 4);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, 2);
        out[i] = Bf16ToF32(bits);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, 2);
        out[i] = F16ToF32(bits);
      }
      return;
    default:
      DequantizeValues(w.dtype, row, w.cols, out);  // block-quantised types (ops/quant.h)
      return;
  }
}

void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));  // [K]
  for (int64_t n = n_begin; n < n_end; ++n) {
    reference::DequantizeRow(w, n, row.data());
    for (int64_t i = 0; i < m; ++i) y[i * ldy + (n - n_begin)] = Dot(x + i * w.cols, row.data(), w.cols);
  }
}

void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
               int kv_heads, int head_dim, float* out, float* probs) {
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const int64_t q_stride = int64_t(heads) * head_dim;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  std::vector<float> scores(static_cast<size_t>(l));  // [L]
  for (int64_t i = 0; i < m; ++i) {
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + i * q_stride + h * head_dim;
      const int64_t kv_offset = int64_t(h / group) * head_dim;
      float max_score = -INFINITY;
      for (int64_t j = 0; j < l; ++j) {
        scores[j] = Dot(qh, k + j * kv_stride + kv_offset, head_dim) * scale;
        max_score = std::max(max_score, scores[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < l; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        total += scores[j];
      }
      float* oh = out + i * q_stride + h * head_dim;
      std::fill(oh, oh + head_dim, 0.0f);
      for (int64_t j = 0; j < l; ++j) {
        const float p = scores[j] / total;
        if (probs != nullptr) probs[(i * heads + h) * l + j] = p;
        const float* vj = v + j * kv_stride + kv_offset;
        for (int d = 0; d < head_dim; ++d) oh[d] += p * vj[d];
      }
    }
  }
}

}  // namespace polestar::reference
