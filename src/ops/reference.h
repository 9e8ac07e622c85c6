// Scalar reference kernels: the test oracle for every SIMD kernel and the fallback on
// CPUs without AVX2. Written for clarity, single-threaded.
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace polestar::reference {

// One output row block: y[M, n_end - n_begin] for columns [n_begin, n_end) of w,
// written at y + i * ldy + (n - n_begin).
void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy);

float Dot(const float* a, const float* b, int64_t n);

void DequantizeRow(const WeightView& w, int64_t n, float* out);

void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
               int kv_heads, int head_dim, float* out, float* probs);

}  // namespace polestar::reference
