#include "model/forward.h"

#include <algorithm>
#include <unordered_map>

#include "base/error.h"

namespace polestar {

KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden, const Backend& backend) {
  const ModelConfig& c = model.config();
  return KvCache(backend, c.layers, positions, int64_t(c.kv_heads) * c.head_dim, c.width,
                 keep_hidden);
}

Forward::Forward(const Model& model, KvCache& cache)
    : model_(model),
      cache_(cache),
      backend_(cache.backend()),
      x_(backend_, 0),
      x_next_(backend_, 0),
      normed_(backend_, 0),
      q_(backend_, 0),
      k_(backend_, 0),
      v_(backend_, 0),
      attn_(backend_, 0),
      proj_(backend_, 0),
      gate_(backend_, 0),
      up_(backend_, 0),
      probs_(backend_, 0),
      loaded_(backend_, 0),
      final_(backend_, 0) {}

// K/V of the fresh rows x[|rows|, C] at `layer`, written into the cache by position.
void Forward::ComputeKv(int layer, std::span<const int> rows, const float* x, LayerHook* hook) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const int64_t m = int64_t(rows.size());
  const int64_t kv_width = int64_t(c.kv_heads) * c.head_dim;
  normed_.Reserve(m * c.width);  // [M, C]
  k_.Reserve(m * kv_width);      // [M, Hkv*D]
  v_.Reserve(m * kv_width);      // [M, Hkv*D]
  backend_.RmsNorm(x, m, c.width, w.attn_norm.data(), c.rms_eps, normed_.data());
  backend_.MatMul(normed_.data(), m, w.wk, k_.data(), w.bk.empty() ? nullptr : w.bk.data());
  backend_.MatMul(normed_.data(), m, w.wv, v_.data(), w.bv.empty() ? nullptr : w.bv.data());
  backend_.ApplyRope(k_.data(), rows, c.kv_heads, model_.rope(), c.rope_interleaved);
  if (hook != nullptr) hook->BeforeFreshRowsStored(layer, rows, x);
  if (rows.empty()) return;
  backend_.CopyRows(k_.data(), {}, cache_.keys(layer), rows, kv_width);
  backend_.CopyRows(v_.data(), {}, cache_.values(layer), rows, kv_width);
  if (cache_.keeps_hidden()) backend_.CopyRows(x, {}, cache_.hidden(layer), rows, c.width);
}

