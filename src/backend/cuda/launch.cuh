// What the CUDA backend's kernels share (included by its .cu files only): the block size,
// grid sizing, and warp and block reductions whose results are the same bits in every thread.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace polestar::cuda {

constexpr int kThreads = 256;  // per block, a multiple of the warp
constexpr int kWarp = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
// Grids stride over their work: enough blocks to fill a GPU, no more.
constexpr int64_t kMaxBlocks = 4096;

// Blocks of kThreads for `items` independent items (one per thread, grid-strided).
inline int GridBlocks(int64_t items) {
  return int(std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks));
}
// Blocks for `rows` rows of one block each (grid-strided).
inline int RowBlocks(int64_t rows) { return int(std::min<int64_t>(rows, kMaxBlocks)); }

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
