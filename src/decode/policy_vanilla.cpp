// vanilla (LLaDA generate.py; Dream's _sample on Dream checkpoints): every step a full pass.
#include "decode/policy_registry.h"

namespace polestar {
namespace {

class VanillaPolicy : public Policy {
 public:
  StepPlan Plan(const DecodeContext& context) override {
    StepPlan plan;
    plan.input_rows = Range(0, int(context.canvas.size()));
    return plan;
  }
};

const PolicyRegistration kVanilla({
    .name = "vanilla",
    .description = "every step a full pass over the canvas (LLaDA generate.py, Dream _sample)",
    .options = {},
    .rank = 0,
    .make = [](const DecodeOptions&, const Model&) -> std::unique_ptr<Policy> {
      return std::make_unique<VanillaPolicy>();
    },
});

}  // namespace
}  // namespace polestar
