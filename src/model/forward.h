// Executes one decoding step as planned by a policy. The model never decides which rows to
// compute; the plan (and, for policies that decide layer by layer, a LayerHook) does.
//
// Semantics, per layer l, with rows named by absolute canvas position:
//   fresh rows F_l: rows with a new layer input (F_0 = plan.input_rows, embedded from the
//     canvas; F_{l+1} = Q_l). Their input is written to the hidden-state cache (when the
//     cache keeps it) and their K/V rows are recomputed and overwritten in place.
//   query rows Q_l: rows pushed through attention + MLP. Default Q_l = F_l; a hook may
//     choose others, whose input then comes from the hidden-state cache.
//   Attention of Q_l runs over all L cached rows (bidirectional), or, when the plan sets
//   attention_block B, block-causally: row p over the cached rows of the blocks up to its
//   own, [0, (p / B + 1) B) (LLaDA 2.x's block diffusion).
// Logits are computed for plan.logit_rows (which must be query rows of the last layer). At
// the last layer only the rows something reads go through attention and the MLP: the logit
// rows, and at a captured layer plan.attention_rows (all query rows when it is empty).
//
// Every op runs on the cache's backend (backend/backend.h); the step's scratch lives there too.
// A batched step (StepRunner) takes one plan per sequence, runs the row-wise ops and matrix
// products once over the concatenation of every sequence's rows, attends each sequence's rows
// over its own KvCache, calls each sequence's hook, and returns one StepResult per sequence:
// each bit for bit what that sequence's step alone gives.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_cache.h"
#include "model/model.h"

namespace polestar {

class Forward;

// Bytes moved between host and backend memory.
struct TransferBytes {
  int64_t to_backend = 0;
  int64_t to_host = 0;
};

// Rows of `width` floats in backend memory that a hook may look at: it hands data() to the
// drift ops, or downloads them all (counted as the sequence's bytes).
class RowsView {
 public:
  RowsView(const Forward& forward, const float* rows, int64_t count, int64_t width)
      : forward_(forward), rows_(rows), count_(count), width_(width) {}
  int64_t count() const { return count_; }
  int64_t width() const { return width_; }
  // Backend memory [count, width]: for the drift ops, never for host code.
  const float* data() const { return rows_; }
  // out[count, width] (host) = every row.
  void Download(float* out) const;

 private:
  const Forward& forward_;
  const float* rows_;
  int64_t count_, width_;
};

// Where the inputs of query rows that are not fresh come from. By default the cache's
// hidden-state rows; a policy may keep them in another form (Polestar's NVFP4 store).
class HiddenSource {
 public:
  virtual ~HiddenSource() = default;
  // out[|positions|, C] (backend memory): the layer-input hidden states of `positions` at
  // `layer`.
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
  virtual void BeforeFreshRowsStored(int layer, std::span<const int> fresh_rows,
                                     const RowsView& x) {}
  // After F_l's K/V were written, before Q_l is computed.
  virtual void BeforeQueries(LayerRows& rows) {}
  // After attention at a layer listed in StepPlan::capture_layers:
  // probs[|Q_l|, H * L] for the query rows in order.
  virtual void OnAttention(int layer, std::span<const int> query_rows, const RowsView& probs) {}
};

struct StepPlan {
  std::vector<int> input_rows;      // F_0, ascending or not; no duplicates
  std::vector<int> logit_rows;      // rows whose final hidden state goes through the LM head
  std::vector<int> capture_layers;  // layers whose attention probabilities go to the hook
  LayerHook* hook = nullptr;
  int attention_block = 0;  // B > 0: block-causal attention
  // The query rows whose attention the hook reads at the captured layers (empty: all).
  std::vector<int> attention_rows = {};
  // What each logit row returns: its logits [V] (a sampler reads the distribution), or, when
  // set, the backend's greedy choice by this spec alone (16 bytes to the host, not 4V).
  std::optional<GreedySpec> greedy = {};
  // The layers at which the hook sees or chooses rows (BeforeFreshRowsStored, BeforeQueries);
  // nullopt: every layer. OnAttention follows capture_layers. The layers no hook acts at issue
  // the same ops in every step with the same rows, which the runner replays as one recording
  // where its backend records (Backend::Record).
  std::optional<std::vector<int>> hook_layers = {};
};

// One logit row of a step's result, as its plan asked: the row's logits, or the backend's
// greedy choice from them.
struct LogitRow {
  // Implicit: a row of logits is what every sampler reads.
  LogitRow(std::span<const float> logits) : logits(logits) {}
  LogitRow(const GreedyChoice& choice, const GreedySpec& spec) : choice(&choice), spec(&spec) {}
  std::span<const float> logits;         // [V]; empty with a choice
  const GreedyChoice* choice = nullptr;  // with StepPlan::greedy: the choice by *spec
  const GreedySpec* spec = nullptr;
};

struct StepResult {
  std::vector<int> logit_rows;        // as planned (and extended by the hook)
  std::optional<GreedySpec> greedy;   // as planned
  std::vector<float> logits;          // [logit_rows, V] without greedy
  std::vector<GreedyChoice> choices;  // [logit_rows] with greedy
  int64_t rows_computed = 0;          // sum over layers of |Q_l|
  int64_t kv_rows_written = 0;        // sum over layers of |F_l|
  int64_t layers_replayed = 0;        // layers issued as a replayed recording
  // With StepRunner::set_counts_experts: over the mixture layers, the experts its rows chose
  // (each expert once a layer), whose weights the step read.
  int64_t experts_read = 0;

