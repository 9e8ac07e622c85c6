// The products' kernels: weight values decoded from every stored type (one thread per value,
// the formulas of ops/quant.cpp DequantizeValues with the same roundings: __fmul_rn/__fsub_rn
// keep nvcc from contracting them into FMAs, so the values are the host's bit for bit),
// activations rounded to BF16, the bias added.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

// Value c of a row stored as kType: what DequantizeValues writes at out[c]. Blocks of 32
// (Q8_0, Q4_0) or 256 values (the K-quants) are `block_bytes` long (BlockBytes).
template <DType kType>
__device__ float ValueAt(const uint8_t* row, int64_t c, int block_bytes) {
  if constexpr (kType == DType::kF32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (kType == DType::kF16) {
    return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(row)[c]));
  } else if constexpr (kType == DType::kBF16) {
    return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
  } else if constexpr (kType == DType::kQ8_0) {  // f16 d; i8 qs[32]
    const uint8_t* block = row + c / 32 * block_bytes;
    return __fmul_rn(float(int8_t(block[2 + c % 32])), HalfAt(block));
  } else if constexpr (kType == DType::kQ4_0) {  // f16 d; u8 qs[16]: low nibbles, then high
    const uint8_t* block = row + c / 32 * block_bytes;
    const int j = int(c % 32);
    const int byte = block[2 + j % 16];
    const int level = (j < 16 ? byte & 0xF : byte >> 4) - 8;
    return __fmul_rn(float(level), HalfAt(block));
  } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
    // f16 d, dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]. Chunks of 64 values: two
    // sub-blocks of 32 sharing 32 bytes of qs, low nibbles then high.
    constexpr bool kFiveBits = kType == DType::kQ5_K;
    const uint8_t* block = row + c / 256 * block_bytes;
    const int j = int(c % 256);
    const int chunk = j / 64, high = (j / 32) % 2, l = j % 32;
    int scale, min;
    ScaleMinK4(2 * chunk + high, block + 4, &scale, &min);
    const float d = __fmul_rn(HalfAt(block), float(scale));
    const float m = __fmul_rn(HalfAt(block + 2), float(min));
    const int byte = block[(kFiveBits ? 48 : 16) + 32 * chunk + l];
    int level = high ? byte >> 4 : byte & 0xF;
    if constexpr (kFiveBits) level += ((block[16 + l] >> (2 * chunk + high)) & 1) << 4;
    return __fsub_rn(__fmul_rn(d, float(level)), m);
  } else {
    static_assert(kType == DType::kQ6_K);
    // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Halves of 128 values (ql[64], qh[32],
    // scales[8]), each four quarters of 32: quarter q takes the low (q < 2) or high nibble of
    // ql[l + 32 (q % 2)] and bits 2q, 2q+1 of qh[l], with scale l / 16 + 2q.
    const uint8_t* block = row + c / 256 * block_bytes;
    const int j = int(c % 256);
    const int half = j / 128, quarter = (j / 32) % 4, l = j % 32;
    const uint8_t* ql = block + 64 * half;
    const uint8_t* qh = block + 128 + 32 * half;
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192 + 8 * half);
    const int byte = ql[l + 32 * (quarter % 2)];
    const int low = quarter < 2 ? byte & 0xF : byte >> 4;
    const int level = (low | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    const float d = __fmul_rn(HalfAt(block + 208), float(scales[l / 16 + 2 * quarter]));
    return __fmul_rn(d, float(level));
  }
}

__device__ uint16_t Bf16Bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
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

// One warp per weight row (grid-strided by whole warps, so every lane of a warp takes the
// same rows and the reductions see all 32): lane l decodes values l, l + 32, ... of the row
// and adds each times every row of x; the lanes' sums are then reduced.
template <DType kType>
__global__ void RowsTimesDecodedKernel(const uint8_t* weights, int64_t row_bytes, int block_bytes,
                                       int64_t n, int64_t k, const float* x, int m, float* y) {
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
      if (lane == 0) y[r * n + row] = total;
    }
  }
}

template <DType kType>
cudaError_t LaunchRowsTimes(const uint8_t* weights, int64_t row_bytes, int64_t n, int64_t k,
                            const float* x, int m, float* y, cudaStream_t stream) {
  constexpr int64_t kWarpsPerBlock = kThreads / kWarp;
  const int blocks = int(std::min<int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
  return Launch(RowsTimesDecodedKernel<kType>, blocks, kThreads, 0, stream, weights, row_bytes,
                BlockBytes(kType), n, k, x, m, y);
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
                                   int64_t k, const float* x, int64_t m, float* y,
                                   cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (m > kMaxDecodedProductRows) return cudaErrorInvalidValue;
  return ForWeightType(type, [&](auto stored) {
    return LaunchRowsTimes<decltype(stored)::value>(weights, row_bytes, n, k, x, int(m), y, stream);
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
