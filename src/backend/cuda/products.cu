// The products' kernels: weight values decoded from every stored type (one thread per value,
// the formulas of ops/quant.cpp DequantizeValues with the same roundings: __fmul_rn/__fsub_rn
// keep nvcc from contracting them into FMAs, so the values are the host's bit for bit),
// activations rounded to BF16, the bias added.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/products.h"

namespace polestar::cuda {
namespace {

__device__ uint16_t LoadU16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

__device__ float HalfAt(const uint8_t* p) { return __half2float(__ushort_as_half(LoadU16(p))); }

// quant.cpp ScaleMinK4: the 6-bit scale and min of sub-block j of a Q4_K / Q5_K block.
__device__ void ScaleMinK4(int j, const uint8_t* scales, int* scale, int* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Values c0 .. c0 + 7 of a row stored as kType (c0 a multiple of 8): group[i] is what
// DequantizeValues writes at out[c0 + i]. Blocks of 32 (Q8_0, Q4_0) or 256 values (the
// K-quants) are `block_bytes` long (BlockBytes). Eight values never straddle a block or a
// sub-block, so what they share (the block's scales, which nibble) is decoded once.
template <DType kType>
struct Group {
  __device__ Group(const uint8_t* row, int64_t c0, int block_bytes) {
    if constexpr (kType == DType::kF32) {
      bytes = row + 4 * c0;
    } else if constexpr (kType == DType::kF16 || kType == DType::kBF16) {
      bytes = row + 2 * c0;
    } else if constexpr (kType == DType::kQ8_0) {  // f16 d; i8 qs[32]
      const uint8_t* block = row + c0 / 32 * block_bytes;
      d = HalfAt(block);
      bytes = block + 2 + c0 % 32;
    } else if constexpr (kType == DType::kQ4_0) {  // f16 d; u8 qs[16]: low nibbles, then high
      const uint8_t* block = row + c0 / 32 * block_bytes;
      const int j0 = int(c0 % 32);
      d = HalfAt(block);
      bytes = block + 2 + j0 % 16;
      shift = j0 < 16 ? 0 : 4;
    } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
      // f16 d, dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]. Chunks of 64 values: two
      // sub-blocks of 32 sharing 32 bytes of qs, low nibbles then high.
      const uint8_t* block = row + c0 / 256 * block_bytes;
      const int j0 = int(c0 % 256);
      const int chunk = j0 / 64, high = (j0 / 32) % 2, l0 = j0 % 32;
      int scale, min;
      ScaleMinK4(2 * chunk + high, block + 4, &scale, &min);
      d = __fmul_rn(HalfAt(block), float(scale));
      m = __fmul_rn(HalfAt(block + 2), float(min));
      bytes = block + (kType == DType::kQ5_K ? 48 : 16) + 32 * chunk + l0;
      shift = high ? 4 : 0;
      high_bits = block + 16 + l0;
      bit = 2 * chunk + high;
    } else {
      static_assert(kType == DType::kQ6_K);
      // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Halves of 128 values (ql[64], qh[32],
      // scales[8]), each four quarters of 32: quarter q takes the low (q < 2) or high nibble of
      // ql[l + 32 (q % 2)] and bits 2q, 2q+1 of qh[l], with scale l / 16 + 2q.
      const uint8_t* block = row + c0 / 256 * block_bytes;
      const int j0 = int(c0 % 256);
      const int half = j0 / 128, quarter = (j0 / 32) % 4, l0 = j0 % 32;
      const auto* scales = reinterpret_cast<const int8_t*>(block + 192 + 8 * half);
      d = __fmul_rn(HalfAt(block + 208), float(scales[l0 / 16 + 2 * quarter]));
      bytes = block + 64 * half + 32 * (quarter % 2) + l0;
      shift = quarter < 2 ? 0 : 4;
      high_bits = block + 128 + 32 * half + l0;
      bit = 2 * quarter;
    }
  }

  __device__ float operator[](int i) const {
    if constexpr (kType == DType::kF32) {
      return reinterpret_cast<const float*>(bytes)[i];
    } else if constexpr (kType == DType::kF16) {
      return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(bytes)[i]));
    } else if constexpr (kType == DType::kBF16) {
      return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(bytes)[i]) << 16);
    } else if constexpr (kType == DType::kQ8_0) {
      return __fmul_rn(float(int8_t(bytes[i])), d);
    } else if constexpr (kType == DType::kQ4_0) {
      return __fmul_rn(float(((bytes[i] >> shift) & 0xF) - 8), d);
    } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
      int level = (bytes[i] >> shift) & 0xF;
      if constexpr (kType == DType::kQ5_K) level += ((high_bits[i] >> bit) & 1) << 4;
      return __fsub_rn(__fmul_rn(d, float(level)), m);
    } else {
      const int level = (((bytes[i] >> shift) & 0xF) | (((high_bits[i] >> bit) & 3) << 4)) - 32;
      return __fmul_rn(d, float(level));
    }
  }

  const uint8_t* bytes = nullptr;      // the group's first value (or its quants)
  const uint8_t* high_bits = nullptr;  // Q5_K, Q6_K: the bytes holding its high bits
  float d = 0, m = 0;                  // the scale (and the K-quants' min) it shares
  int shift = 0, bit = 0;              // its nibble; the position of its high bits
};

