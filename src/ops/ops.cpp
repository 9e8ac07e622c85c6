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

}  // namespace polestar
