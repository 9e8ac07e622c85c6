// The scale benchmark: what each kind of decoding step costs at a real model shape, on a
// random-weight checkpoint, and what that means for each policy's tokens per second.
//
// 1. Step timings (Forward::Run with hand-built plans; the median of `reps`): a full pass, a
//    windowed pass [start - 2B, end + B), a prefix-cache step (the block and everything after
//    it, averaged over a middle pair of blocks, which is the mean over all blocks since the
//    cost is linear in the rows), a dual-cache step (the block only), a Polestar refresh step
//    at k clusters (the block plus k clusters' rows of the window at every layer, 1 cluster at
//    the last, with packet propagation to the next layer), and the Polestar overheads: k-means
//    of every layer's window at block start, and one step's proxy attention at every layer.
//    On LLaDA 2.x (block diffusion) also its own steps, block-causal with the earlier blocks
//    cached: a block step (the block) and a block start (the previous block and this one).
//    Each also reports the bytes it moved between host and backend (Forward::transfers()).
// 2. Forced commit schedule: every policy decodes the first `blocks` blocks (at most
//    `max_steps` steps) committing exactly `tokens_per_step` tokens a step. A random model's
//    distributions are flat (confidence about 1/V), so Fast-dLLM's factor rule with f = k + 1
//    commits exactly k tokens a step for every policy and nothing else commits (Polestar's early
//    and suffix commits need confidence above 0.7); the NFE is checked against the schedule. This
//    measures system cost alone; each kind of step's bytes between host and backend too.
// 3. Projection: seconds for a whole generation at a policy's TPF tau (from a suite run):
//    n blocks, s = B / tau steps a block,
//      vanilla           n s t_full (LLaDA 2.x: n (t_block_start + (s - 1) t_block_step))
//      fast-dllm-prefix  n (t_full + (s - 1) t_prefix)
//      fast-dllm-dual    n (t_full + (s - 1) t_dual)
//      polestar          sum over blocks of its start pass (full, or windowed every 4th) +
//                        n (t_kmeans + (s - 1) (t_refresh(topk) + t_proxy))
//      others            n (start + (s - 1) step), both measured in the forced run
//    and tokens/s = tau * NFE / seconds, for both counting protocols.
// 4. Step-mix projection (with a suite run that counted its steps by kind): each policy's
//    forwards per block by kind, priced by the step timings (scale_projection.cpp), for the
//    whole canvas.
// 5. With --paper: LLaDA-8B's shape, the GSM8K 5-shot prompt (its mean token length under a
//    real tokenizer), gen 256, block 32, and the projection of 3 at the paper's TPF values,
//    with each policy's TPS ratio to Fast-dLLM dual next to the paper's.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench/machine.h"
#include "decode/options.h"
#include "model/forward.h"
#include "model/model.h"

