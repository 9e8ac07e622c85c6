// The emulation's cuBLAS: the handle calls and the two products src/backend/cuda/ makes
// (cublasGemmEx, cublasGemmStridedBatchedEx), computed on the host from cuBLAS's documented
// column-major definition, independently of the CPU backend's kernels:
//   C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C m x n, element (i, j) of a
//   matrix at [i + j * ld], and C not read where beta is 0.
// Arguments are checked as cuBLAS does (CUBLAS_STATUS_INVALID_VALUE), and every matrix's extent,
// from its leading dimension and batch stride, must lie inside one device allocation. Inputs
// are rounded to TF32 where the compute type or the math mode lets cuBLAS do so, so an exact
// mode that leaves TF32 on misses its tolerances here as on the GPU.
#include <cublas_v2.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "cuda_emulation/emulation.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace cuda_emulation {
namespace {

size_t ElementBytes(cudaDataType type) {
  switch (type) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

// IEEE half to float, exactly.
float HalfToFloat(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa != 0 ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(float(mantissa + 1024), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

float Load(const void* data, cudaDataType type, int64_t index) {
  if (type == CUDA_R_32F) return static_cast<const float*>(data)[index];
  const uint16_t bits = static_cast<const uint16_t*>(data)[index];
  return type == CUDA_R_16BF ? std::bit_cast<float>(uint32_t(bits) << 16) : HalfToFloat(bits);
}

// Round to nearest even, NaN kept quiet.
uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return uint16_t((bits >> 16) | 0x40);
  return uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

void Store(void* data, cudaDataType type, int64_t index, float value) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(data)[index] = value;
  } else if (type == CUDA_R_16BF) {
    static_cast<uint16_t*>(data)[index] = FloatToBf16(value);
  } else {
    Die("a product storing half-precision output, which the backend never asks for");
  }
}

// TF32: 10 mantissa bits, rounded to nearest even.
float RoundToTf32(float value) {
  if (!std::isfinite(value)) return value;
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return std::bit_cast<float>((bits + 0xfff + ((bits >> 13) & 1)) & 0xffffe000u);
}

struct Matrix {
  const void* data;
  cudaDataType type;
  int64_t ld, stride;
  bool transposed;
};

// Bytes from a matrix's start to past its last element, over `batches`.
size_t Extent(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int batches, size_t element) {
  if (rows == 0 || cols == 0 || batches == 0) return 0;
  return size_t((int64_t(batches - 1) * stride + (cols - 1) * ld + rows) * int64_t(element));
}

cublasStatus_t Product(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                       int m, int n, int k, const void* alpha, const void* A, cudaDataType a_type,
                       int lda, long long stride_a, const void* B, cudaDataType b_type, int ldb,
                       long long stride_b, const void* beta, void* C, cudaDataType c_type, int ldc,
                       long long stride_c, int batches, cublasComputeType_t compute) {
  const std::lock_guard<std::mutex> lock(Lock());
  CountProduct();
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool a_t = transa != CUBLAS_OP_N, b_t = transb != CUBLAS_OP_N;
  if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
      (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0 || batches < 0 ||
      lda < std::max(1, a_t ? k : m) || ldb < std::max(1, b_t ? n : k) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (ElementBytes(a_type) == 0 || ElementBytes(b_type) == 0 || ElementBytes(c_type) == 0 ||
      a_type != b_type ||
      (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
       compute != CUBLAS_COMPUTE_32F_FAST_TF32)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0 || batches == 0) return CUBLAS_STATUS_SUCCESS;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  const struct {
    const char* name;
    const void* data;
    size_t bytes;
  } operands[] = {
      {"A", A, Extent(a_t ? k : m, a_t ? m : k, lda, stride_a, batches, ElementBytes(a_type))},
      {"B", B, Extent(b_t ? n : k, b_t ? k : n, ldb, stride_b, batches, ElementBytes(b_type))},
      {"C", C, Extent(m, n, ldc, stride_c, batches, ElementBytes(c_type))},
  };
  for (const auto& operand : operands) {
    if (operand.bytes > 0 && !IsDeviceRange(operand.data, operand.bytes)) {
      Die("a product's %s [%p, +%zu) (m %d n %d k %d, lda %d ldb %d ldc %d, %d batches) is not "
          "inside one device allocation",
          operand.name, operand.data, operand.bytes, m, n, k, lda, ldb, ldc, batches);
    }
  }
  const bool tf32 = a_type == CUDA_R_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
                    (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                     (handle->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH);
  Enqueue(handle->stream, [=] {
    // op(A) as [m][k] and op(B) as [n][k] floats, so each element of C is one contiguous dot.
    std::vector<float> a(size_t(m) * size_t(k)), b(size_t(n) * size_t(k));
    for (int batch = 0; batch < batches; ++batch) {
      for (int i = 0; i < m; ++i) {
        for (int p = 0; p < k; ++p) {
          const int64_t at = batch * stride_a + (a_t ? p + int64_t(i) * lda : i + int64_t(p) * lda);
          const float value = Load(A, a_type, at);
          a[size_t(i) * size_t(k) + size_t(p)] = tf32 ? RoundToTf32(value) : value;
        }
      }
      for (int j = 0; j < n; ++j) {
        for (int p = 0; p < k; ++p) {
          const int64_t at = batch * stride_b + (b_t ? j + int64_t(p) * ldb : p + int64_t(j) * ldb);
          const float value = Load(B, b_type, at);
          b[size_t(j) * size_t(k) + size_t(p)] = tf32 ? RoundToTf32(value) : value;
        }
      }
      for (int j = 0; j < n; ++j) {
        const float* b_row = b.data() + size_t(j) * size_t(k);
        for (int i = 0; i < m; ++i) {
          const float* a_row = a.data() + size_t(i) * size_t(k);
          float sum = 0.0f;
          for (int p = 0; p < k; ++p) sum += a_row[p] * b_row[p];
          const int64_t at = batch * stride_c + i + int64_t(j) * ldc;
          const float value = beta_value == 0.0f
                                  ? alpha_value * sum
                                  : alpha_value * sum + beta_value * Load(C, c_type, at);
          Store(C, c_type, at, value);
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace cuda_emulation

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const std::lock_guard<std::mutex> lock(cuda_emulation::Lock());
  if (bytes > 0 && !cuda_emulation::IsDeviceRange(workspace, bytes)) {
    cuda_emulation::Die("cublasSetWorkspace: [%p, +%zu) is not inside one device allocation",
                        workspace, bytes);
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType a_type, int lda, const void* B,
                            cudaDataType b_type, int ldb, const void* beta, void* C,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  return cuda_emulation::Product(handle, transa, transb, m, n, k, alpha, A, a_type, lda, 0, B,
                                 b_type, ldb, 0, beta, C, c_type, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType a_type,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType b_type, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType c_type, int ldc,
                                          long long stride_c, int batches,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
  return cuda_emulation::Product(handle, transa, transb, m, n, k, alpha, A, a_type, lda, stride_a,
                                 B, b_type, ldb, stride_b, beta, C, c_type, ldc, stride_c, batches,
                                 compute);
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    default:
      return "unknown error";
  }
}

}  // extern "C"
