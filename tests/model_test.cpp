// The forward pass against logits computed by the original PyTorch modeling code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "test_support.h"

namespace polestar {
namespace {

std::vector<float> ToFloats(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.NumElements()));
  std::memcpy(v.data(), t.data, t.bytes);
  return v;
}

// The reference code's precision: fp32 activations (BF16 weights widened, not products of
// BF16-rounded activations; ops/isa.h).
const CpuBackend& ExactBackend() {
  static const CpuBackend backend(BestIsa(), ActivationPrecision::kF32);
  return backend;
}

// One pass over every position of `ids` with logits for all of them (attention_block B > 0:
// block-causal).
StepResult FullPass(const Model& model, const std::vector<int>& ids, int attention_block = 0,
                    const Backend& backend = ExactBackend()) {
  KvCache cache = MakeCache(model, int64_t(ids.size()), false, backend);
  Forward forward(model, cache);
  StepPlan plan;
  plan.input_rows.resize(ids.size());
  std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
  plan.logit_rows = plan.input_rows;
  plan.attention_block = attention_block;
  return forward.Run(ids, plan);
}

// A fixture's model with the reference's full pass: its input ids and logits[L, V].
struct ReferencePass {
  std::unique_ptr<Model> model;
  std::vector<int> ids;
  std::vector<float> logits;
};

ReferencePass LoadReferencePass(const char* fixture) {
  const std::string dir = testing::FixtureDir(fixture);
  TensorStore expected;
  ReadSafetensorsFile(dir + "/expected.safetensors", expected);
  return {Model::Load(dir), testing::ToInts(expected.Get("forward.input_ids")),
          ToFloats(expected.Get("forward.logits"))};
}

class FixtureForward : public ::testing::TestWithParam<const char*> {};

