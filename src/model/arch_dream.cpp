// Dream (Dream-v0-Instruct-7B): the Qwen2 layout with q/k/v biases and GQA, run without a
// causal mask. Its logits are shifted right by one (position p is predicted by output
// p-1); the forward returns raw per-position outputs and the sampler applies the shift.
#include <limits>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/json_file.h"
#include "model/model.h"

namespace polestar {
namespace {

int IntOr(const nlohmann::json& j, const char* key, int fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const nlohmann::json& value = j[key];
  if (!value.is_number_integer()) Fail(path, ": ", key, " must be an integer");
  const bool fits = value.is_number_unsigned()
                        ? value.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                        : value.get<int64_t>() >= std::numeric_limits<int>::min() &&
                              value.get<int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) Fail(path, ": ", key, " = ", value.dump(), " is out of range");
  return value.get<int>();
}

bool BoolOr(const nlohmann::json& j, const char* key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) Fail(path, ": ", key, " must be true or false");
  return j[key].get<bool>();
}

}  // namespace

ModelConfig ParseDreamConfig(const std::string& path) {
  const nlohmann::json j = ReadJsonFile(path);
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    Fail(path, ": hidden_act must be silu");
  if (BoolOr(j, "use_sliding_window", false, path))
    Fail(path, ": sliding-window attention is not supported");
  ModelConfig c;
  c.arch = Arch::kDream;
  c.width = IntOr(j, "hidden_size", 0, path);
  c.heads = IntOr(j, "num_attention_heads", 0, path);
  c.kv_heads = IntOr(j, "num_key_value_heads", c.heads, path);
  c.layers = IntOr(j, "num_hidden_layers", 0, path);
  c.ffn = IntOr(j, "intermediate_size", 0, path);
  c.vocab = IntOr(j, "vocab_size", 0, path);
  c.rms_eps = j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()
                  ? j["rms_norm_eps"].get<float>()
                  : 1e-6f;
  c.rope_theta =
      j.contains("rope_theta") && j["rope_theta"].is_number() ? j["rope_theta"].get<float>() : 1e6f;
  // Dream's README caps prompt + output at 2048 even though the Qwen2.5 config says more.
  c.max_positions = std::min(IntOr(j, "max_position_embeddings", 2048, path), 32768);
  c.mask_id = IntOr(j, "mask_token_id", 151666, path);
  c.eos_id = IntOr(j, "eos_token_id", 151643, path);
  c.pad_id = IntOr(j, "pad_token_id", c.eos_id, path);
  c.bos_id = IntOr(j, "bos_token_id", -1, path);
  c.eot_id = IntOr(j, "eot_token_id", -1, path);
  c.qkv_bias = true;
  c.tied_embeddings = BoolOr(j, "tie_word_embeddings", false, path);
  c.shift_logits = true;
  c.sampler = SamplerFamily::kDream;
  c.head_dim = c.heads > 0 ? c.width / c.heads : 0;
  c.Validate(path);
  return c;
}

TensorNames DreamTensorNames() {
  TensorNames n;
  n.embedding = "model.embed_tokens.weight";
  n.final_norm = "model.norm.weight";
  n.lm_head = "lm_head.weight";
  n.layer_prefix = "model.layers.{}.";
  n.q = "self_attn.q_proj.weight";
  n.k = "self_attn.k_proj.weight";
  n.v = "self_attn.v_proj.weight";
  n.o = "self_attn.o_proj.weight";
  n.gate = "mlp.gate_proj.weight";
  n.up = "mlp.up_proj.weight";
  n.down = "mlp.down_proj.weight";
  n.attn_norm = "input_layernorm.weight";
  n.ffn_norm = "post_attention_layernorm.weight";
  n.q_bias = "self_attn.q_proj.bias";
  n.k_bias = "self_attn.k_proj.bias";
  n.v_bias = "self_attn.v_proj.bias";
  return n;
}

}  // namespace polestar
