// The RoPE and softmax kernels' launchers (attention.cu), behind the CUDA backend's attention
// ops (attention.cpp, whose score and value products are cuBLAS calls). Plain pointers to
// device memory, C++17, each launch enqueued on `stream` and returning its status
// (cudaGetLastError) for the backend to check. Shapes as in backend/backend.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace polestar::cuda {

// x[M, heads * head_dim] rotated in place, row i at position positions[i] (device, each
// within the table): the first rotary_dim dims of each head, pairs (f, f + R/2) or, when
// `interleaved`, (2f, 2f + 1), by the angles cos/sin[position, R/2] (device); `inverse`
// rotates back. The same multiplies and adds as ops.cpp's Rotate, unfused: the same bits.
cudaError_t LaunchRope(float* x, int64_t m, const int* positions, int heads, int head_dim,
                       int rotary_dim, const float* cos, const float* sin, bool interleaved,
                       bool inverse, cudaStream_t stream);

// scores[rows, L] replaced by the softmax of each row, as reference.cpp's SoftmaxRow (the
// largest subtracted, exp, divided by the total; the total summed in a tree, not in order);
// `copy` (nullptr or [rows, L]) receives the same probabilities.
cudaError_t LaunchSoftmaxRows(float* scores, int64_t rows, int64_t l, float* copy,
                              cudaStream_t stream);

}  // namespace polestar::cuda
