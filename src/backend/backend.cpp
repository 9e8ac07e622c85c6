#include "backend/backend.h"

#include <utility>

#include "base/error.h"

namespace polestar {

int64_t ElementBytes(ElementType type) {
  switch (type) {
    case ElementType::kF32:
    case ElementType::kI32:
      return 4;
    case ElementType::kBf16:
    case ElementType::kF16:
      return 2;
    case ElementType::kF64:
      return 8;
    case ElementType::kU8:
      return 1;
  }
  PS_CHECK(false);
  return 0;
}

Buffer::Buffer(const Backend& backend, int64_t size, ElementType type, Init init,
               Placement placement)
    : backend_(&backend), type_(type), placement_(placement), size_(size) {
  if (size <= 0) return;
  const int64_t bytes = size * ElementBytes(type);
  const bool zero = init == Init::kZero;
  data_ = placement == Placement::kOffloaded ? backend.AllocateOffloaded(bytes, zero)
                                             : backend.Allocate(bytes, zero);
}

Buffer::Buffer(const Buffer& other) : Buffer() {
  if (other.backend_ == nullptr) return;
  *this = Buffer(*other.backend_, other.size_, other.type_, Init::kNone, other.placement_);
  if (size_ > 0) backend_->CopyBytes(other.data_, bytes(), data_);
}

Buffer& Buffer::operator=(const Buffer& other) {
  if (this != &other) *this = Buffer(other);
  return *this;
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      type_(other.type_),
      placement_(other.placement_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    backend_ = std::exchange(other.backend_, nullptr);
    type_ = other.type_;
    placement_ = other.placement_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Backend::AttentionBatch(std::span<const AttentionCall> calls, int heads, int kv_heads,
                             int head_dim) const {
  for (const AttentionCall& call : calls) {
    Attention(call.q, call.rows, call.k, call.v, call.keys, heads, kv_heads, head_dim, call.out);
  }
}

void Backend::MatMulAddBatch(const float* x, RowSegments segments, const WeightView& w,
                             float* y) const {
  int64_t m = 0;
  for (const int64_t rows : segments) m += rows;
  Buffer product(*this, m * w.rows, Buffer::Init::kNone);  // [M, N]
  MatMulBatch(x, segments, w, product.data());
  AddInPlace(y, product.data(), m * w.rows);
}

void Backend::RmsNormProducts(const float* x, RowSegments segments, int64_t c, const float* weight,
                              float eps, float* normed,
                              std::span<const NormedProduct> products) const {
  int64_t m = 0;
  for (const int64_t rows : segments) m += rows;
  RmsNorm(x, m, c, weight, eps, normed);
  for (const NormedProduct& product : products) {
    MatMulBatch(normed, segments, product.w, product.y, product.bias);
  }
}

void Buffer::Reserve(int64_t size) {
  if (size <= size_) return;
  PS_CHECK(backend_ != nullptr);
  const Backend& backend = *backend_;
  *this = Buffer(backend, size, type_, Init::kNone, placement_);
}

void Buffer::Release() {
  if (data_ != nullptr) {
    if (placement_ == Placement::kOffloaded) {
      backend_->FreeOffloaded(data_);
    } else {
      backend_->Free(data_);
    }
  }
  data_ = nullptr;
  size_ = 0;
}

void Buffer::CheckElement(size_t bytes) const { PS_CHECK(int64_t(bytes) == ElementBytes(type_)); }

}  // namespace polestar
