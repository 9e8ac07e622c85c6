// Elastic-Cache (that refreshing everything reproduces vanilla is decode_test's StandingTest):
// a trigger that never fires leaves only the sliding window's rows; a firing at layer 0
// recomputes layer 1 for every row from the documented inputs; and the accuracy / NFE
// comparison with Fast-dLLM dual cache on the trained probe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>

#include "base/parallel.h"
#include "decode/generate.h"
#include "decode/policy.h"
#include "io/json_file.h"
#include "test_support.h"

namespace polestar {
namespace {

// The fixtures are tiny: threads only add synchronisation, which is slow on a busy machine.
class SingleThread : public ::testing::Environment {
 public:
  void SetUp() override { SetThreadCount(1); }
};
const auto* const kSingleThread = ::testing::AddGlobalTestEnvironment(new SingleThread);

DecodeOptions ElasticOptions() {
  DecodeOptions o;
  o.policy = "elastic-cache";
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 16;
  o.threshold = 0.9;
  return o;
}

const std::vector<int> kPrompt = {1, 5, 9, 14, 22, 31, 40, 3};

// With a trigger that cannot fire, every step after the prefill computes exactly the window
// plus the positions committed by the previous step (plus Dream's predicting row) in every
// layer, and the totals add up to GenerationResult::rows_computed.
TEST(Window, WithoutRefreshesOnlyTheWindowIsComputed) {
  for (const char* fixture : {"llada-tiny", "dream-tiny"}) {
    auto model = Model::Load(testing::FixtureDir(fixture));
    const ModelConfig& config = model->config();
    const int prompt_length = int(kPrompt.size()), length = prompt_length + 32;
    for (int window_option : {0, 8}) {
      SCOPED_TRACE(std::string(fixture) + " --window " + std::to_string(window_option));
      DecodeOptions o = ElasticOptions();
      o.block_length = 0;  // the window alone chooses what may commit
      o.steps = 32;        // one commit per step
      o.threshold.reset();
      o.gamma = 1e-9;
      o.window = window_option;
      const GenerationResult r = Generate(*model, kPrompt, o, nullptr, /*keep_trace=*/true);
      const int window = window_option > 0                         ? window_option
                         : config.sampler == SamplerFamily::kDream ? 32
                                                                   : 16;
      ASSERT_EQ(int(r.trace.size()), r.nfe);
      int64_t rows = 0;
      std::set<int> masked;  // before the step
      for (int p = prompt_length; p < length; ++p) masked.insert(p);
      std::vector<int> committed_before;
      for (size_t t = 0; t < r.trace.size(); ++t) {
        const nlohmann::json& stats = r.trace[t]["policy"];
        // The window: the first `window` masked positions, decoded ones skipped.
        std::vector<int> first_masked(masked.begin(), masked.end());
        first_masked.resize(std::min(first_masked.size(), size_t(window)));
        EXPECT_EQ(stats["window"].get<std::vector<int>>(), first_masked) << "step " << t;
        std::set<int> expected;
        if (t == 0) {
          for (int p = 0; p < length; ++p) expected.insert(p);
          EXPECT_EQ(stats["refresh"], "full");
          EXPECT_TRUE(stats["tracked"].empty());
        } else {
          for (int p : first_masked) expected.insert(config.shift_logits ? p - 1 : p);
          expected.insert(committed_before.begin(), committed_before.end());
          const std::vector<int> tracked = stats["tracked"];
          EXPECT_FALSE(tracked.empty());
          EXPECT_LE(tracked.size(), size_t(config.layers));  // --track-num 1 per layer
          for (int p : tracked) {
            EXPECT_EQ(masked.count(p), 0u) << "a tracked token holds a token";
            expected.insert(p);
          }
          EXPECT_EQ(stats["refresh"], "none");
          EXPECT_EQ(stats["fired_layer"], -1);
        }
        EXPECT_EQ(stats["input_rows"].get<int>(), int(expected.size())) << "step " << t;
        for (int layer_rows : stats["rows_per_layer"]) EXPECT_EQ(layer_rows, int(expected.size()));
        for (int p : r.trace[t]["committed"]) {
          EXPECT_TRUE(std::find(first_masked.begin(), first_masked.end(), p) != first_masked.end());
          masked.erase(p);
        }
        // The last layer computes the rows whose outputs are read: the window's predicting
        // rows (logits) and the tracked tokens (their attention).
        std::set<int> last_layer;
        for (int p : first_masked) last_layer.insert(config.shift_logits ? p - 1 : p);
        if (t > 0) {
          for (int p : stats["tracked"]) last_layer.insert(p);
        }
        rows += int64_t(expected.size()) * (config.layers - 1) + int64_t(last_layer.size());
        committed_before = r.trace[t]["committed"].get<std::vector<int>>();
      }
      EXPECT_EQ(r.rows_computed, rows);
      // The prefill, then at most the window, one commit and the tracked tokens per step.
      EXPECT_LE(r.rows_computed,
                int64_t(config.layers) * (length + (r.nfe - 1) * (window + 1 + config.layers)));
    }
  }
}

// Sets the query rows of one layer to every position.
class WidenLayer : public LayerHook {
 public:
  WidenLayer(int layer, int length) : layer_(layer), length_(length) {}
  void BeforeQueries(LayerRows& rows) override {
    if (rows.layer == layer_) *rows.query_rows = Range(0, length_);
  }

