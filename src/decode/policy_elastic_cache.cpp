// Elastic-Cache (Nguyen-Tri, Ranjan, Shen: "Attention Is All You Need for KV Cache in
// Diffusion LLMs", arXiv 2510.14973): a sliding window of query rows, an attention-aware
// drift test on the most-attended token(s) of every layer, and, when the test fires at layer
// l, a recompute of every position from layer l+1 to the last layer.
//
// The authors' code is not reachable here; where the paper leaves a choice, this file makes
// it as follows (docs/policies.md repeats the list):
//
// 1. Window. Positions [s, s + window) clipped to the canvas, where s is the first masked
//    position (earlier blocks are complete, so s >= block.start). --window 0 means 16 for
//    LLaDA and 32 for Dream. The window slides with s, decoded positions inside it included,
//    so it replaces Fast-dLLM's fixed block as the set of recomputed rows.
// 2. Query rows of a step (F_0): the window, every position whose token changed since the
//    previous step (commits the window has already slid past: their K/V still belong to the
//    MASK token), and for Dream the row s-1 that predicts s.
// 3. Commit candidates: the driver's block masks inside the window (Policy::CommitCandidates).
//    With block_length <= window the block decides what may commit and the rest of the
//    window keeps the next MASK rows fresh; with one block over the canvas (block_length 0)
//    the window alone decides, the paper's setting.
// 4. Caching. The first step is a full pass (the prefill). There is no periodic full pass and
//    none at block starts. Rows outside the window, far MASK rows included, keep the K/V and
//    hidden states of the last pass that computed them ("block-cached").
// 5. Most-attended tokens T^l (--track-num): after each step's attention at layer l, the
//    positions with the largest attention mass summed over the layer's query rows and heads,
//    among positions that hold a token (prompt or decoded; MASK rows are a length bias, not
//    context). Chosen afresh every step; ties go to the lower position.
// 6. Drift test at layer l of step t: for every query row that is MASK now and was a query
//    row of layer l at step t-1 (so the query side is unchanged: a MASK embedding), and every
//    token of T^l chosen at t-1, the attention probability averaged over heads; sigma is the
//    cosine between this vector at t-1 and at t. The test fires when sigma < gamma (strict).
//    No common rows means no evidence: sigma = 1. The lowest firing layer counts; layers above
//    it skip the test but still record attention for the next step.
// 7. Refresh. A firing at layer l makes every position a query row of layers l+1 .. last.
//    Rows outside the step's input get their layer-(l+1) input from the hidden-state cache, so
//    layers >= l+2 receive fresh K/V and hidden states for every position, and layer l+1's
//    queries all see the step's new K/V. It happens inside the same forward (one NFE).
// 8. --refresh-all turns every step into a full pass (the standing "cached == vanilla" test);
//    the window still chooses the commit candidates.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/error.h"
#include "decode/elastic_cache.h"
#include "decode/policy.h"

namespace polestar {

double CosineSimilarity(std::span<const double> a, std::span<const double> b) {
  PS_CHECK(a.size() == b.size());
  double dot = 0, norm_a = 0, norm_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    norm_a += a[i] * a[i];
    norm_b += b[i] * b[i];
  }
  if (norm_a == 0 && norm_b == 0) return 1;
  if (norm_a == 0 || norm_b == 0) return 0;
  return std::clamp(dot / std::sqrt(norm_a * norm_b), -1.0, 1.0);
}

namespace {

class ElasticCachePolicy : public Policy, private LayerHook {
 public:
  ElasticCachePolicy(const DecodeOptions& options, const Model& model)
      : gamma_(options.gamma),
        track_num_(options.track_num),
        refresh_all_(options.refresh_all),
        window_(options.window > 0 ? options.window
                                   : (model.config().arch == Arch::kDream ? 32 : 16)),
        shifted_(model.config().shift_logits),
        heads_(model.config().heads),
        tracks_(size_t(model.config().layers)) {}

  bool NeedsHiddenStates() const override { return true; }

  StepPlan Plan(const DecodeContext& context) override {
    canvas_.assign(context.canvas.begin(), context.canvas.end());
    mask_id_ = context.mask_id;
    const int length = int(canvas_.size());
    int s = context.block.start;
    while (s < length && canvas_[size_t(s)] != mask_id_) ++s;
    PS_CHECK(s < context.block.end);  // the driver plans only blocks with masks
    window_begin_ = s;
    window_end_ = std::min(s + window_, length);

    const bool first = previous_canvas_.empty();
    full_ = first || refresh_all_;
    fired_layer_ = -1;
    similarity_.assign(tracks_.size(), std::nan(""));
    rows_per_layer_.assign(tracks_.size(), 0);

    StepPlan plan;
    if (full_) {
      plan.input_rows = Range(0, length);
    } else {
      std::vector<char> chosen(size_t(length), 0);  // [L]
      for (int p = window_begin_; p < window_end_; ++p) chosen[size_t(p)] = 1;
      for (int p = 0; p < length; ++p)
        chosen[size_t(p)] |= canvas_[size_t(p)] != previous_canvas_[size_t(p)];
      if (shifted_ && s > 0) chosen[size_t(s - 1)] = 1;
      for (int p = 0; p < length; ++p) {
        if (chosen[size_t(p)]) plan.input_rows.push_back(p);
      }
    }
    input_rows_ = int(plan.input_rows.size());
    previous_canvas_ = canvas_;
    plan.capture_layers = Range(0, int(tracks_.size()));
    plan.hook = this;
    return plan;
  }

