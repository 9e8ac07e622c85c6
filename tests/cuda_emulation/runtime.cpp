// The emulation's CUDA runtime: the calls src/backend/cuda/ makes, defined over host memory,
// with the runtime's own declarations (cuda_runtime_api.h), so the backend compiles unchanged
// and links this in place of libcudart.
//
// It is built to make the mistakes a GPU punishes visible on the host:
// * queued work (kernels, async copies and sets, cuBLAS calls, frees) runs only when the host
//   must see its effects: a synchronisation of its stream or an event recorded after it, a
//   blocking copy, cudaFree. A result read before its wait, or pinned memory reused while a
//   queued copy still reads it, comes out wrong;
// * streams run apart: a stream runs another's work only through an event it waits on, so a
//   missing wait leaves the other stream's writes unseen (or its frees early, which
//   AddressSanitizer reports);
// * device memory is a host allocation of exactly the size asked (AddressSanitizer catches a
//   kernel reading past it), poisoned whenever no queued work runs (up to 4 MiB an
//   allocation), so host code that touches device memory directly is reported as a use of
//   poisoned memory;
// * copies check their kind against where the pointers lie, and stay inside one allocation;
// * a stream being captured (cudaStreamBeginCapture) gathers its work into the graph, to run
//   at every launch of it, with the arguments it had when issued; what a capture cannot hold
//   (a wait for the stream, a copy to or from pageable memory) fails and invalidates it, as on
//   a GPU, and what the emulation does not model (allocations, events) in one aborts.
#include <sanitizer/asan_interface.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "cuda_emulation/device.h"
#include "cuda_emulation/emulation.h"

// The runtime's handles, defined here (the headers only declare them).
struct CUgraph_st {
  std::vector<std::function<void()>> work;  // in issue order
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;  // the graph's, run in order at each launch
};
struct CUstream_st {
  std::deque<std::function<void()>> queue;  // work issued and not yet run, in issue order
  uint64_t reached = 0;                     // the ticket of the last event record it has run
  CUgraph_st* capture = nullptr;            // where work issued goes while it is captured
  bool capture_invalidated = false;         // a call the capture could not hold failed
};
struct CUevent_st {
  CUstream_st* stream = nullptr;  // where it was last recorded (null: never)
  uint64_t ticket = 0;            // that record's
};
struct CUmemPoolHandle_st {};