TEST_P(FixtureForward, FullPassMatchesReferenceLogits) {
  const auto [model, ids, want] = LoadReferencePass(GetParam());
  const int V = model->config().vocab;
  ASSERT_EQ(want.size(), ids.size() * V);

  const StepResult got = FullPass(*model, ids);
  ASSERT_EQ(got.logits.size(), want.size());
  float max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, std::fabs(got.logits[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  EXPECT_LE(max_err, 1e-4f) << "max |logit| " << max_abs;
  EXPECT_EQ(got.rows_computed, int64_t(ids.size()) * model->config().layers);
}

// A pass over every position that wants logits for some rows only: the last layer computes
// those rows alone, and they keep the reference's logits. With more logit rows than the
// products' dot path takes (ops/avx512/matmul.cpp: up to 6) and a dense last layer, their
// bits are those of the pass with logits everywhere. A captured last layer keeps every row
// unless the plan names the rows whose attention its hook reads.
TEST_P(FixtureForward, LastLayerComputesOnlyTheRowsItsOutputsFeed) {
  const auto [model, ids, want] = LoadReferencePass(GetParam());
  const int64_t V = model->config().vocab, L = int64_t(ids.size());
  const int layers = model->config().layers;
  // A mixture-of-experts layer hands each expert the rows that chose it, fewer than 7.
  const bool dense_last_layer = !model->config().IsMoeLayer(layers - 1);
  const StepResult all = FullPass(*model, ids);

  class NoHook : public LayerHook {};
  NoHook hook;
  for (const int count : {8, 2}) {
    SCOPED_TRACE(count);
    ASSERT_GE(L, count + 3);
    KvCache cache = MakeCache(*model, L, false, ExactBackend());
    Forward forward(*model, cache);
    StepPlan plan;
    plan.input_rows.resize(size_t(L));
    std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
    plan.logit_rows.resize(size_t(count));
    std::iota(plan.logit_rows.begin(), plan.logit_rows.end(), 3);  // rows 3 .. 3 + count
    const StepResult some = forward.Run(ids, plan);
    EXPECT_EQ(some.rows_computed, L * (layers - 1) + count);
    ASSERT_EQ(some.logits.size(), size_t(count * V));
    for (int i = 0; i < count; ++i) {
      const float* got = some.logits.data() + i * V;
      const float* reference = want.data() + (3 + i) * V;
      const float* unpruned = all.logits.data() + (3 + i) * V;
      for (int64_t j = 0; j < V; ++j) {
        ASSERT_NEAR(got[j], reference[j], 1e-4f) << "row " << 3 + i << " token " << j;
        if (count > 6 && dense_last_layer) {
          ASSERT_EQ(got[j], unpruned[j]) << "row " << 3 + i << " token " << j;
        }
      }
    }

    plan.hook = &hook;
    plan.capture_layers = {layers - 1};
    EXPECT_EQ(forward.Run(ids, plan).rows_computed, L * layers);
    plan.attention_rows = {0, 3};  // row 3 gets logits too
    EXPECT_EQ(forward.Run(ids, plan).rows_computed, L * (layers - 1) + count + 1);
  }
}

// A plan's hook_layers name where its hook sees and chooses rows; OnAttention follows
// capture_layers alone. The layers between run as quiet layers (their own path in the step
// runner, the one a recording replays), which must give the bits and counts of the path that
// offers the hook every layer.
TEST(HookLayers, AHookIsCalledOnlyAtItsLayersAndTheRestGivesTheSameStep) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const int layers = model->config().layers;
  ASSERT_GE(layers, 2);
  const int64_t L = 24;
  std::vector<int> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) ids[size_t(i)] = int((i * 7 + 3) % model->config().vocab);
  struct Calls final : LayerHook {
    std::vector<int> stored, queried, attended;  // the layers of each call
    void BeforeFreshRowsStored(int layer, std::span<const int>, const RowsView&) override {
      stored.push_back(layer);
    }
    void BeforeQueries(LayerRows& rows) override { queried.push_back(rows.layer); }
    void OnAttention(int layer, std::span<const int>, const RowsView&) override {
      attended.push_back(layer);
    }
  };
  struct Run {
    StepResult full, partial;
  };
  // A full pass, then a step over rows 8 .. 15 with logits for three of them.
  auto run = [&](LayerHook* hook, std::optional<std::vector<int>> hook_layers) {
    KvCache cache = MakeCache(*model, L, true, ExactBackend());
    Forward forward(*model, cache);
    StepPlan plan;
    plan.input_rows.resize(size_t(L));
    std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
    plan.logit_rows = {9, 10, 12};
    plan.hook = hook;
    plan.hook_layers = hook_layers;
    Run got;
    got.full = forward.Run(ids, plan);
    plan.input_rows = {8, 9, 10, 11, 12, 13, 14, 15};
    plan.capture_layers = {0};
    got.partial = forward.Run(ids, plan);
    return got;
  };
  Calls every, some;
  const Run offered = run(&every, std::nullopt);
  const Run quiet = run(&some, std::vector<int>{layers - 1});
  std::vector<int> all(static_cast<size_t>(layers));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int> twice = all;
  twice.insert(twice.end(), all.begin(), all.end());
  EXPECT_EQ(every.stored, twice);
  EXPECT_EQ(every.queried, twice);
  EXPECT_EQ(some.stored, std::vector<int>({layers - 1, layers - 1}));
  EXPECT_EQ(some.queried, std::vector<int>({layers - 1, layers - 1}));
  EXPECT_EQ(every.attended, std::vector<int>{0});
  EXPECT_EQ(some.attended, std::vector<int>{0});
  for (const auto& [a, b] :
       {std::pair{&offered.full, &quiet.full}, {&offered.partial, &quiet.partial}}) {
    EXPECT_EQ(a->logits, b->logits);
    EXPECT_EQ(a->rows_computed, b->rows_computed);
    EXPECT_EQ(a->kv_rows_written, b->kv_rows_written);
    EXPECT_EQ(b->layers_replayed, 0);  // the CPU records nothing
  }
  EXPECT_EQ(quiet.partial.kv_rows_written, 8 * layers);
  EXPECT_EQ(quiet.partial.rows_computed, 8 * (layers - 1) + 3);
}

