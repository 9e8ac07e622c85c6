// safetensors: u64 little-endian header length N, N bytes of JSON, then the data buffer.
// Reading validates everything a corrupt or hostile file can get wrong (header length,
// JSON, dtypes, shapes vs byte counts, offsets outside the buffer or overlapping) and
// throws Error naming the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/tensor_store.h"

namespace polestar {

// Adds every tensor of one safetensors file to `store`.
void ReadSafetensorsFile(const std::string& path, TensorStore& store);

// Reads a Hugging Face checkpoint folder: model.safetensors, or the shards named by
// model.safetensors.index.json.
TensorStore ReadSafetensorsDir(const std::string& dir);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes tensors (sorted by name, as the Python writer does) with optional metadata.
void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Convenience constructors for tests and tools.
TensorToWrite F32Tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v);
TensorToWrite I64Tensor(std::string name, std::vector<int64_t> shape,
                        const std::vector<int64_t>& v);

}  // namespace polestar
