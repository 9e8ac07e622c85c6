// RoPE, the attention softmax and fused attention. RoPE repeats ops.cpp's Rotate operation for
// operation with no fused multiply-add (the scalar twin has none either), so it gives the CPU's
// bits; the softmax follows reference.cpp's SoftmaxRow in fp32 with its sums reduced in a tree.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

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

// The fused attention's tiles. A block of four warps takes 16 query rows of one head of one
// segment and walks the keys 64 at a time: warp w scores keys [16w, 16w + 16) of the tile,
// then the four warps run the softmax of four rows each, then each multiplies the
// probabilities by the values of every fourth 16-dim column tile. Head dims are padded with
// zeros to a multiple of 16 (padded dims add nothing to a score and are never written).
constexpr int kRowTile = 16;
constexpr int kKeyTile = 64;
constexpr int kFusedWarps = 4;
constexpr int kFusedThreads = kFusedWarps * kWarp;
constexpr int kMma = 16;            // the warp product's tile side
constexpr int kMaxFusedDims = 128;  // padded head dims: 16 outputs a thread at most
constexpr int kOutputsPerThread = kRowTile * kMaxFusedDims / kFusedThreads;
constexpr int kRowsPerWarp = kRowTile / kFusedWarps;
constexpr int kKeysPerLane = kKeyTile / kWarp;

// Row strides of the shared tiles, padded past the row (a multiple of 16 bytes, as the warp
// products need) so that rows start in different banks.
struct FusedLayout {
  int dims;                                          // Dp: head_dim rounded up to kMma
  int bf16_stride;                                   // q and k/v tiles' rows: Dp + 8 BF16
  int pv_stride;                                     // the product tile's rows: Dp + 4 floats
  static constexpr int kScoreStride = kKeyTile + 4;  // floats
  static constexpr int kProbStride = kKeyTile + 8;   // BF16

  __host__ __device__ explicit FusedLayout(int head_dim)
      : dims((head_dim + kMma - 1) / kMma * kMma), bf16_stride(dims + 8), pv_stride(dims + 4) {}
  // Each section a multiple of 32 bytes, so every one starts aligned for the warp products.
  __host__ __device__ size_t q_bytes() const { return size_t(kRowTile) * bf16_stride * 2; }
  __host__ __device__ size_t kv_bytes() const { return size_t(kKeyTile) * bf16_stride * 2; }
  __host__ __device__ size_t score_bytes() const { return size_t(kRowTile) * kScoreStride * 4; }
  __host__ __device__ size_t prob_bytes() const { return size_t(kRowTile) * kProbStride * 2; }
  __host__ __device__ size_t pv_bytes() const { return size_t(kRowTile) * pv_stride * 4; }
  __host__ __device__ size_t row_bytes() const { return size_t(kRowTile) * 4; }
  // Plus 32 for aligning the dynamic shared memory's start (guaranteed 16 only).
  __host__ __device__ size_t shared_bytes() const {
    return 32 + q_bytes() + kv_bytes() + score_bytes() + prob_bytes() + pv_bytes() + row_bytes();
  }
};

constexpr size_t kSharedWithoutOptIn = 48 << 10;

// The launch's table: its segments and, per segment, the first of its row tiles (the grid's
// x runs over every segment's tiles in turn; its y over the heads).
struct SegmentTable {
  AttentionSegment segment[kFusedAttentionSegments];
  int first_tile[kFusedAttentionSegments + 1];
  int count;
};

