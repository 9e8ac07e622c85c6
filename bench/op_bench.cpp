// Where a step's time goes: each op of the backend seam timed alone at a model's shapes, on
// any backend, beside what it moves and computes (GB/s, TFLOP/s). The products at a cached
// step's rows (a block, 32) and a full pass's (the canvas), and over Q8_0 and Q4_K weights at a
// block's rows (where K holds whole blocks), attention over the canvas with and
// without its probabilities, the row-wise ops, the LM head and greedy choice of a block, and
// Polestar's drift, clustering and NVFP4 work.
//
//   op_bench [--backend SPEC] [--reps 10] [--width 4096] [--ffn 12288] [--heads 32]
//            [--kv-heads 32] [--vocab 126464] [--canvas 1156] [--block 32] [--clusters 32]
//            [--json FILE]
//
// Defaults are LLaDA-8B's shapes with a GSM8K 5-shot canvas (900 + 256). Weights are random
// BF16 uploaded to the backend; each figure is the median of --reps runs after one warm-up,
// timed on the wall clock around the op and a Synchronize.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "base/dtype.h"
#include "base/error.h"
#include "ops/quant.h"

namespace polestar {
namespace {

struct Timing {
  std::string op, shape;
  double ms = 0, bytes = 0, flops = 0;
};

class Bench {
 public:
  Bench(const Backend& backend, int reps) : backend_(backend), reps_(reps) {}

  // A backend buffer of `n` uniform values in [-scale, scale].
  Buffer Random(int64_t n, float scale = 1.0f) {
    std::vector<float> host(static_cast<size_t>(n));
    std::uniform_real_distribution<float> uniform(-scale, scale);
    for (float& v : host) v = uniform(rng_);
    Buffer buffer(backend_, n, Buffer::Init::kNone);
    backend_.Upload(host.data(), buffer.bytes(), buffer.data());
    return buffer;
  }

  // Random weights [n, k] stored as `type` (BF16, or a block type as a GGUF stores it) in the
  // backend, and their view.
  struct Weights {
    Buffer bytes;  // [n, RowBytes(type, k)] u8
    WeightView view;
  };
  Weights RandomWeights(int64_t n, int64_t k, DType type = DType::kBF16) {
    const int64_t row_bytes = RowBytes(type, k);
    std::vector<uint8_t> host(static_cast<size_t>(n * row_bytes));
    std::vector<float> row(static_cast<size_t>(k));
    std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
    for (int64_t r = 0; r < n; ++r) {
      for (float& v : row) v = uniform(rng_);
      QuantizeValues(type, row.data(), k, host.data() + r * row_bytes);
    }
    Weights w{Buffer(backend_, n * row_bytes, ElementType::kU8, Buffer::Init::kNone), {}};
    backend_.Upload(host.data(), w.bytes.bytes(), w.bytes.As<uint8_t>());
    w.view = {type, w.bytes.As<uint8_t>(), n, k, row_bytes};
    return w;
  }

  void Time(std::string op, std::string shape, double bytes, double flops,
            const std::function<void()>& run) {
    run();
    backend_.Synchronize();
    std::vector<double> ms;
    for (int i = 0; i < reps_; ++i) {
      const auto start = std::chrono::steady_clock::now();
      run();
      backend_.Synchronize();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::nth_element(ms.begin(), ms.begin() + reps_ / 2, ms.end());
    timings_.push_back({std::move(op), std::move(shape), ms[size_t(reps_ / 2)], bytes, flops});
    const Timing& t = timings_.back();
    std::fprintf(stderr, "%-28s %-34s %9.3f ms\n", t.op.c_str(), t.shape.c_str(), t.ms);
  }

  const std::vector<Timing>& timings() const { return timings_; }
  std::mt19937& rng() { return rng_; }

 private:
  const Backend& backend_;
  int reps_;
  std::mt19937 rng_{1};
  std::vector<Timing> timings_;
};

std::string Shape(std::initializer_list<int64_t> dims) {
  std::string s;
  for (const int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

}  // namespace
}  // namespace polestar

int main(int argc, char** argv) {
  using namespace polestar;
  CLI::App app{"Each backend op timed alone at a model's shapes"};
  std::string backend_spec = DefaultBackendSpec(), json_path;
  int reps = 10, heads = 32, kv_heads = 32, clusters = 32;
  int64_t width = 4096, ffn = 12288, vocab = 126464, canvas = 1156, block = 32;
  app.add_option("--backend", backend_spec, "backend NAME[:KEY=VALUE,...]")->capture_default_str();
  app.add_option("--reps", reps, "timed runs per op")->check(CLI::Range(1, 1000));
  app.add_option("--width", width, "model width C")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--ffn", ffn, "MLP width F")->check(CLI::Range(1, 1 << 30))->capture_default_str();
  app.add_option("--heads", heads, "query heads H")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "key/value heads")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary V")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--canvas", canvas, "canvas rows L (prompt + gen)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--block", block, "rows of a cached step")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--clusters", clusters, "Polestar's k-means clusters")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--json", json_path, "write the timings as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
    if (width % heads != 0 || heads % kv_heads != 0 || canvas < block)
      Fail("need width % heads == 0, heads % kv-heads == 0 and block <= canvas");
    const Backend& backend = BackendNamed(backend_spec);
    Bench bench(backend, reps);
    const int head_dim = int(width / heads);
    const int64_t kv_width = int64_t(kv_heads) * head_dim;

