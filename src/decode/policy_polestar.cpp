// Polestar (SPEC §5; gt-synergy-lab/Polestar @ a125b28 plus the paper's system parts).
//
// Block skeleton: dual-cache semi-AR decoding. A block starts with a full pass, except every
// `full_refresh_period`-th block, which starts with a pass over the window
// [start - 2B, end + B) only. Decode steps compute the block rows; when the trigger fires
// (more than one token committed last step, or more than tau_upd since the last refresh)
// the step also runs a sparse refresh:
//   Polestar-Cache: at every layer the window's cached layer inputs (prefix and suffix of
//   the block, clustered at block start with spherical k-means) are summarised by cluster
//   centroids; each centroid's proxy attention over the un-rotated key cache is compared
//   (KL) with the last time, and the rows of the most-drifted clusters are recomputed from
//   their cached inputs. Their outputs (the update packet) become the next layer's inputs:
//   its hidden-state cache rows, K/V rows and centroid shift. The last layer's packet gets
//   logits.
//   Polestar-Commit: the last layer's attention of each block query is compared (KL) with
//   the previous step; a masked position with 0.7 < conf < tau_s commits early when the
//   drift jump delta (vs the mean of the last 5 steps) clears alpha (tau_s - conf)^2 and
//   stays under the cap. Refreshed positions beyond the block commit when conf >= tau_s.
//
// Choices where the released code leaves room (see docs/policies.md):
//   - k-means seeding is deterministic (SPEC §5.2); ties in top-k go to the lower cluster.
//   - The cache stores rotated keys; proxy attention un-rotates a copy of the layer's keys.
//   - Proxy attention, drift and cache reads are the model's drift ops (Forward), so the
//     scale bench times exactly this code's proxy step.
//   - The NVFP4 store keeps each window row as frozen-at-clustering centroid + NVFP4
//     residual (one FP32 scale per layer window); packet rows are re-quantised. With
//     offload_residuals the residuals are offloaded memory (backend.h Placement): off the
//     accelerator, read in place for the refreshed rows only.
//   - "cosine" drift (the ablation) replaces the per-cluster KL with 1 - cos; the token
//     drift of Polestar-Commit stays KL (its gate is calibrated for KL).
//   - With overlap on, block-start clustering, quantisation and baseline proxies run on the
//     backend's side queue while the forward moves to the next layers; decode-step proxies
//     are on the critical path (a layer's selection needs them) and stay synchronous.
//   - Everything the drift work reads or keeps lives in backend memory (centroids, proxies
//     and their logs, the NVFP4 store, the last step's attention) and runs as backend ops;
//     the host gets the plan's inputs only: the window's cluster labels once a block, each
//     refresh layer's K cluster drifts, each step's token drifts.
//
// On block diffusion (LLaDA 2.x) Polestar is Polestar-Commit alone: earlier blocks are final
// and later ones invisible, so nothing is stale and there is no window to refresh or to
// commit from. Each step runs what LLaDA 2.x's sampler runs (the block, plus the previous
// block's final rows at a block's first step), its commit rule picks the commits, and the
// drift gate adds early ones from the block-causal attention of the last layer.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "base/error.h"
#include "decode/commit_rules.h"
#include "decode/policy_registry.h"
#include "drift/drift.h"

