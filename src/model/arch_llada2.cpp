// LLaDA 2.x (inclusionAI's LLaDA2.0-mini / LLaDA2.1-mini, model_type llada2_moe): the
// BailingMoeV2 layout trained for block diffusion. A fused q/k/v projection (q heads, then k
// heads, then v heads), per-head RMSNorm on q and k, rotate-half RoPE on the first
// partial_rotary_factor of each head, an output projection with a bias (use_bias), and from
// layer first_k_dense_replace on a mixture of SwiGLU experts: sigmoid router in fp32 whose
// expert bias only selects, group-limited top-k (the best topk_group of n_group groups, each
// ranked by its two best experts), the weights renormalised (k > 1) and scaled by
// routed_scaling_factor, plus num_shared_experts shared experts. No logit shift.
//
// Decoded by its own sampler (SamplerFamily::kLlada2): block-causal attention, previous
// blocks' K/V final. As in the reference modeling code, score_function, norm_topk_prob and
// moe_router_enable_expert_bias are not read (the router is always sigmoid, always
// renormalises for k > 1, and always has the bias).
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "model/architecture.h"

namespace polestar {
namespace {

// A key the config class defaults when absent but that may be null (meaning "none").
std::optional<int> NullableInt(const nlohmann::json& j, const char* key, int fallback,
                               const std::string& path) {
  if (j.contains(key) && j[key].is_null()) return std::nullopt;
  return JsonInt(j, key, fallback, path);
}

ModelConfig ParseConfig(const nlohmann::json& j, const std::string& path) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    Fail(path, ": hidden_act must be silu");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    Fail(path, ": rope_scaling is not supported");
  ModelConfig c;
  c.vocab = JsonInt(j, "vocab_size", 0, path);
  c.width = JsonInt(j, "hidden_size", 0, path);
  c.ffn = JsonInt(j, "intermediate_size", 0, path);
  c.layers = JsonInt(j, "num_hidden_layers", 0, path);
  c.heads = JsonInt(j, "num_attention_heads", 0, path);
  c.kv_heads = JsonInt(j, "num_key_value_heads", 0, path);
  c.head_dim = JsonInt(j, "head_dim", 0, path);  // 0: hidden_size / heads
  c.rms_eps = JsonFloat(j, "rms_norm_eps", 1e-5f, path);
  c.rope_theta = JsonFloat(j, "rope_theta", 10000.0f, path);
  c.max_positions = std::min(JsonInt(j, "max_position_embeddings", 32768, path), 32768);
  // generate()'s defaults; the modeling code reads neither from the config.
  c.mask_id = JsonInt(j, "mask_token_id", 156895, path);
  c.eos_id = JsonInt(j, "eos_token_id", 156892, path);
  c.pad_id = JsonInt(j, "pad_token_id", c.eos_id, path);
  c.bos_id = JsonInt(j, "bos_token_id", -1, path);
  c.eot_id = JsonInt(j, "eot_token_id", -1, path);
  c.tied_embeddings = JsonBool(j, "tie_word_embeddings", false, path);
  c.qkv_bias = JsonBool(j, "use_qkv_bias", false, path);
  c.o_bias = JsonBool(j, "use_bias", true, path);
  c.qk_norm = JsonBool(j, "use_qk_norm", true, path);
  const int head_dim = c.head_dim > 0 ? c.head_dim : DefaultHeadDim(c, path);
  c.rotary_dim = PartialRotaryDim(j, 0.5f, head_dim, path);

  const std::optional<int> experts = NullableInt(j, "num_experts", 16, path);
  if (experts) {
    MoeConfig& moe = c.moe;
    moe.experts = *experts;
    moe.experts_per_token = JsonInt(j, "num_experts_per_tok", 2, path);
    moe.expert_ffn = JsonInt(j, "moe_intermediate_size", 0, path);
    moe.shared_ffn = moe.expert_ffn * NullableInt(j, "num_shared_experts", 0, path).value_or(0);
    moe.score = RouterScore::kSigmoid;
    moe.expert_bias = true;
    moe.bias_in_weights = false;
    moe.groups = JsonInt(j, "n_group", 8, path);
    moe.top_groups = JsonInt(j, "topk_group", 4, path);
    moe.normalize_top_k = moe.experts_per_token > 1;
    moe.routed_scaling = JsonFloat(j, "routed_scaling_factor", 2.5f, path);
    const int dense_layers = JsonInt(j, "first_k_dense_replace", 0, path);
    for (int l = 0; l < c.layers; ++l) moe.moe_layers.push_back(l >= dense_layers);
  }
  c.sampler = SamplerFamily::kLlada2;
  return c;
}

nlohmann::ordered_json RandomConfig(const CheckpointShape& s) {
  return {{"model_type", "llada2_moe"},
          {"architectures", {"LLaDA2MoeModelLM"}},
          {"vocab_size", s.vocab},
          {"hidden_size", s.width},
          {"intermediate_size", s.ffn},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"hidden_act", "silu"},
          {"use_qkv_bias", false},
          {"use_bias", false},
          {"use_qk_norm", true},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", s.rope_theta},
          {"partial_rotary_factor", 0.5},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", s.max_positions},
          {"tie_word_embeddings", false},
          {"num_experts", s.experts},
          {"num_experts_per_tok", s.experts_per_token},
          {"moe_intermediate_size", s.expert_ffn},
          {"num_shared_experts", s.expert_ffn > 0 ? s.shared_ffn / s.expert_ffn : 0},
          {"n_group", s.groups},
          {"topk_group", s.top_groups},
          {"routed_scaling_factor", 2.5},
          {"first_k_dense_replace", s.dense_layers},
          {"score_function", "sigmoid"},
          {"mask_token_id", s.mask_id},
          {"eos_token_id", s.eos_id},
          {"pad_token_id", s.eos_id},
          {"polestar_random_weights", true}};
}

