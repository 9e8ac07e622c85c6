// cuBLAS for the CUDA backend's products (products.cpp, attention.cpp): one handle per
// backend, created by the first product, and per op a binding to the calling thread's stream
// and to that stream's workspace (scratch.h).
#pragma once

#include <cublas_v2.h>

#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/scratch.h"

namespace polestar::cuda {

// Throws Error naming `call` unless `status` is CUBLAS_STATUS_SUCCESS.
void CheckBlas(cublasStatus_t status, const char* call);

// One op's cuBLAS calls: the backend's handle bound to Stream() and to that stream's
// workspace, held under the backend's mutex for this object's life (one handle serves every
// thread). The workspace is the stream's, because the main and the side stream's products may
// run at once and would share the handle's default one. The op's other scratch comes from
// scratch(), which this object holds too.
class BlasCalls {
 public:
  explicit BlasCalls(const CudaBackend& backend);
  cublasHandle_t handle() const { return handle_; }
  OpScratch& scratch() { return scratch_; }

 private:
  OpScratch scratch_;  // first: an op takes its stream's scratch, then the handle
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace polestar::cuda

#define CUBLAS_CHECK(call) ::polestar::cuda::CheckBlas((call), #call)
