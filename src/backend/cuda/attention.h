// The RoPE, softmax and fused attention kernels' launchers (attention.cu), behind the CUDA
// backend's attention ops (attention.cpp). Plain pointers to device memory, C++17, each launch
// enqueued on `stream` and returning its status (cudaGetLastError) for the backend to check.
// Shapes as in backend/backend.h.
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

// One attention call's share of a fused launch: query rows [rows, H*D] at q and out over keys
// [keys, Hkv*D] at k and v (device). At least one key.
struct AttentionSegment {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  int rows = 0, keys = 0;
};
// At most this many segments per launch: the table travels as the kernel's parameter.
constexpr int kFusedAttentionSegments = 32;

// Whether LaunchFusedAttention takes heads of head_dim dims (the tiles fit shared memory).
bool FusedAttentionFits(int head_dim);
// Each segment's out = softmax(q k^T / sqrt(D)) v, query head h reading kv head h / (H / Hkv),
// in one launch and without the scores leaving the chip: flash-style tiles of 16 query rows
// and 64 keys, the products on the tensor cores from BF16 q, k, probabilities and v with FP32
// sums, the softmax running in FP32 over the key tiles (the largest so far subtracted, the
// total rescaled as it grows). `count` <= kFusedAttentionSegments.
cudaError_t LaunchFusedAttention(const AttentionSegment* segments, int count, int heads,
                                 int kv_heads, int head_dim, cudaStream_t stream);

}  // namespace polestar::cuda