Architecture MakeLlada2() {
  Architecture a;
  a.name = "llada2";
  a.model_types = {"llada2_moe"};
  a.block.qkv_bias = QkvBias::kWhenConfigured;
  a.block.rope = RopeStyle::kRotateHalf;
  a.logits = LogitPositions::kSame;
  a.sampler = SamplerFamily::kLlada2;
  a.hf_tensors = {.embedding = "model.word_embeddings.weight",
                  .final_norm = "model.norm.weight",
                  .lm_head = "lm_head.weight",
                  .layer_prefix = "model.layers.{}.",
                  .q = "",
                  .k = "",
                  .v = "",
                  .o = "attention.dense.weight",
                  .gate = "mlp.gate_proj.weight",
                  .up = "mlp.up_proj.weight",
                  .down = "mlp.down_proj.weight",
                  .attn_norm = "input_layernorm.weight",
                  .ffn_norm = "post_attention_layernorm.weight",
                  .q_bias = "",
                  .k_bias = "",
                  .v_bias = "",
                  .qkv = "attention.query_key_value.weight",
                  .qkv_bias = "attention.query_key_value.bias",
                  .o_bias = "attention.dense.bias",
                  .q_norm = "attention.query_layernorm.weight",
                  .k_norm = "attention.key_layernorm.weight",
                  .router = "mlp.gate.weight",
                  .expert_bias = "mlp.gate.expert_bias",
                  .expert_gate = "mlp.experts.{}.gate_proj.weight",
                  .expert_up = "mlp.experts.{}.up_proj.weight",
                  .expert_down = "mlp.experts.{}.down_proj.weight",
                  .shared_gate = "mlp.shared_experts.gate_proj.weight",
                  .shared_up = "mlp.shared_experts.up_proj.weight",
                  .shared_down = "mlp.shared_experts.down_proj.weight"};
  // llama.cpp's layout for LLaDA 2.x (architecture llada2, pending PR #17454, and the
  // community LLaDA2.0 GGUFs) follows its BailingMoeV2 converter: the fused q/k/v kept fused
  // and unpermuted (NEOX RoPE), the router F32, the expert bias as exp_probs_b, the experts
  // stacked, the head dimension and the router's switches in {arch}.* keys.
  a.gguf_tensors = LlamaCppTensorNames();
  a.gguf_tensors.qkv = "attn_qkv.weight";
  a.gguf_tensors.qkv_bias = "attn_qkv.bias";
  a.gguf = {.rope = RopeStyle::kRotateHalf,
            .default_mask_id = 156895,
            .tokenizer_pre = "bailingmoe2",
            .context_length_key = "max_position_embeddings",
            .writes_vocab_size = true,
            .writes_head_dim = true,
            .writes_router_keys = true,
            .expert_bias_in_weights = false};
  a.parse_hf_config = ParseConfig;
  a.random_config = RandomConfig;
  a.random_shapes = {
      // LLaDA2.0-mini: 20 layers (the first dense), 256 experts in 8 groups, 8 per token from
      // the best 4 groups, one shared expert.
      {"llada2-mini", 157184, 2048, 20,  16, 4,   5120, 32768, 600000.0f, 156895,
       156892,        -1,     -1,   256, 8,  512, 512,  1,     8,         4},
      // A few MB, for tests.
      {"llada2-tiny", 200, 64, 2, 4, 2, 96, 512, 10000.0f, 195, 192, -1, -1, 8, 2, 32, 32, 1, 2, 1},
  };
  return a;
}

}  // namespace

const Architecture& Llada2Architecture() {
  static const Architecture llada2 = MakeLlada2();
  return llada2;
}

}  // namespace polestar
