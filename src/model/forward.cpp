#include "model/forward.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "base/error.h"

namespace polestar {

KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden) {
  return MakeCache(model, positions, keep_hidden, model.backend());
}

KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden, const Backend& backend) {
  const ModelConfig& c = model.config();
  return KvCache(backend, c.layers, positions, int64_t(c.kv_heads) * c.head_dim, c.width,
                 keep_hidden);
}

Forward::Forward(const Model& model, KvCache& cache)
    : model_(model),
      cache_(cache),
      backend_(cache.backend()),
      weights_(model.On(backend_)),
      runner_(backend_),
      cached_inputs_(backend_, 0),
      cached_normed_(backend_, 0),
      cached_queries_(backend_, 0),
      key_mass_(backend_, 0, ElementType::kF64),
      every_position_(size_t(cache.positions())) {
  std::iota(every_position_.begin(), every_position_.end(), 0);
}

void Forward::Upload(const void* host, int64_t bytes, void* dst) const {
  backend_.Upload(host, bytes, dst);
  to_backend_ += bytes;
}

void Forward::Download(const void* src, int64_t bytes, void* host) const {
  backend_.Download(src, bytes, host);
  to_host_ += bytes;
}

void RowsView::Download(float* out) const { forward_.Download(rows_, count_ * width_ * 4, out); }

StepResult Forward::Run(std::span<const int> canvas, const StepPlan& plan) {
  const SequenceStep step{this, canvas, &plan};
  return std::move(runner_.Run({&step, 1})[0]);
}

StepRunner::StepRunner(const Backend& backend)
    : backend_(backend),
      x_(backend, 0),
      x_next_(backend, 0),
      normed_(backend, 0),
      q_(backend, 0),
      k_(backend, 0),
      v_(backend, 0),
      attn_(backend, 0),
      proj_(backend, 0),
      gate_(backend, 0),
      up_(backend, 0),
      probs_(backend, 0),
      loaded_(backend, 0),
      final_(backend, 0),
      logits_(backend, 0),
      run_probs_(backend, 0),
      router_(backend, 0),
      expert_in_(backend, 0),
      expert_out_(backend, 0),
      chosen_(backend, 0, ElementType::kI32),
      route_weights_(backend, 0),
      expert_rows_(backend, 0, ElementType::kI32),
      expert_weights_(backend, 0),
      expert_counts_(backend, 0, ElementType::kI32),
      expert_slots_(backend, 0, ElementType::kI32) {}

namespace {

// Per sequence of a batched step: its rows at the current layer and where they sit in the
// concatenated buffers.
struct SequenceRows {
  std::vector<int> fresh;                      // F_l
  std::vector<int> query;                      // Q_l
  int64_t fresh_offset = 0, query_offset = 0;  // first row in the concatenation
  const HiddenSource* hidden_source = nullptr;
};

// Whether the plan's hook reads the attention probabilities of `layer`.
bool Captures(const StepPlan& plan, int layer) {
  return std::ranges::find(plan.capture_layers, layer) != plan.capture_layers.end();
}

// The plan's hook where it sees or chooses rows at `layer`, else null.
LayerHook* HookAt(const StepPlan& plan, int layer) {
  if (plan.hook == nullptr || !plan.hook_layers) return plan.hook;
  return std::ranges::find(*plan.hook_layers, layer) != plan.hook_layers->end() ? plan.hook
                                                                                : nullptr;
}

// Fills out[|Q|, C] with the inputs of s.query: fresh rows from x[|F|, C], the others from
// the hook's hidden source or else the cache's hidden-state rows.
void GatherSequenceQueryInputs(const Backend& backend, KvCache& cache, int layer,
                               const SequenceRows& s, const float* x, float* out, Buffer& loaded) {
  const int64_t C = cache.hidden_width();
  std::unordered_map<int, int> fresh_index;
  for (size_t i = 0; i < s.fresh.size(); ++i) fresh_index[s.fresh[i]] = int(i);
  std::vector<int> fresh_from, fresh_at;  // index in x, index in Q
  std::vector<int> cached_rows;           // positions read from the hidden-state store
  std::vector<int> cached_at;             // their index in Q
  for (int i = 0; i < int(s.query.size()); ++i) {
    auto it = fresh_index.find(s.query[size_t(i)]);
    if (it != fresh_index.end()) {
      fresh_from.push_back(it->second);
      fresh_at.push_back(i);
    } else {
      cached_rows.push_back(s.query[size_t(i)]);
      cached_at.push_back(i);
    }
  }
  if (!fresh_from.empty()) backend.CopyRows(x, fresh_from, out, fresh_at, C);
  if (cached_rows.empty()) return;
  if (s.hidden_source != nullptr) {
    loaded.Reserve(int64_t(cached_rows.size()) * C);  // [rows, C]
    s.hidden_source->Read(layer, cached_rows, loaded.data());
    backend.CopyRows(loaded.data(), {}, out, cached_at, C);
  } else {
    PS_CHECK(cache.keeps_hidden());
    backend.CopyRows(cache.hidden(layer), cached_rows, out, cached_at, C);
  }
}

// At the last layer, drops the query rows whose outputs nothing reads: only the logit rows
// go on to the LM head, and a captured layer's hook reads the attention of plan.attention_rows
// (or of every query row when that list is empty). Their K/V, written before, stay in the cache.
void KeepRowsRead(const StepPlan& plan, int layer, std::span<const int> logit_rows, int64_t length,
                  std::vector<int>& query) {
  const bool captured = Captures(plan, layer);
  if (captured && plan.attention_rows.empty()) return;
  std::vector<char> read(size_t(length), 0);  // [L]
  auto mark = [&](int row) {
    PS_CHECK(row >= 0 && row < length);
    read[size_t(row)] = 1;
  };
  for (const int row : logit_rows) mark(row);
  if (captured) {
    for (const int row : plan.attention_rows) mark(row);
  }
  std::erase_if(query, [&](int row) { return !read[size_t(row)]; });
}

}  // namespace

