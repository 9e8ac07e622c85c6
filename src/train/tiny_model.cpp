#include "train/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/layers.h"

namespace polestar::train {

int64_t ParamTensor::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TinyConfig::Validate() const {
  if (vocab <= 0 || width <= 0 || layers <= 0 || heads <= 0 || ffn <= 0) {
    Fail("model config: vocab, width, layers, heads and ffn must be positive");
  }
  if (width % heads != 0 || head_dim() % 2 != 0) {
    Fail("model config: width ", width, " must split into ", heads, " heads of even size");
  }
  if (mask_id < 0 || mask_id >= vocab || eos_id < 0 || eos_id >= vocab) {
    Fail("model config: mask and EOS ids must lie inside the vocabulary");
  }
}

nlohmann::ordered_json TinyConfig::LladaJson() const {
  return {{"model_type", "llada"},
          {"architectures", {"LLaDAModelLM"}},
          {"d_model", width},
          {"n_heads", heads},
          {"n_kv_heads", heads},
          {"n_layers", layers},
          {"mlp_ratio", ffn / width},
          {"mlp_hidden_size", ffn},
          {"activation_type", "silu"},
          {"block_type", "llama"},
          {"block_group_size", 1},
          {"alibi", false},
          {"alibi_bias_max", 8.0},
          {"rope", true},
          {"rope_full_precision", true},
          {"rope_theta", rope_theta},
          {"flash_attention", false},
          {"attention_dropout", 0.0},
          {"multi_query_attention", nullptr},
          {"attention_layer_norm", false},
          {"residual_dropout", 0.0},
          {"embedding_dropout", 0.0},
          {"input_emb_norm", false},
          {"layer_norm_type", "rms"},
          {"layer_norm_with_affine", true},
          {"rms_norm_eps", std::round(double(rms_eps) * 1e12) / 1e12},
          {"attention_layer_norm_with_affine", true},
          {"max_sequence_length", max_positions},
          {"include_bias", false},
          {"include_qkv_bias", false},
          {"bias_for_layer_norm", false},
          {"scale_logits", false},
          {"vocab_size", vocab},
          {"embedding_size", vocab},
          {"weight_tying", false},
          {"eos_token_id", eos_id},
          {"pad_token_id", pad_id},
          {"mask_token_id", mask_id},
          {"init_device", "cpu"},
          {"init_fn", "normal"},
          {"init_std", 0.02},
          {"init_cutoff_factor", nullptr},
          {"precision", "fp32"},
          {"use_cache", false}};
}

TinyModel::TinyModel(const TinyConfig& config) : config_(config) {
  config_.Validate();
  const int64_t V = config_.vocab, C = config_.width, F = config_.ffn;
  embedding_ = Add("model.transformer.wte.weight", {V, C}, true);
  for (int l = 0; l < config_.layers; ++l) {
    const std::string p = "model.transformer.blocks." + std::to_string(l) + ".";
    LayerOffsets o;
    o.attn_norm = Add(p + "attn_norm.weight", {C}, false);
    o.qkv = Add(p + "qkv", {3 * C, C}, true);
    o.attn_out = Add(p + "attn_out.weight", {C, C}, true);
    o.ffn_norm = Add(p + "ff_norm.weight", {C}, false);
    o.gate_up = Add(p + "gate_up", {2 * F, C}, true);
    o.down = Add(p + "ff_out.weight", {C, F}, true);
    layers_.push_back(o);
  }
  final_norm_ = Add("model.transformer.ln_f.weight", {C}, false);
  lm_head_ = Add("model.transformer.ff_out.weight", {V, C}, true);
  params_.assign(size_t(tensors_.back().offset + tensors_.back().size()), 0.0f);
  rope_ =
      RopeTable(config_.head_dim(), config_.head_dim(), config_.max_positions, config_.rope_theta);
  acts_.resize(size_t(config_.layers));
}

int64_t TinyModel::Add(std::string name, std::vector<int64_t> shape, bool decay) {
  const int64_t offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().size();
  tensors_.push_back({std::move(name), std::move(shape), offset, decay});
  return offset;
}

void TinyModel::Init(uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float out_scale = 1.0f / std::sqrt(2.0f * float(config_.layers));
  for (const ParamTensor& t : tensors_) {
    float* p = &params_[size_t(t.offset)];
    if (!t.decay) {
      std::fill(p, p + t.size(), 1.0f);
      continue;
    }
    const bool output =
        t.name.ends_with("attn_out.weight") ||
        (t.name.ends_with("ff_out.weight") && t.name.find("blocks") != std::string::npos);
    for (int64_t i = 0; i < t.size(); ++i) p[i] = normal(engine) * (output ? out_scale : 1.0f);
  }
}

void TinyModel::ForEachCheckpointTensor(
    const std::function<void(const std::string&, std::vector<int64_t>, int64_t)>& visit) const {
  const int64_t C = config_.width, F = config_.ffn;
  for (const ParamTensor& t : tensors_) {
    if (t.name.ends_with("qkv")) {
      const std::string p = t.name.substr(0, t.name.size() - 3);
      visit(p + "q_proj.weight", {C, C}, t.offset);
      visit(p + "k_proj.weight", {C, C}, t.offset + C * C);
      visit(p + "v_proj.weight", {C, C}, t.offset + 2 * C * C);
    } else if (t.name.ends_with("gate_up")) {
      const std::string p = t.name.substr(0, t.name.size() - 7);
      visit(p + "ff_proj.weight", {F, C}, t.offset);
      visit(p + "up_proj.weight", {F, C}, t.offset + F * C);
    } else {
      visit(t.name, t.shape, t.offset);
    }
  }
}

void TinyModel::Export(const std::string& dir) const {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<TensorToWrite> out;
  ForEachCheckpointTensor([&](const std::string& name, std::vector<int64_t> shape, int64_t offset) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(params_.begin() + offset, params_.begin() + offset + n);
    out.push_back(F32Tensor(name, std::move(shape), values));
  });
  WriteSafetensors((fs::path(dir) / "model.safetensors").string(), out, {{"format", "pt"}});
  const std::string config_path = (fs::path(dir) / "config.json").string();
  WriteFileAtomically(config_path, config_.LladaJson().dump(2) + "\n");
}

