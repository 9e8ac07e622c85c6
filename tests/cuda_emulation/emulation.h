// Inside the CUDA emulation: what its runtime (runtime.cpp), cuBLAS (blas.cpp) and block
// scheduler (threads.cpp) share. Every entry point takes Lock() first; the functions here
// expect it held.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace cuda_emulation {

std::mutex& Lock();

// Prints "cuda emulation: <what>" to stderr and aborts: a fault a GPU would report as an
// illegal address or a hang, or a call the real runtime would reject less clearly.
[[noreturn]] void Die(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Makes `error` the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t SetError(cudaError_t error);

// Appends `work` to `stream`'s queue. Queued work runs only when the host must see its effects
// (a synchronisation, a blocking copy, a free), so a host that reads results before waiting
// for them, or reuses memory a queued copy still reads, sees it go wrong here.
void Enqueue(cudaStream_t stream, std::function<void()> work);

// Whether [data, data + bytes) lies inside one live device allocation.
bool IsDeviceRange(const void* data, size_t bytes);

// "kernel <address> <function>" (the function's name where the sanitizer can symbolize it).
std::string KernelName(const void* kernel);

// With POLESTAR_CUDA_EMULATION_TALLY set, the process prints at exit how many launches (per
// kernel), cuBLAS products and host waits (synchronisations and blocking copies) it made: the
// GPU's fixed costs of a step, which the emulation can count where it cannot time them.
void CountProduct();
void CountHostWait();
void CountGraphLaunch();

// Runs every block of a launch (threads.cpp); called when its stream reaches it.
void RunGrid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
             const std::function<void()>& thread_body);

}  // namespace cuda_emulation