// What the stages of one step share: the sequences, each one's rows at the layer at hand
// (placed in the concatenated scratch), the rows' split into sequences for the op at hand,
// and the results being filled.
struct StepRunner::Step {
  explicit Step(std::span<const SequenceStep> steps)
      : sequences(steps),
        model(steps[0].forward->model_),
        weights(steps[0].forward->weights_),
        config(model.config()),
        q_width(int64_t(config.heads) * config.head_dim),
        kv_width(int64_t(config.kv_heads) * config.head_dim),
        rows(steps.size()),
        results(steps.size()) {}

  // segments[i] = |sequence i's `of` rows| (fresh or query); returns their sum.
  int64_t Split(std::vector<int> SequenceRows::*of) {
    segments.clear();
    int64_t total = 0;
    for (const SequenceRows& s : rows) {
      segments.push_back(int64_t((s.*of).size()));
      total += segments.back();
    }
    return total;
  }

  // F_{l+1} = Q_l, whose outputs x_ holds.
  void QueryRowsBecomeFresh() {
    for (SequenceRows& s : rows) {
      s.fresh = std::move(s.query);
      s.fresh_offset = s.query_offset;
    }
  }

  std::span<const SequenceStep> sequences;
  const Model& model;
  const ResidentWeights& weights;  // the model on the runner's backend
  const ModelConfig& config;
  const int64_t q_width, kv_width;  // H*D, Hkv*D
  std::vector<SequenceRows> rows;   // [n] each sequence's F_l and Q_l
  std::vector<int64_t> segments;    // [n] rows per sequence of the op at hand
  int64_t queries = 0;              // M = sum |Q_l|
  bool queries_are_fresh = true;    // Q_l = F_l in every sequence
  bool inputs_swapped = false;      // x_ and x_next_ traded places (GatherQueryInputs)
  std::vector<StepResult> results;  // [n]
};

std::vector<StepResult> StepRunner::Run(std::span<const SequenceStep> steps) {
  PS_CHECK(!steps.empty());
  Step step(steps);
  EmbedFreshRows(step);
  for (int layer = 0; layer < step.config.layers; ++layer) {
    if (const int end = QuietLayersEnd(step, layer); end > layer) {
      RunQuietLayers(step, layer, end);
      layer = end - 1;
      continue;
    }
    WriteFreshKeysValues(step, layer, false);
    ChooseQueryRows(step, layer);
    // When Q_l = F_l, normed_ still holds rmsnorm(x_) of exactly these rows from the K/V pass.
    if (step.queries_are_fresh) {
      ComputeQueries(step, layer);
    } else {
      GatherQueryInputs(step, layer);
    }
    PositionQueries(step, layer);
    AttendEachSequence(step, layer);
    AddAttentionOutput(step, layer);
    FeedForward(step, layer);
    step.QueryRowsBecomeFresh();
  }
  ComputeLogits(step);
  // Every step starts from the same buffers, so the next one's quiet layers name the memory
  // this one's did (QuietLayersKey).
  if (step.inputs_swapped) std::swap(x_, x_next_);
  return std::move(step.results);
}

void StepRunner::EmbedFreshRows(Step& step) {
  const ModelConfig& c = step.config;
  int64_t total_fresh = 0;
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const SequenceStep& sequence = step.sequences[i];
    PS_CHECK(&sequence.forward->model_ == &step.model && &sequence.forward->backend_ == &backend_);
    PS_CHECK(int64_t(sequence.canvas.size()) == sequence.forward->cache_.positions());
    for (const int row : sequence.plan->input_rows) {
      PS_CHECK(row >= 0 && size_t(row) < sequence.canvas.size());
      PS_CHECK(sequence.canvas[size_t(row)] >= 0 && sequence.canvas[size_t(row)] < c.vocab);
    }
    step.results[i].logit_rows = sequence.plan->logit_rows;
    step.rows[i].fresh = sequence.plan->input_rows;
    step.rows[i].fresh_offset = total_fresh;
    total_fresh += int64_t(step.rows[i].fresh.size());
  }
  x_.Reserve(total_fresh * c.width);  // [sum |F|, C] layer inputs of the fresh rows
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    backend_.Embed(step.weights.embedding, step.sequences[i].canvas, step.rows[i].fresh,
                   x_.data() + step.rows[i].fresh_offset * c.width);
  }
}