namespace cuda_emulation {
namespace {

// The device's memory: what cudaMemGetInfo reports, and where allocations fail.
constexpr size_t kDeviceBytes = size_t(16) << 30;
// How much of each end of a fresh allocation is filled with junk.
constexpr size_t kPoisonedEndBytes = size_t(256) << 10;

struct State {
  std::map<uintptr_t, size_t> device;  // live device allocations: address -> bytes
  std::map<uintptr_t, size_t> pinned;  // live cudaMallocHost allocations
  std::set<uintptr_t> mapped;          // those of them cudaHostAllocMapped mapped for kernels
  size_t device_bytes = 0;
  size_t device_peak = 0;             // the most device_bytes since the pool's high mark was reset
  std::set<CUstream_st*> streams;     // live ones
  std::vector<CUstream_st*> retired;  // destroyed ones: queued waits may still name them
  CUstream_st legacy_stream;          // stream 0
  CUmemPoolHandle_st pool;
  uint64_t tickets = 0;
  int running = 0;  // depth of Run: device memory is unpoisoned while > 0
};

State& Emulation() {
  static State* state = new State;  // never destroyed: the backend may call during exit
  return *state;
}

thread_local cudaError_t last_error = cudaSuccess;

// Allocations above this are not fenced: the backend takes a 32 MiB cuBLAS workspace per
// product, and poisoning it around every run of queued work would cost more than the run.
constexpr size_t kFencedBytes = size_t(4) << 20;

bool Fenced(size_t bytes) { return bytes <= kFencedBytes; }

void PoisonDevice(bool poison) {
  for (const auto& [address, bytes] : Emulation().device) {
    if (!Fenced(bytes)) continue;
    if (poison) {
      ASAN_POISON_MEMORY_REGION(reinterpret_cast<void*>(address), bytes);
    } else {
      ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(address), bytes);
    }
  }
}

CUstream_st* StreamOf(cudaStream_t stream) {
  State& state = Emulation();
  if (stream == nullptr) return &state.legacy_stream;
  if (!state.streams.contains(stream)) Die("stream %p is not a live stream", (void*)stream);
  return stream;
}

// Runs the front of `stream`'s queue while `more` says so, device memory unpoisoned.
template <class More>
void Run(CUstream_st* stream, More more) {
  State& state = Emulation();
  if (state.running++ == 0) PoisonDevice(false);
  while (!stream->queue.empty() && more()) {
    std::function<void()> work = std::move(stream->queue.front());
    stream->queue.pop_front();
    work();
  }
  if (--state.running == 0) PoisonDevice(true);
}

// Work issued to `stream`: into its queue, or into its graph while it is captured.
void Push(CUstream_st* stream, std::function<void()> work) {
  if (stream->capture != nullptr) {
    stream->capture->work.push_back(std::move(work));
  } else {
    stream->queue.push_back(std::move(work));
  }
}

// A call that a capture of `stream` cannot hold: it fails, and so does the capture's end.
cudaError_t RefuseInCapture(CUstream_st* stream) {
  stream->capture_invalidated = true;
  return SetError(cudaErrorStreamCaptureUnsupported);
}

// Aborts on a call the emulation does not model inside a capture.
void NotInCapture(CUstream_st* stream, const char* call) {
  if (stream->capture != nullptr) Die("%s on a stream being captured is not emulated", call);
}

void Drain(CUstream_st* stream) {
  Run(stream, [] { return true; });
}

void DrainAll() {
  State& state = Emulation();
  Drain(&state.legacy_stream);
  // Draining one stream may run others' work (event waits), never add to them.
  for (CUstream_st* stream : state.streams) Drain(stream);
}

// Until `stream` has run the event record of `ticket`.
void RunUntil(CUstream_st* stream, uint64_t ticket) {
  Run(stream, [&] { return stream->reached < ticket; });
  if (stream->reached < ticket) Die("an event's record was lost from its stream");
}

const std::map<uintptr_t, size_t>::value_type* Containing(const std::map<uintptr_t, size_t>& map,
                                                          const void* data) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  auto it = map.upper_bound(address);
  if (it == map.begin()) return nullptr;
  --it;
  return address < it->first + it->second ? &*it : nullptr;
}

bool Inside(const std::map<uintptr_t, size_t>& map, const void* data, size_t bytes) {
  const auto* allocation = Containing(map, data);
  return allocation != nullptr &&
         reinterpret_cast<uintptr_t>(data) + bytes <= allocation->first + allocation->second;
}

bool IsPinned(const void* data, size_t bytes) { return Inside(Emulation().pinned, data, bytes); }

// Where a copy's end must lie, by its kind; false (with the reason printed) if it does not.
bool CopyEndOk(const char* call, const char* end, const void* data, size_t bytes, bool device) {
  if (device ? IsDeviceRange(data, bytes) : Containing(Emulation().device, data) == nullptr) {
    return true;
  }
  std::fprintf(stderr, "cuda emulation: %s: the %s [%p, +%zu) is %s\n", call, end, data, bytes,
               device ? "not inside one device allocation" : "device memory, not host memory");
  return false;
}