namespace polestar {
namespace {

// One layer's view of the current block's window: the plan on the host, the rest in backend
// memory (Buffers grown to the largest block, kept across blocks).
struct LayerClusters {
  LayerClusters(const Backend& backend, Placement store)
      : centroids(backend, 0),
        previous_proxy(backend, 0),
        previous_proxy_logs(backend, 0, ElementType::kF64),
        base(backend, 0),
        scales(backend, 0, ElementType::kU8, Buffer::Init::kZero, store),
        values(backend, 0, ElementType::kU8, Buffer::Init::kZero, store) {}
  int count = 0;                // K
  std::vector<int> labels;      // [L] cluster of each window row, -1 elsewhere
  std::vector<float> members;   // [K]
  Buffer centroids;             // [K, C] moved by update packets
  Buffer previous_proxy;        // [K, H, L] proxy attention the last time it ran
  Buffer previous_proxy_logs;   // [K, H, L] f64: its KL logs, once a drift took them
  bool has_proxy_logs = false;  // whether previous_proxy_logs holds them
  // NVFP4 store of the window's hidden states (when enabled): row p - window begin of
  // scales/values is row p's residual from its cluster's base row. Offloaded on request: it
  // is read only for the refreshed rows.
  Buffer base;    // [K, C] centroids at clustering time
  Buffer scales;  // [window, ceil(C / 16)] u8
  Buffer values;  // [window, ceil(C / 2)] u8
  float tensor_scale = 1;
};

enum class Mode { kBlockStart, kDecode, kRefresh };

class PolestarPolicy final : public Policy, public LayerHook, public HiddenSource {
 public:
  PolestarPolicy(const DecodeOptions& options, const Model& model)
      : options_(options), model_(model), rng_(options.seed ^ 0x9e3779b97f4a7c15ull) {}
  ~PolestarPolicy() override { WaitForWorker(); }

  bool NeedsHiddenStates() const override { return !block_diffusion_; }

  StepPlan Plan(const DecodeContext& context) override {
    WaitForWorker();
    if (forward_ != &context.forward) Bind(context.forward);
    canvas_ = context.canvas;
    stats_ = nlohmann::json::object();
    const ModelConfig& config = model_.config();
    const int length = int(context.canvas.size());
    StepPlan plan;
    plan.hook = this;
    plan.attention_rows = Range(context.block.start, context.block.end);  // OnAttention's rows
    if (block_diffusion_) {
      if (context.step_in_block == 0) StartBlock(context);
      mode_ = context.step_in_block == 0 ? Mode::kBlockStart : Mode::kDecode;
      plan.input_rows = Range(options_.refresh_all ? 0 : final_before_, context.block.end);
      final_before_ = context.block.start;
      plan.hook_layers.emplace();  // under block diffusion the hook reads attention alone
      if (options_.early_commit) plan.capture_layers = {config.layers - 1};  // token drift
      stats_["pass"] = "block";
      kind_ = context.step_in_block == 0 ? step_kind::kBlockStart : step_kind::kBlockStep;
      return plan;
    }
    if (options_.early_commit || options_.refresh_all) plan.capture_layers = {config.layers - 1};

    if (context.step_in_block == 0) {
      StartBlock(context);
      mode_ = Mode::kBlockStart;
      const int period = options_.full_refresh_period;
      const bool windowed = context.block.index > 0 && context.block.index % period == period - 1 &&
                            !options_.refresh_all;
      plan.input_rows = windowed ? Range(window_begin_, window_end_) : Range(0, length);
      plan.capture_layers = {config.layers - 1};  // the token-drift baseline of the block
      stats_["pass"] = windowed ? "window" : "full";
      kind_ = windowed ? step_kind::kWindowedPass : step_kind::kFullPass;
      return plan;
    }

    const bool trigger = trigger_.Fire(block_commits_last_step_);
    if (options_.refresh_all) {
      mode_ = Mode::kDecode;
      plan.hook_layers.emplace();  // a decode step's hook reads attention alone
      plan.input_rows = Range(0, length);
      stats_["pass"] = "full";
      kind_ = step_kind::kFullPass;
      return plan;
    }
    mode_ =
        trigger && options_.polestar_cache && total_clusters_ > 0 ? Mode::kRefresh : Mode::kDecode;
    plan.input_rows = block_rows_;
    if (mode_ == Mode::kDecode) plan.hook_layers.emplace();
    stats_["pass"] = mode_ == Mode::kRefresh ? "refresh" : "block";
    kind_ = mode_ == Mode::kRefresh ? step_kind::Refresh(options_.topk_clusters)
                                    : std::string(step_kind::kDualStep);
    if (mode_ == Mode::kRefresh) stats_["refreshed_rows"] = nlohmann::json::array();
    return plan;
  }

