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
// Matrix products (QuantMatMul) come two ways, by ActivationPrecision (ops/isa.h):
// * kReduced (the default): integer products, as ggml's CPU kernels do them. Each call rounds
//   its activations to 8 bits (QuantizeActivations: per block of values one float scale
//   d = max|x| / 127 and levels q = round_half_even(x * (127 / max|x|)), so x = d * q + e
//   with |e| <= d / 2), then multiplies weight levels with activation levels in exact
//   integer sums per weight (sub-)block, which the blocks' float scales then scale. Two to
//   four times the fp32 path's speed; on the GGUF fixtures the rounding moves logits by
//   1.3-1.8e-2 of the largest logit (an error well below the weight quantisation's own) and
//   changes some of their decode traces.
// * kF32: weight blocks dequantised in registers and multiplied with fp32 activations, so a
//   quantised model's logits follow the dequantised weights to fp32 rounding: exact against
//   the reference code run on the dequantised weights, token for token (the GGUF fixtures'
//   1e-3 and their decode traces hold).
//
// Numeric contract of the integer products. Against the fp32 reference
// (reference::MatMulColumns: dequantised weights times fp32 activations), output
// y_n = sum_k w_nk x_k differs by the activation rounding, at most sum_k |w_nk| * d(k) / 2
// where d(k) is the scale of the activation block holding k (plus 2^-22 |x_k| for the
// rounded inverse scale), and by float rounding of the order of 1e-6 * sum_k |w_nk x_k|;
// quant_test holds the kernels to that bound. The SIMD kernels compute the same integer sums
// as their scalar twins (QuantDotColumns), so they differ from them only in the order of the
// float additions (and the AVX-512 K-quant kernels add the mins' products in float).
#pragma once

#include <cstdint>
#include <vector>

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
// or below `isa` (the CPU backend's choice), with `activations` as above: kReduced quantises x
// once, then the output columns are split among threads. Returns false, doing nothing, when
// w is not block-quantised (the caller's kernels handle it).
bool QuantMatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias,
                 Isa isa, ActivationPrecision activations);

// --- integer matrix products ---

// Activations x[M, K] rounded to 8 bits, `block` values per scale: 32 for Q8_0 / Q4_0
// weights, 256 (one scale per super-block) for the K-quants. Levels lie in [-127, 127]: the
// quantiser never writes -128, which the kernels' saturation arguments rely on.
struct QuantizedActivations {
  int64_t rows = 0, cols = 0;       // M, K
  int block = 32;                   // values per scale
  std::vector<int8_t> q;            // [M, K] levels
  std::vector<float> scales;        // [M, K / block]: x = scale * q
  std::vector<int16_t> group_sums;  // [M, K / 16]: the sum of q over each 16 values

  // Sets the shape and sizes the buffers for it (K a multiple of `block`, itself a multiple
  // of 16); reuses their memory when it is large enough.
  void Reshape(int64_t m, int64_t k, int block_values);
};

// The activation block the integer kernels of `weight_type` take: 32 or 256.
int ActivationBlock(DType weight_type);

// Quantises x[M, K] (K a multiple of `block`, itself a multiple of 16) into *out, resizing
// its buffers. Scalar; avx2::QuantizeActivations gives the same bytes.
void QuantizeActivations(const float* x, int64_t m, int64_t k, int block,
                         QuantizedActivations* out);

// Columns [n_begin, n_end) of y = x·w^T for x quantised with block ActivationBlock(w.dtype),
// written at y + i * ldy + (n - n_begin). The scalar twin of the SIMD kernels: exact integer
// sums per weight block, then float scaling, accumulated block after block.
void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy);

// A K-quant super-block's multipliers as the integer kernels apply them: its 256 values are
// y = d * scales[g] * level - dmin * mins[g] for the 16 values of group g (level unsigned:
// Q4_K 4 bits, Q5_K 5, Q6_K 6 with its offset 32 folded into mins = 32 * scales, dmin = d).
struct KQuantMultipliers {
  float d = 0, dmin = 0;
  int16_t scales[16] = {};
  int16_t mins[16] = {};
};
KQuantMultipliers KQuantMultipliersOf(DType type, const uint8_t* block);

namespace avx2 {

// The AVX2 twin of DequantizeValues for the block types; bit-identical results.
void DequantizeValues(DType type, const uint8_t* src, int64_t n, float* out);
// The levels of row[K] of block-quantised weights as the integer kernels multiply them, one
// byte per value: Q8_0 / Q4_0 signed (Q8_0's bytes, Q4_0's nibbles - 8; y = d * level), the
// K-quants unsigned (see KQuantMultipliers). Shared with the AVX-512 kernels (AVX-512 CPUs
// all run AVX2).
void WeightLevels(DType type, const uint8_t* row, int64_t k, uint8_t* levels);
// Columns [n_begin, n_end) of y = x·w^T on fp32 activations (ActivationPrecision::kF32),
// written at y + i * ldy + (n - n_begin).
void QuantMatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin,
                        int64_t n_end, float* y, int64_t ldy);
// Bit-identical to the scalar QuantizeActivations.
void QuantizeActivations(const float* x, int64_t m, int64_t k, int block,
                         QuantizedActivations* out);
// See the scalar QuantDotColumns.
void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy);

}  // namespace avx2

namespace avx512 {

// AVX-512 VNNI kernels; see the scalar QuantDotColumns.
void QuantDotColumns(const QuantizedActivations& x, const WeightView& w, int64_t n_begin,
                     int64_t n_end, float* y, int64_t ldy);

}  // namespace avx512
}  // namespace polestar
