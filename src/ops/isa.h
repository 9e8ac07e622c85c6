// The instruction sets the CPU kernels come in. Each SIMD set lives in its own folder of
// ops/ (avx2/, avx512/), the only files compiled with that set's flags; everything else is
// portable, and the CPU backend picks one set once, when it is built.
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

}  // namespace polestar