  std::vector<int> CommitCandidates(const DecodeContext&, std::vector<int> masked) override {
    std::erase_if(masked, [&](int p) { return p < window_begin_ || p >= window_end_; });
    return masked;
  }

  nlohmann::json StepStats() const override {
    nlohmann::json similarity = nlohmann::json::array();
    for (double s : similarity_)
      similarity.push_back(std::isnan(s) ? nlohmann::json(nullptr) : nlohmann::json(s));
    return {{"refresh", full_               ? "full"
                        : fired_layer_ >= 0 ? "from_layer"
                                            : "none"},
            {"fired_layer", fired_layer_},
            {"window", {window_begin_, window_end_}},
            {"input_rows", input_rows_},
            {"rows_per_layer", rows_per_layer_},
            {"similarity", similarity}};
  }

 private:
  // What layer l remembers from the previous step: the tracked tokens and, per query row, the
  // head-averaged attention the row paid to each of them.
  struct LayerTrack {
    std::vector<int> tokens;
    std::unordered_map<int, std::vector<double>> attention;  // row -> [|tokens|]
  };

  void BeforeQueries(LayerRows& rows) override {
    if (!full_ && fired_layer_ >= 0 && rows.layer > fired_layer_) {
      *rows.query_rows = Range(0, int(canvas_.size()));
    }
    rows_per_layer_[size_t(rows.layer)] = int64_t(rows.query_rows->size());
  }

  // probs: [|Q|, H, L].
  void OnAttention(int layer, std::span<const int> query_rows, const float* probs) override {
    const int64_t length = int64_t(canvas_.size());
    auto head_mean = [&](size_t row_index, int position) {
      double sum = 0;
      for (int h = 0; h < heads_; ++h)
        sum += probs[(int64_t(row_index) * heads_ + h) * length + position];
      return sum / heads_;
    };
    LayerTrack& track = tracks_[size_t(layer)];

    if (!full_ && fired_layer_ < 0 && !track.tokens.empty()) {
      std::vector<double> before, now;
      for (size_t i = 0; i < query_rows.size(); ++i) {
        const int row = query_rows[i];
        if (canvas_[size_t(row)] != mask_id_) continue;
        const auto it = track.attention.find(row);
        if (it == track.attention.end()) continue;
        for (size_t k = 0; k < track.tokens.size(); ++k) {
          before.push_back(it->second[k]);
          now.push_back(head_mean(i, track.tokens[k]));
        }
      }
      const double sigma = before.empty() ? 1.0 : CosineSimilarity(before, now);
      similarity_[size_t(layer)] = sigma;
      if (sigma < gamma_) fired_layer_ = layer;
    }

    // Re-choose the most-attended tokens from this step's attention mass.
    std::vector<double> mass(size_t(length), 0);  // [L]
    for (size_t i = 0; i < query_rows.size(); ++i) {
      for (int h = 0; h < heads_; ++h) {
        const float* row = probs + (int64_t(i) * heads_ + h) * length;
        for (int64_t j = 0; j < length; ++j) mass[size_t(j)] += row[j];
      }
    }
    std::vector<int> eligible;
    for (int j = 0; j < int(length); ++j) {
      if (canvas_[size_t(j)] != mask_id_) eligible.push_back(j);
    }
    const size_t keep = std::min(eligible.size(), size_t(track_num_));
    std::partial_sort(eligible.begin(), eligible.begin() + keep, eligible.end(), [&](int a, int b) {
      return mass[size_t(a)] != mass[size_t(b)] ? mass[size_t(a)] > mass[size_t(b)] : a < b;
    });
    track.tokens.assign(eligible.begin(), eligible.begin() + keep);
    track.attention.clear();
    for (size_t i = 0; i < query_rows.size(); ++i) {
      std::vector<double>& paid = track.attention[query_rows[i]];
      for (int token : track.tokens) paid.push_back(head_mean(i, token));
    }
  }

  const double gamma_;
  const int track_num_;
  const bool refresh_all_;
  const int window_;
  const bool shifted_;
  const int heads_;
  std::vector<LayerTrack> tracks_;    // [layers]
  std::vector<int> previous_canvas_;  // [L] the canvas at the previous step's plan

  // This step.
  std::vector<int> canvas_;  // [L]
  int mask_id_ = 0;
  int window_begin_ = 0, window_end_ = 0;
  bool full_ = false;
  int fired_layer_ = -1;
  int input_rows_ = 0;
  std::vector<double> similarity_;       // [layers] sigma, NaN where not tested
  std::vector<int64_t> rows_per_layer_;  // [layers] |Q_l|
};

}  // namespace

std::unique_ptr<Policy> MakeElasticCachePolicy(const DecodeOptions& options, const Model& model) {
  return std::make_unique<ElasticCachePolicy>(options, model);
}

}  // namespace polestar
