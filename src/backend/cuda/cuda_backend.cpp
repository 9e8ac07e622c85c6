#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#ifdef POLESTAR_CUDA_EMULATION
#include "backend/cpu/cpu_backend.h"
#endif
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_entry.h"
#include "backend/cuda/scratch.h"
#include "backend/worker_queue.h"
#include "base/error.h"

namespace polestar {

namespace cuda {

void CheckCuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears the error a non-sticky failure leaves behind
  Fail("CUDA call ", call, " failed: ", cudaGetErrorString(status), " (", cudaGetErrorName(status),
       ")");
}

}  // namespace cuda

// Host lists carried to one stream's ops: a pinned host ring and a device ring of the same
// size, in two halves. A list is copied into the pinned ring, then by the stream into the
// device ring at the same offset, where the ops issued after it read it. Device bytes are
// overwritten only by copies issued later on the same stream, so after every op that read
// them; pinned bytes only once the copies out of their half have run (an event per half).
// The copies leave the host at once, so staging never waits for the stream to drain.
//
// One op stages up to kListsPerOp lists before it launches, so those must all stay valid
// until then: a half holds kListsPerOp lists of the largest size staged, so an op's lists
// switch halves at most once and never come back to the half of its first; a ring outgrown
// in the middle of an op stays allocated (its lists are read by the launch still to come)
// until the staging is destroyed. Growth doubles, so the old rings add up to less than the
// current one.
class IndexStaging {
 public:
  explicit IndexStaging(cudaStream_t stream) : stream_(stream) {
    for (cudaEvent_t& event : half_done_)
      CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    Reallocate(kFirstHalfBytes);
  }
  ~IndexStaging() {
    cudaStreamSynchronize(stream_);
    cudaFreeHost(pinned_);
    cudaFree(device_);
    for (void* ring : outgrown_) cudaFree(ring);
    for (cudaEvent_t event : half_done_) cudaEventDestroy(event);
  }
  IndexStaging(const IndexStaging&) = delete;
  IndexStaging& operator=(const IndexStaging&) = delete;

  const int* Stage(std::span<const int> host) {
    const int64_t bytes = int64_t(host.size_bytes());
    const int64_t slot = (bytes + kAlign - 1) / kAlign * kAlign;  // keeps the next list aligned
    if (slot * kListsPerOp > half_bytes_) Reallocate(std::max(slot * kListsPerOp, 2 * half_bytes_));
    if (used_ + slot > half_bytes_) {
      CUDA_CHECK(cudaEventRecord(half_done_[half_], stream_));
      half_ ^= 1;
      used_ = 0;
      // The copies out of this half, issued before the switch to the other one, have run.
      CUDA_CHECK(cudaEventSynchronize(half_done_[half_]));
    }
    const int64_t offset = half_ * half_bytes_ + used_;
    used_ += slot;
    uint8_t* pinned = static_cast<uint8_t*>(pinned_) + offset;
    uint8_t* device = static_cast<uint8_t*>(device_) + offset;
    std::memcpy(pinned, host.data(), size_t(bytes));
    CUDA_CHECK(cudaMemcpyAsync(device, pinned, size_t(bytes), cudaMemcpyHostToDevice, stream_));
    return reinterpret_cast<const int*>(device);
  }

 private:
  static constexpr int64_t kListsPerOp = 4;  // CudaBackend::Stage's "up to four lists"
  static constexpr int64_t kFirstHalfBytes = 64 << 10;
  static constexpr int64_t kAlign = 256;

  // Rings of two halves of `half_bytes`. The copies out of the old pinned ring have run once
  // the stream has drained; the old device ring may hold the lists of the op being staged.
  // A failed allocation leaves no ring (half_bytes_ 0), so the next Stage tries again.
  void Reallocate(int64_t half_bytes) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    if (device_ != nullptr) outgrown_.push_back(std::exchange(device_, nullptr));
    half_bytes_ = 0;
    half_ = 0;
    used_ = 0;
    CUDA_CHECK(cudaMallocHost(&pinned_, size_t(2 * half_bytes)));
    CUDA_CHECK(cudaMalloc(&device_, size_t(2 * half_bytes)));
    half_bytes_ = half_bytes;
  }

  cudaStream_t stream_;
  void* pinned_ = nullptr;  // [2 * half_bytes_] bytes
  void* device_ = nullptr;  // [2 * half_bytes_] bytes
  int64_t half_bytes_ = 0;
  int half_ = 0;      // the half lists go to now
  int64_t used_ = 0;  // bytes of it in use
  cudaEvent_t half_done_[2] = {};
  std::vector<void*> outgrown_;  // device rings replaced by larger ones
};

