// One query head against all cached rows: scores four keys at a time, softmax, then the
// probability-weighted sum of values with the output held in registers.
#include <cmath>

#include "ops/avx2/avx2.h"
#include "ops/avx2/simd.h"

namespace polestar::avx2 {
namespace {

// scores[j] = q · k_j * scale for j < l; keys are kv_stride floats apart.
void Scores(const float* q, const float* k, int64_t l, int64_t kv_stride, int head_dim, float scale,
            float* scores) {
  const int d8 = head_dim & ~7;
  int64_t j = 0;
  for (; j + 4 <= l; j += 4) {
    const float* k0 = k + j * kv_stride;
    const float* k1 = k0 + kv_stride;
    const float* k2 = k1 + kv_stride;
    const float* k3 = k2 + kv_stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int d = 0; d < d8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    alignas(16) float sums[4];
    _mm_store_ps(sums, HorizontalSum4(a0, a1, a2, a3));
    for (int d = d8; d < head_dim; ++d) {
      sums[0] += q[d] * k0[d];
      sums[1] += q[d] * k1[d];
      sums[2] += q[d] * k2[d];
      sums[3] += q[d] * k3[d];
    }
    for (int t = 0; t < 4; ++t) scores[j + t] = sums[t] * scale;
  }
  for (; j < l; ++j) scores[j] = Dot(q, k + j * kv_stride, head_dim) * scale;
}

// out[8 * kVectors] = sum_j probs[j] v_j[...] with the output slice held in registers;
// up to eight independent accumulation chains hide the FMA latency.
template <int kVectors>
void WeightedSum(const float* probs, const float* v, int64_t l, int64_t kv_stride, float* out) {
  __m256 acc[kVectors];
  for (int c = 0; c < kVectors; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < l; ++j) {
    const __m256 p = _mm256_broadcast_ss(probs + j);
    const float* vj = v + j * kv_stride;
    for (int c = 0; c < kVectors; ++c)
      acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * c), acc[c]);
  }
  for (int c = 0; c < kVectors; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

}  // namespace

void AttendHead(const float* q, const float* k, const float* v, int64_t l, int64_t kv_stride,
                int head_dim, float* probs, float* out) {
  Scores(q, k, l, kv_stride, head_dim, 1.0f / std::sqrt(float(head_dim)), probs);
  SoftmaxRow(probs, l);
  int d = 0;
  for (; d + 64 <= head_dim; d += 64) WeightedSum<8>(probs, v + d, l, kv_stride, out + d);
  using SumFn = void (*)(const float*, const float*, int64_t, int64_t, float*);
  constexpr SumFn kSums[8] = {nullptr,        WeightedSum<1>, WeightedSum<2>, WeightedSum<3>,
                              WeightedSum<4>, WeightedSum<5>, WeightedSum<6>, WeightedSum<7>};
  if (const int vectors = (head_dim - d) / 8; vectors > 0) {
    kSums[vectors](probs, v + d, l, kv_stride, out + d);
  }
  d = head_dim & ~7;
  for (; d < head_dim; ++d) {
    float sum = 0.0f;
    for (int64_t j = 0; j < l; ++j) sum += probs[j] * v[j * kv_stride + d];
    out[d] = sum;
  }
}

}  // namespace polestar::avx2
