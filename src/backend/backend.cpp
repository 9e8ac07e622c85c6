#include "backend/backend.h"

#include <utility>

#include "base/error.h"

namespace polestar {

Buffer::Buffer(const Backend& backend, int64_t size, Init init)
    : backend_(&backend),
      data_(size > 0 ? backend.Allocate(size, init == Init::kZero) : nullptr),
      size_(size) {}

Buffer::Buffer(const Buffer& other) : Buffer() {
  if (other.backend_ == nullptr) return;
  *this = Buffer(*other.backend_, other.size_, Init::kNone);
  backend_->Copy(other.data_, size_, data_);
}

Buffer& Buffer::operator=(const Buffer& other) {
  if (this != &other) *this = Buffer(other);
  return *this;
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Reserve(int64_t size) {
  if (size <= size_) return;
  PS_CHECK(backend_ != nullptr);
  const Backend& backend = *backend_;
  *this = Buffer(backend, size, Init::kNone);
}

void Buffer::Release() {
  if (data_ != nullptr) backend_->Free(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace polestar