// A recorded step (CudaBackend::Record): the graph captured from the main stream,
// instantiated, and the host lists its ops staged, copied to device memory of its own that
// stays for every replay (the staging rings move on). The lists are gathered on the host
// while the stream is captured and uploaded after, before the first launch. Their memory is
// taken from the pool before the capture, as much as the last recording's lists took; lists
// beyond that take more during it (cudaMalloc, which a relaxed capture allows).
class CudaGraph final : public OpGraph {
 public:
  CudaGraph(const CudaBackend& backend, cudaStream_t stream, uint64_t generation,
            size_t expected_list_bytes)
      : backend_(backend), stream_(stream), generation_(generation) {
    Chunk& first = chunks_.emplace_back();
    first.bytes = std::max(expected_list_bytes, kFirstChunkBytes);
    CUDA_CHECK(cudaMallocAsync(&first.device, first.bytes, stream_));
    first.pooled = true;
  }
  // The launches and the lists' memory are freed once the launches issued before have run.
  ~CudaGraph() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    for (const Chunk& chunk : chunks_) {
      if (chunk.pooled) {
        cudaFreeAsync(chunk.device, stream_);
      } else {
        cudaFree(chunk.device);
      }
    }
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  const CudaBackend& backend() const { return backend_; }
  uint64_t generation() const { return generation_; }
  cudaGraphExec_t exec() const { return exec_; }
  size_t list_bytes() const {
    size_t bytes = 0;
    for (const Chunk& chunk : chunks_) bytes += chunk.used;
    return bytes;
  }

  // Captures what `issue` issues on the stream; "" when it is instantiated, else why not.
  // Memory the ops free is freed after the capture (a freeing graph would free it at every
  // replay), and the recording fails.
  std::string Capture(const std::function<void()>& issue);
  const int* Stage(std::span<const int> host);
  void DeferFree(void* data) { deferred_frees_.push_back(data); }
  // The lists to their device memory, in stream order; the host copies go.
  void UploadLists() {
    for (Chunk& chunk : chunks_) {
      CUDA_CHECK(cudaMemcpyAsync(chunk.device, chunk.host.data(), chunk.used,
                                 cudaMemcpyHostToDevice, stream_));
      chunk.host = {};  // pageable: staged before the copy returned
    }
  }

 private:
  static constexpr size_t kFirstChunkBytes = size_t(64) << 10;
  static constexpr size_t kAlign = 256;
  struct Chunk {
    void* device = nullptr;  // [bytes]
    size_t bytes = 0;
    bool pooled = false;        // from the stream's pool, else cudaMalloc's
    std::vector<uint8_t> host;  // [used] the lists' bytes
    size_t used = 0;
  };

  const CudaBackend& backend_;
  cudaStream_t stream_;
  const uint64_t generation_;  // of the main stream's scratch when recorded
  cudaGraphExec_t exec_ = nullptr;
  std::vector<Chunk> chunks_;
  std::vector<void*> deferred_frees_;
};

namespace {

// The recording the calling thread is making, and on which backend.
struct ActiveRecording {
  const CudaBackend* backend = nullptr;
  CudaGraph* graph = nullptr;
};
thread_local ActiveRecording active_recording;

}  // namespace