// Value c of a row stored as kType.
template <DType kType>
__device__ float ValueAt(const uint8_t* row, int64_t c, int block_bytes) {
  return Group<kType>(row, c - c % 8, block_bytes)[int(c % 8)];
}

// Element e = r * K + c of out[count, K]: value c of weight row rows[r] (or first_row + r).
template <DType kType, Decoded kDecoded>
__global__ void DequantizeRowsKernel(const uint8_t* weights, int64_t row_bytes, int block_bytes,
                                     int64_t k, const int* rows, int64_t first_row, int64_t count,
                                     void* out) {
  const int64_t total = count * k;
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t r = e / k, c = e % k;
    const int64_t row = rows != nullptr ? int64_t(rows[r]) : first_row + r;
    const float value = ValueAt<kType>(weights + row * row_bytes, c, block_bytes);
    if constexpr (kDecoded == Decoded::kF32) {
      static_cast<float*>(out)[e] = value;
    } else {
      static_cast<uint16_t*>(out)[e] = Bf16Bits(value);
    }
  }
}

template <DType kType>
cudaError_t LaunchDequantize(const uint8_t* weights, int64_t row_bytes, int64_t k, const int* rows,
                             int64_t first_row, int64_t count, Decoded decoded, void* out,
                             cudaStream_t stream) {
  const int blocks = GridBlocks(count * k);
  const int block_bytes = BlockBytes(kType);
  return decoded == Decoded::kF32
             ? Launch(DequantizeRowsKernel<kType, Decoded::kF32>, blocks, kThreads, 0, stream,
                      weights, row_bytes, block_bytes, k, rows, first_row, count, out)
             : Launch(DequantizeRowsKernel<kType, Decoded::kBf16>, blocks, kThreads, 0, stream,
                      weights, row_bytes, block_bytes, k, rows, first_row, count, out);
}

