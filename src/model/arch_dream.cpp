// Dream (Dream-v0-Instruct-7B): the Qwen2 layout with q/k/v biases and GQA, run without a
// causal mask. Its logits are shifted right by one (position p is predicted by output
// p-1); the forward returns raw per-position outputs and the sampler applies the shift.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/architecture.h"

namespace polestar {
namespace {

ModelConfig ParseConfig(const nlohmann::json& j, const std::string& path) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    Fail(path, ": hidden_act must be silu");
  if (JsonBool(j, "use_sliding_window", false, path))
    Fail(path, ": sliding-window attention is not supported");
  ModelConfig c;
  c.width = JsonInt(j, "hidden_size", 0, path);
  c.heads = JsonInt(j, "num_attention_heads", 0, path);
  c.kv_heads = JsonInt(j, "num_key_value_heads", c.heads, path);
  c.layers = JsonInt(j, "num_hidden_layers", 0, path);
  c.ffn = JsonInt(j, "intermediate_size", 0, path);
  c.vocab = JsonInt(j, "vocab_size", 0, path);
  c.rms_eps = j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()
                  ? j["rms_norm_eps"].get<float>()
                  : 1e-6f;
  c.rope_theta =
      j.contains("rope_theta") && j["rope_theta"].is_number() ? j["rope_theta"].get<float>() : 1e6f;
  // Dream's README caps prompt + output at 2048 even though the Qwen2.5 config says more.
  c.max_positions = std::min(JsonInt(j, "max_position_embeddings", 2048, path), 32768);
  c.mask_id = JsonInt(j, "mask_token_id", 151666, path);
  c.eos_id = JsonInt(j, "eos_token_id", 151643, path);
  c.pad_id = JsonInt(j, "pad_token_id", c.eos_id, path);
  c.bos_id = JsonInt(j, "bos_token_id", -1, path);
  c.eot_id = JsonInt(j, "eot_token_id", -1, path);
  c.tied_embeddings = JsonBool(j, "tie_word_embeddings", false, path);
  return c;
}

nlohmann::ordered_json RandomConfig(const CheckpointShape& s) {
  return {{"model_type", "Dream"},
          {"architectures", {"DreamModel"}},
          {"hidden_size", s.width},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"num_hidden_layers", s.layers},
          {"intermediate_size", s.ffn},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", s.rope_theta},
          {"max_position_embeddings", s.max_positions},
          {"vocab_size", s.vocab},
          {"tie_word_embeddings", false},
          {"use_sliding_window", false},
          {"mask_token_id", s.mask_id},
          {"eos_token_id", s.eos_id},
          {"pad_token_id", s.eos_id},
          {"bos_token_id", s.bos_id},
          {"eot_token_id", s.eot_id},
          {"torch_dtype", "bfloat16"},
          {"polestar_random_weights", true}};
}

Architecture MakeDream() {
  Architecture a;
  a.name = "dream";
  a.model_types = {"Dream", "dream"};
  a.block.qkv_bias = QkvBias::kAlways;
  a.block.rope = RopeStyle::kRotateHalf;
  a.logits = LogitPositions::kNext;
  a.sampler = SamplerFamily::kDream;
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
                  .v_bias = "self_attn.v_proj.bias"};
  a.gguf_tensors = LlamaCppTensorNames();
  a.gguf = {.rope = RopeStyle::kRotateHalf,
            .default_mask_id = 151666,
            .tokenizer_pre = "qwen2",  // the Qwen2 pre-tokenizer regex
            // The config's own value: ParseConfig caps max_positions for the RoPE table.
            .context_length_key = "max_position_embeddings"};
  a.parse_hf_config = ParseConfig;
  a.random_config = RandomConfig;
  a.random_shapes = {
      // Dream-v0-Instruct-7B: Qwen2.5-7B layout, GQA 28/4.
      {"dream-7b", 152064, 3584, 28, 28, 4, 18944, 2048, 1000000.0f, 151666, 151643, 151665,
       151645},
      {"dream-tiny", 128, 64, 2, 4, 2, 128, 512, 1000000.0f, 126, 125, 124, 123},
  };
  return a;
}

}  // namespace

const Architecture& DreamArchitecture() {
  static const Architecture dream = MakeDream();
  return dream;
}

}  // namespace polestar