std::string CudaGraph::Capture(const std::function<void()>& issue) {
  // Relaxed: the capture leaves other threads' calls alone (the side stream's worker), and
  // lets a list chunk be allocated in the middle of it.
  if (const cudaError_t begin = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
      begin != cudaSuccess) {
    cudaGetLastError();
    return Cat("cudaStreamBeginCapture: ", cudaGetErrorString(begin));
  }
  std::string failure;
  active_recording = {&backend_, this};
  try {
    issue();
  } catch (const std::exception& error) {
    failure = error.what();
  }
  active_recording = {};
  cudaGraph_t captured = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &captured);
  if (failure.empty() && end != cudaSuccess) {
    failure = Cat("cudaStreamEndCapture: ", cudaGetErrorString(end));
  }
  if (failure.empty() && !deferred_frees_.empty()) failure = "an op freed memory";
  if (failure.empty()) {
    if (const cudaError_t made = cudaGraphInstantiate(&exec_, captured, 0); made != cudaSuccess) {
      exec_ = nullptr;
      failure = Cat("cudaGraphInstantiate: ", cudaGetErrorString(made));
    }
  }
  if (captured != nullptr) cudaGraphDestroy(captured);
  cudaGetLastError();
  for (void* data : std::exchange(deferred_frees_, {})) backend_.Free(data);
  return failure;
}

const int* CudaGraph::Stage(std::span<const int> host) {
  const size_t bytes = host.size_bytes();
  const size_t slot = (bytes + kAlign - 1) / kAlign * kAlign;  // keeps the next list aligned
  if (chunks_.back().used + slot > chunks_.back().bytes) {
    Chunk& more = chunks_.emplace_back();
    more.bytes = std::max(slot, 2 * chunks_[chunks_.size() - 2].bytes);
    CUDA_CHECK(cudaMalloc(&more.device, more.bytes));
  }
  Chunk& chunk = chunks_.back();
  chunk.host.resize(chunk.used + slot);
  std::memcpy(chunk.host.data() + chunk.used, host.data(), bytes);
  const auto* device =
      reinterpret_cast<const int*>(static_cast<uint8_t*>(chunk.device) + chunk.used);
  chunk.used += slot;
  return device;
}

namespace {

// "" where this process can use a CUDA device, else why not.
std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return Cat("no CUDA device: ", cudaGetErrorString(status));
  }
  if (count == 0) return "no CUDA device: the driver reports none";
  return "";
}

// The SideQueue of the CUDA backend: a worker thread whose ops go to a second stream, which
// first waits for what the main stream had issued when the job was handed over (the job reads
// the cache the main queue wrote). The job's host work (downloads, the math on them) runs on
// the worker too, so the whole job overlaps the main queue. A job is done when its stream
// is: what it captured is then freed, and Wait's caller may use what it wrote.
class SideStream;
thread_local const SideStream* active_side_stream = nullptr;

class SideStream final : public SideQueue {
 public:
  explicit SideStream(const CudaBackend& backend)
      : backend_(backend), worker_([this](std::function<void()>& job) { RunHere(job); }) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&main_issued_, cudaEventDisableTiming));
    staging_ = std::make_unique<IndexStaging>(stream_);
    scratch_ = std::make_unique<cuda::StreamScratch>(backend);
  }
  ~SideStream() override {
    // Destructors do not throw: a failure here leaves nothing to recover.
    try {
      worker_.Wait();
    } catch (...) {  // a job's error nobody asked for
    }
    staging_.reset();
    cudaStreamSynchronize(stream_);
    scratch_.reset();  // on the main stream, after this one's ops that used it
    cudaEventDestroy(main_issued_);
    cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  const CudaBackend& backend() const { return backend_; }
  cudaStream_t stream() const { return stream_; }
  IndexStaging& staging() const { return *staging_; }
  cuda::StreamScratch& scratch() const { return *scratch_; }

  void Run(std::function<void()> job) override {
    worker_.Wait();
    // On the caller's queue: the job follows everything issued there so far.
    CUDA_CHECK(cudaEventRecord(main_issued_, backend_.Stream()));
    worker_.Run(std::move(job));
  }
  void Wait() override { worker_.Wait(); }

 private:
  // On the worker thread.
  void RunHere(std::function<void()>& job) {
    CUDA_CHECK(cudaSetDevice(backend_.device()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, main_issued_, 0));
    active_side_stream = this;
    try {
      job();
    } catch (...) {
      Finish(job);
      throw;
    }
    Finish(job);
  }
  // The job's stream has run what it issued; then what the job captured (a Buffer) is freed.
  void Finish(std::function<void()>& job) {
    const cudaError_t status = cudaStreamSynchronize(stream_);
    job = nullptr;
    active_side_stream = nullptr;
    CUDA_CHECK(status);
  }

  const CudaBackend& backend_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t main_issued_ = nullptr;
  std::unique_ptr<IndexStaging> staging_;  // used by the worker thread alone
  std::unique_ptr<cuda::StreamScratch> scratch_;
  WorkerQueue worker_;  // last: its thread stops before the rest goes
};

}  // namespace

