// What the GGUF reader and writer share (private to src/io): the layout constants and
// ggml's table of tensor types.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace polestar {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr size_t kGgufMaxNameBytes = 63;  // ggml's GGML_MAX_NAME (64) less the terminator

struct GgmlType {
  uint32_t id;
  const char* name;
  bool supported;
  DType dtype;  // what polestar reads it as (supported types only)
};

// The entry of ggml type `id` (ggml.h), supported or not, so unsupported types are named in
// errors; nullptr for an id ggml does not define.
const GgmlType* FindGgmlType(uint32_t id);

}  // namespace polestar
