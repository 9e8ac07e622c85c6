#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <unordered_map>

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
  TransferBytes transfers() const { return forward_.transfers(); }

  // The unconditional pass of `plan`, to run beside it.
  SequenceStep Step(std::span<const int> canvas, int prompt_length, int mask_id,
                    const StepPlan& plan) {
    unconditional_.assign(canvas.begin(), canvas.end());
    std::fill(unconditional_.begin(), unconditional_.begin() + prompt_length, mask_id);
    plain_ = plan;
    plain_.hook = nullptr;
    return {&forward_, unconditional_, &plain_};
  }

  void Apply(const StepResult& un, StepResult& conditional) const {
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
  StepPlan plain_;                  // the conditional plan without its hook
};

// Where the blocks lie. LLaDA and Dream decode gen_length / B blocks from the prompt's end;
// LLaDA 2.x's blocks are aligned from position 0, so the first decoded block may hold the
// prompt's tail, blocks of prompt alone are never decoded, and the canvas runs to the end of
// the last block (past prompt + gen_length by less than a block).
struct BlockLayout {
  BlockLayout(const ModelConfig& config, const DecodeOptions& options, int prompt_length)
      : length(prompt_length + options.gen_length),
        block_length(options.EffectiveBlockLength()),
        steps(options.StepsPerBlock()),
        origin(prompt_length),
        count(options.BlockCount()) {
    if (config.sampler != SamplerFamily::kLlada2) return;
    origin = 0;
    first = prompt_length / block_length;
    count = (length + block_length - 1) / block_length;
    length = count * block_length;
    steps = std::min(options.steps, options.gen_length);  // steps per block, as its generate
  }
  Block At(int index) const {
    return {index, origin + index * block_length, origin + (index + 1) * block_length};
  }

  int length, block_length, steps;
  int origin;            // where block 0 starts
  int first = 0, count;  // the decoded blocks: [first, count)
};

void CheckPrompt(const ModelConfig& config, std::span<const int> prompt) {
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab) {
      Fail("prompt token ", prompt[i], " at position ", i, " is outside the vocabulary of ",
           config.vocab);
    }
  }
}

}  // namespace

// One generation: the block loop as a sequence of steps, each step's plan, commit rule, the
// policy's own commits and the bookkeeping of the result.
class Decoder {
 public:
  Decoder(const Model& model, std::span<const int> prompt, const DecodeOptions& options,
          StepCallback on_step, bool keep_trace)
      : model_(model),
        config_(model.config()),
        options_(options),
        on_step_(std::move(on_step)),
        keep_trace_(keep_trace),
        prompt_length_(int(prompt.size())),
        layout_(config_, options_, prompt_length_),
        length_(layout_.length),
        canvas_(prompt.begin(), prompt.end()),
        // The policy and the rule keep references to the options: this decoder's own copy.
        policy_(MakePolicy(options_, model)),
        rule_(MakeCommitRule(options_, config_)),
        cache_(MakeCache(model, length_, policy_->NeedsHiddenStates())),
        forward_(model, cache_),
        rng_(options_.seed),
        block_index_(layout_.first) {
    canvas_.resize(size_t(length_), config_.mask_id);
    if (options_.cfg_scale > 0) guidance_.emplace(model, length_, options_.cfg_scale);
    result_.cache_bytes = cache_.Bytes() + (guidance_ ? guidance_->CacheBytes() : 0);
    Advance();
  }
  // The policy goes first: its side-queue job (Polestar's block-start clustering with
  // overlap) may still read the cache through forward_ when decoding stops early (a
  // cancellation, a step callback's stop), and its destructor waits for that job.
  ~Decoder() { policy_.reset(); }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  bool done() const { return done_; }
  int64_t cache_bytes() const { return result_.cache_bytes; }