StepResult Forward::Run(std::span<const int> canvas, const StepPlan& plan) {
  const ModelConfig& c = model_.config();
  const int64_t length = int64_t(canvas.size());
  PS_CHECK(length == cache_.positions());
  const int64_t C = c.width;
  const int64_t q_width = int64_t(c.heads) * c.head_dim;

  StepResult result;
  result.logit_rows = plan.logit_rows;
  std::vector<int> fresh(plan.input_rows.begin(), plan.input_rows.end());
  for (const int row : fresh) {
    PS_CHECK(row >= 0 && row < length);
    PS_CHECK(canvas[row] >= 0 && canvas[row] < c.vocab);
  }
  x_.Reserve(int64_t(fresh.size()) * C);  // [|F|, C] layer inputs of the fresh rows
  backend_.Embed(model_.embedding(), canvas, fresh, x_.data());

  std::vector<int> query;
  for (int layer = 0; layer < c.layers; ++layer) {
    const LayerWeights& w = model_.layer(layer);
    ComputeKv(layer, fresh, x_.data(), plan.hook);
    result.kv_rows_written += int64_t(fresh.size());

    query = fresh;
    const HiddenSource* hidden_source = nullptr;
    if (plan.hook != nullptr) {
      LayerRows rows{layer, fresh, &query, &result.logit_rows};
      plan.hook->BeforeQueries(rows);
      hidden_source = rows.hidden_source;
    }
    const int64_t m = int64_t(query.size());
    result.rows_computed += m;

    // The query rows' inputs: fresh rows from x_, others from the hidden-state store.
    const bool same_rows = query == fresh;
    if (!same_rows) {
      x_next_.Reserve(m * C);  // [|Q|, C]
      std::unordered_map<int, int> fresh_index;
      for (size_t i = 0; i < fresh.size(); ++i) fresh_index[fresh[i]] = int(i);
      std::vector<int> fresh_from, fresh_at;  // index in x_, index in Q
      std::vector<int> cached_rows;           // positions read from the hidden-state store
      std::vector<int> cached_at;             // their index in Q
      for (int i = 0; i < int(m); ++i) {
        auto it = fresh_index.find(query[size_t(i)]);
        if (it != fresh_index.end()) {
          fresh_from.push_back(it->second);
          fresh_at.push_back(i);
        } else {
          cached_rows.push_back(query[size_t(i)]);
          cached_at.push_back(i);
        }
      }
      if (!fresh_from.empty())
        backend_.CopyRows(x_.data(), fresh_from, x_next_.data(), fresh_at, C);
      if (!cached_rows.empty()) {
        if (hidden_source != nullptr) {
          loaded_.Reserve(int64_t(cached_rows.size()) * C);  // [rows, C]
          hidden_source->Read(layer, cached_rows, loaded_.data());
          backend_.CopyRows(loaded_.data(), {}, x_next_.data(), cached_at, C);
        } else {
          PS_CHECK(cache_.keeps_hidden());
          backend_.CopyRows(cache_.hidden(layer), cached_rows, x_next_.data(), cached_at, C);
        }
      }
      std::swap(x_, x_next_);  // x_: [|Q|, C]
    }

    // Attention block.
    if (!same_rows) {
      normed_.Reserve(m * C);
      backend_.RmsNorm(x_.data(), m, C, w.attn_norm.data(), c.rms_eps, normed_.data());
    }  // else normed_ still holds rmsnorm(x) of exactly these rows from ComputeKv
    q_.Reserve(m * q_width);  // [|Q|, H*D]
    backend_.MatMul(normed_.data(), m, w.wq, q_.data(), w.bq.empty() ? nullptr : w.bq.data());
    backend_.ApplyRope(q_.data(), query, c.heads, model_.rope(), c.rope_interleaved);
    const bool capture = std::find(plan.capture_layers.begin(), plan.capture_layers.end(), layer) !=
                         plan.capture_layers.end();
    attn_.Reserve(m * q_width);                         // [|Q|, H*D]
    if (capture) probs_.Reserve(m * c.heads * length);  // [|Q|, H, L]
    backend_.Attention(q_.data(), m, cache_.keys(layer), cache_.values(layer), length, c.heads,
                       c.kv_heads, c.head_dim, attn_.data(), capture ? probs_.data() : nullptr);
    if (capture && plan.hook != nullptr) plan.hook->OnAttention(layer, query, probs_.data());
    proj_.Reserve(m * C);  // [|Q|, C]
    backend_.MatMul(attn_.data(), m, w.wo, proj_.data());
    backend_.AddInPlace(x_.data(), proj_.data(), m * C);

    // SwiGLU MLP block.
    normed_.Reserve(m * C);
    backend_.RmsNorm(x_.data(), m, C, w.ffn_norm.data(), c.rms_eps, normed_.data());
    gate_.Reserve(m * c.ffn);  // [|Q|, F]
    up_.Reserve(m * c.ffn);    // [|Q|, F]
    backend_.MatMul(normed_.data(), m, w.gate, gate_.data());
    backend_.MatMul(normed_.data(), m, w.up, up_.data());
    backend_.SiluMul(gate_.data(), up_.data(), m * c.ffn);
    backend_.MatMul(gate_.data(), m, w.down, proj_.data());
    backend_.AddInPlace(x_.data(), proj_.data(), m * C);
    fresh = query;
  }

  // Final norm and LM head for the logit rows, which must be rows of the last layer.
  const int64_t n_logits = int64_t(result.logit_rows.size());
  if (n_logits > 0) {
    std::unordered_map<int, int> index;
    for (size_t i = 0; i < fresh.size(); ++i) index[fresh[i]] = int(i);
    std::vector<int> rows;  // [n_logits] index of each logit row in x_
    rows.reserve(size_t(n_logits));
    for (const int row : result.logit_rows) {
      auto it = index.find(row);
      PS_CHECK(it != index.end());
      rows.push_back(it->second);
    }
    final_.Reserve(n_logits * C);  // [n_logits, C]
    backend_.CopyRows(x_.data(), rows, final_.data(), {}, C);
    result.logits.resize(size_t(n_logits * c.vocab));
    backend_.LmHead(final_.data(), n_logits, C, model_.final_norm().data(), c.rms_eps,
                    model_.lm_head(), result.logits.data());
  }
  return result;
}

