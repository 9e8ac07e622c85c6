// The instruction sets the CPU kernels come in, and the precision their matrix products
// give activations. Each SIMD set lives in its own folder of ops/ (avx2/, avx512/), the only
// files compiled with that set's flags; everything else is portable, and the CPU backend
// picks one set and one precision once, when it is built.
#pragma once

#include <string_view>

namespace polestar {

enum class Isa {
  kScalar,  // ops/reference.h: the test oracle, runs anywhere
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // the AVX2 set plus AVX-512 F, BW, VL and VNNI (Ice Lake, Cascade Lake, Zen 4)
};

// Whether this CPU runs `isa`'s kernels.
bool IsaSupported(Isa isa);

// The widest set this CPU runs, capped by the environment variable POLESTAR_MAX_ISA
// (scalar, avx2 or avx512) when it is set: for a CPU whose wide units clock down, or to
// measure one set against another. An unknown value is an error, not ignored.
Isa BestIsa();

std::string_view IsaName(Isa isa);  // "scalar", "avx2", "avx512"

// Whether this CPU has AVX512_BF16 (vdpbf16ps) on top of the kAvx512 set: the products of
// BF16 weights with activations rounded to BF16 (ops/bf16_matmul.h).
bool Avx512Bf16Supported();

// What matrix products do with their activations.
enum class ActivationPrecision {
  // Rounded to fewer bits where the weights' type has a faster product for them: 8-bit
  // levels for block-quantised weights (ops/quant.h) on every kernel set, BF16 for BF16
  // weights where the CPU has AVX512_BF16 (ops/bf16_matmul.h). Every other product is fp32.
  kReduced,
  // fp32 everywhere: each product follows its weights (dequantised, or widened) to fp32
  // rounding, which keeps outputs within the reference code's tolerances token for token.
  kF32,
};

// The process-wide choice: kReduced unless the environment variable POLESTAR_ACTIVATIONS
// says f32 (reduced names the default); any other value is an error, not ignored.
ActivationPrecision ActivationPrecisionFromEnvironment();

}  // namespace polestar