BackendEntry CudaBackendEntry() {
  return {
      .name = "cuda",
#ifdef POLESTAR_CUDA_EMULATION
      .description = "the CUDA backend over the host emulation of tests/cuda_emulation (tests)",
      .rank = CpuBackendEntry().rank - 2,  // below the checking backend: never "auto"
#else
      .description = "NVIDIA GPUs through the CUDA runtime (device 0)",
      .rank = 1,
#endif
      .options = {{"activations", "reduced|f32",
                   "reduced: BF16 activations in the products, FP32 accumulation; f32: FP32 "
                   "products with TF32 off, the exact mode (default: POLESTAR_ACTIVATIONS, "
                   "else reduced)"},
                  {"graphs", "on|off",
                   "on: a step's layers that repeat from step to step are recorded once as a "
                   "CUDA graph and replayed as one launch; off: every op is its own launch "
                   "(default: on)"}},
      .unavailable = NoDeviceReason,
      .make = [](const BackendOptions& options) -> std::unique_ptr<Backend> {
        std::optional<ActivationPrecision> activations;
        bool graphs = true;
        for (const auto& [key, value] : options) {
          if (key == "graphs") {
            if (value != "on" && value != "off")
              Fail("backend option graphs=", value, ": expected on or off");
            graphs = value == "on";
            continue;
          }
          if (value != "reduced" && value != "f32")
            Fail("backend option activations=", value, ": expected reduced or f32");
          activations = value == "f32" ? ActivationPrecision::kF32 : ActivationPrecision::kReduced;
        }
        return std::make_unique<CudaBackend>(
            0, activations ? *activations : ActivationPrecisionFromEnvironment(), graphs);
      },
  };
}

CudaBackend::CudaBackend(int device, ActivationPrecision activations, bool records)
    : device_(device), activations_(activations), records_(records) {
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  staging_ = std::make_unique<IndexStaging>(stream_);
  scratch_ = std::make_unique<cuda::StreamScratch>(*this);
  // The pool keeps what is freed for the next allocation instead of returning it to the
  // driver at every synchronisation: scratch reuse across steps costs no cudaMalloc.
  cudaMemPool_t pool = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  uint64_t keep_all = UINT64_MAX;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
}

CudaBackend::~CudaBackend() {
  // A backend kept to the process's end (BackendNamed's) is destroyed after the static
  // runtime has shut down: every call then only returns cudaErrorCudartUnloading, and the
  // driver reclaims what the process held. cuBLAS is not called then (its teardown would
  // reach into the unloaded runtime).
  const bool unloading = cudaStreamSynchronize(stream_) == cudaErrorCudartUnloading;
  staging_.reset();
  scratch_.reset();
  if (blas_ != nullptr && !unloading) cublasDestroy(blas_);
  cudaStreamDestroy(stream_);
}

cudaStream_t CudaBackend::Stream() const {
  const SideStream* side = active_side_stream;
  return side != nullptr && &side->backend() == this ? side->stream() : stream_;
}

// Device arithmetic (cuBLAS, reduction order, fused multiply-adds) differs from the scalar
// twins, and cuBLAS may choose its algorithm by row count.
BackendContract CudaBackend::contract() const {
  return {.exact_to_scalar_twins = false, .batch_invariant = false, .host_memory = false};
}

void* CudaBackend::Allocate(int64_t bytes, bool zero) const {
  // Captured, it would be an allocation of the graph's, and its replays' memory.
  if (Recording()) Fail("an op allocated ", bytes, " bytes while a step was being recorded");
  void* data = nullptr;
  // At least one byte, as the CPU backend: every Buffer has a distinct address.
  const size_t size = size_t(bytes > 0 ? bytes : 1);
  if (const cudaError_t status = cudaMallocAsync(&data, size, Stream());
      status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    Fail("the GPU is out of memory: ", bytes >> 20, " MiB asked for, ", free_bytes >> 20,
         " MiB of ", total_bytes >> 20, " MiB free (a smaller model, batch or --kv-budget fits)");
  } else {
    CUDA_CHECK(status);
  }
  if (zero) CUDA_CHECK(cudaMemsetAsync(data, 0, size, Stream()));
  return data;
}