 private:
  int layer_, length_;
};

// Passes everything on to the policy's hook and, where the last layer runs every row, asks
// for the logits of every row.
class LogitsForEveryRowIfWidened : public LayerHook {
 public:
  LogitsForEveryRowIfWidened(LayerHook* inner, int last_layer, int length)
      : inner_(inner), last_layer_(last_layer), length_(length) {}
  void BeforeQueries(LayerRows& rows) override {
    inner_->BeforeQueries(rows);
    if (rows.layer == last_layer_ && int(rows.query_rows->size()) == length_) {
      *rows.logit_rows = Range(0, length_);
    }
  }
  void OnAttention(int layer, std::span<const int> query_rows, const RowsView& probs) override {
    inner_->OnAttention(layer, query_rows, probs);
  }

 private:
  LayerHook* inner_;
  int last_layer_, length_;
};

KvCache FullPass(const Model& model, const std::vector<int>& canvas) {
  KvCache cache = MakeCache(model, int64_t(canvas.size()), true);
  Forward forward(model, cache);
  StepPlan plan;
  plan.input_rows = Range(0, int(canvas.size()));
  forward.Run(canvas, plan);
  return cache;
}

void ExpectRowsNear(const float* got, const float* want, int64_t width, int row, const char* what,
                    int layer) {
  for (int64_t i = 0; i < width; ++i) {
    const float g = got[row * width + i], w = want[row * width + i];
    ASSERT_NEAR(g, w, 1e-5f * (1.0f + std::fabs(w)))
        << what << " layer " << layer << " row " << row;
  }
}

// Drives an Elastic-Cache policy by hand over two steps: a prefill on the blank canvas c0,
// then a step on c0 again or on c1 (c0 with three commits at 8, 9 and 10).
struct TwoSteps {
  TwoSteps(const Model& model, const DecodeOptions& options)
      : model(model),
        options(options),
        c0(BlankCanvas(model, options)),
        c1(WithCommits(c0)),
        policy(MakePolicy(options, model)),
        cache(MakeCache(model, int64_t(c0.size()), policy->NeedsHiddenStates())),
        forward(model, cache) {
    forward.Run(c0, policy->Plan(Context(c0, 0, 0)));
  }
  StepPlan PlanNext(const std::vector<int>& next, int committed_last_step) {
    return policy->Plan(Context(next, 1, committed_last_step));
  }
  DecodeContext Context(const std::vector<int>& canvas, int step, int committed) {
    const int prompt_length = int(kPrompt.size());
    return {model,
            options,
            canvas,
            prompt_length,
            model.config().mask_id,
            Block{0, prompt_length, int(canvas.size())},
            step,
            committed,
            forward};
  }
  static std::vector<int> BlankCanvas(const Model& model, const DecodeOptions& options) {
    std::vector<int> canvas(kPrompt);
    canvas.resize(kPrompt.size() + size_t(options.gen_length), model.config().mask_id);
    return canvas;
  }
  static std::vector<int> WithCommits(std::vector<int> canvas) {
    canvas[8] = 17, canvas[9] = 124, canvas[10] = 17;
    return canvas;
  }