  // What the step returned for logit row `row` (logit_rows is ascending); nullopt when it is
  // not a logit row.
  std::optional<LogitRow> Row(int row) const;
};

class Forward;

// One sequence's part of a batched step.
struct SequenceStep {
  Forward* forward = nullptr;  // the sequence's model and cache
  std::span<const int> canvas;
  const StepPlan* plan = nullptr;
};

// Runs steps, one sequence's or a batch's, and holds their scratch so steps do not allocate
// afresh.
class StepRunner {
 public:
  explicit StepRunner(const Backend& backend);
  // results[i] belongs to steps[i]. Every step's forward shares one model and backend.
  std::vector<StepResult> Run(std::span<const SequenceStep> steps);
  // Whether quiet layers may be recorded and replayed (on by default; off issues every op, as
  // a benchmark times the steps both ways).
  void set_records(bool records) { records_ = records; }
  // Whether each mixture layer downloads its experts' row counts to give experts_read (off by
  // default: a host wait a layer, which also keeps its layers from recording): how a
  // benchmark learns what weights a step's routing read.
  void set_counts_experts(bool counts) { counts_experts_ = counts; }

 private:
  // What the stages of one step share (sequences, their rows per layer, results): forward.cpp.
  struct Step;

  // Run's stages, in order. Each runs once over every sequence's rows, concatenated; M is
  // sum |Q_l|, and the scratch a stage writes is named with its shape.
  // Checks every plan; x_[sum |F_0|, C] = the embeddings of the input rows.
  void EmbedFreshRows(Step& step);
  // normed_[sum |F_l|, C], k_ and v_[sum |F_l|, Hkv*D] of the fresh rows, written into each
  // cache by position (x_ into its hidden-state rows); the hooks' BeforeFreshRowsStored. With
  // `queries_too` (a quiet layer: Q_l = F_l), also q_'s products (ComputeQueries' first half)
  // in the same pass over normed_.
  void WriteFreshKeysValues(Step& step, int layer, bool queries_too);
  // Each sequence's Q_l: F_l unless its hook chooses others; at the last layer only rows read.
  static void ChooseQueryRows(Step& step, int layer);
  // The end of the quiet layers from `first`: where no sequence's hook acts, no attention is
  // captured, and Q_l = F_l. The stages of a quiet layer issue the same ops whenever the rows
  // are the same (a mixture's too: its routing stays in backend memory).
  static int QuietLayersEnd(const Step& step, int first);
  // Layers [first, end), all quiet: the stages, issued, recorded, or replayed (Backend::Record).
  // A run of quiet layers is recorded the second time it comes in a row, and replayed after.
  void RunQuietLayers(Step& step, int first, int end);
  // What the ops of quiet layers [first, end) depend on besides the weights' and caches'
  // contents: the rows, the memory, the shapes. Equal keys issue equal ops.
  std::vector<int64_t> QuietLayersKey(const Step& step, int first, int end) const;
  // x_[M, C] = the query rows' inputs (from x_ or the hidden-state store), normed_[M, C], and
  // q_[M, H*D] their queries' products.
  void GatherQueryInputs(Step& step, int layer);
  // q_[M, H*D] = the queries' products of normed_.
  void ComputeQueries(const Step& step, int layer);
  // q_'s products normed (QK-norm), clamped and rotated to their rows' positions.
  void PositionQueries(const Step& step, int layer);
  // q_'s product of normed_ rows, for RmsNormProducts (q_ reserved for `rows`).
  NormedProduct QueryProduct(const Step& step, int layer, int64_t rows);
  // attn_[M, H*D] = each sequence's queries over its own cache; at a captured layer the hook
  // gets probs_[|Q_l|, H, L].
  void AttendEachSequence(const Step& step, int layer);
  // Query rows [begin, end) of a sequence attend over the cache's first `keys` keys.
  struct KeyRun {
    int64_t begin, end, keys;
  };
  // The runs of rows at `positions` over a cache of `length`: with a block-causal `block`,
  // row p sees the keys [0, (p / block + 1) block); with block 0, every row all of them.
  static std::vector<KeyRun> KeyRuns(std::span<const int> positions, int64_t block, int64_t length);
  // out[|Q|, H*D] = the block-causal attention of q[|Q|, H*D] (rows at `positions`) over the
  // cache, and probs[|Q|, H, L] as the bidirectional ones, zero on the keys a row cannot see.
  void AttendBlockCausal(const ModelConfig& c, const KvCache& cache, int layer,
                         std::span<const int> positions, int64_t block, const float* q, float* out,
                         float* probs);
  // x_[M, C] += W_o attn_ (through proj_[M, C] when W_o has a bias): the attention block's
  // residual.
  void AddAttentionOutput(const Step& step, int layer);
  // x_[M, C] += the MLP of rmsnorm(x_): SwiGLU, or a mixture of SwiGLU experts (proj_[M, C]).
  // gate_ and up_ [M, F] hold a SwiGLU's products.
  void FeedForward(Step& step, int layer);
  // Final norm and LM head over each sequence's logit rows (final_[sum n_logits, C]), which
  // must be query rows of the last layer: its result's logits [n_logits, V], or with
  // StepPlan::greedy their choices [n_logits] (the logits stay in backend memory).
  void ComputeLogits(Step& step);

