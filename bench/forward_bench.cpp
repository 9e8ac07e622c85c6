// Seconds per full forward of a model file: every canvas row (prompt + masks) through every
// layer and every row's logits out of the LM head, which is what diffuse-cpp's full forward
// (diffuse_forward_full, its --no-cache step) computes. Warm-up forwards first (page-in of
// the memory-mapped weights, scratch buffers), then each timed forward on the wall clock.
// The polestar side of bench/compare_engines.sh's "full forward" workload.
//
//   forward_bench -m MODEL [--prompt-ids 1,2,3 | --prompt-length 32] [--gen-length 64]
//                 [--forwards 3] [--warmup 1] [-t 2]
//
// Prints one JSON object: rows, seconds of each timed forward and their median.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "decode/generate.h"
#include "model/forward.h"
#include "ops/isa.h"

int main(int argc, char** argv) {
  using namespace polestar;
  CLI::App app{"Seconds per full forward (all rows in, all rows' logits out) of a model file"};
  std::string model_path;
  std::vector<int> prompt;  // [P] prompt ids
  int prompt_length = 32, gen_length = 64, forwards = 3, warmup = 1, threads = 0;
  app.add_option("-m,--model", model_path, "model folder or .gguf file")->required();
  auto* ids = app.add_option("--prompt-ids", prompt, "prompt ids: 1,2,3")->delimiter(',');
  app.add_option("--prompt-length", prompt_length, "prompt tokens when no --prompt-ids")
      ->excludes(ids)
      ->capture_default_str();
  app.add_option("--gen-length", gen_length, "masks after the prompt")->capture_default_str();
  app.add_option("--forwards", forwards, "timed forwards")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed forwards first")->capture_default_str();
  app.add_option("-t,--threads", threads, "threads (0: all)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (forwards < 1 || warmup < 0 || gen_length < 0) Fail("need --forwards >= 1, --warmup >= 0");
    SetThreadCount(threads);
    auto model = Model::Load(model_path);
    const ModelConfig& config = model->config();
    if (prompt.empty()) {
      // Ordinary ids (no special token) spread over the vocabulary.
      for (int i = 0; int(prompt.size()) < prompt_length; ++i) {
        const int id = (17 + i * 7919) % std::min(config.vocab, 60000);
        if (!IsEndToken(config, id) && id != config.mask_id && id != config.bos_id)
          prompt.push_back(id);
      }
    }
    std::vector<int> canvas = prompt;  // [L] prompt + masks
    canvas.resize(prompt.size() + size_t(gen_length), config.mask_id);
    const int length = int(canvas.size());
    if (length > config.max_positions) Fail(length, " rows exceed the model's context");
    KvCache cache = MakeCache(*model, length, false);
    Forward forward(*model, cache);
    StepPlan plan;
    plan.input_rows.resize(size_t(length));
    std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
    plan.logit_rows = plan.input_rows;
    for (int i = 0; i < warmup; ++i) forward.Run(canvas, plan);
    std::vector<double> seconds;  // [forwards]
    int64_t rows_computed = 0;
    for (int i = 0; i < forwards; ++i) {
      const auto start = std::chrono::steady_clock::now();
      rows_computed = forward.Run(canvas, plan).rows_computed;
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    const nlohmann::json out = {{"model", model_path},      {"rows", length},
                                {"logit_rows", length},     {"layer_rows_computed", rows_computed},
                                {"threads", ThreadCount()}, {"kernels", IsaName(BestIsa())},
                                {"warmup", warmup},         {"seconds", seconds},
                                {"median_seconds", median}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "forward_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