  const Model& model;
  const DecodeOptions options;
  const std::vector<int> c0, c1;  // [prompt + gen]
  std::unique_ptr<Policy> policy;
  KvCache cache;
  Forward forward;
};

// llada-tiny has 2 layers. After a prefill on c0, three tokens are committed (c1) and the
// next step fires at layer 0 (gamma 1 fires at any change). Layer 1 must then run for every
// row: the window rows on their fresh layer-1 inputs, the others on the inputs cached by the
// prefill. Expected values come from two independent full passes (on c0 and on c1) composed
// row by row, and from recomputing layer 1 for all rows over that composed cache.
TEST(Trigger, FiringAtLayerZeroRecomputesLayerOneForEveryRow) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const ModelConfig& config = model->config();
  ASSERT_EQ(config.layers, 2);
  DecodeOptions o = ElasticOptions();
  o.block_length = 0;
  o.steps = 32;
  o.gamma = 1.0;
  const int prompt_length = int(kPrompt.size());
  const int length = prompt_length + o.gen_length;
  TwoSteps run(*model, o);
  const std::vector<int>& c0 = run.c0;
  const std::vector<int>& c1 = run.c1;
  KvCache& cache = run.cache;
  StepPlan plan = run.PlanNext(c1, 3);
  LogitsForEveryRowIfWidened all_logits(plan.hook, config.layers - 1, length);
  plan.hook = &all_logits;
  const StepResult got = run.forward.Run(c1, plan);
  const nlohmann::json stats = run.policy->StepStats();
  // The step's input: the tracked prompt tokens, the commits, then the window [11, 27).
  const std::vector<int> tracked = stats["tracked"];
  ASSERT_FALSE(tracked.empty());
  std::vector<int> input = tracked;
  for (int p = 8; p < 27; ++p) input.push_back(p);
  for (int p : tracked) EXPECT_LT(p, prompt_length);
  EXPECT_EQ(plan.input_rows, input);
  const int input_rows = int(input.size());
  EXPECT_EQ(stats["fired_layer"], 0);
  EXPECT_EQ(stats["rows_per_layer"], nlohmann::json({input_rows, length}));
  EXPECT_EQ(got.rows_computed, input_rows + length);

  // Layer 0 depends only on the tokens, so it is exact everywhere; layer 1 holds fresh rows
  // for the step's inputs and the prefill's rows elsewhere.
  const KvCache before = FullPass(*model, c0), after = FullPass(*model, c1);
  KvCache composed = after;
  const int64_t kv = composed.kv_width(), width = composed.hidden_width();
  const Backend& backend = composed.backend();
  for (int p = 0; p < length; ++p) {
    if (std::find(input.begin(), input.end(), p) != input.end()) continue;
    backend.CopyBytes(before.keys(1) + p * kv, kv * 4, composed.keys(1) + p * kv);
    backend.CopyBytes(before.values(1) + p * kv, kv * 4, composed.values(1) + p * kv);
    backend.CopyBytes(before.hidden(1) + p * width, width * 4, composed.hidden(1) + p * width);
  }
  // A layer's rows of a cache ([L, width]) on the host.
  auto rows = [&](const KvCache& from, const float* data, int64_t row_width) {
    return testing::Download(from.backend(), data, length * row_width);
  };
  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<float> keys = rows(cache, cache.keys(layer), kv),
                             want_keys = rows(composed, composed.keys(layer), kv),
                             values = rows(cache, cache.values(layer), kv),
                             want_values = rows(composed, composed.values(layer), kv),
                             hidden = rows(cache, cache.hidden(layer), width),
                             want_hidden = rows(composed, composed.hidden(layer), width);
    for (int p = 0; p < length; ++p) {
      ExpectRowsNear(keys.data(), want_keys.data(), kv, p, "keys", layer);
      ExpectRowsNear(values.data(), want_values.data(), kv, p, "values", layer);
      ExpectRowsNear(hidden.data(), want_hidden.data(), width, p, "hidden", layer);
    }
  }
  // Layer 1 recomputed for every row over the composed cache.
  Forward recompute(*model, composed);
  WidenLayer widen(1, length);
  StepPlan full_layer_one;
  full_layer_one.input_rows = plan.input_rows;
  full_layer_one.logit_rows = Range(0, length);
  full_layer_one.hook = &widen;
  const StepResult want = recompute.Run(c1, full_layer_one);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (int p = 0; p < length; ++p) {
    ExpectRowsNear(got.logits.data(), want.logits.data(), config.vocab, p, "logits", 1);
  }
  // The stale rows really differ from a fresh pass on c1, so the comparison above is not
  // one that any full pass would pass.
  const std::vector<float> stale = rows(before, before.hidden(1), width),
                           fresh = rows(after, after.hidden(1), width);
  float difference = 0;
  for (size_t i = 0; i < stale.size(); ++i) {
    difference = std::max(difference, std::fabs(stale[i] - fresh[i]));
  }
  EXPECT_GT(difference, 1e-3f);
}

// The drift test compares each tracked token's attention now with its attention before the
// step: its query from the cached layer input, over the keys before any were rewritten. A
// step over an unchanged canvas rewrites every row with the same values, so the two agree
// to rounding at every layer; after three commits they do not.
TEST(Trigger, AttentionBeforeTheStepIsTheCachedOne) {
  for (const char* fixture : {"llada-tiny", "dream-tiny"}) {
    SCOPED_TRACE(fixture);
    auto model = Model::Load(testing::FixtureDir(fixture));
    const ModelConfig& config = model->config();
    DecodeOptions o = ElasticOptions();
    o.block_length = 0;
    o.gamma = 0;  // never fires: every layer is tested
    for (const bool committed : {false, true}) {
      TwoSteps run(*model, o);
      const std::vector<int>& next = committed ? run.c1 : run.c0;
      run.forward.Run(next, run.PlanNext(next, 0));
      const nlohmann::json stats = run.policy->StepStats();
      ASSERT_FALSE(stats["tracked"].empty());
      for (int layer = 0; layer < config.layers; ++layer) {
        const double sigma = stats["similarity"][size_t(layer)];
        if (!committed) {
          EXPECT_NEAR(sigma, 1.0, 1e-6) << "layer " << layer;
        } else if (layer == 0) {
          EXPECT_LT(sigma, 1.0 - 1e-6);
        }
      }
    }
  }
}

