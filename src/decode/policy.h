// A decoding policy decides, every step, which rows the model recomputes (a StepPlan, plus
// a LayerHook for policies that decide layer by layer) and may add commits beyond the shared
// commit rule. The block loop, the commit rules and the bookkeeping live in generate.cpp.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "decode/options.h"
#include "model/forward.h"

namespace polestar {

struct Block {
  int index = 0;
  int start = 0;  // absolute canvas positions [start, end)
  int end = 0;
};

// What a policy sees of the decoding state. Positions are absolute canvas indices.
struct DecodeContext {
  const Model& model;
  const DecodeOptions& options;
  std::span<const int> canvas;
  int prompt_length = 0;
  int mask_id = 0;
  Block block;
  int step_in_block = 0;  // 0 at the block's first forward
  int committed_last_step = 0;
  Forward& forward;
};

struct Commit {
  int position = 0;
  int token = 0;
};

// The cost classes of decoding steps, as Policy::StepKind names them and the scale benchmark
// (bench/scale.h) times them: what a step recomputes decides what it costs.
namespace step_kind {
inline constexpr const char* kFullPass = "full pass";            // every row, every layer
inline constexpr const char* kWindowedPass = "windowed pass";    // Polestar's block-start window
inline constexpr const char* kPrefixStep = "prefix-cache step";  // the block and its suffix
inline constexpr const char* kDualStep = "dual-cache step";      // the block only
// Elastic-Cache's step without a refresh: its sliding window, the tracked tokens and the rows
// whose token changed.
inline constexpr const char* kElasticStep = "elastic-cache step";
inline constexpr const char* kBlockStart = "block-causal block start";  // LLaDA 2.x
inline constexpr const char* kBlockStep = "block-causal step";          // LLaDA 2.x
// Polestar's refresh: the block plus k clusters of its window at every layer.
std::string Refresh(int clusters);  // "refresh step, k=4"
// Elastic-Cache's refresh: its step's rows below `layer`, every row from it on.
std::string RefreshFromLayer(int layer, int layers);  // "refresh from layer 2 of 4"
}  // namespace step_kind

// A masked position of the current block with the token and confidence the commit rule saw.
struct Candidate {
  int position = 0;
  int token = 0;
  double confidence = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  // Whether the cache must keep per-layer input hidden states.
  virtual bool NeedsHiddenStates() const { return false; }
  // Fast-dLLM's cached loops (the version the reference fixtures come from) run one more
  // step after a block-start pass that already filled the block; counting it keeps NFE
  // comparable with the published numbers.
  virtual bool RunsStepAfterFilledBlockStart() const { return false; }
  // Whether a full block of masks should be decoded at all (Polestar skips blocks that its
  // suffix commits filled; blocks without masks are always skipped by the driver).
  virtual StepPlan Plan(const DecodeContext& context) = 0;
  // The masked positions of the block (ascending) that the commit rule may choose from this
  // step; called after Plan. Elastic-Cache narrows them to its sliding window.
  virtual std::vector<int> CommitCandidates(const DecodeContext& context, std::vector<int> masked) {
    return masked;
  }
  // After the forward and the shared commit rule chose `commits` among `candidates` (the
  // block's masked positions): a policy may add commits of its own (distinct masked
  // positions, anywhere in the canvas).
  virtual void AfterStep(const DecodeContext& context, const StepResult& result,
                         std::span<const Candidate> candidates, std::vector<Commit>& commits) {}
  // Per-step statistics for --trace (refreshes, rows per layer, early commits, drift ...).
  virtual nlohmann::json StepStats() const { return nlohmann::json::object(); }
  // The cost class (step_kind) of the step just run; called after AfterStep.
  virtual std::string StepKind() const = 0;
};

// Rows [begin, end) as a list.
std::vector<int> Range(int begin, int end);

// Builds the named policy (options.policy) through its registration (policy_registry.h);
// throws Error for an unknown name.
std::unique_ptr<Policy> MakePolicy(const DecodeOptions& options, const Model& model);

}  // namespace polestar
