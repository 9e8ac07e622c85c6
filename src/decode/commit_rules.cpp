#include "decode/commit_rules.h"

#include <algorithm>

#include "base/error.h"
#include "decode/option_schema.h"

namespace polestar {

TokenSampler::TokenSampler(const ModelConfig& config, const DecodeOptions& options,
                           DreamConfidence confidence)
    : config_(config), options_(options), confidence_(confidence) {}

namespace {

// LLaDA 2.x generate samples as Dream does (logits / T, top-k, top-p, fp32 softmax; the
// chosen token's probability is its confidence).
bool SamplesAsDream(const ModelConfig& config) {
  return config.sampler == SamplerFamily::kDream || config.sampler == SamplerFamily::kLlada2;
}

}  // namespace

TokenChoice TokenSampler::operator()(const LogitRow& row, Rng& rng) const {
  if (row.choice != nullptr) {
    PS_CHECK(Greedy() == *row.spec);
    return FromGreedy(*row.choice, *row.spec, rng);
  }
  if (SamplesAsDream(config_)) {
    return ChooseDream(row.logits, config_.mask_id, options_.temperature, options_.top_p,
                       options_.top_k, confidence_, rng);
  }
  return ChooseLlada(row.logits, config_.mask_id, options_.temperature,
                     options_.remasking == Remasking::kRandom, rng);
}

std::optional<GreedySpec> TokenSampler::Greedy() const {
  if (options_.temperature > 0) return std::nullopt;
  if (!SamplesAsDream(config_))
    return LladaGreedySpec(config_.mask_id, options_.remasking == Remasking::kRandom);
  if (DreamFilters(options_.top_p, options_.top_k)) return std::nullopt;
  return DreamGreedySpec(config_.mask_id, confidence_);
}

namespace {

// The rules that draw every candidate's token first and then select among the confidences.
class SelectingRule : public CommitRule {
 public:
  explicit SelectingRule(TokenSampler sampler) : sampler_(std::move(sampler)) {}

  RuleDecision Decide(std::span<const int> masked, int step, const LogitsOf& logits,
                      Rng& rng) override {
    RuleDecision decision;
    std::vector<double> confidence;  // [|masked|]
    for (int p : masked) {
      decision.choices.push_back(sampler_(logits(p), rng));
      confidence.push_back(decision.choices.back().confidence);
    }
    decision.selected = Select(confidence, step, rng);
    return decision;
  }
  std::optional<GreedySpec> Greedy() const override { return sampler_.Greedy(); }

 protected:
  virtual std::vector<size_t> Select(std::span<const double> confidence, int step, Rng& rng) = 0;

 private:
  TokenSampler sampler_;
};

// LLaDA 2.x generate: step i of a block commits every mask whose confidence exceeds the
// threshold when at least n_i do, else the n_i most confident, where n_i is the block
// length split over the steps (from the block length, not the block's mask count).
class BlockThresholdRule : public SelectingRule {
 public:
  BlockThresholdRule(TokenSampler sampler, double threshold, int block_length)
      : SelectingRule(std::move(sampler)), threshold_(threshold), block_length_(block_length) {}
  void StartBlock(int, int steps) override { counts_ = NumTransferTokens(block_length_, steps); }

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int step, Rng&) override {
    // The schedule sums to the block length, so a block ends within it; past it (never on
    // the reference's path) everything left commits.
    const size_t count =
        step < int(counts_.size()) ? size_t(counts_[size_t(step)]) : confidence.size();
    std::vector<size_t> high;
    for (size_t i = 0; i < confidence.size(); ++i) {
      if (confidence[i] > threshold_) high.push_back(i);
    }
    if (high.size() >= count) return high;
    return SelectTopK(confidence, std::min(count, confidence.size()));
  }

 private:
  double threshold_;
  int block_length_;
  std::vector<int> counts_;
};

class FixedCountRule : public SelectingRule {
 public:
  using SelectingRule::SelectingRule;
  void StartBlock(int block_masks, int steps) override {
    counts_ = NumTransferTokens(block_masks, steps);
  }

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int step, Rng&) override {
    // Past the schedule (Fast-dLLM's extra step) the last step's count applies.
    return SelectTopK(confidence, size_t(counts_[size_t(std::min(step, int(counts_.size()) - 1))]));
  }

 private:
  std::vector<int> counts_;  // [steps]
};

class ThresholdRule : public SelectingRule {
 public:
  ThresholdRule(TokenSampler sampler, double threshold)
      : SelectingRule(std::move(sampler)), threshold_(threshold) {}
  void StartBlock(int, int) override {}

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int, Rng&) override {
    return SelectThreshold(confidence, threshold_);
  }

 private:
  double threshold_;
};

class FactorRule : public SelectingRule {
 public:
  FactorRule(TokenSampler sampler, double factor)
      : SelectingRule(std::move(sampler)), factor_(factor) {}
  void StartBlock(int, int) override {}

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int, Rng&) override {
    return SelectFactor(confidence, factor_);
  }

 private:
  double factor_;
};