cudaError_t Copy(const char* call, void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream, bool blocking) {
  if (count == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) {
    const bool dst_device = Containing(Emulation().device, dst) != nullptr;
    const bool src_device = Containing(Emulation().device, src) != nullptr;
    kind = src_device ? (dst_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                      : (dst_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (!CopyEndOk(call, "source", src, count, src_device) ||
      !CopyEndOk(call, "destination", dst, count, dst_device)) {
    return SetError(cudaErrorInvalidValue);
  }
  CUstream_st* queue = StreamOf(stream);
  if (queue->capture != nullptr && (blocking || (!src_device && !IsPinned(src, count)) ||
                                    (!dst_device && !IsPinned(dst, count)))) {
    return RefuseInCapture(queue);  // a copy with pageable memory at an end waits for the host
  }
  if (!src_device && !IsPinned(src, count)) {
    // From pageable memory the runtime stages the bytes before it returns.
    auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                         static_cast<const uint8_t*>(src) + count);
    Push(queue, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    Push(queue, [dst, src, count] { std::memcpy(dst, src, count); });
  }
  // To pageable memory, and every cudaMemcpy, the call returns once the copy is done.
  if (blocking || (!dst_device && !IsPinned(dst, count))) {
    if (!blocking) CountHostWait();  // cudaMemcpy counts its own
    Drain(queue);
  }
  return cudaSuccess;
}

}  // namespace

std::mutex& Lock() {
  static std::mutex* lock = new std::mutex;
  return *lock;
}

void Die(const char* format, ...) {
  std::fputs("cuda emulation: ", stderr);
  va_list arguments;
  va_start(arguments, format);
  std::vfprintf(stderr, format, arguments);
  va_end(arguments);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

cudaError_t SetError(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  Push(StreamOf(stream), std::move(work));
}

bool IsDeviceRange(const void* data, size_t bytes) {
  return Inside(Emulation().device, data, bytes);
}

}  // namespace cuda_emulation

using cuda_emulation::Emulation;
using cuda_emulation::SetError;

extern "C" {

#if defined(__SANITIZE_ADDRESS__)
// Device memory is unpoisoned and poisoned again around every run of queued work. AddressSanitizer
// clears the shadow of a region over 64 KiB by remapping its pages, so the next poisoning
// faults them all in again; clearing it in place is many times faster. (ASAN_OPTIONS, when
// set, still wins.)
const char* __asan_default_options() { return "clear_shadow_mmap_threshold=1073741824"; }
#endif

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : SetError(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return std::exchange(cuda_emulation::last_error, cudaSuccess); }

cudaError_t cudaPeekAtLastError() { return cuda_emulation::last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    case cudaErrorIllegalState:
      return "the resource is not in a valid state to perform the requested operation";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "unknown error";
  }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  *stream = new CUstream_st;
  Emulation().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (stream == nullptr) return SetError(cudaErrorInvalidValue);
  cuda_emulation::Drain(cuda_emulation::StreamOf(stream));  // its work still completes
  Emulation().streams.erase(stream);
  Emulation().retired.push_back(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  if (queue->capture != nullptr) return cuda_emulation::RefuseInCapture(queue);
  cuda_emulation::CountHostWait();
  cuda_emulation::Drain(queue);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (stream == nullptr) return SetError(cudaErrorStreamCaptureUnsupported);  // legacy stream
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  if (queue->capture != nullptr) return SetError(cudaErrorIllegalState);
  queue->capture = new CUgraph_st;
  queue->capture_invalidated = false;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  *graph = nullptr;
  if (queue->capture == nullptr) return SetError(cudaErrorIllegalState);
  CUgraph_st* captured = std::exchange(queue->capture, nullptr);
  if (std::exchange(queue->capture_invalidated, false)) {
    delete captured;
    return SetError(cudaErrorStreamCaptureInvalidated);
  }
  *graph = captured;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  const CUstream_st* queue = cuda_emulation::StreamOf(stream);
  *status = queue->capture == nullptr    ? cudaStreamCaptureStatusNone
            : queue->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                         : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  cuda_emulation::NotInCapture(queue, "cudaGraphLaunch");
  cuda_emulation::CountGraphLaunch();
  queue->queue.push_back([exec] {
    for (const std::function<void()>& work : exec->work) work();
  });
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  cuda_emulation::DrainAll();  // its queued launches run first (the runtime frees it after them)
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  cuda_emulation::CountHostWait();
  cuda_emulation::DrainAll();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;  // queued waits hold its stream and ticket, not the event
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  cuda_emulation::NotInCapture(queue, "cudaEventRecord");
  const uint64_t ticket = ++Emulation().tickets;
  event->stream = queue;
  event->ticket = ticket;
  queue->queue.push_back([queue, ticket] { queue->reached = ticket; });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  cuda_emulation::CountHostWait();
  if (event->stream != nullptr) cuda_emulation::RunUntil(event->stream, event->ticket);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  CUstream_st* queue = cuda_emulation::StreamOf(stream);
  cuda_emulation::NotInCapture(queue, "cudaStreamWaitEvent");
  if (event->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  queue->queue.push_back([recorded = event->stream, ticket = event->ticket] {
    cuda_emulation::RunUntil(recorded, ticket);
  });
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** data, size_t size) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  cuda_emulation::State& state = Emulation();
  if (size > cuda_emulation::kDeviceBytes - state.device_bytes) {
    *data = nullptr;
    return SetError(cudaErrorMemoryAllocation);
  }
  *data = std::malloc(size > 0 ? size : 1);
  if (*data == nullptr) return SetError(cudaErrorMemoryAllocation);
  // Poisoned, as fresh device memory holds whatever was there: all of a small allocation,
  // the ends of a large one (a cuBLAS workspace per product would otherwise cost more than the
  // product).
  auto* bytes = static_cast<uint8_t*>(*data);
  const size_t end_bytes = std::min(size, cuda_emulation::kPoisonedEndBytes);
  std::memset(bytes, 0xa5, end_bytes);
  std::memset(bytes + size - end_bytes, 0xa5, end_bytes);
  state.device.emplace(reinterpret_cast<uintptr_t>(*data), size);
  state.device_bytes += size;
  state.device_peak = std::max(state.device_peak, state.device_bytes);
  if (state.running == 0 && cuda_emulation::Fenced(size)) ASAN_POISON_MEMORY_REGION(*data, size);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** data, size_t size, cudaStream_t stream) {
  {
    const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
    cuda_emulation::NotInCapture(cuda_emulation::StreamOf(stream), "cudaMallocAsync");
  }
  return cudaMalloc(data, size);
}

namespace cuda_emulation {
namespace {

void FreeDevice(void* data) {
  State& state = Emulation();
  const auto it = state.device.find(reinterpret_cast<uintptr_t>(data));
  if (it == state.device.end()) Die("a free of %p, which is no live device allocation", data);
  ASAN_UNPOISON_MEMORY_REGION(data, it->second);
  state.device_bytes -= it->second;
  state.device.erase(it);
  std::free(data);
}

}  // namespace
}  // namespace cuda_emulation

cudaError_t cudaFree(void* data) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (data == nullptr) return cudaSuccess;
  cuda_emulation::DrainAll();  // cudaFree waits for the device
  cuda_emulation::FreeDevice(data);
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* data, cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (data == nullptr) return cudaSuccess;
  if (!Emulation().device.contains(reinterpret_cast<uintptr_t>(data))) {
    cuda_emulation::Die("cudaFreeAsync(%p): no live device allocation starts there", data);
  }
  cuda_emulation::NotInCapture(cuda_emulation::StreamOf(stream), "cudaFreeAsync");
  cuda_emulation::Enqueue(stream, [data] { cuda_emulation::FreeDevice(data); });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** data, size_t size, unsigned int flags) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  *data = std::malloc(size > 0 ? size : 1);
  if (*data == nullptr) return SetError(cudaErrorMemoryAllocation);
  Emulation().pinned.emplace(reinterpret_cast<uintptr_t>(*data), size);
  if (flags & cudaHostAllocMapped) Emulation().mapped.insert(reinterpret_cast<uintptr_t>(*data));
  return cudaSuccess;
}

// Unified addressing: a mapped allocation's device address is its host address.
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  const auto* allocation = cuda_emulation::Containing(Emulation().pinned, host);
  if (flags != 0 || allocation == nullptr || !Emulation().mapped.contains(allocation->first))
    return SetError(cudaErrorInvalidValue);
  *device = host;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** data, size_t size) { return cudaHostAlloc(data, size, 0); }

