#include "decode/options.h"

#include "base/error.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"

namespace polestar {

DecodeOptions DecodeOptions::Resolved(const ModelConfig& config) const {
  DecodeOptions resolved = *this;
  // Elastic-Cache's window by sampler family, as its reference code sets it per model.
  if (resolved.window == 0) resolved.window = config.sampler == SamplerFamily::kDream ? 32 : 16;
  if (resolved.policy == "polestar" && !resolved.threshold && !resolved.factor) {
    resolved.threshold = resolved.tau_s;
  }
  return resolved;
}

void DecodeOptions::Validate(const ModelConfig& config, int prompt_length) const {
  if (!IsKnownPolicy(policy)) Fail("unknown policy '", policy, "' (known: ", KnownPolicies(), ")");
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
  if (!alg.empty() && config.sampler != SamplerFamily::kDream) {
    FailOption(OptionOf(&DecodeOptions::alg), " selects a Dream sampler; this is a ",
               ArchName(config.arch), " model");
  }
  if (alg == "confidence_threshold" && (gen_length / BlockCount()) % StepsPerBlock() != 0) {
    Fail("confidence_threshold needs the block length to be divisible by the steps per block");
  }
  if (const PolicyEntry* entry = FindPolicy(policy); cfg_scale > 0 && entry && !entry->guidance) {
    std::string supported;
    for (const PolicyEntry& other : RegisteredPolicies()) {
      if (other.guidance) supported += Cat(supported.empty() ? "" : ", ", other.name);
    }
    FailOption(OptionOf(&DecodeOptions::cfg_scale), " is supported by ", supported, " only");
  }
  if (policy == "polestar" && config.sampler == SamplerFamily::kDream && !alg.empty()) {
    FailOption("polestar uses the threshold commit rule; ", OptionOf(&DecodeOptions::alg),
               " does not apply");
  }
}

}  // namespace polestar
