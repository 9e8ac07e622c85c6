// The matrix products of the CUDA backend: MatMulBatch, MatMulAddBatch, MatMulGroups,
// RmsNormProducts, LmHeadBatch and Embed over weights of every stored type (kernels in
// products.cu).
//
// y[M, N] = x[M, K] · w[N, K]^T is cuBLAS's column-major y^T = op_T(w) · x^T, by weight type
// and activations():
//   F32                               FP32 GEMM, TF32 off (CUBLAS_COMPUTE_32F_PEDANTIC)
//   BF16, kReduced                    x rounded to BF16; BF16 x BF16 GEMM, FP32 accumulation
//   block types, kReduced             w dequantised to BF16, then as BF16 weights
//   F16; BF16 and block types, kF32   w widened to F32, then as F32 weights
// (F16 stays FP32 in both modes: F16 activations could overflow.) Products of few rows skip
// the decoded copy: with kReduced, at most kMaxTileProductRows rows over block types are one
// kernel that decodes the weights tile by tile into shared memory for the tensor cores (BF16
// operands, FP32 sums: the line above's numbers); otherwise at most kMaxDecodedProductRows
// rows over weights of the last two lines are one kernel that decodes the values in registers
// and multiplies them with FP32 activations (within both modes' bounds). Weights stay resident as
// stored; what is decoded goes to a scratch of at most kScratchBytes, one chunk of output columns
// at a time, so even LLaDA-8B's LM head (126464 x 4096) needs no more. The segments only count
// rows: the contract is not batch invariant, so all M rows go into one product. A product
// added to y (MatMulAddBatch) adds in its last pass (cuBLAS's beta = 1, the kernels' stores),
// and products of normed rows (RmsNormProducts, the LM head) read the BF16 rows the norm's
// kernel wrote beside its own: no pass of their own for either.
#include "backend/cuda/products.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/rowwise.h"
#include "backend/cuda/scratch.h"
#include "base/error.h"
#include "ops/quant.h"

namespace polestar {
namespace {

constexpr int64_t kScratchBytes = int64_t(64) << 20;  // decoded weight rows of one chunk

int64_t RowCount(RowSegments segments) {
  int64_t m = 0;
  for (const int64_t rows : segments) m += rows;
  return m;
}

// Fails (Error) unless the kernels can read `w` as the view describes it: a type they decode,
// rows of whole blocks, row_bytes at least a row's bytes, and F32/F16/BF16 aligned to their
// element (cuBLAS and the kernels load those whole).
void CheckWeights(const WeightView& w, const char* op) {
  const DType type = w.dtype;
  if (type != DType::kF32 && type != DType::kF16 && type != DType::kBF16 &&
      !IsBlockQuantized(type)) {
    Fail("cuda ", op, ": no kernel for weights of type ", DTypeName(type));
  }
  if (w.rows < 0 || w.cols < 0 || w.cols % BlockSize(type) != 0) {
    Fail("cuda ", op, ": ", DTypeName(type), " weights of ", w.rows, " rows of ", w.cols,
         " values (rows must hold whole blocks of ", BlockSize(type), ")");
  }
  if (w.rows > 0 && w.row_bytes < RowBytes(type, w.cols)) {
    Fail("cuda ", op, ": ", DTypeName(type), " rows of ", w.cols, " values are ",
         RowBytes(type, w.cols), " bytes, more than their stride of ", w.row_bytes);
  }
  const int64_t element = IsBlockQuantized(type) ? 1 : BlockBytes(type);
  if (reinterpret_cast<uintptr_t>(w.data) % element != 0 || w.row_bytes % element != 0) {
    Fail("cuda ", op, ": ", DTypeName(type), " weights not aligned to their ", element,
         "-byte elements (row stride ", w.row_bytes, ")");
  }
}

// y[M, ldy] columns [0, n) = x[M, K] · w[n, K]^T (w's rows ldw elements apart), accumulated
// in FP32 (`compute`); added to y's values when `accumulate` (beta = 1).
void Gemm(const cuda::BlasCalls& blas, int64_t n, int64_t m, int64_t k, const void* w,
          cudaDataType w_type, int64_t ldw, const void* x, cudaDataType x_type, float* y,
          int64_t ldy, cublasComputeType_t compute, bool accumulate) {
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                            w, w_type, int(ldw), x, x_type, int(k), &beta, y, CUDA_R_32F, int(ldy),
                            compute, CUBLAS_GEMM_DEFAULT));
}