void TinyModel::Import(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "model.safetensors").string();
  TensorStore store;
  store.set_origin(path);
  ReadSafetensorsFile(path, store);
  const std::string block_prefix = "model.transformer.blocks.";
  int source_layers = 0;
  while (store.Find(block_prefix + std::to_string(source_layers) + ".attn_norm.weight")) {
    ++source_layers;
  }
  if (source_layers == 0 || source_layers > config_.layers) {
    Fail(path, ": ", source_layers, " blocks; this model has ", config_.layers,
         " (a warm start takes as many blocks or fewer)");
  }
  // A shallower source grows this model in depth: source block s becomes block
  // s * layers / source_layers, and each block between keeps its initial weights with zero
  // output projections, so it adds nothing to the residual stream and the grown model
  // computes the source's function exactly until training moves it.
  std::vector<int> source_of(size_t(config_.layers), -1);  // [layers] source block or -1
  for (int s = 0; s < source_layers; ++s) {
    source_of[size_t(s * config_.layers / source_layers)] = s;
  }
  ForEachCheckpointTensor([&](const std::string& name, std::vector<int64_t> shape, int64_t offset) {
    std::string source_name = name;
    if (name.starts_with(block_prefix)) {
      const size_t dot = name.find('.', block_prefix.size());
      const int layer = std::stoi(name.substr(block_prefix.size(), dot - block_prefix.size()));
      const int source = source_of[size_t(layer)];
      if (source < 0) {
        if (name.ends_with("attn_out.weight") || name.ends_with("ff_out.weight")) {
          std::fill_n(params_.data() + offset, shape[0] * shape[1], 0.0f);
        }
        return;
      }
      source_name = block_prefix + std::to_string(source) + name.substr(dot);
    }
    const TensorRef& t = store.Get(source_name);
    if (t.dtype != DType::kF32 || t.shape != shape) {
      Fail(path, ": tensor ", source_name, " is not an F32 tensor of this model's shape");
    }
    std::memcpy(params_.data() + offset, t.data, t.bytes);
  });
}