  void AfterStep(const DecodeContext& context, const StepResult& result,
                 std::span<const Candidate> candidates, std::vector<Commit>& commits) override {
    if (context.step_in_block == 0) {
      block_commits_last_step_ = int(commits.size());
      return;
    }
    // Polestar-Commit: drift jump of every block position against its recent history.
    std::vector<double> delta;
    if (token_drift_valid_) {
      delta = token_drift_;
      if (!drift_history_.empty()) {
        for (size_t i = 0; i < delta.size(); ++i) {
          double mean = 0;
          for (const auto& past : drift_history_) mean += past[i];
          delta[i] -= mean / double(drift_history_.size());
        }
      }
      drift_history_.push_back(token_drift_);
      if (int(drift_history_.size()) > options_.drift_history) drift_history_.pop_front();
    }
    nlohmann::json early_commits = nlohmann::json::array();  // [position, confidence] each
    if (options_.early_commit && !delta.empty()) {
      std::vector<bool> taken(static_cast<size_t>(context.block.end - context.block.start), false);
      for (const Commit& c : commits) taken[size_t(c.position - context.block.start)] = true;
      for (const Candidate& candidate : candidates) {
        const size_t offset = size_t(candidate.position - context.block.start);
        if (taken[offset]) continue;
        if (PassesDriftGate(candidate.confidence, delta[offset], options_.early_floor,
                            options_.tau_s, options_.alpha, options_.drift_cap)) {
          commits.push_back({candidate.position, candidate.token});
          early_commits.push_back({candidate.position, candidate.confidence});
        }
      }
    }
    block_commits_last_step_ = int(commits.size());

    int suffix = 0;
    if (mode_ == Mode::kRefresh && options_.suffix_commit)
      suffix = SuffixCommits(context, result, commits);
    stats_["early_commits"] = early_commits;
    stats_["suffix_commits"] = suffix;
    if (!delta.empty()) {
      stats_["token_drift"] = token_drift_;
      stats_["drift_delta"] = delta;
    }
  }

  nlohmann::json StepStats() const override { return stats_; }
  std::string StepKind() const override { return kind_; }

  // LayerHook -----------------------------------------------------------------------------

  void BeforeFreshRowsStored(int layer, std::span<const int> fresh, const RowsView& rows) override {
    if (mode_ != Mode::kRefresh || layer == 0) return;
    // Rows of the previous layer's packet arrive here: move their clusters' centroids by
    // (sum h_new - sum h_old) / members and re-quantise their NVFP4 residuals.
    LayerClusters& lc = layers_[size_t(layer)];
    if (lc.labels.empty()) return;
    std::vector<int> packet_rows, positions, labels, store_rows;  // per moved row
    for (size_t i = 0; i < fresh.size(); ++i) {
      const int p = fresh[i];
      const int label = lc.labels[size_t(p)];
      if (label < 0 || IsBlockRow(p)) continue;
      packet_rows.push_back(int(i));
      positions.push_back(p);
      labels.push_back(label);
      store_rows.push_back(p - window_begin_);
    }
    if (positions.empty()) return;
    const int64_t C = model_.config().width;
    const Backend& backend = forward_->backend();
    old_rows_.Reserve(int64_t(positions.size()) * C);  // [moved, C]
    Read(layer, positions, old_rows_.data());
    backend.ShiftCentroids(rows.data(), packet_rows, old_rows_.data(), labels, lc.members, C,
                           lc.centroids.data());
    if (options_.nvfp4_hidden) {
      backend.QuantizeResiduals(rows.data(), packet_rows, lc.base.data(), labels, C,
                                lc.tensor_scale, lc.scales.As<uint8_t>(), lc.values.As<uint8_t>(),
                                store_rows);
    }
  }