// The product over weights decoded chunk by chunk: rows [n0, n0 + nc) of w as BF16 (`bf16`,
// times x_bf16[M, K]) or F32 (times x[M, K]) into scratch, then y's columns [n0, n0 + nc).
void DecodedProduct(const CudaBackend& backend, cuda::BlasCalls& blas, const float* x,
                    const uint16_t* x_bf16, int64_t m, const WeightView& w, bool bf16, float* y,
                    bool accumulate) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t element_bytes = bf16 ? 2 : 4;
  const int64_t chunk_rows = std::clamp<int64_t>(kScratchBytes / (k * element_bytes), 1, n);
  // [chunk_rows, K] BF16 or F32
  void* decoded =
      blas.scratch().Get(cuda::ScratchKind::kDecodedWeights, chunk_rows * k * element_bytes);
  for (int64_t n0 = 0; n0 < n; n0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - n0);
    // The stream orders this chunk's decoding after the previous chunk's product.
    CUDA_CHECK(cuda::LaunchDequantizeRows(w.dtype, w.data, w.row_bytes, k, nullptr, n0, rows,
                                          bf16 ? cuda::Decoded::kBf16 : cuda::Decoded::kF32,
                                          decoded, backend.Stream()));
    if (bf16) {
      Gemm(blas, rows, m, k, decoded, CUDA_R_16BF, k, x_bf16, CUDA_R_16BF, y + n0, n,
           CUBLAS_COMPUTE_32F, accumulate);
    } else {
      Gemm(blas, rows, m, k, decoded, CUDA_R_32F, k, x, CUDA_R_32F, y + n0, n,
           CUBLAS_COMPUTE_32F_PEDANTIC, accumulate);
    }
  }
}

}  // namespace

bool CudaBackend::ProductTakesBf16(const WeightView& w) const {
  return activations_ == ActivationPrecision::kReduced &&
         (w.dtype == DType::kBF16 || IsBlockQuantized(w.dtype));
}

