// MatMul on the decoding-step shapes of LLaDA-8B (K = 4096; N = 4096 for q/k/v/o, 12288 for
// gate/up): ours on BF16 (with the default reduced activation precision, which on a CPU with
// AVX512_BF16 rounds activations to BF16 for vdpbf16ps, and with fp32 activations), F16 and
// F32 weights, with each kernel set asked for, against
// OpenBLAS cblas_sgemm on an F32 copy, in the same run and on the same x. Prints the
// core's clock and FMA peaks, a table, then one JSON object per measurement.
//
//   matmul_bench [--threads T] [--m 1,8,32,128] [--n 4096,12288] [--k 4096] [--reps R]
//                [--clock wall|cpu] [--isa avx2,avx512]
//   matmul_bench --batched 1,2,4,8 [--threads T] [--reps R] [--clock wall|cpu] [--isa LIST]
//
// --batched: batched decoding steps instead (Backend::MatMulBatch, the rows of B sequences
// in one product) on the shapes of a ~1B LLaDA layer (N x K = 2048 x 2048 for q/k/v/o,
// 5632 x 2048 for gate/up, 2048 x 5632 for down), BF16, F16 and Q4_K weights, B sequences
// of 32 rows each and B sequences of 1, 2, 3, 1, 2, ... rows: GFLOP/s of the batched product
// next to the same segments multiplied one after another (what a batch would cost without
// MatMulBatch) and to the threads' FMA peak.
// --isa lists the kernel sets to compare (default: the best this CPU runs, ops/isa.h).
// The peaks are measured, not assumed: one thread running independent FMAs of each width
// (a CPU with one 512-bit FMA unit per core gets no more from 512 bits than from 256),
// and the clock from a chain of dependent multiplies, both on the thread's CPU time.
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

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/parallel.h"
#include "ops/isa.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace polestar {
namespace {

struct Options {
  int threads = 0;  // 0: ThreadCount() (OMP_NUM_THREADS)
  std::vector<int64_t> m = {1, 8, 32, 128};
  std::vector<int64_t> n = {4096, 12288};
  int64_t k = 4096;
  int reps = 3;
  bool cpu_clock = false;
  std::vector<Isa> isas = {BestIsa()};
  std::vector<int64_t> batches;  // --batched: sequences per step; empty: the M x N x K mode
};

std::vector<int64_t> ParseList(const char* text) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoll(item));
  return values;
}

std::vector<Isa> ParseIsas(const char* text) {
  std::vector<Isa> isas;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    bool known = false;
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (item == IsaName(isa)) isas.push_back(isa), known = true;
    }
    if (!known || !IsaSupported(isas.back())) {
      std::fprintf(stderr, "matmul_bench: unknown kernel set or not on this CPU: %s\n",
                   item.c_str());
      std::exit(2);
    }
  }
  return isas;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (value == nullptr) {
      std::fprintf(stderr,
                   "usage: matmul_bench [--threads T] [--m LIST] [--n LIST] [--k K] [--reps R] "
                   "[--clock wall|cpu] [--isa LIST] [--batched LIST]\n");
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
    else if (flag == "--isa")
      options.isas = ParseIsas(value);
    else if (flag == "--batched")
      options.batches = ParseList(value);
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

// This thread's CPU time: the peaks below must not count time spent descheduled.
double ThreadSeconds() {
  timespec time;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time);
  return double(time.tv_sec) + 1e-9 * double(time.tv_nsec);
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

// Cycles per second: 4 dependent 64-bit multiplies per iteration take 12 cycles (3 each on
// every x86 core since Nehalem; a chain of adds would not do, as recent Intel cores execute
// some adds of immediates at rename); the loop's own counter and branch run beside them.
double ClockGhz() {
  constexpr int64_t kIterations = 50'000'000;
  uint64_t value = 1;
  const double start = ThreadSeconds();
  for (int64_t i = 0; i < kIterations; ++i) {
    asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(value));
  }
  return 12.0 * double(kIterations) / (ThreadSeconds() - start) * 1e-9;
}

