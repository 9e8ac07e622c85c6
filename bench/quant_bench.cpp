// Quantised weights, side by side: matmul GFLOP/s per weight type (threaded dispatch, and
// one thread on the AVX2 kernel and on its scalar twin); the integer kernels (activations
// rounded to 8 bits, ops/quant.h) on one thread, scalar / AVX2 / AVX-512 VNNI, at decode
// shapes next to QuantMatMul and the F16 path, against this CPU's FMA peak;
// then one dual-cache decode step
// (a block of query rows against a full cache) of a ~1B LLaDA-shaped random model stored as
// BF16, Q8_0 and Q4_K_M GGUF files, loaded through Model::Load (memory-mapped), with the
// resident memory it takes next to the file size.
//
//   quant_bench [--layers 16] [--context 512] [--block 32] [--steps 3] [--json out.json]
//               [--skip-matmul] [--skip-kernels] [--skip-decode]
//
// Prints a table and writes the numbers as JSON.
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/parallel.h"
#include "io/gguf.h"
#include "model/forward.h"
#include "ops/isa.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {
namespace {

namespace fs = std::filesystem;

// splitmix64: fast enough to fill a gigabyte of weights in a second or two.
struct Random {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform(float scale) { return float(int32_t(Next() >> 32)) * (scale / 2147483648.0f); }
};

void PutF16(uint8_t* p, float value) {
  const uint16_t bits = F32ToF16(value);
  std::memcpy(p, &bits, 2);
}

// Random weights of `count` values in `type`: random levels, with scales chosen so that the
// values are about +-0.03 (no denormals, no overflow).
std::vector<uint8_t> RandomWeights(DType type, int64_t count, uint64_t seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(RowBytes(type, count)));
  Random rng{seed};
  if (type == DType::kBF16 || type == DType::kF16 || type == DType::kF32) {
    for (int64_t i = 0; i < count; ++i) {
      const float v = rng.Uniform(0.03f);
      if (type != DType::kF32) {
        const uint16_t bits = type == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(&bytes[2 * i], &bits, 2);
      } else {
        std::memcpy(&bytes[4 * i], &v, 4);
      }
    }
    return bytes;
  }
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(&bytes[i], &r, 8);
  }
  const int64_t blocks = count / BlockSize(type);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = bytes.data() + b * BlockBytes(type);
    switch (type) {
      case DType::kQ8_0:
        PutF16(block, 0.03f / 127);
        break;
      case DType::kQ4_0:
        PutF16(block, 0.03f / 8);
        break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        PutF16(block, 0.03f / 15 / 32);
        PutF16(block + 2, 0.015f / 32);
        break;
      case DType::kQ6_K:
        PutF16(block + 208, 0.03f / 32 / 64);
        break;
      default:
        break;
    }
  }
  return bytes;
}

double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Best wall-clock and best CPU time of one call over repeated calls filling `min_seconds`.
// The machine may be shared: the fastest run is the least disturbed one, and CPU time (of
// the calling thread for single-threaded calls, of the process otherwise, waits included)
// measures the work itself however busy the machine is.
struct Timing {
  double wall = 1e30, cpu = 1e30;
};

Timing Measure(const std::function<void()>& fn, double min_seconds, clockid_t cpu_clock,
               int min_runs = 1) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up
  Timing best;
  double total = 0;
  int runs = 0;
  do {
    const auto start = Clock::now();
    const double cpu_start = CpuSeconds(cpu_clock);
    fn();
    const double cpu = CpuSeconds(cpu_clock) - cpu_start;
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    best.wall = std::min(best.wall, wall);
    best.cpu = std::min(best.cpu, cpu);
    total += wall;
    ++runs;
  } while (total < min_seconds || runs < min_runs);
  return best;
}

int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

