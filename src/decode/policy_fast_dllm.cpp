// Fast-dLLM's prefix cache (block start: full pass; then the block and everything after it)
// and dual cache (block start: full pass; then the block only, prefix and suffix K/V from
// cache): one policy, registered under two names.
#include "decode/policy_registry.h"

namespace polestar {
namespace {

class FastDllmPolicy : public Policy {
 public:
  explicit FastDllmPolicy(bool dual) : dual_(dual) {}
  bool RunsStepAfterFilledBlockStart() const override { return true; }

  StepPlan Plan(const DecodeContext& context) override {
    StepPlan plan;
    const int length = int(context.canvas.size());
    if (context.step_in_block == 0 || context.options.refresh_all) {
      kind_ = step_kind::kFullPass;
      plan.input_rows = Range(0, length);
      return plan;
    }
    kind_ = dual_ ? step_kind::kDualStep : step_kind::kPrefixStep;
    // Dream predicts position p from output p-1, so the row before the block is computed too.
    const int begin = context.model.config().PredictingRow(context.block.start);
    plan.input_rows = Range(begin, dual_ ? context.block.end : length);
    return plan;
  }

  std::string StepKind() const override { return kind_; }

 private:
  bool dual_;
  const char* kind_ = step_kind::kFullPass;
};

const PolicyRegistration kPrefix({
    .name = "fast-dllm-prefix",
    .description = "Fast-dLLM prefix cache: block start full, then the block and its suffix",
    .options = {&DecodeOptions::refresh_all},
    .rank = 10,
    .make = [](const DecodeOptions&, const Model&) -> std::unique_ptr<Policy> {
      return std::make_unique<FastDllmPolicy>(/*dual=*/false);
    },
    .paper_threshold = 0.9,
});

const PolicyRegistration kDual({
    .name = "fast-dllm-dual",
    .description = "Fast-dLLM dual cache: block start full, then the block only",
    .options = {&DecodeOptions::refresh_all},
    .rank = 11,
    .make = [](const DecodeOptions&, const Model&) -> std::unique_ptr<Policy> {
      return std::make_unique<FastDllmPolicy>(/*dual=*/true);
    },
    .paper_threshold = 0.9,
});

}  // namespace
}  // namespace polestar
