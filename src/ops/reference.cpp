#include "ops/reference.h"

#include <algorithm>
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

// The dtype switch every weight kernel shares: a new storage type adds a case here (its
// scalar definition) and one in avx2/matmul.cpp.
void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  const uint8_t* row = w.Row(n);
  switch (w.dtype) {
    case DType::kF32:
      // An empty row may have null pointers, which memcpy must not get even for 0 bytes.
      if (w.cols > 0) std::memcpy(out, row, size_t(w.cols) * 4);
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
    for (int64_t i = 0; i < m; ++i) {
      y[i * ldy + (n - n_begin)] = Dot(x + i * w.cols, row.data(), w.cols);
    }
  }
}

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

void HeadProbabilities(const float* q, const float* k, int64_t l, int64_t kv_stride, int head_dim,
                       float* probs) {
  const float scale = 1.0f / std::sqrt(float(head_dim));
  for (int64_t j = 0; j < l; ++j) probs[j] = Dot(q, k + j * kv_stride, head_dim) * scale;
  SoftmaxRow(probs, l);
}

void HeadProbabilitiesSideBySide(const float* q, const float* k, int64_t l, int64_t kv_stride,
                                 int head_dim, float* probs) {
  constexpr int64_t kKeys = 8;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  int64_t j = 0;
  for (; j + kKeys <= l; j += kKeys) {
    float sums[kKeys] = {};  // [8] keys j..j+7
    const float* rows = k + j * kv_stride;
    for (int d = 0; d < head_dim; ++d) {
      for (int64_t r = 0; r < kKeys; ++r) sums[r] += q[d] * rows[r * kv_stride + d];
    }
    for (int64_t r = 0; r < kKeys; ++r) probs[j + r] = sums[r] * scale;
  }
  for (; j < l; ++j) probs[j] = Dot(q, k + j * kv_stride, head_dim) * scale;
  SoftmaxRow(probs, l);
}

void AttendHead(const float* q, const float* k, const float* v, int64_t l, int64_t kv_stride,
                int head_dim, float* probs, float* out) {
  HeadProbabilities(q, k, l, kv_stride, head_dim, probs);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j = 0; j < l; ++j) {
    const float* vj = v + j * kv_stride;
    for (int d = 0; d < head_dim; ++d) out[d] += probs[j] * vj[d];
  }
}

void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
               int kv_heads, int head_dim, float* out, float* probs) {
  const int group = heads / kv_heads;
  const int64_t q_stride = int64_t(heads) * head_dim;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  std::vector<float> scores(static_cast<size_t>(l));  // [L]
  for (int64_t i = 0; i < m; ++i) {
    for (int h = 0; h < heads; ++h) {
      const int64_t kv_offset = int64_t(h / group) * head_dim;
      AttendHead(q + i * q_stride + h * head_dim, k + kv_offset, v + kv_offset, l, kv_stride,
                 head_dim, scores.data(), out + i * q_stride + h * head_dim);
      if (probs != nullptr) std::copy(scores.begin(), scores.end(), probs + (i * heads + h) * l);
    }
  }
}

double KlDivergence(const float* current, const float* previous, int64_t n, float floor) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float c = std::max(current[i], floor);
    const float p = std::max(previous[i], floor);
    sum += double(c) * (std::log(double(c)) - std::log(double(p)));
  }
  return std::max(sum, 0.0);
}

void FlooredLogs(const float* p, int64_t n, double* out, float floor) {
  // Peaked attention leaves many entries at the floor: their log is taken once.
  const double floor_log = std::log(double(floor));
  for (int64_t i = 0; i < n; ++i) out[i] = p[i] < floor ? floor_log : std::log(double(p[i]));
}

double KlDivergenceFromLogs(const float* current, const double* current_logs,
                            const double* previous_logs, int64_t n, float floor) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += double(std::max(current[i], floor)) * (current_logs[i] - previous_logs[i]);
  }
  return std::max(sum, 0.0);
}

void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u,
                        double* out) {
  std::fill(out, out + n, 0.0);
  for (int64_t j = 0; j < d; ++j) {
    const double* x = x_by_dim + j * n;
    for (int64_t i = 0; i < n; ++i) out[i] += x[i] * u[j];
  }
}

double CosineSimilarity(const float* a, const float* b, int64_t n) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  if (na == 0 || nb == 0) return 0;
  return dot / (std::sqrt(na) * std::sqrt(nb));
}

}  // namespace polestar::reference
