// polestar make-random-model: a random-weight checkpoint at a real model's shape.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "base/parallel.h"
#include "bench/random_model.h"
#include "commands.h"
#include "decode_flags.h"

namespace polestar::cli {

void AddMakeRandomModelCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-random-model",
      "Write a random-weight checkpoint at a real model's shape (for timing, not for text)");
  struct Args {
    std::string like = "llada-1b", out, dtype = "bf16";
    double scale = 1.0;
    uint64_t seed = 0;
    int layers = 0, width = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, threads = 0;
    double max_shard_gb = 4;
  };
  auto args = std::make_shared<Args>();
  std::string shapes;
  for (const auto& s : bench::KnownShapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  cmd->add_option("--like", args->like, "shape to copy: " + shapes)->capture_default_str();
  cmd->add_option("--scale", args->scale,
                  "multiply the layer count (per-layer shapes stay real), e.g. 0.25")
      ->check(Within(1e-3, 64))
      ->capture_default_str();
  cmd->add_option("-o,--output", args->out, "output folder")->required();
  cmd->add_option("--dtype", args->dtype, "bf16 or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  AddUint64Option(cmd, "--seed", args->seed, "weight seed");
  cmd->add_option("--layers", args->layers, "override: layer count (before --scale)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--width", args->width, "override: hidden width")->check(CLI::Range(2, 65536));
  cmd->add_option("--heads", args->heads, "override: attention heads")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", args->kv_heads, "override: key/value heads")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--ffn", args->ffn, "override: SwiGLU inner width")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--vocab", args->vocab, "override: vocabulary (special ids are moved below it)")
      ->check(CLI::Range(8, 1 << 24));
  cmd->add_option("--max-shard-gb", args->max_shard_gb, "shard size limit")
      ->check(Within(1e-3, 1e6))
      ->capture_default_str();
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024));
  cmd->callback([args] {
    SetThreadCount(args->threads);
    bench::RandomModelOptions options;
    options.shape = bench::ShapeByName(args->like);
    bench::ModelShape& s = options.shape;
    if (args->layers > 0) s.layers = args->layers;
    if (args->width > 0) s.width = args->width;
    if (args->heads > 0) s.heads = s.kv_heads = args->heads;
    if (args->kv_heads > 0) s.kv_heads = args->kv_heads;
    if (args->ffn > 0) s.ffn = args->ffn;
    if (args->vocab > 0) {
      s.vocab = args->vocab;
      if (s.vocab < 8) Fail("--vocab must be at least 8");
      // The four special ids go to the top of the smaller vocabulary.
      s.mask_id = s.vocab - 1, s.eos_id = s.vocab - 2, s.bos_id = s.vocab - 3,
      s.eot_id = s.vocab - 4;
    }
    if (args->layers > 0 || args->width > 0 || args->heads > 0 || args->kv_heads > 0 ||
        args->ffn > 0 || args->vocab > 0) {
      s.name += "-custom";
    }
    options.scale = args->scale;
    options.dtype = args->dtype == "bf16" ? DType::kBF16 : DType::kF32;
    options.seed = args->seed;
    if (!(args->max_shard_gb > 0)) Fail("--max-shard-gb must be positive");
    options.max_shard_bytes = int64_t(args->max_shard_gb * double(int64_t{1} << 30));
    const auto start = std::chrono::steady_clock::now();
    const bench::RandomModelSummary summary = bench::WriteRandomModel(args->out, options);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bench::ModelShape& w = summary.shape;
    std::printf("%s: %s, %d layers, width %d, heads %d/%d, ffn %d, vocab %d\n", args->out.c_str(),
                w.name.c_str(), w.layers, w.width, w.heads, w.kv_heads, w.ffn, w.vocab);
    if (w.experts > 0) {
      std::printf(
          "%d experts, %d per token, expert ffn %d, shared expert ffn %d, %d dense layers\n",
          w.experts, w.experts_per_token, w.expert_ffn, w.shared_ffn,
          std::min(w.dense_layers, w.layers));
    }
    std::printf("%.3f B parameters (%.3f B active per token), %.2f GB in %zu file(s), %.1f s\n",
                summary.parameters / 1e9, summary.active_parameters / 1e9, summary.bytes / 1e9,
                summary.files.size(), seconds);
  });
}

}  // namespace polestar::cli
