#include "bench/scale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/error.h"
#include "bench/random_model.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "decode/commit_rules.h"
#include "decode/generate.h"
#include "decode/policy.h"
#include "drift/drift.h"
#include "io/atomic_file.h"
#include "model/forward.h"
#include "model/gguf_convert.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// Prompt ids that are no special token of the model.
std::vector<int> ScalePrompt(const ModelConfig& config, int length) {
  std::vector<int> prompt;
  const int span =
      std::max(2, std::min(config.vocab, config.mask_id > 0 ? config.mask_id : config.vocab) / 2);
  for (int i = 0; prompt.size() < size_t(length); ++i) {
    const int id = (17 + i * 7919) % span;
    if (IsEndToken(config, id) || id == config.mask_id || id == config.pad_id ||
        id == config.bos_id)
      continue;
    prompt.push_back(id);
  }
  return prompt;
}

// Polestar's refresh at every layer: the block rows plus the rows of k clusters of the
// window (k = 1 at the last layer), the clusters being equal slices of the window that
// change from layer to layer. The refreshed rows' outputs become the next layer's fresh rows
// (packet propagation), as in Forward's semantics.
class RefreshHook final : public LayerHook {
 public:
  RefreshHook(std::vector<int> block, std::vector<int> window, int clusters, int k, int layers)
      : block_(std::move(block)),
        window_(std::move(window)),
        clusters_(clusters),
        k_(k),
        layers_(layers) {}

  void BeforeQueries(LayerRows& rows) override {
    std::vector<int> query = block_;
    const int k = rows.layer == layers_ - 1 ? 1 : k_;
    const size_t n = window_.size();
    for (int j = 0; j < k && n > 0; ++j) {
      const int cluster = (rows.layer + j) % clusters_;
      const size_t begin = n * size_t(cluster) / size_t(clusters_);
      const size_t end = n * size_t(cluster + 1) / size_t(clusters_);
      query.insert(query.end(), window_.begin() + int64_t(begin), window_.begin() + int64_t(end));
    }
    std::sort(query.begin(), query.end());
    // As Polestar's suffix commits: the last layer's packet rows beyond the block get logits.
    if (rows.layer == layers_ - 1) {
      for (int p : query) {
        if (p > block_.back()) rows.logit_rows->push_back(p);
      }
    }
    *rows.query_rows = std::move(query);
  }

 private:
  std::vector<int> block_, window_;
  int clusters_, k_, layers_;
};

struct Geometry {
  int prompt = 0, length = 0, block = 0, blocks = 0;
  int BlockStart(int b) const { return prompt + b * block; }
  // Polestar's window of block b: [start - prefix, start) and [end, end + suffix).
  std::vector<int> Window(int b, int prefix_blocks, int suffix_blocks) const {
    std::vector<int> rows;
    for (int p = std::max(0, BlockStart(b) - prefix_blocks * block); p < BlockStart(b); ++p)
      rows.push_back(p);
    for (int p = BlockStart(b) + block;
         p < std::min(length, BlockStart(b) + block + suffix_blocks * block); ++p) {
      rows.push_back(p);
    }
    return rows;
  }
};

Geometry GeometryOf(const ScaleOptions& options) {
  Geometry g;
  g.prompt = options.prompt_length;
  g.length = options.prompt_length + options.base.gen_length;
  g.block = options.base.EffectiveBlockLength();
  g.blocks = options.base.BlockCount();
  return g;
}

const StepTiming* FindStep(const std::vector<StepTiming>& steps, const std::string& kind) {
  for (const StepTiming& s : steps) {
    if (s.kind == kind) return &s;
  }
  return nullptr;
}

// What crossed between host and backend since `before`, over `count` steps.
TransferBytes TransfersSince(const Forward& forward, TransferBytes before, int64_t count) {
  const TransferBytes now = forward.transfers();
  return {(now.to_backend - before.to_backend) / count, (now.to_host - before.to_host) / count};
}

// Kilobytes (10^3 bytes) for the tables.
std::string Kb(double bytes) { return Fixed(bytes / 1e3, bytes < 1e5 ? 1 : 0); }

// The bytes of a model file, or of every file of a checkpoint folder.
int64_t ModelFileBytes(const std::string& path) {
  if (!fs::is_directory(path)) return int64_t(fs::file_size(path));
  int64_t bytes = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
    if (entry.is_regular_file()) bytes += int64_t(entry.file_size());
  }
  return bytes;
}

}  // namespace

double StepTiming::Median() const { return bench::Median(seconds); }

int ForcedStepsPerBlock(int block_length, int tokens_per_step) {
  int masks = block_length, steps = 0;
  while (masks > 0) {
    // SelectFactor with all confidences 0 and f = k + 1 accepts k, or all when one is left.
    int accepted = std::min(masks, tokens_per_step);
    if (accepted == masks - 1) accepted = masks;
    masks -= accepted;
    ++steps;
  }
  return steps;
}