nlohmann::json MatMulBench(double min_seconds) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 5632, 2048}, {32, 5632, 2048}, {32, 2048, 5632}};
  const DType types[] = {DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  const int threads = ThreadCount();
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "\nmatmul y[M,N] = x[M,K] w[N,K]^T in GFLOP/s: %d threads by wall clock; one thread\n"
      "(dispatched kernel, and the scalar reference) by its CPU time\n",
      threads);
  std::printf("%-6s %4s %6s %6s %12s %12s %14s %14s\n", "type", "M", "N", "K", "threaded",
              "1 thread", "weight GB/s", "1 thr scalar");
  for (const Shape& s : shapes) {
    Random rng{uint64_t(s.m * 7 + s.k)};
    std::vector<float> x(static_cast<size_t>(s.m * s.k));  // [M, K]
    for (float& v : x) v = rng.Uniform(1.0f);
    std::vector<float> y(static_cast<size_t>(s.m * s.n));  // [M, N]
    for (DType type : types) {
      const std::vector<uint8_t> bytes = RandomWeights(type, s.n * s.k, 11);
      const WeightView w{type, bytes.data(), s.n, s.k, RowBytes(type, s.k)};
      const double flops = 2.0 * s.m * s.n * s.k;
      auto matmul = [&] { CpuBackend::Host().MatMul(x.data(), s.m, w, y.data()); };
      const Timing threaded = Measure(matmul, min_seconds, CLOCK_PROCESS_CPUTIME_ID);
      SetThreadCount(1);
      const Timing single = Measure(matmul, min_seconds, CLOCK_THREAD_CPUTIME_ID);
      SetThreadCount(threads);
      Timing scalar;
      if (s.k == 2048) {
        scalar = Measure([&] { reference::MatMulColumns(x.data(), s.m, w, 0, s.n, y.data(), s.n); },
                         min_seconds / 4, CLOCK_THREAD_CPUTIME_ID);
      }
      const double gflops = flops / threaded.wall * 1e-9;
      const double gflops_1 = flops / single.cpu * 1e-9;
      const double gbps_1 = double(bytes.size()) / single.cpu * 1e-9;
      std::printf("%-6s %4lld %6lld %6lld %12.1f %12.1f %14.2f",
                  std::string(DTypeName(type)).c_str(), (long long)s.m, (long long)s.n,
                  (long long)s.k, gflops, gflops_1, gbps_1);
      nlohmann::json row = {{"type", DTypeName(type)},
                            {"m", s.m},
                            {"n", s.n},
                            {"k", s.k},
                            {"threads", threads},
                            {"gflops_wall", gflops},
                            {"gflops_1thread_cpu", gflops_1},
                            {"weight_gbps_1thread_cpu", gbps_1}};
      if (scalar.cpu < 1e30) {
        std::printf(" %14.2f", flops / scalar.cpu * 1e-9);
        row["gflops_1thread_scalar_cpu"] = flops / scalar.cpu * 1e-9;
      }
      std::printf("\n");
      rows.push_back(row);
    }
  }
  return rows;
}

// Core clock in GHz: a chain of dependent integer adds retires one add per cycle, whatever
// else the loop does, so cycles = adds; timed on this thread's CPU clock.
double MeasureClockGhz() {
  constexpr int64_t kIterations = 200'000'000 / 8;
  uint64_t value = 0;
  const double start = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  for (int64_t i = 0; i < kIterations; ++i) {
    for (int a = 0; a < 8; ++a) {
      value += uint64_t(i);
      asm volatile("" : "+r"(value));  // keeps the adds, in order, in one register
    }
  }
  const double seconds = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - start;
  asm volatile("" ::"r"(value));
  return double(kIterations) * 8 / seconds * 1e-9;
}

