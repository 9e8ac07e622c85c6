// Scratch an op of the CUDA backend uses between its own launches: cuBLAS's workspace, a
// product's BF16 activations and decoded weights, attention's scores. Each stream keeps one
// buffer of each kind, grown to the largest use: ops neither allocate nor free once warm, so
// a recorded step (CudaBackend::Record) holds no memory of its own and its replays use the
// buffers it recorded. A growth replaces a buffer and starts a new generation, which no
// recording made before it may replay over.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "backend/backend.h"

namespace polestar {

class CudaBackend;

namespace cuda {

enum class ScratchKind { kBlasWorkspace, kBf16Activations, kTileProduct, kDecodedWeights, kScores };
constexpr int kScratchKinds = 5;

// One stream's scratch; its ops hold it one at a time (OpScratch).
class StreamScratch {
 public:
  explicit StreamScratch(const CudaBackend& backend);
  uint64_t generation() const { return generation_.load(); }

 private:
  friend class OpScratch;
  const CudaBackend& backend_;
  std::mutex mutex_;
  Buffer buffers_[kScratchKinds];  // [bytes + alignment] u8 each, by ScratchKind
  std::atomic<uint64_t> generation_ = 0;
};

// One op's hold on the calling thread's stream's scratch, for the op's life.
class OpScratch {
 public:
  explicit OpScratch(const CudaBackend& backend);
  // `bytes` bytes of `kind`, 256-byte aligned, for this op's launches (stream order keeps
  // later ops from writing them before those have run). Growing it while a step is being
  // recorded fails (Error): the recording would free memory at every replay.
  void* Get(ScratchKind kind, int64_t bytes);
  template <class T>
  T* Get(ScratchKind kind, int64_t count) {
    return static_cast<T*>(Get(kind, count * int64_t(sizeof(T))));
  }

 private:
  const CudaBackend& backend_;
  StreamScratch& scratch_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace cuda
}  // namespace polestar