struct ProbeScore {
  int correct = 0, nfe = 0, prompts = 0, refreshes = 0;
};

// Every `stride`-th prompt of the probe's reference.json; accuracy: the canvas cut at the
// first EOS equals the answer.
ProbeScore RunProbe(const Model& model, const nlohmann::json& reference, const DecodeOptions& o,
                    int stride, const std::function<void(const GenerationResult&, size_t)>& check) {
  const nlohmann::json vocab = ReadJsonFile(testing::FixtureDir("llada-probe") + "/vocab.json");
  const int eos = vocab["EOS"];
  ProbeScore score;
  const nlohmann::json& prompts = reference["prompts"];
  for (size_t i = 0; i < prompts.size(); i += size_t(stride)) {
    const GenerationResult r =
        Generate(model, prompts[i]["prompt_ids"].get<std::vector<int>>(), o, nullptr, true);
    std::string text;
    for (int token : r.generated) {
      if (token == eos) break;
      text += vocab["chars"].at(size_t(token)).get<std::string>();
    }
    score.correct += text == prompts[i]["answer"].get<std::string>();
    score.nfe += r.nfe;
    for (const nlohmann::json& step : r.trace) {
      score.refreshes += step.contains("policy") && step["policy"]["refresh"] == "from_layer";
    }
    ++score.prompts;
    check(r, i);
  }
  return score;
}

// A sixth of the trained probe (bench/probe_policies runs all of it): Fast-dLLM dual cache
// reproduces its reference canvases, Elastic-Cache with the same threshold keeps its
// accuracy in fewer forwards, and a firing at any layer widens exactly the layers above it.
TEST(Probe, ElasticCacheNextToFastDllmDual) {
  const std::string dir = testing::FixtureDir("llada-probe");
  auto model = Model::Load(dir);
  const nlohmann::json reference = ReadJsonFile(dir + "/reference.json");
  const int length = 20 + 32, stride = 6;
  DecodeOptions dual;
  dual.policy = "fast-dllm-dual";
  dual.gen_length = 32;
  dual.block_length = 8;
  dual.steps = 4;
  dual.threshold = 0.9;
  const nlohmann::json& dual_reference = reference["policies"]["dual@0.9"]["per_prompt"];
  const ProbeScore dual_score =
      RunProbe(*model, reference, dual, stride, [&](const GenerationResult& r, size_t i) {
        EXPECT_EQ(r.generated, dual_reference[i]["generated"].get<std::vector<int>>())
            << "prompt " << i;
        EXPECT_EQ(r.nfe, dual_reference[i]["nfe"].get<int>()) << "prompt " << i;
      });

  int fired = 0, fired_above_zero = 0;
  auto check_refresh = [&](const GenerationResult& r, size_t) {
    for (const nlohmann::json& step : r.trace) {
      const nlohmann::json& stats = step["policy"];
      if (stats["refresh"] == "full") continue;
      const int layer_fired = stats["fired_layer"], input = stats["input_rows"];
      fired += layer_fired >= 0;
      fired_above_zero += layer_fired > 0;
      for (int layer = 0; layer < 4; ++layer) {
        EXPECT_EQ(stats["rows_per_layer"][size_t(layer)].get<int>(),
                  layer_fired >= 0 && layer > layer_fired ? length : input);
      }
    }
  };
  DecodeOptions elastic = dual;
  elastic.policy = "elastic-cache";
  const ProbeScore elastic_score = RunProbe(*model, reference, elastic, stride, check_refresh);
  std::printf("%d prompts: fast-dllm-dual %d correct, NFE %d; elastic-cache %d correct, NFE %d\n",
              dual_score.prompts, dual_score.correct, dual_score.nfe, elastic_score.correct,
              elastic_score.nfe);
  EXPECT_GE(elastic_score.correct, dual_score.correct - 1);
  EXPECT_LT(elastic_score.nfe, dual_score.nfe);

  elastic.gamma = 0.99;  // fires often, at every depth
  fired = fired_above_zero = 0;
  RunProbe(*model, reference, elastic, 2 * stride, check_refresh);
  EXPECT_GT(fired, fired_above_zero);
  EXPECT_GT(fired_above_zero, 0);
}

}  // namespace
}  // namespace polestar