// The integer kernels on one thread (each call quantises x, then runs every column, as
// QuantMatMul's work would be), next to CpuBackend::MatMul on the same weights with fp32
// activations (ActivationPrecision::kF32) and on F16 weights at the same shape.
nlohmann::json KernelBench(double min_seconds) {
  const int threads = ThreadCount();
  SetThreadCount(1);
  const double ghz = MeasureClockGhz();
  // Two FMA units, each 8 (AVX2) or 16 (AVX-512) fp32 lanes, two FLOP per FMA.
  const double avx2_peak = 32 * ghz, avx512_peak = 64 * ghz;
  std::printf(
      "\nkernels on one thread, GFLOP/s by CPU time; clock %.2f GHz (dependent-add chain), "
      "fp32 FMA peak %.0f (AVX2: 2 x 8 lanes x 2 x clock), %.0f (AVX-512)\n",
      ghz, avx2_peak, avx512_peak);
  std::printf(
      "int8 = activations rounded to 8 bits (quantisation included); f32 act = "
      "CpuBackend::MatMul on the quantised weights with fp32 activations\n");
  std::printf("%-6s %5s %5s %4s %11s %10s %11s %11s %8s %11s\n", "type", "N", "K", "M",
              "int8 scalar", "int8 avx2", "int8 avx512", "f32 act", "F16", "best / F16");
  nlohmann::json out = {{"clock_ghz", ghz},
                        {"fma_peak_gflops_avx2", avx2_peak},
                        {"fma_peak_gflops_avx512", avx512_peak},
                        {"rows", nlohmann::json::array()}};
  const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  const int64_t row_counts[] = {1, 8, 32, 96, 256};
  const CpuBackend& backend = CpuBackend::Host();
  const CpuBackend f32_activations(BestIsa(), ActivationPrecision::kF32);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {5632, 2048}}) {
    Random rng{uint64_t(n + k)};
    std::vector<float> x(static_cast<size_t>(256 * k));  // [256, K]
    for (float& v : x) v = rng.Uniform(1.0f);
    std::vector<float> y(static_cast<size_t>(256 * n));  // [256, N]
    const std::vector<uint8_t> f16_bytes = RandomWeights(DType::kF16, n * k, 3);
    const WeightView f16{DType::kF16, f16_bytes.data(), n, k, RowBytes(DType::kF16, k)};
    std::vector<double> f16_gflops;
    for (int64_t m : row_counts) {
      const double flops = 2.0 * double(m * n * k);
      f16_gflops.push_back(flops /
                           Measure([&] { backend.MatMul(x.data(), m, f16, y.data()); }, min_seconds,
                                   CLOCK_THREAD_CPUTIME_ID)
                               .cpu *
                           1e-9);
    }
    for (DType type : types) {
      const std::vector<uint8_t> bytes = RandomWeights(type, n * k, 11);
      const WeightView w{type, bytes.data(), n, k, RowBytes(type, k)};
      for (size_t mi = 0; mi < std::size(row_counts); ++mi) {
        const int64_t m = row_counts[mi];
        const double flops = 2.0 * double(m * n * k);
        QuantizedActivations xq;
        auto int8 = [&](Isa isa) {
          if (!IsaSupported(isa)) return 0.0;
          if (isa == Isa::kScalar && m > 8) return 0.0;  // minutes per point: skipped
          const Timing t = Measure(
              [&] {
                if (isa == Isa::kScalar) {
                  QuantizeActivations(x.data(), m, k, ActivationBlock(type), &xq);
                  QuantDotColumns(xq, w, 0, n, y.data(), n);
                } else {
                  avx2::QuantizeActivations(x.data(), m, k, ActivationBlock(type), &xq);
                  (isa == Isa::kAvx512 ? avx512::QuantDotColumns : avx2::QuantDotColumns)(
                      xq, w, 0, n, y.data(), n);
                }
              },
              isa == Isa::kScalar ? 0.0 : min_seconds, CLOCK_THREAD_CPUTIME_ID);
          return flops / t.cpu * 1e-9;
        };
        const double scalar = int8(Isa::kScalar), avx2 = int8(Isa::kAvx2),
                     avx512 = int8(Isa::kAvx512);
        const double f32_act = flops /
                               Measure([&] { f32_activations.MatMul(x.data(), m, w, y.data()); },
                                       min_seconds, CLOCK_THREAD_CPUTIME_ID)
                                   .cpu *
                               1e-9;
        const double best = std::max(avx2, avx512);
        std::printf("%-6s %5lld %5lld %4lld %11.2f %10.1f %11.1f %11.1f %8.1f %11.2f\n",
                    std::string(DTypeName(type)).c_str(), (long long)n, (long long)k, (long long)m,
                    scalar, avx2, avx512, f32_act, f16_gflops[mi], best / f16_gflops[mi]);
        out["rows"].push_back({{"type", DTypeName(type)},
                               {"n", n},
                               {"k", k},
                               {"m", m},
                               {"gflops_int8_scalar", scalar},
                               {"gflops_int8_avx2", avx2},
                               {"gflops_int8_avx512", avx512},
                               {"gflops_f32_activations", f32_act},
                               {"gflops_f16", f16_gflops[mi]}});
      }
    }
  }
  SetThreadCount(threads);
  return out;
}

struct ModelShape {
  int width = 2048, heads = 16, layers = 16, ffn = 5632, vocab = 32000, context = 512;
};