  // Plans the next step unless it is planned; the forward passes it needs go to `steps`.
  void Plan() {
    if (planned_ || done_) return;
    const DecodeContext context = Context();
    transfers_at_plan_ = Transfers();  // the plan's drift ops count as the step's
    plan_ = policy_->Plan(context);
    masked_ = policy_->CommitCandidates(context, block_masked_);
    for (int p : masked_) plan_.logit_rows.push_back(config_.PredictingRow(p));

    if (config_.sampler == SamplerFamily::kLlada2) plan_.attention_block = layout_.block_length;
    // The rows cross as the backend's greedy choices where the rule reads no more, and as
    // logits where a sampler reads the distribution or guidance combines two passes' logits.
    plan_.greedy = guidance_ ? std::nullopt : rule_->Greedy();
    std::sort(plan_.logit_rows.begin(), plan_.logit_rows.end());
    plan_.logit_rows.erase(std::unique(plan_.logit_rows.begin(), plan_.logit_rows.end()),
                           plan_.logit_rows.end());
    planned_ = true;
  }
  int64_t PlannedRows() const {
    return planned_ ? int64_t(plan_.input_rows.size()) * (guidance_ ? 2 : 1) : 0;
  }
  // The planned step's forwards: this sequence's, then guidance's.
  void AppendSteps(std::vector<SequenceStep>& steps) {
    PS_CHECK(planned_);
    steps.push_back({&forward_, canvas_, &plan_});
    if (guidance_)
      steps.push_back(guidance_->Step(canvas_, prompt_length_, config_.mask_id, plan_));
  }
  int ForwardsPerStep() const { return guidance_ ? 2 : 1; }

  // The commits of the planned step from its forwards' results (as AppendSteps ordered them).
  void Finish(std::span<StepResult> results) {
    PS_CHECK(planned_ && results.size() == size_t(ForwardsPerStep()));
    planned_ = false;
    StepResult& step_result = results[0];
    result_.nfe += 1;
    result_.rows_computed += step_result.rows_computed;
    result_.kv_rows_written += step_result.kv_rows_written;
    result_.layers_replayed += step_result.layers_replayed;
    if (guidance_) guidance_->Apply(results[1], step_result);
    RequireFinite(step_result);

    auto logits_of = [&](int position) {
      const std::optional<LogitRow> row = step_result.Row(config_.PredictingRow(position));
      PS_CHECK(row.has_value());
      return *row;
    };
    const RuleDecision decision = rule_->Decide(masked_, step_, logits_of, rng_);
    std::vector<Commit> commits;
    for (size_t i : decision.selected) commits.push_back({masked_[i], decision.choices[i].token});
    std::vector<Candidate> candidates;
    if (decision.offers_candidates) {
      for (size_t i = 0; i < masked_.size(); ++i) {
        candidates.push_back(
            {masked_[i], decision.choices[i].token, decision.choices[i].confidence});
      }
    }
    policy_->AfterStep(Context(), step_result, candidates, commits);
    if (!Apply(block_.index, commits)) result_.cancelled = true;
    ++step_;
    if (options_.eos_early_stop && EndsEarly(commits)) done_ = true;
    Advance();
  }

  GenerationResult Result() {
    result_.seconds = Elapsed();
    // The prompt and gen_length positions (LLaDA 2.x's canvas may run past them).
    const auto end = canvas_.begin() + prompt_length_ + options_.gen_length;
    result_.tokens.assign(canvas_.begin(), end);
    result_.generated.assign(canvas_.begin() + prompt_length_, end);
    CountEndTokens();
    return std::move(result_);
  }

 private:
  DecodeContext Context() {
    return {model_,          options_, canvas_, prompt_length_,
            config_.mask_id, block_,   step_,   committed_last_step_,
            forward_};
  }

  std::vector<int> MaskedIn(const Block& block) const {
    std::vector<int> positions;
    for (int p = block.start; p < block.end; ++p) {
      if (canvas_[size_t(p)] == config_.mask_id) positions.push_back(p);
    }
    return positions;
  }

  // Moves on to the next step to run (within the block, or the next block with masks), or
  // marks the generation done.
  void Advance() {
    const int steps = layout_.steps;
    while (!done_) {
      if (result_.cancelled || (!in_block_ && block_index_ >= layout_.count)) {
        done_ = true;
        return;
      }
      if (!in_block_) {
        block_ = layout_.At(block_index_);
        const int block_masks = int(MaskedIn(block_).size());
        if (block_masks == 0) {  // filled by earlier suffix commits
          ++block_index_;
          done_ = EndsAfterBlock();
          continue;
        }
        rule_->StartBlock(block_masks, steps);
        // Every rule commits at least one mask per step once its schedule is spent (and the
        // schedule only extends while it does), so a block ends within its steps plus one step
        // per mask plus Fast-dLLM's extra step. Past that bound decoding is broken: fail, not
        // hang.
        step_limit_ = steps + block_masks + 1;
        step_ = 0;
        in_block_ = true;
      }
      block_masked_ = MaskedIn(block_);
      if (block_masked_.empty() && !(step_ == 1 && policy_->RunsStepAfterFilledBlockStart())) {
        in_block_ = false;
        ++block_index_;
        done_ = EndsAfterBlock();
        continue;
      }
      if (step_ >= step_limit_) {
        Fail("decoding made no progress: block ", block_.index, " still has ", block_masked_.size(),
             " masks after ", step_, " steps");
      }
      return;
    }
  }

