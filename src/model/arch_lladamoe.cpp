// LLaDA-MoE (inclusionAI's LLaDA-MoE-7B-A1B, model_type lladamoe): OLMoE-style blocks run
// without a causal mask. Per-head RMSNorm on q and k (then clip_qkv's clamp of q, k and v)
// before RoPE, optional biases on q, k, v and o (attention_bias), rotate-half RoPE on the
// first partial_rotary_factor of each head, and an MLP that is, per moe_layer_freq, either
// dense SwiGLU or a mixture of SwiGLU experts: softmax router in fp32, the optional expert
// bias added to the probabilities (it picks the experts and stays in their weights), top-k
// without renormalisation, plus an optional shared expert. No logit shift.
//
// The reference modeling code (modeling_lladamoe.py) fixes some config keys: it always
// routes by softmax and never renormalises or scales the top-k weights, whatever
// moe_router_score_function, norm_topk_prob and routed_scaling_factor say, and ignores the
// router group keys; so does this file.
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/architecture.h"

namespace polestar {
namespace {

ModelConfig ParseConfig(const nlohmann::json& j, const std::string& path) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    Fail(path, ": hidden_act must be silu");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    Fail(path, ": rope_scaling is not supported");
  ModelConfig c;
  c.width = JsonInt(j, "hidden_size", 0, path);
  c.heads = JsonInt(j, "num_attention_heads", 0, path);
  c.kv_heads = JsonInt(j, "num_key_value_heads", c.heads, path);
  c.layers = JsonInt(j, "num_hidden_layers", 0, path);
  c.ffn = JsonInt(j, "dense_intermediate_size", 0, path);
  c.vocab = JsonInt(j, "vocab_size", 0, path);
  c.rms_eps = JsonFloat(j, "rms_norm_eps", 1e-5f, path);
  c.rope_theta = JsonFloat(j, "rope_theta", 10000.0f, path);
  c.max_positions = std::min(JsonInt(j, "max_position_embeddings", 4096, path), 32768);
  c.mask_id = JsonInt(j, "mask_token_id", 156895, path);
  c.eos_id = JsonInt(j, "eos_token_id", -1, path);
  c.pad_id = JsonInt(j, "pad_token_id", c.eos_id, path);
  c.bos_id = JsonInt(j, "bos_token_id", -1, path);
  c.eot_id = JsonInt(j, "eot_token_id", -1, path);
  c.tied_embeddings = JsonBool(j, "tie_word_embeddings", false, path);
  c.qk_norm = JsonBool(j, "qk_layernorm", true, path);
  c.qkv_bias = c.o_bias = JsonBool(j, "attention_bias", false, path);  // q, k, v and o
  c.clip_qkv = JsonFloat(j, "clip_qkv", 0.0f, path);
  if (c.clip_qkv < 0) Fail(path, ": clip_qkv must not be negative");
  if (c.heads > 0) c.rotary_dim = PartialRotaryDim(j, 1.0f, DefaultHeadDim(c, path), path);

  MoeConfig& moe = c.moe;
  moe.experts = JsonInt(j, "num_experts", 0, path);
  moe.experts_per_token = JsonInt(j, "num_experts_per_tok", 0, path);
  moe.expert_ffn = JsonInt(j, "expert_intermediate_size", 0, path);
  moe.shared_ffn = JsonInt(j, "shared_expert_intermediate_size", 0, path);
  moe.expert_bias = JsonBool(j, "moe_router_enable_expert_bias", false, path);
  if (moe.experts <= 0) Fail(path, ": num_experts must be positive");
  if (!j.contains("moe_layer_freq") || j["moe_layer_freq"].is_null()) {
    moe.moe_layers.assign(size_t(std::max(c.layers, 0)), true);
  } else {
    const nlohmann::json& freq = j["moe_layer_freq"];
    if (!freq.is_array()) Fail(path, ": moe_layer_freq must be a list of 0/1 per layer");
    for (const nlohmann::json& flag : freq) {
      if (!flag.is_number_integer() || (flag != 0 && flag != 1))
        Fail(path, ": moe_layer_freq entries must be 0 or 1");
      moe.moe_layers.push_back(flag == 1);
    }
  }
  return c;
}

nlohmann::ordered_json RandomConfig(const CheckpointShape& s) {
  nlohmann::ordered_json moe_layers = nlohmann::ordered_json::array();
  for (int l = 0; l < s.layers; ++l) moe_layers.push_back(l < s.dense_layers ? 0 : 1);
  return {
      {"model_type", "lladamoe"},
      {"architectures", {"LLaDAMoEModelLM"}},
      {"vocab_size", s.vocab},
      {"hidden_size", s.width},
      {"dense_intermediate_size", s.ffn},
      {"expert_intermediate_size", s.expert_ffn},
      {"shared_expert_intermediate_size",
       s.shared_ffn > 0 ? nlohmann::ordered_json(s.shared_ffn) : nlohmann::ordered_json()},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"hidden_act", "silu"},
      {"max_position_embeddings", s.max_positions},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", s.rope_theta},
      {"partial_rotary_factor", 1.0},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"clip_qkv", nullptr},
      {"tie_word_embeddings", false},
      {"qk_layernorm", true},
      {"num_experts", s.experts},
      {"num_experts_per_tok", s.experts_per_token},
      {"norm_topk_prob", false},
      {"moe_layer_freq", moe_layers},
      {"moe_router_enable_expert_bias", false},
      {"moe_router_score_function", "softmax"},
      {"mask_token_id", s.mask_id},
      {"eos_token_id", s.eos_id},
      {"pad_token_id", s.eos_id},
      {"bos_token_id", s.bos_id >= 0 ? nlohmann::ordered_json(s.bos_id) : nlohmann::ordered_json()},
      {"eot_token_id", s.eot_id},
      {"polestar_random_weights", true}};
}