// A LLaDA-shaped GGUF of random weights; `type_for` picks each matrix's type.
void WriteRandomModel(const std::string& path, const ModelShape& s,
                      const std::function<DType(const std::string&)>& type_for) {
  GgufWriter writer;
  GgufMetadata& m = writer.metadata();
  m.Add("general.architecture", GgufValue::String("llada"));
  m.Add("llada.context_length", GgufValue::U32(uint32_t(s.context)));
  m.Add("llada.embedding_length", GgufValue::U32(uint32_t(s.width)));
  m.Add("llada.block_count", GgufValue::U32(uint32_t(s.layers)));
  m.Add("llada.feed_forward_length", GgufValue::U32(uint32_t(s.ffn)));
  m.Add("llada.attention.head_count", GgufValue::U32(uint32_t(s.heads)));
  m.Add("llada.attention.head_count_kv", GgufValue::U32(uint32_t(s.heads)));
  m.Add("llada.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5f));
  m.Add("llada.rope.freq_base", GgufValue::F32(500000.0f));
  m.Add("tokenizer.ggml.mask_token_id", GgufValue::U32(uint32_t(s.vocab - 2)));
  m.Add("tokenizer.ggml.eos_token_id", GgufValue::U32(uint32_t(s.vocab - 1)));
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> tensors = {{"token_embd.weight", {s.vocab, s.width}}};
  for (int l = 0; l < s.layers; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    for (const char* leaf : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      tensors.push_back({blk + leaf + ".weight", {s.width, s.width}});
    }
    tensors.push_back({blk + "ffn_gate.weight", {s.ffn, s.width}});
    tensors.push_back({blk + "ffn_up.weight", {s.ffn, s.width}});
    tensors.push_back({blk + "ffn_down.weight", {s.width, s.ffn}});
    tensors.push_back({blk + "attn_norm.weight", {s.width}});
    tensors.push_back({blk + "ffn_norm.weight", {s.width}});
  }
  tensors.push_back({"output_norm.weight", {s.width}});
  tensors.push_back({"output.weight", {s.vocab, s.width}});
  for (const Tensor& t : tensors) {
    writer.AddTensor(t.name, t.shape.size() == 1 ? DType::kF32 : type_for(t.name), t.shape);
  }
  writer.Open(path);
  uint64_t seed = 1;
  for (const Tensor& t : tensors) {
    if (t.shape.size() == 1) {
      const std::vector<float> ones(static_cast<size_t>(t.shape[0]), 1.0f);
      writer.WriteTensorData(reinterpret_cast<const uint8_t*>(ones.data()), ones.size() * 4);
    } else {
      const std::vector<uint8_t> bytes =
          RandomWeights(type_for(t.name), t.shape[0] * t.shape[1], seed++);
      writer.WriteTensorData(bytes.data(), bytes.size());
    }
  }
  writer.Close();
}

nlohmann::json DecodeBench(const ModelShape& shape, int block, int steps) {
  const std::string dir =
      (fs::temp_directory_path() / ("polestar-quant-bench-" + std::to_string(getpid()))).string();
  fs::create_directories(dir);
  auto ends_with = [](const std::string& s, const char* suffix) {
    return s.size() >= std::strlen(suffix) &&
           s.compare(s.size() - std::strlen(suffix), std::string::npos, suffix) == 0;
  };
  const struct {
    const char* name;
    std::function<DType(const std::string&)> type_for;
  } variants[] = {
      {"BF16", [](const std::string&) { return DType::kBF16; }},
      {"Q8_0", [](const std::string&) { return DType::kQ8_0; }},
      {"Q4_K_M",
       [&](const std::string& name) {
         const bool sensitive = name == "output.weight" || ends_with(name, "attn_v.weight") ||
                                ends_with(name, "ffn_down.weight");
         return sensitive ? DType::kQ6_K : DType::kQ4_K;
       }},
  };
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "\ndual-cache decode step: %d query rows against %d cached rows, logits for the block\n",
      block, shape.context);
  std::printf("%-7s %10s %10s %10s %10s %12s %12s %10s %12s\n", "type", "params", "file MB",
              "wall ms", "CPU ms", "GFLOP/s", "GFLOP/CPU-s", "RSS MB", "RSS-file MB");
  for (const auto& variant : variants) {
    const std::string path = dir + "/" + variant.name + ".gguf";
    WriteRandomModel(path, shape, variant.type_for);
    const int64_t file_bytes = int64_t(fs::file_size(path));
    const int64_t rss_before = ResidentBytes();
    Timing timing;
    int64_t params = 0, rss = 0;
    {
      auto model = Model::Load(path);
      const ModelConfig& c = model->config();
      params = model->ParameterCount();
      KvCache cache = MakeCache(*model, shape.context, false);
      Random rng{5};
      for (int l = 0; l < c.layers; ++l) {  // a cache as a prefill would leave it
        for (int64_t i = 0; i < int64_t(shape.context) * cache.kv_width(); ++i) {
          cache.keys(l)[i] = rng.Uniform(1.0f);
          cache.values(l)[i] = rng.Uniform(1.0f);
        }
      }
      std::vector<int> canvas(static_cast<size_t>(shape.context));
      for (int& token : canvas) token = int(rng.Next() % uint64_t(c.vocab - 2));
      StepPlan plan;
      for (int i = shape.context - block; i < shape.context; ++i) plan.input_rows.push_back(i);
      plan.logit_rows = plan.input_rows;
      Forward forward(*model, cache);
      // The warm-up run pages in every weight.
      timing = Measure([&] { forward.Run(canvas, plan); }, 0.0, CLOCK_PROCESS_CPUTIME_ID, steps);
      rss = ResidentBytes() - rss_before - cache.Bytes();
    }
    fs::remove(path);
    const int64_t matmul_params = params -
                                  int64_t(shape.vocab) * shape.width  // no embedding matmul
                                  - int64_t(shape.layers * 2 + 1) * shape.width;
    const double flops = 2.0 * double(matmul_params) * block;
    std::printf("%-7s %10.3g %10.1f %10.1f %10.1f %12.1f %12.1f %10.1f %12.1f\n", variant.name,
                double(params), file_bytes / 1e6, timing.wall * 1e3, timing.cpu * 1e3,
                flops / timing.wall * 1e-9, flops / timing.cpu * 1e-9, rss / 1e6,
                (rss - file_bytes) / 1e6);
    rows.push_back({{"type", variant.name},
                    {"params", params},
                    {"file_bytes", file_bytes},
                    {"ms_per_step_wall", timing.wall * 1e3},
                    {"ms_per_step_cpu", timing.cpu * 1e3},
                    {"gflops_wall", flops / timing.wall * 1e-9},
                    {"gflops_per_cpu_second", flops / timing.cpu * 1e-9},
                    {"rss_bytes", rss},
                    {"block", block},
                    {"context", shape.context},
                    {"layers", shape.layers},
                    {"threads", ThreadCount()}});
  }
  fs::remove_all(dir);
  return rows;
}

}  // namespace
}  // namespace polestar