namespace polestar::bench {

struct ScaleOptions {
  std::string like = "llada-1b";
  double layer_scale = 1.0;
  std::string model_dir;  // "" = /tmp/polestar-random-LIKE; written when it holds no checkpoint
  // "" runs the checkpoint itself; "q4_k_m", "q8_0", ... run its GGUF conversion, written
  // next to the folder (MODEL_DIR-TYPE.gguf) when absent, and report its resident memory.
  std::string gguf_type;
  int reps = 2;
  int prompt_length = 32;
  int tokens_per_step = 4;
  int blocks = 1;     // forced runs: blocks decoded from the start of the canvas
  int max_steps = 4;  // ... and at most this many steps (0: no limit)
  std::vector<std::string> policies = {"vanilla", "fast-dllm-prefix", "fast-dllm-dual", "polestar"};
  DecodeOptions base;    // gen_length, block_length and the policies' knobs
  std::string tpf_from;  // results.jsonl of a suite run; "" projects at the forced TPF only
  // The prompt length from a suite instead of prompt_length: the mean token count of its
  // prompts (gsm8k: 5-shot, as lm-eval builds them) under the tokenizer of prompt_tokenizer
  // (a model folder, or a folder with tokenizer.json), with data from data_dir.
  std::string prompt_suite, prompt_tokenizer, data_dir;
  // Two layer counts a < b below the shape's: the steps are timed at both and extrapolated
  // layer by layer to the shape's count (no forced runs then). Empty: the shape as it is.
  std::vector<int> fit_layers;
  bool paper = false;   // also project at the paper's TPF values (PaperGsm8kRows)
  std::string out_dir;  // scale.json and scale.md
  Clock clock = Clock::kWall;
  bool progress = true;
  const Backend* backend = nullptr;  // what runs the checkpoint; nullptr: the default
};

struct StepTiming {
  std::string kind;           // "full pass", "dual-cache step", "refresh step, k=4", ...
  int64_t rows_computed = 0;  // (layer, position) rows; 0 for the overheads
  std::vector<double> seconds;
  TransferBytes transfers;  // host <-> backend bytes of one step (of each overhead's pass)
  // A mixture's steps: the experts their routing read, over the layers (each expert once a
  // layer; StepResult::experts_read), per step, from one more untimed run of the plans.
  double experts_read = 0;
  double Median() const;
};

struct ForcedRun {
  std::string policy;
  int nfe = 0, nfe_expected = 0;
  int tokens = 0;  // committed
  double seconds = 0;
  int64_t rows_computed = 0;
  double start_seconds = 0;          // median of the block-start steps
  double step_seconds = 0;           // median of the other steps
  nlohmann::json step_kinds;         // kind -> {"count", "median_seconds"}
  nlohmann::ordered_json transfers;  // host <-> backend bytes by kind (TransfersJson)
  MemoryUse memory;                  // the backend's peaks over the run (-1: not counted)
  std::string error;                 // when the policy could not run (e.g. not built yet)
};

// Step timings on `model` for a canvas of prompt_length + gen_length.
std::vector<StepTiming> TimeSteps(const Model& model, const ScaleOptions& options);
// Forced-schedule runs, one per policy, and for Polestar (but on block diffusion) one per
// system part switched on: "polestar +nvfp4", "polestar +nvfp4 +offload", "polestar +overlap".
std::vector<ForcedRun> RunForcedSchedule(const Model& model, const ScaleOptions& options);
// NFE of one block of `block_length` masks under the factor rule with zero confidences.
int ForcedStepsPerBlock(int block_length, int tokens_per_step);

// Seconds for a whole generation (options.base's gen/block length) at all-positions TPF
// `tpf`, from the step timings (or, for a policy without a cost model, its forced run).
// Returns a negative value when neither is available.
double ProjectSeconds(const std::string& policy, double tpf, const ScaleOptions& options,
                      const std::vector<StepTiming>& steps, const ForcedRun* forced);

// The timings of Polestar's overheads, beside the step kinds (decode/policy.h).
inline constexpr const char* kKMeansTiming = "k-means (all layers)";
inline constexpr const char* kProxyTiming = "proxy attention (all layers)";

// The paper's LLaDA-8B-Instruct GSM8K 5-shot results at gen 256 (accuracy %, TPF, TPS).
struct PaperRow {
  const char* policy;
  double accuracy, tpf, tps;
};
std::span<const PaperRow> PaperGsm8kRows();

struct PromptLengths {
  int items = 0, min = 0, max = 0;
  double mean = 0;
};
// Token counts of a suite's prompts under a tokenizer. Throws Error naming what is missing.
PromptLengths SuitePromptLengths(const std::string& suite_name, const std::string& tokenizer_dir,
                                 const std::string& data_dir);

// Step timings at layers_a and layers_b layers, extrapolated linearly to `layers` (rows and
// bytes crossing between host and backend scaled with the layers).
std::vector<StepTiming> ExtrapolateLayers(const std::vector<StepTiming>& at_a, int layers_a,
                                          const std::vector<StepTiming>& at_b, int layers_b,
                                          int layers);

// A results.jsonl row's forwards per block by step kind (empty for rows without them).
std::map<std::string, double> StepsPerBlock(const nlohmann::json& row);
// Seconds of one step of `kind` from the timings; negative when it has no price.
double StepPrice(const std::string& kind, const std::vector<StepTiming>& steps);
// Seconds for a whole generation (options.base's canvas) at a step mix; negative when a
// kind has no price.
double ProjectStepMixSeconds(const std::string& policy,
                             const std::map<std::string, double>& steps_per_block,
                             const ScaleOptions& options, const std::vector<StepTiming>& steps);

// Writes the checkpoint when needed, runs everything, prints tables and writes
// out_dir/scale.json and out_dir/scale.md. Returns the JSON.
nlohmann::json RunScaleBenchmark(const ScaleOptions& options, const MachineInfo& machine);

}  // namespace polestar::bench