void StepRunner::WriteFreshKeysValues(Step& step, int layer, bool queries_too) {
  const ModelConfig& c = step.config;
  const LayerWeights& w = step.weights.layers[size_t(layer)];
  const int64_t C = c.width, kv_width = step.kv_width;
  const int64_t m_fresh = step.Split(&SequenceRows::fresh);
  normed_.Reserve(m_fresh * C);    // [sum |F|, C]
  k_.Reserve(m_fresh * kv_width);  // [sum |F|, Hkv*D]
  v_.Reserve(m_fresh * kv_width);  // [sum |F|, Hkv*D]
  NormedProduct products[3] = {
      {.w = w.wk, .y = k_.data(), .bias = w.bk.empty() ? nullptr : w.bk.data()},
      {.w = w.wv, .y = v_.data(), .bias = w.bv.empty() ? nullptr : w.bv.data()}};
  if (queries_too) products[2] = QueryProduct(step, layer, m_fresh);
  backend_.RmsNormProducts(x_.data(), step.segments, C, w.attn_norm.data(), c.rms_eps,
                           normed_.data(), std::span(products, queries_too ? 3 : 2));
  if (c.qk_norm) {
    backend_.RmsNorm(k_.data(), m_fresh * c.kv_heads, c.head_dim, w.k_norm.data(), c.rms_eps,
                     k_.data());
  }
  if (c.clip_qkv > 0) {
    backend_.Clamp(k_.data(), m_fresh * kv_width, c.clip_qkv);
    backend_.Clamp(v_.data(), m_fresh * kv_width, c.clip_qkv);
  }
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const SequenceRows& s = step.rows[i];
    KvCache& cache = step.sequences[i].forward->cache_;
    float* k = k_.data() + s.fresh_offset * kv_width;
    const float* x = x_.data() + s.fresh_offset * C;
    backend_.ApplyRope(k, s.fresh, c.kv_heads, step.weights.rope, c.rope_interleaved);
    if (LayerHook* hook = HookAt(*step.sequences[i].plan, layer)) {
      hook->BeforeFreshRowsStored(
          layer, s.fresh, RowsView(*step.sequences[i].forward, x, int64_t(s.fresh.size()), C));
    }
    if (s.fresh.empty()) continue;
    backend_.CopyRows(k, {}, cache.keys(layer), s.fresh, kv_width);
    backend_.CopyRows(v_.data() + s.fresh_offset * kv_width, {}, cache.values(layer), s.fresh,
                      kv_width);
    if (cache.keeps_hidden()) backend_.CopyRows(x, {}, cache.hidden(layer), s.fresh, C);
  }
}

void StepRunner::ChooseQueryRows(Step& step, int layer) {
  step.queries = 0;
  step.queries_are_fresh = true;
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    SequenceRows& s = step.rows[i];
    const SequenceStep& sequence = step.sequences[i];
    StepResult& result = step.results[i];
    s.query = s.fresh;
    s.hidden_source = nullptr;
    if (LayerHook* hook = HookAt(*sequence.plan, layer)) {
      LayerRows layer_rows{layer, s.fresh, &s.query, &result.logit_rows};
      hook->BeforeQueries(layer_rows);
      s.hidden_source = layer_rows.hidden_source;
    }
    if (layer == step.config.layers - 1) {
      KeepRowsRead(*sequence.plan, layer, result.logit_rows, sequence.forward->cache_.positions(),
                   s.query);
    }
    s.query_offset = step.queries;
    step.queries += int64_t(s.query.size());
    result.kv_rows_written += int64_t(s.fresh.size());
    result.rows_computed += int64_t(s.query.size());
    step.queries_are_fresh = step.queries_are_fresh && s.query == s.fresh;
  }
  step.Split(&SequenceRows::query);
}

int StepRunner::QuietLayersEnd(const Step& step, int first) {
  const ModelConfig& c = step.config;
  int end = first;
  for (; end < c.layers; ++end) {
    for (size_t i = 0; i < step.sequences.size(); ++i) {
      const StepPlan& plan = *step.sequences[i].plan;
      if (HookAt(plan, end) != nullptr || Captures(plan, end)) return end;
      if (end == c.layers - 1) {  // quiet only where the last layer keeps every fresh row
        std::vector<int> kept = step.rows[i].fresh;
        KeepRowsRead(plan, end, step.results[i].logit_rows,
                     step.sequences[i].forward->cache_.positions(), kept);
        if (kept.size() != step.rows[i].fresh.size()) return end;
      }
    }
  }
  return end;
}

