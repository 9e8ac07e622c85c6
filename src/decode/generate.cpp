#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "base/error.h"
#include "decode/commit_rules.h"
#include "decode/policy.h"

namespace polestar {

bool IsEndToken(const ModelConfig& config, int token) {
  return token == config.eos_id || (config.eot_id >= 0 && token == config.eot_id);
}

namespace {

// Classifier-free guidance runs every plan a second time on the canvas with the prompt
// masked, with its own cache: logits = un + (scale + 1) (cond - un).
class Guidance {
 public:
  Guidance(const Model& model, int length, double scale)
      : cache_(MakeCache(model, length, false)), forward_(model, cache_), scale_(float(scale)) {}

  int64_t CacheBytes() const { return cache_.Bytes(); }

  void Apply(std::span<const int> canvas, int prompt_length, int mask_id, const StepPlan& plan,
             StepResult& conditional) {
    unconditional_.assign(canvas.begin(), canvas.end());
    std::fill(unconditional_.begin(), unconditional_.begin() + prompt_length, mask_id);
    StepPlan plain = plan;
    plain.hook = nullptr;
    const StepResult un = forward_.Run(unconditional_, plain);
    PS_CHECK(un.logits.size() == conditional.logits.size());
    for (size_t i = 0; i < un.logits.size(); ++i) {
      conditional.logits[i] = un.logits[i] + (scale_ + 1) * (conditional.logits[i] - un.logits[i]);
    }
  }

 private:
  KvCache cache_;
  Forward forward_;
  float scale_;
  std::vector<int> unconditional_;  // [L]: the canvas with the prompt masked
};

// One generation: the block loop, each step's forward, the commit rule, the policy's own
// commits and the bookkeeping of the result.
class Decoder {
 public:
  Decoder(const Model& model, std::span<const int> prompt, const DecodeOptions& options,
          const StepCallback& on_step, bool keep_trace)
      : model_(model),
        config_(model.config()),
        options_(options),
        on_step_(on_step),
        keep_trace_(keep_trace),
        prompt_length_(int(prompt.size())),
        length_(prompt_length_ + options.gen_length),
        canvas_(prompt.begin(), prompt.end()),
        policy_(MakePolicy(options, model)),
        rule_(MakeCommitRule(options, config_)),
        cache_(MakeCache(model, length_, policy_->NeedsHiddenStates())),
        forward_(model, cache_),
        rng_(options.seed) {
    canvas_.resize(size_t(length_), config_.mask_id);
    if (options.cfg_scale > 0) guidance_.emplace(model, length_, options.cfg_scale);
    result_.cache_bytes = cache_.Bytes() + (guidance_ ? guidance_->CacheBytes() : 0);
  }

  GenerationResult Run() {
    for (int b = 0; b < options_.BlockCount() && !result_.cancelled; ++b) DecodeBlock(b);
    result_.seconds = Elapsed();
    result_.tokens = canvas_;
    result_.generated.assign(canvas_.begin() + prompt_length_, canvas_.end());
    CountEndTokens();
    return std::move(result_);
  }

 private:
  std::vector<int> MaskedIn(const Block& block) const {
    std::vector<int> positions;
    for (int p = block.start; p < block.end; ++p) {
      if (canvas_[size_t(p)] == config_.mask_id) positions.push_back(p);
    }
    return positions;
  }

  void DecodeBlock(int b) {
    const int block_length = options_.EffectiveBlockLength();
    const Block block{b, prompt_length_ + b * block_length,
                      prompt_length_ + (b + 1) * block_length};
    const int block_masks = int(MaskedIn(block).size());
    if (block_masks == 0) return;  // filled by earlier suffix commits
    const int steps = options_.StepsPerBlock();
    rule_->StartBlock(block_masks, steps);
    // Every rule commits at least one mask per step once its schedule is spent (and the
    // schedule only extends while it does), so a block ends within its steps plus one step
    // per mask plus Fast-dLLM's extra step. Past that bound decoding is broken: fail, not hang.
    const int step_limit = steps + block_masks + 1;
    for (int step = 0;; ++step) {
      const std::vector<int> block_masked = MaskedIn(block);
      if (block_masked.empty() && !(step == 1 && policy_->RunsStepAfterFilledBlockStart())) break;
      if (step >= step_limit) {
        Fail("decoding made no progress: block ", b, " still has ", block_masked.size(),
             " masks after ", step, " steps");
      }
      if (!Step(block, step, block_masked)) {
        result_.cancelled = true;
        return;
      }
    }
  }