__global__ void FusedAttentionKernel(SegmentTable table, int heads, int group, int head_dim,
                                     float scale) {
  namespace wmma = nvcuda::wmma;
  int s = 0;
  while (int(blockIdx.x) >= table.first_tile[s + 1]) ++s;
  const AttentionSegment segment = table.segment[s];
  const int row0 = (int(blockIdx.x) - table.first_tile[s]) * kRowTile;
  const int head = blockIdx.y, kv_head = head / group;
  const int64_t q_stride = int64_t(heads) * head_dim, kv_stride = int64_t(heads / group) * head_dim;
  const FusedLayout layout(head_dim);
  const int dims = layout.dims, ld = layout.bf16_stride;

  uint8_t* base = DynamicShared<uint8_t>();
  base += (32 - reinterpret_cast<uintptr_t>(base) % 32) % 32;
  auto* q_tile = reinterpret_cast<__nv_bfloat16*>(base);                      // [16, Dp] of ld
  auto* kv_tile = reinterpret_cast<__nv_bfloat16*>(base + layout.q_bytes());  // [64, Dp] of ld
  uint8_t* after_kv = base + layout.q_bytes() + layout.kv_bytes();
  auto* scores = reinterpret_cast<float*>(after_kv);  // [16, 64] of kScoreStride
  auto* probs = reinterpret_cast<__nv_bfloat16*>(after_kv + layout.score_bytes());  // [16, 64]
  auto* pv = reinterpret_cast<float*>(after_kv + layout.score_bytes() + layout.prob_bytes());
  auto* rescale = pv + size_t(kRowTile) * layout.pv_stride;  // [16]: the tile's exp(old - new max)

  const int t = threadIdx.x, lane = t % kWarp, warp = t / kWarp;
  for (int idx = t; idx < kRowTile * dims; idx += kFusedThreads) {
    const int i = idx / dims, c = idx % dims;
    const bool inside = row0 + i < segment.rows && c < head_dim;
    q_tile[i * ld + c] = __float2bfloat16_rn(
        inside ? segment.q[int64_t(row0 + i) * q_stride + int64_t(head) * head_dim + c] : 0.0f);
  }
  // A tile of keys or values into kv_tile: rows past the segment's keys and padded dims zero.
  auto load_keys = [&](const float* source, int key0, int keys) {
    for (int idx = t; idx < kKeyTile * dims; idx += kFusedThreads) {
      const int j = idx / dims, c = idx % dims;
      const bool inside = j < keys && c < head_dim;
      kv_tile[j * ld + c] = __float2bfloat16_rn(
          inside ? source[int64_t(key0 + j) * kv_stride + int64_t(kv_head) * head_dim + c] : 0.0f);
    }
  };

  float out[kOutputsPerThread] = {};  // this thread's outputs t + k * kFusedThreads of [16, Dp]
  float running_max[kRowsPerWarp], running_total[kRowsPerWarp];  // rows warp + r * kFusedWarps
  for (int r = 0; r < kRowsPerWarp; ++r) {
    running_max[r] = -INFINITY;
    running_total[r] = 0.0f;
  }
  for (int key0 = 0; key0 < segment.keys; key0 += kKeyTile) {
    const int keys = segment.keys - key0 < kKeyTile ? segment.keys - key0 : kKeyTile;
    __syncthreads();  // the last tile's values, probabilities and products are read
    load_keys(segment.k, key0, keys);
    __syncthreads();
    {  // scores[:, 16w, 16w + 16) = q_tile k_tile^T over the padded dims
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> score;
      wmma::fill_fragment(score, 0.0f);
      for (int c = 0; c < dims; c += kMma) {
        wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_tile + c, ld);
        wmma::load_matrix_sync(b, kv_tile + warp * kMma * ld + c, ld);
        wmma::mma_sync(score, a, b, score);
      }
      wmma::store_matrix_sync(scores + warp * kMma, score, FusedLayout::kScoreStride,
                              wmma::mem_row_major);
    }
    __syncthreads();  // every score is stored; the keys are read
    load_keys(segment.v, key0, keys);
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = warp + r * kFusedWarps;
      float score[kKeysPerLane], tile_max = -INFINITY;
      for (int e = 0; e < kKeysPerLane; ++e) {
        const int j = lane + e * kWarp;
        score[e] = j < keys ? scores[i * FusedLayout::kScoreStride + j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, score[e]);
      }
      const float new_max = fmaxf(running_max[r], WarpReduce(tile_max, Max()));
      // The total sums the probabilities as rounded for the product, so out is their exact
      // weighted mean.
      float tile_total = 0.0f;
      for (int e = 0; e < kKeysPerLane; ++e) {
        const __nv_bfloat16 p = __float2bfloat16_rn(expf(score[e] - new_max));
        probs[i * FusedLayout::kProbStride + lane + e * kWarp] = p;
        tile_total += __bfloat162float(p);
      }
      const float factor = expf(running_max[r] - new_max);  // 0 at the first tile
      running_total[r] = running_total[r] * factor + WarpReduce(tile_total, Sum());
      running_max[r] = new_max;
      if (lane == 0) rescale[i] = factor;
    }
    __syncthreads();  // values, probabilities and factors in place
    for (int c = warp * kMma; c < dims; c += kFusedWarps * kMma) {  // pv[:, c, c + 16)
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> product;
      wmma::fill_fragment(product, 0.0f);
      for (int j = 0; j < kKeyTile; j += kMma) {
        wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, probs + j, FusedLayout::kProbStride);
        wmma::load_matrix_sync(b, kv_tile + j * ld + c, ld);
        wmma::mma_sync(product, a, b, product);
      }
      wmma::store_matrix_sync(pv + c, product, layout.pv_stride, wmma::mem_row_major);
    }
    __syncthreads();
    for (int k = 0; k < kOutputsPerThread; ++k) {
      const int idx = t + k * kFusedThreads;
      if (idx >= kRowTile * dims) break;
      const int i = idx / dims, c = idx % dims;
      out[k] = out[k] * rescale[i] + pv[i * layout.pv_stride + c];
    }
  }
  __syncthreads();  // the last tile's factors are read: the slots take the totals
  if (lane == 0) {
    for (int r = 0; r < kRowsPerWarp; ++r) rescale[warp + r * kFusedWarps] = running_total[r];
  }
  __syncthreads();
  for (int k = 0; k < kOutputsPerThread; ++k) {
    const int idx = t + k * kFusedThreads;
    if (idx >= kRowTile * dims) break;
    const int i = idx / dims, c = idx % dims;
    if (row0 + i < segment.rows && c < head_dim) {
      segment.out[int64_t(row0 + i) * q_stride + int64_t(head) * head_dim + c] =
          out[k] / rescale[i];
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

bool FusedAttentionFits(int head_dim) {
  const FusedLayout layout(head_dim);
  return head_dim > 0 && layout.dims <= kMaxFusedDims &&
         layout.shared_bytes() <= kSharedWithoutOptIn;
}

cudaError_t LaunchFusedAttention(const AttentionSegment* segments, int count, int heads,
                                 int kv_heads, int head_dim, cudaStream_t stream) {
  if (count <= 0 || count > kFusedAttentionSegments || !FusedAttentionFits(head_dim) ||
      kv_heads <= 0 || heads % kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  SegmentTable table{};
  table.count = count;
  for (int s = 0; s < count; ++s) {
    if (segments[s].keys <= 0 || segments[s].rows < 0) return cudaErrorInvalidValue;
    table.segment[s] = segments[s];
    table.first_tile[s + 1] = table.first_tile[s] + (segments[s].rows + kRowTile - 1) / kRowTile;
  }
  for (int s = count; s < kFusedAttentionSegments; ++s) table.first_tile[s + 1] = INT_MAX;
  const int tiles = table.first_tile[count];
  if (tiles == 0 || heads == 0) return cudaSuccess;
  const float scale = 1.0f / sqrtf(float(head_dim));
  return Launch(FusedAttentionKernel, dim3(unsigned(tiles), unsigned(heads)), kFusedThreads,
                FusedLayout(head_dim).shared_bytes(), stream, table, heads, heads / kv_heads,
                head_dim, scale);
}

}  // namespace polestar::cuda
