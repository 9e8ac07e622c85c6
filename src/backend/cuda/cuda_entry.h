// The CUDA backend's registration (backend/registry.cpp): "cuda", available where the CUDA
// runtime finds a device. Apart from cuda_backend.h so that the registry compiles without
// the toolkit's headers.
#pragma once

#include "backend/registry.h"

namespace polestar {

BackendEntry CudaBackendEntry();

}  // namespace polestar
