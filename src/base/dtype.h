// Element types of weights on disk and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace polestar {

// Weight storage types. Block-quantised ggml types store `BlockSize()` values in
// `BlockBytes()` bytes; plain types have a block of one value.
enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K, kI64, kI32 };

std::string_view DTypeName(DType type);
int BlockSize(DType type);   // values per block
int BlockBytes(DType type);  // bytes per block
// Bytes of a row of `n` values; `n` must be a multiple of BlockSize(type).
inline int64_t RowBytes(DType type, int64_t n) { return n / BlockSize(type) * BlockBytes(type); }

inline float Bf16ToF32(uint16_t bits) {
  uint32_t wide = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// Round to nearest even; NaN stays NaN (ggml's rule, so converted files match byte for byte).
inline uint16_t F32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return uint16_t((bits >> 16) | 64);
  return uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);  // round to nearest even, IEEE binary16

}  // namespace polestar