void CudaBackend::Product(cuda::BlasCalls& blas, const float* x, const uint16_t* x_bf16, int64_t m,
                          const WeightView& w, float* y, const float* bias, bool accumulate) const {
  PS_CHECK(bias == nullptr || !accumulate);
  CheckWeights(w, accumulate ? "MatMulAddBatch" : "MatMulBatch");
  const int64_t n = w.rows, k = w.cols;
  if (m == 0 || n == 0) return;
  // cuBLAS takes int sizes and strides.
  const int64_t ldw = IsBlockQuantized(w.dtype) ? k : w.row_bytes / BlockBytes(w.dtype);
  if (std::max({m, n, k, ldw}) > INT_MAX) {
    Fail("cuda MatMulBatch: ", m, " x ", k, " times ", n, " x ", k, " (row stride ", ldw,
         ") exceeds cuBLAS's int sizes");
  }
  if (k == 0) {
    if (!accumulate) Zero(y, m * n);  // empty sums
    return;
  }
  // Every path below that multiplies BF16 rows (all of them where ProductTakesBf16) reads
  // x_bf16.
  const bool bf16 = ProductTakesBf16(w);
  if (bf16 && x_bf16 == nullptr) {
    // [M, K]
    auto* rounded = blas.scratch().Get<uint16_t>(cuda::ScratchKind::kBf16Activations, m * k);
    CUDA_CHECK(cuda::LaunchRoundToBf16(x, m * k, rounded, Stream()));
    x_bf16 = rounded;
  }
  const bool native = w.dtype == DType::kF32 || (w.dtype == DType::kBF16 && bf16);
  if (bf16 && IsBlockQuantized(w.dtype) && m <= cuda::kMaxTileProductRows) {
    // A cached step's rows over quantised weights: decoded tile by tile beside the tensor
    // cores, so the product reads the stored bytes once (no decoded copy).
    float* tiles = blas.scratch().Get<float>(cuda::ScratchKind::kTileProduct,
                                             cuda::TileProductScratchFloats(m, n, k));
    CUDA_CHECK(cuda::LaunchTileProduct(w.dtype, w.data, w.row_bytes, n, k, x_bf16, m, y, accumulate,
                                       tiles, Stream()));
  } else if (!native && m <= cuda::kMaxDecodedProductRows) {
    // A cached step's few rows over weights cuBLAS does not take as stored: decoded in
    // registers, so the product reads the stored bytes once (no decoded copy).
    CUDA_CHECK(cuda::LaunchRowsTimesDecoded(w.dtype, w.data, w.row_bytes, n, k, x, m, y, accumulate,
                                            Stream()));
  } else if (w.dtype == DType::kF32) {
    Gemm(blas, n, m, k, w.data, CUDA_R_32F, ldw, x, CUDA_R_32F, y, n, CUBLAS_COMPUTE_32F_PEDANTIC,
         accumulate);
  } else if (native) {
    Gemm(blas, n, m, k, w.data, CUDA_R_16BF, ldw, x_bf16, CUDA_R_16BF, y, n, CUBLAS_COMPUTE_32F,
         accumulate);
  } else {
    DecodedProduct(*this, blas, x, x_bf16, m, w, bf16, y, accumulate);
  }
  if (bias != nullptr) CUDA_CHECK(cuda::LaunchAddBias(y, m, n, bias, Stream()));
}

void CudaBackend::MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                              const float* bias) const {
  cuda::BlasCalls blas(*this);
  Product(blas, x, nullptr, RowCount(segments), w, y, bias, false);
}

void CudaBackend::MatMulAddBatch(const float* x, RowSegments segments, const WeightView& w,
                                 float* y) const {
  cuda::BlasCalls blas(*this);
  Product(blas, x, nullptr, RowCount(segments), w, y, nullptr, true);
}

void CudaBackend::RmsNormProducts(const float* x, RowSegments segments, int64_t c,
                                  const float* weight, float eps, float* normed,
                                  std::span<const NormedProduct> products) const {
  const int64_t m = RowCount(segments);
  if (m > INT_MAX) Fail("RmsNorm on the cuda backend: ", m, " rows exceed its ", INT_MAX);
  for (const NormedProduct& product : products) {
    if (product.w.cols != c) {
      Fail("cuda RmsNormProducts: weights of ", product.w.cols, " values a row over rows of ", c);
    }
  }
  cuda::BlasCalls blas(*this);
  const bool bf16 = std::ranges::any_of(
      products, [&](const NormedProduct& product) { return ProductTakesBf16(product.w); });
  // [M, C] the normed rows as BF16, which every product that multiplies BF16 rows reads
  uint16_t* rounded = bf16 && m > 0 && c > 0
                          ? blas.scratch().Get<uint16_t>(cuda::ScratchKind::kBf16Activations, m * c)
                          : nullptr;
  CUDA_CHECK(cuda::LaunchRmsNorm(x, m, c, weight, eps, normed, rounded, Stream()));
  for (const NormedProduct& product : products) {
    Product(blas, normed, rounded, m, product.w, product.y, product.bias, false);
  }
}

