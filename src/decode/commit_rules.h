// The shared commit rules: each step, which masked positions of the current block commit, and
// to which tokens. One strategy per rule of the reference decoders:
//   fixed      LLaDA generate.py: the schedule's count, most confident first;
//   threshold  Fast-dLLM: the most confident, plus every other with confidence >= t;
//   factor     Fast-dLLM: the n-th most confident while conf_n >= 1 - f / (n + 1);
//   dream      Dream diffusion_generate (maskgit_plus, topk_margin, entropy): its time
//              schedule's count, by its confidence kind, optionally sampled (alg_temp);
//   dream-threshold  Fast-dLLM's Dream confidence_threshold;
//   dream-origin     Dream's origin: every mask commits with the schedule's probability;
//   block-threshold  LLaDA 2.x generate: every mask above the threshold when at least the
//                    schedule's count are, else that count, most confident first.
// A rule draws each position's token with the checkpoint's sampler family (TokenSampler), so
// the random stream is consumed in the reference's order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "decode/options.h"
#include "decode/sampling.h"
#include "model/config.h"
#include "model/forward.h"

namespace polestar {

// Draws the token and confidence of one masked position from its logits row, as the
// reference sampler of the model's family does.
class TokenSampler {
 public:
  TokenSampler(const ModelConfig& config, const DecodeOptions& options,
               DreamConfidence confidence = DreamConfidence::kProbability);
  // From the row's logits, or from the backend's greedy choice by Greedy()'s spec.
  TokenChoice operator()(const LogitRow& row, Rng& rng) const;
  // The spec by which the backend's greedy choice of a row is this sampler's choice: at
  // temperature 0, unless Dream's top-p / top-k filter the row first. Otherwise the sampler
  // reads the logits.
  std::optional<GreedySpec> Greedy() const;

 private:
  const ModelConfig& config_;
  const DecodeOptions& options_;
  DreamConfidence confidence_;
};

// The logit row that predicts a canvas position, from the step's result.
using LogitsOf = std::function<LogitRow(int position)>;

struct RuleDecision {
  std::vector<TokenChoice> choices;  // [|masked|]: what the rule drew for each position
  std::vector<size_t> selected;      // indices into masked, in the rule's order
  // Whether `choices` are the policy's commit candidates. Dream's origin draws a token only
  // for the positions it commits, so it offers none.
  bool offers_candidates = true;
};

class CommitRule {
 public:
  virtual ~CommitRule() = default;
  // At the start of each block with masks: its mask count and its steps.
  virtual void StartBlock(int block_masks, int steps) = 0;
  // `masked`: the block's commit candidates this step (ascending); `step`: 0 at the block's
  // first forward.
  virtual RuleDecision Decide(std::span<const int> masked, int step, const LogitsOf& logits,
                              Rng& rng) = 0;
  // Its sampler's Greedy(): what the step's logit rows may return in place of their logits.
  virtual std::optional<GreedySpec> Greedy() const = 0;
};

// The rule the options select for this model (Dream's --alg, --threshold, --factor, or the
// sampler family's default). Throws Error for combinations no rule reads.
std::unique_ptr<CommitRule> MakeCommitRule(const DecodeOptions& options, const ModelConfig& config);

}  // namespace polestar