cudaError_t cudaFreeHost(void* data) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (data == nullptr) return cudaSuccess;
  Emulation().mapped.erase(reinterpret_cast<uintptr_t>(data));
  if (Emulation().pinned.erase(reinterpret_cast<uintptr_t>(data)) == 0) {
    cuda_emulation::Die("cudaFreeHost(%p): no live pinned allocation starts there", data);
  }
  cuda_emulation::DrainAll();  // as cudaFreeHost: no queued copy reads it afterwards
  std::free(data);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  cuda_emulation::CountHostWait();
  cuda_emulation::DrainAll();
  return cuda_emulation::Copy("cudaMemcpy", dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  return cuda_emulation::Copy("cudaMemcpyAsync", dst, src, count, kind, stream, false);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (width > dst_pitch || width > src_pitch) return SetError(cudaErrorInvalidPitchValue);
  if (width == 0 || height == 0) return cudaSuccess;
  if (kind != cudaMemcpyDeviceToDevice) {
    cuda_emulation::Die("cudaMemcpy2DAsync other than device to device is not emulated");
  }
  if (!cuda_emulation::CopyEndOk("cudaMemcpy2DAsync", "source", src,
                                 (height - 1) * src_pitch + width, true) ||
      !cuda_emulation::CopyEndOk("cudaMemcpy2DAsync", "destination", dst,
                                 (height - 1) * dst_pitch + width, true)) {
    return SetError(cudaErrorInvalidValue);
  }
  cuda_emulation::Enqueue(stream, [=] {
    for (size_t row = 0; row < height; ++row) {
      std::memcpy(static_cast<uint8_t*>(dst) + row * dst_pitch,
                  static_cast<const uint8_t*>(src) + row * src_pitch, width);
    }
  });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* data, int value, size_t count, cudaStream_t stream) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (count == 0) return cudaSuccess;
  if (!cuda_emulation::IsDeviceRange(data, count)) {
    std::fprintf(stderr,
                 "cuda emulation: cudaMemsetAsync: [%p, +%zu) is not inside one device "
                 "allocation\n",
                 data, count);
    return SetError(cudaErrorInvalidValue);
  }
  cuda_emulation::Enqueue(stream, [=] { std::memset(data, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  *total_bytes = cuda_emulation::kDeviceBytes;
  *free_bytes = cuda_emulation::kDeviceBytes - Emulation().device_bytes;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (device != 0) return SetError(cudaErrorInvalidDevice);
  *pool = &Emulation().pool;
  return cudaSuccess;
}

// The pool's counts are all device memory's (the emulation has no memory outside its pool);
// the high mark resets to what is held, as the runtime's does when set to 0.
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr attribute, void*) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (attribute == cudaMemPoolAttrUsedMemHigh) Emulation().device_peak = Emulation().device_bytes;
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr attribute, void* value) {
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (attribute == cudaMemPoolAttrUsedMemCurrent) {
    *static_cast<uint64_t*>(value) = Emulation().device_bytes;
  } else if (attribute == cudaMemPoolAttrUsedMemHigh) {
    *static_cast<uint64_t*>(value) = Emulation().device_peak;
  } else {
    cuda_emulation::Die("cudaMemPoolGetAttribute(%d): not emulated", int(attribute));
  }
  return cudaSuccess;
}

}  // extern "C"