  void BeforeQueries(LayerRows& rows) override {
    if (block_diffusion_) return;
    if (mode_ == Mode::kBlockStart) {
      if (options_.overlap) {
        // One job in flight: layer l's clustering runs while the forward computes layer l's
        // queries, attention and MLP and layer l+1's K/V.
        if (!side_queue_) side_queue_ = forward_->backend().MakeSideQueue();
        side_queue_->Run([this, layer = rows.layer] { ClusterLayer(layer); });
      } else {
        ClusterLayer(rows.layer);
      }
      return;
    }
    if (mode_ != Mode::kRefresh) return;
    const ModelConfig& config = model_.config();
    LayerClusters& lc = layers_[size_t(rows.layer)];
    if (lc.count == 0) return;
    const int64_t proxy_size = int64_t(lc.count) * config.heads * int64_t(canvas_.size());
    proxy_.Reserve(proxy_size);  // [K, H, L]
    forward_->ProxyAttention(rows.layer, lc.centroids.data(), lc.count, proxy_.data(), *scratch_);
    const int64_t length = int64_t(canvas_.size());
    std::vector<double> drift(static_cast<size_t>(lc.count), 0.0);  // [K]
    const bool kl = options_.drift_metric == DriftMetric::kKl;
    if (kl) proxy_logs_.Reserve(proxy_size);  // [K, H, L]
    forward_->HeadMeanDrift(
        options_.drift_metric, proxy_.data(), lc.previous_proxy.data(), lc.count, drift.data(),
        {kl ? proxy_logs_.As<double>() : nullptr,
         lc.has_proxy_logs ? lc.previous_proxy_logs.As<const double>() : nullptr});
    if (kl) std::swap(lc.previous_proxy_logs, proxy_logs_);
    lc.has_proxy_logs = kl;
    std::swap(lc.previous_proxy, proxy_);
    const bool last = rows.layer == config.layers - 1;
    const size_t top = size_t(std::min(last ? 1 : options_.topk_clusters, lc.count));
    const std::vector<size_t> chosen = SelectTopK(drift, top);
    std::vector<bool> refresh(static_cast<size_t>(lc.count), false);
    for (size_t c : chosen) refresh[c] = true;
    std::vector<int> selected;
    for (int p = window_begin_; p < window_end_; ++p) {
      const int label = lc.labels[size_t(p)];
      if (label >= 0 && refresh[size_t(label)] && !IsBlockRow(p)) selected.push_back(p);
    }
    std::vector<int>& query = *rows.query_rows;
    query = block_rows_;
    query.insert(query.end(), selected.begin(), selected.end());
    if (options_.nvfp4_hidden) rows.hidden_source = this;
    stats_["refreshed_rows"].push_back(selected.size());
    if (last) {
      packet_rows_ = selected;
      for (int r : selected) {
        const int predicted = config.PredictedPosition(r);
        if (predicted >= block_end_ && predicted < int(length) &&
            canvas_[size_t(predicted)] == config.mask_id) {
          rows.logit_rows->push_back(r);
        }
      }
      std::sort(rows.logit_rows->begin(), rows.logit_rows->end());
    }
  }

  void OnAttention(int layer, std::span<const int> query_rows, const RowsView& probs) override {
    // The last layer's attention rows of the block queries: token drift vs the last step.
    const int64_t row_size = probs.width();  // H * L
    const int block = block_end_ - block_start_;
    std::vector<int> from, to;  // the block's rows among the query rows, and their offsets
    for (size_t i = 0; i < query_rows.size(); ++i) {
      const int p = query_rows[i];
      if (p < block_start_ || p >= block_end_) continue;
      from.push_back(int(i));
      to.push_back(p - block_start_);
    }
    const Backend& backend = forward_->backend();
    attention_.Reserve(block * row_size);  // [B, H, L]
    if (int(from.size()) < block) backend.Zero(attention_.data(), block * row_size);
    if (!from.empty()) backend.CopyRows(probs.data(), from, attention_.data(), to, row_size);
    token_drift_valid_ = mode_ != Mode::kBlockStart && has_previous_attention_;
    if (token_drift_valid_) {
      token_drift_.assign(size_t(block), 0.0);
      attention_logs_.Reserve(block * row_size);  // [B, H, L]
      forward_->HeadMeanDrift(
          DriftMetric::kKl, attention_.data(), previous_attention_.data(), block,
          token_drift_.data(),
          {attention_logs_.As<double>(),
           has_previous_attention_logs_ ? previous_attention_logs_.As<const double>() : nullptr});
      std::swap(previous_attention_logs_, attention_logs_);
    }
    has_previous_attention_logs_ = token_drift_valid_;
    std::swap(previous_attention_, attention_);
    has_previous_attention_ = true;
  }