void StepRunner::RunQuietLayers(Step& step, int first, int end) {
  const ModelConfig& c = step.config;
  const int64_t layers = end - first;
  // ChooseQueryRows' outcome at every quiet layer: Q_l = F_l.
  step.queries = 0;
  step.queries_are_fresh = true;
  for (size_t i = 0; i < step.rows.size(); ++i) {
    SequenceRows& s = step.rows[i];
    s.query = s.fresh;
    s.query_offset = step.queries;
    s.hidden_source = nullptr;
    step.queries += int64_t(s.query.size());
    step.results[i].kv_rows_written += layers * int64_t(s.fresh.size());
    step.results[i].rows_computed += layers * int64_t(s.query.size());
  }
  step.Split(&SequenceRows::query);
  auto issue = [&] {
    for (int layer = first; layer < end; ++layer) {
      WriteFreshKeysValues(step, layer, true);
      PositionQueries(step, layer);
      AttendEachSequence(step, layer);
      AddAttentionOutput(step, layer);
      FeedForward(step, layer);
    }
  };
  if (!backend_records_ || !records_ || counts_experts_) {
    issue();
    return;
  }
  // The stages' scratch at its size for these rows first, so the key holds the memory they
  // will use (the stages' own Reserve calls then keep it).
  const int64_t m = step.queries;
  const int64_t routed = m * c.moe.experts_per_token;  // a mixture's rows, one per choice
  int64_t inner = 0;  // the rows times F of gate_ and up_ at the widest layer
  bool mixture = false;
  for (int layer = first; layer < end; ++layer) {
    const LayerWeights& w = step.weights.layers[size_t(layer)];
    if (c.IsMoeLayer(layer)) {
      mixture = true;
      inner = std::max({inner, routed * w.experts[0].gate.rows, m * w.shared.gate.rows});
    } else {
      inner = std::max(inner, m * w.mlp.gate.rows);
    }
  }
  for (Buffer* rows_of_width : {&normed_, &proj_}) rows_of_width->Reserve(m * c.width);
  for (Buffer* kv_rows : {&k_, &v_}) kv_rows->Reserve(m * step.kv_width);
  for (Buffer* query_rows : {&q_, &attn_}) query_rows->Reserve(m * step.q_width);
  for (Buffer* inner_rows : {&gate_, &up_}) inner_rows->Reserve(inner);
  if (mixture) {
    router_.Reserve(m * c.moe.experts);
    for (Buffer* choices :
         {&chosen_, &route_weights_, &expert_rows_, &expert_weights_, &expert_slots_}) {
      choices->Reserve(routed);
    }
    expert_counts_.Reserve(int64_t(step.sequences.size()) * c.moe.experts);
    for (Buffer* routed_rows : {&expert_in_, &expert_out_}) routed_rows->Reserve(routed * c.width);
  }
  std::vector<int64_t> key = QuietLayersKey(step, first, end);

  if (const auto it = std::ranges::find(recordings_, key, &Recording::key);
      it != recordings_.end()) {
    if (backend_.Replay(*it->graph)) {
      std::rotate(recordings_.begin(), it, it + 1);
      for (StepResult& result : step.results) result.layers_replayed += layers;
      return;
    }
    recordings_.erase(it);  // its ops used scratch the backend has since replaced
  }
  const auto seen = std::ranges::find(unrecorded_keys_, key);
  if (seen == unrecorded_keys_.end()) {
    if (unrecorded_keys_.size() == kRecordings) unrecorded_keys_.pop_back();
    unrecorded_keys_.insert(unrecorded_keys_.begin(), std::move(key));
    issue();
    return;
  }
  unrecorded_keys_.erase(seen);
  std::unique_ptr<OpGraph> graph = backend_.Record(issue);
  if (graph == nullptr) {
    backend_records_ = false;
    return;
  }
  if (recordings_.size() == kRecordings) recordings_.pop_back();
  recordings_.insert(recordings_.begin(), {std::move(key), std::move(graph)});
}

std::vector<int64_t> StepRunner::QuietLayersKey(const Step& step, int first, int end) const {
  auto address = [](const void* p) { return int64_t(reinterpret_cast<intptr_t>(p)); };
  std::vector<int64_t> key = {first, end, address(&step.weights)};
  for (const Buffer* scratch :
       {&x_, &normed_, &q_, &k_, &v_, &attn_, &proj_, &gate_, &up_, &router_, &chosen_,
        &route_weights_, &expert_rows_, &expert_weights_, &expert_counts_, &expert_slots_,
        &expert_in_, &expert_out_}) {
    key.push_back(address(scratch->data()));
  }
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const KvCache& cache = step.sequences[i].forward->cache_;
    const std::vector<int>& fresh = step.rows[i].fresh;
    key.push_back(step.sequences[i].plan->attention_block);
    key.push_back(cache.positions());
    for (int layer = first; layer < end; ++layer) {
      key.push_back(address(cache.keys(layer)));
      key.push_back(address(cache.values(layer)));
      key.push_back(cache.keeps_hidden() ? address(cache.hidden(layer)) : 0);
    }
    key.push_back(int64_t(fresh.size()));
    key.insert(key.end(), fresh.begin(), fresh.end());
  }
  return key;
}

