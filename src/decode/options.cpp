#include "decode/options.h"

#include <cmath>
#include <limits>

#include "base/error.h"

namespace polestar {

bool IsKnownPolicy(const std::string& name) {
  return name == "vanilla" || name == "fast-dllm-prefix" || name == "fast-dllm-dual" ||
         name == "elastic-cache" || name == "polestar";
}

const char* KnownPolicies() {
  return "vanilla, fast-dllm-prefix, fast-dllm-dual, elastic-cache, polestar";
}

namespace {

// "(0, 1]"-style text for an interval; the bounds are inclusive unless marked open.
struct Interval {
  double low, high;
  bool low_open = false, high_open = false;
  bool Contains(double v) const {  // false for NaN
    return (low_open ? v > low : v >= low) && (high_open ? v < high : v <= high);
  }
  std::string Text() const {
    auto bound = [](double b) {
      return std::isinf(b) ? std::string(b < 0 ? "-inf" : "inf") : Cat(b);
    };
    return Cat(low_open ? "(" : "[", bound(low), ", ", bound(high), high_open ? ")" : "]");
  }
};
constexpr double kInf = std::numeric_limits<double>::infinity();

void RequireIn(double value, const char* flag, Interval range) {
  if (range.Contains(value)) return;
  const bool integral =
      std::isfinite(value) && std::fabs(value) < 1e15 && value == std::floor(value);
  Fail(flag, " must lie in ", range.Text(), " (got ", integral ? Cat(int64_t(value)) : Cat(value),
       ")");
}

}  // namespace

DecodeOptions DecodeOptions::Resolved(const ModelConfig& config) const {
  DecodeOptions resolved = *this;
  if (resolved.window == 0) resolved.window = config.sampler == SamplerFamily::kDream ? 32 : 16;
  if (resolved.policy == "polestar" && !resolved.threshold && !resolved.factor) {
    resolved.threshold = resolved.tau_s;
  }
  return resolved;
}

void DecodeOptions::Validate(const ModelConfig& config, int prompt_length) const {
  if (!IsKnownPolicy(policy)) Fail("unknown policy '", policy, "' (known: ", KnownPolicies(), ")");
  // Lengths and counts: bounded by the context, so nothing below allocates or loops beyond it.
  if (prompt_length <= 0) Fail("the prompt is empty");
  if (gen_length <= 0) Fail("--gen-length must be positive (got ", gen_length, ")");
  if (int64_t(prompt_length) + gen_length > config.max_positions) {
    Fail("prompt (", prompt_length, " tokens) + generation (", gen_length,
         ") exceeds the model's context of ", config.max_positions, " positions");
  }
  RequireIn(block_length, "--block-length", {0, double(gen_length)});
  const int block = EffectiveBlockLength();
  if (gen_length % block != 0) {
    Fail("--block-length ", block, " does not divide --gen-length ", gen_length);
  }
  // Bounded by the context: a schedule allocates and may run a step per step.
  RequireIn(steps, "--steps", {1, double(config.max_positions)});
  if (steps % BlockCount() != 0) {
    Fail("--steps ", steps, " is not divisible by the number of blocks (", BlockCount(), ")");
  }
  // Commit rules and sampling.
  if (threshold) RequireIn(*threshold, "--threshold", {0, 1, true});
  if (factor) RequireIn(*factor, "--factor", {0, kInf, true, true});
  if (threshold && factor) Fail("--threshold and --factor cannot be combined");
  RequireIn(temperature, "--temperature", {0, kInf, false, true});
  if (remasking != "low_confidence" && remasking != "random") {
    Fail("unknown --remasking '", remasking, "' (low_confidence, random)");
  }
  if (!alg.empty() && alg != "origin" && alg != "maskgit_plus" && alg != "topk_margin" &&
      alg != "entropy" && alg != "confidence_threshold") {
    Fail("unknown --alg '", alg,
         "' (origin, maskgit_plus, topk_margin, entropy, confidence_threshold)");
  }
  if (!alg.empty() && config.sampler != SamplerFamily::kDream) {
    Fail("--alg selects a Dream sampler; this is a ", ArchName(config.arch), " model");
  }
  if (alg == "confidence_threshold" && (gen_length / BlockCount()) % StepsPerBlock() != 0) {
    Fail("confidence_threshold needs the block length to be divisible by the steps per block");
  }
  RequireIn(eps, "--eps", {0, 1, true, true});
  RequireIn(alg_temp, "--alg-temp", {0, kInf, false, true});
  RequireIn(cfg_scale, "--cfg-scale", {0, kInf, false, true});
  if (cfg_scale > 0 && (policy == "elastic-cache" || policy == "polestar")) {
    Fail("--cfg-scale is supported by vanilla and the Fast-dLLM policies only");
  }
  RequireIn(top_p, "--top-p", {0, 1, true});
  RequireIn(top_k, "--top-k", {0, double(config.vocab)});
  // Elastic-Cache.
  RequireIn(gamma, "--gamma", {0, 1, true});
  RequireIn(track_num, "--track-num", {1, double(gen_length)});
  RequireIn(window, "--window", {0, double(config.max_positions)});
  // Polestar. tau-s comes before anything derived from it (it is the default threshold).
  RequireIn(tau_s, "--tau-s", {0, 1, true});
  RequireIn(early_floor, "--early-floor", {0, tau_s, false, true});
  RequireIn(alpha, "--alpha", {0, kInf, false, true});
  RequireIn(drift_cap, "--drift-cap", {0, kInf, false, true});
  RequireIn(drift_history, "--drift-history", {1, 1000});
  RequireIn(clusters, "--clusters", {2, 1024});
  RequireIn(topk_clusters, "--topk", {1, double(clusters)});
  RequireIn(kmeans_iters, "--kmeans-iters", {1, 1000});
  RequireIn(window_prefix_blocks, "--window-prefix-blocks", {0, double(config.max_positions)});
  RequireIn(window_suffix_blocks, "--window-suffix-blocks", {0, double(config.max_positions)});
  RequireIn(full_refresh_period, "--full-refresh-period", {1, 1e6});
  RequireIn(tau_upd, "--tau-upd", {0, double(gen_length)});
  if (drift_metric != "kl" && drift_metric != "cosine") Fail("--drift-metric must be kl or cosine");
  if (policy == "polestar" && config.sampler == SamplerFamily::kDream && !alg.empty()) {
    Fail("polestar uses the threshold commit rule; --alg does not apply");
  }
}

}  // namespace polestar