double TinyModel::Run(const Batch& batch, float* grads, std::vector<float>* logits_out) {
  const TinyConfig& c = config_;
  const int64_t M = int64_t(batch.tokens.size());
  const int64_t C = c.width, F = c.ffn, V = c.vocab, R = int64_t(batch.target_rows.size());
  const int H = c.heads, D = c.head_dim();
  PS_CHECK(int64_t(batch.positions.size()) == M && batch.starts.back() == M);
  const float* P = params_.data();

  // Embedding.
  std::vector<float> x(size_t(M * C));  // [M, C] running residual stream
  for (int64_t r = 0; r < M; ++r) {
    const int token = batch.tokens[size_t(r)];
    PS_CHECK(token >= 0 && token < V && batch.positions[size_t(r)] < c.max_positions);
    std::memcpy(&x[size_t(r * C)], P + embedding_ + token * C, size_t(C) * 4);
  }
  const int64_t probs_size = AttentionProbsSize(batch.starts, H);
  for (int l = 0; l < c.layers; ++l) {
    const LayerOffsets& o = layers_[size_t(l)];
    LayerActs& a = acts_[size_t(l)];
    a.x = x;                          // [M, C]
    a.h1.resize(size_t(M * C));       // [M, C]
    a.inv1.resize(size_t(M));         // [M]
    a.qkv.resize(size_t(M * 3 * C));  // [M, 3C] rotated q | rotated k | v
    a.probs.resize(size_t(probs_size));
    a.attn.resize(size_t(M * C));            // [M, C]
    a.h2.resize(size_t(M * C));              // [M, C]
    a.inv2.resize(size_t(M));                // [M]
    a.gu.resize(size_t(M * 2 * F));          // [M, 2F] gate | up
    a.act.resize(size_t(M * F));             // [M, F]
    std::vector<float> proj(size_t(M * C));  // [M, C]

    RmsNormForward(x.data(), M, C, P + o.attn_norm, c.rms_eps, a.h1.data(), a.inv1.data());
    LinearForward(a.h1.data(), M, C, P + o.qkv, 3 * C, a.qkv.data());
    Rope(a.qkv.data(), M, 3 * C, H, batch.positions, rope_, false);
    Rope(a.qkv.data() + C, M, 3 * C, H, batch.positions, rope_, false);
    AttentionForward(a.qkv.data(), batch.starts, H, D, a.attn.data(), a.probs.data());
    LinearForward(a.attn.data(), M, C, P + o.attn_out, C, proj.data());
    for (int64_t i = 0; i < M * C; ++i) x[size_t(i)] += proj[size_t(i)];
    a.x_mid = x;
    RmsNormForward(x.data(), M, C, P + o.ffn_norm, c.rms_eps, a.h2.data(), a.inv2.data());
    LinearForward(a.h2.data(), M, C, P + o.gate_up, 2 * F, a.gu.data());
    SwigluForward(a.gu.data(), M, F, a.act.data());
    LinearForward(a.act.data(), M, F, P + o.down, C, proj.data());
    for (int64_t i = 0; i < M * C; ++i) x[size_t(i)] += proj[size_t(i)];
  }
  x_final_ = x;
  h_final_.resize(size_t(M * C));  // [M, C]
  inv_final_.resize(size_t(M));
  RmsNormForward(x.data(), M, C, P + final_norm_, c.rms_eps, h_final_.data(), inv_final_.data());

  // LM head on the target rows only: the loss needs nothing else.
  h_target_.resize(size_t(R * C));  // [R, C]
  for (int64_t i = 0; i < R; ++i) {
    const int row = batch.target_rows[size_t(i)];
    PS_CHECK(row >= 0 && row < M);
    std::memcpy(&h_target_[size_t(i * C)], &h_final_[size_t(row * C)], size_t(C) * 4);
  }
  logits_.resize(size_t(R * V));  // [R, V], then dlogits in place
  LinearForward(h_target_.data(), R, C, P + lm_head_, V, logits_.data());
  if (logits_out != nullptr) *logits_out = logits_;
  const double loss =
      CrossEntropy(logits_.data(), R, V, batch.targets, batch.weights, logits_.data());
  if (grads == nullptr) return loss;

  // Backward.
  float* G = grads;
  dh_target_.resize(size_t(R * C));  // [R, C]
  LinearBackward(logits_.data(), h_target_.data(), P + lm_head_, R, C, V, dh_target_.data(),
                 G + lm_head_);
  dh_.assign(size_t(M * C), 0.0f);  // [M, C]
  for (int64_t i = 0; i < R; ++i) {
    const int row = batch.target_rows[size_t(i)];
    for (int64_t j = 0; j < C; ++j) dh_[size_t(row * C + j)] += dh_target_[size_t(i * C + j)];
  }
  dx_.assign(size_t(M * C), 0.0f);  // [M, C] gradient of the residual stream
  RmsNormBackward(dh_.data(), x_final_.data(), P + final_norm_, inv_final_.data(), M, C, dx_.data(),
                  G + final_norm_);
  dact_.resize(size_t(M * F));      // [M, F]
  dgu_.resize(size_t(M * 2 * F));   // [M, 2F]
  dattn_.resize(size_t(M * C));     // [M, C]
  dqkv_.resize(size_t(M * 3 * C));  // [M, 3C]
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerOffsets& o = layers_[size_t(l)];
    LayerActs& a = acts_[size_t(l)];
    // x_next = x_mid + swiglu(rmsnorm(x_mid) W_gu^T) W_down^T
    LinearBackward(dx_.data(), a.act.data(), P + o.down, M, F, C, dact_.data(), G + o.down);
    SwigluBackward(dact_.data(), a.gu.data(), M, F, dgu_.data());
    LinearBackward(dgu_.data(), a.h2.data(), P + o.gate_up, M, C, 2 * F, dh_.data(), G + o.gate_up);
    RmsNormBackward(dh_.data(), a.x_mid.data(), P + o.ffn_norm, a.inv2.data(), M, C, dx_.data(),
                    G + o.ffn_norm);
    // x_mid = x + attention(rope(rmsnorm(x) W_qkv^T)) W_o^T
    LinearBackward(dx_.data(), a.attn.data(), P + o.attn_out, M, C, C, dattn_.data(),
                   G + o.attn_out);
    AttentionBackward(dattn_.data(), a.qkv.data(), a.probs.data(), batch.starts, H, D,
                      dqkv_.data());
    Rope(dqkv_.data(), M, 3 * C, H, batch.positions, rope_, true);
    Rope(dqkv_.data() + C, M, 3 * C, H, batch.positions, rope_, true);
    LinearBackward(dqkv_.data(), a.h1.data(), P + o.qkv, M, C, 3 * C, dh_.data(), G + o.qkv);
    RmsNormBackward(dh_.data(), a.x.data(), P + o.attn_norm, a.inv1.data(), M, C, dx_.data(),
                    G + o.attn_norm);
  }
  for (int64_t r = 0; r < M; ++r) {
    float* g = G + embedding_ + int64_t(batch.tokens[size_t(r)]) * C;
    for (int64_t j = 0; j < C; ++j) g[j] += dx_[size_t(r * C + j)];
  }
  return loss;
}

}  // namespace polestar::train
