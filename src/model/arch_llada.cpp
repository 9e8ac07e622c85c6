// LLaDA (LLaDA-8B-Instruct, LLaDA-1.5): Llama-style blocks without a causal mask, no
// biases, rotate-half RoPE, SwiGLU with ff_proj as the gate and block-level ff_out as the
// down projection; transformer.ff_out is the LM head. No logit shift.
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

float FloatOr(const nlohmann::json& j, const char* key, float fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) Fail(path, ": ", key, " must be a number");
  return j[key].get<float>();
}

}  // namespace

ModelConfig ParseLladaConfig(const std::string& path) {
  const nlohmann::json j = ReadJsonFile(path);
  auto expect = [&](const char* key, const char* value) {
    if (j.contains(key) && j[key].is_string() && j[key] != value) {
      Fail(path, ": unsupported ", key, " '", j[key].get<std::string>(), "' (expected ", value,
           ")");
    }
  };
  expect("block_type", "llama");
  expect("layer_norm_type", "rms");
  expect("activation_type", "silu");
  for (const char* flag :
       {"alibi", "attention_layer_norm", "include_bias", "scale_logits", "input_emb_norm"}) {
    if (j.contains(flag) && j[flag].is_boolean() && j[flag].get<bool>()) {
      Fail(path, ": LLaDA option ", flag, "=true is not supported");
    }
  }
  if (j.contains("rope") && j["rope"].is_boolean() && !j["rope"].get<bool>()) {
    Fail(path, ": LLaDA without RoPE is not supported");
  }
  ModelConfig c;
  c.arch = Arch::kLlada;
  c.width = IntOr(j, "d_model", 0, path);
  c.heads = IntOr(j, "n_heads", 0, path);
  c.kv_heads = IntOr(j, "n_kv_heads", c.heads, path);
  c.layers = IntOr(j, "n_layers", 0, path);
  c.ffn = IntOr(j, "mlp_hidden_size", c.width * IntOr(j, "mlp_ratio", 4, path), path);
  c.vocab = IntOr(j, "embedding_size", IntOr(j, "vocab_size", 0, path), path);
  c.rms_eps = FloatOr(j, "rms_norm_eps", 1e-5f, path);
  c.rope_theta = FloatOr(j, "rope_theta", 10000.0f, path);
  c.max_positions = IntOr(j, "max_sequence_length", 4096, path);
  c.mask_id = IntOr(j, "mask_token_id", 126336, path);
  c.eos_id = IntOr(j, "eos_token_id", -1, path);
  c.pad_id = IntOr(j, "pad_token_id", c.eos_id, path);
  c.bos_id = IntOr(j, "bos_token_id", -1, path);
  c.eot_id = IntOr(j, "eot_token_id", -1, path);
  c.qkv_bias = BoolOr(j, "include_qkv_bias", false, path);
  c.tied_embeddings = BoolOr(j, "weight_tying", false, path);
  c.head_dim = c.heads > 0 ? c.width / c.heads : 0;
  c.Validate(path);
  return c;
}

TensorNames LladaTensorNames() {
  TensorNames n;
  n.embedding = "model.transformer.wte.weight";
  n.final_norm = "model.transformer.ln_f.weight";
  n.lm_head = "model.transformer.ff_out.weight";
  n.layer_prefix = "model.transformer.blocks.{}.";
  n.q = "q_proj.weight";
  n.k = "k_proj.weight";
  n.v = "v_proj.weight";
  n.o = "attn_out.weight";
  n.gate = "ff_proj.weight";
  n.up = "up_proj.weight";
  n.down = "ff_out.weight";
  n.attn_norm = "attn_norm.weight";
  n.ffn_norm = "ff_norm.weight";
  n.q_bias = "q_proj.bias";
  n.k_bias = "k_proj.bias";
  n.v_bias = "v_proj.bias";
  return n;
}

}  // namespace polestar
