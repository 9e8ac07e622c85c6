// The scale benchmark's projections beyond the TPF cost model of scale.cpp: a policy's own
// step mix priced step kind by step kind, the paper's TPF values, and the per-layer
// extrapolation that lets a few layers stand for a whole 8B model.
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "bench/scale.h"
#include "decode/policy.h"
#include "eval/suite.h"
#include "tokenizer/model_tokenizer.h"

namespace polestar::bench {
namespace {

const StepTiming* Find(const std::vector<StepTiming>& steps, const std::string& kind) {
  for (const StepTiming& s : steps) {
    if (s.kind == kind) return &s;
  }
  return nullptr;
}

}  // namespace

std::span<const PaperRow> PaperGsm8kRows() {
  // Polestar's Table 1, LLaDA-8B-Instruct, GSM8K 5-shot, gen 256, block 32, one A100
  // (shared/reference/anchors_methods.md, section 1.4). Fast-dLLM is its dual cache.
  static const PaperRow rows[] = {{"vanilla", 79.30, 1.00, 6.58},
                                  {"fast-dllm-dual", 77.88, 2.72, 47.88},
                                  {"elastic-cache", 77.58, 2.93, 55.01},
                                  {"polestar", 78.33, 3.67, 87.57}};
  return rows;
}

PromptLengths SuitePromptLengths(const std::string& suite_name, const std::string& tokenizer_dir,
                                 const std::string& data_dir) {
  const eval::Suite suite =
      eval::LoadSuite(suite_name, data_dir.empty() ? eval::DefaultDataDir() : data_dir);
  const std::unique_ptr<Tokenizer> tokenizer = LoadModelTokenizer(tokenizer_dir);
  PromptLengths lengths;
  double sum = 0;
  for (const eval::EvalItem& item : suite.items) {
    // The whole few-shot prompt as lm-eval builds it, no chat template (as the reference
    // evaluations feed LLaDA-8B-Instruct).
    const int n = int(tokenizer->Encode(item.prompt).size());
    lengths.min = lengths.items == 0 ? n : std::min(lengths.min, n);
    lengths.max = std::max(lengths.max, n);
    sum += n;
    ++lengths.items;
  }
  if (lengths.items == 0) Fail("suite ", suite_name, " has no items");
  lengths.mean = sum / double(lengths.items);
  return lengths;
}

std::vector<StepTiming> ExtrapolateLayers(const std::vector<StepTiming>& at_a, int layers_a,
                                          const std::vector<StepTiming>& at_b, int layers_b,
                                          int layers) {
  PS_CHECK(layers_a > 0 && layers_b > layers_a);
  std::vector<StepTiming> out;
  for (const StepTiming& a : at_a) {
    const StepTiming* b = Find(at_b, a.kind);
    if (b == nullptr) continue;
    // t(L) = t(a) + (L - a) (t(b) - t(a)) / (b - a): each layer costs the same, and what
    // does not grow with the layers (embedding, final norm, LM head) stays. Rows alike: the
    // last layer computes only the rows whose outputs are read, the others every row.
    const int64_t rows_per_layer = (b->rows_computed - a.rows_computed) / (layers_b - layers_a);
    StepTiming t{a.kind, a.rows_computed + (layers - layers_a) * rows_per_layer, {}, {}};
    const double per_layer = (b->Median() - a.Median()) / double(layers_b - layers_a);
    t.seconds.push_back(std::max(0.0, a.Median() + double(layers - layers_a) * per_layer));
    // Bytes alike: a layer's hooks and drift ops move the same, the plan and logits once.
    auto bytes = [&](int64_t at_a, int64_t at_b) {
      return at_a + (layers - layers_a) * ((at_b - at_a) / (layers_b - layers_a));
    };
    t.transfers = {bytes(a.transfers.to_backend, b->transfers.to_backend),
                   bytes(a.transfers.to_host, b->transfers.to_host)};
    // A mixture's experts read alike: each added layer routes the same rows.
    const double experts_per_layer = (b->experts_read - a.experts_read) / (layers_b - layers_a);
    t.experts_read = a.experts_read + double(layers - layers_a) * experts_per_layer;
    out.push_back(std::move(t));
  }
  return out;
}

std::map<std::string, double> StepsPerBlock(const nlohmann::json& row) {
  std::map<std::string, double> per_block;
  const nlohmann::json& summary = row.at("summary");
  if (!summary.contains("step_kinds")) return per_block;  // rows from before step kinds
  const nlohmann::json& options = row.at("options");
  const int gen = options.at("gen_length").get<int>();
  const int block = options.at("block_length").get<int>();
  const double blocks = double(summary.at("items").get<int64_t>()) * double(gen / block);
  for (const auto& [kind, count] : summary.at("step_kinds").items())
    per_block[kind] = count.get<double>() / blocks;
  return per_block;
}

double StepPrice(const std::string& kind, const std::vector<StepTiming>& steps) {
  auto t = [&](const std::string& k) {
    const StepTiming* s = Find(steps, k);
    return s ? s->Median() : -1.0;
  };
  // Elastic-Cache's plain step recomputes its window (a block) and a few tracked tokens: a
  // dual-cache step's rows; its attention tracking is not priced.
  if (kind == step_kind::kElasticStep) return t(step_kind::kDualStep);
  int layer = 0, layers = 0;
  if (std::sscanf(kind.c_str(), "refresh from layer %d of %d", &layer, &layers) == 2 &&
      layers > 0) {
    // The step's own rows below the layer that fired, every row from it on.
    const double dual = t(step_kind::kDualStep), full = t(step_kind::kFullPass);
    if (dual < 0 || full < 0) return -1;
    const double below = double(layer) / double(layers);
    return below * dual + (1 - below) * full;
  }
  return t(kind);
}

double ProjectStepMixSeconds(const std::string& policy,
                             const std::map<std::string, double>& steps_per_block,
                             const ScaleOptions& options, const std::vector<StepTiming>& steps) {
  const double blocks = double(options.base.BlockCount());
  double per_block = 0;
  for (const auto& [kind, count] : steps_per_block) {
    const double price = StepPrice(kind, steps);
    if (price < 0) return -1;
    per_block += count * price;
    // Polestar's proxy attention runs before each refresh step's layers.
    if (policy == "polestar" && kind.starts_with("refresh step")) {
      const double proxy = StepPrice(kProxyTiming, steps);
      if (proxy < 0) return -1;
      per_block += count * proxy;
    }
  }
  // ... and its k-means of every layer's window once a block.
  if (policy == "polestar") {
    const double kmeans = StepPrice(kKMeansTiming, steps);
    if (kmeans < 0) return -1;
    per_block += kmeans;
  }
  return blocks * per_block;
}

}  // namespace polestar::bench
