// Every decoding knob, with the reference implementations' defaults. One struct feeds the
// CLI, the server and the benchmark, so a flag means the same thing everywhere; each field
// is declared once more in option_schema.cpp (its names, help and valid values), which
// generates the flags, the request fields and the range checks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/backend.h"  // DriftMetric: the drift kernel's own, passed straight through
#include "model/config.h"

namespace polestar {

// The modes an option chooses between, read once from their names where the option is read
// (the schema, option_schema.cpp, names the values in this order).
enum class Remasking { kLowConfidence, kRandom };
// Dream's samplers. kUnset: maskgit_plus confidence, with --threshold/--factor open to it.
enum class DreamAlg { kUnset, kOrigin, kMaskgitPlus, kTopkMargin, kEntropy, kConfidenceThreshold };

struct DecodeOptions {
  std::string policy = "vanilla";  // a registered policy (policy_registry.h)
  int gen_length = 128;
  int block_length = 32;  // 0: one block over the whole canvas
  int steps = 128;        // total over all blocks (LLaDA generate.py); per block for LLaDA 2.x
  // Unset: the policy's schedule. Explicit values must be valid: a rule is never switched
  // off by a number.
  std::optional<double> threshold;  // in (0, 1]: Fast-dLLM threshold commit (top-1 + conf >= t)
  std::optional<double> factor;     // > 0: Fast-dLLM factor commit
  double temperature = 0;
  uint64_t seed = 0;
  Remasking remasking = Remasking::kLowConfidence;  // LLaDA
  // Dream samplers (the vanilla policy on Dream checkpoints).
  DreamAlg alg = DreamAlg::kUnset;
  double eps = 1e-3;
  double alg_temp = 0;
  double cfg_scale = 0;
  double top_p = 1.0;
  int top_k = 0;
  // Forces every step to be a full pass (the standing "cached == vanilla" test).
  bool refresh_all = false;
  // Stop as soon as a step commits an end token with nothing masked before the first one
  // (LLaDA 2.x generate's eos_early_stop; on other models an opt-in variable length).
  bool eos_early_stop = false;

  // Elastic-Cache.
  int track_num = 1;
  double gamma = 0.9;
  int window = 0;  // 0: 16 for LLaDA, 32 for Dream

  // Polestar (defaults as released in gt-synergy-lab/Polestar).
  double tau_s = 0.9;
  double early_floor = 0.7;
  double alpha = 10.0;
  double drift_cap = 2.0;
  int drift_history = 5;
  int clusters = 8;
  int topk_clusters = 4;
  int kmeans_iters = 5;
  int window_prefix_blocks = 2;
  int window_suffix_blocks = 1;
  int full_refresh_period = 4;
  int tau_upd = 2;
  bool polestar_cache = true;  // drift-aware sparse refresh
  bool early_commit = true;    // Polestar-Commit early commit
  bool suffix_commit = true;   // commit refreshed suffix positions
  DriftMetric drift_metric = DriftMetric::kKl;
  bool nvfp4_hidden = false;       // hidden-state cache as centroid + NVFP4 residual
  bool offload_residuals = false;  // the NVFP4 residuals off the accelerator (Placement)
  bool overlap = false;            // auxiliary work on a worker thread

  // A copy with the model-dependent defaults filled in: every policy's defaults of the
  // options it reads (Elastic-Cache's window: 16 LLaDA, 32 Dream), then the decoding
  // policy's own (Polestar's commit threshold: tau_s unless --threshold is given), then
  // LLaDA 2.x's threshold (policy_registry.h).
  DecodeOptions Resolved(const ModelConfig& config) const;
  // Throws Error naming the first invalid value or combination (an OptionError naming the
  // options), before any work is done: the rules every policy shares, then the decoding
  // policy's own. Call it on the options as given, before Resolved().
  void Validate(const ModelConfig& config, int prompt_length) const;
  // Sizes the canvas for an answer of up to `max_tokens` tokens (the server's max_tokens):
  // gen_length becomes max_tokens rounded up to whole blocks (block_length 0: one block),
  // and unless `keep_steps`, steps keep `ratio_from`'s steps per generated position, rounded
  // up to whole steps per block. Safe for any values the fields may hold (computed in 64
  // bits, bounded before narrowing); throws OptionError when block_length is negative or the
  // rounded canvas exceeds the model's context. Validate checks everything else.
  void FitCanvasTo(int64_t max_tokens, bool keep_steps, const DecodeOptions& ratio_from,
                   const ModelConfig& config);
  // Parts of Validate, for a registered policy: the combinations LLaDA 2.x's block
  // diffusion decodes (the policies that declare it, PolicyEntry::block_diffusion, and its
  // sampler's options), and those the other models' blocks and samplers decode.
  void ValidateBlockDiffusion(const ModelConfig& config, int prompt_length) const;
  void ValidateBlocks(const ModelConfig& config) const;
  // The number of blocks and steps per block this configuration decodes with.
  // (LLaDA 2.x's blocks are aligned from position 0 instead: policy.h BlockLayout.)
  int EffectiveBlockLength() const { return block_length > 0 ? block_length : gen_length; }
  int BlockCount() const { return gen_length / EffectiveBlockLength(); }
  int StepsPerBlock() const { return steps / BlockCount(); }
};

}  // namespace polestar
