// Rows per second of batched decoding steps: B sequences (different prompts, one policy)
// step together through StepBatch, so every matrix product sees all B sequences' rows, and
// the in-block steps after each block start are timed. On a random-weight checkpoint the
// commits follow the forced schedule of the scale bench (factor rule at tokens-per-step + 1
// over confidences near zero: that many tokens per step), so every batch size runs the same
// steps and only the batching differs.
//
//   batch_bench -m MODEL [--policies fast-dllm-dual,polestar] [--batch-sizes 1,2,4,8]
//               [--prompt-length 32] [--gen-length 128] [--block-length 32]
//               [--tokens-per-step 4] [--blocks 1] [-t 2]
//
// Prints one JSON object per (policy, batch size) and a table: in-block steps, their median
// seconds, rows per step (summed over the batch and the layers), rows per second and the
// speed-up over batch 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "decode/generate.h"
#include "ops/isa.h"

namespace {

using namespace polestar;

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Ordinary ids (no special token) spread over the vocabulary; `seed` varies the prompt.
std::vector<int> Prompt(const ModelConfig& config, int length, int seed) {
  std::vector<int> prompt;
  for (int i = 0; int(prompt.size()) < length; ++i) {
    const int id = (17 + seed * 104729 + i * 7919) % std::min(config.vocab, 60000);
    if (!IsEndToken(config, id) && id != config.mask_id && id != config.bos_id)
      prompt.push_back(id);
  }
  return prompt;
}

struct Timing {
  std::vector<double> seconds;  // per timed step
  int64_t rows = 0;             // layer rows computed by the timed steps, all sequences
};

// Decodes `blocks` blocks of `batch` sequences in lockstep; times the steps after each block
// start (the block starts fill the caches).
Timing TimeBatch(const Model& model, const DecodeOptions& options, int prompt_length, int batch,
                 int blocks) {
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::vector<Sequence*> pointers;
  std::vector<int> block_of(size_t(batch), -1);  // each sequence's block at its last step
  std::vector<int64_t> rows_before(size_t(batch), 0);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < batch; ++i) prompts.push_back(Prompt(model.config(), prompt_length, i));
  for (int i = 0; i < batch; ++i) {
    const size_t s = size_t(i);
    sequences.push_back(std::make_unique<Sequence>(
        model, prompts[s], options, [&block_of, &rows_before, s, blocks](const StepEvent& e) {
          block_of[s] = e.block_index;
          return e.block_index < blocks - 1 || e.masks_left > 0;
        }));
    pointers.push_back(sequences.back().get());
  }
  Timing timing;
  int last_block = -1;
  while (std::any_of(pointers.begin(), pointers.end(), [](Sequence* s) { return !s->done(); })) {
    int64_t rows = 0;
    for (Sequence* s : pointers) rows += s->NextStepRows();
    const auto start = std::chrono::steady_clock::now();
    StepBatch(pointers);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool block_start = block_of[0] != last_block;
    last_block = block_of[0];
    if (!block_start) {
      timing.seconds.push_back(seconds);
      timing.rows += rows;
    }
    if (block_of[0] >= blocks) break;
    for (Sequence* s : pointers) {
      if (!s->error().empty()) Fail(s->error());
    }
  }
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Rows per second of batched decoding steps at several batch sizes"};
  std::string model_path;
  std::vector<std::string> policies = {"fast-dllm-dual", "polestar"};
  std::vector<int> batch_sizes = {1, 2, 4, 8};
  int prompt_length = 32, gen_length = 128, block_length = 32, tokens_per_step = 4, blocks = 1;
  int threads = 0;
  app.add_option("-m,--model", model_path, "model folder or .gguf file")->required();
  app.add_option("--policies", policies, "policies")->delimiter(',')->capture_default_str();
  app.add_option("--batch-sizes", batch_sizes, "batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--prompt-length", prompt_length, "prompt tokens")->capture_default_str();
  app.add_option("--gen-length", gen_length, "generated positions")->capture_default_str();
  app.add_option("--block-length", block_length, "block length")->capture_default_str();
  app.add_option("--tokens-per-step", tokens_per_step, "forced commits per step")
      ->capture_default_str();
  app.add_option("--blocks", blocks, "blocks decoded per run")->capture_default_str();
  app.add_option("-t,--threads", threads, "threads (0: all)");
  CLI11_PARSE(app, argc, argv);
  try {
    SetThreadCount(threads);
    auto model = Model::Load(model_path);
    std::vector<nlohmann::json> rows;
    for (const std::string& policy : policies) {
      double rows_per_second_1 = 0;
      for (int batch : batch_sizes) {
        if (batch < 1) Fail("batch sizes must be at least 1");
        DecodeOptions o;
        o.policy = policy;
        o.gen_length = gen_length;
        o.block_length = block_length;
        o.steps = gen_length;
        o.factor = tokens_per_step + 1;
        const Timing t = TimeBatch(*model, o, prompt_length, batch, blocks);
        const double median = Median(t.seconds);
        const double rows_per_step = t.seconds.empty() ? 0 : double(t.rows) / t.seconds.size();
        const double rows_per_second = median > 0 ? rows_per_step / median : 0;
        if (batch == batch_sizes.front()) rows_per_second_1 = rows_per_second;
        nlohmann::json row = {
            {"model", model_path},
            {"policy", policy},
            {"batch", batch},
            {"threads", ThreadCount()},
            {"kernels", IsaName(BestIsa())},
            {"timed_steps", t.seconds.size()},
            {"step_seconds", t.seconds},
            {"median_step_seconds", median},
            {"rows_per_step", rows_per_step},
            {"rows_per_second", rows_per_second},
            {"speedup", rows_per_second_1 > 0 ? rows_per_second / rows_per_second_1 : 0.0}};
        std::printf("%s\n", row.dump().c_str());
        std::fflush(stdout);
        rows.push_back(std::move(row));
      }
    }
    std::printf("\n| policy | batch | steps | median s/step | rows/step | rows/s | vs first |\n");
    std::printf("|---|--:|--:|--:|--:|--:|--:|\n");
    for (const nlohmann::json& r : rows) {
      std::printf("| %s | %d | %d | %.3f | %.0f | %.0f | %.2fx |\n",
                  r["policy"].get<std::string>().c_str(), r["batch"].get<int>(),
                  int(r["timed_steps"].get<size_t>()), r["median_step_seconds"].get<double>(),
                  r["rows_per_step"].get<double>(), r["rows_per_second"].get<double>(),
                  r["speedup"].get<double>());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "batch_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
