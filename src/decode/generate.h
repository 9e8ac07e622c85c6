// Text generation by iterative unmasking: the block loop shared by every policy.
//
// The canvas is the prompt followed by gen_length masks. Blocks are decoded left to right;
// each step the policy plans a forward, the shared commit rule (fixed count, threshold,
// factor, or a Dream sampler) chooses positions of the current block, and the policy may
// add commits. A step's callback can cancel the generation.
//
// Batches: a Sequence is one generation advanced a step at a time, so the steps of many
// sequences (each with its own prompt, options, policy and cache) share one batched forward
// (StepBatch). A sequence's tokens, NFE and trace do not depend on what it is batched with:
// Generate is a Sequence stepped alone.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "decode/options.h"
#include "model/forward.h"
#include "model/model.h"

namespace polestar {

struct StepEvent {
  int nfe = 0;  // forwards so far, this one included
  int block_index = 0;
  std::span<const int> canvas;     // prompt + canvas after this step's commits
  std::span<const int> committed;  // positions committed this step
  int masks_left = 0;
  double seconds = 0;  // since the generation started
};

// Returns false to cancel the generation (e.g. the client went away).
using StepCallback = std::function<bool(const StepEvent&)>;

struct GenerationResult {
  std::vector<int> tokens;     // prompt + canvas
  std::vector<int> generated;  // canvas only
  int nfe = 0;
  int64_t rows_computed = 0;  // (layer, position) rows pushed through attention + MLP
  int64_t kv_rows_written = 0;
  int64_t layers_replayed = 0;  // (step, layer) pairs issued as a replayed recording
  double seconds = 0;
  bool cancelled = false;
  int tokens_until_eos = 0;  // generated tokens before the first EOS / end-of-turn
  int non_eos_tokens = 0;    // generated tokens that are not EOS (Polestar's protocol)
  int64_t cache_bytes = 0;
  std::map<std::string, int> step_kinds;  // forwards by cost class (Policy::StepKind)
  // Bytes between host and backend by cost class, summed over its steps (plan, outputs,
  // hooks, drift ops, classifier-free guidance's pass included).
  std::map<std::string, TransferBytes> step_transfers;
  // Per step: nfe, block, step kind, positions committed, policy stats.
  nlohmann::json trace = nlohmann::json::array();

  double TpfAllPositions() const { return nfe ? double(generated.size()) / nfe : 0; }
  double TpfUntilEos() const { return nfe ? double(tokens_until_eos) / nfe : 0; }
  double TpfNonEos() const { return nfe ? double(non_eos_tokens) / nfe : 0; }
  double TpsUntilEos() const { return seconds > 0 ? tokens_until_eos / seconds : 0; }
  double TpsNonEos() const { return seconds > 0 ? non_eos_tokens / seconds : 0; }
};

class Decoder;

// One generation, advanced by StepBatch.
class Sequence {
 public:
  // Throws Error for invalid options or prompt tokens, before any work.
  Sequence(const Model& model, std::span<const int> prompt, const DecodeOptions& options,
           StepCallback on_step = nullptr, bool keep_trace = false);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Finished, cancelled by its callback, or failed.
  bool done() const;
  // Why the sequence failed ("" unless it did).
  const std::string& error() const { return error_; }
  // The rows the next step feeds the model (its input rows, twice with guidance); plans the
  // step if it is not planned yet. 0 once done.
  int64_t NextStepRows();
  // Bytes of the caches this sequence holds (KV, hidden states, guidance).
  int64_t cache_bytes() const;
  // Throws what made the sequence fail, if it failed.
  void RethrowFailure() const;
  // The result, once done and not failed; call once.
  GenerationResult TakeResult();

 private:
  friend void StepBatch(std::span<Sequence* const> sequences);
  void Failed(const std::exception& e);  // inside the catch block

  std::unique_ptr<Decoder> decoder_;
  std::string error_;
  std::exception_ptr failure_;
};

// Runs the next step of every sequence that is not done in one batched forward. A sequence
// whose step fails (non-finite logits, no progress) ends with error() set; the others go on.
void StepBatch(std::span<Sequence* const> sequences);

// The cache bytes a Sequence of these options would hold (the KV budget's unit); throws
// Error for invalid options as the Sequence would.
int64_t SequenceCacheBytes(const Model& model, int prompt_length, const DecodeOptions& options);

struct GenerationRequest {
  std::span<const int> prompt;
  DecodeOptions options;
};

// Decodes every request, at most `max_batch` sequences per forward: when one finishes the
// next request takes its place. results[i] belongs to requests[i] and has Generate's tokens,
// NFE and trace. Throws Error (before any work) for an invalid request, and the error of the
// first sequence that fails.
std::vector<GenerationResult> GenerateBatch(const Model& model,
                                            std::span<const GenerationRequest> requests,
                                            int max_batch, bool keep_trace = false);

// Throws Error for invalid options (before any work).
GenerationResult Generate(const Model& model, std::span<const int> prompt,
                          const DecodeOptions& options, const StepCallback& on_step = nullptr,
                          bool keep_trace = false);

// Whether `token` ends the text (EOS or end-of-turn of this model).
bool IsEndToken(const ModelConfig& config, int token);

}  // namespace polestar