// One warp per weight row (grid-strided by whole warps over the blocks of the grid's x, so
// every lane of a warp takes the same rows and the reductions see all 32): lane l decodes
// values l, l + 32, ... of the row and adds each times every row of x[m, K] (m <=
// kMaxDecodedProductRows); the lanes' sums are then reduced into y[m, N] (added to it when
// `accumulate`).
template <DType kType>
__device__ void RowsTimesDecodedRows(const uint8_t* weights, int64_t row_bytes, int block_bytes,
                                     int64_t n, int64_t k, const float* x, int m, float* y,
                                     bool accumulate) {
  constexpr int kWarpsPerBlock = kThreads / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; row < n;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    const uint8_t* w = weights + row * row_bytes;
    float sums[kMaxDecodedProductRows] = {};
    for (int64_t c = lane; c < k; c += kWarp) {
      const float value = ValueAt<kType>(w, c, block_bytes);
#pragma unroll
      for (int r = 0; r < kMaxDecodedProductRows; ++r) {
        if (r < m) sums[r] = fmaf(value, x[r * k + c], sums[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxDecodedProductRows; ++r) {
      if (r >= m) break;  // m is the same in every lane
      const float total = WarpReduce(sums[r], Sum());
      if (lane == 0) y[r * n + row] = accumulate ? y[r * n + row] + total : total;
    }
  }
}

template <DType kType>
__global__ void RowsTimesDecodedKernel(const uint8_t* weights, int64_t row_bytes, int block_bytes,
                                       int64_t n, int64_t k, const float* x, int m, float* y,
                                       bool accumulate) {
  RowsTimesDecodedRows<kType>(weights, row_bytes, block_bytes, n, k, x, m, y, accumulate);
}

// Group blockIdx.y's rows and weights: its first row and row count are the sums of
// counts[S, G] over the sequences and the groups before it (warp 0 adds them; the block
// shares the result).
struct GroupRows {
  int64_t first;
  int count;
  const uint8_t* weights;
};
__device__ GroupRows ThisBlocksGroup(const ProductGroups& groups) {
  __shared__ int64_t shared_first;
  __shared__ int shared_count;
  const int g = int(blockIdx.y);
  if (threadIdx.x < kWarp) {
    int64_t before = 0, mine = 0;
    const int64_t items = int64_t(groups.sequences) * (g + 1);  // counts[s, 0 .. g]
    for (int64_t i = threadIdx.x; i < items; i += kWarp) {
      const int64_t s = i / (g + 1), e = i % (g + 1);
      const int64_t rows = groups.counts[s * groups.groups + e];
      if (e < g) {
        before += rows;
      } else {
        mine += rows;
      }
    }
    before = WarpReduce(before, Sum());
    mine = WarpReduce(mine, Sum());
    if (threadIdx.x == 0) {
      shared_first = before;
      shared_count = int(mine);
    }
  }
  __syncthreads();
  return {shared_first, shared_count, groups.weights[blockIdx.y]};
}

// Group blockIdx.y's rows, kMaxDecodedProductRows at a time.
template <DType kType>
__global__ void GroupsTimesDecodedKernel(ProductGroups groups, int64_t row_bytes, int block_bytes,
                                         int64_t n, int64_t k, const float* x, float* y) {
  const auto [first, count, weights] = ThisBlocksGroup(groups);
  for (int r0 = 0; r0 < count; r0 += int(kMaxDecodedProductRows)) {
    const int m =
        count - r0 < int(kMaxDecodedProductRows) ? count - r0 : int(kMaxDecodedProductRows);
    RowsTimesDecodedRows<kType>(weights, row_bytes, block_bytes, n, k, x + (first + r0) * k, m,
                                y + (first + r0) * n, false);
  }
}

template <DType kType>
cudaError_t LaunchRowsTimes(const uint8_t* weights, int64_t row_bytes, int64_t n, int64_t k,
                            const float* x, int m, float* y, bool accumulate, cudaStream_t stream) {
  constexpr int64_t kWarpsPerBlock = kThreads / kWarp;
  const int blocks = int(std::min<int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
  return Launch(RowsTimesDecodedKernel<kType>, blocks, kThreads, 0, stream, weights, row_bytes,
                BlockBytes(kType), n, k, x, m, y, accumulate);
}

// The tile product's blocks: four warps take 64 weight rows (warp w rows [16w, 16w + 16))
// and every row of x over one split of K, 64 values of K a step: the block decodes the
// weights' step into a BF16 tile in shared memory (a group of 8 values a thread at a time),
// copies x's step beside it, and each warp multiplies its 16 rows with every 16-row tile of
// x on the tensor cores, accumulating in FP32. Row strides are padded by 8 BF16 (16 bytes:
// rows start in different banks and stay aligned for the warp products).
constexpr int kTileWarps = 4;
constexpr int kTileThreads = kTileWarps * kWarp;
constexpr int kTileWeightRows = kTileWarps * 16;
constexpr int kTileStep = 64;            // values of K a step
constexpr int64_t kTileSplitUnit = 256;  // K's splits are whole K-quant blocks (and steps)
constexpr int64_t kTileProductBlocks = 512;
constexpr int kTileStride = kTileStep + 8;
constexpr int kTileOutStride = kTileWeightRows + 4;  // floats
constexpr int kTileXTiles = kMaxTileProductRows / 16;
constexpr size_t kWeightTileBytes = size_t(kTileWeightRows) * kTileStride * 2;  // multiple of 32
constexpr size_t kXTileBytes = size_t(kMaxTileProductRows) * kTileStride * 2;
// The two BF16 tiles, then (reusing them) the block's FP32 outputs; plus 32 for aligning the
// dynamic shared memory's start.
constexpr size_t kTileSharedBytes =
    32 + std::max(kWeightTileBytes + kXTileBytes, size_t(kMaxTileProductRows) * kTileOutStride * 4);

// Eight BF16 values as one 16-byte store.
union EightBf16 {
  uint4 whole;
  __nv_bfloat16 value[8];
};

namespace wmma = nvcuda::wmma;
using TileSums = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The block's shared memory (kTileSharedBytes): the weight and x tiles, and (reusing them)
// the sums.
struct TileSpace {
  __device__ TileSpace() {
    uint8_t* base = DynamicShared<uint8_t>();
    base += (32 - reinterpret_cast<uintptr_t>(base) % 32) % 32;
    w_tile = reinterpret_cast<__nv_bfloat16*>(base);
    x_tile = reinterpret_cast<__nv_bfloat16*>(base + kWeightTileBytes);
    sums = reinterpret_cast<float*>(base);
  }
  __nv_bfloat16* w_tile;  // [64, kTileStep] of kTileStride
  __nv_bfloat16* x_tile;  // [16 x_tiles, kTileStep] of kTileStride
  float* sums;            // [m, 64] of kTileOutStride, after the steps
};

constexpr int kTileGroupsPerRow = kTileStep / 8;

// w_tile = weight rows [row0, row0 + 64) (of n), values [c0, c0 + kTileStep) (of k_end), as
// BF16; zeros past them.
template <DType kType>
__device__ void DecodeWeightStep(__nv_bfloat16* w_tile, const uint8_t* weights, int64_t row_bytes,
                                 int block_bytes, int64_t n, int64_t row0, int64_t c0,
                                 int64_t k_end) {
  for (int g = threadIdx.x; g < kTileWeightRows * kTileGroupsPerRow; g += kTileThreads) {
    const int r = g / kTileGroupsPerRow, c = g % kTileGroupsPerRow * 8;
    EightBf16 eight;
    if (row0 + r < n && c0 + c < k_end) {
      const Group<kType> group(weights + (row0 + r) * row_bytes, c0 + c, block_bytes);
#pragma unroll
      for (int i = 0; i < 8; ++i) eight.value[i] = __float2bfloat16_rn(group[i]);
    } else {
      eight.whole = make_uint4(0, 0, 0, 0);
    }
    *reinterpret_cast<uint4*>(w_tile + r * kTileStride + c) = eight.whole;
  }
}

// Each warp's 16 weight rows times every 16-row tile of x over one step, into acc.
__device__ void MultiplyStep(TileSums (&acc)[kTileXTiles], const __nv_bfloat16* w_tile,
                             const __nv_bfloat16* x_tile, int x_tiles) {
  const int warp = int(threadIdx.x) / kWarp;
#pragma unroll
  for (int kk = 0; kk < kTileStep; kk += 16) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> w_part;
    wmma::load_matrix_sync(w_part, w_tile + warp * 16 * kTileStride + kk, kTileStride);
#pragma unroll
    for (int i = 0; i < kTileXTiles; ++i) {
      if (i >= x_tiles) break;  // the same in every lane
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> x_part;
      wmma::load_matrix_sync(x_part, x_tile + i * 16 * kTileStride + kk, kTileStride);
      wmma::mma_sync(acc[i], x_part, w_part, acc[i]);
    }
  }
}

// x_tile = rows [0, m) of x[m, K] (BF16, K a multiple of 8), values [c0, c0 + kTileStep) (of
// k_end), as 16 x_tiles rows; zeros past them.
__device__ void LoadXStep(__nv_bfloat16* x_tile, const __nv_bfloat16* x, int m, int64_t k,
                          int x_tiles, int64_t c0, int64_t k_end) {
  for (int g = threadIdx.x; g < 16 * x_tiles * kTileGroupsPerRow; g += kTileThreads) {
    const int r = g / kTileGroupsPerRow, c = g % kTileGroupsPerRow * 8;
    uint4 eight = make_uint4(0, 0, 0, 0);
    if (r < m && c0 + c < k_end) eight = *reinterpret_cast<const uint4*>(x + r * k + c0 + c);
    *reinterpret_cast<uint4*>(x_tile + r * kTileStride + c) = eight;
  }
}

// out[m, N] columns [row0, row0 + 64) (of n) = the block's sums (+= when `accumulate`), once
// its steps are done.
__device__ void StoreTileSums(const TileSums (&acc)[kTileXTiles], float* sums, int x_tiles, int m,
                              int64_t n, int64_t row0, bool accumulate, float* out) {
  const int warp = int(threadIdx.x) / kWarp;
  __syncthreads();  // the tiles are read: the space takes the sums
#pragma unroll
  for (int i = 0; i < kTileXTiles; ++i) {
    if (i >= x_tiles) break;
    wmma::store_matrix_sync(sums + i * 16 * kTileOutStride + warp * 16, acc[i], kTileOutStride,
                            wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m * kTileWeightRows; e += kTileThreads) {
    const int r = e / kTileWeightRows, c = e % kTileWeightRows;
    if (row0 + c >= n) continue;
    const float sum = sums[r * kTileOutStride + c];
    float& to = out[r * n + row0 + c];
    to = accumulate ? to + sum : sum;
  }
  __syncthreads();  // the sums are read: the next tile's steps may take the space
}

// x[m, K] is BF16 (K a multiple of 8); out[s, m, N] takes split s's sums (y itself, added to
// when `accumulate`, when there is one split).
template <DType kType>
__global__ void TileProductKernel(const uint8_t* weights, int64_t row_bytes, int block_bytes,
                                  int64_t n, int64_t k, const __nv_bfloat16* x, int m, int x_tiles,
                                  int64_t split_k, bool accumulate, float* out) {
  const TileSpace space;
  const int64_t row0 = int64_t(blockIdx.x) * kTileWeightRows;
  const int64_t k_begin = int64_t(blockIdx.y) * split_k;
  const int64_t k_end = k_begin + split_k < k ? k_begin + split_k : k;

  TileSums acc[kTileXTiles];
#pragma unroll
  for (int i = 0; i < kTileXTiles; ++i) wmma::fill_fragment(acc[i], 0.0f);
  for (int64_t c0 = k_begin; c0 < k_end; c0 += kTileStep) {
    __syncthreads();  // the last step's tiles are read
    DecodeWeightStep<kType>(space.w_tile, weights, row_bytes, block_bytes, n, row0, c0, k_end);
    LoadXStep(space.x_tile, x, m, k, x_tiles, c0, k_end);
    __syncthreads();
    MultiplyStep(acc, space.w_tile, space.x_tile, x_tiles);
  }
  StoreTileSums(acc, space.sums, x_tiles, m, n, row0, accumulate,
                out + int64_t(blockIdx.y) * m * n);
}

// Group blockIdx.y's rows of x[rows, K] (BF16, K a multiple of 8), 64 at a time (row tiles
// strided by the grid's z), times its weights' rows [64 blockIdx.x, + 64), over all of K.
template <DType kType>
__global__ void GroupsTileProductKernel(ProductGroups groups, int64_t row_bytes, int block_bytes,
                                        int64_t n, int64_t k, const __nv_bfloat16* x, float* y) {
  const auto [first, count, weights] = ThisBlocksGroup(groups);
  const TileSpace space;
  const int64_t row0 = int64_t(blockIdx.x) * kTileWeightRows;
  for (int64_t tile0 = int64_t(blockIdx.z) * kMaxTileProductRows; tile0 < count;
       tile0 += int64_t(gridDim.z) * kMaxTileProductRows) {
    const int m = int(count - tile0 < kMaxTileProductRows ? count - tile0 : kMaxTileProductRows);
    const int x_tiles = (m + 15) / 16;
    const __nv_bfloat16* x_rows = x + (first + tile0) * k;  // [m, K]
    TileSums acc[kTileXTiles];
#pragma unroll
    for (int i = 0; i < kTileXTiles; ++i) wmma::fill_fragment(acc[i], 0.0f);
    for (int64_t c0 = 0; c0 < k; c0 += kTileStep) {
      __syncthreads();  // the last step's tiles are read
      DecodeWeightStep<kType>(space.w_tile, weights, row_bytes, block_bytes, n, row0, c0, k);
      LoadXStep(space.x_tile, x_rows, m, k, x_tiles, c0, k);
      __syncthreads();
      MultiplyStep(acc, space.w_tile, space.x_tile, x_tiles);
    }
    StoreTileSums(acc, space.sums, x_tiles, m, n, row0, false, y + (first + tile0) * n);
  }
}

// y[i] = the splits' sums of output i, added in split order (the same bits every run); with
// `accumulate`, y[i] + that total.
__global__ void SumSplitsKernel(const float* partial, int64_t outputs, int splits, bool accumulate,
                                float* y) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < outputs;
       i += int64_t(gridDim.x) * kThreads) {
    float total = partial[i];
    for (int s = 1; s < splits; ++s) total += partial[s * outputs + i];
    y[i] = accumulate ? y[i] + total : total;
  }
}

__global__ void RoundToBf16Kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    out[i] = Bf16Bits(x[i]);
  }
}

