#include "train/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/parallel.h"

namespace polestar::train {

void LinearForward(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x, int(k), w,
              int(k), 0.0f, y, int(n));
}

void LinearBackward(const float* dy, const float* x, const float* w, int64_t m, int64_t k,
                    int64_t n, float* dx, float* dw, bool accumulate_dx) {
  if (dx != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(k), int(n), 1.0f, dy, int(n),
                w, int(k), accumulate_dx ? 1.0f : 0.0f, dx, int(k));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(n), int(k), int(m), 1.0f, dy, int(n), x,
              int(k), 1.0f, dw, int(k));
}

void RmsNormForward(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* y,
                    float* inv_rms) {
  ParallelFor(m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * c;
      float sum = 0.0f;
      for (int64_t i = 0; i < c; ++i) sum += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(sum / float(c) + eps);
      inv_rms[r] = inv;
      for (int64_t i = 0; i < c; ++i) y[r * c + i] = xr[i] * inv * weight[i];
    }
  });
}

void RmsNormBackward(const float* dy, const float* x, const float* weight, const float* inv_rms,
                     int64_t m, int64_t c, float* dx, float* dweight) {
  // dweight is summed per fixed chunk of rows, then over chunks in order: deterministic
  // for any thread count.
  const int64_t chunks = std::min<int64_t>(16, std::max<int64_t>(1, m));
  std::vector<float> partial(size_t(chunks * c), 0.0f);  // [chunks, C]
  ParallelFor(chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      float* part = &partial[size_t(chunk * c)];
      for (int64_t r = m * chunk / chunks; r < m * (chunk + 1) / chunks; ++r) {
        const float* xr = x + r * c;
        const float* dyr = dy + r * c;
        const float inv = inv_rms[r];
        float dot = 0.0f;  // sum_i dy_i w_i x_i
        for (int64_t i = 0; i < c; ++i) dot += dyr[i] * weight[i] * xr[i];
        const float coef = dot * inv * inv * inv / float(c);
        for (int64_t i = 0; i < c; ++i) {
          dx[r * c + i] += inv * dyr[i] * weight[i] - coef * xr[i];
          part[i] += dyr[i] * xr[i] * inv;
        }
      }
    }
  });
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    for (int64_t i = 0; i < c; ++i) dweight[i] += partial[size_t(chunk * c + i)];
  }
}

void Rope(float* x, int64_t m, int64_t stride, int heads, std::span<const int> positions,
          const RopeTable& table, bool inverse) {
  PS_CHECK(int64_t(positions.size()) == m);
  const int head_dim = table.head_dim;
  const int half = table.rotary_dim / 2;
  const float direction = inverse ? -1.0f : 1.0f;
  ParallelFor(m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      PS_CHECK(size_t(positions[r] + 1) * half <= table.cos.size());
      const float* cos_row = &table.cos[size_t(positions[r]) * half];
      const float* sin_row = &table.sin[size_t(positions[r]) * half];
      for (int h = 0; h < heads; ++h) {
        float* xh = x + r * stride + int64_t(h) * head_dim;
        for (int f = 0; f < half; ++f) {
          const float cos_a = cos_row[f], sin_a = direction * sin_row[f];
          const float x0 = xh[f], x1 = xh[f + half];
          xh[f] = x0 * cos_a - x1 * sin_a;
          xh[f + half] = x1 * cos_a + x0 * sin_a;
        }
      }
    }
  });
}

namespace {

std::vector<int64_t> ProbOffsets(std::span<const int> starts, int heads) {
  std::vector<int64_t> offsets(starts.size(), 0);
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    const int64_t len = starts[b + 1] - starts[b];
    offsets[b + 1] = offsets[b] + heads * len * len;
  }
  return offsets;
}

}  // namespace

int64_t AttentionProbsSize(std::span<const int> starts, int heads) {
  return ProbOffsets(starts, heads).back();
}