  // LLaDA 2.x generate stops after a block once the generated positions so far hold an end
  // token.
  bool EndsAfterBlock() const {
    if (config_.sampler != SamplerFamily::kLlada2) return false;
    return std::find(canvas_.begin() + prompt_length_, canvas_.begin() + block_.end,
                     config_.eos_id) != canvas_.begin() + block_.end;
  }

  // eos_early_stop: a step that committed an end token ends decoding when no mask lies
  // between the prompt and the first end token. LLaDA 2.x generate's: its eos id alone,
  // searched from position 0 within the window, as the reference does; elsewhere any end
  // token after the prompt (chat prompts end turns with them).
  bool EndsEarly(std::span<const Commit> commits) const {
    const bool llada2 = config_.sampler == SamplerFamily::kLlada2;
    auto is_end = [&](int token) {
      return llada2 ? token == config_.eos_id : IsEndToken(config_, token);
    };
    if (std::none_of(commits.begin(), commits.end(),
                     [&](const Commit& c) { return is_end(c.token); })) {
      return false;
    }
    const auto search_end = llada2 ? canvas_.begin() + block_.end : canvas_.end();
    const auto first_end =
        std::find_if(canvas_.begin() + (llada2 ? 0 : prompt_length_), search_end, is_end);
    if (first_end - canvas_.begin() <= prompt_length_) return true;
    return std::find(canvas_.begin() + prompt_length_, first_end, config_.mask_id) == first_end;
  }

  // Every logit of the step, or every greedy choice's row (which reports its first
  // non-finite logit), is finite.
  void RequireFinite(const StepResult& step) const {
    auto require = [&](float logit) {
      if (!std::isfinite(logit)) {
        Fail(model_.source(), ": the model produced a non-finite logit (", logit,
             ") in forward pass ", result_.nfe, " (NaN or infinite weights?)");
      }
    };
    for (float logit : step.logits) require(logit);
    for (const GreedyChoice& choice : step.choices) require(choice.non_finite);
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
    const std::string kind = policy_->StepKind();
    ++result_.step_kinds[kind];
    const TransferBytes now = Transfers();
    const TransferBytes step{now.to_backend - transfers_at_plan_.to_backend,
                             now.to_host - transfers_at_plan_.to_host};
    TransferBytes& total = result_.step_transfers[kind];
    total.to_backend += step.to_backend;
    total.to_host += step.to_host;
    if (keep_trace_) {
      nlohmann::json entry = {{"nfe", result_.nfe},
                              {"block", block_index},
                              {"kind", kind},
                              {"committed", committed},
                              {"bytes_to_backend", step.to_backend},
                              {"bytes_to_host", step.to_host}};
      nlohmann::json stats = policy_->StepStats();
      if (!stats.empty()) entry["policy"] = stats;
      result_.trace.push_back(std::move(entry));
    }
    if (!on_step_) return true;
    int masks_left = 0;
    for (int p = prompt_length_; p < prompt_length_ + options_.gen_length; ++p)
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

  // This sequence's transfers so far, guidance's pass included.
  TransferBytes Transfers() const {
    TransferBytes bytes = forward_.transfers();
    if (guidance_) {
      bytes.to_backend += guidance_->transfers().to_backend;
      bytes.to_host += guidance_->transfers().to_host;
    }
    return bytes;
  }

  double Elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }

  const Model& model_;
  const ModelConfig& config_;
  const DecodeOptions options_;
  const StepCallback on_step_;
  const bool keep_trace_;
  const int prompt_length_;
  const BlockLayout layout_;
  const int length_;
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

  // Where decoding stands: the block being decoded and its step about to run.
  bool done_ = false, in_block_ = false;
  int block_index_;
  Block block_;
  int step_ = 0, step_limit_ = 0;
  std::vector<int> block_masked_;  // the block's masked positions before the step
  // The planned step.
  bool planned_ = false;
  StepPlan plan_;
  std::vector<int> masked_;  // commit candidates (ascending)
  TransferBytes transfers_at_plan_;
};

namespace {

// A batch's forward scratch, per calling thread and backend: batches of any sequences reuse it.
StepRunner& RunnerFor(const Backend& backend) {
  thread_local std::unordered_map<const Backend*, std::unique_ptr<StepRunner>> runners;
  std::unique_ptr<StepRunner>& runner = runners[&backend];
  if (!runner) runner = std::make_unique<StepRunner>(backend);
  return *runner;
}

}  // namespace