// Free runs in destructors (Buffer's, also while an op's Error unwinds the stack), so it
// never throws: after a kernel's fault every call fails, and an exception here would end the
// process (std::terminate) in place of the Error that reports the fault. Buffers the process
// keeps to its end are freed after the runtime has shut down (cudaErrorCudartUnloading).
void CudaBackend::Free(void* data) const {
  if (data == nullptr) return;
  if (Recording()) {
    active_recording.graph->DeferFree(data);
    return;
  }
  const cudaError_t status = cudaFreeAsync(data, Stream());
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) return;
  cudaGetLastError();  // a sticky error stays for the next checked call to report
  std::fprintf(stderr, "cuda backend: cudaFreeAsync(%p) failed: %s\n", data,
               cudaGetErrorString(status));
}

void* CudaBackend::AllocateOffloaded(int64_t bytes, bool zero) const {
  void* data = nullptr;
  const size_t size = size_t(bytes > 0 ? bytes : 1);
  if (const cudaError_t status = cudaHostAlloc(&data, size, cudaHostAllocMapped);
      status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    Fail("out of pinned host memory: ", bytes >> 20, " MiB of offloaded memory asked for");
  } else {
    CUDA_CHECK(status);
  }
  // Kernels take the host address as it is: a device without unified addressing would need
  // another, and none of the architectures built for lacks it.
  void* device = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&device, data, 0);
  if (mapped != cudaSuccess || device != data) {
    cudaGetLastError();
    cudaFreeHost(data);
    Fail("pinned host memory is not at the same address on the GPU (no unified addressing)");
  }
  if (zero) std::memset(data, 0, size);  // fresh: no queued op touches it yet
  const std::lock_guard<std::mutex> lock(offloaded_mutex_);
  offloaded_.emplace(reinterpret_cast<uintptr_t>(data), size);
  offloaded_bytes_ += int64_t(size);
  offloaded_peak_ = std::max(offloaded_peak_, offloaded_bytes_);
  return data;
}

// As Free, never throws. Ops issued before the free may still read or write the memory: they
// are waited for first (pinned memory has no stream-ordered free).
void CudaBackend::FreeOffloaded(void* data) const {
  if (data == nullptr) return;
  {
    const std::lock_guard<std::mutex> lock(offloaded_mutex_);
    if (const auto it = offloaded_.find(reinterpret_cast<uintptr_t>(data));
        it != offloaded_.end()) {
      offloaded_bytes_ -= int64_t(it->second);
      offloaded_.erase(it);
    }
  }
  cudaError_t status = cudaStreamSynchronize(Stream());
  if (status == cudaSuccess) status = cudaFreeHost(data);
  if (status == cudaSuccess || status == cudaErrorCudartUnloading) return;
  cudaGetLastError();
  std::fprintf(stderr, "cuda backend: cudaFreeHost(%p) failed: %s\n", data,
               cudaGetErrorString(status));
}

MemoryUse CudaBackend::Memory() const {
  cudaMemPool_t pool = nullptr;
  uint64_t held = 0, peak = 0;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &held));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak));
  const std::lock_guard<std::mutex> lock(offloaded_mutex_);
  return {.held = int64_t(held),
          .peak = int64_t(peak),
          .offloaded = offloaded_bytes_,
          .offloaded_peak = offloaded_peak_};
}

void CudaBackend::ResetMemoryPeak() const {
  cudaMemPool_t pool = nullptr;
  uint64_t zero = 0;  // the runtime's only value here: the mark restarts from what is held
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  const std::lock_guard<std::mutex> lock(offloaded_mutex_);
  offloaded_peak_ = offloaded_bytes_;
}

