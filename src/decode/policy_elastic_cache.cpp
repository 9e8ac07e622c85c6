// Elastic-Cache (Nguyen-Tri, Ranjan, Shen: "Attention Is All You Need for KV Cache in
// Diffusion LLMs", arXiv 2510.14973): a sliding window of MASK rows, an attention-aware drift
// test on the most-attended tokens of every layer, and, when the test fires at layer l, a
// recompute of every position from layer l+1 to the last layer.
//
// Behaviour follows the authors' released code (VILA-Lab/Elastic-Cache, llada/generate.py and
// the attention of its modeling_llada.py); docs/policies.md lists each point and where we
// differ (blocks and the EOS stop, which belong to the shared driver here).
//
// 1. Window: the first --window masked positions (0: 16 LLaDA, 32 Dream), decoded positions
//    skipped. Commit candidates are the block's masks inside it.
// 2. Query rows of a step (F_0) after the first: the tracked tokens (the union over layers of
//    the last step's most-attended tokens), the positions committed since the last step (their
//    K/V still belong to MASK), and the rows that predict the window's masks (the masks
//    themselves; for Dream the row before each). The first step is a full pass; there is no
//    other scheduled full pass, and rows outside F_0, far MASK rows included, stay cached.
// 3. Most-attended tokens, every layer of every step: the attention of the window's
//    predicting rows summed over rows and heads; masked positions are not eligible; the top
//    --track-num, ties to the lower position.
// 4. Drift test at layer l (until one fires): for every tracked token u, its attention row now
//    (it is a query row) against its attention row before this step, i.e. the query of its
//    cached layer-l input over the keys as they stood before this step wrote any. For every
//    (u, key) pair the cosine is taken across heads; sigma is the mean over all pairs. It
//    fires when sigma < --gamma.
// 5. Refresh: a firing at layer l makes every position a query row of layers l+1 .. last; rows
//    outside the step's input read their layer-(l+1) input from the hidden-state cache. It is
//    part of the same forward (one NFE).
// 6. --refresh-all turns every step into a full pass (the standing "cached == vanilla" test);
//    the window still chooses the commit candidates.
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "decode/policy_registry.h"
#include "model/forward.h"

namespace polestar {
namespace {

class ElasticCachePolicy : public Policy, private LayerHook {
 public:
  ElasticCachePolicy(const DecodeOptions& options, const Model& model)
      : model_(model),
        gamma_(options.gamma),
        track_num_(options.track_num),
        refresh_all_(options.refresh_all),
        window_size_(options.window),  // resolved: never 0
        config_(model.config()),
        heads_(model.config().heads),
        tracks_(size_t(model.config().layers)) {}

  bool NeedsHiddenStates() const override { return true; }

  StepPlan Plan(const DecodeContext& context) override {
    forward_ = &context.forward;
    canvas_.assign(context.canvas.begin(), context.canvas.end());
    mask_id_ = context.mask_id;
    const int length = int(canvas_.size());
    window_.clear();
    for (int p = context.block.start; p < length && int(window_.size()) < window_size_; ++p) {
      if (canvas_[size_t(p)] == mask_id_) window_.push_back(p);
    }
    PS_CHECK(!window_.empty());  // the driver plans only blocks with masks
    predicting_rows_.clear();
    for (int p : window_) {
      if (config_.HasPredictingRow(p)) predicting_rows_.push_back(config_.PredictingRow(p));
    }

    const bool first = previous_canvas_.empty();
    full_ = first || refresh_all_;
    fired_layer_ = -1;
    similarity_.assign(tracks_.size(), std::nan(""));
    rows_per_layer_.assign(tracks_.size(), 0);
    tracked_.clear();
    for (const std::vector<int>& tokens : tracks_)
      tracked_.insert(tracked_.end(), tokens.begin(), tokens.end());
    std::sort(tracked_.begin(), tracked_.end());
    tracked_.erase(std::unique(tracked_.begin(), tracked_.end()), tracked_.end());

    StepPlan plan;
    if (full_) {
      plan.input_rows = Range(0, length);
    } else {
      std::vector<char> chosen(size_t(length), 0);  // [L]
      for (int p : tracked_) chosen[size_t(p)] = 1;
      for (int p : predicting_rows_) chosen[size_t(p)] = 1;
      for (int p = 0; p < length; ++p)
        chosen[size_t(p)] |= canvas_[size_t(p)] != previous_canvas_[size_t(p)];
      for (int p = 0; p < length; ++p) {
        if (chosen[size_t(p)]) plan.input_rows.push_back(p);
      }
      if (!tracked_.empty()) RecordAttentionBefore(context.forward);
    }
    input_rows_ = int(plan.input_rows.size());
    previous_canvas_ = canvas_;
    plan.capture_layers = Range(0, int(tracks_.size()));
    // OnAttention reads the tracked tokens' and the predicting rows' attention.
    std::set_union(tracked_.begin(), tracked_.end(), predicting_rows_.begin(),
                   predicting_rows_.end(), std::back_inserter(plan.attention_rows));
    plan.hook = this;
    return plan;
  }

  std::vector<int> CommitCandidates(const DecodeContext&, std::vector<int> masked) override {
    std::erase_if(masked,
                  [&](int p) { return !std::binary_search(window_.begin(), window_.end(), p); });
    return masked;
  }

  std::string StepKind() const override {
    if (full_) return step_kind::kFullPass;
    if (fired_layer_ >= 0) return step_kind::RefreshFromLayer(fired_layer_, int(tracks_.size()));
    return step_kind::kElasticStep;
  }