void StepRunner::GatherQueryInputs(Step& step, int layer) {
  const int64_t C = step.config.width, m = step.queries;
  x_next_.Reserve(m * C);  // [sum |Q|, C]
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const SequenceRows& s = step.rows[i];
    GatherSequenceQueryInputs(backend_, step.sequences[i].forward->cache_, layer, s,
                              x_.data() + s.fresh_offset * C, x_next_.data() + s.query_offset * C,
                              loaded_);
  }
  std::swap(x_, x_next_);  // x_: [sum |Q|, C]
  step.inputs_swapped = !step.inputs_swapped;
  normed_.Reserve(m * C);
  const NormedProduct queries[] = {QueryProduct(step, layer, m)};
  backend_.RmsNormProducts(x_.data(), step.segments, C,
                           step.weights.layers[size_t(layer)].attn_norm.data(), step.config.rms_eps,
                           normed_.data(), queries);
}

NormedProduct StepRunner::QueryProduct(const Step& step, int layer, int64_t rows) {
  const LayerWeights& w = step.weights.layers[size_t(layer)];
  q_.Reserve(rows * step.q_width);  // [sum |Q|, H*D]
  return {.w = w.wq, .y = q_.data(), .bias = w.bq.empty() ? nullptr : w.bq.data()};
}

void StepRunner::ComputeQueries(const Step& step, int layer) {
  const NormedProduct queries = QueryProduct(step, layer, step.queries);
  backend_.MatMulBatch(normed_.data(), step.segments, queries.w, queries.y, queries.bias);
}

void StepRunner::PositionQueries(const Step& step, int layer) {
  const ModelConfig& c = step.config;
  const LayerWeights& w = step.weights.layers[size_t(layer)];
  const int64_t m = step.queries;
  if (c.qk_norm) {
    backend_.RmsNorm(q_.data(), m * c.heads, c.head_dim, w.q_norm.data(), c.rms_eps, q_.data());
  }
  if (c.clip_qkv > 0) backend_.Clamp(q_.data(), m * step.q_width, c.clip_qkv);
  for (const SequenceRows& s : step.rows) {
    backend_.ApplyRope(q_.data() + s.query_offset * step.q_width, s.query, c.heads,
                       step.weights.rope, c.rope_interleaved);
  }
}

void StepRunner::AttendEachSequence(const Step& step, int layer) {
  const ModelConfig& c = step.config;
  attn_.Reserve(step.queries * step.q_width);  // [sum |Q|, H*D]
  uncaptured_.clear();
  for (size_t i = 0; i < step.sequences.size(); ++i) {
    const SequenceRows& s = step.rows[i];
    const StepPlan& plan = *step.sequences[i].plan;
    const KvCache& cache = step.sequences[i].forward->cache_;
    const int64_t length = cache.positions(), rows_here = int64_t(s.query.size());
    const float* q = q_.data() + s.query_offset * step.q_width;
    float* out = attn_.data() + s.query_offset * step.q_width;
    if (!Captures(plan, layer)) {  // with the other sequences' rows, below
      for (const KeyRun& run : KeyRuns(s.query, plan.attention_block, length)) {
        uncaptured_.push_back({.q = q + run.begin * step.q_width,
                               .rows = run.end - run.begin,
                               .k = cache.keys(layer),
                               .v = cache.values(layer),
                               .keys = run.keys,
                               .out = out + run.begin * step.q_width});
      }
      continue;
    }
    probs_.Reserve(rows_here * c.heads * length);  // [|Q|, H, L]
    if (plan.attention_block == 0) {
      backend_.Attention(q, rows_here, cache.keys(layer), cache.values(layer), length, c.heads,
                         c.kv_heads, c.head_dim, out, probs_.data());
    } else {
      AttendBlockCausal(c, cache, layer, s.query, plan.attention_block, q, out, probs_.data());
    }
    if (plan.hook != nullptr) {
      plan.hook->OnAttention(
          layer, s.query,
          RowsView(*step.sequences[i].forward, probs_.data(), rows_here, c.heads * length));
    }
  }
  backend_.AttentionBatch(uncaptured_, c.heads, c.kv_heads, c.head_dim);
}

// A row sees the keys up to the end of its block (all of them when block is 0), the first
// rows of the cache; each run of consecutive query rows with the same end attends at once.
std::vector<StepRunner::KeyRun> StepRunner::KeyRuns(std::span<const int> positions, int64_t block,
                                                    int64_t length) {
  const int64_t rows = int64_t(positions.size());
  if (block == 0) return {{.begin = 0, .end = rows, .keys = length}};
  auto visible = [&](int64_t r) {
    return std::min(length, (positions[size_t(r)] / block + 1) * block);
  };
  std::vector<KeyRun> runs;
  for (int64_t begin = 0, end = 0; begin < rows; begin = end) {
    const int64_t keys = visible(begin);
    for (end = begin + 1; end < rows && visible(end) == keys;) ++end;
    runs.push_back({.begin = begin, .end = end, .keys = keys});
  }
  return runs;
}

