// ggml's block-quantised weight formats (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): scalar
// dequantisation (the reference every SIMD kernel is tested against), the quantisers that
// write GGUF files, and the matmul on quantised weights.
//
// Block layouts (little-endian, f16 = IEEE binary16; ggml-common.h):
//   Q8_0  32 values, 34 bytes: f16 d; i8 qs[32]                  y = qs * d
//   Q4_0  32 values, 18 bytes: f16 d; u8 qs[16]                  y[j] = (lo(qs[j]) - 8) * d,
//                                                                y[j+16] = (hi(qs[j]) - 8) * d
//   Q4_K 256 values, 144 bytes: f16 d, dmin; u8 scales[12]; u8 qs[128]
//         8 sub-blocks of 32 with 6-bit scale sc and min m: y = d*sc * q - dmin*m, q 4-bit
//   Q5_K 256 values, 176 bytes: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
//         as Q4_K with a fifth bit per value in qh
//   Q6_K 256 values, 210 bytes: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d (last)
//         16 sub-blocks of 16: y = d*sc * (q - 32), q 6-bit
//
// Activations stay in fp32: the kernels dequantise weight blocks in registers and multiply
// them with fp32 inputs (no int8 activation products), so a quantised model's logits
// follow the dequantised weights to fp32 rounding.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "ops/isa.h"
#include "ops/ops.h"

namespace polestar {

bool IsBlockQuantized(DType type);  // Q8_0, Q4_0, Q4_K, Q5_K, Q6_K

// Converts n values stored as `type` (F32, F16, BF16 or a block type; n a multiple of
// BlockSize(type)) to floats. Scalar; computes exactly what ggml's dequantize_row_* does.
void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out);

// Writes n floats as `type` into RowBytes(type, n) bytes, reproducing ggml's reference
// quantisers (quantize_row_*_ref, fp16/bf16 rounding) bit for bit. Supports F32, F16,
// BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
void QuantizeValues(DType type, const float* src, int64_t n, uint8_t* dst);

// y[M, N] = x[M, K] · w[N, K]^T (+ bias) for block-quantised w, on the widest kernels at
// or below `isa` (the CPU backend's choice). Returns false, doing nothing, when w is not
// block-quantised (the caller's kernels handle it).
bool QuantMatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias,
                 Isa isa);

namespace avx2 {

// The AVX2 twin of DequantizeValues for the block types; bit-identical results.
void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out);
// Columns [n_begin, n_end) of y = x·w^T, written at y + i * ldy + (n - n_begin).
void QuantMatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin,
                        int64_t n_end, float* y, int64_t ldy);

}  // namespace avx2
}  // namespace polestar
