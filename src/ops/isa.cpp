// Lives in a file built without SIMD flags, so the checks themselves run on any CPU.
#include "ops/isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace polestar {
namespace {

// F16C, AVX-512 VNNI and AVX512_BF16 are read from CPUID (leaf 1 ECX, leaf 7 ECX, leaf 7
// sub-leaf 1 EAX): clang's __builtin_cpu_supports does not know F16C. The OS must also save
// the wide registers (XCR0: SSE/AVX state for AVX2, plus opmask and ZMM state for AVX-512).
enum class CpuidRegister { kEax, kEbx, kEcx };

bool CpuidHas(unsigned leaf, unsigned bit, CpuidRegister reg, unsigned subleaf = 0) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(leaf, subleaf, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned bits = reg == CpuidRegister::kEax ? eax : reg == CpuidRegister::kEbx ? ebx : ecx;
  return (bits & bit) != 0;
}

bool OsSavesAvx512State() {
  if (!CpuidHas(1, bit_OSXSAVE, CpuidRegister::kEcx)) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;  // SSE, AVX, opmask, ZMM0-15 upper halves, ZMM16-31
}

}  // namespace

bool IsaSupported(Isa isa) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           CpuidHas(1, bit_F16C, CpuidRegister::kEcx);
  static const bool avx512 =
      avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && CpuidHas(7, bit_AVX512VNNI, CpuidRegister::kEcx) &&
      OsSavesAvx512State();
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

bool Avx512Bf16Supported() {
  static const bool bf16 =
      IsaSupported(Isa::kAvx512) && CpuidHas(7, bit_AVX512BF16, CpuidRegister::kEax, 1);
  return bf16;
}

ActivationPrecision ActivationPrecisionFromEnvironment() {
  static const ActivationPrecision precision = [] {
    if (std::getenv("POLESTAR_QUANT_ACTIVATIONS") != nullptr) {
      Fail("POLESTAR_QUANT_ACTIVATIONS is now POLESTAR_ACTIVATIONS (reduced or f32)");
    }
    const char* env = std::getenv("POLESTAR_ACTIVATIONS");
    const std::string value = env == nullptr ? "" : env;
    if (value.empty() || value == "reduced") return ActivationPrecision::kReduced;
    if (value == "f32") return ActivationPrecision::kF32;
    Fail("POLESTAR_ACTIVATIONS is '", value, "'; expected reduced or f32");
  }();
  return precision;
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
