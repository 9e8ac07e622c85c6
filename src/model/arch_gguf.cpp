// GGUF files of llama.cpp's converters for the registered architectures: hyper-parameters
// from {arch}.* keys, special tokens from tokenizer.ggml.*, tensors named blk.N.*. Where an
// architecture's converter permutes the q/k rows of each head so that rotate-half RoPE
// becomes the interleaved (2i, 2i+1) form (llama.cpp's LLaDA), we run interleaved RoPE on
// those rows rather than undo the permutation (attention scores are the same either way,
// since q and k share the permutation).
#include <algorithm>
#include <limits>

#include "base/error.h"
#include "io/gguf.h"
#include "model/model.h"

namespace polestar {
namespace {

// The mixture of experts of a GGUF file with {arch}.expert_count: the counts and widths from
// its keys; which layers route, and whether they carry an expert bias, from the tensors
// (llama.cpp's layout has no key for either: a layer routes when it has a router).
template <typename Key, typename Count>
void ParseGgufMoe(const GgufMetadata& m, const TensorStore& store, const TensorNames& names,
                  const Key& key, const Count& count, ModelConfig& c) {
  if (!m.Has(key("expert_count"))) return;
  MoeConfig& moe = c.moe;
  moe.experts = count(key("expert_count"));
  const std::string& origin = m.origin();
  if (moe.experts == 0) Fail(origin, ": ", key("expert_count"), " is 0");
  moe.experts_per_token = count(key("expert_used_count"));
  moe.expert_ffn = count(key("expert_feed_forward_length"));
  if (m.Has(key("expert_shared_feed_forward_length")))
    moe.shared_ffn = count(key("expert_shared_feed_forward_length"));
  // Every layer has tensors of its own: this bounds the search below on a hostile count.
  if (size_t(c.layers) > store.tensors().size()) {
    Fail(origin, ": ", key("block_count"), " = ", c.layers, " but the file has only ",
         store.tensors().size(), " tensors");
  }
  int first_moe_layer = -1;
  for (int l = 0; l < c.layers; ++l) {
    moe.moe_layers.push_back(store.Find(LayerTensorName(names, l, names.router)) != nullptr);
    if (moe.moe_layers.back() && first_moe_layer < 0) first_moe_layer = l;
  }
  if (first_moe_layer < 0)
    Fail(origin, ": ", key("expert_count"), " is set but no layer has a router (", names.router,
         ")");
  moe.expert_bias =
      store.Find(LayerTensorName(names, first_moe_layer, names.expert_bias)) != nullptr;
}

// llama.cpp's BailingMoeV2 router keys (LLaDA 2.x): the scoring function, renormalisation,
// scaling and expert groups, checked against what the tensors say (which layers route,
// whether there is a shared expert).
template <typename Key, typename Count>
void ParseGgufRouterKeys(const GgufMetadata& m, const Key& key, const Count& count,
                         ModelConfig& c) {
  MoeConfig& moe = c.moe;
  const std::string& origin = m.origin();
  const int gating = count(key("expert_gating_func"));
  if (gating != 1 && gating != 2) {
    Fail(origin, ": ", key("expert_gating_func"), " = ", gating,
         " is not a router scoring this model runs (1 softmax, 2 sigmoid)");
  }
  moe.score = gating == 2 ? RouterScore::kSigmoid : RouterScore::kSoftmax;
  moe.normalize_top_k = m.GetBool(key("expert_weights_norm"));
  moe.routed_scaling = float(m.GetFloat(key("expert_weights_scale")));
  moe.groups = count(key("expert_group_count"));
  moe.top_groups = count(key("expert_group_used_count"));
  const int dense_layers = count(key("leading_dense_block_count"));
  for (int l = 0; l < c.layers; ++l) {
    if (c.IsMoeLayer(l) != (l >= dense_layers)) {
      Fail(origin, ": ", key("leading_dense_block_count"), " = ", dense_layers, " but layer ", l,
           c.IsMoeLayer(l) ? " has a" : " has no", " router (", c.arch->gguf_tensors.router, ")");
    }
  }
  const int shared = count(key("expert_shared_count"));
  if ((shared > 0) != (moe.shared_ffn > 0)) {
    Fail(origin, ": ", key("expert_shared_count"), " = ", shared, " but ",
         key("expert_shared_feed_forward_length"), " = ", moe.shared_ffn);
  }
}

ModelConfig ParseGgufConfig(const Architecture& arch, const GgufMetadata& m,
                            const TensorStore& store) {
  const std::string& origin = m.origin();
  ModelConfig c;
  c.arch = &arch;
  auto key = [&](const char* leaf) { return arch.name + "." + leaf; };
  auto count = [&](const std::string& name) {
    const uint64_t value = m.GetUint(name);
    if (value > uint64_t(std::numeric_limits<int>::max()))
      Fail(origin, ": ", name, " is too large");
    return int(value);
  };
  auto id_or = [&](const char* name, int fallback) {
    return m.Has(name) ? int(std::min<int64_t>(m.GetInt(name), std::numeric_limits<int>::max()))
                       : fallback;
  };
  c.width = count(key("embedding_length"));
  c.layers = count(key("block_count"));
  const TensorNames& names = arch.gguf_tensors;
  ParseGgufMoe(m, store, names, key, count, c);
  // A model whose every layer routes needs no dense width.
  bool all_moe = c.moe.experts > 0;
  for (int l = 0; l < c.layers && all_moe; ++l) all_moe = c.IsMoeLayer(l);
  c.ffn = all_moe && !m.Has(key("feed_forward_length")) ? 0 : count(key("feed_forward_length"));
  c.heads = count(key("attention.head_count"));
  c.kv_heads =
      m.Has(key("attention.head_count_kv")) ? count(key("attention.head_count_kv")) : c.heads;
  c.rms_eps = float(m.GetFloat(key("attention.layer_norm_rms_epsilon")));
  c.rope_theta = m.Has(key("rope.freq_base")) ? float(m.GetFloat(key("rope.freq_base"))) : 10000.0f;
  c.max_positions = std::min(count(key("context_length")), 32768);
  if (m.Has(key("attention.key_length"))) {
    c.head_dim = count(key("attention.key_length"));
    if (m.Has(key("attention.value_length")) &&
        count(key("attention.value_length")) != c.head_dim) {
      Fail(origin, ": ", key("attention.value_length"), " = ", count(key("attention.value_length")),
           " differs from ", key("attention.key_length"), " = ", c.head_dim);
    }
  } else {
    c.head_dim = DefaultHeadDim(c, origin);
  }
  c.rotary_dim =
      m.Has(key("rope.dimension_count")) ? count(key("rope.dimension_count")) : c.head_dim;
  if (m.Has(key("attention.causal")) && m.GetBool(key("attention.causal"))) {
    Fail(origin, ": ", key("attention.causal"), " is true; diffusion models attend both ways");
  }
  const TensorRef& embedding = store.Get(names.embedding);
  if (embedding.shape.size() != 2) Fail(origin, ": ", names.embedding, " is not a matrix");
  c.vocab = int(std::min<int64_t>(embedding.shape[0], std::numeric_limits<int>::max()));
  if (m.Has(key("vocab_size")) && count(key("vocab_size")) != c.vocab) {
    Fail(origin, ": ", key("vocab_size"), " = ", count(key("vocab_size")), " but ", names.embedding,
         " has ", c.vocab, " rows");
  }
  c.mask_id = id_or("tokenizer.ggml.mask_token_id", arch.gguf.default_mask_id);
  c.eos_id = id_or("tokenizer.ggml.eos_token_id", -1);
  c.pad_id = id_or("tokenizer.ggml.padding_token_id", c.eos_id);
  c.bos_id = id_or("tokenizer.ggml.bos_token_id", -1);
  c.eot_id = id_or("tokenizer.ggml.eot_token_id", -1);
  c.qkv_bias = arch.block.qkv_bias == QkvBias::kAlways ||
               store.Find(LayerTensorName(
                   names, 0, names.qkv.empty() ? names.q_bias : names.qkv_bias)) != nullptr;
  c.o_bias = store.Find(LayerTensorName(names, 0, names.o_bias)) != nullptr;
  if (m.Has(key("attention.clamp_kqv"))) {
    c.clip_qkv = float(m.GetFloat(key("attention.clamp_kqv")));
    if (!(c.clip_qkv > 0)) Fail(origin, ": ", key("attention.clamp_kqv"), " must be positive");
  }
  if (c.moe.experts > 0) {
    c.moe.bias_in_weights = arch.gguf.expert_bias_in_weights;
    if (arch.gguf.writes_router_keys) ParseGgufRouterKeys(m, key, count, c);
  }
  c.tied_embeddings = store.Find(names.lm_head) == nullptr;
  c.shift_logits = m.Has("diffusion.shift_logits") ? m.GetBool("diffusion.shift_logits")
                                                   : arch.logits == LogitPositions::kNext;
  c.qk_norm = store.Find(LayerTensorName(names, 0, names.q_norm)) != nullptr;
  c.rope_interleaved = arch.gguf.rope == RopeStyle::kInterleaved;
  c.sampler = arch.sampler;
  c.Validate(origin);
  return c;
}

}  // namespace

TensorNames LlamaCppTensorNames() {
  return {.embedding = "token_embd.weight",
          .final_norm = "output_norm.weight",
          .lm_head = "output.weight",
          .layer_prefix = "blk.{}.",
          .q = "attn_q.weight",
          .k = "attn_k.weight",
          .v = "attn_v.weight",
          .o = "attn_output.weight",
          .gate = "ffn_gate.weight",
          .up = "ffn_up.weight",
          .down = "ffn_down.weight",
          .attn_norm = "attn_norm.weight",
          .ffn_norm = "ffn_norm.weight",
          .q_bias = "attn_q.bias",
          .k_bias = "attn_k.bias",
          .v_bias = "attn_v.bias",
          .o_bias = "attn_output.bias",
          .q_norm = "attn_q_norm.weight",
          .k_norm = "attn_k_norm.weight",
          .router = "ffn_gate_inp.weight",
          .expert_bias = "exp_probs_b.bias",
          .expert_gate = "ffn_gate_exps.weight",
          .expert_up = "ffn_up_exps.weight",
          .expert_down = "ffn_down_exps.weight",
          .shared_gate = "ffn_gate_shexp.weight",
          .shared_up = "ffn_up_shexp.weight",
          .shared_down = "ffn_down_shexp.weight"};
}

std::unique_ptr<Model> LoadGgufModel(const std::string& path) {
  TensorStore store;
  store.set_origin(path);
  const GgufFile file = ReadGgufFile(path, store);
  const Architecture& arch =
      ArchitectureOfGguf(file.metadata.GetString("general.architecture"), file.metadata.origin());
  const ModelConfig config = ParseGgufConfig(arch, file.metadata, store);
  return std::make_unique<Model>(std::move(store), config, arch.gguf_tensors, path);
}

}  // namespace polestar