namespace cuda_emulation {

namespace {

struct Tally {
  std::map<const void*, uint64_t> launches;  // by kernel (a capture's count once)
  uint64_t products = 0, host_waits = 0, graph_launches = 0;
};
void PrintTally();

// Made before main when the variable is set; never destroyed: the report runs at exit.
Tally* MakeTally() {
  if (std::getenv("POLESTAR_CUDA_EMULATION_TALLY") == nullptr) return nullptr;
  std::atexit(PrintTally);
  return new Tally;
}
Tally* const tally = MakeTally();

void PrintTally() {
  uint64_t launches = 0;
  for (const auto& [kernel, count] : tally->launches) launches += count;
  std::fprintf(stderr,
               "cuda emulation tally: %llu launches, %llu cuBLAS products, %llu host waits, %llu "
               "graph launches\n",
               (unsigned long long)launches, (unsigned long long)tally->products,
               (unsigned long long)tally->host_waits, (unsigned long long)tally->graph_launches);
  for (const auto& [kernel, count] : tally->launches) {
    std::fprintf(stderr, "  %10llu  %s\n", (unsigned long long)count, KernelName(kernel).c_str());
  }
}

}  // namespace

void CountProduct() {
  if (tally != nullptr) ++tally->products;
}
void CountHostWait() {
  if (tally != nullptr) ++tally->host_waits;
}
void CountGraphLaunch() {
  if (tally != nullptr) ++tally->graph_launches;
}

cudaError_t Launch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   cudaStream_t stream, std::function<void()> thread_body) {
  const std::lock_guard<std::mutex> lock(Lock());
  if (tally != nullptr) ++tally->launches[kernel];
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64) {
    return SetError(cudaErrorInvalidConfiguration);
  }
  // 48 KiB is what a launch gets without opting in to more (cudaFuncSetAttribute).
  if (dynamic_shared_bytes > (size_t(48) << 10)) return SetError(cudaErrorInvalidValue);
  Enqueue(stream, [=, body = std::move(thread_body)] {
    RunGrid(kernel, grid, block, dynamic_shared_bytes, body);
  });
  return cudaSuccess;
}

}  // namespace cuda_emulation
