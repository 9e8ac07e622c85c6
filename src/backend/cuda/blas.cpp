#include "backend/cuda/blas.h"

#include <cstdint>

#include "base/error.h"

namespace polestar::cuda {
namespace {

// cuBLAS's workspace per op: NVIDIA's recommended size for Hopper, and its alignment.
constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;
constexpr int64_t kWorkspaceAlign = 256;

}  // namespace

void CheckBlas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  Fail("cuBLAS call ", call, " failed: ", cublasGetStatusString(status), " (",
       cublasGetStatusName(status), ")");
}

BlasCalls::BlasCalls(const CudaBackend& backend)
    : lock_(backend.blas_mutex_),
      workspace_(backend, kWorkspaceBytes + kWorkspaceAlign, ElementType::kU8,
                 Buffer::Init::kNone) {
  if (backend.blas_ == nullptr) {
    cublasHandle_t created = nullptr;
    CUBLAS_CHECK(cublasCreate(&created));
    // FP32 products choose no TF32 by their compute type; this keeps reductions in FP32 too.
    const cublasStatus_t status = cublasSetMathMode(
        created,
        cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (status != CUBLAS_STATUS_SUCCESS) cublasDestroy(created);
    CheckBlas(status, "cublasSetMathMode");
    backend.blas_ = created;
  }
  handle_ = backend.blas_;
  const auto address = reinterpret_cast<uintptr_t>(workspace_.As<uint8_t>());
  const uintptr_t aligned = (address + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  CUBLAS_CHECK(cublasSetStream(handle_, backend.Stream()));  // resets the workspace to cuBLAS's
  CUBLAS_CHECK(
      cublasSetWorkspace(handle_, reinterpret_cast<void*>(aligned), size_t(kWorkspaceBytes)));
}

}  // namespace polestar::cuda
