// A set of named tensors living in memory-mapped files (safetensors shards or a GGUF file).
// The store owns the maps; TensorRef points into them and stays valid while the store lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "io/mapped_file.h"

namespace polestar {

struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first, as in PyTorch: a Linear weight is [out, in]
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  const std::string* file = nullptr;  // for error messages

  int64_t NumElements() const;
};

class TensorStore {
 public:
  // Throws Error naming the file when the tensor is absent.
  const TensorRef& Get(const std::string& name) const;
  const TensorRef* Find(const std::string& name) const;
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  // A description of where the tensors come from ("dir/model.safetensors", "3 shards in dir").
  const std::string& origin() const { return origin_; }

  // Used by the format readers.
  const MappedFile& AddFile(const std::string& path);
  void Add(TensorRef tensor);
  void set_origin(std::string origin) { origin_ = std::move(origin); }

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorRef> tensors_;
  std::string origin_;
};

}  // namespace polestar
