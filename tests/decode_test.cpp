// Decoding: every reference run of the fixtures through `polestar generate --json`, the
// commit rules and schedules against hand-computed cases, and the standing equivalence of
// cached policies told to refresh everything with vanilla.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "backend/registry.h"
#include "base/error.h"
#include "decode/generate.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"
#include "decode/sampling.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "test_support.h"

namespace polestar {
namespace {

std::string Join(const std::vector<int>& ids) {
  std::string s;
  // Appended piece by piece: gcc 12 -O3 warns (-Wrestrict, falsely) on "," + std::string.
  for (int id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

// Sets (or, for nullptr, unsets) an environment variable for its lifetime.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    if (before != nullptr) before_ = before;
    Set(value);
  }
  ~ScopedEnvironment() { Set(before_ ? before_->c_str() : nullptr); }

 private:
  void Set(const char* value) {
    if (value != nullptr) {
      setenv(name_, value, 1);
    } else {
      unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> before_;
};

// Command-line flags that reproduce one run of expected.json.
std::string RunFlags(const std::string& run, const nlohmann::json& p) {
  std::string policy = "vanilla";
  if (run.rfind("prefix", 0) == 0) policy = "fast-dllm-prefix";
  if (run.rfind("dual", 0) == 0) policy = "fast-dllm-dual";
  std::string flags = " --policy " + policy + " --gen-length " +
                      std::to_string(p["gen_length"].get<int>()) + " --steps " +
                      std::to_string(p["steps"].get<int>()) + " --block-length " +
                      std::to_string(p.value("block_length", 0));
  if (p.contains("threshold") && !p["threshold"].is_null()) {
    flags += " --threshold " + std::to_string(p["threshold"].get<double>());
  }
  if (p.value("eos_early_stop", false)) flags += " --eos-early-stop";
  if (p.contains("alg"))
    flags += " --alg " + p["alg"].get<std::string>() + " --eps " +
             std::to_string(p["eps"].get<double>());
  return flags;
}

TEST(FixtureDecode, EveryReferenceRunIsReproducedThroughTheCli) {
  int runs = 0;
  for (const char* fixture :
       {"llada-tiny", "llada-tiny-bf16", "llada-c", "dream-tiny", "gguf-llada-q8_0",
        "gguf-llada-f16", "gguf-llada-q4_k_m", "gguf-dream-q8_0", "lladamoe-a", "lladamoe-b",
        "lladamoe-d", "llada2-a", "llada2-b"}) {
    const std::string dir = testing::FixtureDir(fixture);
    // GGUF fixtures hold model.gguf; the reference ran on its dequantised (or, for BF16,
    // widened) weights, which the engine follows exactly with fp32 activations (the child
    // processes inherit the setting; this process's own backend was fixed when first used).
    const bool gguf = std::string(fixture).rfind("gguf-", 0) == 0;
    const bool bf16 = std::string(fixture).ends_with("-bf16");
    const std::string model = gguf ? dir + "/model.gguf" : dir;
    ScopedEnvironment activations("POLESTAR_ACTIVATIONS", gguf || bf16 ? "f32" : nullptr);
    const nlohmann::json expected = ReadJsonFile(dir + "/expected.json");
    TensorStore tensors;
    ReadSafetensorsFile(dir + "/expected.safetensors", tensors);
    const std::vector<int> prompt = testing::ToInts(tensors.Get("prompt"));
    for (const auto& [run, params] : expected["runs"].items()) {
      SCOPED_TRACE(std::string(fixture) + " " + run);
      std::string out;
      ASSERT_EQ(testing::RunCli("generate -t 1 -m " + model + " --prompt-ids " + Join(prompt) +
                                    " --json" + RunFlags(run, params),
                                &out),
                0);
      const nlohmann::json got = nlohmann::json::parse(out);
      EXPECT_EQ(got["tokens"].get<std::vector<int>>(),
                testing::ToInts(tensors.Get(run + ".tokens")));
      if (params.contains("nfe")) {
        EXPECT_EQ(got["nfe"].get<int>(), params["nfe"].get<int>());
      }
      ++runs;
    }
  }
  EXPECT_EQ(runs, 54);
}

// LLaDA 2.x's block diffusion, step by step: the reference records the window of every
// forward, so the tokens each step commits are the difference of consecutive windows. The
// engine computes each finished block's K/V once (at the next block's first step), yet it
// commits exactly those tokens at exactly those steps, and what generate returns (cut after
// the first end token); recomputing the whole window every step (refresh_all) is the same.
TEST(BlockDiffusionDecode, CommitsWhatTheReferenceCommitsAtEveryStep) {
  int runs = 0;
  for (const char* fixture : {"llada2-a", "llada2-b"}) {
    const std::string dir = testing::FixtureDir(fixture);
    auto model = Model::Load(dir);
    const nlohmann::json expected = ReadJsonFile(dir + "/expected.json");
    TensorStore tensors;
    ReadSafetensorsFile(dir + "/expected.safetensors", tensors);
    const std::vector<int> prompt = testing::ToInts(tensors.Get("prompt"));
    for (const auto& [run, p] : expected["runs"].items()) {
      SCOPED_TRACE(std::string(fixture) + " " + run);
      DecodeOptions options;
      options.gen_length = p["gen_length"];
      options.block_length = p["block_length"];
      options.steps = p["steps"];
      options.threshold = p["threshold"].get<double>();
      options.eos_early_stop = p["eos_early_stop"];
      const GenerationResult got = Generate(*model, prompt, options, nullptr, true);
      const std::vector<int> windows = testing::ToInts(tensors.Get(run + ".inputs"));  // [nfe, T]
      const int nfe = p["nfe"];
      ASSERT_EQ(got.nfe, nfe);
      ASSERT_EQ(got.trace.size(), size_t(nfe));
      const std::vector<std::vector<int>> commits = testing::ReferenceCommits(windows, nfe);
      for (size_t step = 0; step < commits.size(); ++step) {
        EXPECT_EQ(got.trace[step]["committed"].get<std::vector<int>>(), commits[step])
            << "step " << step;
      }
      EXPECT_EQ(got.tokens, testing::ToInts(tensors.Get(run + ".tokens")));
      std::vector<int> answer = got.generated;
      const auto end = std::find(answer.begin(), answer.end(), model->config().eos_id);
      if (end != answer.end()) answer.erase(end + 1, answer.end());
      EXPECT_EQ(answer, testing::ToInts(tensors.Get(run + ".answer")));

      // Polestar without its early commits is the same sampler, step for step.
      DecodeOptions polestar = options;
      polestar.policy = "polestar";
      polestar.early_commit = false;
      const GenerationResult commit_rule_only = Generate(*model, prompt, polestar, nullptr, true);
      EXPECT_EQ(commit_rule_only.tokens, got.tokens);
      EXPECT_EQ(commit_rule_only.nfe, got.nfe);
      EXPECT_EQ(commit_rule_only.rows_computed, got.rows_computed);
      for (size_t step = 0; step < got.trace.size(); ++step) {
        EXPECT_EQ(commit_rule_only.trace[step]["committed"], got.trace[step]["committed"]);
      }

      options.refresh_all = true;
      const GenerationResult full = Generate(*model, prompt, options, nullptr, true);
      EXPECT_EQ(full.tokens, got.tokens);
      EXPECT_EQ(full.trace, got.trace);
      EXPECT_GT(full.rows_computed, got.rows_computed);
      ++runs;
    }
  }
  EXPECT_EQ(runs, 8);
}

// Polestar-Commit inside LLaDA 2.x's blocks: on top of the sampler's rule, a masked position
// of the block commits early when its drift jump clears the gate. The jump is re-derived here
// from the trace's token drift (d_t minus the mean of the block's last w steps), every early
// commit passes the gate with it, and the early commits save forwards.
TEST(BlockDiffusionDecode, PolestarCommitAddsDriftGatedCommitsInsideTheBlock) {
  for (const char* fixture : {"llada2-a", "llada2-b"}) {
    SCOPED_TRACE(fixture);
    auto model = Model::Load(testing::FixtureDir(fixture));
    TensorStore tensors;
    ReadSafetensorsFile(testing::FixtureDir(fixture) + "/expected.safetensors", tensors);
    const std::vector<int> prompt = testing::ToInts(tensors.Get("prompt"));
    DecodeOptions options;
    options.policy = "polestar";
    options.gen_length = 64;
    options.block_length = 16;
    options.steps = 16;
    options.tau_s = 0.99;  // random weights are confident: a high bar leaves room for the gate
    const GenerationResult got = Generate(*model, prompt, options, nullptr, true);
    DecodeOptions rule_only = options;
    rule_only.early_commit = false;
    const GenerationResult without = Generate(*model, prompt, rule_only, nullptr, true);

    std::deque<std::vector<double>> history;  // the block's last w token drifts
    int block = -1, early = 0, measured = 0;
    for (const nlohmann::json& step : got.trace) {
      if (step["block"].get<int>() != block) history.clear();
      block = step["block"];
      const nlohmann::json& stats = step["policy"];
      if (!stats.contains("token_drift")) continue;
      ++measured;
      const std::vector<double> drift = stats["token_drift"];
      const std::vector<double> reported = stats["drift_delta"];
      ASSERT_EQ(drift.size(), size_t(options.block_length));
      std::vector<double> delta = drift;
      for (size_t i = 0; i < delta.size() && !history.empty(); ++i) {
        double mean = 0;
        for (const auto& past : history) mean += past[i];
        delta[i] -= mean / double(history.size());
      }
      for (size_t i = 0; i < delta.size(); ++i) EXPECT_NEAR(reported[i], delta[i], 1e-12);
      history.push_back(drift);
      if (int(history.size()) > options.drift_history) history.pop_front();

      const std::vector<int> committed = step["committed"];
      for (const nlohmann::json& commit : stats["early_commits"]) {
        const int position = commit[0];
        const double confidence = commit[1];
        const int offset = position - block * options.block_length;
        ASSERT_GE(offset, 0);
        ASSERT_LT(offset, options.block_length);
        EXPECT_NE(std::find(committed.begin(), committed.end(), position), committed.end());
        EXPECT_GT(confidence, options.early_floor);
        EXPECT_LT(confidence, options.tau_s);
        EXPECT_GE(delta[size_t(offset)], options.alpha * std::pow(options.tau_s - confidence, 2));
        EXPECT_LT(delta[size_t(offset)], options.drift_cap);
        ++early;
      }
    }
    EXPECT_GT(measured, 0);
    EXPECT_GT(early, 0);
    EXPECT_LT(got.nfe, without.nfe);
  }
}

TEST(BlockDiffusionDecode, PoliciesAndOptionsItsSamplerDoesNotReadAreRefused) {
  auto model = Model::Load(testing::FixtureDir("llada2-a"));
  const std::vector<int> prompt = {1, 2, 3};
  auto error_of = [&](auto change) {
    DecodeOptions options;
    options.gen_length = 16;
    options.block_length = 8;
    options.steps = 8;
    change(options);
    try {
      Generate(*model, prompt, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const PolicyEntry& entry : RegisteredPolicies()) {
    if (entry.block_diffusion) continue;
    EXPECT_THAT(error_of([&](DecodeOptions& o) { o.policy = entry.name; }),
                ::testing::HasSubstr("nothing stale to refresh; use vanilla (LLaDA 2.x's own "
                                     "sampler, earlier blocks cached exactly) or polestar ("));
  }
  EXPECT_THAT(error_of([](DecodeOptions& o) {
                o.policy = "polestar";
                o.nvfp4_hidden = true;
              }),
              ::testing::HasSubstr("no window to refresh"));
  EXPECT_THAT(error_of([](DecodeOptions& o) {
                o.policy = "polestar";
                o.overlap = true;
              }),
              ::testing::HasSubstr("no window to refresh"));
  EXPECT_EQ(error_of([](DecodeOptions& o) { o.policy = "polestar"; }), "");
  EXPECT_THAT(error_of([](DecodeOptions& o) { o.block_length = 0; }),
              ::testing::HasSubstr("decodes block by block"));
  EXPECT_THAT(error_of([](DecodeOptions& o) { o.factor = 1.0; }),
              ::testing::HasSubstr("does not apply to llada2's sampler"));
  EXPECT_THAT(error_of([](DecodeOptions& o) { o.cfg_scale = 1.0; }),
              ::testing::HasSubstr("does not apply to llada2's sampler"));
  EXPECT_EQ(error_of([](DecodeOptions&) {}), "");
}

// On the other models eos_early_stop is an opt-in variable length: decoding ends at the step
// that commits an end token with nothing masked before it, and until then is the run without.
TEST(EosEarlyStop, EndsAtTheFirstCompleteAnswerAndChangesNothingBefore) {
  // The bundled model answers "ab+cd=" in a few tokens and pads with end tokens.
  auto model = Model::Load(testing::SourceDir() + "/models/polestar-tiny");
  const ModelConfig& config = model->config();
  int stopped = 0;
  for (int seed = 0; seed < 6; ++seed) {
    // <|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{a}{b}+{c}{d}=<|eot_id|>
    // <|start_header_id|>assistant<|end_header_id|>\n\n, digits as their bytes.
    const std::vector<int> prompt = {555, 557,           267, 558, 10,  10,  49 + seed % 9, 50, 43,
                                     51,  52 + seed % 5, 61,  559, 557, 266, 558,           10, 10};
    DecodeOptions options;
    options.gen_length = 32;
    options.block_length = 8;
    options.steps = 32;
    options.temperature = seed < 3 ? 0.0 : 1.0;
    options.seed = uint64_t(seed);
    const GenerationResult full = Generate(*model, prompt, options, nullptr, true);
    options.eos_early_stop = true;
    const GenerationResult early = Generate(*model, prompt, options, nullptr, true);
    ASSERT_LE(early.nfe, full.nfe);
    // The same steps up to the stop.
    ASSERT_EQ(early.trace, std::vector<nlohmann::json>(full.trace.begin(),
                                                       full.trace.begin() + early.trace.size()));
    if (early.nfe == full.nfe) continue;
    ++stopped;
    const auto end = std::find_if(early.generated.begin(), early.generated.end(),
                                  [&](int t) { return IsEndToken(config, t); });
    ASSERT_NE(end, early.generated.end());
    EXPECT_EQ(std::count(early.generated.begin(), end, config.mask_id), 0);
    EXPECT_EQ(std::vector<int>(early.generated.begin(), end),
              std::vector<int>(full.generated.begin(),
                               full.generated.begin() + (end - early.generated.begin())));
  }
  EXPECT_GT(stopped, 0) << "no run committed an end token early: the test shows nothing";
}

// The commit trace with the steps that committed nothing left out: Fast-dLLM runs one such
// step after a block-start pass that filled the block, vanilla does not.
std::vector<nlohmann::json> CommittingSteps(const GenerationResult& result) {
  std::vector<nlohmann::json> steps;
  for (const nlohmann::json& entry : result.trace) {
    if (!entry["committed"].empty()) steps.push_back(entry["committed"]);
  }
  return steps;
}

// The standing test, for every registered policy (a new one gets it by registering): told to
// refresh everything (refresh_all) and to commit by the shared rule alone, a cached policy
// reproduces vanilla under the same resolved commit rule (Polestar's default threshold is
// its tau_s): the same tokens, the same commits step by step, the same forward count.
class StandingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StandingTest, RefreshingEverythingReproducesVanilla) {
  for (const char* fixture : {"llada-tiny", "dream-tiny", "llada-c", "lladamoe-b", "llada2-a"}) {
    auto model = Model::Load(testing::FixtureDir(fixture));
    // Block diffusion refuses the cache-refresh policies (BlockDiffusionDecode checks that).
    if (model->config().sampler == SamplerFamily::kLlada2 && GetParam() != "vanilla" &&
        GetParam() != "polestar") {
      continue;
    }
    const std::vector<int> prompt = {1, 5, 9, 14, 22, 31, 40, 3};
    for (std::optional<double> threshold : {std::optional<double>(), {0.9}, {0.5}}) {
      SCOPED_TRACE(std::string(fixture) + " threshold " +
                   (threshold ? std::to_string(*threshold) : "unset"));
      DecodeOptions cached;
      cached.policy = GetParam();
      cached.gen_length = 32;
      cached.block_length = 8;
      cached.steps = 16;
      cached.threshold = threshold;
      cached.refresh_all = true;
      cached.early_commit = false;  // Polestar's commits beyond the shared rule
      cached.suffix_commit = false;
      DecodeOptions vanilla = cached.Resolved(model->config());
      vanilla.policy = "vanilla";
      const GenerationResult want = Generate(*model, prompt, vanilla, nullptr, true);
      const GenerationResult got = Generate(*model, prompt, cached, nullptr, true);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(CommittingSteps(got), CommittingSteps(want));
      const int idle_steps = int(got.trace.size() - CommittingSteps(got).size()) -
                             int(want.trace.size() - CommittingSteps(want).size());
      EXPECT_EQ(got.nfe, want.nfe + idle_steps);
      if (!MakePolicy(cached, *model)->RunsStepAfterFilledBlockStart()) {
        EXPECT_EQ(idle_steps, 0);
      }
      // Every forward is counted under its kind; refreshing everything, each is a full pass
      // (block diffusion's block-causal steps aside).
      int counted = 0;
      for (const auto& [kind, count] : got.step_kinds) counted += count;
      EXPECT_EQ(counted, got.nfe);
      if (model->config().sampler != SamplerFamily::kLlada2) {
        EXPECT_EQ(got.step_kinds, (std::map<std::string, int>{{"full pass", got.nfe}}));
      }
    }
  }
}

// Each cached policy names the kind of every step it runs, as the scale benchmark prices it.
TEST(StepKinds, CachedPoliciesNameTheStepsTheyRun) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const std::vector<int> prompt = {1, 5, 9, 14, 22, 31, 40, 3};
  for (const char* policy : {"fast-dllm-prefix", "fast-dllm-dual", "elastic-cache", "polestar"}) {
    SCOPED_TRACE(policy);
    DecodeOptions options;
    options.policy = policy;
    options.gen_length = 40;  // five blocks: Polestar's fourth starts with a windowed pass
    options.block_length = 8;
    options.steps = 40;
    const GenerationResult got = Generate(*model, prompt, options, nullptr, true);
    std::map<std::string, int> counted;
    int previous_block = -1;
    for (const nlohmann::json& step : got.trace) {
      const std::string kind = step["kind"].get<std::string>();
      const int block = step["block"].get<int>();
      const bool starts_block = block != previous_block;
      previous_block = block;
      ++counted[kind];
      if (std::string(policy) == "elastic-cache") {  // one full pass, then its window slides
        EXPECT_EQ(kind == "full pass", &step == &got.trace.front()) << kind;
        if (kind != "full pass") {
          EXPECT_TRUE(kind == "elastic-cache step" || kind.starts_with("refresh from layer "))
              << kind;
        }
        continue;
      }
      if (starts_block) {
        EXPECT_EQ(kind,
                  std::string(policy) == "polestar" && block == 3 ? "windowed pass" : "full pass");
      } else if (std::string(policy) == "polestar") {
        EXPECT_TRUE(kind == "refresh step, k=4" || kind == "dual-cache step") << kind;
      } else {
        EXPECT_EQ(kind, std::string(policy) == "fast-dllm-dual" ? "dual-cache step"
                                                                : "prefix-cache step");
      }
    }
    EXPECT_EQ(counted, got.step_kinds);
  }
}

// A step's quiet layers (no hook acting, no attention captured) replay as one recording on
// the CUDA backend once seen twice, a mixture's layers too (their routing stays on the
// device). A replay runs the recorded kernels over the same memory, so the tokens must be
// those of the same steps issued op by op, and the cached steps of every policy must replay.
// (On the CPU nothing records.)
TEST(RecordedSteps, ReplayedLayersGiveTheTokensOfStepsIssuedOpByOp) {
  struct Case {
    const char* fixture;
    const char* policy;
    const char* activations;
  };
  const Case cases[] = {
      {"llada-tiny", "fast-dllm-prefix", "reduced"}, {"llada-tiny", "fast-dllm-dual", "reduced"},
      {"llada-tiny", "fast-dllm-dual", "f32"},       {"llada-tiny", "polestar", "reduced"},
      {"dream-tiny", "fast-dllm-dual", "reduced"},   {"llada2-a", "polestar", "reduced"},
      {"lladamoe-a", "fast-dllm-dual", "reduced"},   {"lladamoe-a", "fast-dllm-dual", "f32"},
  };
  const std::vector<int> prompt = {1, 5, 9, 14, 22, 31, 40, 3};
  int ran = 0;
  for (const Case& c : cases) {
    const std::string on = std::string("cuda:activations=") + c.activations;
    const std::string off = on + ",graphs=off";
    SCOPED_TRACE(std::string(c.fixture) + " " + c.policy + " " + on);
    if (const std::string why = testing::BackendUnavailable(on); !why.empty()) {
      std::printf("backend '%s' cannot run here: %s\n", on.c_str(), why.c_str());
      continue;
    }
    auto model = Model::Load(testing::FixtureDir(c.fixture));
    DecodeOptions options;
    options.policy = c.policy;
    options.gen_length = 32;
    options.block_length = 8;
    options.steps = 32;
    // A commit a step (random weights are confident): blocks of eight steps to replay.
    options.threshold = 1.0;
    model->UseBackend(BackendNamed(off));
    const GenerationResult op_by_op = Generate(*model, prompt, options);
    model->UseBackend(BackendNamed(on));
    const GenerationResult replayed = Generate(*model, prompt, options);
    EXPECT_EQ(replayed.tokens, op_by_op.tokens);
    EXPECT_EQ(replayed.nfe, op_by_op.nfe);
    EXPECT_EQ(op_by_op.layers_replayed, 0);
    // The last layer computes only the rows still masked (the logit rows): never quiet.
    const int quiet_layers = model->config().layers - 1;
    ASSERT_GT(quiet_layers, 0);
    if (std::string(c.policy) == "fast-dllm-dual") {
      // Four blocks of eight steps: each block's dual steps replay from its third, and the full
      // passes that start blocks from the third block.
      EXPECT_EQ(replayed.nfe, 32);
      EXPECT_EQ(replayed.layers_replayed, int64_t(quiet_layers) * (4 * 5 + 2));
    } else {
      EXPECT_GT(replayed.layers_replayed, 0);
    }
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no CUDA backend here";
}

// Each logit row crosses to the host as what its sampler reads: at temperature 0 the
// backend's greedy choice (16 bytes), otherwise (sampling, guidance, Dream's top-p) its
// logits; guidance's second pass doubles them. Nothing else crosses in these steps.
TEST(Transfers, LogitRowsCrossAsChoicesUnlessASamplerReadsTheDistribution) {
  const std::vector<int> prompt = {1, 5, 9, 14};
  struct Case {
    const char* fixture;
    const char* policy;
    double temperature, cfg_scale, top_p;
    Remasking remasking;
    std::optional<DreamAlg> alg;
    int64_t bytes_per_row;  // 0: the row's logits, 4V
  } cases[] = {
      {"llada-tiny", "fast-dllm-dual", 0, 0, 1, Remasking::kLowConfidence, {}, 16},
      {"llada-tiny", "vanilla", 0, 0, 1, Remasking::kRandom, {}, 16},
      {"llada-tiny", "fast-dllm-dual", 1, 0, 1, Remasking::kLowConfidence, {}, 0},
      {"llada-tiny", "vanilla", 0, 1, 1, Remasking::kLowConfidence, {}, 0},
      {"dream-tiny", "fast-dllm-dual", 0, 0, 1, Remasking::kLowConfidence, DreamAlg::kTopkMargin,
       16},
      {"dream-tiny", "vanilla", 0, 0, 0.9, Remasking::kLowConfidence, {}, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.fixture) + " " + c.policy + " T=" + std::to_string(c.temperature) +
                 " cfg=" + std::to_string(c.cfg_scale) + " top_p=" + std::to_string(c.top_p));
    auto model = Model::Load(testing::FixtureDir(c.fixture));
    DecodeOptions options;
    options.policy = c.policy;
    options.gen_length = 16;
    options.block_length = 8;
    options.steps = 16;
    options.temperature = c.temperature;
    options.cfg_scale = c.cfg_scale;
    options.top_p = c.top_p;
    options.remasking = c.remasking;
    if (c.alg) options.alg = *c.alg;
    const GenerationResult got = Generate(*model, prompt, options, nullptr, true);
    const int64_t per_row = (c.bytes_per_row > 0 ? c.bytes_per_row : 4 * model->config().vocab) *
                            (c.cfg_scale > 0 ? 2 : 1);
    // The logit rows of a step: the block's masks before it.
    std::map<int, int> masks;  // block -> masks left
    int64_t total = 0;
    for (const nlohmann::json& step : got.trace) {
      const int block = step["block"].get<int>();
      const int before = masks.emplace(block, options.block_length).first->second;
      EXPECT_EQ(step["bytes_to_host"].get<int64_t>(), before * per_row) << step.dump();
      masks[block] -= int(step["committed"].size());
      total += step["bytes_to_host"].get<int64_t>();
    }
    int64_t counted = 0;
    for (const auto& [kind, bytes] : got.step_transfers) counted += bytes.to_host;
    EXPECT_EQ(counted, total);
  }
}

std::vector<std::string> RegisteredPolicyNames() {
  std::vector<std::string> names;
  for (const PolicyEntry& entry : RegisteredPolicies()) names.emplace_back(entry.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, StandingTest, ::testing::ValuesIn(RegisteredPolicyNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(PolicyRegistry, ListsEveryPolicyOnceInRankOrderWithItsOptions) {
  EXPECT_EQ(KnownPolicies(), "vanilla, fast-dllm-prefix, fast-dllm-dual, elastic-cache, polestar");
  EXPECT_TRUE(IsKnownPolicy("fast-dllm-dual"));
  EXPECT_FALSE(IsKnownPolicy("fast-dllm"));
  EXPECT_EQ(PoliciesReading("window"), std::vector<std::string>{"elastic-cache"});
  EXPECT_EQ(PoliciesReading("refresh_all"),
            (std::vector<std::string>{"fast-dllm-prefix", "fast-dllm-dual", "elastic-cache",
                                      "polestar"}));
  EXPECT_TRUE(PoliciesReading("steps").empty());  // the shared loop's
  const std::string help = PolicyHelp();
  EXPECT_NE(help.find("elastic-cache: Elastic-Cache: "), std::string::npos) << help;
  EXPECT_NE(help.find("    options: --track-num --gamma --window --refresh-all\n"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("\nevery policy: --policy --gen-length --block-length --steps "),
            std::string::npos)
      << help;
  // The shared loop's options end the list; refresh_all and the policies' own are not in it.
  EXPECT_TRUE(help.ends_with(" --cfg-scale --top-p --top-k --eos-early-stop\n")) << help;
  DecodeOptions o;
  o.policy = "nope";
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  try {
    MakePolicy(o, *model);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown policy 'nope' (known: vanilla, fast-dllm-prefix, "
                 "fast-dllm-dual, elastic-cache, polestar)");
  }
}

// Converts to anything: counts an aggregate's fields by how many initialise it.
struct AnyField {
  template <typename T>
  operator T&() const;
};
template <typename T, typename... Fields>
constexpr int FieldCount() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return FieldCount<T, Fields..., AnyField>();
  } else {
    return int(sizeof...(Fields));
  }
}

TEST(OptionSchema, DeclaresEveryDecodeOptionsFieldOnceUnderDistinctNames) {
  const std::vector<OptionSpec>& schema = OptionSchema();
  EXPECT_EQ(int(schema.size()), FieldCount<DecodeOptions>());
  std::set<std::string> names;
  for (const OptionSpec& option : schema) {
    SCOPED_TRACE(option.name);
    EXPECT_EQ(&OptionOf(option.member), &option);  // no member twice
    std::vector<std::string> keys = {option.name};
    for (const char* alias : option.aliases) keys.emplace_back(alias);
    std::string flags = option.flags;
    for (size_t at = 0; (at = flags.find("--", at)) != std::string::npos; at += 2) {
      keys.push_back(flags.substr(at + 2, flags.find(',', at) - at - 2));
    }
    std::set<std::string> own;  // '-' and '_' alike
    for (std::string key : keys) {
      EXPECT_EQ(FindOption(key), &option) << key;
      std::replace(key.begin(), key.end(), '-', '_');
      EXPECT_EQ(FindOption(key), &option) << key;
      own.insert(key);
    }
    for (const std::string& key : own) EXPECT_TRUE(names.insert(key).second) << key << " twice";
  }
  EXPECT_EQ(FindOption("nonsense"), nullptr);
  EXPECT_EQ(OptionName(OptionOf(&DecodeOptions::topk_clusters), Vocabulary::kCli),
            "--topk-clusters");
  EXPECT_EQ(FindOption("topk"), &OptionOf(&DecodeOptions::topk_clusters));
  EXPECT_EQ(FindOption("diffusion-steps"), &OptionOf(&DecodeOptions::steps));
}

// A bad value throws an error that knows its option and names it in either vocabulary.
TEST(OptionSchema, ErrorsNameTheOptionAsTheCliAndTheServerCallIt) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  auto error_of = [&](const DecodeOptions& o) -> std::optional<OptionError> {
    try {
      o.Validate(model->config(), 8);
    } catch (const OptionError& e) {
      return e;
    }
    return std::nullopt;
  };
  DecodeOptions o;
  o.threshold = 0;
  std::optional<OptionError> e = error_of(o);
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->option().name, "threshold");
  EXPECT_STREQ(e->what(), "--threshold must lie in (0, 1] (got 0)");
  EXPECT_EQ(e->Message(Vocabulary::kHttp), "threshold must lie in (0, 1] (got 0)");
  o = {};
  o.gen_length = 30;
  o.block_length = 8;
  e = error_of(o);
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->option().name, "block_length");
  EXPECT_STREQ(e->what(), "--block-length 8 does not divide --gen-length 30");
  EXPECT_EQ(e->Message(Vocabulary::kHttp),
            "block_length 8 does not divide max_tokens (rounded up to the block length) 30");
  o = {};
  o.clusters = 4;
  o.topk_clusters = 5;  // its range depends on another option
  e = error_of(o);
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->what(), "--topk-clusters must lie in [1, 4] (got 5)");
}

// A mode is read by name once, where its option is read; an unknown name is an error naming
// the option and the names it takes ("", alg's unset value, goes unlisted), and the records
// name the values as the options do.
TEST(OptionSchema, ModesAreReadByNameAndWrittenByName) {
  const OptionSpec& remasking = OptionOf(&DecodeOptions::remasking);
  const OptionSpec& alg = OptionOf(&DecodeOptions::alg);
  const OptionSpec& metric = OptionOf(&DecodeOptions::drift_metric);
  EXPECT_EQ(ParseMode<Remasking>(remasking, "low_confidence"), Remasking::kLowConfidence);
  EXPECT_EQ(ParseMode<Remasking>(remasking, "random"), Remasking::kRandom);
  EXPECT_EQ(ParseMode<DreamAlg>(alg, ""), DreamAlg::kUnset);
  EXPECT_EQ(ParseMode<DreamAlg>(alg, "maskgit_plus"), DreamAlg::kMaskgitPlus);
  EXPECT_EQ(ParseMode<DreamAlg>(alg, "topk_margin"), DreamAlg::kTopkMargin);
  EXPECT_EQ(ParseMode<DreamAlg>(alg, "confidence_threshold"), DreamAlg::kConfidenceThreshold);
  EXPECT_EQ(ParseMode<DriftMetric>(metric, "kl"), DriftMetric::kKl);
  EXPECT_EQ(ParseMode<DriftMetric>(metric, "cosine"), DriftMetric::kCosine);
  DecodeOptions o;
  EXPECT_EQ(OptionValueJson(alg, o), "");
  EXPECT_EQ(OptionValueJson(remasking, o), "low_confidence");
  o.alg = DreamAlg::kEntropy;
  o.drift_metric = DriftMetric::kCosine;
  EXPECT_EQ(OptionValueJson(alg, o), "entropy");
  EXPECT_EQ(OptionValueJson(metric, o), "cosine");
  auto error_of = [](auto parse) -> std::optional<OptionError> {
    try {
      parse();
    } catch (const OptionError& e) {
      return e;
    }
    return std::nullopt;
  };
  std::optional<OptionError> e = error_of([&] { ParseMode<DriftMetric>(metric, "l2"); });
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->what(), "unknown --drift-metric 'l2' (kl, cosine)");
  EXPECT_EQ(e->Message(Vocabulary::kHttp), "unknown drift_metric 'l2' (kl, cosine)");
  e = error_of([&] { ParseMode<DreamAlg>(alg, "none"); });
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->what(),
               "unknown --alg 'none' (origin, maskgit_plus, topk_margin, entropy, "
               "confidence_threshold)");
}

