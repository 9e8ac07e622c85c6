// The matrix products' kernels (products.cu): weight rows of every stored type decoded on the
// device, the product of few rows over such weights, activations rounded to BF16, the bias
// added. Plain pointers to device memory, C++17
// (see rowwise.h); each launch enqueued on `stream`, returning its status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace polestar::cuda {

// What a dequantisation writes: floats, or BF16 bits (round to nearest even).
enum class Decoded { kF32, kBf16 };

// out[r, K] (as `decoded`) = the K values of weight row rows[r], or of row first_row + r when
// `rows` is null, for r < count. Row j of the weights starts at weights + j * row_bytes and
// holds K values stored as `type` (F32, F16, BF16 or a block type, K a multiple of its block;
// F32/F16/BF16 rows aligned to their element). The values are ops/quant.cpp
// DequantizeValues's, bit for bit.
cudaError_t LaunchDequantizeRows(DType type, const uint8_t* weights, int64_t row_bytes, int64_t k,
                                 const int* rows, int64_t first_row, int64_t count, Decoded decoded,
                                 void* out, cudaStream_t stream);

// A product of few rows: at most this many rows of x take LaunchRowsTimesDecoded.
constexpr int64_t kMaxDecodedProductRows = 8;

// y[M, N] = x[M, K] · w[N, K]^T for M <= kMaxDecodedProductRows, w's rows stored as `type`
// (as LaunchDequantizeRows reads them): each weight value decoded in registers as it is read,
// so the stored bytes cross from memory once and no decoded copy is written, and multiplied
// with every row of x in FP32. With `accumulate`, y += the product.
cudaError_t LaunchRowsTimesDecoded(DType type, const uint8_t* weights, int64_t row_bytes, int64_t n,
                                   int64_t k, const float* x, int64_t m, float* y, bool accumulate,
                                   cudaStream_t stream);

// The tile product: at most this many rows of x take LaunchTileProduct.
constexpr int64_t kMaxTileProductRows = 64;

// y[M, N] = x[M, K] · w[N, K]^T for M <= kMaxTileProductRows over weights of a block type:
// x_bf16 (x as BF16 bits, K a multiple of 8) times the weights decoded to BF16 (as
// LaunchDequantizeRows decodes them) tile by tile in shared memory, on the tensor cores with
// FP32 sums, so the stored bytes cross from memory once and no decoded copy is written. K
// may be split across blocks, whose sums are then added in a fixed order: the same bits
// every run. With `accumulate`, y += the product. `scratch` holds
// TileProductScratchFloats(M, N, K) floats (the splits' sums).
int64_t TileProductScratchFloats(int64_t m, int64_t n, int64_t k);
cudaError_t LaunchTileProduct(DType type, const uint8_t* weights, int64_t row_bytes, int64_t n,
                              int64_t k, const uint16_t* x_bf16, int64_t m, float* y,
                              bool accumulate, float* scratch, cudaStream_t stream);

// The row groups of a grouped product (Backend::MatMulGroups): group g's weights start at
// weights[g] (device memory, [groups] pointers, every group's rows row_bytes apart), its rows
// number the sum of counts[s, g] over the `sequences` rows of counts[S, G] (device memory),
// and they follow the rows of the groups before it.
struct ProductGroups {
  const uint8_t* const* weights = nullptr;
  const int* counts = nullptr;
  int sequences = 0;
  int groups = 0;
};
// The most groups a grouped product takes (a grid's y).
constexpr int kMaxProductGroups = 65535;

// y[rows, N] = each group's rows of x[rows, K] times its weights[N, K]^T, decoded in
// registers and multiplied in FP32 as LaunchRowsTimesDecoded, kMaxDecodedProductRows rows at
// a time.
cudaError_t LaunchGroupsTimesDecoded(DType type, const ProductGroups& groups, int64_t row_bytes,
                                     int64_t n, int64_t k, const float* x, float* y,
                                     cudaStream_t stream);

// The same over x_bf16[rows, K] (BF16 bits, K a multiple of 8) and weights of BF16 or a block
// type, as the tile product multiplies them (BF16 operands on the tensor cores, FP32 sums),
// kMaxTileProductRows rows at a time; K is not split.
cudaError_t LaunchGroupsTileProduct(DType type, const ProductGroups& groups, int64_t row_bytes,
                                    int64_t n, int64_t k, const uint16_t* x_bf16, int64_t rows,
                                    float* y, cudaStream_t stream);

// out[n] = x[n] as BF16 bits, rounded to nearest even (base/dtype.h F32ToBf16).
cudaError_t LaunchRoundToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// y[M, N] += bias[N] on every row.
cudaError_t LaunchAddBias(float* y, int64_t m, int64_t n, const float* bias, cudaStream_t stream);

}  // namespace polestar::cuda