std::vector<StepTiming> TimeSteps(const Model& model, const ScaleOptions& options) {
  const ModelConfig& config = model.config();
  const Geometry g = GeometryOf(options);
  if (g.blocks < 1 || options.base.gen_length % g.block != 0) {
    Fail("--block-length ", g.block, " must divide --gen-length ", options.base.gen_length);
  }
  if (g.length > config.max_positions)
    Fail("the scale canvas (", g.length, ") exceeds the model's context");
  std::vector<int> canvas = ScalePrompt(config, g.prompt);  // [L]
  canvas.resize(size_t(g.length), config.mask_id);
  KvCache cache = MakeCache(model, g.length, true);
  Forward forward(model, cache);
  const int middle = g.blocks / 2;
  auto block_rows = [&](int b) { return Range(g.BlockStart(b), g.BlockStart(b) + g.block); };
  std::vector<StepTiming> timings;
  // What the base options' commit rule asks of each logit row, as decoding asks it.
  const std::optional<GreedySpec> greedy =
      MakeCommitRule(options.base.Resolved(config), config)->Greedy();
  // Times the plans; returns the layers their timed steps replayed (Backend::Record).
  auto time_plan = [&](const std::string& kind, std::vector<StepPlan> plans) {
    StepTiming t{kind, 0, {}, {}};
    int64_t replayed = 0;
    for (StepPlan& plan : plans) plan.greedy = greedy;
    // Untimed, each plan twice: a backend that records steps (CUDA graphs) records one the
    // second time it comes, so the timed ones are replays, as in a decode's steady state.
    for (int warm = 0; warm < 2; ++warm) {
      for (const StepPlan& plan : plans) forward.Run(canvas, plan);
    }
    for (int r = 0; r < options.reps; ++r) {
      const TransferBytes before = forward.transfers();
      const double start = ClockSeconds(options.clock);
      int64_t rows = 0;
      for (const StepPlan& plan : plans) {
        const StepResult result = forward.Run(canvas, plan);
        rows += result.rows_computed;
        replayed += result.layers_replayed;
      }
      t.seconds.push_back((ClockSeconds(options.clock) - start) / double(plans.size()));
      t.rows_computed = rows / int64_t(plans.size());
      t.transfers = TransfersSince(forward, before, int64_t(plans.size()));
    }
    if (config.moe.experts > 0) {
      forward.set_counts_experts(true);
      for (const StepPlan& plan : plans)
        t.experts_read += double(forward.Run(canvas, plan).experts_read);
      t.experts_read /= double(plans.size());
      forward.set_counts_experts(false);
    }
    timings.push_back(std::move(t));
    return replayed;
  };
  // The cache must hold every row before partial steps read it (and this warms the weights).
  const StepPlan full{Range(0, g.length), block_rows(0), {}, nullptr};
  forward.Run(canvas, full);
  time_plan(step_kind::kFullPass, {full});
  const int window_block = std::min(3, g.blocks - 1);
  const int window_begin = std::max(0, g.BlockStart(window_block) - 2 * g.block);
  const int window_end = std::min(g.length, g.BlockStart(window_block) + 2 * g.block);
  time_plan(step_kind::kWindowedPass,
            {{Range(window_begin, window_end), block_rows(window_block), {}, nullptr}});
  std::vector<StepPlan> prefix_plans;
  for (int b : {std::max(0, middle - (g.blocks % 2 == 0 ? 1 : 0)), middle}) {
    prefix_plans.push_back({Range(g.BlockStart(b), g.length), block_rows(b), {}, nullptr});
  }
  if (g.blocks % 2 == 1) prefix_plans.pop_back();  // odd: the middle block is the mean
  time_plan(step_kind::kPrefixStep, prefix_plans);
  const StepPlan dual{block_rows(middle), block_rows(middle), {}, nullptr};
  if (time_plan(step_kind::kDualStep, {dual}) > 0) {
    // Its layers replayed a recording (CUDA graphs): the same step with every op launched.
    forward.set_records(false);
    time_plan(std::string(step_kind::kDualStep) + ", op by op", {dual});
    forward.set_records(true);
  }
  if (config.sampler == SamplerFamily::kLlada2) {
    // LLaDA 2.x's own steps (vanilla, its only policy): block-causal attention, the earlier
    // blocks' K/V cached and final. A step computes its block; a block's first step also
    // recomputes the previous block, now with its final tokens.
    std::vector<int> start_rows = block_rows(std::max(0, middle - 1));
    if (middle > 0) {
      for (int p : block_rows(middle)) start_rows.push_back(p);
    }
    time_plan(step_kind::kBlockStart, {{start_rows, block_rows(middle), {}, nullptr, g.block}});
    time_plan(step_kind::kBlockStep,
              {{block_rows(middle), block_rows(middle), {}, nullptr, g.block}});
  }

  const DecodeOptions& o = options.base;
  const std::vector<int> window = g.Window(middle, o.window_prefix_blocks, o.window_suffix_blocks);
  std::vector<int> ks;
  for (int k : {1, 2, 4, 8}) {
    if (k <= o.clusters) ks.push_back(k);
  }
  if (std::find(ks.begin(), ks.end(), o.topk_clusters) == ks.end()) ks.push_back(o.topk_clusters);
  std::sort(ks.begin(), ks.end());
  for (int k : ks) {
    RefreshHook hook(block_rows(middle), window, o.clusters, std::min(k, o.clusters),
                     config.layers);
    time_plan(step_kind::Refresh(k), {{block_rows(middle), block_rows(middle), {}, &hook}});
  }

  // Polestar's overheads, on this cache's rows (prefix and suffix clustered separately).
  const int64_t C = config.width;
  const int prefix_rows = int(
      std::count_if(window.begin(), window.end(), [&](int p) { return p < g.BlockStart(middle); }));
  const int suffix_rows = int(window.size()) - prefix_rows;
  const int prefix_clusters =
      prefix_rows > 0 ? std::clamp(o.clusters * prefix_rows / int(window.size()), 1, o.clusters - 1)
                      : 0;
  const int suffix_clusters = suffix_rows > 0 ? o.clusters - prefix_clusters : 0;
  StepTiming kmeans{kKMeansTiming, 0, {}, {}};
  const Backend& backend = forward.backend();
  const int clusters = prefix_clusters + suffix_clusters;
  Buffer hidden(backend, int64_t(window.size()) * C);                 // [window, C] layer inputs
  Buffer centroids(backend, int64_t(std::max(clusters, 1)) * C);      // [K, C]
  Buffer labels(backend, int64_t(window.size()), ElementType::kI32);  // [window]
  std::vector<int> host_labels(window.size());                        // [window], as Polestar's
  for (int r = 0; r < options.reps; ++r) {
    const TransferBytes before = forward.transfers();
    const double start = ClockSeconds(options.clock);
    for (int l = 0; l < config.layers; ++l) {
      forward.ReadHidden(l, window, hidden.data());
      if (prefix_clusters > 0) {
        backend.SphericalKMeans(hidden.data(), prefix_rows, C, prefix_clusters, o.kmeans_iters,
                                centroids.data(), labels.As<int>());
      }
      if (suffix_clusters > 0) {
        backend.SphericalKMeans(hidden.data() + int64_t(prefix_rows) * C, suffix_rows, C,
                                suffix_clusters, o.kmeans_iters,
                                centroids.data() + int64_t(prefix_clusters) * C,
                                labels.As<int>() + prefix_rows);
      }
      forward.Download(labels.As<int>(), labels.bytes(), host_labels.data());  // the plan's
    }
    kmeans.seconds.push_back(ClockSeconds(options.clock) - start);
    kmeans.transfers = TransfersSince(forward, before, 1);
  }
  timings.push_back(kmeans);
  // The proxy step exactly as Polestar runs it (the model's drift ops): every layer's proxy
  // attention of the centroids and its drift from the last time.
  StepTiming proxy{kProxyTiming, 0, {}, {}};
  std::vector<int> seeds;  // [K] one window row per cluster
  for (int c = 0; c < clusters; ++c)
    seeds.push_back(window[size_t(c) * window.size() / size_t(clusters)]);
  forward.ReadHidden(0, seeds, centroids.data());
  const int64_t probs_size = int64_t(clusters) * config.heads * g.length;
  Buffer probs(backend, probs_size), previous(backend, probs_size);  // [K, H, L]
  DriftScratch scratch(backend);
  std::vector<double> drift(static_cast<size_t>(clusters));  // [K]
  double drift_sum = 0;  // keeps the drift from being optimised away
  for (int r = 0; r < options.reps; ++r) {
    const TransferBytes before = forward.transfers();
    const double start = ClockSeconds(options.clock);
    for (int l = 0; l < config.layers; ++l) {
      forward.ProxyAttention(l, centroids.data(), clusters, probs.data(), scratch);
      forward.HeadMeanDrift(DriftMetric::kKl, probs.data(), previous.data(), clusters,
                            drift.data());
      for (double d : drift) drift_sum += d;
      std::swap(probs, previous);
    }
    proxy.seconds.push_back(ClockSeconds(options.clock) - start);
    proxy.transfers = TransfersSince(forward, before, 1);
  }
  volatile double sink = drift_sum;
  (void)sink;
  timings.push_back(proxy);
  return timings;
}

