#include "decode/options.h"

#include "base/error.h"

namespace polestar {

bool IsKnownPolicy(const std::string& name) {
  return name == "vanilla" || name == "fast-dllm-prefix" || name == "fast-dllm-dual" ||
         name == "elastic-cache" || name == "polestar";
}

const char* KnownPolicies() {
  return "vanilla, fast-dllm-prefix, fast-dllm-dual, elastic-cache, polestar";
}

DecodeOptions DecodeOptions::Resolved(const ModelConfig& config) const {
  DecodeOptions resolved = *this;
  if (resolved.window == 0) resolved.window = config.arch == Arch::kDream ? 32 : 16;
  if (resolved.policy == "polestar" && resolved.threshold <= 0 && resolved.factor <= 0) {
    resolved.threshold = resolved.tau_s;
  }
  return resolved;
}

void DecodeOptions::Validate(const ModelConfig& config, int prompt_length) const {
  if (!IsKnownPolicy(policy)) Fail("unknown policy '", policy, "' (known: ", KnownPolicies(), ")");
  if (gen_length <= 0) Fail("--gen-length must be positive (got ", gen_length, ")");
  if (block_length < 0) Fail("--block-length must not be negative");
  const int block = EffectiveBlockLength();
  if (gen_length % block != 0) {
    Fail("--block-length ", block, " does not divide --gen-length ", gen_length);
  }
  if (steps <= 0) Fail("--steps must be positive (got ", steps, ")");
  if (steps % BlockCount() != 0) {
    Fail("--steps ", steps, " is not divisible by the number of blocks (", BlockCount(), ")");
  }
  if (prompt_length <= 0) Fail("the prompt is empty");
  if (int64_t(prompt_length) + gen_length > config.max_positions) {
    Fail("prompt (", prompt_length, " tokens) + generation (", gen_length,
         ") exceeds the model's context of ", config.max_positions, " positions");
  }
  if (threshold > 1.0) Fail("--threshold must be at most 1 (got ", threshold, ")");
  if (threshold > 0 && factor > 0) Fail("--threshold and --factor cannot be combined");
  if (temperature < 0) Fail("--temperature must not be negative");
  if (remasking != "low_confidence" && remasking != "random") {
    Fail("unknown --remasking '", remasking, "' (low_confidence, random)");
  }
  if (!alg.empty() && alg != "origin" && alg != "maskgit_plus" && alg != "topk_margin" &&
      alg != "entropy" && alg != "confidence_threshold") {
    Fail("unknown --alg '", alg, "' (origin, maskgit_plus, topk_margin, entropy, confidence_threshold)");
  }
  if (!alg.empty() && config.arch != Arch::kDream) {
    Fail("--alg selects a Dream sampler; this is a ", ArchName(config.arch), " model");
  }
  if (alg == "confidence_threshold" && (gen_length / BlockCount()) % StepsPerBlock() != 0) {
    Fail("confidence_threshold needs the block length to be divisible by the steps per block");
  }
  if (top_p <= 0 || top_p > 1) Fail("--top-p must lie in (0, 1]");
  if (top_k < 0) Fail("--top-k must not be negative");
  if (eps <= 0 || eps >= 1) Fail("--eps must lie in (0, 1)");
  if (cfg_scale < 0) Fail("--cfg-scale must not be negative");
  if (cfg_scale > 0 && (policy == "elastic-cache" || policy == "polestar")) {
    Fail("--cfg-scale is supported by vanilla and the Fast-dLLM policies only");
  }
  if (gamma <= 0 || gamma > 1) Fail("--gamma must lie in (0, 1]");
  if (track_num <= 0) Fail("--track-num must be positive");
  if (window < 0) Fail("--window must not be negative");
  if (clusters < 2) Fail("--clusters must be at least 2");
  if (topk_clusters <= 0) Fail("--topk must be positive");
  if (kmeans_iters <= 0) Fail("--kmeans-iters must be positive");
  if (drift_history <= 0) Fail("--drift-history must be positive");
  if (full_refresh_period <= 0) Fail("--full-refresh-period must be positive");
  if (drift_metric != "kl" && drift_metric != "cosine") Fail("--drift-metric must be kl or cosine");
  if (tau_s <= 0 || tau_s > 1) Fail("--tau-s must lie in (0, 1]");
  if (early_floor < 0 || early_floor >= tau_s) Fail("--early-floor must lie in [0, tau-s)");
  if (window_prefix_blocks < 0 || window_suffix_blocks < 0) Fail("window block counts must not be negative");
  if (policy == "polestar" && config.arch == Arch::kDream && !alg.empty()) {
    Fail("polestar uses the threshold commit rule; --alg does not apply");
  }
}

}  // namespace polestar