// GFLOP/s of one thread issuing only FMAs of `reg` (ymm or zmm) width, `lanes` floats:
// 12 independent chains (more than latency x ports) on zeroed registers (no slow operands).
// In assembly so that the compiler neither needs the instruction set's flags nor drops the
// loop; the caller checks that the CPU runs it.
#define POLESTAR_FMA_PEAK_LOOP(reg)                                                              \
  asm volatile(".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13\n\tvxorps %%" reg "\\r, %%" reg           \
               "\\r, %%" reg                                                                     \
               "\\r\n\t.endr\n\t"                                                                \
               "1:\n\t.irp r,0,1,2,3,4,5,6,7,8,9,10,11\n\t"                                      \
               "vfmadd231ps %%" reg "12, %%" reg "13, %%" reg                                    \
               "\\r\n\t.endr\n\t"                                                                \
               "dec %0\n\tjnz 1b"                                                                \
               : "+r"(iterations)                                                                \
               :                                                                                 \
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                 "xmm10", "xmm11", "xmm12", "xmm13", "cc")
double FmaPeak(Isa isa) {
  constexpr int64_t kIterations = 50'000'000;
  int64_t iterations = kIterations;
  const double start = ThreadSeconds();
  if (isa == Isa::kAvx512) {
    POLESTAR_FMA_PEAK_LOOP("zmm");
  } else {
    POLESTAR_FMA_PEAK_LOOP("ymm");
  }
  const double seconds = ThreadSeconds() - start;
  const int lanes = isa == Isa::kAvx512 ? 16 : 8;
  return 2.0 * lanes * 12 * double(kIterations) / seconds * 1e-9;
}
#undef POLESTAR_FMA_PEAK_LOOP

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

// Prints the machine line and returns one core's FMA peak (f32 GFLOP/s) per kernel set.
std::vector<double> PrintMachine(const Options& options, int threads) {
  std::printf("threads %d, %s clock, openblas core %s\n", threads,
              options.cpu_clock ? "cpu" : "wall", openblas_get_corename());
  std::printf("one core: clock %.2f GHz, FMA peak (f32 GFLOP/s)", ClockGhz());
  std::vector<double> peaks(3, 0.0);  // by Isa
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    peaks[size_t(isa)] = FmaPeak(isa);
    std::printf(" %s %.1f", std::string(IsaName(isa)).c_str(), peaks[size_t(isa)]);
  }
  std::printf("\n");
  return peaks;
}

