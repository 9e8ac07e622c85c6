// Text generation by iterative unmasking: the block loop shared by every policy.
//
// The canvas is the prompt followed by gen_length masks. Blocks are decoded left to right;
// each step the policy plans a forward, the shared commit rule (fixed count, threshold,
// factor, or a Dream sampler) chooses positions of the current block, and the policy may
// add commits. A step's callback can cancel the generation.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "decode/options.h"
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
  double seconds = 0;
  bool cancelled = false;
  int tokens_until_eos = 0;  // generated tokens before the first EOS / end-of-turn
  int non_eos_tokens = 0;    // generated tokens that are not EOS (Polestar's protocol)
  int64_t cache_bytes = 0;
  nlohmann::json trace = nlohmann::json::array();  // per step: positions committed, policy stats

  double TpfAllPositions() const { return nfe ? double(generated.size()) / nfe : 0; }
  double TpfUntilEos() const { return nfe ? double(tokens_until_eos) / nfe : 0; }
  double TpfNonEos() const { return nfe ? double(non_eos_tokens) / nfe : 0; }
  double TpsUntilEos() const { return seconds > 0 ? tokens_until_eos / seconds : 0; }
  double TpsNonEos() const { return seconds > 0 ? non_eos_tokens / seconds : 0; }
};

// Throws Error for invalid options (before any work).
GenerationResult Generate(const Model& model, std::span<const int> prompt,
                          const DecodeOptions& options, const StepCallback& on_step = nullptr,
                          bool keep_trace = false);

// Whether `token` ends the text (EOS or end-of-turn of this model).
bool IsEndToken(const ModelConfig& config, int token);

}  // namespace polestar
