#include "train/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/parallel.h"

namespace polestar::train {

// The trainer runs OpenBLAS single-threaded (Trainer sets it) and splits each product over
// its output rows here: with a second thread pool beside OpenMP's, the two pools' idle
// threads spun against each other on two cores (a third of the step in sched_yield).
void LinearForward(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y) {
  ParallelFor(m, 64, [&](int64_t begin, int64_t end) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(end - begin), int(n), int(k), 1.0f,
                x + begin * k, int(k), w, int(k), 0.0f, y + begin * n, int(n));
  });
}

void LinearBackward(const float* dy, const float* x, const float* w, int64_t m, int64_t k,
                    int64_t n, float* dx, float* dw, bool accumulate_dx) {
  if (dx != nullptr) {
    ParallelFor(m, 64, [&](int64_t begin, int64_t end) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(end - begin), int(k), int(n), 1.0f,
                  dy + begin * n, int(n), w, int(k), accumulate_dx ? 1.0f : 0.0f, dx + begin * k,
                  int(k));
    });
  }
  // dw's rows split over threads: each row is still the whole sum over the M rows.
  ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(end - begin), int(k), int(m), 1.0f,
                dy + begin, int(n), x, int(k), 1.0f, dw + begin * k, int(k));
  });
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

// One (sequence, head) of attention is four or six small matrix products (L x L x D), each
// one single-threaded sgemm (threads split the (sequence, head) pairs); only the softmax and
// its backward are element-wise loops here.

// p[L, L] = softmax(q k^T * scale) row by row; out[L, D] = p v.
void HeadForward(const float* q, const float* k, const float* v, int64_t len, int64_t stride,
                 int64_t out_stride, int head_dim, float scale, float* p, float* out) {
  const int l = int(len), d = head_dim;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l, l, d, scale, q, int(stride), k,
              int(stride), 0.0f, p, l);
  for (int64_t i = 0; i < len; ++i) {
    float* row = p + i * len;
    float max = -INFINITY;
    for (int64_t j = 0; j < len; ++j) max = std::max(max, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < len; ++j) sum += (row[j] = std::exp(row[j] - max));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < len; ++j) row[j] *= inv;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, l, d, l, 1.0f, p, l, v, int(stride), 0.0f,
              out, int(out_stride));
}

// With ds = p * (dout v^T - rowsum(p * dout v^T)) * scale:
// dv = p^T dout, dq = ds k, dk = ds^T q (the three overwrite their [L, D] blocks).
// ds[L, L] is scratch.
void HeadBackward(const float* dout, int64_t out_stride, const float* q, const float* k,
                  const float* v, const float* p, int64_t len, int64_t stride, int head_dim,
                  float scale, float* ds, float* dq, float* dk, float* dv) {
  const int l = int(len), d = head_dim, s = int(stride);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l, l, d, 1.0f, dout, int(out_stride), v, s,
              0.0f, ds, l);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l, d, l, 1.0f, p, l, dout, int(out_stride),
              0.0f, dv, s);
  for (int64_t i = 0; i < len; ++i) {
    const float* row = p + i * len;
    float* dsi = ds + i * len;
    float row_dot = 0.0f;
    for (int64_t j = 0; j < len; ++j) row_dot += dsi[j] * row[j];
    for (int64_t j = 0; j < len; ++j) dsi[j] = row[j] * (dsi[j] - row_dot) * scale;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, l, d, l, 1.0f, ds, l, k, s, 0.0f, dq, s);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l, d, l, 1.0f, ds, l, q, s, 0.0f, dk, s);
}

}  // namespace

void AttentionForward(const float* qkv, std::span<const int> starts, int heads, int head_dim,
                      float* out, float* probs) {
  const int64_t width = int64_t(heads) * head_dim, stride = 3 * width;
  const std::vector<int64_t> offsets = ProbOffsets(starts, heads);
  const int64_t sequences = int64_t(starts.size()) - 1;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  ParallelFor(sequences * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      const int64_t base = starts[b], len = starts[b + 1] - starts[b];
      if (len == 0) continue;
      const float* row0 = qkv + base * stride + h * head_dim;
      HeadForward(row0, row0 + width, row0 + 2 * width, len, stride, width, head_dim, scale,
                  probs + offsets[b] + h * len * len, out + base * width + h * head_dim);
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
  ParallelFor(sequences * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds;  // [L, L]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      const int64_t base = starts[b], len = starts[b + 1] - starts[b];
      if (len == 0) continue;
      ds.resize(size_t(len * len));
      const int64_t at = base * stride + h * head_dim;
      HeadBackward(dout + base * width + h * head_dim, width, qkv + at, qkv + at + width,
                   qkv + at + 2 * width, probs + offsets[b] + h * len * len, len, stride, head_dim,
                   scale, ds.data(), dqkv + at, dqkv + at + width, dqkv + at + 2 * width);
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
