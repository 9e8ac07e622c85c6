#include "model/forward.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "base/error.h"

namespace polestar {

KvCache MakeCache(const Model& model, int64_t positions, bool keep_hidden) {
  const ModelConfig& c = model.config();
  return KvCache(c.layers, positions, int64_t(c.kv_heads) * c.head_dim, c.width, keep_hidden);
}

Forward::Forward(const Model& model, KvCache& cache) : model_(model), cache_(cache) {}

void Forward::ProjectQueries(int layer, const float* x, int64_t m, float* q) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  std::vector<float> normed(static_cast<size_t>(m * c.width));  // [M, C]
  RmsNorm(x, m, c.width, w.attn_norm.data(), c.rms_eps, normed.data());
  MatMul(normed.data(), m, w.wq, q, w.bq.empty() ? nullptr : w.bq.data());
}

// K/V of the fresh rows x[|rows|, C] at `layer`, written into the cache by position.
void Forward::ComputeKv(int layer, std::span<const int> rows, const float* x, LayerHook* hook) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const int64_t m = int64_t(rows.size());
  const int64_t kv_width = int64_t(c.kv_heads) * c.head_dim;
  normed_.resize(size_t(m * c.width));  // [M, C]
  k_.resize(size_t(m * kv_width));      // [M, Hkv*D]
  v_.resize(size_t(m * kv_width));      // [M, Hkv*D]
  RmsNorm(x, m, c.width, w.attn_norm.data(), c.rms_eps, normed_.data());
  MatMul(normed_.data(), m, w.wk, k_.data(), w.bk.empty() ? nullptr : w.bk.data());
  MatMul(normed_.data(), m, w.wv, v_.data(), w.bv.empty() ? nullptr : w.bv.data());
  ApplyRope(k_.data(), rows, c.kv_heads, model_.rope(), c.rope_interleaved);
  if (hook != nullptr) hook->BeforeFreshRowsStored(layer, rows, x);
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(cache_.keys(layer) + rows[i] * kv_width, &k_[i * kv_width], kv_width * 4);
    std::memcpy(cache_.values(layer) + rows[i] * kv_width, &v_[i * kv_width], kv_width * 4);
    if (cache_.keeps_hidden()) {
      std::memcpy(cache_.hidden(layer) + rows[i] * c.width, x + i * c.width, c.width * 4);
    }
  }
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
  // x_: [|F|, C] layer inputs of the fresh rows.
  x_.resize(fresh.size() * C);
  for (size_t i = 0; i < fresh.size(); ++i) {
    PS_CHECK(fresh[i] >= 0 && fresh[i] < length);
    const int token = canvas[fresh[i]];
    PS_CHECK(token >= 0 && token < c.vocab);
    DequantizeRow(model_.embedding(), token, &x_[i * C]);
  }

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

    // Gather the query rows' inputs: fresh rows from x_, others from the hidden cache.
    x_next_.resize(size_t(m * C));  // [|Q|, C]
    const bool same_rows = query == fresh;
    if (same_rows) {
      std::copy(x_.begin(), x_.end(), x_next_.begin());
    } else {
      std::unordered_map<int, int64_t> fresh_index;
      for (size_t i = 0; i < fresh.size(); ++i) fresh_index[fresh[i]] = int64_t(i);
      std::vector<int> cached_rows;    // positions read from the hidden-state store
      std::vector<int64_t> cached_at;  // their index in Q
      for (int64_t i = 0; i < m; ++i) {
        auto it = fresh_index.find(query[i]);
        if (it != fresh_index.end()) {
          std::memcpy(&x_next_[i * C], &x_[it->second * C], C * 4);
        } else {
          cached_rows.push_back(query[i]);
          cached_at.push_back(i);
        }
      }
      if (!cached_rows.empty()) {
        std::vector<float> loaded(cached_rows.size() * C);  // [rows, C]
        if (hidden_source != nullptr) {
          hidden_source->Read(layer, cached_rows, loaded.data());
        } else {
          PS_CHECK(cache_.keeps_hidden());
          for (size_t r = 0; r < cached_rows.size(); ++r) {
            std::memcpy(&loaded[r * C], cache_.hidden(layer) + int64_t(cached_rows[r]) * C, C * 4);
          }
        }
        for (size_t r = 0; r < cached_rows.size(); ++r) {
          std::memcpy(&x_next_[cached_at[r] * C], &loaded[r * C], C * 4);
        }
      }
    }
    std::swap(x_, x_next_);  // x_: [|Q|, C]

    // Attention block.
    if (!same_rows) {
      normed_.resize(size_t(m * C));
      RmsNorm(x_.data(), m, C, w.attn_norm.data(), c.rms_eps, normed_.data());
    }  // else normed_ still holds rmsnorm(x) of exactly these rows from ComputeKv
    q_.resize(size_t(m * q_width));  // [|Q|, H*D]
    MatMul(normed_.data(), m, w.wq, q_.data(), w.bq.empty() ? nullptr : w.bq.data());
    ApplyRope(q_.data(), query, c.heads, model_.rope(), c.rope_interleaved);
    const bool capture = std::find(plan.capture_layers.begin(), plan.capture_layers.end(), layer) !=
                         plan.capture_layers.end();
    attn_.resize(size_t(m * q_width));                         // [|Q|, H*D]
    if (capture) probs_.resize(size_t(m * c.heads * length));  // [|Q|, H, L]
    Attention(q_.data(), m, cache_.keys(layer), cache_.values(layer), length, c.heads, c.kv_heads,
              c.head_dim, attn_.data(), capture ? probs_.data() : nullptr);
    if (capture && plan.hook != nullptr) plan.hook->OnAttention(layer, query, probs_.data());
    proj_.resize(size_t(m * C));  // [|Q|, C]
    MatMul(attn_.data(), m, w.wo, proj_.data());
    AddInPlace(x_.data(), proj_.data(), m * C);

    // SwiGLU MLP block.
    normed_.resize(size_t(m * C));
    RmsNorm(x_.data(), m, C, w.ffn_norm.data(), c.rms_eps, normed_.data());
    gate_.resize(size_t(m * c.ffn));  // [|Q|, F]
    up_.resize(size_t(m * c.ffn));    // [|Q|, F]
    MatMul(normed_.data(), m, w.gate, gate_.data());
    MatMul(normed_.data(), m, w.up, up_.data());
    SiluMul(gate_.data(), up_.data(), m * c.ffn);
    MatMul(gate_.data(), m, w.down, proj_.data());
    AddInPlace(x_.data(), proj_.data(), m * C);
    fresh = query;
  }

  // Final norm and LM head for the logit rows, which must be rows of the last layer.
  const int64_t n_logits = int64_t(result.logit_rows.size());
  if (n_logits > 0) {
    std::unordered_map<int, int64_t> index;
    for (size_t i = 0; i < fresh.size(); ++i) index[fresh[i]] = int64_t(i);
    std::vector<float> rows(static_cast<size_t>(n_logits * C));  // [n_logits, C]
    for (int64_t i = 0; i < n_logits; ++i) {
      auto it = index.find(result.logit_rows[i]);
      PS_CHECK(it != index.end());
      std::memcpy(&rows[i * C], &x_[it->second * C], C * 4);
    }
    RmsNorm(rows.data(), n_logits, C, model_.final_norm().data(), c.rms_eps, rows.data());
    result.logits.resize(size_t(n_logits * c.vocab));
    MatMul(rows.data(), n_logits, model_.lm_head(), result.logits.data());
  }
  return result;
}

}  // namespace polestar
