// Element-wise and row kernels: RmsNorm, SiluMul, AddInPlace, SoftmaxRow, Dot.
#include <algorithm>
#include <cmath>

#include "ops/avx2/avx2.h"
#include "ops/avx2/simd.h"

namespace polestar::avx2 {

float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  if (i + 8 <= n) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    i += 8;
  }
  float sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * c;
    float* oi = out + i * c;
    const float inv = 1.0f / std::sqrt(Dot(xi, xi, c) / float(c) + eps);
    const __m256 inv_v = _mm256_set1_ps(inv);
    int64_t j = 0;
    for (; j + 8 <= c; j += 8) {
      const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(xi + j), inv_v);
      _mm256_storeu_ps(oi + j, _mm256_mul_ps(scaled, _mm256_loadu_ps(weight + j)));
    }
    for (; j < c; ++j) oi[j] = xi[j] * inv * weight[j];
  }
}

namespace {

// silu(g) * u, lane by lane.
__m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 denominator =
      _mm256_add_ps(_mm256_set1_ps(1.0f), Exp(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f))));
  return _mm256_mul_ps(_mm256_div_ps(g, denominator), u);
}

}  // namespace

void SiluMul(float* gate, const float* up, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(gate + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  // The tail goes through the same vector formula on a padded copy (std::exp rounds
  // differently from Exp): an element's bits must not depend on whether it falls in the
  // tail, which moves with the batch's rows and with the threads' chunk boundaries.
  if (i < count) {
    alignas(32) float g[8] = {}, u[8] = {};  // [8]: the tail, zero-padded
    std::copy(gate + i, gate + count, g);
    std::copy(up + i, up + count, u);
    _mm256_store_ps(g, SiluMul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(g, g + (count - i), gate + i);
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) x[i] += y[i];
}

void SoftmaxRow(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 max_v = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) max_v = _mm256_max_ps(max_v, _mm256_loadu_ps(x + i));
  float max_value = HorizontalMax(max_v);
  for (; i < n; ++i) max_value = std::max(max_value, x[i]);

  const __m256 shift = _mm256_set1_ps(max_value);
  __m256 total_v = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(x + i, e);
    total_v = _mm256_add_ps(total_v, e);
  }
  float total = HorizontalSum(total_v);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    total += x[i];
  }

  const float inv = 1.0f / total;
  const __m256 inv_v = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv_v));
  for (; i < n; ++i) x[i] *= inv;
}

}  // namespace polestar::avx2