__global__ void AddBiasKernel(float* y, int64_t m, int64_t n, const float* bias) {
  const int64_t total = m * n;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    y[i] += bias[i % n];
  }
}

// launch(std::integral_constant<DType, type>{}) for a weight type the kernels decode;
// cudaErrorInvalidValue for any other (the backend rejects those before launching).
template <class Launch>
cudaError_t ForWeightType(DType type, Launch&& launch) {
  switch (type) {
    case DType::kF32:
      return launch(std::integral_constant<DType, DType::kF32>{});
    case DType::kF16:
      return launch(std::integral_constant<DType, DType::kF16>{});
    case DType::kBF16:
      return launch(std::integral_constant<DType, DType::kBF16>{});
    case DType::kQ8_0:
      return launch(std::integral_constant<DType, DType::kQ8_0>{});
    case DType::kQ4_0:
      return launch(std::integral_constant<DType, DType::kQ4_0>{});
    case DType::kQ4_K:
      return launch(std::integral_constant<DType, DType::kQ4_K>{});
    case DType::kQ5_K:
      return launch(std::integral_constant<DType, DType::kQ5_K>{});
    case DType::kQ6_K:
      return launch(std::integral_constant<DType, DType::kQ6_K>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchDequantizeRows(DType type, const uint8_t* weights, int64_t row_bytes, int64_t k,
                                 const int* rows, int64_t first_row, int64_t count, Decoded decoded,
                                 void* out, cudaStream_t stream) {
  if (count <= 0 || k <= 0) return cudaSuccess;
  return ForWeightType(type, [&](auto stored) {
    return LaunchDequantize<decltype(stored)::value>(weights, row_bytes, k, rows, first_row, count,
                                                     decoded, out, stream);
  });
}

cudaError_t LaunchRowsTimesDecoded(DType type, const uint8_t* weights, int64_t row_bytes, int64_t n,
                                   int64_t k, const float* x, int64_t m, float* y, bool accumulate,
                                   cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (m > kMaxDecodedProductRows) return cudaErrorInvalidValue;
  return ForWeightType(type, [&](auto stored) {
    return LaunchRowsTimes<decltype(stored)::value>(weights, row_bytes, n, k, x, int(m), y,
                                                    accumulate, stream);
  });
}

// K is split in whole units of kTileSplitUnit, into enough splits for about kTileProductBlocks
// blocks (a cached step's 4096 weight rows are 64 tiles: too few to keep a GPU's memory
// busy), every split holding the same number of units but the last.
int64_t TileUnitsPerSplit(int64_t n, int64_t k) {
  const int64_t tiles = (n + kTileWeightRows - 1) / kTileWeightRows;
  const int64_t units = (k + kTileSplitUnit - 1) / kTileSplitUnit;
  const int64_t wanted = std::clamp<int64_t>((kTileProductBlocks + tiles - 1) / tiles, 1, units);
  return std::max<int64_t>(1, (units + wanted - 1) / wanted);
}

int TileProductSplits(int64_t n, int64_t k) {
  const int64_t units = (k + kTileSplitUnit - 1) / kTileSplitUnit,
                per_split = TileUnitsPerSplit(n, k);
  return int(std::max<int64_t>(1, (units + per_split - 1) / per_split));
}

int64_t TileProductScratchFloats(int64_t m, int64_t n, int64_t k) {
  const int splits = TileProductSplits(n, k);
  return splits > 1 ? splits * m * n : 0;  // the splits' sums
}

cudaError_t LaunchTileProduct(DType type, const uint8_t* weights, int64_t row_bytes, int64_t n,
                              int64_t k, const uint16_t* x_bf16, int64_t m, float* y,
                              bool accumulate, float* scratch, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (m > kMaxTileProductRows || k % 8 != 0) return cudaErrorInvalidValue;
  const int splits = TileProductSplits(n, k);
  const int64_t split_k = TileUnitsPerSplit(n, k) * kTileSplitUnit;
  const int x_tiles = int((m + 15) / 16);
  float* partial = splits > 1 ? scratch : y;
  const dim3 grid(unsigned((n + kTileWeightRows - 1) / kTileWeightRows), unsigned(splits));
  const cudaError_t status = ForWeightType(type, [&](auto stored) {
    constexpr DType kType = decltype(stored)::value;
    if constexpr (kType == DType::kF32 || kType == DType::kF16 || kType == DType::kBF16) {
      return cudaErrorInvalidValue;
    } else {
      return Launch(TileProductKernel<kType>, grid, kTileThreads, kTileSharedBytes, stream, weights,
                    row_bytes, BlockBytes(type), n, k,
                    reinterpret_cast<const __nv_bfloat16*>(x_bf16), int(m), x_tiles, split_k,
                    accumulate && splits == 1, partial);
    }
  });
  if (status != cudaSuccess || splits == 1) return status;
  return Launch(SumSplitsKernel, GridBlocks(m * n), kThreads, 0, stream,
                static_cast<const float*>(partial), m * n, splits, accumulate, y);
}

cudaError_t LaunchGroupsTimesDecoded(DType type, const ProductGroups& groups, int64_t row_bytes,
                                     int64_t n, int64_t k, const float* x, float* y,
                                     cudaStream_t stream) {
  if (groups.groups <= 0 || n <= 0) return cudaSuccess;
  if (groups.groups > kMaxProductGroups) return cudaErrorInvalidValue;
  constexpr int64_t kWarpsPerBlock = kThreads / kWarp;
  const dim3 grid(unsigned(std::min<int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                             std::max<int64_t>(1, kMaxBlocks / groups.groups))),
                  unsigned(groups.groups));
  return ForWeightType(type, [&](auto stored) {
    return Launch(GroupsTimesDecodedKernel<decltype(stored)::value>, grid, kThreads, 0, stream,
                  groups, row_bytes, BlockBytes(type), n, k, x, y);
  });
}

cudaError_t LaunchGroupsTileProduct(DType type, const ProductGroups& groups, int64_t row_bytes,
                                    int64_t n, int64_t k, const uint16_t* x_bf16, int64_t rows,
                                    float* y, cudaStream_t stream) {
  if (groups.groups <= 0 || n <= 0 || rows <= 0) return cudaSuccess;
  if (groups.groups > kMaxProductGroups || k % 8 != 0) return cudaErrorInvalidValue;
  // Enough row tiles a group for the groups' mean rows; a larger group's blocks take more.
  const int64_t mean_tiles =
      (rows + groups.groups * kMaxTileProductRows - 1) / (groups.groups * kMaxTileProductRows);
  const dim3 grid(unsigned((n + kTileWeightRows - 1) / kTileWeightRows), unsigned(groups.groups),
                  unsigned(std::clamp<int64_t>(mean_tiles, 1, 16)));
  return ForWeightType(type, [&](auto stored) {
    constexpr DType kType = decltype(stored)::value;
    if constexpr (kType == DType::kF32 || kType == DType::kF16) {
      return cudaErrorInvalidValue;
    } else {
      return Launch(GroupsTileProductKernel<kType>, grid, kTileThreads, kTileSharedBytes, stream,
                    groups, row_bytes, BlockBytes(type), n, k,
                    reinterpret_cast<const __nv_bfloat16*>(x_bf16), y);
    }
  });
}

cudaError_t LaunchRoundToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return Launch(RoundToBf16Kernel, GridBlocks(n), kThreads, 0, stream, x, n, out);
}

cudaError_t LaunchAddBias(float* y, int64_t m, int64_t n, const float* bias, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  return Launch(AddBiasKernel, GridBlocks(m * n), kThreads, 0, stream, y, m, n, bias);
}

}  // namespace polestar::cuda
