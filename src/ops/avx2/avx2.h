// AVX2 + FMA + F16C kernels. The files in ops/avx2/ are the only ones compiled with those
// instruction sets; the CPU backend (backend/cpu/cpu_backend.cpp) chooses them once, when
// IsaSupported(Isa::kAvx2) says yes (ops/isa.h), and otherwise runs the scalar twins in
// ops/reference.h. Each function here computes what its twin of the
// same name computes (up to the order of float additions); ops_test.cpp holds them to it.
//
// This header declares plain C++ signatures only, so code built without AVX2 may include it.
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace polestar::avx2 {

// Single-threaded; see reference::MatMulColumns. Each output's bits depend on its own row
// of x, its weight row and the path the call takes (dot for m <= DotPathMaxRows(w.dtype),
// panel above), nothing else: not the other rows, the row's position among them, nor where
// [n_begin, n_end) falls. Batched products rely on it (CpuBackend::MatMulBatch).
void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy);
// The most rows MatMulColumns takes by its dot path for `type`; above, the panel path, which
// rounds differently (0 for types on the scalar twin, whose one path serves every M).
int64_t DotPathMaxRows(DType type);

void DequantizeRow(const WeightView& w, int64_t n, float* out);

float Dot(const float* a, const float* b, int64_t n);
void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t count);
void AddInPlace(float* x, const float* y, int64_t n);
void SoftmaxRow(float* x, int64_t n);

// See reference::AttendHead.
void AttendHead(const float* q, const float* k, const float* v, int64_t l, int64_t kv_stride,
                int head_dim, float* probs, float* out);
// Bit for bit their twins' (ops/avx2/exact.cpp), unlike the kernels above.
void HeadProbabilitiesSideBySide(const float* q, const float* k, int64_t l, int64_t kv_stride,
                                 int head_dim, float* probs);
void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u, double* out);

}  // namespace polestar::avx2