// A copy's kind as the backend memory at each end lies: offloaded memory is host memory to
// the copy engines, whatever address the kernels give it.
cudaMemcpyKind CudaBackend::KindOf(const void* src, const void* dst, cudaMemcpyKind kind) const {
  const std::lock_guard<std::mutex> lock(offloaded_mutex_);
  if (offloaded_.empty()) return kind;
  auto offloaded = [&](const void* p) {
    const auto after = offloaded_.upper_bound(reinterpret_cast<uintptr_t>(p));
    return after != offloaded_.begin() &&
           reinterpret_cast<uintptr_t>(p) < std::prev(after)->first + std::prev(after)->second;
  };
  const bool src_device = kind != cudaMemcpyHostToDevice && !offloaded(src);
  const bool dst_device = kind != cudaMemcpyDeviceToHost && !offloaded(dst);
  return src_device ? (dst_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                    : (dst_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
}

void CudaBackend::CopyBytes(const void* src, int64_t bytes, void* dst) const {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), KindOf(src, dst, cudaMemcpyDeviceToDevice),
                             Stream()));
}

void CudaBackend::Zero(float* x, int64_t n) const {
  if (n <= 0) return;
  CUDA_CHECK(cudaMemsetAsync(x, 0, size_t(n) * sizeof(float), Stream()));
}

// From pageable memory the copy returns once the runtime has staged the bytes, so the caller
// may reuse `host` at once.
void CudaBackend::Upload(const void* host, int64_t bytes, void* dst) const {
  if (bytes <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, size_t(bytes), KindOf(host, dst, cudaMemcpyHostToDevice),
                             Stream()));
}

void CudaBackend::Download(const void* src, int64_t bytes, void* host) const {
  if (bytes <= 0) return;
  if (Recording()) Fail("an op downloaded ", bytes, " bytes while a step was being recorded");
  CUDA_CHECK(cudaMemcpyAsync(host, src, size_t(bytes), KindOf(src, host, cudaMemcpyDeviceToHost),
                             Stream()));
  CUDA_CHECK(cudaStreamSynchronize(Stream()));
}

void CudaBackend::Synchronize() const {
  if (Recording()) Fail("an op waited for the GPU while a step was being recorded");
  CUDA_CHECK(cudaStreamSynchronize(Stream()));
}

std::unique_ptr<SideQueue> CudaBackend::MakeSideQueue() const {
  return std::make_unique<SideStream>(*this);
}

bool CudaBackend::Recording() const {
  return active_recording.backend == this && Stream() == stream_;
}

std::unique_ptr<OpGraph> CudaBackend::Record(const std::function<void()>& issue) const {
  if (!records_ || Stream() != stream_ || active_recording.backend != nullptr) {
    issue();
    return nullptr;
  }
  auto graph = std::make_unique<CudaGraph>(*this, stream_, scratch_->generation(),
                                           recorded_list_bytes_.load());
  const std::string failure = graph->Capture(issue);
  recorded_list_bytes_ = graph->list_bytes();
  if (!failure.empty()) {
    if (records_.exchange(false)) {
      std::fprintf(stderr,
                   "cuda backend: recording a step as a CUDA graph failed (%s); steps run op by "
                   "op from here on\n",
                   failure.c_str());
    }
    issue();
    return nullptr;
  }
  graph->UploadLists();
  CUDA_CHECK(cudaGraphLaunch(graph->exec(), stream_));
  return graph;
}

bool CudaBackend::Replay(const OpGraph& graph) const {
  const auto* recorded = dynamic_cast<const CudaGraph*>(&graph);
  PS_CHECK(recorded != nullptr && &recorded->backend() == this && Stream() == stream_);
  if (recorded->generation() != scratch_->generation()) return false;
  CUDA_CHECK(cudaGraphLaunch(recorded->exec(), stream_));
  return true;
}

cuda::StreamScratch& CudaBackend::Scratch() const {
  const SideStream* side = active_side_stream;
  return side != nullptr && &side->backend() == this ? side->scratch() : *scratch_;
}

const int* CudaBackend::Stage(std::span<const int> host) const {
  if (host.empty()) return nullptr;
  const SideStream* side = active_side_stream;
  if (side != nullptr && &side->backend() == this) return side->staging().Stage(host);
  if (Recording()) return active_recording.graph->Stage(host);  // kept for the replays
  const std::lock_guard<std::mutex> lock(staging_mutex_);
  return staging_->Stage(host);
}

}  // namespace polestar