// With set_counts_experts a step reports the experts its rows chose, each once a layer: one
// row chooses experts_per_token at every mixture layer; a full pass at least that and at most
// every expert; counting changes no logit. Off, nothing is counted.
TEST(ExpertsRead, OneRowReadsItsChoicesAndCountingChangesNothing) {
  for (const char* fixture : {"lladamoe-a", "llada2-a"}) {
    SCOPED_TRACE(fixture);
    auto model = Model::Load(testing::FixtureDir(fixture));
    const ModelConfig& c = model->config();
    int mixture_layers = 0;
    for (int layer = 0; layer < c.layers; ++layer) mixture_layers += c.IsMoeLayer(layer);
    ASSERT_GT(mixture_layers, 0);
    const int k = c.moe.experts_per_token;
    const int64_t L = 16;
    std::vector<int> ids(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) ids[size_t(i)] = int((i * 5 + 2) % c.vocab);
    auto run = [&](bool counts) {
      KvCache cache = MakeCache(*model, L, true, ExactBackend());
      Forward forward(*model, cache);
      forward.set_counts_experts(counts);
      StepPlan plan;
      plan.input_rows.resize(size_t(L));
      std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
      plan.logit_rows = {3, 9};
      std::vector<StepResult> results = {forward.Run(ids, plan)};
      plan.input_rows = {9};
      plan.logit_rows = {9};
      results.push_back(forward.Run(ids, plan));
      return results;
    };
    const std::vector<StepResult> counted = run(true), uncounted = run(false);
    for (size_t i = 0; i < counted.size(); ++i) {
      EXPECT_EQ(counted[i].logits, uncounted[i].logits) << "step " << i;
      EXPECT_EQ(uncounted[i].experts_read, 0) << "step " << i;
    }
    EXPECT_GE(counted[0].experts_read, int64_t(mixture_layers) * k);
    EXPECT_LE(counted[0].experts_read, int64_t(mixture_layers) * c.moe.experts);
    EXPECT_EQ(counted[1].experts_read, int64_t(mixture_layers) * k);
  }
}

// LLaDA 2.x's sampler runs the model with block-causal attention: position p sees the
// blocks up to its own. The reference's forward under that mask (block length 8), row by row.
TEST(BlockCausalForward, MatchesTheReferenceUnderTheSamplersMask) {
  for (const char* fixture : {"llada2-a", "llada2-b"}) {
    SCOPED_TRACE(fixture);
    const std::string dir = testing::FixtureDir(fixture);
    auto model = Model::Load(dir);
    TensorStore expected;
    ReadSafetensorsFile(dir + "/expected.safetensors", expected);
    const std::vector<int> ids = testing::ToInts(expected.Get("forward.input_ids"));
    const std::vector<float> want = ToFloats(expected.Get("forward_block.logits"));
    const std::vector<float> bidirectional = ToFloats(expected.Get("forward.logits"));
    const StepResult got = FullPass(*model, ids, 8);
    ASSERT_EQ(got.logits.size(), want.size());
    float max_err = 0, mask_effect = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_err = std::max(max_err, std::fabs(got.logits[i] - want[i]));
      mask_effect = std::max(mask_effect, std::fabs(bidirectional[i] - want[i]));
    }
    EXPECT_LE(max_err, 1e-4f);
    EXPECT_GT(mask_effect, 1e-2f);  // the mask matters: a bidirectional pass would fail
  }
}

// With BF16-rounded activations (the default where the CPU has AVX512_BF16) the BF16
// fixture's logits stay within the bound ops/bf16_matmul.h states for each product, which
// the layers then carry: here a few times 2^-9 of the largest logit.
TEST(Bf16Products, FixtureLogitsStayNearTheReference) {
  const CpuBackend reduced(BestIsa(), ActivationPrecision::kReduced);
  if (!reduced.bf16_products()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const std::string dir = testing::FixtureDir("llada-tiny-bf16");
  auto model = Model::Load(dir);
  TensorStore expected;
  ReadSafetensorsFile(dir + "/expected.safetensors", expected);
  const std::vector<int> ids = testing::ToInts(expected.Get("forward.input_ids"));
  const std::vector<float> want = ToFloats(expected.Get("forward.logits"));
  const StepResult got = FullPass(*model, ids, 0, reduced);
  ASSERT_EQ(got.logits.size(), want.size());
  float max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, std::fabs(got.logits[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  std::printf("llada-tiny-bf16, BF16 products: max |logit error| / max |logit| = %.2e\n",
              max_err / max_abs);
  EXPECT_LE(max_err, 8 * 0x1p-9f * max_abs);
  EXPECT_GT(max_err, 1e-4f);  // the BF16 products ran (fp32 activations stay within 1e-4)
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureForward,
                         ::testing::Values("llada-tiny", "llada-tiny-bf16", "dream-tiny", "llada-c",
                                           "lladamoe-a", "lladamoe-b", "lladamoe-d", "llada2-a",
                                           "llada2-b"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace polestar
