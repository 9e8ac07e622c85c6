// The commit rules on hand-made logits: which positions each rule commits, to which tokens.
#include "decode/commit_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>

#include "base/error.h"

namespace polestar {
namespace {

using ::testing::ElementsAre;

constexpr int kVocab = 4, kMask = 3;

ModelConfig Config(SamplerFamily sampler) {
  ModelConfig config;
  config.vocab = kVocab;
  config.mask_id = kMask;
  config.sampler = sampler;
  return config;
}

// One logits row per position: token `token` at logit `logit`, the others at 0; the mask
// token (never chosen) by default one above, so a rule that chose it would show.
class Logits {
 public:
  void Set(int position, int token, float logit, std::optional<float> mask_logit = {}) {
    std::vector<float>& row = rows_[position];
    row.assign(kVocab, 0.0f);
    row[size_t(token)] = logit;
    row[kMask] = mask_logit.value_or(logit + 1);
  }
  LogitsOf Lookup() const {
    return [this](int position) { return std::span<const float>(rows_.at(position)); };
  }
  // The softmax probability of `token` in the row of `position`.
  double Confidence(int position, int token) const {
    const std::vector<float>& row = rows_.at(position);
    double total = 0;
    for (float l : row) total += std::exp(double(l));
    return std::exp(double(row[size_t(token)])) / total;
  }