  // out[M, C] += W_down (silu(gate_) * up_), gate_ and up_ [M, F] holding the rows' SwiGLU
  // products.
  void AddSwiGluOutput(const SwiGluWeights& w, RowSegments segments, int64_t m, float* out);
  // proj_ = the mixture of experts of normed_ (the step's M query rows; router_ [M, E] holds
  // their router logits).
  void MixtureOfExperts(Step& step, const LayerWeights& w);

  const Backend& backend_;
  // Recordings of quiet layers, the most recently replayed first, and the keys of the quiet
  // layers last issued without one. Off once the backend records none.
  struct Recording {
    std::vector<int64_t> key;
    std::unique_ptr<OpGraph> graph;
  };
  static constexpr size_t kRecordings = 4;
  std::vector<Recording> recordings_;
  std::vector<std::vector<int64_t>> unrecorded_keys_;  // most recent first, at most kRecordings
  bool backend_records_ = true;
  bool records_ = true;          // set_records
  bool counts_experts_ = false;  // set_counts_experts
  // Scratch, grown to the largest step seen; rows of all sequences, concatenated. Shapes at
  // the stages above.
  Buffer x_, x_next_, normed_, q_, k_, v_, attn_, proj_, gate_, up_, probs_, loaded_, final_;
  Buffer logits_;     // [sum n_logits, V]
  Buffer run_probs_;  // block-causal capture: one run's probabilities [run, H, keys]
  std::vector<AttentionCall>
      uncaptured_;  // a layer's attention runs whose probabilities no hook reads
  Buffer router_, expert_in_, expert_out_;  // MoE layers: [M, E], [M*k, C], [M*k, C]
  // MoE routing, in backend memory: per row its experts and weights ([M, k], i32 and f32),
  // the rows grouped by expert with their weights ([M*k], i32 and f32), the rows of each
  // sequence per expert ([S, E], i32) and each row's places among the grouped rows ([M, k],
  // i32; GroupByExpert).
  Buffer chosen_, route_weights_, expert_rows_, expert_weights_, expert_counts_, expert_slots_;
  // The experts' weights, a list per product ([E] each).
  std::vector<WeightView> expert_gates_, expert_ups_, expert_downs_;
  std::vector<int> expert_counts_host_;  // [S, E] with set_counts_experts
};

// The scratch of the drift ops that need some (ProjectQueries, ProxyAttention), grown to the
// largest call and kept, so they do not allocate once warm. A caller keeps one per queue it
// issues drift ops on: a side queue's job and the main queue may run at once.
class DriftScratch {
 public:
  explicit DriftScratch(const Backend& backend);

 private:
  friend class Forward;
  Buffer normed_;   // [M, C]
  Buffer queries_;  // [M, H*D]
  Buffer keys_;     // [L, Hkv*D] un-rotated
};

// A sequence's view of the model over its cache: its steps alone, and the drift ops.
class Forward {
 public:
  // Runs on the cache's backend.
  Forward(const Model& model, KvCache& cache);
  StepResult Run(std::span<const int> canvas, const StepPlan& plan);
  const Backend& backend() const { return backend_; }
  // This sequence's steps' StepRunner::set_records.
  void set_records(bool records) { runner_.set_records(records); }
  // This sequence's steps' StepRunner::set_counts_experts.
  void set_counts_experts(bool counts) { runner_.set_counts_experts(counts); }