  // HiddenSource: window rows from the NVFP4 store (when enabled), others from the engine's
  // cache.
  void Read(int layer, std::span<const int> positions, float* out) const override {
    const LayerClusters& lc = layers_[size_t(layer)];
    std::vector<int> cached, cached_at, stored, labels, stored_at;  // positions, their rows
    for (int i = 0; i < int(positions.size()); ++i) {
      const int p = positions[size_t(i)];
      const int label = lc.labels.empty() ? -1 : lc.labels[size_t(p)];
      if (options_.nvfp4_hidden && label >= 0) {
        stored.push_back(p - window_begin_);
        labels.push_back(label);
        stored_at.push_back(i);
      } else {
        cached.push_back(p);
        cached_at.push_back(i);
      }
    }
    forward_->ReadHidden(layer, cached, out, cached_at);
    if (!stored.empty()) {
      forward_->backend().DequantizeResiduals(lc.scales.As<uint8_t>(), lc.values.As<uint8_t>(),
                                              stored, lc.base.data(), labels, model_.config().width,
                                              lc.tensor_scale, out, stored_at);
    }
  }

 private:
  // The backend memory of a sequence's forward; the policy's Buffers live there.
  void Bind(Forward& forward) {
    forward_ = &forward;
    const Backend& backend = forward.backend();
    layers_.clear();
    const Placement store =
        options_.offload_residuals ? Placement::kOffloaded : Placement::kBackend;
    for (int l = 0; l < model_.config().layers; ++l) layers_.emplace_back(backend, store);
    scratch_.emplace(backend);
    side_scratch_.emplace(backend);
    window_ = Buffer(backend, 0);
    window_labels_ = Buffer(backend, 0, ElementType::kI32);
    amax_ = Buffer(backend, 1);
    old_rows_ = Buffer(backend, 0);
    proxy_ = Buffer(backend, 0);
    proxy_logs_ = Buffer(backend, 0, ElementType::kF64);
    for (Buffer* b : {&attention_, &previous_attention_}) *b = Buffer(backend, 0);
    for (Buffer* b : {&attention_logs_, &previous_attention_logs_})
      *b = Buffer(backend, 0, ElementType::kF64);
    has_previous_attention_ = has_previous_attention_logs_ = false;
  }

  bool IsBlockRow(int p) const { return p >= block_rows_.front() && p < block_end_; }

  void StartBlock(const DecodeContext& context) {
    const int length = int(context.canvas.size());
    const int block_length = context.block.end - context.block.start;
    block_start_ = context.block.start;
    block_end_ = context.block.end;
    block_rows_ = Range(model_.config().PredictingRow(block_start_), block_end_);
    // In 64 bits: a window of up to the context's worth of blocks overflows int before the
    // canvas clamps it.
    window_begin_ = int(
        std::max<int64_t>(0, block_start_ - int64_t(options_.window_prefix_blocks) * block_length));
    window_end_ = int(std::min<int64_t>(
        length, block_end_ + int64_t(options_.window_suffix_blocks) * block_length));
    // Block diffusion: no window (nothing before the block is stale, nothing after it seen).
    const int prefix = block_diffusion_ ? 0 : block_start_ - window_begin_;
    const int suffix = block_diffusion_ ? 0 : window_end_ - block_end_;
    const int total = prefix + suffix;
    prefix_clusters_ = 0;
    if (prefix > 0 && total > 0) {
      prefix_clusters_ = std::clamp(options_.clusters * prefix / total, 1, options_.clusters - 1);
    }
    suffix_clusters_ = suffix > 0 ? options_.clusters - prefix_clusters_ : 0;
    total_clusters_ = prefix_clusters_ + suffix_clusters_;
    trigger_.Reset();
    block_commits_last_step_ = 0;
    drift_history_.clear();
    token_drift_valid_ = false;
    packet_rows_.clear();
  }