 private:
  std::map<int, std::vector<float>> rows_;
};

std::vector<int> Committed(const RuleDecision& decision, std::span<const int> masked) {
  std::vector<int> positions;
  for (size_t i : decision.selected) positions.push_back(masked[i]);
  return positions;
}

TEST(CommitRuleStrategies, FixedCountCommitsTheScheduleMostConfidentFirst) {
  const ModelConfig config = Config(SamplerFamily::kLlada);
  const DecodeOptions options;
  Logits logits;
  logits.Set(10, 1, 2.0f);
  logits.Set(11, 2, 5.0f);
  logits.Set(12, 0, 3.0f);
  logits.Set(13, 1, 1.0f);
  const std::vector<int> masked = {10, 11, 12, 13};
  std::unique_ptr<CommitRule> rule = MakeCommitRule(options, config);
  rule->StartBlock(4, 2);  // two tokens a step
  Rng rng(0);
  const RuleDecision decision = rule->Decide(masked, 0, logits.Lookup(), rng);
  EXPECT_THAT(Committed(decision, masked), ElementsAre(11, 12));
  ASSERT_EQ(decision.choices.size(), 4u);
  EXPECT_EQ(decision.choices[1].token, 2);  // the argmax, never the mask
  EXPECT_NEAR(decision.choices[1].confidence, logits.Confidence(11, 2), 1e-12);
  EXPECT_TRUE(decision.offers_candidates);
  // Past the schedule (Fast-dLLM's extra step) the last step's count applies.
  const std::vector<int> left = {10, 13};
  EXPECT_THAT(Committed(rule->Decide(left, 5, logits.Lookup(), rng), left), ElementsAre(10, 13));
}

TEST(CommitRuleStrategies, ThresholdCommitsTheBestAndEveryOtherAboveIt) {
  const ModelConfig config = Config(SamplerFamily::kLlada);
  DecodeOptions options;
  Logits logits;
  logits.Set(0, 1, 6.0f);
  logits.Set(1, 1, 9.0f);
  logits.Set(2, 1, 1.0f);
  options.threshold = 0.5 * (logits.Confidence(0, 1) + logits.Confidence(2, 1));
  const std::vector<int> masked = {0, 1, 2};
  std::unique_ptr<CommitRule> rule = MakeCommitRule(options, config);
  rule->StartBlock(3, 3);
  Rng rng(0);
  EXPECT_THAT(Committed(rule->Decide(masked, 0, logits.Lookup(), rng), masked), ElementsAre(1, 0));
  // Nothing above the threshold: the most confident still commits.
  options.threshold = 1.0;
  rule = MakeCommitRule(options, config);
  rule->StartBlock(3, 3);
  EXPECT_THAT(Committed(rule->Decide(masked, 0, logits.Lookup(), rng), masked), ElementsAre(1));
}

TEST(CommitRuleStrategies, FactorAcceptsWhileConfidenceClearsItsBar) {
  const ModelConfig config = Config(SamplerFamily::kLlada);
  DecodeOptions options;
  options.factor = 1.0;  // n-th (from 1) accepted while conf_n >= 1 - 1 / (n + 1)
  Logits logits;
  logits.Set(0, 1, 9.0f, 0.0f);  // conf 0.9996
  logits.Set(1, 1, 9.0f, 0.0f);
  logits.Set(2, 1, 0.0f);  // conf 0.14 < 1 - 1/4
  logits.Set(3, 1, 0.0f);
  const std::vector<int> masked = {0, 1, 2, 3};
  ASSERT_GE(logits.Confidence(1, 1), 1 - 1.0 / 3);
  std::unique_ptr<CommitRule> rule = MakeCommitRule(options, config);
  rule->StartBlock(4, 4);
  Rng rng(0);
  EXPECT_THAT(Committed(rule->Decide(masked, 0, logits.Lookup(), rng), masked), ElementsAre(0, 1));
}

TEST(CommitRuleStrategies, DreamOriginDrawsOnlyTheCommittedAndOffersNoCandidates) {
  const ModelConfig config = Config(SamplerFamily::kDream);
  DecodeOptions options;
  options.alg = DreamAlg::kOrigin;
  Logits logits;
  for (int p = 0; p < 3; ++p) logits.Set(p, 2, 4.0f);
  const std::vector<int> masked = {0, 1, 2};
  std::unique_ptr<CommitRule> rule = MakeCommitRule(options, config);
  rule->StartBlock(3, 1);  // one step: the last, every mask commits
  Rng rng(7);
  const RuleDecision decision = rule->Decide(masked, 0, logits.Lookup(), rng);
  EXPECT_FALSE(decision.offers_candidates);
  EXPECT_THAT(Committed(decision, masked), ElementsAre(0, 1, 2));
  for (const TokenChoice& choice : decision.choices) EXPECT_EQ(choice.token, 2);
}

TEST(CommitRuleStrategies, DreamConfidenceThresholdCarriesTheRestAndExtendsAtTheLastStep) {
  const ModelConfig config = Config(SamplerFamily::kDream);
  DecodeOptions options;
  options.alg = DreamAlg::kConfidenceThreshold;
  options.threshold = 0.99;  // no token clears it: only each step's most confident commits
  Logits logits;
  for (int p = 0; p < 4; ++p) logits.Set(p, 1, float(p));
  std::unique_ptr<CommitRule> rule = MakeCommitRule(options, config);
  rule->StartBlock(4, 2);  // 2 a step
  Rng rng(0);
  std::vector<int> masked = {0, 1, 2, 3};
  EXPECT_THAT(Committed(rule->Decide(masked, 0, logits.Lookup(), rng), masked), ElementsAre(3));
  // One carried: three wanted, one commits, and at the last step the schedule extends.
  masked = {0, 1, 2};
  EXPECT_THAT(Committed(rule->Decide(masked, 1, logits.Lookup(), rng), masked), ElementsAre(2));
  masked = {0, 1};
  EXPECT_THAT(Committed(rule->Decide(masked, 2, logits.Lookup(), rng), masked), ElementsAre(1));
}

TEST(CommitRuleStrategies, DreamScheduleSamplersRefuseThresholdAndFactor) {
  const ModelConfig config = Config(SamplerFamily::kDream);
  DecodeOptions options;
  options.alg = DreamAlg::kEntropy;
  options.threshold = 0.9;
  EXPECT_THROW(MakeCommitRule(options, config), Error);
  options.threshold.reset();
  EXPECT_NO_THROW(MakeCommitRule(options, config));
}

}  // namespace
}  // namespace polestar
