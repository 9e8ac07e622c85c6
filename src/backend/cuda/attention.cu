// RoPE and the attention softmax. RoPE repeats ops.cpp's Rotate operation for operation with
// no fused multiply-add (the scalar twin has none either), so it gives the CPU's bits; the
// softmax follows reference.cpp's SoftmaxRow in fp32 with its sums reduced in a tree.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention.h"
#include "backend/cuda/launch.cuh"

namespace polestar::cuda {
namespace {

// One thread per (row, head, frequency f): the pair of dims f rotates. pairs = M * heads * R/2.
__global__ void RopeKernel(float* x, int64_t pairs, const int* positions, int heads, int head_dim,
                           int half, const float* cos, const float* sin, bool interleaved,
                           float direction) {
  for (int64_t pair = int64_t(blockIdx.x) * kThreads + threadIdx.x; pair < pairs;
       pair += int64_t(gridDim.x) * kThreads) {
    const int f = int(pair % half);
    const int64_t row_head = pair / half;  // i * heads + h
    const int64_t angle = int64_t(positions[row_head / heads]) * half + f;
    float* xh = x + row_head * head_dim;
    const float cos_a = cos[angle];
    const float sin_a = direction * sin[angle];  // times +-1: exact
    float* a = interleaved ? &xh[2 * f] : &xh[f];
    float* b = interleaved ? &xh[2 * f + 1] : &xh[f + half];
    const float x0 = *a, x1 = *b;
    *a = __fsub_rn(__fmul_rn(x0, cos_a), __fmul_rn(x1, sin_a));
    *b = __fadd_rn(__fmul_rn(x1, cos_a), __fmul_rn(x0, sin_a));
  }
}

// One block per row (striding over rows past the grid). Each thread rewrites only the
// entries it read, so the passes need no barrier beyond the reductions'.
__global__ void SoftmaxRowsKernel(float* scores, int64_t rows, int64_t l, float* copy) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = scores + r * l;
    float max_value = -INFINITY;
    for (int64_t j = threadIdx.x; j < l; j += kThreads) max_value = fmaxf(max_value, row[j]);
    max_value = BlockReduce(max_value, Max());
    float total = 0.0f;
    for (int64_t j = threadIdx.x; j < l; j += kThreads) {
      const float e = expf(row[j] - max_value);
      row[j] = e;
      total += e;
    }
    total = BlockReduce(total, Sum());
    float* copy_row = copy == nullptr ? nullptr : copy + r * l;
    for (int64_t j = threadIdx.x; j < l; j += kThreads) {
      const float p = row[j] / total;
      row[j] = p;
      if (copy_row != nullptr) copy_row[j] = p;
    }
  }
}

}  // namespace

cudaError_t LaunchRope(float* x, int64_t m, const int* positions, int heads, int head_dim,
                       int rotary_dim, const float* cos, const float* sin, bool interleaved,
                       bool inverse, cudaStream_t stream) {
  const int half = rotary_dim / 2;
  const int64_t pairs = m * heads * half;
  if (pairs <= 0) return cudaSuccess;
  const int blocks = int(std::min<int64_t>((pairs + kThreads - 1) / kThreads, kMaxBlocks));
  return Launch(RopeKernel, blocks, kThreads, 0, stream, x, pairs, positions, heads, head_dim, half,
                cos, sin, interleaved, inverse ? -1.0f : 1.0f);
}

cudaError_t LaunchSoftmaxRows(float* scores, int64_t rows, int64_t l, float* copy,
                              cudaStream_t stream) {
  if (rows <= 0 || l <= 0) return cudaSuccess;
  // Rows are plenty: a row per block, up to a grid that fills the GPU many times over.
  const int blocks = int(std::min<int64_t>(rows, int64_t(1) << 20));
  return Launch(SoftmaxRowsKernel, blocks, kThreads, 0, stream, scores, rows, l, copy);
}

}  // namespace polestar::cuda
