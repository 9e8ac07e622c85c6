#include "io/tensor_store.h"

#include "base/error.h"

namespace polestar {

int64_t TensorRef::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorRef* TensorStore::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef& TensorStore::Get(const std::string& name) const {
  const TensorRef* tensor = Find(name);
  if (tensor == nullptr) Fail(origin_, ": missing tensor '", name, "'");
  return *tensor;
}

const MappedFile& TensorStore::AddFile(const std::string& path) {
  files_.push_back(std::make_unique<MappedFile>(path));
  return *files_.back();
}

void TensorStore::Add(TensorRef tensor) {
  if (tensors_.count(tensor.name)) Fail(origin_, ": tensor '", tensor.name, "' appears twice");
  std::string name = tensor.name;
  tensors_.emplace(std::move(name), std::move(tensor));
}

}  // namespace polestar
