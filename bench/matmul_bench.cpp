// MatMul on the decoding-step shapes of LLaDA-8B (K = 4096; N = 4096 for q/k/v/o, 12288 for
// gate/up): ours on BF16, F16 and F32 weights against OpenBLAS cblas_sgemm on an F32 copy,
// in the same run and on the same x. Prints a table, then one JSON object per measurement.
//
//   matmul_bench [--threads T] [--m 1,8,32,128] [--n 4096,12288] [--k 4096] [--reps R]
//                [--clock wall|cpu]
//
// Times are the best of R rounds after one warm-up. --clock cpu (one thread only) counts
// the process's CPU time instead of wall time: on a machine shared with other jobs it
// leaves out the time the benchmark spent descheduled. OpenBLAS picks its kernels by CPU model
// (printed as "openblas core"); OPENBLAS_CORETYPE=Haswell forces its AVX2 kernels.
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "base/parallel.h"
#include "ops/isa.h"
#include "ops/ops.h"

namespace polestar {
namespace {

struct Options {
  int threads = 0;  // 0: ThreadCount() (OMP_NUM_THREADS)
  std::vector<int64_t> m = {1, 8, 32, 128};
  std::vector<int64_t> n = {4096, 12288};
  int64_t k = 4096;
  int reps = 3;
  bool cpu_clock = false;
};

std::vector<int64_t> ParseList(const char* text) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoll(item));
  return values;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (value == nullptr) {
      std::fprintf(stderr,
                   "usage: matmul_bench [--threads T] [--m LIST] [--n LIST] [--k K] [--reps R] "
                   "[--clock wall|cpu]\n");
      std::exit(2);
    }
    if (flag == "--threads")
      options.threads = std::atoi(value);
    else if (flag == "--m")
      options.m = ParseList(value);
    else if (flag == "--n")
      options.n = ParseList(value);
    else if (flag == "--k")
      options.k = std::stoll(value);
    else if (flag == "--reps")
      options.reps = std::max(1, std::atoi(value));
    else if (flag == "--clock" &&
             (std::strcmp(value, "cpu") == 0 || std::strcmp(value, "wall") == 0))
      options.cpu_clock = std::strcmp(value, "cpu") == 0;
    else {
      std::fprintf(stderr, "matmul_bench: bad flag or value: %s %s\n", flag.c_str(), value);
      std::exit(2);
    }
    ++i;
  }
  return options;
}

double Now(bool cpu_clock) {
  if (!cpu_clock) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  timespec time;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time);
  return double(time.tv_sec) + 1e-9 * double(time.tv_nsec);
}

// Best time of each function over `reps` rounds after one warm-up (page in the weights,
// start the threads). Rounds visit the functions in turn, so load from other processes
// on a shared machine falls on all of them alike.
std::vector<double> BestSeconds(int reps, bool cpu_clock,
                                const std::vector<std::function<void()>>& fns) {
  std::vector<double> best(fns.size(), 1e30);
  for (const auto& fn : fns) fn();
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const double start = Now(cpu_clock);
      fns[i]();
      best[i] = std::min(best[i], Now(cpu_clock) - start);
    }
  }
  return best;
}

struct Weights {
  std::vector<float> f32;      // [N, K]
  std::vector<uint16_t> bf16;  // [N, K]
  std::vector<uint16_t> f16;   // [N, K]
};

Weights MakeWeights(int64_t n, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  Weights w;
  w.f32.resize(size_t(n * k));
  w.bf16.resize(w.f32.size());
  w.f16.resize(w.f32.size());
  for (size_t i = 0; i < w.f32.size(); ++i) {
    w.bf16[i] = F32ToBf16(normal(rng));
    w.f32[i] = Bf16ToF32(w.bf16[i]);  // the same values in every type
    w.f16[i] = F32ToF16(w.f32[i]);
  }
  return w;
}

WeightView View(DType type, const void* data, int64_t n, int64_t k) {
  return WeightView{type, static_cast<const uint8_t*>(data), n, k, RowBytes(type, k)};
}

float MaxRelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  float max_err = 0.0f, max_abs = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  return max_abs > 0 ? max_err / max_abs : max_err;
}

int Run(const Options& options) {
  if (options.threads > 0) SetThreadCount(options.threads);
  const int threads = ThreadCount();
  if (options.cpu_clock && threads != 1) {
    std::fprintf(stderr, "matmul_bench: --clock cpu needs one thread (--threads 1)\n");
    return 2;
  }
  openblas_set_num_threads(threads);
  std::printf("threads %d, %s clock, kernels %s, openblas core %s\n", threads,
              options.cpu_clock ? "cpu" : "wall", std::string(IsaName(BestIsa())).c_str(),
              openblas_get_corename());
  std::printf("%6s %6s %6s | %-39s | %s\n", "", "", "", "GFLOP/s",
              "speed ratio (OpenBLAS time / ours)");
  std::printf("%6s %6s %6s | %9s %9s %9s %9s | %9s %9s %9s\n", "M", "N", "K", "ours BF16",
              "ours F16", "ours F32", "BLAS F32", "BF16", "F16", "F32");
  std::vector<std::string> json;
  std::mt19937 rng(1234);
  const int64_t k = options.k;
  for (const int64_t n : options.n) {
    const Weights w = MakeWeights(n, k, rng);
    for (const int64_t m : options.m) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(size_t(m * k));  // [M, K]
      for (float& v : x) v = normal(rng);
      std::vector<float> y(size_t(m * n)), y_blas(size_t(m * n));  // [M, N]
      const double flops = 2.0 * double(m) * double(n) * double(k);

      struct Case {
        const char* name;
        WeightView view;
        double seconds = 0;
        float error = 0;
      };
      Case cases[] = {{"BF16", View(DType::kBF16, w.bf16.data(), n, k)},
                      {"F16", View(DType::kF16, w.f16.data(), n, k)},
                      {"F32", View(DType::kF32, w.f32.data(), n, k)}};
      std::vector<std::function<void()>> fns = {[&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x.data(),
                    int(k), w.f32.data(), int(k), 0.0f, y_blas.data(), int(n));
      }};
      for (const Case& c : cases) {
        fns.push_back([&] { CpuBackend::Host().MatMul(x.data(), m, c.view, y.data()); });
      }
      const std::vector<double> best = BestSeconds(options.reps, options.cpu_clock, fns);
      const double blas = best[0];
      for (size_t i = 0; i < 3; ++i) {
        cases[i].seconds = best[i + 1];
        fns[i + 1]();
        cases[i].error = MaxRelativeError(y, y_blas);
      }
      std::printf("%6lld %6lld %6lld | %9.1f %9.1f %9.1f %9.1f | %9.2f %9.2f %9.2f\n",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                  flops / cases[0].seconds * 1e-9, flops / cases[1].seconds * 1e-9,
                  flops / cases[2].seconds * 1e-9, flops / blas * 1e-9, blas / cases[0].seconds,
                  blas / cases[1].seconds, blas / cases[2].seconds);
      for (const Case& c : cases) {
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"matmul\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"threads\":%d,"
                      "\"weights\":\"%s\",\"ours_ms\":%.4f,\"ours_gflops\":%.2f,"
                      "\"openblas_ms\":%.4f,\"openblas_gflops\":%.2f,\"speed_ratio\":%.3f,"
                      "\"max_rel_error\":%.3g,\"openblas_core\":\"%s\",\"clock\":\"%s\"}",
                      static_cast<long long>(m), static_cast<long long>(n),
                      static_cast<long long>(k), threads, c.name, c.seconds * 1e3,
                      flops / c.seconds * 1e-9, blas * 1e3, flops / blas * 1e-9, blas / c.seconds,
                      c.error, openblas_get_corename(), options.cpu_clock ? "cpu" : "wall");
        json.push_back(line);
      }
    }
  }
  std::printf("(speed ratio above 1: ours is faster)\n");
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace
}  // namespace polestar

int main(int argc, char** argv) { return polestar::Run(polestar::ParseOptions(argc, argv)); }
