// AVX-512 kernels (F, BW, VL, DQ, VNNI on top of the AVX2 set). The files in ops/avx512/ are
// the only ones compiled with those instruction sets; the CPU backend
// (backend/cpu/cpu_backend.cpp) chooses them once, when IsaSupported(Isa::kAvx512) says yes
// (ops/isa.h). Each function here computes what its scalar twin of the same name in
// ops/reference.h computes (up to the order of float additions); ops_test.cpp holds them to it.
//
// This header declares plain C++ signatures only, so code built without AVX-512 may include it.
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace polestar::avx512 {

// Single-threaded; see reference::MatMulColumns. F32, BF16 and F16 weights run here, every
// other type on avx2::MatMulColumns. Bits per output as avx2::MatMulColumns says, with the
// path chosen by DotPathMaxRows below.
void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy);
// The most rows MatMulColumns takes by its dot path for `type` (see avx2::DotPathMaxRows).
int64_t DotPathMaxRows(DType type);

}  // namespace polestar::avx512
