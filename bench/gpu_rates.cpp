// The GPU's measured limits, which every GPU time in bench/RESULTS.md stands beside: copy
// bandwidth (device to device, and host to device and back from pinned and pageable memory)
// and cuBLAS's BF16 product rate (BF16 inputs, FP32 accumulation and output, as the CUDA
// backend's products) at LLaDA-8B's matrix shapes for the row counts of a cached step (32)
// and of a full pass (1156), plus one large square product for the card's peak.
//
//   gpu_rates [--json FILE] [--reps 10]
//
// Each figure is the median of --reps timed runs (CUDA events) after two warm-ups, on
// random data. Prints a table, and the JSON object to FILE when given.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

void Check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "gpu_rates: %s failed: %s\n", call, cudaGetErrorString(status));
  std::exit(1);
}
void Check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "gpu_rates: %s failed: %s\n", call, cublasGetStatusString(status));
  std::exit(1);
}
#define CHECK(call) Check((call), #call)

// The median milliseconds of `reps` runs of `work` on `stream`, after two warm-ups.
double MedianMs(int reps, cudaStream_t stream, const std::function<void()>& work) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) work();
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& t : ms) {
    CHECK(cudaEventRecord(start, stream));
    work();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[size_t(reps / 2)];
}

struct Copy {
  std::string what;
  double bytes;  // per run
  double ms;
  // Bytes over seconds; a device copy counts what it reads and what it writes.
  double GBps(double moved) const { return moved / (ms * 1e-3) / 1e9; }
};

struct Product {
  std::string what;
  long m, n, k;
  double ms;
  double Tflops() const { return 2.0 * double(m) * double(n) * double(k) / (ms * 1e-3) / 1e12; }
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: gpu_rates [--json FILE] [--reps N]\n");
      return 2;
    }
  }

  cudaDeviceProp props{};
  CHECK(cudaGetDeviceProperties(&props, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Copies: 1 GiB device to device, 256 MiB each way between host and device.
  std::vector<Copy> copies;
  {
    const size_t device_bytes = size_t(1) << 30, host_bytes = size_t(256) << 20;
    void *a, *b, *pinned;
    CHECK(cudaMalloc(&a, device_bytes));
    CHECK(cudaMalloc(&b, device_bytes));
    CHECK(cudaMemset(a, 1, device_bytes));
    CHECK(cudaMallocHost(&pinned, host_bytes));
    std::vector<unsigned char> pageable(host_bytes, 1);
    std::memset(pinned, 1, host_bytes);
    auto time = [&](const char* what, double bytes, const void* src, void* dst,
                    cudaMemcpyKind kind) {
      copies.push_back({what, bytes, MedianMs(reps, stream, [&] {
                          CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), kind, stream));
                        })});
    };
    time("device to device", double(device_bytes), a, b, cudaMemcpyDeviceToDevice);
    time("host to device, pinned", double(host_bytes), pinned, a, cudaMemcpyHostToDevice);
    time("device to host, pinned", double(host_bytes), a, pinned, cudaMemcpyDeviceToHost);
    time("host to device, pageable", double(host_bytes), pageable.data(), a,
         cudaMemcpyHostToDevice);
    time("device to host, pageable", double(host_bytes), a, pageable.data(),
         cudaMemcpyDeviceToHost);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFreeHost(pinned));
  }

  // Products y[M, N] = x[M, K] · w[N, K]^T, BF16 in, FP32 out and accumulation.
  std::vector<Product> products;
  {
    struct Shape {
      const char* what;
      long n, k;
    };
    const Shape shapes[] = {{"attention q/k/v/out 4096x4096", 4096, 4096},
                            {"MLP gate/up 12288x4096", 12288, 4096},
                            {"MLP down 4096x12288", 4096, 12288},
                            {"LM head 126464x4096", 126464, 4096}};
    const long max_m = 8192, max_elements = 126464L * 4096;
    void *w, *x, *y;  // w[max_elements] and x[max_m, 12288] BF16, y[max_m, 126464] FP32
    CHECK(cudaMalloc(&w, size_t(max_elements) * 2));
    CHECK(cudaMalloc(&x, size_t(max_m * 12288) * 2));
    CHECK(cudaMalloc(&y, size_t(max_m) * 126464 * 4));
    {  // random values in [-1, 1): zeros would run faster than real data
      std::vector<__nv_bfloat16> host(static_cast<size_t>(max_elements));
      std::mt19937 rng(1);
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      for (auto& v : host) v = __float2bfloat16(uniform(rng));
      CHECK(cudaMemcpy(w, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(x, host.data(), size_t(max_m * 12288) * 2, cudaMemcpyHostToDevice));
    }
    cublasHandle_t handle;
    CHECK(cublasCreate(&handle));
    CHECK(cublasSetStream(handle, stream));
    void* workspace;
    const size_t workspace_bytes = size_t(32) << 20;
    CHECK(cudaMalloc(&workspace, workspace_bytes));
    CHECK(cublasSetWorkspace(handle, workspace, workspace_bytes));
    auto time = [&](const std::string& what, long m, long n, long k) {
      const float one = 1.0f, zero = 0.0f;
      products.push_back({what, m, n, k, MedianMs(reps, stream, [&] {
                            CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m),
                                               int(k), &one, w, CUDA_R_16BF, int(k), x, CUDA_R_16BF,
                                               int(k), &zero, y, CUDA_R_32F, int(n),
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                          })});
    };
    for (const long m : {32L, 1156L}) {
      for (const Shape& s : shapes) time(s.what, m, s.n, s.k);
    }
    time("peak: square 8192", 8192, 8192, 8192);
    CHECK(cublasDestroy(handle));
    CHECK(cudaFree(workspace));
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }

  std::printf("%s, %d SMs, %.0f GiB, compute %d.%d\n", props.name, props.multiProcessorCount,
              double(props.totalGlobalMem) / (1 << 30), props.major, props.minor);
  std::printf("%-28s %10s %10s\n", "copy", "ms", "GB/s");
  for (const Copy& c : copies) {
    const double moved = c.what == "device to device" ? 2 * c.bytes : c.bytes;
    std::printf("%-28s %10.3f %10.1f\n", c.what.c_str(), c.ms, c.GBps(moved));
  }
  std::printf("%-32s %6s %10s %10s\n", "BF16 product", "M", "ms", "TFLOP/s");
  for (const Product& p : products)
    std::printf("%-32s %6ld %10.4f %10.1f\n", p.what.c_str(), p.m, p.ms, p.Tflops());

  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "gpu_rates: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(out, "{\"device\": \"%s\", \"sms\": %d, \"memory_bytes\": %zu, \"copies\": [",
                 props.name, props.multiProcessorCount, props.totalGlobalMem);
    for (size_t i = 0; i < copies.size(); ++i) {
      const Copy& c = copies[i];
      const double moved = c.what == "device to device" ? 2 * c.bytes : c.bytes;
      std::fprintf(out, "%s{\"what\": \"%s\", \"bytes\": %.0f, \"ms\": %.5f, \"GBps\": %.2f}",
                   i ? ", " : "", c.what.c_str(), c.bytes, c.ms, c.GBps(moved));
    }
    std::fprintf(out, "], \"products\": [");
    for (size_t i = 0; i < products.size(); ++i) {
      const Product& p = products[i];
      std::fprintf(out,
                   "%s{\"what\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"ms\": %.5f, "
                   "\"tflops\": %.2f}",
                   i ? ", " : "", p.what.c_str(), p.m, p.n, p.k, p.ms, p.Tflops());
    }
    std::fprintf(out, "]}\n");
    std::fclose(out);
  }
  return 0;
}
