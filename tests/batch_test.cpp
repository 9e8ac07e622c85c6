// Batch invariance, the standing test of batched decoding: a sequence decoded in a batch,
// beside sequences of other prompts, lengths and policies, gives the tokens, forward count,
// rows and trace of its run alone, for every registered policy on every fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "decode/generate.h"
#include "decode/policy_registry.h"
#include "model/model.h"
#include "test_support.h"

namespace polestar {
namespace {

struct Case {
  std::vector<int> prompt;
  DecodeOptions options;
};

// Two cases per registered policy (so every batch of 8 mixes policies), with prompt lengths
// 3-17, gen lengths 8-32 in blocks of 8, and by turns the policy's own threshold, 0.9 and
// 0.5; one samples at temperature 0.7 and one runs classifier-free guidance (a second
// forward per step, batched too).
std::vector<Case> MixedCases(const Model& model) {
  const ModelConfig& config = model.config();
  std::mt19937 random(7);
  std::vector<Case> cases;
  int n = 0;
  for (int round = 0; round < 2; ++round) {
    for (const PolicyEntry& entry : RegisteredPolicies()) {
      Case c;
      const int prompt_length = 3 + (n * 5) % 15;
      for (int i = 0; i < prompt_length; ++i) {
        int token = int(random() % uint32_t(config.vocab));
        if (token == config.mask_id) token = (token + 1) % config.vocab;
        c.prompt.push_back(token);
      }
      c.options.policy = std::string(entry.name);
      c.options.gen_length = 8 * (1 + n % 4);
      c.options.block_length = 8;
      c.options.steps = c.options.gen_length / (n % 2 == 0 ? 1 : 2);
      if (n % 3 == 1) c.options.threshold = 0.9;
      if (n % 3 == 2) c.options.threshold = 0.5;
      c.options.seed = uint64_t(n);
      cases.push_back(std::move(c));
      ++n;
    }
  }
  cases[1].options.temperature = 0.7;
  if (config.sampler == SamplerFamily::kLlada2) {
    // Block diffusion decodes with its own sampler, alone or with Polestar-Commit (options.cpp
    // ValidateBlockDiffusion).
    for (Case& c : cases) {
      if (c.options.policy != "polestar") c.options.policy = "vanilla";
    }
    cases[2].options.eos_early_stop = true;
    return cases;
  }
  cases[2].options.cfg_scale = 1.5;
  cases[2].options.policy = "vanilla";  // guidance is vanilla's
  return cases;
}

void ExpectSameRun(const GenerationResult& got, const GenerationResult& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.nfe, want.nfe);
  EXPECT_EQ(got.rows_computed, want.rows_computed);
  EXPECT_EQ(got.kv_rows_written, want.kv_rows_written);
  EXPECT_EQ(got.trace, want.trace);  // commits and every policy statistic, drift included
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, EverySequenceDecodesAsItDoesAlone) {
  const std::string dir = testing::FixtureDir(GetParam());
  auto model = Model::Load(GetParam().starts_with("gguf") ? dir + "/model.gguf" : dir);
  const std::vector<Case> cases = MixedCases(*model);
  std::vector<GenerationResult> alone;
  std::vector<GenerationRequest> requests;
  for (const Case& c : cases) {
    alone.push_back(Generate(*model, c.prompt, c.options, nullptr, true));
    requests.push_back({c.prompt, c.options});
  }
  for (int batch : {1, 2, 3, 8}) {
    const std::vector<GenerationResult> batched = GenerateBatch(*model, requests, batch, true);
    ASSERT_EQ(batched.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("batch " + std::to_string(batch) + ", case " + std::to_string(i) + " (" +
                   cases[i].options.policy + ")");
      ExpectSameRun(batched[i], alone[i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFixture, BatchInvariance,
                         ::testing::Values("llada-tiny", "llada-tiny-bf16", "dream-tiny", "llada-c",
                                           "gguf-llada-f16", "gguf-llada-q8_0", "gguf-llada-q4_k_m",
                                           "gguf-dream-q8_0", "lladamoe-a", "lladamoe-b",
                                           "llada2-a", "llada2-b"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Sequences step together; one that finishes, is cancelled or fails leaves the others
// decoding exactly as before.
TEST(StepBatch, ASequenceThatEndsOrFailsLeavesTheOthersUnchanged) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const std::vector<Case> cases = MixedCases(*model);
  const GenerationResult want = Generate(*model, cases[0].prompt, cases[0].options, nullptr, true);

  Sequence kept(*model, cases[0].prompt, cases[0].options, nullptr, true);
  int steps_seen = 0;
  Sequence cancelled(*model, cases[3].prompt, cases[3].options,
                     [&](const StepEvent&) { return ++steps_seen < 2; });
  Sequence* const batch[] = {&cancelled, &kept};
  while (!kept.done()) StepBatch(batch);
  EXPECT_TRUE(cancelled.done());
  EXPECT_EQ(steps_seen, 2);
  EXPECT_TRUE(cancelled.TakeResult().cancelled);
  ExpectSameRun(kept.TakeResult(), want);
  EXPECT_EQ(kept.NextStepRows(), 0);
}

TEST(GenerateBatch, InvalidRequestsFailBeforeAnyWork) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const std::vector<int> prompt = {1, 2, 3};
  const std::vector<int> outside = {1, model->config().vocab};
  DecodeOptions options;
  options.gen_length = 16;
  options.block_length = 8;
  options.steps = 16;
  DecodeOptions bad = options;
  bad.block_length = 5;
  EXPECT_THAT(
      [&] {
        GenerateBatch(*model, std::vector<GenerationRequest>{{prompt, options}}, 0);
      },
      testing::ThrowsErrorContaining({"batch size must be at least 1"}));
  EXPECT_THAT(
      [&] {
        GenerateBatch(*model, std::vector<GenerationRequest>{{prompt, options}, {prompt, bad}}, 2);
      },
      testing::ThrowsErrorContaining({"block"}));
  EXPECT_THAT(
      [&] {
        GenerateBatch(*model, std::vector<GenerationRequest>{{prompt, options}, {outside, options}},
                      2);
      },
      testing::ThrowsErrorContaining({"outside the vocabulary"}));
}

// The KV budget's unit is what a sequence really allocates.
TEST(SequenceCacheBytes, IsWhatTheSequenceHolds) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  for (const Case& c : MixedCases(*model)) {
    SCOPED_TRACE(c.options.policy);
    Sequence sequence(*model, c.prompt, c.options);
    EXPECT_EQ(SequenceCacheBytes(*model, int(c.prompt.size()), c.options), sequence.cache_bytes());
  }
}

}  // namespace
}  // namespace polestar
