// The CUDA emulation (tests/cuda_emulation/) against what a GPU does: the CUDA backend's tests
// on it mean something only if it runs kernels and queued work as CUDA defines them and makes
// the mistakes a GPU punishes go wrong here too. Built where POLESTAR_CUDA_EMULATION is on.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_emulation/device.h"

namespace {

class CudaEmulationDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Device memory of `n` ints and a pinned host copy of it.
struct Buffers {
  explicit Buffers(size_t n) : n(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), n * sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(int)), cudaSuccess);
    std::memset(pinned, 0, n * sizeof(int));
  }
  ~Buffers() {
    cudaFree(device);
    cudaFreeHost(pinned);
  }
  size_t n;
  int* device = nullptr;  // [n]
  int* pinned = nullptr;  // [n]
};

TEST(CudaEmulation, QueuedWorkRunsOnlyOnceTheHostWaitsForIt) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Buffers buffers(4);
  ASSERT_EQ(cudaMemsetAsync(buffers.device, 1, 4 * sizeof(int), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(buffers.pinned, buffers.device, 4 * sizeof(int), cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
  EXPECT_EQ(buffers.pinned[0], 0);  // a host reading before it waits sees nothing yet
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(buffers.pinned[3], 0x01010101);
  cudaStreamDestroy(stream);
}

TEST(CudaEmulation, AStreamSeesAnotherStreamsWritesOnlyThroughAnEvent) {
  cudaStream_t writer, reader;
  cudaEvent_t written;
  ASSERT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  Buffers buffers(1);
  ASSERT_EQ(cudaMemsetAsync(buffers.device, 0, sizeof(int), writer), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(buffers.pinned, buffers.device, sizeof(int), cudaMemcpyDeviceToHost, reader),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  EXPECT_NE(buffers.pinned[0], 0);  // fresh device memory's junk: the set has not run
  ASSERT_EQ(cudaEventRecord(written, writer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(reader, written, 0), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(buffers.pinned, buffers.device, sizeof(int), cudaMemcpyDeviceToHost, reader),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  EXPECT_EQ(buffers.pinned[0], 0);
  cudaEventDestroy(written);
  cudaStreamDestroy(writer);
  cudaStreamDestroy(reader);
}

// Reverses a block's values through shared memory, with or without the barrier between the
// writes and the reads.
void ReverseKernel(int* values, bool barrier) {
  __shared__ int staged[64];
  staged[threadIdx.x] = values[blockIdx.x * blockDim.x + threadIdx.x];
  if (barrier) __syncthreads();
  values[blockIdx.x * blockDim.x + threadIdx.x] = staged[blockDim.x - 1 - threadIdx.x];
}

std::vector<int> Reversed(bool barrier) {
  Buffers buffers(128);
  std::vector<int> host(128);
  for (int i = 0; i < 128; ++i) host[size_t(i)] = i;
  EXPECT_EQ(cudaMemcpy(buffers.device, host.data(), 128 * sizeof(int), cudaMemcpyHostToDevice),
            cudaSuccess);
  int* values = buffers.device;
  EXPECT_EQ(cuda_emulation::Launch(reinterpret_cast<const void*>(&ReverseKernel), dim3(2), dim3(64),
                                   0, nullptr, [=] { ReverseKernel(values, barrier); }),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), buffers.device, 128 * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

TEST(CudaEmulation, ABarrierOrdersTheThreadsOfABlockAndItsLackShows) {
  const std::vector<int> with_barrier = Reversed(true);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(with_barrier[size_t(i)], i / 64 * 64 + 63 - i % 64);
  EXPECT_NE(Reversed(false), with_barrier);  // reads of writes not yet made
}

TEST(CudaEmulation, AButterflyOfShufflesGivesEveryLaneTheWarpsSum) {
  Buffers buffers(32);
  int* out = buffers.device;
  ASSERT_EQ(cuda_emulation::Launch(nullptr, dim3(1), dim3(32), 0, nullptr,
                                   [=] {
                                     int value = int(threadIdx.x);
                                     for (int offset = 16; offset > 0; offset /= 2) {
                                       value += __shfl_xor_sync(0xffffffffu, value, offset);
                                     }
                                     out[threadIdx.x] = value;
                                   }),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(buffers.pinned, out, 32 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(buffers.pinned[lane], 31 * 32 / 2);
}

// One warp: d = a b + c for 16x16 BF16 a (row major) and b (column major, so b's element
// (r, col) sits at b[col * 16 + r]), c = 1, d stored row major to out; then each lane copies the
// element the next lane stored, with or without a warp barrier between.
std::vector<float> WarpProduct(bool barrier, std::vector<float>* seen) {
  std::vector<__nv_bfloat16> host(2 * 256);
  for (int i = 0; i < 256; ++i) {
    host[size_t(i)] = __float2bfloat16_rn(float(i % 7) - 3.0f);        // a
    host[size_t(256 + i)] = __float2bfloat16_rn(float(i % 5) * 0.5f);  // b
  }
  __nv_bfloat16* operands = nullptr;
  float* out = nullptr;  // [256] the product, then [32] what each lane saw
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&operands), host.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), (256 + 32) * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(operands, host.data(), host.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(out, 0, (256 + 32) * sizeof(float), nullptr), cudaSuccess);
  EXPECT_EQ(cuda_emulation::Launch(
                nullptr, dim3(1), dim3(32), 0, nullptr,
                [=] {
                  namespace wmma = nvcuda::wmma;
                  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                  wmma::fragment<wmma::accumulator, 16, 16, 16, float> d;
                  wmma::load_matrix_sync(a, operands, 16);
                  wmma::load_matrix_sync(b, operands + 256, 16);
                  wmma::fill_fragment(d, 1.0f);
                  wmma::mma_sync(d, a, b, d);
                  wmma::store_matrix_sync(out, d, 16, wmma::mem_row_major);
                  if (barrier) __syncwarp();
                  out[256 + threadIdx.x] = out[(threadIdx.x + 1) % 32];
                }),
            cudaSuccess);
  std::vector<float> result(256 + 32);
  EXPECT_EQ(cudaMemcpy(result.data(), out, result.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(operands);
  cudaFree(out);
  seen->assign(result.begin() + 256, result.end());
  result.resize(256);
  return result;
}

TEST(CudaEmulation, AWarpProductFollowsItsDefinitionAndItsStoreIsSeenAfterABarrier) {
  std::vector<float> seen;
  const std::vector<float> d = WarpProduct(true, &seen);
  for (int r = 0; r < 16; ++r) {
    for (int col = 0; col < 16; ++col) {
      float want = 1.0f;
      for (int k = 0; k < 16; ++k) {
        want += (float((r * 16 + k) % 7) - 3.0f) * (float((col * 16 + k) % 5) * 0.5f);
      }
      EXPECT_EQ(d[size_t(r * 16 + col)], want) << r << ", " << col;
    }
  }
  for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(seen[size_t(lane)], d[size_t((lane + 1) % 32)]);
  WarpProduct(false, &seen);
  EXPECT_EQ(seen[0], 0.0f);  // lane 1's element, read before lane 1 stored it
}

TEST_F(CudaEmulationDeathTest, AMisalignedWarpMatrixEndsTheProgram) {
  EXPECT_DEATH(
      {
        float* tile = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&tile), 300 * sizeof(float));
        cuda_emulation::Launch(nullptr, dim3(1), dim3(32), 0, nullptr, [=] {
          nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> d;
          nvcuda::wmma::load_matrix_sync(d, tile + 4, 16, nvcuda::wmma::mem_row_major);
        });
        cudaDeviceSynchronize();
      },
      "must be 32-byte aligned");
}

TEST_F(CudaEmulationDeathTest, ABarrierSomeThreadsNeverReachEndsTheProgram) {
  EXPECT_DEATH(
      {
        cuda_emulation::Launch(nullptr, dim3(1), dim3(64), 0, nullptr, [] {
          if (threadIdx.x < 32) __syncthreads();
        });
        cudaDeviceSynchronize();
      },
      "32 at __syncthreads, 0 at a warp barrier, 32 finished");
}

TEST_F(CudaEmulationDeathTest, HostCodeTouchingDeviceMemoryIsReported) {
#if !defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "device memory is fenced from the host only under AddressSanitizer";
#else
  Buffers buffers(1);
  volatile int* device = buffers.device;
  EXPECT_DEATH({ [[maybe_unused]] const int value = *device; }, "use-after-poison");
#endif
}

// A captured stream gathers its work into the graph: nothing runs at the capture, and each
// launch runs all of it again.
TEST(CudaEmulation, ACapturedGraphRunsItsWorkAtEveryLaunchAndNotBefore) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Buffers buffers(4);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemsetAsync(buffers.device, 1, 4 * sizeof(int), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(buffers.pinned, buffers.device, 4 * sizeof(int), cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the instance keeps the work
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(buffers.pinned[0], 0);  // the capture ran nothing
  for (int launch = 0; launch < 2; ++launch) {
    std::memset(buffers.pinned, 0, 4 * sizeof(int));
    ASSERT_EQ(cudaMemsetAsync(buffers.device, 0, 4 * sizeof(int), stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(buffers.pinned[3], 0x01010101) << "launch " << launch;
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  cudaStreamDestroy(stream);
}

// A capture cannot hold a wait for the stream or a copy with pageable memory at an end: the
// call fails, and so does the capture's end, as on a GPU.
TEST(CudaEmulation, ACallACaptureCannotHoldFailsTheCapture) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Buffers buffers(4);
  std::vector<int> pageable(4, 7);
  auto refused = [&](auto call) {
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
    EXPECT_EQ(call(), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&pageable);  // overwritten
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    cudaGetLastError();
  };
  refused([&] { return cudaStreamSynchronize(stream); });
  refused([&] {
    return cudaMemcpyAsync(buffers.device, pageable.data(), 4 * sizeof(int), cudaMemcpyHostToDevice,
                           stream);
  });
  refused([&] {
    return cudaMemcpyAsync(pageable.data(), buffers.device, 4 * sizeof(int), cudaMemcpyDeviceToHost,
                           stream);
  });
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeRelaxed),
            cudaErrorStreamCaptureUnsupported);  // the legacy stream is never captured
  cudaGraph_t none = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &none), cudaErrorIllegalState);  // no capture begun
  cudaGetLastError();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the stream works on
  cudaStreamDestroy(stream);
}

TEST(CudaEmulation, LaunchesAreCheckedAsOnAGpu) {
  const auto nothing = [] {};
  EXPECT_EQ(cuda_emulation::Launch(nullptr, dim3(0), dim3(32), 0, nullptr, nothing),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cuda_emulation::Launch(nullptr, dim3(1), dim3(2048), 0, nullptr, nothing),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cuda_emulation::Launch(nullptr, dim3(1), dim3(32), 49 << 10, nullptr, nothing),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
}

TEST(CudaEmulation, CopiesAndAllocationsAreCheckedAsOnAGpu) {
  Buffers buffers(4);
  int host[4] = {};
  // Kinds that disagree with where the pointers lie, and a copy past an allocation's end.
  EXPECT_EQ(cudaMemcpy(host, buffers.device, sizeof host, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(buffers.device, host, 8 * sizeof(int), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, size_t(64) << 30), cudaErrorMemoryAllocation);
  cudaGetLastError();
}

// C = A B with A 2 x 3 and B 3 x 2, column-major as cuBLAS defines them: A(i, p) at [i + 2p].
TEST(CudaEmulation, ProductsFollowCublasColumnMajorDefinition) {
  const float a[6] = {1, 4, 2, 5, 3, 6};             // [[1 2 3], [4 5 6]]
  const float b_transposed[6] = {1, 4, 2, 5, 3, 6};  // B^T, so B = [[1 4], [2 5], [3 6]]
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 16 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, a, sizeof a, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device + 6, b_transposed, sizeof b_transposed, cudaMemcpyHostToDevice),
            cudaSuccess);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const float one = 1, zero = 0;
  // op(B) = (B^T)^T, stored 2 x 3 with ldb 2.
  ASSERT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, &one, device, CUDA_R_32F, 2,
                         device + 6, CUDA_R_32F, 2, &zero, device + 12, CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  float c[4];
  ASSERT_EQ(cudaMemcpy(c, device + 12, sizeof c, cudaMemcpyDeviceToHost), cudaSuccess);
  // [[1 2 3], [4 5 6]] [[1 4], [2 5], [3 6]] = [[14 32], [32 77]], column-major.
  EXPECT_EQ(c[0], 14);
  EXPECT_EQ(c[1], 32);
  EXPECT_EQ(c[2], 32);
  EXPECT_EQ(c[3], 77);
  // A leading dimension below the rows it must span.
  EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, &one, device, CUDA_R_32F, 1,
                         device + 6, CUDA_R_32F, 2, &zero, device + 12, CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasDestroy(handle);
  cudaFree(device);
}

// C (2 x 2 at device + 2) reaches two floats past the 4-float allocation.
void ProductPastItsAllocation() {
  float* device = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&device), 4 * sizeof(float));
  cublasHandle_t handle;
  cublasCreate(&handle);
  const float one = 1, zero = 0;
  cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, device, CUDA_R_32F, 2, device,
               CUDA_R_32F, 2, &zero, device + 2, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_PEDANTIC,
               CUBLAS_GEMM_DEFAULT);
}

TEST_F(CudaEmulationDeathTest, AProductReachingPastItsAllocationEndsTheProgram) {
  EXPECT_DEATH(ProductPastItsAllocation(), "product's C .* is not inside one device allocation");
}

}  // namespace
