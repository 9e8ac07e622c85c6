#include "backend/cuda/blas.h"

#include <cstdint>

#include "base/error.h"

namespace polestar::cuda {
namespace {

// cuBLAS's workspace: NVIDIA's recommended size for Hopper.
constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;

}  // namespace

void CheckBlas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  Fail("cuBLAS call ", call, " failed: ", cublasGetStatusString(status), " (",
       cublasGetStatusName(status), ")");
}

BlasCalls::BlasCalls(const CudaBackend& backend) : scratch_(backend), lock_(backend.blas_mutex_) {
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
  void* workspace = scratch_.Get(ScratchKind::kBlasWorkspace, kWorkspaceBytes);
  CUBLAS_CHECK(cublasSetStream(handle_, backend.Stream()));  // resets the workspace to cuBLAS's
  CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace, size_t(kWorkspaceBytes)));
}

}  // namespace polestar::cuda
