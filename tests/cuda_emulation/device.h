// The device side of the CUDA emulation (tests/cuda_emulation/): what a kernel of
// src/backend/cuda/ calls, for its .cu files compiled as host C++ (the build force-includes
// this header into them). Blocks run one at a time; a block's threads run as fibers on the
// launching host thread, switched at barriers and warp shuffles, so __syncthreads, __syncwarp,
// the shuffles and __shared__ memory behave as on a GPU, and a barrier not every thread
// reaches stops the program with the kernel's name instead of hanging.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>  // the global math functions device code calls (expf, fmaxf, ...)

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace cuda_emulation {

// Runs `thread_body` for every thread of every block of `grid` once `stream` reaches it;
// checks the configuration as the GPU does (the error is also cudaGetLastError's). `kernel`
// only names the kernel in diagnostics.
cudaError_t Launch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   cudaStream_t stream, std::function<void()> thread_body);

// The running thread waits at its block's barrier, or at its warp's for the lanes of `mask`.
void SyncThreads();
void SyncWarp(unsigned mask);
// The lanes of `mask` each give `bytes` at `value`; each gets the bytes lane `source` gave.
void WarpExchange(unsigned mask, const void* value, size_t bytes, int source, void* result);
// The launch's dynamic shared memory (its size as launched), the same for the whole block.
void* DynamicShared();

}  // namespace cuda_emulation

constexpr int warpSize = 32;

// The running thread's place, set by the scheduler before it resumes a thread.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

// Blocks run one at a time (under one lock, whatever host thread launches), so a __shared__
// variable may be one static per kernel.
#undef __shared__
#define __shared__ static

inline void __syncthreads() { cuda_emulation::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_emulation::SyncWarp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = warpSize) {
  const int lane = int(threadIdx.x % warpSize);
  const int source = lane / width * width + source_lane % width;
  T result;
  cuda_emulation::WarpExchange(mask, &value, sizeof(T), source, &result);
  return result;
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  const int lane = int(threadIdx.x % warpSize);
  int source = lane ^ lane_mask;
  if (source / width != lane / width) source = lane;  // outside the lane's segment: its own
  T result;
  cuda_emulation::WarpExchange(mask, &value, sizeof(T), source, &result);
  return result;
}

// One thread at a time: read-modify-write is atomic by construction.
inline unsigned atomicMax(unsigned* address, unsigned value) {
  const unsigned old = *address;
  if (value > old) *address = value;
  return old;
}
inline int atomicMax(int* address, int value) {
  const int old = *address;
  if (value > old) *address = value;
  return old;
}
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

// Correctly rounded arithmetic: the emulated sources are compiled with -ffp-contract=off, so
// a plain operation is the IEEE one.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

inline float __int_as_float(int bits) { return std::bit_cast<float>(bits); }
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline unsigned __float_as_uint(float value) { return std::bit_cast<unsigned>(value); }
inline int __float_as_int(float value) { return std::bit_cast<int>(value); }

#include "cuda_emulation/wmma.h"