Architecture MakeLladaMoe() {
  Architecture a;
  a.name = "llada-moe";  // llama.cpp's general.architecture
  a.model_types = {"lladamoe"};
  a.block.qkv_bias = QkvBias::kWhenConfigured;
  a.block.rope = RopeStyle::kRotateHalf;
  a.logits = LogitPositions::kSame;
  a.sampler = SamplerFamily::kLlada;
  a.hf_tensors = {.embedding = "model.embed_tokens.weight",
                  .final_norm = "model.norm.weight",
                  .lm_head = "lm_head.weight",
                  .layer_prefix = "model.layers.{}.",
                  .q = "self_attn.q_proj.weight",
                  .k = "self_attn.k_proj.weight",
                  .v = "self_attn.v_proj.weight",
                  .o = "self_attn.o_proj.weight",
                  .gate = "mlp.gate_proj.weight",
                  .up = "mlp.up_proj.weight",
                  .down = "mlp.down_proj.weight",
                  .attn_norm = "input_layernorm.weight",
                  .ffn_norm = "post_attention_layernorm.weight",
                  .q_bias = "self_attn.q_proj.bias",
                  .k_bias = "self_attn.k_proj.bias",
                  .v_bias = "self_attn.v_proj.bias",
                  .o_bias = "self_attn.o_proj.bias",
                  .q_norm = "self_attn.q_norm.weight",
                  .k_norm = "self_attn.k_norm.weight",
                  .router = "mlp.gate.weight",
                  .expert_bias = "mlp.expert_bias",
                  .expert_gate = "mlp.experts.{}.gate_proj.weight",
                  .expert_up = "mlp.experts.{}.up_proj.weight",
                  .expert_down = "mlp.experts.{}.down_proj.weight",
                  .shared_gate = "shared_expert.gate_proj.weight",
                  .shared_up = "shared_expert.up_proj.weight",
                  .shared_down = "shared_expert.down_proj.weight"};
  a.gguf_tensors = LlamaCppTensorNames();
  // llama.cpp runs LLaDA-MoE with NEOX (rotate-half) RoPE: its converter keeps q/k as they are.
  a.gguf = {.rope = RopeStyle::kRotateHalf,
            .default_mask_id = 156895,
            .tokenizer_pre = "llada-moe",
            .context_length_key = "max_position_embeddings"};
  a.parse_hf_config = ParseConfig;
  a.random_config = RandomConfig;
  a.random_shapes = {
      // LLaDA-MoE-7B-A1B's config.json: width 2048, 16 layers of 16 heads (no GQA), every
      // layer routed (64 experts of width 1024, 8 per token, no shared expert), rope_theta
      // 50000, 8192 positions; mask 156895 (as llama.cpp's converter hard-codes it) and eos
      // 156892, the ids of inclusionAI's 157184-token tokenizer.
      {"llada-moe-7b-a1b", 157184, 2048, 16, 16, 16, 8192, 8192, 50000.0f, 156895, 156892, -1, -1,
       64, 8, 1024, 0, 0},
      // A few MB, for tests: 8 experts top-2, a shared expert, the first layer dense.
      {"llada-moe-tiny", 160, 64, 3, 4, 2, 96, 512, 50000.0f, 156, 157, -1, -1, 8, 2, 32, 24, 1},
  };
  return a;
}

}  // namespace

const Architecture& LladaMoeArchitecture() {
  static const Architecture llada_moe = MakeLladaMoe();
  return llada_moe;
}

}  // namespace polestar