void StepRunner::AttendBlockCausal(const ModelConfig& c, const KvCache& cache, int layer,
                                   std::span<const int> positions, int64_t block, const float* q,
                                   float* out, float* probs) {
  const int64_t length = cache.positions(), rows = int64_t(positions.size());
  const int64_t q_width = int64_t(c.heads) * c.head_dim;
  backend_.Zero(probs, rows * c.heads * length);
  for (const KeyRun& run : KeyRuns(positions, block, length)) {
    const int64_t run_rows = run.end - run.begin;
    run_probs_.Reserve(run_rows * c.heads * run.keys);  // [run, H, keys]
    backend_.Attention(q + run.begin * q_width, run_rows, cache.keys(layer), cache.values(layer),
                       run.keys, c.heads, c.kv_heads, c.head_dim, out + run.begin * q_width,
                       run_probs_.data());
    // The run's (row, head) rows of `keys` into the first `keys` of their rows of L.
    backend_.CopyStrided(run_probs_.data(), run.keys, probs + run.begin * c.heads * length, length,
                         run_rows * c.heads, run.keys);
  }
}

void StepRunner::AddAttentionOutput(const Step& step, int layer) {
  const LayerWeights& w = step.weights.layers[size_t(layer)];
  if (w.bo.empty()) {
    backend_.MatMulAddBatch(attn_.data(), step.segments, w.wo, x_.data());
    return;
  }
  const int64_t size = step.queries * step.config.width;
  proj_.Reserve(size);  // [sum |Q|, C]
  backend_.MatMulBatch(attn_.data(), step.segments, w.wo, proj_.data(), w.bo.data());
  backend_.AddInPlace(x_.data(), proj_.data(), size);
}

void StepRunner::FeedForward(Step& step, int layer) {
  const ModelConfig& c = step.config;
  const LayerWeights& w = step.weights.layers[size_t(layer)];
  const int64_t m = step.queries, C = c.width;
  normed_.Reserve(m * C);  // [sum |Q|, C]
  if (c.IsMoeLayer(layer)) {
    router_.Reserve(m * c.moe.experts);  // [M, E]
    proj_.Reserve(m * C);                // [sum |Q|, C]
    const NormedProduct router[] = {{.w = w.router, .y = router_.data()}};
    backend_.RmsNormProducts(x_.data(), step.segments, C, w.ffn_norm.data(), c.rms_eps,
                             normed_.data(), router);
    MixtureOfExperts(step, w);
    backend_.AddInPlace(x_.data(), proj_.data(), m * C);
    return;
  }
  const int64_t inner = w.mlp.gate.rows;
  gate_.Reserve(m * inner);  // [M, F]
  up_.Reserve(m * inner);    // [M, F]
  const NormedProduct gate_up[] = {{.w = w.mlp.gate, .y = gate_.data()},
                                   {.w = w.mlp.up, .y = up_.data()}};
  backend_.RmsNormProducts(x_.data(), step.segments, C, w.ffn_norm.data(), c.rms_eps,
                           normed_.data(), gate_up);
  AddSwiGluOutput(w.mlp, step.segments, m, x_.data());
}

void StepRunner::ComputeLogits(Step& step) {
  const ModelConfig& c = step.config;
  const size_t n = step.sequences.size();
  std::vector<int> logit_sources;  // [sum n_logits] row of x_ behind each logit row
  step.segments.clear();
  for (size_t i = 0; i < n; ++i) {
    const SequenceRows& s = step.rows[i];
    std::unordered_map<int, int> index;
    for (size_t r = 0; r < s.fresh.size(); ++r) index[s.fresh[r]] = int(r);
    for (const int row : step.results[i].logit_rows) {
      auto it = index.find(row);
      PS_CHECK(it != index.end());
      logit_sources.push_back(int(s.fresh_offset) + it->second);
    }
    step.segments.push_back(int64_t(step.results[i].logit_rows.size()));
    step.results[i].greedy = step.sequences[i].plan->greedy;
  }
  const int64_t n_logits = int64_t(logit_sources.size());
  if (n_logits == 0) return;
  final_.Reserve(n_logits * c.width);  // [sum n_logits, C]
  backend_.CopyRows(x_.data(), logit_sources, final_.data(), {}, c.width);
  logits_.Reserve(n_logits * c.vocab);  // [sum n_logits, V]
  backend_.LmHeadBatch(final_.data(), step.segments, c.width, step.weights.final_norm.data(),
                       c.rms_eps, step.weights.lm_head, logits_.data());
  // Each sequence's rows cross as its plan asks: their greedy choices, or their logits.
  const float* from = logits_.data();
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = step.segments[i];
    StepResult& result = step.results[i];
    const Forward& forward = *step.sequences[i].forward;
    if (result.greedy) {
      result.choices.resize(size_t(rows));
      backend_.GreedyChoices(from, rows, c.vocab, *result.greedy, result.choices.data());
      forward.to_host_ += rows * int64_t(sizeof(GreedyChoice));
    } else {
      result.logits.resize(size_t(rows * c.vocab));
      forward.Download(from, rows * c.vocab * 4, result.logits.data());
    }
    from += rows * c.vocab;
  }
}

std::optional<LogitRow> StepResult::Row(int row) const {
  const auto it = std::lower_bound(logit_rows.begin(), logit_rows.end(), row);
  if (it == logit_rows.end() || *it != row) return std::nullopt;
  const size_t index = size_t(it - logit_rows.begin());
  if (greedy) return LogitRow(choices[index], *greedy);
  const size_t vocab = logits.size() / logit_rows.size();
  return LogitRow(std::span<const float>(&logits[index * vocab], vocab));
}

