// Products of BF16 weights with activations rounded to BF16, on AVX512_BF16's vdpbf16ps
// (ActivationPrecision::kReduced on a CPU that has it, ops/isa.h): one instruction does 32
// multiply-adds where a 512-bit FMA does 16, and BF16 weights go into it as stored, where
// the fp32 kernels (ops/avx512/matmul.cpp) widen every one of them first.
//
// Numeric contract. Activations are rounded to BF16 as vcvtneps2bf16 rounds them: to nearest
// even, inputs below FLT_MIN flushed to zero, NaN kept a (quiet) NaN; so x = b + e with
// |e| <= 2^-9 |x|. A product of two BF16 values is exact in fp32; vdpbf16ps adds the
// products to each output's fp32 sum in K order, the odd value of each pair first, each
// addition rounded to nearest with results below FLT_MIN flushed to zero. Against the fp32
// reference (the same weights times fp32 activations, reference::MatMulColumns) an output
// y_n = sum_k w_nk x_k therefore differs by at most 2^-9 sum_k |w_nk x_k| from the rounding
// of the activations, plus float rounding of the order of K 2^-24 sum_k |w_nk x_k|. That is
// about what BF16 weights themselves already cost (the same 2^-9 per value), and what a
// PyTorch model run in bf16 does on every product; on the BF16 fixture it moves logits by
// 3.4e-3 of the largest logit, so the checks against the reference code's fp32 run use
// ActivationPrecision::kF32. The scalar twin Bf16DotColumns makes the same additions in the
// same order, so the AVX512_BF16 kernel gives its outputs bit for bit, at every M.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace polestar {

// Activations x[M, K] rounded to BF16, two values per 32-bit word: word q of a row holds
// values 2q (low half) and 2q + 1 (high half), the latter 0 past K when K is odd.
struct Bf16Activations {
  int64_t rows = 0, cols = 0;   // M, K
  int64_t pairs = 0;            // ceil(K / 2): words per row
  std::vector<uint32_t> words;  // [M, pairs]

  void Reshape(int64_t m, int64_t k);  // sizes the buffer, reusing its memory when it can
};

// The BF16 value vcvtneps2bf16 rounds `x` to (see the contract above). Scalar.
uint16_t RoundToBf16(float x);
// Rounds x[M, K] into *out. Scalar; avx512::RoundToBf16 gives the same words.
void RoundToBf16(const float* x, int64_t m, int64_t k, Bf16Activations* out);

// Columns [n_begin, n_end) of y = x·w^T for BF16 w, written at y + i * ldy + (n - n_begin):
// the scalar twin of avx512::Bf16DotColumns, vdpbf16ps's additions one by one.
void Bf16DotColumns(const Bf16Activations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
                    float* y, int64_t ldy);

// y[M, N] = x[M, K] · w[N, K]^T (+ bias) for BF16 w on the AVX512_BF16 kernels: x rounded
// once, then the output columns split among threads. Returns false, doing nothing, when w
// is not BF16; must not be called where Avx512Bf16Supported() is false.
bool Bf16MatMul(const float* x, int64_t m, const WeightView& w, float* y, const float* bias);

namespace avx512 {

// Built with AVX512_BF16: run only where Avx512Bf16Supported() (ops/isa.h).
void RoundToBf16(const float* x, int64_t m, int64_t k, Bf16Activations* out);
void Bf16DotColumns(const Bf16Activations& x, const WeightView& w, int64_t n_begin, int64_t n_end,
                    float* y, int64_t ldy);

}  // namespace avx512
}  // namespace polestar
