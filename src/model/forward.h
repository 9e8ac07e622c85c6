// Executes one decoding step as planned by a policy. The model never decides which rows to
// compute; the plan (and, for policies that decide layer by layer, a LayerHook) does.
//
// Semantics, per layer l, with rows named by absolute canvas position:
//   fresh rows F_l: rows with a new layer input (F_0 = plan.input_rows, embedded from the
//     canvas; F_{l+1} = Q_l). Their input is written to the hidden-state cache (when the
//     cache keeps it) and their K/V rows are recomputed and overwritten in place.
//   query rows Q_l: rows pushed through attention + MLP. Default Q_l = F_l; a hook may
//     choose others, whose input then comes from the hidden-state cache.
//   Attention of Q_l runs over all L cached rows (bidirectional).
// Logits are computed for plan.logit_rows (which must be query rows of the last layer).
#pragma once

#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "model/model.h"

namespace polestar {

// Where the inputs of query rows that are not fresh come from. By default the cache's
// hidden-state rows; a policy may keep them in another form (Polestar's NVFP4 store).
class HiddenSource {
 public:
  virtual ~HiddenSource() = default;
  // out[|positions|, C]: the layer-input hidden states of `positions` at `layer`.
  virtual void Read(int layer, std::span<const int> positions, float* out) const = 0;
};

struct LayerRows {
  int layer = 0;
  std::span<const int> fresh_rows;  // F_l (their K/V are already rewritten)
  std::vector<int>* query_rows;     // Q_l, preset to F_l; the hook may replace it
  std::vector<int>* logit_rows;     // the step's logit rows; may be extended at the last layer
  const HiddenSource* hidden_source = nullptr;  // set by the hook to override the cache
};

class LayerHook {
 public:
  virtual ~LayerHook() = default;
  // Before the fresh rows' inputs x[|F_l|, C] overwrite the hidden-state cache (which still
  // holds the old rows), so a policy can see both.
  virtual void BeforeFreshRowsStored(int layer, std::span<const int> fresh_rows, const float* x) {}
  // After F_l's K/V were written, before Q_l is computed.
  virtual void BeforeQueries(LayerRows& rows) {}
  // After attention at a layer listed in StepPlan::capture_layers:
  // probs[|Q_l|, H, L] for the query rows in order.
  virtual void OnAttention(int layer, std::span<const int> query_rows, const float* probs) {}
};

struct StepPlan {
  std::vector<int> input_rows;      // F_0, ascending or not; no duplicates
  std::vector<int> logit_rows;      // rows whose final hidden state goes through the LM head
  std::vector<int> capture_layers;  // layers whose attention probabilities go to the hook
  LayerHook* hook = nullptr;
};

struct StepResult {
  std::vector<int> logit_rows;  // as planned (and extended by the hook)
  std::vector<float> logits;    // [logit_rows, V]
  int64_t rows_computed = 0;    // sum over layers of |Q_l|
  int64_t kv_rows_written = 0;  // sum over layers of |F_l|
};

// Holds the scratch buffers of the forward pass so steps do not allocate afresh.
class Forward {
 public:
  Forward(const Model& model, KvCache& cache);
  StepResult Run(std::span<const int> canvas, const StepPlan& plan);

  // q[M, H*D] = W_q · rmsnorm(x[M, C]) (+ bias), without RoPE: Polestar's proxy queries.
  void ProjectQueries(int layer, const float* x, int64_t m, float* q);

 private:
  void ComputeKv(int layer, std::span<const int> rows, const float* x, LayerHook* hook);

  const Model& model_;
  KvCache& cache_;
  std::vector<float> x_, x_next_, normed_, q_, k_, v_, attn_, proj_, gate_, up_, probs_;
};

// A fresh cache sized for `positions` rows of this model.
KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden);

}  // namespace polestar
