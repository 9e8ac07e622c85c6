#include "backend/cuda/scratch.h"

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"

namespace polestar::cuda {
namespace {

constexpr int64_t kAlign = 256;

}  // namespace

StreamScratch::StreamScratch(const CudaBackend& backend) : backend_(backend) {
  for (Buffer& buffer : buffers_)
    buffer = Buffer(backend, 0, ElementType::kU8, Buffer::Init::kNone);
}

OpScratch::OpScratch(const CudaBackend& backend)
    : backend_(backend), scratch_(backend.Scratch()), lock_(scratch_.mutex_) {}

void* OpScratch::Get(ScratchKind kind, int64_t bytes) {
  Buffer& buffer = scratch_.buffers_[int(kind)];
  if (bytes + kAlign > buffer.size()) {
    if (backend_.Recording()) {
      Fail("an op's scratch grew to ", bytes, " bytes while a step was being recorded");
    }
    // By half again at least, so scratch grown row by row is not replaced at every step.
    buffer = Buffer(backend_, std::max(bytes + kAlign, buffer.size() + buffer.size() / 2),
                    ElementType::kU8, Buffer::Init::kNone);
    ++scratch_.generation_;
  }
  const auto address = reinterpret_cast<uintptr_t>(buffer.As<uint8_t>());
  return reinterpret_cast<void*>((address + kAlign - 1) / kAlign * kAlign);
}

}  // namespace polestar::cuda