    // Products: y[M, N] = x[M, K] · w[N, K]^T at a block's rows and the canvas's.
    const std::pair<const char*, std::pair<int64_t, int64_t>> matrices[] = {
        {"q/out projection", {width, width}},
        {"k/v projection", {kv_width, width}},
        {"MLP gate/up", {ffn, width}},
        {"MLP down", {width, ffn}}};
    const Buffer x = bench.Random(canvas * std::max(width, ffn));
    Buffer y(backend, canvas * std::max({width, ffn, vocab / 8}), Buffer::Init::kNone);
    for (const auto& [what, nk] : matrices) {
      const auto [n, k] = nk;
      const auto w = bench.RandomWeights(n, k);
      for (const int64_t m : {block, canvas}) {
        bench.Time(Cat("MatMul ", what), Shape({m, n, k}), double(n * k * 2 + m * (n + k) * 4),
                   2.0 * double(m * n * k), [&] { backend.MatMul(x.data(), m, w.view, y.data()); });
      }
      // Quantised weights at a block's rows (a cached step's products): the bytes they read
      // are the stored ones.
      for (const DType type : {DType::kQ8_0, DType::kQ4_K}) {
        if (k % BlockSize(type) != 0) continue;  // rows of whole blocks only
        const auto q = bench.RandomWeights(n, k, type);
        bench.Time(Cat("MatMul ", what, " ", DTypeName(type)), Shape({block, n, k}),
                   double(n * RowBytes(type, k) + block * (n + k) * 4), 2.0 * double(block * n * k),
                   [&] { backend.MatMul(x.data(), block, q.view, y.data()); });
      }
    }
    {
      const auto head = bench.RandomWeights(vocab, width);
      const Buffer norm = bench.Random(width);
      Buffer logits(backend, block * vocab, Buffer::Init::kNone);
      Buffer rows = bench.Random(block * width);
      bench.Time(
          "LmHead (norm + product)", Shape({block, vocab, width}),
          double(vocab * width * 2 + block * vocab * 4), 2.0 * double(block * vocab * width), [&] {
            backend.LmHead(rows.data(), block, width, norm.data(), 1e-5f, head.view, logits.data());
          });
      std::vector<GreedyChoice> choices(static_cast<size_t>(block));
      bench.Time("GreedyChoices (float64 softmax)", Shape({block, vocab}),
                 double(block * vocab * 4), 0, [&] {
                   backend.GreedyChoices(logits.data(), block, vocab, GreedySpec{}, choices.data());
                 });
    }

    // Attention over the canvas's cached keys and values.
    const Buffer q = bench.Random(canvas * width), k = bench.Random(canvas * kv_width),
                 v = bench.Random(canvas * kv_width);
    Buffer out(backend, canvas * width, Buffer::Init::kNone);
    Buffer probs(backend, block * heads * canvas, Buffer::Init::kNone);
    for (const int64_t m : {block, canvas}) {
      bench.Time("Attention", Shape({m, heads, canvas, head_dim}),
                 double((m * width * 2 + canvas * kv_width * 2) * 4),
                 4.0 * double(m * canvas * width), [&] {
                   backend.Attention(q.data(), m, k.data(), v.data(), canvas, heads, kv_heads,
                                     head_dim, out.data());
                 });
    }
    bench.Time("Attention + probabilities", Shape({block, heads, canvas, head_dim}),
               double((block * width * 2 + canvas * kv_width * 2 + block * heads * canvas) * 4),
               4.0 * double(block * canvas * width), [&] {
                 backend.Attention(q.data(), block, k.data(), v.data(), canvas, heads, kv_heads,
                                   head_dim, out.data(), probs.data());
               });

