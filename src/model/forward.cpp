#include "model/forward.h"

#include <algorithm>
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
      runner_(backend_) {}

void Forward::Upload(const void* host, int64_t bytes, void* dst) const {
  backend_.Upload(host, bytes, dst);
  to_backend_ += bytes;
}

void Forward::Download(const void* src, int64_t bytes, void* host) const {
  backend_.Download(src, bytes, host);
  to_host_ += bytes;
}

void RowsView::Download(std::span<const int> indices, float* out) const {
  for (size_t i = 0; i < indices.size(); ++i) {
    PS_CHECK(indices[i] >= 0 && indices[i] < count_);
    forward_.Download(rows_ + indices[i] * width_, width_ * 4, out + int64_t(i) * width_);
  }
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
      expert_out_(backend, 0) {}

namespace {

// Per sequence of a batched step: its rows at the current layer and where they sit in the
// concatenated buffers.
struct SequenceRows {
  std::vector<int> fresh;                      // F_l
  std::vector<int> query;                      // Q_l
  int64_t fresh_offset = 0, query_offset = 0;  // first row in the concatenation
  const HiddenSource* hidden_source = nullptr;
};

// segments[i] = |rows of sequence i|; returns their sum.
int64_t Segments(const std::vector<SequenceRows>& sequences, std::vector<int> SequenceRows::*rows,
                 std::vector<int64_t>& segments) {
  segments.clear();
  int64_t total = 0;
  for (const SequenceRows& s : sequences) {
    segments.push_back(int64_t((s.*rows).size()));
    total += segments.back();
  }
  return total;
}

// Fills out[|Q|, C] with the inputs of s.query: fresh rows from x[|F|, C], the others from
// the hook's hidden source or else the cache's hidden-state rows.
void GatherQueryInputs(const Backend& backend, KvCache& cache, int layer, const SequenceRows& s,
                       const float* x, float* out, Buffer& loaded) {
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
  const bool captured = std::find(plan.capture_layers.begin(), plan.capture_layers.end(), layer) !=
                        plan.capture_layers.end();
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

std::vector<StepResult> StepRunner::Run(std::span<const SequenceStep> steps) {
  PS_CHECK(!steps.empty());
  const Model& model = steps[0].forward->model_;
  const ResidentWeights& weights = steps[0].forward->weights_;
  const ModelConfig& c = model.config();
  const int64_t C = c.width;
  const int64_t q_width = int64_t(c.heads) * c.head_dim;
  const int64_t kv_width = int64_t(c.kv_heads) * c.head_dim;
  const size_t n = steps.size();

  std::vector<StepResult> results(n);
  std::vector<SequenceRows> rows(n);
  std::vector<int64_t> segments;  // [n] rows per sequence of the op at hand
  int64_t total_fresh = 0;
  for (size_t i = 0; i < n; ++i) {
    const SequenceStep& step = steps[i];
    PS_CHECK(&step.forward->model_ == &model && &step.forward->backend_ == &backend_);
    PS_CHECK(int64_t(step.canvas.size()) == step.forward->cache_.positions());
    for (const int row : step.plan->input_rows) {
      PS_CHECK(row >= 0 && size_t(row) < step.canvas.size());
      PS_CHECK(step.canvas[size_t(row)] >= 0 && step.canvas[size_t(row)] < c.vocab);
    }
    results[i].logit_rows = step.plan->logit_rows;
    rows[i].fresh = step.plan->input_rows;
    rows[i].fresh_offset = total_fresh;
    total_fresh += int64_t(rows[i].fresh.size());
  }
  x_.Reserve(total_fresh * C);  // [sum |F|, C] layer inputs of the fresh rows
  for (size_t i = 0; i < n; ++i) {
    backend_.Embed(weights.embedding, steps[i].canvas, rows[i].fresh,
                   x_.data() + rows[i].fresh_offset * C);
  }

  for (int layer = 0; layer < c.layers; ++layer) {
    const LayerWeights& w = weights.layers[size_t(layer)];

    // K/V of every sequence's fresh rows, written into its cache by position.
    const int64_t m_fresh = Segments(rows, &SequenceRows::fresh, segments);
    normed_.Reserve(m_fresh * C);    // [sum |F|, C]
    k_.Reserve(m_fresh * kv_width);  // [sum |F|, Hkv*D]
    v_.Reserve(m_fresh * kv_width);  // [sum |F|, Hkv*D]
    backend_.RmsNorm(x_.data(), m_fresh, C, w.attn_norm.data(), c.rms_eps, normed_.data());
    backend_.MatMulBatch(normed_.data(), segments, w.wk, k_.data(),
                         w.bk.empty() ? nullptr : w.bk.data());
    if (c.qk_norm) {
      backend_.RmsNorm(k_.data(), m_fresh * c.kv_heads, c.head_dim, w.k_norm.data(), c.rms_eps,
                       k_.data());
    }
    backend_.MatMulBatch(normed_.data(), segments, w.wv, v_.data(),
                         w.bv.empty() ? nullptr : w.bv.data());
    if (c.clip_qkv > 0) {
      backend_.Clamp(k_.data(), m_fresh * kv_width, c.clip_qkv);
      backend_.Clamp(v_.data(), m_fresh * kv_width, c.clip_qkv);
    }
    for (size_t i = 0; i < n; ++i) {
      SequenceRows& s = rows[i];
      KvCache& cache = steps[i].forward->cache_;
      LayerHook* hook = steps[i].plan->hook;
      float* k = k_.data() + s.fresh_offset * kv_width;
      const float* x = x_.data() + s.fresh_offset * C;
      backend_.ApplyRope(k, s.fresh, c.kv_heads, weights.rope, c.rope_interleaved);
      if (hook != nullptr) {
        hook->BeforeFreshRowsStored(layer, s.fresh,
                                    RowsView(*steps[i].forward, x, int64_t(s.fresh.size()), C));
      }
      results[i].kv_rows_written += int64_t(s.fresh.size());
      if (s.fresh.empty()) continue;
      backend_.CopyRows(k, {}, cache.keys(layer), s.fresh, kv_width);
      backend_.CopyRows(v_.data() + s.fresh_offset * kv_width, {}, cache.values(layer), s.fresh,
                        kv_width);
      if (cache.keeps_hidden()) backend_.CopyRows(x, {}, cache.hidden(layer), s.fresh, C);
    }

    // The query rows: F_l unless a hook chooses others.
    bool same_rows = true;
    int64_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      SequenceRows& s = rows[i];
      s.query = s.fresh;
      s.hidden_source = nullptr;
      if (LayerHook* hook = steps[i].plan->hook) {
        LayerRows layer_rows{layer, s.fresh, &s.query, &results[i].logit_rows};
        hook->BeforeQueries(layer_rows);
        s.hidden_source = layer_rows.hidden_source;
      }
      if (layer == c.layers - 1) {
        KeepRowsRead(*steps[i].plan, layer, results[i].logit_rows,
                     steps[i].forward->cache_.positions(), s.query);
      }
      s.query_offset = m;
      m += int64_t(s.query.size());
      results[i].rows_computed += int64_t(s.query.size());
      same_rows = same_rows && s.query == s.fresh;
    }
    Segments(rows, &SequenceRows::query, segments);

    // The query rows' inputs: fresh rows from x_, others from the hidden-state store.
    if (!same_rows) {
      x_next_.Reserve(m * C);  // [sum |Q|, C]
      for (size_t i = 0; i < n; ++i) {
        GatherQueryInputs(backend_, steps[i].forward->cache_, layer, rows[i],
                          x_.data() + rows[i].fresh_offset * C,
                          x_next_.data() + rows[i].query_offset * C, loaded_);
      }
      std::swap(x_, x_next_);  // x_: [sum |Q|, C]
      normed_.Reserve(m * C);
      backend_.RmsNorm(x_.data(), m, C, w.attn_norm.data(), c.rms_eps, normed_.data());
    }  // else normed_ still holds rmsnorm(x) of exactly these rows from the K/V pass

    // Attention block: each sequence's queries over its own cache.
    q_.Reserve(m * q_width);  // [sum |Q|, H*D]
    backend_.MatMulBatch(normed_.data(), segments, w.wq, q_.data(),
                         w.bq.empty() ? nullptr : w.bq.data());
    if (c.qk_norm) {
      backend_.RmsNorm(q_.data(), m * c.heads, c.head_dim, w.q_norm.data(), c.rms_eps, q_.data());
    }
    if (c.clip_qkv > 0) backend_.Clamp(q_.data(), m * q_width, c.clip_qkv);
    attn_.Reserve(m * q_width);  // [sum |Q|, H*D]
    for (size_t i = 0; i < n; ++i) {
      const SequenceRows& s = rows[i];
      const StepPlan& plan = *steps[i].plan;
      KvCache& cache = steps[i].forward->cache_;
      const int64_t length = cache.positions();
      float* q = q_.data() + s.query_offset * q_width;
      backend_.ApplyRope(q, s.query, c.heads, weights.rope, c.rope_interleaved);
      const bool capture = std::find(plan.capture_layers.begin(), plan.capture_layers.end(),
                                     layer) != plan.capture_layers.end();
      const int64_t rows_here = int64_t(s.query.size());
      float* out = attn_.data() + s.query_offset * q_width;
      if (plan.attention_block == 0) {
        if (capture) probs_.Reserve(rows_here * c.heads * length);  // [|Q|, H, L]
        backend_.Attention(q, rows_here, cache.keys(layer), cache.values(layer), length, c.heads,
                           c.kv_heads, c.head_dim, out, capture ? probs_.data() : nullptr);
        if (capture && plan.hook != nullptr) {
          plan.hook->OnAttention(
              layer, s.query,
              RowsView(*steps[i].forward, probs_.data(), rows_here, c.heads * length));
        }
        continue;
      }
      // Block-causal: a row sees the keys up to the end of its block, the first rows of the
      // cache; each run of consecutive query rows with the same end attends at once. Captured
      // probabilities are laid out as the bidirectional ones, zero on the keys a row cannot see.
      const int64_t block = plan.attention_block;
      auto visible = [&](int64_t r) {
        return std::min(length, (s.query[size_t(r)] / block + 1) * block);
      };
      if (capture) {
        probs_.Reserve(rows_here * c.heads * length);  // [|Q|, H, L]
        backend_.Zero(probs_.data(), rows_here * c.heads * length);
      }
      for (int64_t begin = 0, end = 0; begin < rows_here; begin = end) {
        const int64_t keys = visible(begin);
        for (end = begin + 1; end < rows_here && visible(end) == keys;) ++end;
        if (capture) run_probs_.Reserve((end - begin) * c.heads * keys);  // [run, H, keys]
        backend_.Attention(q + begin * q_width, end - begin, cache.keys(layer), cache.values(layer),
                           keys, c.heads, c.kv_heads, c.head_dim, out + begin * q_width,
                           capture ? run_probs_.data() : nullptr);
        if (!capture) continue;
        for (int64_t r = begin; r < end; ++r) {
          for (int h = 0; h < c.heads; ++h) {
            backend_.Copy(run_probs_.data() + ((r - begin) * c.heads + h) * keys, keys,
                          probs_.data() + (r * c.heads + h) * length);
          }
        }
      }
      if (capture && plan.hook != nullptr) {
        plan.hook->OnAttention(
            layer, s.query,
            RowsView(*steps[i].forward, probs_.data(), rows_here, c.heads * length));
      }
    }
    proj_.Reserve(m * C);  // [sum |Q|, C]
    backend_.MatMulBatch(attn_.data(), segments, w.wo, proj_.data(),
                         w.bo.empty() ? nullptr : w.bo.data());
    backend_.AddInPlace(x_.data(), proj_.data(), m * C);

    // MLP block: SwiGLU, or a mixture of SwiGLU experts.
    normed_.Reserve(m * C);
    backend_.RmsNorm(x_.data(), m, C, w.ffn_norm.data(), c.rms_eps, normed_.data());
    if (c.IsMoeLayer(layer)) {
      MixtureOfExperts(w, c, segments, m);
    } else {
      SwiGlu(w.mlp, normed_.data(), segments, m, proj_.data());
    }
    backend_.AddInPlace(x_.data(), proj_.data(), m * C);
    for (SequenceRows& s : rows) {
      s.fresh = std::move(s.query);
      s.fresh_offset = s.query_offset;
    }
  }

  // Final norm and LM head for the logit rows, which must be rows of the last layer.
  std::vector<int> logit_sources;  // [sum n_logits] row of x_ behind each logit row
  segments.clear();
  for (size_t i = 0; i < n; ++i) {
    std::unordered_map<int, int> index;
    for (size_t r = 0; r < rows[i].fresh.size(); ++r) index[rows[i].fresh[r]] = int(r);
    for (const int row : results[i].logit_rows) {
      auto it = index.find(row);
      PS_CHECK(it != index.end());
      logit_sources.push_back(int(rows[i].fresh_offset) + it->second);
    }
    segments.push_back(int64_t(results[i].logit_rows.size()));
  }
  const int64_t n_logits = int64_t(logit_sources.size());
  if (n_logits > 0) {
    final_.Reserve(n_logits * C);  // [sum n_logits, C]
    backend_.CopyRows(x_.data(), logit_sources, final_.data(), {}, C);
    logits_.Reserve(n_logits * c.vocab);  // [sum n_logits, V]
    backend_.LmHeadBatch(final_.data(), segments, C, weights.final_norm.data(), c.rms_eps,
                         weights.lm_head, logits_.data());
    const float* from = logits_.data();
    for (size_t i = 0; i < n; ++i) {
      const int64_t count = segments[i] * c.vocab;
      results[i].logits.resize(size_t(count));
      steps[i].forward->Download(from, count * 4, results[i].logits.data());
      from += count;
    }
  }
  return results;
}

void StepRunner::SwiGlu(const SwiGluWeights& w, const float* x, RowSegments segments, int64_t m,
                        float* out) {
  const int64_t inner = w.gate.rows;
  gate_.Reserve(m * inner);  // [M, F]
  up_.Reserve(m * inner);    // [M, F]
  backend_.MatMulBatch(x, segments, w.gate, gate_.data());
  backend_.MatMulBatch(x, segments, w.up, up_.data());
  backend_.SiluMul(gate_.data(), up_.data(), m * inner);
  backend_.MatMulBatch(gate_.data(), segments, w.down, out);
}

// proj_[M, C] = sum over each row's chosen experts of weight * expert(normed_ row), plus the
// shared expert's output: the reference's order (zeros, index_add expert by expert, + shared).
// Each expert runs once over the rows that chose it, in row order, split by sequence so every
// sequence's rows get the bits they get alone.
void StepRunner::MixtureOfExperts(const LayerWeights& w, const ModelConfig& c, RowSegments segments,
                                  int64_t m) {
  const MoeConfig& moe = c.moe;
  const int k = moe.experts_per_token;
  const int64_t C = c.width;
  router_.Reserve(m * moe.experts);  // [M, E]
  backend_.MatMulBatch(normed_.data(), segments, w.router, router_.data());
  std::vector<int>& chosen = routing_.chosen;
  std::vector<float>& weights = routing_.weights;
  chosen.resize(size_t(m * k));
  weights.resize(size_t(m * k));
  const RouterSpec spec{.experts = moe.experts,
                        .top_k = k,
                        .score = moe.score,
                        .bias = w.expert_bias.empty() ? nullptr : w.expert_bias.data(),
                        .bias_in_weights = moe.bias_in_weights,
                        .groups = moe.groups,
                        .top_groups = moe.top_groups,
                        .normalize = moe.normalize_top_k,
                        .scaling = moe.routed_scaling};
  backend_.RouteTopK(router_.data(), m, spec, chosen.data(), weights.data());

  // Per expert: its rows (ascending), their weights, and its rows per sequence.
  auto& expert_rows = routing_.expert_rows;
  auto& expert_weights = routing_.expert_weights;
  auto& expert_segments = routing_.expert_segments;
  expert_rows.resize(size_t(moe.experts));
  expert_weights.resize(size_t(moe.experts));
  expert_segments.resize(size_t(moe.experts));
  for (int e = 0; e < moe.experts; ++e) {
    expert_rows[size_t(e)].clear();
    expert_weights[size_t(e)].clear();
    expert_segments[size_t(e)].clear();
  }
  int64_t row = 0;
  for (size_t sequence = 0; sequence < segments.size(); ++sequence) {
    for (auto& counts : expert_segments) counts.push_back(0);
    for (int64_t end = row + segments[sequence]; row < end; ++row) {
      for (int i = 0; i < k; ++i) {
        const size_t e = size_t(chosen[size_t(row * k + i)]);
        expert_rows[e].push_back(int(row));
        expert_weights[e].push_back(weights[size_t(row * k + i)]);
        ++expert_segments[e].back();
      }
    }
  }

  backend_.Zero(proj_.data(), m * C);
  for (int e = 0; e < moe.experts; ++e) {
    const std::vector<int>& rows = expert_rows[size_t(e)];
    if (rows.empty()) continue;
    const int64_t n = int64_t(rows.size());
    expert_in_.Reserve(n * C);   // [n, C] the rows that chose expert e
    expert_out_.Reserve(n * C);  // [n, C]
    backend_.CopyRows(normed_.data(), rows, expert_in_.data(), {}, C);
    SwiGlu(w.experts[size_t(e)], expert_in_.data(), expert_segments[size_t(e)], n,
           expert_out_.data());
    backend_.ScaleAddRows(expert_out_.data(), expert_weights[size_t(e)], proj_.data(), rows, C);
  }
  if (moe.shared_ffn > 0) {
    expert_out_.Reserve(m * C);  // [M, C]
    SwiGlu(w.shared, normed_.data(), segments, m, expert_out_.data());
    backend_.AddInPlace(proj_.data(), expert_out_.data(), m * C);
  }
}

void Forward::ProjectQueries(int layer, const float* x, int64_t m, float* q) const {
  const ModelConfig& c = model_.config();
  const int64_t q_width = int64_t(c.heads) * c.head_dim;
  Buffer inputs(backend_, m * c.width, Buffer::Init::kNone);   // [M, C]
  Buffer queries(backend_, m * q_width, Buffer::Init::kNone);  // [M, H*D]
  Upload(x, inputs.bytes(), inputs.data());
  Project(layer, inputs.data(), m, queries.data());
  Download(queries.data(), queries.bytes(), q);
}

void Forward::Project(int layer, const float* x, int64_t m, float* q) const {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = weights_.layers[size_t(layer)];
  Buffer normed(backend_, m * c.width, Buffer::Init::kNone);  // [M, C]
  backend_.RmsNorm(x, m, c.width, w.attn_norm.data(), c.rms_eps, normed.data());
  backend_.MatMul(normed.data(), m, w.wq, q, w.bq.empty() ? nullptr : w.bq.data());
  if (c.qk_norm) backend_.RmsNorm(q, m * c.heads, c.head_dim, w.q_norm.data(), c.rms_eps, q);
}

void Forward::ReadHidden(int layer, std::span<const int> positions, float* out) const {
  PS_CHECK(cache_.keeps_hidden());
  if (positions.empty()) return;
  const int64_t C = cache_.hidden_width();
  Buffer rows(backend_, int64_t(positions.size()) * C, Buffer::Init::kNone);  // [|P|, C]
  backend_.CopyRows(cache_.hidden(layer), positions, rows.data(), {}, C);
  Download(rows.data(), rows.bytes(), out);
}

void Forward::UnrotatedKeys(int layer, float* out) const {
  Buffer keys(backend_, cache_.positions() * cache_.kv_width(), Buffer::Init::kNone);  // [L, Hkv*D]
  Unrotate(layer, keys.data());
  Download(keys.data(), keys.bytes(), out);
}

void Forward::Unrotate(int layer, float* out) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  backend_.Copy(cache_.keys(layer), length * cache_.kv_width(), out);
  std::vector<int> positions(static_cast<size_t>(length));  // [L] 0, 1, ...
  for (int p = 0; p < int(length); ++p) positions[size_t(p)] = p;
  backend_.UndoRope(out, positions, c.kv_heads, weights_.rope, c.rope_interleaved);
}

void Forward::ProxyAttention(int layer, const float* x, int64_t m, float* probs) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  Buffer inputs(backend_, m * c.width, Buffer::Init::kNone);                // [M, C]
  Buffer queries(backend_, m * c.heads * c.head_dim, Buffer::Init::kNone);  // [M, H*D]
  Buffer keys(backend_, length * cache_.kv_width(), Buffer::Init::kNone);   // [L, Hkv*D]
  Buffer out(backend_, m * c.heads * length, Buffer::Init::kNone);          // [M, H, L]
  Upload(x, inputs.bytes(), inputs.data());
  Project(layer, inputs.data(), m, queries.data());
  Unrotate(layer, keys.data());
  backend_.AttentionProbabilities(queries.data(), m, keys.data(), length, c.heads, c.kv_heads,
                                  c.head_dim, out.data());
  Download(out.data(), out.bytes(), probs);
}

