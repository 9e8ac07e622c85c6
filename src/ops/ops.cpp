#include "ops/ops.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "ops/avx2/avx2.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {

// Lives here, in a file built without AVX2 flags, so the check itself runs on any CPU.
// F16C is read from CPUID (leaf 1, ECX): clang's __builtin_cpu_supports does not know it.
bool avx2::Supported() {
  static const bool supported = [] {
    unsigned eax, ebx, ecx, edx;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return supported;
}

namespace {

// Work below this many multiply-adds is not worth waking another thread for.
constexpr int64_t kMinParallelWork = 1 << 16;

int64_t GrainFor(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(work_per_item, 1));
}

}  // namespace

void MatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias) {
  if (QuantMatMul(x, m, w, y, bias)) return;  // block-quantised weights (ops/quant.h)
  // Threads take whole 16-row panels of w, so every thread converts its own weights once.
  constexpr int64_t kPanel = 16;
  const int64_t panels = (w.rows + kPanel - 1) / kPanel;
  const auto columns = avx2::Supported() ? avx2::MatMulColumns : reference::MatMulColumns;
  ParallelFor(panels, GrainFor(kPanel * w.cols * m), [&](int64_t p_begin, int64_t p_end) {
    const int64_t n_begin = p_begin * kPanel;
    const int64_t n_end = std::min(p_end * kPanel, w.rows);
    columns(x, m, w, n_begin, n_end, y + n_begin, w.rows);
  });
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) AddInPlace(y + i * w.rows, bias, w.rows);
  }
}

void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  if (avx2::Supported()) {
    avx2::DequantizeRow(w, n, out);
  } else {
    reference::DequantizeRow(w, n, out);
  }
}

void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* out) {
  const auto norm = avx2::Supported() ? avx2::RmsNorm : reference::RmsNorm;
  ParallelFor(m, GrainFor(c), [&](int64_t begin, int64_t end) {
    norm(x + begin * c, end - begin, c, weight, eps, out + begin * c);
  });
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
  const int group = heads / kv_heads;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  const auto attend = avx2::Supported() ? avx2::AttendHead : reference::AttendHead;
  // Each (query row, head) pair is independent; pair p is row p / H, head p % H.
  ParallelFor(m * heads, GrainFor(2 * l * head_dim), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(probs == nullptr ? size_t(l) : 0);  // [L]
    for (int64_t pair = begin; pair < end; ++pair) {
      const int h = int(pair % heads);
      const int64_t kv_offset = int64_t(h / group) * head_dim;
      attend(q + pair * head_dim, k + kv_offset, v + kv_offset, l, kv_stride, head_dim,
             probs == nullptr ? scratch.data() : probs + pair * l, out + pair * head_dim);
    }
  });
}

void SiluMul(float* gate, const float* up, int64_t count) {
  const auto kernel = avx2::Supported() ? avx2::SiluMul : reference::SiluMul;
  ParallelFor(count, kMinParallelWork / 16,
              [&](int64_t begin, int64_t end) { kernel(gate + begin, up + begin, end - begin); });
}

void AddInPlace(float* x, const float* y, int64_t n) {
  if (avx2::Supported()) {
    avx2::AddInPlace(x, y, n);
  } else {
    reference::AddInPlace(x, y, n);
  }
}

void SoftmaxRow(float* x, int64_t n) {
  if (avx2::Supported()) {
    avx2::SoftmaxRow(x, n);
  } else {
    reference::SoftmaxRow(x, n);
  }
}

}  // namespace polestar