std::vector<ForcedRun> RunForcedSchedule(const Model& model, const ScaleOptions& options) {
  const ModelConfig& config = model.config();
  const Geometry g = GeometryOf(options);
  const int blocks = std::clamp(options.blocks, 1, g.blocks);
  const std::vector<int> prompt = ScalePrompt(config, g.prompt);
  // Each policy, then Polestar's system parts switched on one at a time (SPEC §7: each a
  // switch, its step time and memory measured).
  std::vector<std::pair<std::string, DecodeOptions>> variants;
  for (const std::string& policy : options.policies) {
    DecodeOptions o = options.base;
    o.policy = policy;
    variants.emplace_back(policy, o);
    if (policy != "polestar" || config.sampler == SamplerFamily::kLlada2) continue;
    o.nvfp4_hidden = true;
    variants.emplace_back("polestar +nvfp4", o);
    o.offload_residuals = true;
    variants.emplace_back("polestar +nvfp4 +offload", o);
    o.nvfp4_hidden = o.offload_residuals = false;
    o.overlap = true;
    variants.emplace_back("polestar +overlap", o);
  }
  const Backend& backend = model.backend();
  std::vector<ForcedRun> runs;
  for (auto& [name, o] : variants) {
    if (options.progress) std::fprintf(stderr, "  %s\n", name.c_str());
    ForcedRun run;
    run.policy = name;
    o.threshold.reset();
    o.factor = options.tokens_per_step + 1;
    o.steps = o.gen_length;
    o.temperature = 0;
    run.nfe_expected = blocks * ForcedStepsPerBlock(g.block, options.tokens_per_step);
    if (config.sampler == SamplerFamily::kLlada2) {
      // LLaDA 2.x's sampler has no factor rule; with a threshold of 1 (never met) its fixed
      // schedule alone commits B / steps tokens a step.
      o.factor.reset();
      o.threshold = 1.0;
      o.steps = std::max(1, g.block / options.tokens_per_step);
      run.nfe_expected = blocks * o.steps;
    }
    if (options.max_steps > 0) run.nfe_expected = std::min(run.nfe_expected, options.max_steps);
    std::vector<double> stamps;  // seconds since start after each step
    std::vector<int> block_of;   // block of each step
    const int masks_at_stop = o.gen_length - blocks * g.block;
    const double started = ClockSeconds(options.clock);
    auto on_step = [&](const StepEvent& e) {
      stamps.push_back(ClockSeconds(options.clock) - started);
      block_of.push_back(e.block_index);
      return e.masks_left > masks_at_stop &&
             (options.max_steps <= 0 || int(stamps.size()) < options.max_steps);
    };
    try {
      backend.Synchronize();  // the frees of the run before are counted out
      backend.ResetMemoryPeak();
      const GenerationResult r = Generate(model, prompt, o, on_step, true);
      run.memory = backend.Memory();
      run.nfe = r.nfe;
      run.seconds = stamps.empty() ? 0 : stamps.back();
      run.rows_computed = r.rows_computed;
      for (int t : r.generated) run.tokens += t != config.mask_id;
      std::vector<double> start_times, step_times;
      std::map<std::string, std::vector<double>> kinds;
      for (size_t i = 0; i < stamps.size(); ++i) {
        const double dt = stamps[i] - (i ? stamps[i - 1] : 0.0);
        const bool starts_block = i == 0 || block_of[i] != block_of[i - 1];
        (starts_block ? start_times : step_times).push_back(dt);
        kinds[i < r.trace.size() ? r.trace[i]["kind"].get<std::string>() : "?"].push_back(dt);
      }
      run.start_seconds = Median(start_times);
      run.step_seconds = Median(step_times);
      run.step_kinds = nlohmann::json::object();
      for (const auto& [kind, times] : kinds) {
        run.step_kinds[kind] = {{"count", times.size()}, {"median_seconds", Median(times)}};
      }
      run.transfers = TransfersJson(r.step_kinds, r.step_transfers);
    } catch (const Error& e) {
      run.error = e.what();
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

double ProjectSeconds(const std::string& policy, double tpf, const ScaleOptions& options,
                      const std::vector<StepTiming>& steps, const ForcedRun* forced) {
  const Geometry g = GeometryOf(options);
  const double per_block = std::max(1.0, double(g.block) / std::max(tpf, 1e-9));  // s
  const double n = g.blocks;
  auto t = [&](const std::string& kind) {
    const StepTiming* s = FindStep(steps, kind);
    return s ? s->Median() : -1.0;
  };
  const double full = t(step_kind::kFullPass);
  if (policy == "vanilla" && t(step_kind::kBlockStep) >= 0)  // LLaDA 2.x: block by block, cached
    return n * (t(step_kind::kBlockStart) + (per_block - 1) * t(step_kind::kBlockStep));
  if (policy == "vanilla" && full >= 0) return n * per_block * full;
  if (policy == "fast-dllm-prefix" && full >= 0)
    return n * (full + (per_block - 1) * t(step_kind::kPrefixStep));
  if (policy == "fast-dllm-dual" && full >= 0)
    return n * (full + (per_block - 1) * t(step_kind::kDualStep));
  if (policy == "elastic-cache" && full >= 0)  // its plain steps, no refresh priced
    return n * (full + (per_block - 1) * StepPrice(step_kind::kElasticStep, steps));
  if (policy == "polestar" && full >= 0 && t(step_kind::Refresh(options.base.topk_clusters)) >= 0) {
    const int period = options.base.full_refresh_period;
    double starts = 0;
    for (int b = 0; b < g.blocks; ++b) {
      starts += b > 0 && b % period == period - 1 ? t(step_kind::kWindowedPass) : full;
    }
    const double step = t(step_kind::Refresh(options.base.topk_clusters)) + t(kProxyTiming);
    return starts + n * (t(kKMeansTiming) + (per_block - 1) * step);
  }
  if (forced != nullptr && forced->error.empty() && forced->nfe > 0) {
    return n * (forced->start_seconds + (per_block - 1) * forced->step_seconds);
  }
  return -1;
}

namespace {

// The random checkpoint of options.like at `layer_scale` (written to `dir`, or to its default
// folder when `dir` is empty, unless already there), or its GGUF conversion of
// options.gguf_type, loaded; *model_path is what was loaded.
std::unique_ptr<Model> LoadRandomModel(const ScaleOptions& options, double layer_scale,
                                       std::string& dir, std::string* model_path) {
  const ModelShape shape = ScaledShape(ShapeByName(options.like), layer_scale);
  if (dir.empty()) dir = (fs::path("/tmp") / ("polestar-random-" + shape.name)).string();
  if (!fs::exists(fs::path(dir) / "config.json")) {
    if (options.progress)
      std::fprintf(stderr, "writing a random %s checkpoint to %s ...\n", shape.name.c_str(),
                   dir.c_str());
    RandomModelOptions random;
    random.shape = ShapeByName(options.like);
    random.scale = layer_scale;
    WriteRandomModel(dir, random);
  }
  *model_path = dir;
  if (!options.gguf_type.empty()) {
    *model_path = dir + "-" + options.gguf_type + ".gguf";
    const GgufFileType type = ParseGgufFileType(options.gguf_type);
    if (!fs::exists(*model_path)) {
      if (options.progress) std::fprintf(stderr, "converting it to %s ...\n", model_path->c_str());
      ConvertToGguf(dir, *model_path, type);
    }
  }
  std::unique_ptr<Model> model = Model::Load(*model_path);
  if (options.backend != nullptr) model->UseBackend(*options.backend);
  return model;
}

// The step-mix projection: each policy's forwards per block by kind in its suite row, priced
// by the step timings, with tokens/s over all positions and the ratio to Fast-dLLM dual's.
std::string StepMixSection(const ScaleOptions& options, const std::vector<StepTiming>& steps,
                           const std::map<std::string, nlohmann::json>& suite_rows,
                           nlohmann::ordered_json& out) {
  std::map<std::string, std::map<std::string, double>> mixes;
  std::string skipped;
  for (const auto& [policy, row] : suite_rows) {
    // Forwards per block carry over to another canvas only at the same block length.
    if (row.at("options").at("block_length").get<int>() != options.base.EffectiveBlockLength()) {
      skipped += (skipped.empty() ? "" : ", ") + policy;
      continue;
    }
    std::map<std::string, double> mix = StepsPerBlock(row);
    if (!mix.empty()) mixes[policy] = std::move(mix);
  }
  if (!skipped.empty() && mixes.empty()) {
    return "\nNo step-mix projection: the rows of " + options.tpf_from + " (" + skipped +
           ") decoded with another block length.\n";
  }
  if (mixes.empty()) return "";
  const int gen = options.base.gen_length, blocks = options.base.BlockCount();
  double dual_seconds = -1;
  if (mixes.count("fast-dllm-dual"))
    dual_seconds = ProjectStepMixSeconds("fast-dllm-dual", mixes["fast-dllm-dual"], options, steps);
  std::string md = "\nProjected with each policy's own step mix in " + options.tpf_from +
                   " (forwards per block by kind, over " + std::to_string(blocks) +
                   " blocks):\n\n| policy | forwards per block | NFE | TPF all | seconds | TPS all "
                   "| TPS / fast-dllm-dual |\n|---|---|--:|--:|--:|--:|--:|\n";
  out["step_mix_projection"] = nlohmann::json::array();
  for (const std::string& policy : options.policies) {
    if (!mixes.count(policy)) continue;
    const std::map<std::string, double>& mix = mixes[policy];
    const double seconds = ProjectStepMixSeconds(policy, mix, options, steps);
    if (seconds <= 0) continue;
    double per_block = 0;
    std::string kinds;
    for (const auto& [kind, count] : mix) {
      per_block += count;
      kinds += (kinds.empty() ? "" : ", ") + Fixed(count, 2) + " " + kind;
    }
    const double nfe = per_block * blocks;
    const double ratio = dual_seconds > 0 ? dual_seconds / seconds : 0;
    md += "| " + policy + " | " + kinds + " | " + Fixed(nfe, 1) + " | " + Fixed(gen / nfe, 2) +
          " | " + Fixed(seconds, 1) + " | " + Fixed(gen / seconds, 2) + " | " +
          (ratio > 0 ? Fixed(ratio, 2) : "-") + " |\n";
    out["step_mix_projection"].push_back({{"policy", policy},
                                          {"steps_per_block", mix},
                                          {"nfe", nfe},
                                          {"seconds", seconds},
                                          {"tps_all_positions", gen / seconds},
                                          {"tps_ratio_to_fast_dllm_dual", ratio}});
  }
  md +=
      "\nPrices: each kind's step time above; an Elastic-Cache step as a dual-cache step, its "
      "refresh from layer l of L as l/L of a dual-cache step plus the rest of a full pass; "
      "Polestar's proxy attention on each refresh step and its k-means once a block.\n";
  return md;
}

// The projection at the paper's TPF values, with the TPS ratios to Fast-dLLM dual next to the
// paper's own.
std::string PaperSection(const ScaleOptions& options, const std::vector<StepTiming>& steps,
                         nlohmann::ordered_json& out) {
  const std::span<const PaperRow> rows = PaperGsm8kRows();
  auto paper = [&](const std::string& policy) -> const PaperRow& {
    for (const PaperRow& r : rows) {
      if (policy == r.policy) return r;
    }
    Fail("no paper row for ", policy);
  };
  const int gen = options.base.gen_length;
  const double dual_seconds =
      ProjectSeconds("fast-dllm-dual", paper("fast-dllm-dual").tpf, options, steps, nullptr);
  std::string md =
      "\nProjected at the paper's TPF (LLaDA-8B-Instruct, GSM8K 5-shot, gen 256: Polestar's "
      "Table 1; TPF taken over all " +
      std::to_string(gen) +
      " positions):\n\n| policy | paper TPF | seconds | TPS | TPS / fast-dllm-dual | paper TPS "
      "| paper TPS / fast-dllm |\n|---|--:|--:|--:|--:|--:|--:|\n";
  out["paper_projection"] = nlohmann::json::array();
  for (const PaperRow& r : rows) {
    const double seconds = ProjectSeconds(r.policy, r.tpf, options, steps, nullptr);
    if (seconds <= 0) continue;
    const double ratio = dual_seconds / seconds;
    const double paper_ratio = r.tps / paper("fast-dllm-dual").tps;
    md += std::string("| ") + r.policy + " | " + Fixed(r.tpf, 2) + " | " + Fixed(seconds, 1) +
          " | " + Fixed(gen / seconds, 2) + " | " + Fixed(ratio, 2) + " | " + Fixed(r.tps, 2) +
          " | " + Fixed(paper_ratio, 2) + " |\n";
    out["paper_projection"].push_back({{"policy", r.policy},
                                       {"paper_tpf", r.tpf},
                                       {"seconds", seconds},
                                       {"tps_all_positions", gen / seconds},
                                       {"tps_ratio_to_fast_dllm_dual", ratio},
                                       {"paper_tps", r.tps},
                                       {"paper_tps_ratio", paper_ratio}});
  }
  md += "\nCost model as above: Polestar refreshes on every in-block step (k = " +
        std::to_string(options.base.topk_clusters) +
        ") with a windowed pass at every 4th block start; Elastic-Cache's steps are priced "
        "as dual-cache steps (no refreshes).\n";
  return md;
}

// Each forced run's bytes between host and backend per step, by kind of step: what a device
// backend would move across its bus (the plan in; logits, hook rows and drift results out).
std::string ForcedTransfersTable(const std::vector<ForcedRun>& forced) {
  std::string md =
      "\nBytes between host and backend per step of the forced runs, by kind (the mean over "
      "its steps; KB = 10^3 bytes):\n\n| policy | step | steps | KB to host per step | KB to "
      "backend per step |\n|---|---|--:|--:|--:|\n";
  for (const ForcedRun& r : forced) {
    if (!r.error.empty()) continue;
    for (const auto& [kind, entry] : r.transfers.items()) {
      md += "| " + r.policy + " | " + kind + " | " + std::to_string(entry["steps"].get<int64_t>()) +
            " | " + Kb(entry["bytes_to_host_per_step"].get<double>()) + " | " +
            Kb(entry["bytes_to_backend_per_step"].get<double>()) + " |\n";
    }
  }
  return md;
}

}  // namespace

nlohmann::json RunScaleBenchmark(const ScaleOptions& requested, const MachineInfo& machine) {
  ScaleOptions options = requested;
  if (options.reps < 1) Fail("--reps must be at least 1");
  if (options.tokens_per_step < 1) Fail("--tokens-per-step must be at least 1");
  const ModelShape shape = ScaledShape(ShapeByName(options.like), options.layer_scale);
  PromptLengths prompt_lengths;
  if (!options.prompt_suite.empty()) {
    if (options.prompt_tokenizer.empty())
      Fail("--prompt-suite needs --prompt-tokenizer (a folder with tokenizer.json)");
    prompt_lengths =
        SuitePromptLengths(options.prompt_suite, options.prompt_tokenizer, options.data_dir);
    options.prompt_length = int(std::lround(prompt_lengths.mean));
  }
  if (!options.fit_layers.empty()) {
    const std::vector<int>& fit = options.fit_layers;
    if (fit.size() != 2 || fit[0] < 1 || fit[0] >= fit[1] || fit[1] > shape.layers)
      Fail("--fit-layers takes two layer counts a < b up to the shape's ", shape.layers);
    if (!options.model_dir.empty())
      Fail("--fit-layers writes its own checkpoints; drop --random-model");
  }
  // The peak from here on is the model's weights as the steps touch them (a GGUF file is
  // mapped, so only what the steps read becomes resident) plus the decoding buffers.
  ResetPeakRss();
  std::string model_path;
  std::unique_ptr<Model> model;
  std::vector<StepTiming> steps;
  std::vector<ForcedRun> forced;
  double parameters = 0;
  std::vector<std::vector<StepTiming>> timed;  // --fit-layers: the steps at each layer count
  if (options.fit_layers.empty()) {
    model = LoadRandomModel(options, options.layer_scale, options.model_dir, &model_path);
    if (options.progress)
      std::fprintf(stderr, "timing steps on %s (%d layers, width %d) ...\n",
                   options.model_dir.c_str(), model->config().layers, model->config().width);
    steps = TimeSteps(*model, options);
    if (options.progress)
      std::fprintf(stderr, "forced schedule (%d tokens/step, %d blocks) ...\n",
                   options.tokens_per_step, options.blocks);
    forced = RunForcedSchedule(*model, options);
    parameters = double(model->ParameterCount());
  } else {
    // Every layer of a dense shape costs the same, so two layer counts give each step's
    // per-layer and fixed parts.
    std::vector<int64_t> counts;  // parameters at each layer count
    for (int layers : options.fit_layers) {
      model.reset();
      options.model_dir.clear();
      model = LoadRandomModel(options, double(layers) / ShapeByName(options.like).layers,
                              options.model_dir, &model_path);
      if (options.progress)
        std::fprintf(stderr, "timing steps on %s (%d layers, width %d) ...\n",
                     options.model_dir.c_str(), model->config().layers, model->config().width);
      timed.push_back(TimeSteps(*model, options));
      counts.push_back(model->ParameterCount());
    }
    const int a = options.fit_layers[0], b = options.fit_layers[1];
    parameters = double(counts[1]) +
                 double(shape.layers - b) * double(counts[1] - counts[0]) / double(b - a);
    steps = ExtrapolateLayers(timed[0], a, timed[1], b, shape.layers);
  }
  const ModelConfig& config = model->config();
  const int layers = options.fit_layers.empty() ? config.layers : shape.layers;

  // TPF per policy from a suite run: its row with default settings, else its first row.
  std::map<std::string, ResultRow> from_suite;
  std::map<std::string, nlohmann::json> suite_rows;  // the same rows as written
  if (!options.tpf_from.empty()) {
    std::ifstream in(options.tpf_from);
    if (!in) Fail(options.tpf_from, ": cannot read");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("policy")) continue;
      const ResultRow row = ResultRow::FromJson(j);
      if (!from_suite.count(row.policy) || row.settings == "defaults") {
        from_suite[row.policy] = row;
        suite_rows[row.policy] = j;
      }
    }
  }

  const Geometry g = GeometryOf(options);
  const StepTiming* full = FindStep(steps, step_kind::kFullPass);
  // The routed experts' weights: all of them (the file holds them), and one expert's, which
  // a step reads once a layer for every expert its rows chose (the floors' bytes).
  int64_t routed_expert_bytes = 0, expert_bytes = 0;
  for (int l = 0; l < config.layers; ++l) {
    for (const SwiGluWeights& e : model->layer(l).experts) {
      expert_bytes = e.gate.Bytes() + e.up.Bytes() + e.down.Bytes();
      routed_expert_bytes += expert_bytes;
    }
  }
  // --fit-layers loaded fewer layers than the shape's; the ones it extrapolates to are
  // mixture layers (a shape's dense layers come first).
  routed_expert_bytes += int64_t(layers - config.layers) * config.moe.experts * expert_bytes;
  nlohmann::ordered_json out;
  out["machine"] = machine.ToJson();
  const int64_t peak_rss = PeakRssBytes();
  out["model"] = {{"folder", options.model_dir},
                  {"file", model_path},
                  {"file_bytes", ModelFileBytes(model_path)},
                  {"peak_rss_bytes", peak_rss},
                  {"experts", config.moe.experts},
                  {"experts_per_token", config.moe.experts_per_token},
                  {"expert_ffn", config.moe.expert_ffn},
                  {"routed_expert_bytes", routed_expert_bytes},
                  {"expert_bytes", expert_bytes},
                  {"like", options.like},
                  {"layer_scale", options.layer_scale},
                  {"layers", layers},
                  {"layers_timed", options.fit_layers.empty() ? std::vector<int>{config.layers}
                                                              : options.fit_layers},
                  {"width", config.width},
                  {"ffn", config.ffn},
                  {"heads", config.heads},
                  {"kv_heads", config.kv_heads},
                  {"vocab", config.vocab},
                  {"parameters", parameters},
                  {"backend", model->backend().name()}};
  out["canvas"] = {
      {"prompt", g.prompt}, {"gen_length", options.base.gen_length}, {"block_length", g.block}};
  if (!options.prompt_suite.empty()) {
    out["canvas"]["prompt_from"] = {
        {"suite", options.prompt_suite}, {"tokenizer", options.prompt_tokenizer},
        {"items", prompt_lengths.items}, {"min", prompt_lengths.min},
        {"mean", prompt_lengths.mean},   {"max", prompt_lengths.max}};
  }
  out["reps"] = options.reps;
  out["clock"] = ClockName(options.clock);
  std::string md = "### Scale benchmark: " + shape.name + " (random weights, " +
                   std::to_string(layers) + " layers, width " + std::to_string(config.width) +
                   ", " + Fixed(parameters / 1e9, 2) + " B parameters)\n\n";
  md += "Command: `" + machine.command + "`  \nMachine: " + machine.Summary() + "; backend " +
        std::string(model->backend().name()) + "\n\n";
  if (config.moe.experts > 0) {
    md += "Mixture of experts: " + std::to_string(config.moe.experts) + " experts of width " +
          std::to_string(config.moe.expert_ffn) + ", " +
          std::to_string(config.moe.experts_per_token) + " per token.\n\n";
  }
  md += "Weights: " + model_path + " (" + Fixed(double(ModelFileBytes(model_path)) / 1e9, 2) +
        " GB); peak resident set over the run " + Fixed(double(peak_rss) / 1e9, 2) + " GB.\n\n";
  md += "Canvas: prompt " + std::to_string(g.prompt) + " + gen length " +
        std::to_string(options.base.gen_length) + ", block " + std::to_string(g.block) +
        "; median of " + std::to_string(options.reps) + " reps; " +
        (options.clock == Clock::kCpu ? "process CPU time" : "wall-clock time") + ".\n\n";
  if (!options.prompt_suite.empty()) {
    md += "Prompt: the mean token length of the " + std::to_string(prompt_lengths.items) + " " +
          options.prompt_suite + " prompts (as lm-eval builds them, no chat template) under " +
          options.prompt_tokenizer + "'s tokenizer: " + Fixed(prompt_lengths.mean, 1) + " (" +
          std::to_string(prompt_lengths.min) + " to " + std::to_string(prompt_lengths.max) +
          ").\n\n";
  }
  if (!options.fit_layers.empty()) {
    md += "Layers: every step timed at " + std::to_string(options.fit_layers[0]) + " and " +
          std::to_string(options.fit_layers[1]) +
          " layers of the shape and extrapolated linearly to " + std::to_string(layers) +
          " (t(L) = t(a) + (L - a) (t(b) - t(a)) / (b - a)); no forced runs.\n\n";
  }
  md +=
      "| step | rows computed | ms | µs per row | time / full | rows / full | KB to host | KB "
      "to backend |" +
      (timed.empty() ? std::string()
                     : " ms at " + std::to_string(options.fit_layers[0]) + " / " +
                           std::to_string(options.fit_layers[1]) + " layers |") +
      "\n|---|--:|--:|--:|--:|--:|--:|--:|" + (timed.empty() ? "" : "--:|") + "\n";
  out["steps"] = nlohmann::json::array();
  for (const StepTiming& s : steps) {
    const double ms = 1e3 * s.Median();
    const bool has_rows = s.rows_computed > 0;
    std::string measured;  // the timings the extrapolation started from
    nlohmann::json measured_json = nlohmann::json::array();
    for (const std::vector<StepTiming>& at : timed) {
      const StepTiming* t = FindStep(at, s.kind);
      const double seconds = t != nullptr ? t->Median() : 0;
      measured += (measured.empty() ? " " : " / ") + Fixed(1e3 * seconds, 1);
      measured_json.push_back(seconds);
    }
    if (!timed.empty()) measured += " |";
    md += "| " + s.kind + " | " + (has_rows ? std::to_string(s.rows_computed) : "-") + " | " +
          Fixed(ms, 1) + " | " +
          (has_rows ? Fixed(1e6 * s.Median() / double(s.rows_computed), 1) : "-") + " | " +
          Fixed(s.Median() / full->Median(), 3) + " | " +
          (has_rows ? Fixed(double(s.rows_computed) / double(full->rows_computed), 3) : "-") +
          " | " + Kb(double(s.transfers.to_host)) + " | " + Kb(double(s.transfers.to_backend)) +
          " |" + measured + "\n";
    out["steps"].push_back({{"kind", s.kind},
                            {"rows_computed", s.rows_computed},
                            {"median_seconds", s.Median()},
                            {"seconds", s.seconds},
                            {"bytes_to_backend", s.transfers.to_backend},
                            {"bytes_to_host", s.transfers.to_host}});
    if (config.moe.experts > 0) out["steps"].back()["experts_read"] = s.experts_read;
    if (!timed.empty()) out["steps"].back()["seconds_at_fit_layers"] = measured_json;
  }

  out["forced"] = nlohmann::json::array();
  if (!forced.empty()) {
    md += "\nForced commit schedule: " + std::to_string(options.tokens_per_step) +
          " tokens per step, block 0";
    if (options.blocks > 1)
      md += " to " + std::to_string(std::clamp(options.blocks, 1, g.blocks) - 1);
    if (options.max_steps > 0) md += ", at most " + std::to_string(options.max_steps) + " steps";
    md +=
        ". Backend memory: the most the backend held during the run, in its own memory and "
        "offloaded (Polestar's NVFP4 store with +offload), where it counts them (a GPU's).\n\n"
        "| policy | NFE (schedule) | tokens | seconds | tokens/s | block start ms | step ms | "
        "backend MB | offloaded MB | steps by kind |\n";
    md += "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n";
    auto megabytes = [](int64_t bytes) {
      return bytes < 0 ? std::string("-") : Fixed(double(bytes) / double(1 << 20), 0);
    };
    for (const ForcedRun& r : forced) {
      if (!r.error.empty()) {
        md += "| " + r.policy + " | not run: " + r.error + " |||||||||\n";
        out["forced"].push_back({{"policy", r.policy}, {"error", r.error}});
        continue;
      }
      std::string kinds;
      for (const auto& [kind, entry] : r.step_kinds.items()) {
        kinds += (kinds.empty() ? "" : ", ") + kind + " " +
                 std::to_string(entry["count"].get<int>()) + " x " +
                 Fixed(1e3 * entry["median_seconds"].get<double>(), 0) + " ms";
      }
      md += "| " + r.policy + " | " + std::to_string(r.nfe) + " (" +
            std::to_string(r.nfe_expected) + ") | " + std::to_string(r.tokens) + " | " +
            Fixed(r.seconds, 2) + " | " + Fixed(r.tokens / r.seconds, 2) + " | " +
            Fixed(1e3 * r.start_seconds, 0) + " | " + Fixed(1e3 * r.step_seconds, 0) + " | " +
            megabytes(r.memory.peak) + " | " + megabytes(r.memory.offloaded_peak) + " | " + kinds +
            " |\n";
      out["forced"].push_back({{"policy", r.policy},
                               {"nfe", r.nfe},
                               {"nfe_expected", r.nfe_expected},
                               {"tokens", r.tokens},
                               {"seconds", r.seconds},
                               {"rows_computed", r.rows_computed},
                               {"tokens_per_second", r.tokens / r.seconds},
                               {"block_start_seconds", r.start_seconds},
                               {"step_seconds", r.step_seconds},
                               {"step_kinds", r.step_kinds},
                               {"backend_peak_bytes", r.memory.peak},
                               {"offloaded_peak_bytes", r.memory.offloaded_peak},
                               {"transfers", r.transfers}});
    }
    md += ForcedTransfersTable(forced);
  }
  md += "\nProjected tokens/s for a whole generation (" + std::to_string(options.base.gen_length) +
        " tokens, block " + std::to_string(g.block) + ")";
  md += options.tpf_from.empty() ? " at the forced TPF"
                                 : " at the TPF each policy reached in " + options.tpf_from;
  md +=
      ":\n\n| policy | TPF all | TPF until EOS | TPF non-EOS | seconds | TPS until EOS | TPS "
      "non-EOS |\n";
  md += "|---|--:|--:|--:|--:|--:|--:|\n";
  out["projection"] = nlohmann::json::array();
  for (const std::string& policy : options.policies) {
    const ForcedRun* run = nullptr;
    for (const ForcedRun& r : forced) {
      if (r.policy == policy) run = &r;
    }
    double tpf_all = options.tokens_per_step, tpf_eos = tpf_all, tpf_non_eos = tpf_all;
    if (!options.tpf_from.empty()) {
      if (!from_suite.count(policy)) continue;
      tpf_all = from_suite[policy].tpf_all;
      tpf_eos = from_suite[policy].tpf_until_eos;
      tpf_non_eos = from_suite[policy].tpf_non_eos;
    }
    const double seconds = ProjectSeconds(policy, tpf_all, options, steps, run);
    if (seconds <= 0) continue;
    const double nfe = double(options.base.gen_length) / tpf_all;
    md += "| " + policy + " | " + Fixed(tpf_all, 2) + " | " + Fixed(tpf_eos, 2) + " | " +
          Fixed(tpf_non_eos, 2) + " | " + Fixed(seconds, 1) + " | " +
          Fixed(tpf_eos * nfe / seconds, 2) + " | " + Fixed(tpf_non_eos * nfe / seconds, 2) +
          " |\n";
    out["projection"].push_back({{"policy", policy},
                                 {"tpf_all", tpf_all},
                                 {"tpf_until_eos", tpf_eos},
                                 {"tpf_non_eos", tpf_non_eos},
                                 {"seconds", seconds},
                                 {"tps_until_eos", tpf_eos * nfe / seconds},
                                 {"tps_non_eos", tpf_non_eos * nfe / seconds}});
  }
  md +=
      "\nProjection: cost model of bench/README.md from the step timings above (Polestar refreshes "
      "every "
      "step, as its trigger does when more than one token commits a step); policies without a "
      "model use "
      "their forced run's block-start and step times.\n";
  md += StepMixSection(options, steps, suite_rows, out);
  if (options.paper) md += PaperSection(options, steps, out);
  std::printf("%s", md.c_str());
  if (!options.out_dir.empty()) {
    fs::create_directories(options.out_dir);
    WriteFileAtomically((fs::path(options.out_dir) / "scale.json").string(), out.dump(2) + "\n");
    WriteFileAtomically((fs::path(options.out_dir) / "scale.md").string(), md);
  }
  return out;
}

}  // namespace polestar::bench