class DreamScheduleRule : public SelectingRule {
 public:
  DreamScheduleRule(TokenSampler sampler, const DecodeOptions& options)
      : SelectingRule(std::move(sampler)), eps_(float(options.eps)), alg_temp_(options.alg_temp) {}
  void StartBlock(int, int steps) override {
    steps_ = steps;
    timesteps_ = DreamTimesteps(steps, eps_);
  }

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int step, Rng& rng) override {
    const size_t count =
        size_t(DreamTransferCount(int(confidence.size()), step, steps_, timesteps_));
    return alg_temp_ > 0 ? SampleWithoutReplacement(confidence, alg_temp_, count, rng)
                         : SelectTopK(confidence, count);
  }

 private:
  float eps_;
  double alg_temp_;
  int steps_ = 0;
  std::vector<float> timesteps_;  // [steps + 1]
};

// Fast-dLLM's Dream confidence_threshold: masks/steps per step; tokens below the threshold
// are carried to the next step, and at the last step the schedule extends by one.
class DreamThresholdRule : public SelectingRule {
 public:
  DreamThresholdRule(TokenSampler sampler, double threshold)
      : SelectingRule(std::move(sampler)), threshold_(threshold) {}
  void StartBlock(int block_masks, int steps) override {
    steps_ = steps;
    number_ = block_masks / steps;
    left_ = 0;
  }

 protected:
  std::vector<size_t> Select(std::span<const double> confidence, int step, Rng&) override {
    const int wanted = number_ + left_;
    left_ = 0;
    std::vector<size_t> selected;
    const std::vector<size_t> order = SelectTopK(confidence, size_t(wanted));
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || confidence[order[k]] >= threshold_) {
        selected.push_back(order[k]);
      } else if (step < steps_ - 1) {
        ++left_;
      } else {
        number_ = 0;
        ++steps_;
        ++left_;
      }
    }
    return selected;
  }

 private:
  double threshold_;
  int steps_ = 0, number_ = 0, left_ = 0;
};

// Dream's origin: each mask commits with probability 1 - t_{i+1} / t_i (all at the last
// step); only those draw a token.
class DreamOriginRule : public CommitRule {
 public:
  DreamOriginRule(TokenSampler sampler, const DecodeOptions& options)
      : sampler_(std::move(sampler)), eps_(float(options.eps)) {}
  void StartBlock(int, int steps) override {
    steps_ = steps;
    timesteps_ = DreamTimesteps(steps, eps_);
  }
  RuleDecision Decide(std::span<const int> masked, int step, const LogitsOf& logits,
                      Rng& rng) override {
    RuleDecision decision;
    decision.offers_candidates = false;
    const bool last = step >= steps_ - 1;
    const double p_transfer =
        last ? 1.0 : 1.0 - double(timesteps_[size_t(step) + 1]) / double(timesteps_[size_t(step)]);
    for (size_t i = 0; i < masked.size(); ++i) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p_transfer) {
        decision.choices.push_back(sampler_(logits(masked[i]), rng));
        decision.selected.push_back(i);
      } else {
        decision.choices.push_back({});
      }
    }
    return decision;
  }
  std::optional<GreedySpec> Greedy() const override { return sampler_.Greedy(); }

 private:
  TokenSampler sampler_;
  float eps_;
  int steps_ = 0;
  std::vector<float> timesteps_;  // [steps + 1]
};

}  // namespace

std::unique_ptr<CommitRule> MakeCommitRule(const DecodeOptions& options,
                                           const ModelConfig& config) {
  const bool dream = config.sampler == SamplerFamily::kDream;
  if (dream && options.alg != DreamAlg::kUnset) {
    const TokenSampler sampler(config, options);
    if (options.alg == DreamAlg::kOrigin)
      return std::make_unique<DreamOriginRule>(sampler, options);
    if (options.alg == DreamAlg::kConfidenceThreshold) {
      return std::make_unique<DreamThresholdRule>(sampler, options.threshold.value_or(0.9));
    }
    if (options.threshold || options.factor) {
      Fail("--threshold/--factor do not apply to --alg ",
           ModeName(OptionOf(&DecodeOptions::alg), options.alg),
           " (use --alg confidence_threshold, or no --alg)");
    }
    const DreamConfidence confidence =
        options.alg == DreamAlg::kTopkMargin ? DreamConfidence::kMargin
        : options.alg == DreamAlg::kEntropy  ? DreamConfidence::kNegEntropy
                                             : DreamConfidence::kProbability;  // maskgit_plus
    return std::make_unique<DreamScheduleRule>(TokenSampler(config, options, confidence), options);
  }
  const TokenSampler sampler(config, options);
  if (config.sampler == SamplerFamily::kLlada2) {
    return std::make_unique<BlockThresholdRule>(sampler, options.threshold.value_or(0.95),
                                                options.block_length);
  }
  if (options.threshold) return std::make_unique<ThresholdRule>(sampler, *options.threshold);
  if (options.factor) return std::make_unique<FactorRule>(sampler, *options.factor);
  // Dream without --alg: maskgit_plus confidence.
  if (dream) return std::make_unique<DreamScheduleRule>(sampler, options);
  return std::make_unique<FixedCountRule>(sampler);
}

}  // namespace polestar