// The --batched mode (see the top of the file).
int RunBatched(const Options& options, int threads) {
  const std::vector<double> core_peaks = PrintMachine(options, threads);
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"qkvo", 2048, 2048}, {"gate/up", 5632, 2048}, {"down", 2048, 5632}};
  std::printf("%-7s %5s %5s %5s %-6s %5s %4s | %9s %9s %6s | %8s\n", "kernels", "type", "N", "K",
              "rows", "B", "M", "batched", "one-by-1", "ratio", "peak");
  std::vector<std::string> json;
  std::mt19937 rng(1234);
  for (const Shape& shape : shapes) {
    const int64_t n = shape.n, k = shape.k;
    // The same values in every type: BF16-rounded normals, converted row by row.
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> values(size_t(n * k));  // [N, K]
    for (float& v : values) v = Bf16ToF32(F32ToBf16(normal(rng)));
    const DType types[] = {DType::kBF16, DType::kF16, DType::kQ4_K};
    std::vector<std::vector<uint8_t>> stored;  // [N, RowBytes] per type
    for (DType type : types) {
      stored.emplace_back(size_t(n * RowBytes(type, k)));
      for (int64_t r = 0; r < n; ++r) {
        QuantizeValues(type, values.data() + r * k, k,
                       stored.back().data() + r * RowBytes(type, k));
      }
    }
    for (Isa isa : options.isas) {
      const CpuBackend backend(isa);
      const double peak = core_peaks[size_t(isa)] * threads;
      for (size_t t = 0; t < std::size(types); ++t) {
        const WeightView w = View(types[t], stored[t].data(), n, k);
        for (const bool short_rows : {false, true}) {
          for (const int64_t b : options.batches) {
            std::vector<int64_t> segments;  // rows per sequence
            for (int64_t i = 0; i < b; ++i) segments.push_back(short_rows ? 1 + i % 3 : 32);
            int64_t m = 0;
            for (int64_t rows : segments) m += rows;
            std::vector<float> x(size_t(m * k));  // [M, K]
            for (float& v : x) v = normal(rng) * 50.0f;
            std::vector<float> y(size_t(m * n));  // [M, N]
            const std::vector<double> best =
                BestSeconds(options.reps, options.cpu_clock,
                            {[&] { backend.MatMulBatch(x.data(), segments, w, y.data()); },
                             [&] {
                               int64_t row = 0;
                               for (int64_t rows : segments) {
                                 backend.MatMul(x.data() + row * k, rows, w, y.data() + row * n);
                                 row += rows;
                               }
                             }});
            const double flops = 2.0 * double(m) * double(n) * double(k);
            const double batched = flops / best[0] * 1e-9, one_by_one = flops / best[1] * 1e-9;
            const std::string rows = short_rows ? "1-3" : "32";
            const std::string kernels(IsaName(isa));
            std::printf("%-7s %5s %5lld %5lld %-6s %5lld %4lld | %9.1f %9.1f %6.2f | %8.1f\n",
                        kernels.c_str(), std::string(DTypeName(types[t])).c_str(),
                        static_cast<long long>(n), static_cast<long long>(k), rows.c_str(),
                        static_cast<long long>(b), static_cast<long long>(m), batched, one_by_one,
                        batched / one_by_one, peak);
            char line[512];
            std::snprintf(line, sizeof line,
                          "{\"bench\":\"matmul_batch\",\"shape\":\"%s\",\"n\":%lld,\"k\":%lld,"
                          "\"weights\":\"%s\",\"kernels\":\"%s\",\"threads\":%d,"
                          "\"rows_per_sequence\":\"%s\",\"sequences\":%lld,\"m\":%lld,"
                          "\"batched_ms\":%.4f,\"batched_gflops\":%.2f,\"one_by_one_ms\":%.4f,"
                          "\"one_by_one_gflops\":%.2f,\"fma_peak_gflops\":%.1f,\"clock\":\"%s\"}",
                          shape.name, static_cast<long long>(n), static_cast<long long>(k),
                          std::string(DTypeName(types[t])).c_str(), kernels.c_str(), threads,
                          rows.c_str(), static_cast<long long>(b), static_cast<long long>(m),
                          best[0] * 1e3, batched, best[1] * 1e3, one_by_one, peak,
                          options.cpu_clock ? "cpu" : "wall");
            json.push_back(line);
          }
        }
      }
    }
  }
  std::printf(
      "(GFLOP/s; one-by-1: the same segments multiplied one after another; ratio: "
      "batched / one-by-1; peak: the threads' f32 FMA peak)\n");
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  return 0;
}

