#include "decode/options.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"

namespace polestar {
namespace {

// The registered policies `has` holds for, by rank, each as `text` gives it, the last two
// joined by `last`: "a, b or c".
template <typename Has, typename Text>
std::string PolicyList(Has has, Text text, const char* last) {
  std::vector<std::string> items;
  for (const PolicyEntry& entry : RegisteredPolicies()) {
    if (has(entry)) items.push_back(text(entry));
  }
  std::string list;
  for (size_t i = 0; i < items.size(); ++i) {
    list += Cat(i == 0 ? "" : i + 1 == items.size() ? last : ", ", items[i]);
  }
  return list;
}

}  // namespace

DecodeOptions DecodeOptions::Resolved(const ModelConfig& config) const {
  DecodeOptions resolved = *this;
  for (const PolicyEntry& entry : RegisteredPolicies()) {
    if (entry.option_defaults) entry.option_defaults(resolved, config);
  }
  const PolicyEntry* decoding = FindPolicy(policy);
  if (decoding && decoding->resolve) decoding->resolve(resolved, config);
  // LLaDA 2.x generate's default threshold.
  if (config.sampler == SamplerFamily::kLlada2 && !resolved.threshold) resolved.threshold = 0.95;
  return resolved;
}

void DecodeOptions::Validate(const ModelConfig& config, int prompt_length) const {
  const PolicyEntry* decoding = FindPolicy(policy);
  if (!decoding) Fail("unknown policy '", policy, "' (known: ", KnownPolicies(), ")");
  // The context bounds the lengths before anything is derived from them.
  if (prompt_length <= 0) Fail("the prompt is empty");
  CheckOptionValue(OptionOf(&DecodeOptions::gen_length), *this, config);
  if (int64_t(prompt_length) + gen_length > config.max_positions) {
    Fail("prompt (", prompt_length, " tokens) + generation (", gen_length,
         ") exceeds the model's context of ", config.max_positions, " positions");
  }
  // Every value in its range (the schema's), in the schema's order.
  for (const OptionSpec& spec : OptionSchema()) CheckOptionValue(spec, *this, config);
  // Combinations.
  if (config.sampler == SamplerFamily::kLlada2) {
    ValidateBlockDiffusion(config, prompt_length);
  } else {
    ValidateBlocks(config);
  }
  if (decoding->validate) decoding->validate(*this, config);
}

void DecodeOptions::ValidateBlocks(const ModelConfig& config) const {
  const int block = EffectiveBlockLength();
  if (gen_length % block != 0) {
    FailOption(OptionOf(&DecodeOptions::block_length), " ", block, " does not divide ",
               OptionOf(&DecodeOptions::gen_length), " ", gen_length);
  }
  if (steps % BlockCount() != 0) {
    FailOption(OptionOf(&DecodeOptions::steps), " ", steps,
               " is not divisible by the number of blocks (", BlockCount(), ")");
  }
  if (threshold && factor) {
    FailOption(OptionOf(&DecodeOptions::threshold), " and ", OptionOf(&DecodeOptions::factor),
               " cannot be combined");
  }
  if (alg != DreamAlg::kUnset && config.sampler != SamplerFamily::kDream) {
    FailOption(OptionOf(&DecodeOptions::alg), " selects a Dream sampler; this is a ",
               ArchName(config.arch), " model");
  }
  if (alg == DreamAlg::kConfidenceThreshold && (gen_length / BlockCount()) % StepsPerBlock() != 0) {
    Fail("confidence_threshold needs the block length to be divisible by the steps per block");
  }
  if (cfg_scale > 0 && !FindPolicy(policy)->guidance) {
    FailOption(OptionOf(&DecodeOptions::cfg_scale), " is supported by ",
               PolicyList([](const PolicyEntry& entry) { return entry.guidance; },
                          [](const PolicyEntry& entry) { return std::string(entry.name); }, ", "),
               " only");
  }
}

void DecodeOptions::FitCanvasTo(int64_t max_tokens, bool keep_steps,
                                const DecodeOptions& ratio_from, const ModelConfig& config) {
  const OptionSpec& block_option = OptionOf(&DecodeOptions::block_length);
  if (block_length < 0) FailOption(block_option, " must not be negative (got ", block_length, ")");
  if (max_tokens < 1 || max_tokens > config.max_positions) {
    Fail("the answer length ", max_tokens, " is not in [1, ", config.max_positions,
         "], the model's context");
  }
  // Both are below 2^31, so their sum cannot overflow 64 bits; the result is bounded by the
  // context before it is narrowed back to int.
  const int64_t block = block_length > 0 ? block_length : max_tokens;
  const int64_t canvas = (max_tokens + block - 1) / block * block;
  if (canvas > config.max_positions) {
    FailOption(block_option, " ", block, ": the answer length ", max_tokens,
               " rounded up to whole blocks is ", canvas,
               " positions, more than the model's context of ", config.max_positions);
  }
  gen_length = int(canvas);
  if (keep_steps) return;
  const int64_t blocks = canvas / block;
  const double per_position =
      double(std::max(ratio_from.steps, 1)) / double(std::max(ratio_from.gen_length, 1));
  // At least a step per block, at most the context's worth (the steps option's range), in
  // whole steps per block.
  const int64_t most = std::max<int64_t>(blocks, config.max_positions / blocks * blocks);
  const int64_t wanted = int64_t(std::min(std::ceil(double(canvas) * per_position), double(most)));
  steps = int(std::clamp((wanted + blocks - 1) / blocks * blocks, blocks, most));
}

void DecodeOptions::ValidateBlockDiffusion(const ModelConfig& config, int prompt_length) const {
  // Previous blocks are final and later blocks invisible, so a cache-refresh policy has
  // nothing stale to refresh: the policies that decode it say how (their registrations).
  if (!FindPolicy(policy)->block_diffusion) {
    FailOption(OptionOf(&DecodeOptions::policy), " ", policy, " does not apply to ",
               ArchName(config.arch),
               ": block diffusion keeps earlier blocks' K/V final, so there is nothing stale to "
               "refresh; use ",
               PolicyList([](const PolicyEntry& entry) { return entry.block_diffusion != nullptr; },
                          [](const PolicyEntry& entry) {
                            return Cat(entry.name, " (", entry.block_diffusion, ")");
                          },
                          " or "));
  }
  if (block_length == 0) {
    FailOption(OptionOf(&DecodeOptions::block_length), " must be set: ", ArchName(config.arch),
               " decodes block by block");
  }
  const int64_t blocks = (int64_t(prompt_length) + gen_length + block_length - 1) / block_length;
  if (blocks * block_length > config.max_positions) {
    Fail("prompt (", prompt_length, " tokens) + generation (", gen_length, ") rounded up to whole ",
         block_length, "-token blocks exceeds the model's context of ", config.max_positions,
         " positions");
  }
  auto unsupported = [&](bool given, const OptionSpec& option) {
    if (given) FailOption(option, " does not apply to ", ArchName(config.arch), "'s sampler");
  };
  unsupported(factor.has_value(), OptionOf(&DecodeOptions::factor));
  unsupported(alg != DreamAlg::kUnset, OptionOf(&DecodeOptions::alg));
  unsupported(remasking != Remasking::kLowConfidence, OptionOf(&DecodeOptions::remasking));
  unsupported(cfg_scale > 0, OptionOf(&DecodeOptions::cfg_scale));
}

}  // namespace polestar
