// The baselines: vanilla (LLaDA generate.py: every step a full pass) and Fast-dLLM's
// prefix cache (block start: full pass; then the block and everything after it) and dual
// cache (block start: full pass; then the block only, prefix and suffix K/V from cache).
#include "base/error.h"
#include "decode/policy.h"

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

class FastDllmPolicy : public Policy {
 public:
  explicit FastDllmPolicy(bool dual) : dual_(dual) {}
  bool RunsStepAfterFilledBlockStart() const override { return true; }

  StepPlan Plan(const DecodeContext& context) override {
    StepPlan plan;
    const int length = int(context.canvas.size());
    if (context.step_in_block == 0 || context.options.refresh_all) {
      plan.input_rows = Range(0, length);
      return plan;
    }
    // Dream predicts position p from output p-1, so the row before the block is computed too.
    const int begin = context.model.config().PredictingRow(context.block.start);
    plan.input_rows = Range(begin, dual_ ? context.block.end : length);
    return plan;
  }

 private:
  bool dual_;
};

}  // namespace

std::vector<int> Range(int begin, int end) {
  std::vector<int> rows;
  rows.reserve(size_t(std::max(0, end - begin)));
  for (int i = begin; i < end; ++i) rows.push_back(i);
  return rows;
}

std::unique_ptr<Policy> MakeVanillaPolicy() { return std::make_unique<VanillaPolicy>(); }
std::unique_ptr<Policy> MakeFastDllmPolicy(bool dual) {
  return std::make_unique<FastDllmPolicy>(dual);
}

std::unique_ptr<Policy> MakePolicy(const DecodeOptions& options, const Model& model) {
  if (options.policy == "vanilla") return MakeVanillaPolicy();
  if (options.policy == "fast-dllm-prefix") return MakeFastDllmPolicy(false);
  if (options.policy == "fast-dllm-dual") return MakeFastDllmPolicy(true);
  if (options.policy == "elastic-cache") return MakeElasticCachePolicy(options, model);
  if (options.policy == "polestar") return MakePolestarPolicy(options, model);
  Fail("unknown policy '", options.policy, "' (known: ", KnownPolicies(), ")");
}

}  // namespace polestar