int main(int argc, char** argv) {
  using namespace polestar;
  CLI::App app{
      "Quantised weights: matmul GFLOP/s and a dual-cache decode step, BF16 / Q8_0 / Q4_K_M"};
  ModelShape shape;
  int block = 32, steps = 3, threads = 0;
  double min_seconds = 0.5;
  bool skip_matmul = false, skip_kernels = false, skip_decode = false;
  std::string json_path = "quant_bench.json";
  app.add_option("--layers", shape.layers, "decoder layers of the ~1B model")
      ->capture_default_str();
  app.add_option("--context", shape.context, "cached rows (prompt + canvas)")
      ->capture_default_str();
  app.add_option("--block", block, "query rows per decode step")->capture_default_str();
  app.add_option("--steps", steps, "timed decode steps per type")->capture_default_str();
  app.add_option("--min-seconds", min_seconds, "minimum time per matmul measurement")
      ->capture_default_str();
  app.add_option("-t,--threads", threads, "threads (0: all)");
  app.add_flag("--skip-matmul", skip_matmul);
  app.add_flag("--skip-kernels", skip_kernels);
  app.add_flag("--skip-decode", skip_decode);
  app.add_option("--json", json_path, "where to write the results")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    SetThreadCount(threads);
    std::printf("threads %d, kernels %s\n", ThreadCount(), std::string(IsaName(BestIsa())).c_str());
    nlohmann::json out = {{"threads", ThreadCount()}, {"kernels", IsaName(BestIsa())}};
    if (!skip_matmul) out["matmul"] = MatMulBench(min_seconds);
    if (!skip_kernels) out["kernels"] = KernelBench(min_seconds / 2);
    if (!skip_decode) out["decode"] = DecodeBench(shape, block, steps);
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("\nwrote %s\n", json_path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "quant_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
