// The AVX2 kernels that equal their scalar twins bit for bit, for what Polestar's decisions
// read: its attention probabilities (cluster ranking, commit gate) and its k-means
// similarities (cluster labels). Each result is still one chain of separately rounded
// products and sums in the scalar loop's order, only several results side by side. This file
// is built without FMA contraction (ops/CMakeLists.txt), so the compiler cannot fuse them.
#include <immintrin.h>

#include <cmath>

#include "ops/avx2/avx2.h"
#include "ops/reference.h"

namespace polestar::avx2 {
namespace {

// rows[0..7] in, columns out: after it, lane r of v[c] holds what lane c of v[r] held.
inline void Transpose8x8(__m256 v[8]) {
  __m256 t[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(v[2 * p], v[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(v[2 * p], v[2 * p + 1]);
  }
  __m256 u[8];
  for (int p = 0; p < 2; ++p) {
    const int a = 4 * p;
    u[a] = _mm256_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
    v[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
  }
}

}  // namespace

void HeadProbabilitiesSideBySide(const float* q, const float* k, int64_t l, int64_t kv_stride,
                                 int head_dim, float* probs) {
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const int d8 = head_dim & ~7;
  int64_t j = 0;
  for (; j + 8 <= l; j += 8) {
    const float* rows = k + j * kv_stride;  // keys j..j+7, kv_stride apart
    __m256 sums = _mm256_setzero_ps();      // lane r: key j + r
    for (int d = 0; d < d8; d += 8) {
      __m256 column[8];  // after the transpose, lane r of column[dd]: rows[r][d + dd]
      for (int r = 0; r < 8; ++r) column[r] = _mm256_loadu_ps(rows + r * kv_stride + d);
      Transpose8x8(column);
      for (int dd = 0; dd < 8; ++dd) {
        sums = _mm256_add_ps(sums, _mm256_mul_ps(_mm256_set1_ps(q[d + dd]), column[dd]));
      }
    }
    for (int d = d8; d < head_dim; ++d) {
      const __m256 column =
          _mm256_setr_ps(rows[d], rows[kv_stride + d], rows[2 * kv_stride + d],
                         rows[3 * kv_stride + d], rows[4 * kv_stride + d], rows[5 * kv_stride + d],
                         rows[6 * kv_stride + d], rows[7 * kv_stride + d]);
      sums = _mm256_add_ps(sums, _mm256_mul_ps(_mm256_set1_ps(q[d]), column));
    }
    _mm256_storeu_ps(probs + j, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
  }
  for (; j < l; ++j) probs[j] = reference::Dot(q, k + j * kv_stride, head_dim) * scale;
  reference::SoftmaxRow(probs, l);
}

// Sixteen points side by side (four vectors of four doubles held in registers over all d).
void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u,
                        double* out) {
  constexpr int kVectors = 4;
  int64_t i = 0;
  for (; i + 4 * kVectors <= n; i += 4 * kVectors) {
    __m256d sums[kVectors];
    for (int v = 0; v < kVectors; ++v) sums[v] = _mm256_setzero_pd();
    for (int64_t j = 0; j < d; ++j) {
      const __m256d scale = _mm256_set1_pd(u[j]);
      const double* x = x_by_dim + j * n + i;
      for (int v = 0; v < kVectors; ++v) {
        sums[v] = _mm256_add_pd(sums[v], _mm256_mul_pd(_mm256_loadu_pd(x + 4 * v), scale));
      }
    }
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_pd(out + i + 4 * v, sums[v]);
  }
  for (; i + 4 <= n; i += 4) {
    __m256d sum = _mm256_setzero_pd();
    for (int64_t j = 0; j < d; ++j) {
      sum = _mm256_add_pd(
          sum, _mm256_mul_pd(_mm256_loadu_pd(x_by_dim + j * n + i), _mm256_set1_pd(u[j])));
    }
    _mm256_storeu_pd(out + i, sum);
  }
  for (; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += x_by_dim[j * n + i] * u[j];
    out[i] = sum;
  }
}

}  // namespace polestar::avx2