    // Row-wise ops over the canvas.
    {
      Buffer a = bench.Random(canvas * ffn);
      const Buffer b = bench.Random(canvas * ffn), norm = bench.Random(width);
      bench.Time("RmsNorm", Shape({canvas, width}), double(canvas * width * 8), 0,
                 [&] { backend.RmsNorm(a.data(), canvas, width, norm.data(), 1e-5f, out.data()); });
      bench.Time("SiluMul", Shape({canvas, ffn}), double(canvas * ffn * 12), 0,
                 [&] { backend.SiluMul(a.data(), b.data(), canvas * ffn); });
      bench.Time("AddInPlace", Shape({canvas, width}), double(canvas * width * 12), 0,
                 [&] { backend.AddInPlace(a.data(), b.data(), canvas * width); });
      const RopeTable host_table(head_dim, head_dim, int(canvas), 500000.0f);
      Buffer cos(backend, int64_t(host_table.cos.size()), Buffer::Init::kNone),
          sin(backend, int64_t(host_table.sin.size()), Buffer::Init::kNone);
      backend.Upload(host_table.cos.data(), cos.bytes(), cos.data());
      backend.Upload(host_table.sin.data(), sin.bytes(), sin.data());
      const RopeTable table =
          host_table.WithAngles({cos.data(), size_t(cos.size())}, {sin.data(), size_t(sin.size())});
      std::vector<int> positions(static_cast<size_t>(canvas));
      for (int i = 0; i < int(canvas); ++i) positions[size_t(i)] = i;
      bench.Time("ApplyRope", Shape({canvas, heads, head_dim}), double(canvas * width * 8), 0,
                 [&] { backend.ApplyRope(a.data(), positions, heads, table, false); });
    }

    // Polestar's drift measurement, clustering and NVFP4 store.
    {
      const Buffer before = bench.Random(block * heads * canvas, 1e-3f);
      std::vector<double> drift(static_cast<size_t>(block));
      bench.Time("HeadMeanDrift (KL)", Shape({block, heads, canvas}),
                 double(block * heads * canvas * 8), 0, [&] {
                   backend.HeadMeanDrift(DriftMetric::kKl, probs.data(), before.data(), block,
                                         heads, canvas, drift.data());
                 });
      Buffer centroids(backend, clusters * width, Buffer::Init::kNone);
      Buffer labels(backend, canvas, ElementType::kI32, Buffer::Init::kNone);
      bench.Time("SphericalKMeans (10 iterations)", Shape({canvas, width, clusters}),
                 double(canvas * width * 4), 2.0 * 10 * double(canvas * width * clusters), [&] {
                   backend.SphericalKMeans(x.data(), canvas, width, clusters, 10, centroids.data(),
                                           labels.As<int>());
                 });
      std::vector<int> rows(static_cast<size_t>(canvas)), zeros(static_cast<size_t>(canvas), 0);
      for (int i = 0; i < int(canvas); ++i) rows[size_t(i)] = i;
      const int64_t scale_bytes = (width + 15) / 16, value_bytes = (width + 1) / 2;
      Buffer scales(backend, canvas * scale_bytes, ElementType::kU8, Buffer::Init::kNone);
      Buffer values(backend, canvas * value_bytes, ElementType::kU8, Buffer::Init::kNone);
      bench.Time("QuantizeResiduals (NVFP4)", Shape({canvas, width}),
                 double(canvas * width * 4 + canvas * (scale_bytes + value_bytes)), 0, [&] {
                   backend.QuantizeResiduals(x.data(), rows, centroids.data(), zeros, width, 1.0f,
                                             scales.As<uint8_t>(), values.As<uint8_t>(), rows);
                 });
    }

    std::printf("%-32s %-24s %10s %10s %10s\n", "op", "shape", "ms", "GB/s", "TFLOP/s");
    nlohmann::json records = nlohmann::json::array();
    for (const Timing& t : bench.timings()) {
      const double seconds = t.ms * 1e-3;
      std::printf("%-32s %-24s %10.3f %10.1f %10.2f\n", t.op.c_str(), t.shape.c_str(), t.ms,
                  t.bytes / seconds / 1e9, t.flops / seconds / 1e12);
      records.push_back(
          {{"op", t.op}, {"shape", t.shape}, {"ms", t.ms}, {"bytes", t.bytes}, {"flops", t.flops}});
    }
    if (!json_path.empty()) {
      const nlohmann::json out = {
          {"backend", std::string(backend.name())}, {"reps", reps}, {"ops", records}};
      std::FILE* file = std::fopen(json_path.c_str(), "w");
      if (file == nullptr) Fail("cannot write ", json_path);
      std::fprintf(file, "%s\n", out.dump(1).c_str());
      std::fclose(file);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "op_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