void StepRunner::AddSwiGluOutput(const SwiGluWeights& w, RowSegments segments, int64_t m,
                                 float* out) {
  backend_.SiluMul(gate_.data(), up_.data(), m * w.gate.rows);
  backend_.MatMulAddBatch(gate_.data(), segments, w.down, out);
}

// proj_[M, C] = sum over each row's chosen experts of weight * expert(normed_ row), plus the
// shared expert's output: the reference's order (zeros, index_add expert by expert, + shared).
// Each expert runs once over the rows that chose it, in row order, split by sequence so every
// sequence's rows get the bits they get alone. Routing, grouping and the experts' row counts
// stay in backend memory: the grouped products read them there, so the host issues the layer
// without waiting for the device.
void StepRunner::MixtureOfExperts(Step& step, const LayerWeights& w) {
  const ModelConfig& c = step.config;
  const MoeConfig& moe = c.moe;
  const int k = moe.experts_per_token, experts = moe.experts;
  const int64_t C = c.width, m = step.queries, routed = m * k;
  const int64_t sequences = int64_t(step.segments.size());
  chosen_.Reserve(m * k);         // [M, k]
  route_weights_.Reserve(m * k);  // [M, k]
  const RouterSpec spec{.experts = experts,
                        .top_k = k,
                        .score = moe.score,
                        .bias = w.expert_bias.empty() ? nullptr : w.expert_bias.data(),
                        .bias_in_weights = moe.bias_in_weights,
                        .groups = moe.groups,
                        .top_groups = moe.top_groups,
                        .normalize = moe.normalize_top_k,
                        .scaling = moe.routed_scaling};
  backend_.RouteTopK(router_.data(), m, spec, chosen_.As<int>(), route_weights_.data());
  expert_rows_.Reserve(routed);                 // [M*k]
  expert_weights_.Reserve(routed);              // [M*k]
  expert_counts_.Reserve(sequences * experts);  // [S, E]
  expert_slots_.Reserve(routed);                // [M, k]
  backend_.GroupByExpert(chosen_.As<int>(), route_weights_.data(), step.segments, experts, k,
                         expert_rows_.As<int>(), expert_weights_.data(), expert_counts_.As<int>(),
                         expert_slots_.As<int>());
  if (counts_experts_) {
    expert_counts_host_.resize(size_t(sequences * experts));  // [S, E]
    step.sequences[0].forward->Download(expert_counts_.As<int>(), sequences * experts * 4,
                                        expert_counts_host_.data());
    for (int64_t s = 0; s < sequences; ++s) {
      const auto row = expert_counts_host_.begin() + s * experts;
      step.results[size_t(s)].experts_read +=
          std::count_if(row, row + experts, [](int n) { return n > 0; });
    }
  }

  // The routed rows, expert by expert: [M*k, C] in, [M*k, Fe] through the SwiGLU, [M*k, C] out.
  expert_gates_.resize(size_t(experts));  // [E]
  expert_ups_.resize(size_t(experts));    // [E]
  expert_downs_.resize(size_t(experts));  // [E]
  for (int e = 0; e < experts; ++e) {
    expert_gates_[size_t(e)] = w.experts[size_t(e)].gate;
    expert_ups_[size_t(e)] = w.experts[size_t(e)].up;
    expert_downs_[size_t(e)] = w.experts[size_t(e)].down;
  }
  const int64_t inner = w.experts[0].gate.rows;
  expert_in_.Reserve(routed * C);   // [M*k, C]
  gate_.Reserve(routed * inner);    // [M*k, Fe]
  up_.Reserve(routed * inner);      // [M*k, Fe]
  expert_out_.Reserve(routed * C);  // [M*k, C]
  const int* counts = expert_counts_.As<int>();
  backend_.GatherRows(normed_.data(), expert_rows_.As<int>(), routed, expert_in_.data(), C);
  backend_.MatMulGroups(expert_in_.data(), routed, expert_gates_, counts, sequences, gate_.data());
  backend_.MatMulGroups(expert_in_.data(), routed, expert_ups_, counts, sequences, up_.data());
  backend_.SiluMul(gate_.data(), up_.data(), routed * inner);
  backend_.MatMulGroups(gate_.data(), routed, expert_downs_, counts, sequences, expert_out_.data());
  backend_.Zero(proj_.data(), m * C);
  backend_.CombineExperts(expert_out_.data(), expert_weights_.data(), expert_slots_.As<int>(), m, k,
                          C, proj_.data());
  if (moe.shared_ffn > 0) {
    const int64_t shared_inner = w.shared.gate.rows;
    gate_.Reserve(m * shared_inner);  // [M, Fs]
    up_.Reserve(m * shared_inner);    // [M, Fs]
    backend_.MatMulBatch(normed_.data(), step.segments, w.shared.gate, gate_.data());
    backend_.MatMulBatch(normed_.data(), step.segments, w.shared.up, up_.data());
    AddSwiGluOutput(w.shared, step.segments, m, proj_.data());
  }
}

