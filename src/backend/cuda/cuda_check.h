// What every file of the CUDA backend uses to call the runtime: each call's status checked,
// a failure turned into an Error naming the call (no crash, no silently wrong answer).
#pragma once

#include <cuda_runtime_api.h>

namespace polestar::cuda {

// Throws Error naming `call` unless `status` is cudaSuccess.
void CheckCuda(cudaError_t status, const char* call);

}  // namespace polestar::cuda

#define CUDA_CHECK(call) ::polestar::cuda::CheckCuda((call), #call)