TEST(Schedules, NumTransferTokensSpreadsTheRemainderOverTheFirstSteps) {
  EXPECT_EQ(NumTransferTokens(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(NumTransferTokens(10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(NumTransferTokens(3, 5), (std::vector<int>{1, 1, 1, 0, 0}));
}

TEST(Schedules, DreamTimestepsAndCountsMatchTheReferenceArithmetic) {
  const std::vector<float> ts = DreamTimesteps(4, 1e-3f);
  ASSERT_EQ(ts.size(), 5u);
  EXPECT_FLOAT_EQ(ts[0], 1.0f);
  EXPECT_FLOAT_EQ(ts[4], 1e-3f);
  EXPECT_NEAR(ts[2], 0.5005f, 1e-6);
  // steps = L = 256: the first step commits int(256 * (1 - s/t)) = int(0.999...) = 0 tokens.
  const std::vector<float> t256 = DreamTimesteps(256, 1e-3f);
  EXPECT_EQ(DreamTransferCount(256, 0, 256, t256), 0);
  EXPECT_EQ(DreamTransferCount(7, 255, 256, t256), 7);  // the last step commits the rest
  // 32 masks over 8 steps: 1 - s/t at step 0 is 1 - 0.875125 = 0.124875 -> int(3.996) = 3.
  const std::vector<float> t8 = DreamTimesteps(8, 1e-3f);
  EXPECT_EQ(DreamTransferCount(32, 0, 8, t8), 3);
}

TEST(CommitRules, ThresholdKeepsTheMostConfidentAndEverythingAboveTheBar) {
  const std::vector<double> conf = {0.2, 0.95, 0.5, 0.91, 0.3};
  EXPECT_EQ(SelectThreshold(conf, 0.9), (std::vector<size_t>{1, 3}));
  const std::vector<double> low = {0.2, 0.4, 0.3};
  EXPECT_EQ(SelectThreshold(low, 0.9), (std::vector<size_t>{1}));  // top-1 always
}

TEST(CommitRules, TopKBreaksTiesTowardsTheLeftmostPosition) {
  const std::vector<double> conf = {0.5, 0.7, 0.7, 0.1};
  EXPECT_EQ(SelectTopK(conf, 2), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(SelectTopK(conf, 9).size(), 4u);
}

TEST(CommitRules, FactorAcceptsWhileConfidenceClearsOneMinusFOverNPlusOne) {
  // factor 1: bars are n=2: 1 - 1/3 = 0.667, n=3: 0.75, n=4: 0.8.
  const std::vector<double> conf = {0.9, 0.7, 0.72, 0.1, 0.05};
  // sorted: 0.9 (always), 0.72 >= 0.667, 0.7 < 0.75 -> stop: 2 accepted.
  EXPECT_EQ(SelectFactor(conf, 1.0), (std::vector<size_t>{0, 2}));
  // Reference quirk: when only the last candidate fails, it is accepted too.
  const std::vector<double> three = {0.9, 0.8, 0.1};
  EXPECT_EQ(SelectFactor(three, 1.0).size(), 3u);
}

TEST(Choices, LladaConfidenceIsTheFloat64SoftmaxOfTheArgmax) {
  Rng rng(1);
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const TokenChoice c = ChooseLlada(logits, /*excluded=*/-1, 0, false, rng);
  EXPECT_EQ(c.token, 1);
  const double expected = std::exp(3.0) / (std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(c.confidence, expected, 1e-12);
}

TEST(Choices, DreamMarginAndEntropyConfidences) {
  Rng rng(1);
  const std::vector<float> logits = {0.0f, std::log(3.0f), std::log(6.0f)};  // probs 0.1, 0.3, 0.6
  const TokenChoice margin =
      ChooseDream(logits, /*excluded=*/-1, 0, 1.0, 0, DreamConfidence::kMargin, rng);
  EXPECT_EQ(margin.token, 2);
  EXPECT_NEAR(margin.confidence, 0.3, 1e-6);
  const TokenChoice entropy =
      ChooseDream(logits, /*excluded=*/-1, 0, 1.0, 0, DreamConfidence::kNegEntropy, rng);
  EXPECT_NEAR(entropy.confidence, 0.1 * std::log(0.1) + 0.3 * std::log(0.3) + 0.6 * std::log(0.6),
              1e-5);
}

TEST(Choices, TemperatureSamplingFollowsTheDistribution) {
  Rng rng(7);
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  int ones = 0;
  for (int i = 0; i < 4000; ++i)
    ones += ChooseLlada(logits, /*excluded=*/-1, 1.0, false, rng).token;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(Validation, InvalidCombinationsFailBeforeAnyWork) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const std::vector<int> prompt = {1, 2, 3};
  auto expect_error = [&](DecodeOptions o, const std::string& needle) {
    EXPECT_THAT([&] { Generate(*model, prompt, o); }, testing::ThrowsErrorContaining({needle}));
  };
  DecodeOptions o;
  o.gen_length = 30;
  o.block_length = 8;
  expect_error(o, "does not divide");
  o = {};
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 6;
  expect_error(o, "not divisible by the number of blocks");
  o = {};
  o.policy = "nope";
  expect_error(o, "unknown policy");
  o = {};
  o.gen_length = 1000;
  o.block_length = 8;
  o.steps = 1000;
  expect_error(o, "exceeds the model's context");
  o = {};
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 2000;
  expect_error(o, "--steps must lie in [1, 512] (got 2000)");
  // Guidance's unconditional pass runs without a policy's layer hook.
  for (const char* policy : {"elastic-cache", "polestar"}) {
    o = {};
    o.policy = policy;
    o.cfg_scale = 1;
    expect_error(o, "--cfg-scale is supported by vanilla, fast-dllm-prefix, fast-dllm-dual only");
  }
  // Every number out of its range or not finite is an error naming the option, never a
  // rule quietly switched off.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [field, value, message] :
       std::vector<std::tuple<double DecodeOptions::*, double, std::string>>{
           {&DecodeOptions::temperature, nan, "--temperature must lie in [0, inf) (got nan)"},
           {&DecodeOptions::temperature, -1, "--temperature must lie in [0, inf) (got -1)"},
           {&DecodeOptions::cfg_scale, nan, "--cfg-scale must lie in [0, 1000]"},
           {&DecodeOptions::alpha, nan, "--alpha must lie in [0, inf)"},
           {&DecodeOptions::tau_s, 2, "--tau-s must lie in (0, 1] (got 2)"},
           {&DecodeOptions::tau_s, nan, "--tau-s must lie in (0, 1]"},
           {&DecodeOptions::top_p, nan, "--top-p must lie in (0, 1]"},
           {&DecodeOptions::eps, 1, "--eps must lie in (0, 1)"},
           {&DecodeOptions::gamma, 0, "--gamma must lie in (0, 1]"},
           {&DecodeOptions::drift_cap, std::numeric_limits<double>::infinity(),
            "--drift-cap must lie in [0, inf) (got inf)"}}) {
    o = {};
    o.*field = value;
    expect_error(o, message);
  }
  for (double threshold : {-1.0, 0.0, 1.5, nan}) {
    o = {};
    o.threshold = threshold;
    expect_error(o, "--threshold must lie in (0, 1]");
    o = {};
    o.factor = threshold == 1.5 ? -0.5 : threshold;
    expect_error(o, "--factor must lie in (0, inf)");
  }
  o = {};
  o.policy = "polestar";
  o.tau_s = 1.5;  // the default threshold of polestar: its own name in the error
  expect_error(o, "--tau-s must lie in (0, 1] (got 1.5)");
  o = {};
  o.alg = DreamAlg::kEntropy;
  expect_error(o, "Dream sampler");
}

// A tied-embedding checkpoint whose mask embedding dominates the residual stream: the mask
// token is the most likely prediction at every position (as with real tied checkpoints,
// or a GGUF file without output.weight). It must never be committed, and every policy must
// still finish its canvas in bounded steps.
TEST(Termination, TheMaskTokenIsNeverCommittedEvenWhenTheModelPrefersIt) {
  testing::Checkpoint checkpoint = testing::LoadCheckpoint("llada-tiny");
  checkpoint.config["weight_tying"] = true;
  std::erase_if(checkpoint.tensors, [](const TensorToWrite& t) {
    return t.name == "model.transformer.ff_out.weight";  // the LM head tying replaces
  });
  const int mask_id = checkpoint.config["mask_token_id"], width = checkpoint.config["d_model"];
  std::span<float> embedding = checkpoint.Floats("model.transformer.wte.weight");  // [V, C]
  for (int i = 0; i < width; ++i) embedding[size_t(mask_id * width + i)] *= 200.0f;
  auto model = Model::Load(testing::WriteCheckpoint(checkpoint, testing::TempDir()));
  const int mask = model->config().mask_id;
  const std::vector<int> prompt = {1, 5, 9};
  DecodeOptions vanilla;
  vanilla.gen_length = 16;
  vanilla.block_length = 8;
  vanilla.steps = 16;
  // The premise: at a masked position the model's first choice is the mask itself.
  {
    KvCache cache = MakeCache(*model, 19, false);
    Forward forward(*model, cache);
    std::vector<int> canvas = {1, 5, 9};
    canvas.resize(19, mask);
    StepPlan plan;
    for (int p = 0; p < 19; ++p) plan.input_rows.push_back(p);
    plan.logit_rows = {10};
    const StepResult r = forward.Run(canvas, plan);
    EXPECT_EQ(std::max_element(r.logits.begin(), r.logits.end()) - r.logits.begin(), mask);
  }
  for (const char* policy :
       {"vanilla", "fast-dllm-prefix", "fast-dllm-dual", "elastic-cache", "polestar"}) {
    for (std::optional<double> threshold : {std::optional<double>(), {0.9}}) {
      SCOPED_TRACE(std::string(policy) + (threshold ? " threshold" : " fixed"));
      DecodeOptions o = vanilla;
      o.policy = policy;
      o.threshold = threshold;
      const GenerationResult r = Generate(*model, prompt, o);
      EXPECT_EQ(std::count(r.generated.begin(), r.generated.end(), mask), 0);
      EXPECT_LE(r.nfe, 16);
    }
  }
}

TEST(Termination, NonFiniteLogitsAreAnErrorNotTokens) {
  testing::Checkpoint checkpoint = testing::LoadCheckpoint("llada-tiny");
  checkpoint.Floats("model.transformer.blocks.1.ff_out.weight")[7] =
      std::numeric_limits<float>::quiet_NaN();
  const std::string dir = testing::WriteCheckpoint(checkpoint, testing::TempDir());
  auto generate = [&](const std::string& flags) {
    std::string out;
    EXPECT_EQ(
        testing::RunCli("generate -m " + dir +
                            " --prompt-ids 1,2,3 --gen-length 8 --block-length 8 --steps 8" + flags,
                        &out, /*merge_stderr=*/true),
        1);
    return out;
  };
  const std::string out = generate("");
  EXPECT_NE(out.find("non-finite logit"), std::string::npos) << out;
  // The backend's greedy choices (temperature 0) report the logit the host finds in the rows
  // (temperature > 0): the same message.
  EXPECT_EQ(generate(" --temperature 1"), out);
}

}  // namespace
}  // namespace polestar