Sequence::Sequence(const Model& model, std::span<const int> prompt, const DecodeOptions& requested,
                   StepCallback on_step, bool keep_trace) {
  const ModelConfig& config = model.config();
  requested.Validate(config, int(prompt.size()));
  CheckPrompt(config, prompt);
  decoder_ = std::make_unique<Decoder>(model, prompt, requested.Resolved(config),
                                       std::move(on_step), keep_trace);
}

Sequence::~Sequence() = default;

bool Sequence::done() const { return !error_.empty() || decoder_->done(); }

int64_t Sequence::NextStepRows() {
  if (done()) return 0;
  try {
    decoder_->Plan();
  } catch (const std::exception& e) {
    Failed(e);
    return 0;
  }
  return decoder_->PlannedRows();
}

void Sequence::Failed(const std::exception& e) {
  error_ = e.what();
  if (error_.empty()) error_ = "decoding failed";
  failure_ = std::current_exception();
}

void Sequence::RethrowFailure() const {
  if (failure_) std::rethrow_exception(failure_);
}

int64_t Sequence::cache_bytes() const { return decoder_->cache_bytes(); }

GenerationResult Sequence::TakeResult() {
  PS_CHECK(decoder_->done() && error_.empty());
  return decoder_->Result();
}

void StepBatch(std::span<Sequence* const> sequences) {
  std::vector<Sequence*> stepping;  // the sequences with a planned step, in order
  std::vector<SequenceStep> steps;  // their forwards, each sequence's consecutive
  for (Sequence* sequence : sequences) {
    sequence->NextStepRows();  // plans the step
    if (sequence->done()) continue;
    stepping.push_back(sequence);
    sequence->decoder_->AppendSteps(steps);
  }
  if (steps.empty()) return;
  std::vector<StepResult> results = RunnerFor(steps[0].forward->backend()).Run(steps);
  size_t next = 0;
  for (Sequence* sequence : stepping) {
    const size_t count = size_t(sequence->decoder_->ForwardsPerStep());
    try {
      sequence->decoder_->Finish(std::span(results).subspan(next, count));
    } catch (const std::exception& e) {
      sequence->Failed(e);
    }
    next += count;
  }
}

int64_t SequenceCacheBytes(const Model& model, int prompt_length, const DecodeOptions& requested) {
  const ModelConfig& config = model.config();
  requested.Validate(config, prompt_length);
  const DecodeOptions options = requested.Resolved(config);
  const int64_t length = BlockLayout(config, options, prompt_length).length;
  const int64_t kv = 2 * int64_t(config.layers) * length * config.kv_heads * config.head_dim;
  const bool hidden = MakePolicy(options, model)->NeedsHiddenStates();
  const int64_t floats = kv + (hidden ? int64_t(config.layers) * length * config.width : 0);
  return 4 * (floats + (options.cfg_scale > 0 ? kv : 0));
}

std::vector<GenerationResult> GenerateBatch(const Model& model,
                                            std::span<const GenerationRequest> requests,
                                            int max_batch, bool keep_trace) {
  if (max_batch < 1) Fail("the batch size must be at least 1, not ", max_batch);
  for (const GenerationRequest& request : requests) {
    request.options.Validate(model.config(), int(request.prompt.size()));
    CheckPrompt(model.config(), request.prompt);
  }
  std::vector<GenerationResult> results(requests.size());
  std::vector<std::pair<size_t, std::unique_ptr<Sequence>>> active;  // (request, sequence)
  std::vector<Sequence*> batch;
  size_t next = 0;
  while (next < requests.size() || !active.empty()) {
    while (active.size() < size_t(max_batch) && next < requests.size()) {
      active.emplace_back(
          next, std::make_unique<Sequence>(model, requests[next].prompt, requests[next].options,
                                           nullptr, keep_trace));
      ++next;
    }
    batch.clear();
    for (auto& [index, sequence] : active) batch.push_back(sequence.get());
    StepBatch(batch);
    for (auto it = active.begin(); it != active.end();) {
      Sequence& sequence = *it->second;
      if (!sequence.done()) {
        ++it;
        continue;
      }
      sequence.RethrowFailure();
      results[it->first] = sequence.TakeResult();
      it = active.erase(it);
    }
  }
  return results;
}

GenerationResult Generate(const Model& model, std::span<const int> prompt,
                          const DecodeOptions& options, const StepCallback& on_step,
                          bool keep_trace) {
  Sequence sequence(model, prompt, options, on_step, keep_trace);
  Sequence* const batch[] = {&sequence};
  while (!sequence.done()) StepBatch(batch);
  sequence.RethrowFailure();
  return sequence.TakeResult();
}

}  // namespace polestar