  // Every byte this sequence moved between host and backend so far: its steps' plans and
  // outputs, its hooks' downloads, its drift ops' inputs and outputs.
  TransferBytes transfers() const { return {to_backend_.load(), to_host_.load()}; }
  // The crossings, counted. Thread-safe (drift ops may run on a side queue).
  void Upload(const void* host, int64_t bytes, void* dst) const;
  void Download(const void* src, int64_t bytes, void* host) const;

  // Drift ops: the model operations the drift-aware policies (and the scale bench, which
  // times them) measure drift with, so no policy touches the cache or re-derives model math.
  // They only read the cache, so a policy may call them from a side queue (backend.h
  // SideQueue) while Run computes other layers. L is the cache's length. Polestar's
  // (ProjectQueries, ReadHidden, UnrotatedKeys, ProxyAttention, HeadMeanDrift) take and
  // write backend memory; what comes back to the host is HeadMeanDrift's per-row drift
  // (counted here). Scratch is the caller's (DriftScratch).

  // q[M, H*D] = W_q · rmsnorm(x[M, C]) (+ bias), without RoPE: Polestar's proxy queries.
  void ProjectQueries(int layer, const float* x, int64_t m, float* q, DriftScratch& scratch) const;
  // out row out_rows[i] (i when out_rows is empty) [C] = the cached layer-input hidden state
  // of positions[i] at `layer`.
  void ReadHidden(int layer, std::span<const int> positions, float* out,
                  std::span<const int> out_rows = {}) const;
  // out[L, Hkv*D]: the layer's cached keys with RoPE undone.
  void UnrotatedKeys(int layer, float* out) const;
  // probs[M, H, L]: the attention of the proxy queries of x[M, C] (ProjectQueries) over the
  // un-rotated keys: Polestar's proxy attention of cluster centroids.
  void ProxyAttention(int layer, const float* x, int64_t m, float* probs,
                      DriftScratch& scratch) const;
  // probs[|positions|, H, L] (backend memory, grown to fit): the attention the cached layer
  // inputs of `positions` pay over the cached keys, with RoPE as in Run: Elastic-Cache's
  // attention before a step. Its scratch persists (one call at a time).
  void CachedRowsAttention(int layer, std::span<const int> positions, Buffer& probs) const;
  // out[r] (host) = the mean over heads of the drift of now from before, both [rows, H, L];
  // `logs` as the backend's.
  void HeadMeanDrift(DriftMetric metric, const float* now, const float* before, int64_t rows,
                     double* out, DriftLogs logs = {}) const;
  // The mean over rows i and keys j of the cosine across heads between before[i, :, j] and
  // now[now_rows[i], :, j]; before[|now_rows|, H, L] (CachedRowsAttention's), now[*, H, L] (a
  // hook's view).
  double MeanCrossHeadCosine(const RowsView& now, std::span<const int> now_rows,
                             const Buffer& before) const;
  // top[|top|] (host) = the |top| keys of `keys` (host, distinct) to which the rows `rows` of
  // probs[*, H, L] (a hook's view) pay the most attention, summed over those rows and heads;
  // largest first, ties to the lower key: Elastic-Cache's most-attended tokens. Its scratch
  // persists (one call at a time).
  void MostAttendedKeys(const RowsView& probs, std::span<const int> rows, std::span<const int> keys,
                        std::span<int> top) const;

 private:
  friend class StepRunner;

  // ProjectQueries and UnrotatedKeys over backend memory; normed[M, C] is scratch.
  void Project(int layer, const float* x, int64_t m, float* q, Buffer& normed) const;
  void Unrotate(int layer, float* out) const;

  const Model& model_;
  KvCache& cache_;
  const Backend& backend_;
  const ResidentWeights& weights_;  // the model on backend_
  StepRunner runner_;               // this sequence's steps alone
  mutable std::atomic<int64_t> to_backend_ = 0, to_host_ = 0;
  // Elastic-Cache's drift ops' scratch, grown to the largest call: CachedRowsAttention's
  // inputs [|P|, C], their norms [|P|, C] and queries [|P|, H*D], MostAttendedKeys' mass [L]
  // (doubles).
  mutable Buffer cached_inputs_, cached_normed_, cached_queries_, key_mass_;
  std::vector<int> every_position_;  // [L] 0, 1, ...: Unrotate's positions
};

// A fresh cache sized for `positions` rows of this model, on the model's backend or `backend`.
KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden);
KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden, const Backend& backend);

}  // namespace polestar