namespace {

// The per-(sequence, head) kernels keep every inner loop a contiguous multiply-add over one
// index (no float reductions), so they vectorise; built for AVX2 with a generic fallback.
// A ThreadSanitizer build has no clones: their ifunc resolvers run while the dynamic loader
// relocates the program, before TSan's runtime starts, and clang 14 instruments them (a crash).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define POLESTAR_TRAIN_NO_CLONES
#endif
#endif
#ifdef POLESTAR_TRAIN_NO_CLONES
#define POLESTAR_TRAIN_SIMD
#else
#define POLESTAR_TRAIN_SIMD __attribute__((target_clones("arch=haswell", "default")))
#endif

// Copies column block [L, D] (row stride `stride`) transposed into t[D, L].
void Transpose(const float* __restrict__ x, int64_t len, int64_t stride, int head_dim,
               float* __restrict__ t) {
  for (int64_t j = 0; j < len; ++j) {
    for (int d = 0; d < head_dim; ++d) t[d * len + j] = x[j * stride + d];
  }
}

POLESTAR_TRAIN_SIMD
void HeadForward(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, int64_t len, int64_t stride, int64_t out_stride,
                 int head_dim, float scale, float* __restrict__ kt, float* __restrict__ p,
                 float* __restrict__ out) {
  Transpose(k, len, stride, head_dim, kt);
  for (int64_t i = 0; i < len; ++i) {
    float* row = p + i * len;
    std::fill(row, row + len, 0.0f);
    for (int d = 0; d < head_dim; ++d) {
      const float qd = q[i * stride + d] * scale;
      const float* ktd = kt + d * len;
      for (int64_t j = 0; j < len; ++j) row[j] += qd * ktd[j];
    }
    float max = -INFINITY;
    for (int64_t j = 0; j < len; ++j) max = std::max(max, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < len; ++j) sum += (row[j] = std::exp(row[j] - max));
    const float inv = 1.0f / sum;
    float* o = out + i * out_stride;
    std::fill(o, o + head_dim, 0.0f);
    for (int64_t j = 0; j < len; ++j) {
      row[j] *= inv;
      const float pj = row[j];
      const float* vj = v + j * stride;
      for (int d = 0; d < head_dim; ++d) o[d] += pj * vj[d];
    }
  }
}

POLESTAR_TRAIN_SIMD
void HeadBackward(const float* __restrict__ dout, int64_t out_stride, const float* __restrict__ q,
                  const float* __restrict__ k, const float* __restrict__ v,
                  const float* __restrict__ p, int64_t len, int64_t stride, int head_dim,
                  float scale, float* __restrict__ vt, float* __restrict__ dp,
                  float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv) {
  Transpose(v, len, stride, head_dim, vt);
  for (int64_t i = 0; i < len; ++i) {
    const float* dov = dout + i * out_stride;
    const float* row = p + i * len;
    std::fill(dp, dp + len, 0.0f);
    for (int d = 0; d < head_dim; ++d) {
      const float g = dov[d];
      const float* vtd = vt + d * len;
      for (int64_t j = 0; j < len; ++j) dp[j] += g * vtd[j];
    }
    float row_dot = 0.0f;
    for (int64_t j = 0; j < len; ++j) row_dot += dp[j] * row[j];
    const float* qi = q + i * stride;
    float* dqi = dq + i * stride;
    for (int64_t j = 0; j < len; ++j) {
      const float pj = row[j];
      const float ds = pj * (dp[j] - row_dot) * scale;
      const float* kj = k + j * stride;
      float* dkj = dk + j * stride;
      float* dvj = dv + j * stride;
      for (int d = 0; d < head_dim; ++d) dvj[d] += pj * dov[d];
      for (int d = 0; d < head_dim; ++d) dqi[d] += ds * kj[d];
      for (int d = 0; d < head_dim; ++d) dkj[d] += ds * qi[d];
    }
  }
}

}  // namespace

void AttentionForward(const float* qkv, std::span<const int> starts, int heads, int head_dim,
                      float* out, float* probs) {
  const int64_t width = int64_t(heads) * head_dim, stride = 3 * width;
  const std::vector<int64_t> offsets = ProbOffsets(starts, heads);
  const int64_t sequences = int64_t(starts.size()) - 1;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  ParallelFor(sequences * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt;  // [D, L]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      const int64_t base = starts[b], len = starts[b + 1] - starts[b];
      kt.resize(size_t(len * head_dim));
      const float* row0 = qkv + base * stride + h * head_dim;
      HeadForward(row0, row0 + width, row0 + 2 * width, len, stride, width, head_dim, scale,
                  kt.data(), probs + offsets[b] + h * len * len, out + base * width + h * head_dim);
    }
  });
}

void AttentionBackward(const float* dout, const float* qkv, const float* probs,
                       std::span<const int> starts, int heads, int head_dim, float* dqkv) {
  const int64_t width = int64_t(heads) * head_dim, stride = 3 * width;
  const std::vector<int64_t> offsets = ProbOffsets(starts, heads);
  const int64_t sequences = int64_t(starts.size()) - 1;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  PS_CHECK(!starts.empty() && starts.front() == 0);
  std::memset(dqkv, 0, sizeof(float) * size_t(starts.back()) * size_t(stride));
  ParallelFor(sequences * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> vt, dp;  // [D, L], [L]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      const int64_t base = starts[b], len = starts[b + 1] - starts[b];
      vt.resize(size_t(len * head_dim));
      dp.resize(size_t(len));
      const int64_t at = base * stride + h * head_dim;
      HeadBackward(dout + base * width + h * head_dim, width, qkv + at, qkv + at + width,
                   qkv + at + 2 * width, probs + offsets[b] + h * len * len, len, stride, head_dim,
                   scale, vt.data(), dp.data(), dqkv + at, dqkv + at + width,
                   dqkv + at + 2 * width);
    }
  });
}

void SwigluForward(const float* gu, int64_t m, int64_t f, float* act) {
  ParallelFor(m, 32, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gu + r * 2 * f;
      const float* u = g + f;
      for (int64_t i = 0; i < f; ++i) act[r * f + i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void SwigluBackward(const float* dact, const float* gu, int64_t m, int64_t f, float* dgu) {
  ParallelFor(m, 32, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gu + r * 2 * f;
      const float* u = g + f;
      float* dg = dgu + r * 2 * f;
      float* du = dg + f;
      for (int64_t i = 0; i < f; ++i) {
        const float sig = 1.0f / (1.0f + std::exp(-g[i]));
        const float d = dact[r * f + i];
        du[i] = d * g[i] * sig;
        dg[i] = d * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      }
    }
  });
}

double CrossEntropy(const float* logits, int64_t rows, int64_t vocab, std::span<const int> targets,
                    std::span<const float> weights, float* dlogits) {
  PS_CHECK(int64_t(targets.size()) == rows && int64_t(weights.size()) == rows);
  std::vector<double> losses(static_cast<size_t>(rows));
  ParallelFor(rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* z = logits + r * vocab;
      float* dz = dlogits + r * vocab;
      const int target = targets[size_t(r)];
      PS_CHECK(target >= 0 && target < vocab);
      float max = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) max = std::max(max, z[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(z[i] - max));
      const double lse = double(max) + std::log(sum);
      const float w = weights[size_t(r)];
      losses[size_t(r)] = w * (lse - double(z[target]));
      for (int64_t i = 0; i < vocab; ++i) dz[i] = w * float(std::exp(double(z[i]) - lse));
      dz[target] -= w;
    }
  });
  double total = 0.0;
  for (double loss : losses) total += loss;
  return total;
}

}  // namespace polestar::train