  // Clusters one layer's window at block start and records its baseline proxy attention.
  // May run on the side queue: it touches only this layer's state, window_, window_labels_,
  // amax_ and side_scratch_.
  void ClusterLayer(int layer) {
    const int64_t C = model_.config().width;
    const int64_t length = int64_t(canvas_.size());
    const Backend& backend = forward_->backend();
    LayerClusters& lc = layers_[size_t(layer)];
    lc.count = total_clusters_;
    lc.has_proxy_logs = false;
    lc.labels.clear();
    lc.members.assign(size_t(lc.count), 0.0f);
    if (lc.count == 0) return;
    lc.labels.assign(size_t(length), -1);
    lc.centroids.Reserve(lc.count * C);  // [K, C]
    // The window's cached layer inputs; row p - window_begin_ is row p's.
    const int window = window_end_ - window_begin_;
    window_.Reserve(window * C);     // [window, C]
    window_labels_.Reserve(window);  // [window] i32
    forward_->ReadHidden(layer, Range(window_begin_, window_end_), window_.data());
    auto cluster_part = [&](int begin, int end, int k, int first_label) {
      if (end <= begin || k == 0) return;
      const int64_t offset = begin - window_begin_;
      int* labels = window_labels_.As<int>() + offset;
      backend.SphericalKMeans(window_.data() + offset * C, end - begin, C, k, options_.kmeans_iters,
                              lc.centroids.data() + first_label * C, labels);
      forward_->Download(labels, int64_t(end - begin) * 4, &lc.labels[size_t(begin)]);
      for (int p = begin; p < end; ++p) {
        lc.labels[size_t(p)] += first_label;
        lc.members[size_t(lc.labels[size_t(p)])] += 1;
      }
    };
    cluster_part(window_begin_, block_start_, prefix_clusters_, 0);
    cluster_part(block_end_, window_end_, suffix_clusters_, prefix_clusters_);
    if (options_.nvfp4_hidden) {
      lc.base.Reserve(lc.count * C);  // [K, C]
      backend.Copy(lc.centroids.data(), lc.count * C, lc.base.data());
      lc.scales.Reserve(window * Nvfp4ScaleBytes(C));
      lc.values.Reserve(window * Nvfp4ValueBytes(C));
      std::vector<int> rows, labels;  // the clustered window rows, their clusters
      for (int p = window_begin_; p < window_end_; ++p) {
        if (lc.labels[size_t(p)] < 0) continue;
        rows.push_back(p - window_begin_);
        labels.push_back(lc.labels[size_t(p)]);
      }
      backend.ResidualAbsMax(window_.data(), rows, lc.base.data(), labels, C, amax_.data());
      float amax = 0;
      forward_->Download(amax_.data(), 4, &amax);
      lc.tensor_scale = Nvfp4TensorScale(amax);
      backend.QuantizeResiduals(window_.data(), rows, lc.base.data(), labels, C, lc.tensor_scale,
                                lc.scales.As<uint8_t>(), lc.values.As<uint8_t>(), rows);
    }
    lc.previous_proxy.Reserve(lc.count * model_.config().heads * length);  // [K, H, L]
    forward_->ProxyAttention(layer, lc.centroids.data(), lc.count, lc.previous_proxy.data(),
                             *side_scratch_);
  }

  int SuffixCommits(const DecodeContext& context, const StepResult& result,
                    std::vector<Commit>& commits) {
    const ModelConfig& config = model_.config();
    const TokenSampler sample(config, options_);  // as the commit rule draws its candidates
    int added = 0;
    for (int r : packet_rows_) {
      const int p = config.PredictedPosition(r);
      if (p < block_end_ || p >= int(canvas_.size()) || canvas_[size_t(p)] != config.mask_id)
        continue;
      const std::optional<LogitRow> row = result.Row(r);
      if (!row) continue;
      const TokenChoice choice = sample(*row, rng_);
      if (choice.confidence >= options_.tau_s) {
        commits.push_back({p, choice.token});
        ++added;
      }
    }
    return added;
  }

  void WaitForWorker() {
    if (side_queue_) side_queue_->Wait();
  }

