// vanilla (LLaDA generate.py; Dream's _sample on Dream checkpoints): every step a full pass.
// On LLaDA 2.x (block diffusion, attention causal across blocks) a full pass of the window is
// what its generate runs; the rows of finished blocks give the same K/V every step, so they
// are computed once, with their final tokens, at the next block's first step.
#include "decode/policy_registry.h"

namespace polestar {
namespace {

class VanillaPolicy : public Policy {
 public:
  StepPlan Plan(const DecodeContext& context) override {
    StepPlan plan;
    if (context.model.config().sampler != SamplerFamily::kLlada2) {
      kind_ = step_kind::kFullPass;
      plan.input_rows = Range(0, int(context.canvas.size()));
      return plan;
    }
    kind_ = context.step_in_block == 0 ? step_kind::kBlockStart : step_kind::kBlockStep;
    plan.input_rows = Range(context.options.refresh_all ? 0 : final_before_, context.block.end);
    final_before_ = context.block.start;
    return plan;
  }

  std::string StepKind() const override { return kind_; }

 private:
  const char* kind_ = step_kind::kFullPass;
  int final_before_ = 0;  // LLaDA 2.x: rows before it hold their final K/V
};

const PolicyRegistration kVanilla({
    .name = "vanilla",
    .description = "every step a full pass over the canvas (LLaDA generate.py, Dream _sample)",
    .options = {},
    .rank = 0,
    .make = [](const DecodeOptions&, const Model&) -> std::unique_ptr<Policy> {
      return std::make_unique<VanillaPolicy>();
    },
    .block_diffusion = "LLaDA 2.x's own sampler, earlier blocks cached exactly",
});

}  // namespace
}  // namespace polestar