void Forward::ProjectQueries(int layer, const float* x, int64_t m, float* q) const {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  Buffer normed(backend_, m * c.width, Buffer::Init::kNone);  // [M, C]
  backend_.RmsNorm(x, m, c.width, w.attn_norm.data(), c.rms_eps, normed.data());
  backend_.MatMul(normed.data(), m, w.wq, q, w.bq.empty() ? nullptr : w.bq.data());
}

void Forward::ReadHidden(int layer, std::span<const int> positions, float* out) const {
  PS_CHECK(cache_.keeps_hidden());
  if (positions.empty()) return;
  backend_.CopyRows(cache_.hidden(layer), positions, out, {}, cache_.hidden_width());
}

void Forward::UnrotatedKeys(int layer, float* out) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  backend_.Copy(cache_.keys(layer), length * cache_.kv_width(), out);
  std::vector<int> positions(static_cast<size_t>(length));  // [L] 0, 1, ...
  for (int p = 0; p < int(length); ++p) positions[size_t(p)] = p;
  backend_.UndoRope(out, positions, c.kv_heads, model_.rope(), c.rope_interleaved);
}

void Forward::ProxyAttention(int layer, const float* x, int64_t m, float* probs) const {
  const ModelConfig& c = model_.config();
  const int64_t length = cache_.positions();
  Buffer queries(backend_, m * c.heads * c.head_dim, Buffer::Init::kNone);  // [M, H*D]
  Buffer keys(backend_, length * cache_.kv_width(), Buffer::Init::kNone);   // [L, Hkv*D]
  ProjectQueries(layer, x, m, queries.data());
  UnrotatedKeys(layer, keys.data());
  backend_.AttentionProbabilities(queries.data(), m, keys.data(), length, c.heads, c.kv_heads,
                                  c.head_dim, probs);
}

void Forward::CachedRowsAttention(int layer, std::span<const int> positions, float* probs) const {
  const ModelConfig& c = model_.config();
  const int64_t count = int64_t(positions.size());
  Buffer inputs(backend_, count * c.width, Buffer::Init::kNone);                // [|P|, C]
  Buffer queries(backend_, count * c.heads * c.head_dim, Buffer::Init::kNone);  // [|P|, H*D]
  ReadHidden(layer, positions, inputs.data());
  ProjectQueries(layer, inputs.data(), count, queries.data());
  backend_.ApplyRope(queries.data(), positions, c.heads, model_.rope(), c.rope_interleaved);
  backend_.AttentionProbabilities(queries.data(), count, cache_.keys(layer), cache_.positions(),
                                  c.heads, c.kv_heads, c.head_dim, probs);
}

void Forward::HeadMeanDrift(DriftMetric metric, const float* now, const float* before, int64_t rows,
                            double* out) const {
  backend_.HeadMeanDrift(metric, now, before, rows, model_.config().heads, cache_.positions(), out);
}

double Forward::MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                    const float* before) const {
  return backend_.MeanCrossHeadCosine(now, now_rows, before, model_.config().heads,
                                      cache_.positions());
}

}  // namespace polestar