// The groups' sizes stay on the device (counts), so no host round trip orders the products:
// one kernel a product, whose blocks read their group's rows from counts. With kReduced,
// BF16 and block-type weights are multiplied as the tile product multiplies them (BF16
// operands on the tensor cores, FP32 sums); other weights, and every weight with kF32, as
// the few-row product (decoded in registers, FP32), a few rows at a time.
void CudaBackend::MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                               const int* counts, int64_t sequences, float* y) const {
  if (weights.empty() || n == 0) return;
  const WeightView& first = weights[0];
  for (const WeightView& w : weights) {
    CheckWeights(w, "MatMulGroups");
    if (w.dtype != first.dtype || w.rows != first.rows || w.cols != first.cols ||
        w.row_bytes != first.row_bytes) {
      Fail("cuda MatMulGroups: the groups' weights differ in type or shape (", DTypeName(w.dtype),
           " ", w.rows, " x ", w.cols, " beside ", DTypeName(first.dtype), " ", first.rows, " x ",
           first.cols, ")");
    }
  }
  const int64_t groups = int64_t(weights.size()), out = first.rows, k = first.cols;
  if (groups > cuda::kMaxProductGroups || sequences <= 0 || sequences * groups > INT_MAX ||
      n > INT_MAX) {
    Fail("cuda MatMulGroups: ", groups, " groups of ", sequences, " sequences and ", n,
         " rows exceed its grid");
  }
  if (out == 0) return;
  if (k == 0) {
    Zero(y, n * out);  // empty sums
    return;
  }
  std::vector<const uint8_t*> pointers(weights.size());  // [G]
  for (size_t g = 0; g < weights.size(); ++g) pointers[g] = weights[g].data;
  static_assert(sizeof(const uint8_t*) % sizeof(int) == 0);
  const int* staged = Stage({reinterpret_cast<const int*>(pointers.data()),
                             pointers.size() * (sizeof(const uint8_t*) / sizeof(int))});
  const cuda::ProductGroups product_groups{
      .weights = reinterpret_cast<const uint8_t* const*>(staged),
      .counts = counts,
      .sequences = int(sequences),
      .groups = int(groups)};
  const bool tiles = activations_ == ActivationPrecision::kReduced &&
                     (first.dtype == DType::kBF16 || IsBlockQuantized(first.dtype)) && k % 8 == 0;
  if (tiles) {
    cuda::OpScratch scratch(*this);
    // [n, K]
    auto* x_bf16 = scratch.Get<uint16_t>(cuda::ScratchKind::kBf16Activations, n * k);
    CUDA_CHECK(cuda::LaunchRoundToBf16(x, n * k, x_bf16, Stream()));
    CUDA_CHECK(cuda::LaunchGroupsTileProduct(first.dtype, product_groups, first.row_bytes, out, k,
                                             x_bf16, n, y, Stream()));
  } else {
    CUDA_CHECK(cuda::LaunchGroupsTimesDecoded(first.dtype, product_groups, first.row_bytes, out, k,
                                              x, y, Stream()));
  }
}

void CudaBackend::LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm,
                              float eps, const WeightView& lm_head, float* logits) const {
  if (lm_head.cols != c) {
    Fail("cuda LmHeadBatch: the LM head's rows hold ", lm_head.cols, " values, the hidden rows ",
         c);
  }
  const NormedProduct head[] = {{.w = lm_head, .y = logits}};
  RmsNormProducts(x, segments, c, final_norm, eps, x, head);
}

void CudaBackend::Embed(const WeightView& embedding, std::span<const int> tokens,
                        std::span<const int> rows, float* out) const {
  CheckWeights(embedding, "Embed");
  // Each output row's token, checked here: a kernel could not report a bad one.
  std::vector<int> ids(rows.size());  // [rows]
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || size_t(rows[i]) >= tokens.size()) {
      Fail("cuda Embed: row ", i, " names position ", rows[i], " of ", tokens.size(), " tokens");
    }
    const int token = tokens[size_t(rows[i])];
    if (token < 0 || token >= embedding.rows) {
      Fail("cuda Embed: token id ", token, " at position ", rows[i], " is outside the ",
           embedding.rows, " rows of the embedding");
    }
    ids[i] = token;
  }
  CUDA_CHECK(cuda::LaunchDequantizeRows(embedding.dtype, embedding.data, embedding.row_bytes,
                                        embedding.cols, Stage(ids), 0, int64_t(ids.size()),
                                        cuda::Decoded::kF32, out, Stream()));
}

}  // namespace polestar