int Run(const Options& options) {
  if (options.threads > 0) SetThreadCount(options.threads);
  const int threads = ThreadCount();
  if (options.cpu_clock && threads != 1) {
    std::fprintf(stderr, "matmul_bench: --clock cpu needs one thread (--threads 1)\n");
    return 2;
  }
  openblas_set_num_threads(threads);
  if (!options.batches.empty()) return RunBatched(options, threads);
  PrintMachine(options, threads);
  std::printf("%6s %6s %6s |", "", "", "");
  for (Isa isa : options.isas) std::printf(" %-35s |", Cat("GFLOP/s ", IsaName(isa)).c_str());
  std::printf(" OpenBLAS\n%6s %6s %6s |", "M", "N", "K");
  for (size_t i = 0; i < options.isas.size(); ++i)
    std::printf(" %8s %8s %8s %8s |", "BF16", "BF16 f32", "F16", "F32");
  std::printf(" %8s\n", "F32");
  std::vector<CpuBackend> backends;  // per kernel set: reduced precision, fp32 activations
  for (Isa isa : options.isas) {
    backends.emplace_back(isa, ActivationPrecision::kReduced);
    backends.emplace_back(isa, ActivationPrecision::kF32);
  }
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
        const CpuBackend* backend;
        const char* name;
        WeightView view;
        double seconds = 0;
        float error = 0;
      };
      std::vector<Case> cases;  // kernel set by kernel set: BF16, BF16 f32, F16, F32
      for (size_t b = 0; b < backends.size(); b += 2) {
        const CpuBackend &reduced = backends[b], &exact = backends[b + 1];
        cases.push_back({&reduced, "BF16", View(DType::kBF16, w.bf16.data(), n, k)});
        cases.push_back({&exact, "BF16 f32", View(DType::kBF16, w.bf16.data(), n, k)});
        cases.push_back({&reduced, "F16", View(DType::kF16, w.f16.data(), n, k)});
        cases.push_back({&reduced, "F32", View(DType::kF32, w.f32.data(), n, k)});
      }
      std::vector<std::function<void()>> fns = {[&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x.data(),
                    int(k), w.f32.data(), int(k), 0.0f, y_blas.data(), int(n));
      }};
      for (const Case& c : cases) {
        fns.push_back([&] { c.backend->MatMul(x.data(), m, c.view, y.data()); });
      }
      const std::vector<double> best = BestSeconds(options.reps, options.cpu_clock, fns);
      const double blas = best[0];
      std::printf("%6lld %6lld %6lld |", static_cast<long long>(m), static_cast<long long>(n),
                  static_cast<long long>(k));
      for (size_t i = 0; i < cases.size(); ++i) {
        cases[i].seconds = best[i + 1];
        fns[i + 1]();
        cases[i].error = MaxRelativeError(y, y_blas);
        std::printf(" %8.1f%s", flops / cases[i].seconds * 1e-9, i % 4 == 3 ? " |" : "");
      }
      std::printf(" %8.1f\n", flops / blas * 1e-9);
      for (const Case& c : cases) {
        char line[512];
        std::snprintf(
            line, sizeof line,
            "{\"bench\":\"matmul\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"threads\":%d,"
            "\"kernels\":\"%s\",\"weights\":\"%s\",\"bf16_products\":%s,"
            "\"ours_ms\":%.4f,\"ours_gflops\":%.2f,\"openblas_ms\":%.4f,\"openblas_gflops\":%.2f,"
            "\"speed_ratio\":%.3f,"
            "\"max_rel_error\":%.3g,\"openblas_core\":\"%s\",\"clock\":\"%s\"}",
            static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
            threads, std::string(IsaName(c.backend->isa())).c_str(), c.name,
            c.backend->bf16_products() && std::string(c.name) == "BF16" ? "true" : "false",
            c.seconds * 1e3, flops / c.seconds * 1e-9, blas * 1e3, flops / blas * 1e-9,
            blas / c.seconds, c.error, openblas_get_corename(), options.cpu_clock ? "cpu" : "wall");
        json.push_back(line);
      }
    }
  }
  std::printf(
      "(BF16: reduced activation precision, vdpbf16ps where the CPU has AVX512_BF16, whose peak "
      "is twice the f32 FMA peak; BF16 f32: fp32 activations; speed_ratio: OpenBLAS time / "
      "ours, above 1: ours is faster)\n");
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace
}  // namespace polestar

int main(int argc, char** argv) { return polestar::Run(polestar::ParseOptions(argc, argv)); }