  const DecodeOptions options_;
  const Model& model_;
  const bool block_diffusion_ = model_.config().sampler == SamplerFamily::kLlada2;
  int final_before_ = 0;  // block diffusion: rows before it hold their final K/V
  Rng rng_;
  Forward* forward_ = nullptr;
  std::span<const int> canvas_;
  Mode mode_ = Mode::kBlockStart;
  int block_start_ = 0, block_end_ = 0, window_begin_ = 0, window_end_ = 0;
  int prefix_clusters_ = 0, suffix_clusters_ = 0, total_clusters_ = 0;
  std::vector<int> block_rows_;  // rows computed every decode step
  // Backend memory, bound to the sequence's forward by Bind.
  std::vector<LayerClusters> layers_;
  std::optional<DriftScratch> scratch_;       // the main queue's drift ops
  std::optional<DriftScratch> side_scratch_;  // ClusterLayer's (maybe on the side queue)
  Buffer window_;                             // [window, C] ClusterLayer's window rows
  Buffer window_labels_;                      // [window] i32 their clusters
  Buffer amax_;                               // [1] the NVFP4 store's amax
  Buffer old_rows_;                           // [moved, C] a packet's rows before it
  Buffer proxy_, proxy_logs_;                 // [K, H, L] a refresh layer's proxy, f64 logs
  Buffer attention_, attention_logs_;         // [B, H, L] last layer, block queries; f64 KL logs
  Buffer previous_attention_, previous_attention_logs_;  // the same, the step before
  bool has_previous_attention_ = false;
  bool has_previous_attention_logs_ = false;  // if a drift took them
  std::vector<double> token_drift_;           // [B]
  bool token_drift_valid_ = false;
  std::deque<std::vector<double>> drift_history_;
  std::vector<int> packet_rows_;  // the last layer's refreshed rows this step
  RefreshTrigger trigger_{options_.tau_upd};
  int block_commits_last_step_ = 0;
  std::unique_ptr<SideQueue> side_queue_;  // overlap's block-start work
  nlohmann::json stats_;
  std::string kind_;  // step_kind of the step planned last
};

const PolicyRegistration kPolestar({
    .name = "polestar",
    .description = "Polestar: drift-aware sparse refresh by clusters, drift-gated early commit",
    .options = {&DecodeOptions::tau_s,
                &DecodeOptions::early_floor,
                &DecodeOptions::alpha,
                &DecodeOptions::drift_cap,
                &DecodeOptions::drift_history,
                &DecodeOptions::clusters,
                &DecodeOptions::topk_clusters,
                &DecodeOptions::kmeans_iters,
                &DecodeOptions::window_prefix_blocks,
                &DecodeOptions::window_suffix_blocks,
                &DecodeOptions::full_refresh_period,
                &DecodeOptions::tau_upd,
                &DecodeOptions::polestar_cache,
                &DecodeOptions::early_commit,
                &DecodeOptions::suffix_commit,
                &DecodeOptions::drift_metric,
                &DecodeOptions::nvfp4_hidden,
                &DecodeOptions::offload_residuals,
                &DecodeOptions::overlap,
                &DecodeOptions::refresh_all},
    .rank = 30,
    .make = [](const DecodeOptions& options, const Model& model) -> std::unique_ptr<Policy> {
      return std::make_unique<PolestarPolicy>(options.Resolved(model.config()), model);
    },
    .guidance = false,
    .block_diffusion = "LLaDA 2.x's sampler with Polestar-Commit's drift-gated early commits",
    // Polestar-Commit commits at tau_s unless another rule is given.
    .resolve =
        [](DecodeOptions& options, const ModelConfig&) {
          if (!options.threshold && !options.factor) options.threshold = options.tau_s;
        },
    .validate =
        [](const DecodeOptions& options, const ModelConfig& config) {
          if (config.sampler == SamplerFamily::kDream && options.alg != DreamAlg::kUnset) {
            FailOption("polestar uses the threshold commit rule; ", OptionOf(&DecodeOptions::alg),
                       " does not apply");
          }
          if (options.offload_residuals && !options.nvfp4_hidden) {
            FailOption(OptionOf(&DecodeOptions::offload_residuals), " needs ",
                       OptionOf(&DecodeOptions::nvfp4_hidden), ": it places the NVFP4 store");
          }
          if (config.sampler != SamplerFamily::kLlada2) return;
          // Block diffusion leaves it Polestar-Commit alone.
          for (bool DecodeOptions::*option :
               {&DecodeOptions::nvfp4_hidden, &DecodeOptions::offload_residuals,
                &DecodeOptions::overlap}) {
            if (options.*option) {
              FailOption(OptionOf(option), " does not apply to ", ArchName(config.arch),
                         ": Polestar-Cache has no window to refresh under block diffusion");
            }
          }
        },
});

}  // namespace
}  // namespace polestar