DriftScratch::DriftScratch(const Backend& backend)
    : normed_(backend, 0), queries_(backend, 0), keys_(backend, 0) {}

void Forward::ProjectQueries(int layer, const float* x, int64_t m, float* q,
                             DriftScratch& scratch) const {
  Project(layer, x, m, q, scratch.normed_);
}

void Forward::Project(int layer, const float* x, int64_t m, float* q, Buffer& normed) const {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = weights_.layers[size_t(layer)];
  normed.Reserve(m * c.width);  // [M, C]
  const NormedProduct queries[] = {
      {.w = w.wq, .y = q, .bias = w.bq.empty() ? nullptr : w.bq.data()}};
  const int64_t rows[] = {m};
  backend_.RmsNormProducts(x, rows, c.width, w.attn_norm.data(), c.rms_eps, normed.data(), queries);
  if (c.qk_norm) backend_.RmsNorm(q, m * c.heads, c.head_dim, w.q_norm.data(), c.rms_eps, q);
}

void Forward::ReadHidden(int layer, std::span<const int> positions, float* out,
                         std::span<const int> out_rows) const {
  PS_CHECK(cache_.keeps_hidden());
  if (positions.empty()) return;
  backend_.CopyRows(cache_.hidden(layer), positions, out, out_rows, cache_.hidden_width());
}

void Forward::UnrotatedKeys(int layer, float* out) const { Unrotate(layer, out); }

void Forward::Unrotate(int layer, float* out) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  backend_.Copy(cache_.keys(layer), length * cache_.kv_width(), out);
  backend_.UndoRope(out, every_position_, c.kv_heads, weights_.rope, c.rope_interleaved);
}

void Forward::ProxyAttention(int layer, const float* x, int64_t m, float* probs,
                             DriftScratch& scratch) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  scratch.queries_.Reserve(m * c.heads * c.head_dim);  // [M, H*D]
  scratch.keys_.Reserve(length * cache_.kv_width());   // [L, Hkv*D]
  Project(layer, x, m, scratch.queries_.data(), scratch.normed_);
  Unrotate(layer, scratch.keys_.data());
  backend_.AttentionProbabilities(scratch.queries_.data(), m, scratch.keys_.data(), length, c.heads,
                                  c.kv_heads, c.head_dim, probs);
}

void Forward::CachedRowsAttention(int layer, std::span<const int> positions, Buffer& probs) const {
  const ModelConfig& c = model_.config();
  const int64_t count = int64_t(positions.size());
  const int64_t C = cache_.hidden_width(), length = cache_.positions();
  PS_CHECK(cache_.keeps_hidden());
  cached_inputs_.Reserve(count * C);                      // [|P|, C]
  cached_queries_.Reserve(count * c.heads * c.head_dim);  // [|P|, H*D]
  const int64_t size = count * c.heads * length;          // [|P|, H, L]
  if (probs.backend() == &backend_) {
    probs.Reserve(size);
  } else {
    probs = Buffer(backend_, size, Buffer::Init::kNone);
  }
  if (count == 0) return;
  backend_.CopyRows(cache_.hidden(layer), positions, cached_inputs_.data(), {}, C);
  Project(layer, cached_inputs_.data(), count, cached_queries_.data(), cached_normed_);
  backend_.ApplyRope(cached_queries_.data(), positions, c.heads, weights_.rope, c.rope_interleaved);
  backend_.AttentionProbabilities(cached_queries_.data(), count, cache_.keys(layer), length,
                                  c.heads, c.kv_heads, c.head_dim, probs.data());
}

void Forward::HeadMeanDrift(DriftMetric metric, const float* now, const float* before, int64_t rows,
                            double* out, DriftLogs logs) const {
  backend_.HeadMeanDrift(metric, now, before, rows, model_.config().heads, cache_.positions(), out,
                         logs);
  to_host_ += rows * int64_t(sizeof(double));
}

double Forward::MeanCrossHeadCosine(const RowsView& now, std::span<const int> now_rows,
                                    const Buffer& before) const {
  PS_CHECK(before.size() >= int64_t(now_rows.size()) * now.width());  // [|now_rows|, H, L]
  to_host_ += int64_t(sizeof(double));
  return backend_.MeanCrossHeadCosine(now.data(), now_rows, before.data(), model_.config().heads,
                                      cache_.positions());
}

void Forward::MostAttendedKeys(const RowsView& probs, std::span<const int> rows,
                               std::span<const int> keys, std::span<int> top) const {
  const int64_t length = cache_.positions();
  PS_CHECK(probs.width() == model_.config().heads * length);
  for (const int r : rows) PS_CHECK(r >= 0 && r < probs.count());
  key_mass_.Reserve(length);  // [L]
  backend_.AttentionMass(probs.data(), rows, model_.config().heads, length, key_mass_.As<double>());
  backend_.TopKeys(key_mass_.As<double>(), keys, top);
  to_host_ += int64_t(top.size_bytes());
}

}  // namespace polestar
