// Lives in a file built without SIMD flags, so the checks themselves run on any CPU.
#include "ops/isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace polestar {
namespace {

// F16C and AVX-512 VNNI are read from CPUID (leaf 1 ECX, leaf 7 ECX): clang's
// __builtin_cpu_supports does not know F16C. The OS must also save the wide registers
// (XCR0: SSE/AVX state for AVX2, plus opmask and ZMM state for AVX-512).
bool CpuidHas(unsigned leaf, unsigned bit, bool ecx) {
  unsigned eax, ebx, ecx_bits, edx;
  if (!__get_cpuid_count(leaf, 0, &eax, &ebx, &ecx_bits, &edx)) return false;
  return ((ecx ? ecx_bits : ebx) & bit) != 0;
}

bool OsSavesAvx512State() {
  if (!CpuidHas(1, bit_OSXSAVE, true)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;  // SSE, AVX, opmask, ZMM0-15 upper halves, ZMM16-31
}

}  // namespace

bool IsaSupported(Isa isa) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           CpuidHas(1, bit_F16C, true);
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl") &&
                             CpuidHas(7, bit_AVX512VNNI, true) && OsSavesAvx512State();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512:
      return avx512;
  }
  return false;
}

Isa BestIsa() {
  static const Isa best = [] {
    Isa cap = Isa::kAvx512;
    if (const char* env = std::getenv("POLESTAR_MAX_ISA"); env != nullptr && *env != '\0') {
      const std::string value = env;
      if (value == "scalar") {
        cap = Isa::kScalar;
      } else if (value == "avx2") {
        cap = Isa::kAvx2;
      } else if (value != "avx512") {
        Fail("POLESTAR_MAX_ISA is '", value, "'; expected scalar, avx2 or avx512");
      }
    }
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
      if (isa <= cap && IsaSupported(isa)) return isa;
    }
    return Isa::kScalar;
  }();
  return best;
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace polestar