  nlohmann::json StepStats() const override {
    nlohmann::json similarity = nlohmann::json::array();
    for (double s : similarity_)
      similarity.push_back(std::isnan(s) ? nlohmann::json(nullptr) : nlohmann::json(s));
    return {{"refresh", full_               ? "full"
                        : fired_layer_ >= 0 ? "from_layer"
                                            : "none"},
            {"fired_layer", fired_layer_},
            {"window", window_},
            {"tracked", tracked_},
            {"input_rows", input_rows_},
            {"rows_per_layer", rows_per_layer_},
            {"similarity", similarity}};
  }

 private:
  // before_[l][|tracked|, H, L]: each tracked token's attention at layer l as the cache stands
  // before this step: the query of its cached layer input (the input its last query came
  // from) over the keys no row of this step has rewritten yet.
  void RecordAttentionBefore(const Forward& forward) {
    before_.resize(tracks_.size());
    for (int layer = 0; layer < int(tracks_.size()); ++layer)
      forward.CachedRowsAttention(layer, tracked_, before_[size_t(layer)]);
  }

  void BeforeQueries(LayerRows& rows) override {
    if (!full_ && fired_layer_ >= 0 && rows.layer > fired_layer_)
      *rows.query_rows = Range(0, int(canvas_.size()));
    rows_per_layer_[size_t(rows.layer)] = int64_t(rows.query_rows->size());
  }

  // probs: [|Q|, H * L].
  void OnAttention(int layer, std::span<const int> query_rows, const RowsView& probs) override {
    const int64_t length = int64_t(canvas_.size());
    row_of_.assign(size_t(length), -1);  // position -> index in query_rows
    for (size_t i = 0; i < query_rows.size(); ++i) row_of_[size_t(query_rows[i])] = int64_t(i);

    if (!full_ && fired_layer_ < 0 && !tracked_.empty()) {
      tracked_rows_.clear();  // [|tracked|] index of each tracked token in query_rows
      for (int p : tracked_) {
        PS_CHECK(row_of_[size_t(p)] >= 0);  // tracked rows are query rows
        tracked_rows_.push_back(int(row_of_[size_t(p)]));
      }
      const double sigma =
          forward_->MeanCrossHeadCosine(probs, tracked_rows_, before_[size_t(layer)]);
      similarity_[size_t(layer)] = sigma;
      if (sigma < gamma_) fired_layer_ = layer;
    }

    // The next step's tracked tokens of this layer: where the window's masks look most.
    predicting_.clear();  // [|predicting|] their index in query_rows
    for (int p : predicting_rows_) {
      PS_CHECK(row_of_[size_t(p)] >= 0);  // predicting rows are query rows
      predicting_.push_back(int(row_of_[size_t(p)]));
    }
    eligible_.clear();  // the positions that are no masks
    for (int j = 0; j < int(length); ++j) {
      if (canvas_[size_t(j)] != mask_id_) eligible_.push_back(j);
    }
    std::vector<int>& track = tracks_[size_t(layer)];
    track.resize(std::min(eligible_.size(), size_t(track_num_)));
    forward_->MostAttendedKeys(probs, predicting_, eligible_, track);
  }

  const Model& model_;
  const double gamma_;
  const int track_num_;
  const bool refresh_all_;
  const int window_size_;
  const ModelConfig& config_;
  const int heads_;
  std::vector<std::vector<int>> tracks_;  // [layers][<= track_num] most-attended tokens
  std::vector<int> previous_canvas_;      // [L] the canvas at the previous step's plan

  // This step.
  std::vector<int> canvas_;  // [L]
  int mask_id_ = 0;
  std::vector<int> window_;           // the first window_size_ masked positions, ascending
  std::vector<int> predicting_rows_;  // [|window|] the rows whose logits predict them
  std::vector<int> tracked_;          // union of tracks_ at the plan, ascending
  std::vector<Buffer> before_;        // [layers][|tracked|, H, L] (CachedRowsAttention's)
  std::vector<int64_t> row_of_;       // [L] index of a position in the layer's query rows
  std::vector<int> tracked_rows_;     // [|tracked|] their index in the layer's query rows
  std::vector<int> predicting_;       // [|predicting|] their index in the layer's query rows
  std::vector<int> eligible_;         // the positions that may be tracked: no masks, ascending
  const Forward* forward_ = nullptr;  // the step's model (drift ops)
  bool full_ = false;
  int fired_layer_ = -1;
  int input_rows_ = 0;
  std::vector<double> similarity_;       // [layers] sigma, NaN where not tested
  std::vector<int64_t> rows_per_layer_;  // [layers] |Q_l|
};

const PolicyRegistration kElasticCache({
    .name = "elastic-cache",
    .description = "Elastic-Cache: a sliding window of masks, layers refreshed on attention drift",
    .options = {&DecodeOptions::track_num, &DecodeOptions::gamma, &DecodeOptions::window,
                &DecodeOptions::refresh_all},
    .rank = 20,
    .make = [](const DecodeOptions& options, const Model& model) -> std::unique_ptr<Policy> {
      return std::make_unique<ElasticCachePolicy>(options.Resolved(model.config()), model);
    },
    .guidance = false,
    .paper_threshold = 0.9,
    // Its window by sampler family, as its reference code sets it per model.
    .option_defaults =
        [](DecodeOptions& options, const ModelConfig& config) {
          if (options.window == 0)
            options.window = config.sampler == SamplerFamily::kDream ? 32 : 16;
        },
});

}  // namespace
}  // namespace polestar
