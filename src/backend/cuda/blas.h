// cuBLAS for the CUDA backend's products (products.cpp, attention.cpp): one handle per
// backend, created by the first product, and per op a binding to the calling thread's stream
// and to a workspace of the op's own.
#pragma once

#include <cublas_v2.h>

#include <mutex>

#include "backend/cuda/cuda_backend.h"

namespace polestar::cuda {

// Throws Error naming `call` unless `status` is CUBLAS_STATUS_SUCCESS.
void CheckBlas(cublasStatus_t status, const char* call);

// One op's cuBLAS calls: the backend's handle bound to Stream() and to a workspace from the
// pool on that stream, held under the backend's mutex for this object's life (one handle
// serves every thread). The workspace is the op's own, freed in stream order after its
// calls, because the main and the side stream's products may run at once and would share
// the handle's default one.
class BlasCalls {
 public:
  explicit BlasCalls(const CudaBackend& backend);
  cublasHandle_t handle() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_ = nullptr;
  Buffer workspace_;  // [kWorkspaceBytes + alignment] bytes
};

}  // namespace polestar::cuda

#define CUBLAS_CHECK(call) ::polestar::cuda::CheckBlas((call), #call)
