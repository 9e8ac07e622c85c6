// What the CUDA backend's kernels share (included by its .cu files only): the block size,
// grid sizing, and warp and block reductions whose results are the same bits in every thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace polestar::cuda {

// Launches `kernel(args...)` on `grid` blocks of `threads` with `shared_bytes` of dynamic
// shared memory, and returns the launch's error. Every launch goes through here, so the CUDA
// emulation (tests/cuda_emulation/, POLESTAR_CUDA_EMULATION) can run the kernels on the host.
template <class... Params, class... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 threads, size_t shared_bytes,
                   cudaStream_t stream, Args... args) {
#ifdef POLESTAR_CUDA_EMULATION
  return cuda_emulation::Launch(reinterpret_cast<const void*>(kernel), grid, threads, shared_bytes,
                                stream, [=] { kernel(Params(args)...); });
#else
  // clang-format splits a launch's chevrons in a header.
  // clang-format off
  kernel<<<grid, threads, shared_bytes, stream>>>(args...);
  // clang-format on
  return cudaGetLastError();
#endif
}

// The launch's dynamic shared memory (its shared_bytes), as T.
template <class T>
__device__ T* DynamicShared() {
#ifdef POLESTAR_CUDA_EMULATION
  return static_cast<T*>(cuda_emulation::DynamicShared());
#else
  extern __shared__ uint4 dynamic_shared[];  // uint4: aligned for every T
  return reinterpret_cast<T*>(dynamic_shared);
#endif
}

// value as BF16 bits, rounded to nearest even (base/dtype.h F32ToBf16).
__device__ inline uint16_t Bf16Bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

constexpr int kThreads = 256;  // per block, a multiple of the warp
constexpr int kWarp = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
// Grids stride over their work: enough blocks to fill a GPU, no more.
constexpr int64_t kMaxBlocks = 4096;

// Blocks of kThreads for `items` independent items (one per thread, grid-strided).
// At least one block: a grid of none is a launch error, and one block with no work does none.
inline int GridBlocks(int64_t items) {
  return int(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}
// Blocks for `rows` rows of one block each (grid-strided), at least one.
inline int RowBlocks(int64_t rows) { return int(std::clamp<int64_t>(rows, 1, kMaxBlocks)); }

// Reductions' combining rules.
struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

inline __device__ float ShuffleXor(float v, int offset) {
  return __shfl_xor_sync(kFullWarp, v, offset);
}
inline __device__ double ShuffleXor(double v, int offset) {
  return __shfl_xor_sync(kFullWarp, v, offset);
}
inline __device__ int64_t ShuffleXor(int64_t v, int offset) {
  return int64_t(__shfl_xor_sync(kFullWarp, (long long)v, offset));
}

// The combination of `value` over the warp's lanes, returned to every lane. Other types
// reduce too where a ShuffleXor overload for them is declared.
template <class T, class Combine>
__device__ T WarpReduce(T value, Combine combine) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value = combine(value, ShuffleXor(value, offset));
  }
  return value;
}

// The combination of `value` over the block's kThreads threads, returned to every thread.
// Every thread combines the warps' results in the same order, so all get the same bits; the
// closing barrier lets the next call reuse the shared slots at once. Every thread of the block
// must call it.
template <class T, class Combine>
__device__ T BlockReduce(T value, Combine combine) {
  __shared__ T warp_values[kThreads / kWarp];
  value = WarpReduce(value, combine);
  if (threadIdx.x % kWarp == 0) warp_values[threadIdx.x / kWarp] = value;
  __syncthreads();
  value = warp_values[0];
  for (int w = 1; w < kThreads / kWarp; ++w) value = combine(value, warp_values[w]);
  __syncthreads();
  return value;
}

}  // namespace polestar::cuda