void Forward::CachedRowsAttention(int layer, std::span<const int> positions, float* probs) const {
  const ModelConfig& c = model_.config();
  const int64_t count = int64_t(positions.size());
  const int64_t C = cache_.hidden_width();
  Buffer inputs(backend_, count * C, Buffer::Init::kNone);                          // [|P|, C]
  Buffer queries(backend_, count * c.heads * c.head_dim, Buffer::Init::kNone);      // [|P|, H*D]
  Buffer out(backend_, count * c.heads * cache_.positions(), Buffer::Init::kNone);  // [|P|, H, L]
  PS_CHECK(cache_.keeps_hidden());
  backend_.CopyRows(cache_.hidden(layer), positions, inputs.data(), {}, C);
  Project(layer, inputs.data(), count, queries.data());
  backend_.ApplyRope(queries.data(), positions, c.heads, weights_.rope, c.rope_interleaved);
  backend_.AttentionProbabilities(queries.data(), count, cache_.keys(layer), cache_.positions(),
                                  c.heads, c.kv_heads, c.head_dim, out.data());
  Download(out.data(), out.bytes(), probs);
}

void Forward::HeadMeanDrift(DriftMetric metric, const float* now, const float* before, int64_t rows,
                            double* out, DriftLogs logs) const {
  const int64_t size = rows * model_.config().heads * cache_.positions();  // [rows, H, L]
  Buffer now_rows(backend_, size, Buffer::Init::kNone),
      before_rows(backend_, size, Buffer::Init::kNone);
  Upload(now, now_rows.bytes(), now_rows.data());
  Upload(before, before_rows.bytes(), before_rows.data());
  backend_.HeadMeanDrift(metric, now_rows.data(), before_rows.data(), rows, model_.config().heads,
                         cache_.positions(), out, logs);
  to_host_ += rows * int64_t(sizeof(double));
}

double Forward::MeanCrossHeadCosine(const RowsView& now, std::span<const int> now_rows,
                                    const float* before) const {
  const int64_t size = int64_t(now_rows.size()) * now.width();  // [|now_rows|, H, L]
  Buffer before_rows(backend_, size, Buffer::Init::kNone);
  Upload(before, before_rows.bytes(), before_rows.data());
  to_host_ += int64_t(sizeof(double));
  return backend_.MeanCrossHeadCosine(now.data(), now_rows, before_rows.data(),
                                      model_.config().heads, cache_.positions());
}

}  // namespace polestar
