#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"
#include "decode/policy.h"
#include "decode/sampling.h"

namespace polestar {
namespace {

enum class Rule { kFixed, kThreshold, kFactor, kDreamSchedule, kDreamThreshold, kDreamOrigin };

struct CommitRule {
  Rule rule = Rule::kFixed;
  DreamConfidence dream_confidence = DreamConfidence::kProbability;
};

CommitRule ChooseRule(const DecodeOptions& options, const ModelConfig& config) {
  CommitRule r;
  if (config.sampler == SamplerFamily::kDream && !options.alg.empty()) {
    if (options.alg == "origin") r.rule = Rule::kDreamOrigin;
    if (options.alg == "confidence_threshold") r.rule = Rule::kDreamThreshold;
    if (options.alg == "maskgit_plus" || options.alg == "topk_margin" || options.alg == "entropy") {
      r.rule = Rule::kDreamSchedule;
      if (options.threshold || options.factor) {
        Fail("--threshold/--factor do not apply to --alg ", options.alg,
             " (use --alg confidence_threshold, or no --alg)");
      }
    }
    if (options.alg == "topk_margin") r.dream_confidence = DreamConfidence::kMargin;
    if (options.alg == "entropy") r.dream_confidence = DreamConfidence::kNegEntropy;
    return r;
  }
  if (options.threshold) {
    r.rule = Rule::kThreshold;
  } else if (options.factor) {
    r.rule = Rule::kFactor;
  } else if (config.sampler == SamplerFamily::kDream) {
    r.rule = Rule::kDreamSchedule;  // Dream without --alg: maskgit_plus confidence
  } else {
    r.rule = Rule::kFixed;
  }
  return r;
}

}  // namespace

bool IsEndToken(const ModelConfig& config, int token) {
  return token == config.eos_id || (config.eot_id >= 0 && token == config.eot_id);
}

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
  const CommitRule rule = ChooseRule(options, config);
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };

  const int prompt_length = int(prompt.size());
  const int length = prompt_length + options.gen_length;
  std::vector<int> canvas(prompt.begin(), prompt.end());  // [L]
  canvas.resize(size_t(length), config.mask_id);

  std::unique_ptr<Policy> policy = MakePolicy(options, model);
  KvCache cache = MakeCache(model, length, policy->NeedsHiddenStates());
  Forward forward(model, cache);
  // Classifier-free guidance runs every plan a second time on the canvas with the prompt
  // masked, with its own cache: logits = un + (scale + 1) (cond - un).
  const bool guided = options.cfg_scale > 0;
  std::vector<int> unconditional;
  KvCache unconditional_cache;
  std::unique_ptr<Forward> unconditional_forward;
  if (guided) {
    unconditional_cache = MakeCache(model, length, false);
    unconditional_forward = std::make_unique<Forward>(model, unconditional_cache);
  }

  Rng rng(options.seed);
  GenerationResult result;
  result.cache_bytes = cache.Bytes() * (guided ? 2 : 1);
  const int block_length = options.EffectiveBlockLength();
  int committed_last_step = 0;

  for (int b = 0; b < options.BlockCount() && !result.cancelled; ++b) {
    const Block block{b, prompt_length + b * block_length, prompt_length + (b + 1) * block_length};
    auto masked_in_block = [&] {
      std::vector<int> positions;
      for (int p = block.start; p < block.end; ++p) {
        if (canvas[size_t(p)] == config.mask_id) positions.push_back(p);
      }
      return positions;
    };
    const int block_masks = int(masked_in_block().size());
    if (block_masks == 0) continue;  // filled by earlier suffix commits

    int steps = options.StepsPerBlock();
    const std::vector<int> fixed_counts = NumTransferTokens(block_masks, steps);
    const std::vector<float> timesteps = DreamTimesteps(steps, float(options.eps));
    int dream_number = block_masks / steps, dream_left = 0;  // confidence_threshold state
    // Every rule commits at least one mask per step once its schedule is spent (and the
    // schedule only extends while it does), so a block ends within its steps plus one step
    // per mask plus Fast-dLLM's extra step. Past that bound decoding is broken: fail, not hang.
    const int step_limit = steps + block_masks + 1;

    for (int step = 0;; ++step) {
      const std::vector<int> block_masked = masked_in_block();
      if (block_masked.empty() && !(step == 1 && policy->RunsStepAfterFilledBlockStart())) break;
      if (step >= step_limit) {
        Fail("decoding made no progress: block ", b, " still has ", block_masked.size(),
             " masks after ", step, " steps");
      }
      DecodeContext context{model,          options, canvas, prompt_length,
                            config.mask_id, block,   step,   committed_last_step,
                            cache,          forward};
      StepPlan plan = policy->Plan(context);
      const std::vector<int> masked = policy->CommitCandidates(context, block_masked);
      for (int p : masked) plan.logit_rows.push_back(config.PredictingRow(p));
      std::sort(plan.logit_rows.begin(), plan.logit_rows.end());
      plan.logit_rows.erase(std::unique(plan.logit_rows.begin(), plan.logit_rows.end()),
                            plan.logit_rows.end());
      StepResult step_result = forward.Run(canvas, plan);
      result.nfe += 1;
      result.rows_computed += step_result.rows_computed;
      result.kv_rows_written += step_result.kv_rows_written;
      if (guided) {
        unconditional = canvas;
        std::fill(unconditional.begin(), unconditional.begin() + prompt_length, config.mask_id);
        StepPlan plain = plan;
        plain.hook = nullptr;
        const StepResult un = unconditional_forward->Run(unconditional, plain);
        PS_CHECK(un.logits.size() == step_result.logits.size());
        const float scale = float(options.cfg_scale);
        for (size_t i = 0; i < un.logits.size(); ++i) {
          step_result.logits[i] =
              un.logits[i] + (scale + 1) * (step_result.logits[i] - un.logits[i]);
        }
      }

      for (size_t i = 0; i < step_result.logits.size(); ++i) {
        if (!std::isfinite(step_result.logits[i])) {
          Fail(model.source(), ": the model produced a non-finite logit (", step_result.logits[i],
               ") in forward pass ", result.nfe, " (NaN or infinite weights?)");
        }
      }

      // Token and confidence for every masked position of the block.
      auto row_logits = [&](int position) {
        const int row = config.PredictingRow(position);
        const auto it =
            std::lower_bound(step_result.logit_rows.begin(), step_result.logit_rows.end(), row);
        PS_CHECK(it != step_result.logit_rows.end() && *it == row);
        const size_t index = size_t(it - step_result.logit_rows.begin());
        return std::span<const float>(&step_result.logits[index * config.vocab],
                                      size_t(config.vocab));
      };
      std::vector<TokenChoice> choices;
      std::vector<double> confidence;
      std::vector<size_t> selected;
      if (rule.rule == Rule::kDreamOrigin) {
        const bool last = step >= steps - 1;
        const double p_transfer =
            last ? 1.0
                 : 1.0 - double(timesteps[size_t(step) + 1]) / double(timesteps[size_t(step)]);
        for (size_t i = 0; i < masked.size(); ++i) {
          if (std::uniform_real_distribution<double>(0, 1)(rng) < p_transfer) {
            choices.push_back(ChooseDream(row_logits(masked[i]), config.mask_id,
                                          options.temperature, options.top_p, options.top_k,
                                          DreamConfidence::kProbability, rng));
            selected.push_back(i);
          } else {
            choices.push_back({});
          }
        }
      } else {
        for (int p : masked) {
          choices.push_back(config.sampler == SamplerFamily::kDream
                                ? ChooseDream(row_logits(p), config.mask_id, options.temperature,
                                              options.top_p, options.top_k, rule.dream_confidence,
                                              rng)
                                : ChooseLlada(row_logits(p), config.mask_id, options.temperature,
                                              options.remasking == "random", rng));
          confidence.push_back(choices.back().confidence);
        }
        switch (rule.rule) {
          case Rule::kFixed:
            selected =
                SelectTopK(confidence, size_t(fixed_counts[size_t(std::min(step, steps - 1))]));
            break;
          case Rule::kThreshold:
            selected = SelectThreshold(confidence, *options.threshold);
            break;
          case Rule::kFactor:
            selected = SelectFactor(confidence, *options.factor);
            break;
          case Rule::kDreamSchedule: {
            const size_t count =
                size_t(DreamTransferCount(int(masked.size()), step, steps, timesteps));
            selected = options.alg_temp > 0
                           ? SampleWithoutReplacement(confidence, options.alg_temp, count, rng)
                           : SelectTopK(confidence, count);
            break;
          }
          case Rule::kDreamThreshold: {
            // Fast-dLLM's Dream confidence_threshold: masks/steps per step, tokens below the
            // threshold are carried to the next step; at the last step the schedule extends.
            const int wanted = dream_number + dream_left;
            dream_left = 0;
            const std::vector<size_t> order = SelectTopK(confidence, size_t(wanted));
            for (size_t k = 0; k < order.size(); ++k) {
              const double threshold = options.threshold.value_or(0.9);
              if (k == 0 || confidence[order[k]] >= threshold) {
                selected.push_back(order[k]);
              } else if (step < steps - 1) {
                ++dream_left;
              } else {
                dream_number = 0;
                ++steps;
                ++dream_left;
              }
            }
            break;
          }
          case Rule::kDreamOrigin:
            break;
        }
      }
      std::vector<Commit> commits;
      for (size_t i : selected) commits.push_back({masked[i], choices[i].token});
      std::vector<Candidate> candidates;
      for (size_t i = 0; i < masked.size(); ++i) {
        if (rule.rule != Rule::kDreamOrigin)
          candidates.push_back({masked[i], choices[i].token, choices[i].confidence});
      }
      policy->AfterStep(context, step_result, candidates, commits);

      std::vector<int> committed;
      for (const Commit& c : commits) {
        PS_CHECK(canvas[size_t(c.position)] == config.mask_id);
        canvas[size_t(c.position)] = c.token;
        committed.push_back(c.position);
      }
      std::sort(committed.begin(), committed.end());
      committed_last_step = int(committed.size());
      if (keep_trace) {
        nlohmann::json entry = {{"nfe", result.nfe}, {"block", b}, {"committed", committed}};
        nlohmann::json stats = policy->StepStats();
        if (!stats.empty()) entry["policy"] = stats;
        result.trace.push_back(std::move(entry));
      }
      if (on_step) {
        int masks_left = 0;
        for (int p = prompt_length; p < length; ++p)
          masks_left += canvas[size_t(p)] == config.mask_id;
        StepEvent event{result.nfe, b, canvas, committed, masks_left, elapsed()};
        if (!on_step(event)) {
          result.cancelled = true;
          break;
        }
      }
    }
  }

  result.seconds = elapsed();
  result.tokens = canvas;
  result.generated.assign(canvas.begin() + prompt_length, canvas.end());
  bool ended = false;
  for (int token : result.generated) {
    const bool end = IsEndToken(config, token);
    ended = ended || end;
    if (!ended) ++result.tokens_until_eos;
    if (!end) ++result.non_eos_tokens;
  }
  return result;
}

}  // namespace polestar
