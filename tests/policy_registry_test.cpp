// A new policy is one file: the policy this file registers, and nothing else in the tree
// names it, has its own defaults and rules applied by DecodeOptions and joins the lists the
// shared rules' errors give. Its own binary: it would join every list the decode tests check.
#include "decode/policy_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "decode/option_schema.h"
#include "test_support.h"

namespace polestar {
namespace {

constexpr const char* kEvenSteps = "test-even-steps";

// Vanilla's plan: every step a full pass.
class FullPassPolicy : public Policy {
 public:
  StepPlan Plan(const DecodeContext& context) override {
    StepPlan plan;
    plan.input_rows = Range(0, int(context.canvas.size()));
    return plan;
  }
  std::string StepKind() const override { return step_kind::kFullPass; }
};

const PolicyRegistration kEvenStepsPolicy({
    .name = kEvenSteps,
    .description = "test only: full passes, factor commit at 2, even steps per block",
    .options = {},
    .rank = 40,
    .make = [](const DecodeOptions&, const Model&) -> std::unique_ptr<Policy> {
      return std::make_unique<FullPassPolicy>();
    },
    .block_diffusion = "test only: full passes",
    .resolve =
        [](DecodeOptions& options, const ModelConfig&) {
          if (!options.threshold && !options.factor) options.factor = 2.0;
        },
    .validate =
        [](const DecodeOptions& options, const ModelConfig&) {
          if (options.StepsPerBlock() % 2 != 0) {
            FailOption(OptionOf(&DecodeOptions::steps), " ", options.steps, " gives ",
                       options.StepsPerBlock(), " steps per block; ", kEvenSteps,
                       " takes an even number");
          }
        },
});

DecodeOptions Options(const char* policy, int steps) {
  DecodeOptions o;
  o.policy = policy;
  o.gen_length = 16;
  o.block_length = 8;
  o.steps = steps;
  return o;
}

// The message of the OptionError Validate throws; nullopt when it accepts the options.
std::optional<std::string> ValidationError(const DecodeOptions& o, const ModelConfig& config) {
  try {
    o.Validate(config, 3);
  } catch (const OptionError& e) {
    return e.what();
  }
  return std::nullopt;
}

TEST(OneFilePolicy, ValidateAppliesItsRuleToItAlone) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const ModelConfig& config = model->config();
  EXPECT_EQ(ValidationError(Options(kEvenSteps, 8), config), std::nullopt);
  EXPECT_EQ(ValidationError(Options(kEvenSteps, 10), config),
            "--steps 10 gives 5 steps per block; test-even-steps takes an even number");
  EXPECT_EQ(ValidationError(Options("vanilla", 10), config), std::nullopt);
  // The shared rules come first.
  EXPECT_EQ(ValidationError(Options(kEvenSteps, 7), config),
            "--steps 7 is not divisible by the number of blocks (2)");
  // Through Generate, which validates before any work.
  const std::vector<int> prompt = {1, 2, 3};
  EXPECT_THAT([&] { Generate(*model, prompt, Options(kEvenSteps, 10)); },
              testing::ThrowsErrorContaining({"5 steps per block; test-even-steps"}));
}

TEST(OneFilePolicy, ItsDefaultsApplyWhenItDecodesAndItDecodesThroughGenerate) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const ModelConfig& config = model->config();
  const DecodeOptions resolved = Options(kEvenSteps, 8).Resolved(config);
  EXPECT_EQ(resolved.factor, 2.0);
  EXPECT_EQ(resolved.window, 16);  // Elastic-Cache's, whichever policy decodes
  EXPECT_EQ(Options("vanilla", 8).Resolved(config).factor, std::nullopt);
  DecodeOptions given = Options(kEvenSteps, 8);
  given.threshold = 0.5;
  EXPECT_EQ(given.Resolved(config).factor, std::nullopt);  // another rule given

  // Full passes with factor 2: vanilla's run with --factor 2, token for token.
  const std::vector<int> prompt = {1, 2, 3};
  DecodeOptions vanilla = Options("vanilla", 8);
  vanilla.factor = 2.0;
  const GenerationResult want = Generate(*model, prompt, vanilla);
  const GenerationResult got = Generate(*model, prompt, Options(kEvenSteps, 8));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.nfe, want.nfe);
}

TEST(OneFilePolicy, TheSharedRulesListItWhereItApplies) {
  auto llada2 = Model::Load(testing::FixtureDir("llada2-a"));
  EXPECT_EQ(ValidationError(Options(kEvenSteps, 8), llada2->config()), std::nullopt);
  EXPECT_THAT(
      ValidationError(Options("fast-dllm-dual", 8), llada2->config()).value_or(""),
      ::testing::EndsWith("; use vanilla (LLaDA 2.x's own sampler, earlier blocks cached exactly), "
                          "polestar (LLaDA 2.x's sampler with Polestar-Commit's drift-gated early "
                          "commits) or test-even-steps (test only: full passes)"));
  auto llada = Model::Load(testing::FixtureDir("llada-tiny"));
  DecodeOptions guided = Options("polestar", 8);
  guided.cfg_scale = 1;
  EXPECT_EQ(ValidationError(guided, llada->config()),
            "--cfg-scale is supported by vanilla, fast-dllm-prefix, fast-dllm-dual, "
            "test-even-steps only");
}

}  // namespace
}  // namespace polestar