  // One forward and its commits; false when the step callback cancels.
  bool Step(const Block& block, int step, std::vector<int> block_masked) {
    DecodeContext context{model_,          options_, canvas_, prompt_length_,
                          config_.mask_id, block,    step,    committed_last_step_,
                          forward_};
    StepPlan plan = policy_->Plan(context);
    const std::vector<int> masked = policy_->CommitCandidates(context, std::move(block_masked));
    for (int p : masked) plan.logit_rows.push_back(config_.PredictingRow(p));
    std::sort(plan.logit_rows.begin(), plan.logit_rows.end());
    plan.logit_rows.erase(std::unique(plan.logit_rows.begin(), plan.logit_rows.end()),
                          plan.logit_rows.end());
    StepResult step_result = forward_.Run(canvas_, plan);
    result_.nfe += 1;
    result_.rows_computed += step_result.rows_computed;
    result_.kv_rows_written += step_result.kv_rows_written;
    if (guidance_) guidance_->Apply(canvas_, prompt_length_, config_.mask_id, plan, step_result);
    RequireFinite(step_result.logits);

    auto logits_of = [&](int position) {
      const int row = config_.PredictingRow(position);
      const auto it =
          std::lower_bound(step_result.logit_rows.begin(), step_result.logit_rows.end(), row);
      PS_CHECK(it != step_result.logit_rows.end() && *it == row);
      const size_t index = size_t(it - step_result.logit_rows.begin());
      return std::span<const float>(&step_result.logits[index * config_.vocab],
                                    size_t(config_.vocab));
    };
    const RuleDecision decision = rule_->Decide(masked, step, logits_of, rng_);
    std::vector<Commit> commits;
    for (size_t i : decision.selected) commits.push_back({masked[i], decision.choices[i].token});
    std::vector<Candidate> candidates;
    if (decision.offers_candidates) {
      for (size_t i = 0; i < masked.size(); ++i) {
        candidates.push_back(
            {masked[i], decision.choices[i].token, decision.choices[i].confidence});
      }
    }
    policy_->AfterStep(context, step_result, candidates, commits);
    return Apply(block.index, commits);
  }

  void RequireFinite(std::span<const float> logits) const {
    for (float logit : logits) {
      if (!std::isfinite(logit)) {
        Fail(model_.source(), ": the model produced a non-finite logit (", logit,
             ") in forward pass ", result_.nfe, " (NaN or infinite weights?)");
      }
    }
  }

  // Writes the commits into the canvas, records the step; false when the callback cancels.
  bool Apply(int block_index, std::span<const Commit> commits) {
    std::vector<int> committed;
    for (const Commit& c : commits) {
      PS_CHECK(canvas_[size_t(c.position)] == config_.mask_id);
      canvas_[size_t(c.position)] = c.token;
      committed.push_back(c.position);
    }
    std::sort(committed.begin(), committed.end());
    committed_last_step_ = int(committed.size());
    if (keep_trace_) {
      nlohmann::json entry = {
          {"nfe", result_.nfe}, {"block", block_index}, {"committed", committed}};
      nlohmann::json stats = policy_->StepStats();
      if (!stats.empty()) entry["policy"] = stats;
      result_.trace.push_back(std::move(entry));
    }
    if (!on_step_) return true;
    int masks_left = 0;
    for (int p = prompt_length_; p < length_; ++p)
      masks_left += canvas_[size_t(p)] == config_.mask_id;
    const StepEvent event{result_.nfe, block_index, canvas_, committed, masks_left, Elapsed()};
    return on_step_(event);
  }

  // Tokens before the first end token, and tokens that are not end tokens.
  void CountEndTokens() {
    bool ended = false;
    for (int token : result_.generated) {
      const bool end = IsEndToken(config_, token);
      ended = ended || end;
      if (!ended) ++result_.tokens_until_eos;
      if (!end) ++result_.non_eos_tokens;
    }
  }

  double Elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }

  const Model& model_;
  const ModelConfig& config_;
  const DecodeOptions& options_;
  const StepCallback& on_step_;
  const bool keep_trace_;
  const int prompt_length_, length_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::vector<int> canvas_;  // [L]: prompt + canvas
  std::unique_ptr<Policy> policy_;
  std::unique_ptr<CommitRule> rule_;
  KvCache cache_;
  Forward forward_;
  std::optional<Guidance> guidance_;
  Rng rng_;
  int committed_last_step_ = 0;
  GenerationResult result_;
};

}  // namespace

GenerationResult Generate(const Model& model, std::span<const int> prompt,
                          const DecodeOptions& requested, const StepCallback& on_step,
                          bool keep_trace) {
  const ModelConfig& config = model.config();
  requested.Validate(config, int(prompt.size()));
  const DecodeOptions options = requested.Resolved(config);
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab) {
      Fail("prompt token ", prompt[i], " at position ", i, " is outside the vocabulary of ",
           config.vocab);
    }
  }
  return Decoder(model, prompt, options, on_step, keep_trace).Run();
}

}  // namespace polestar
