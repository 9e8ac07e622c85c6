// LLaDA (LLaDA-8B-Instruct, LLaDA-1.5): Llama-style blocks without a causal mask, no
// biases, rotate-half RoPE, SwiGLU with ff_proj as the gate and block-level ff_out as the
// down projection; transformer.ff_out is the LM head. No logit shift.
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/architecture.h"

namespace polestar {
namespace {

ModelConfig ParseConfig(const nlohmann::json& j, const std::string& path) {
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
  c.width = JsonInt(j, "d_model", 0, path);
  c.heads = JsonInt(j, "n_heads", 0, path);
  c.kv_heads = JsonInt(j, "n_kv_heads", c.heads, path);
  c.layers = JsonInt(j, "n_layers", 0, path);
  c.ffn = JsonInt(j, "mlp_hidden_size", c.width * JsonInt(j, "mlp_ratio", 4, path), path);
  c.vocab = JsonInt(j, "embedding_size", JsonInt(j, "vocab_size", 0, path), path);
  c.rms_eps = JsonFloat(j, "rms_norm_eps", 1e-5f, path);
  c.rope_theta = JsonFloat(j, "rope_theta", 10000.0f, path);
  c.max_positions = JsonInt(j, "max_sequence_length", 4096, path);
  c.mask_id = JsonInt(j, "mask_token_id", 126336, path);
  c.eos_id = JsonInt(j, "eos_token_id", -1, path);
  c.pad_id = JsonInt(j, "pad_token_id", c.eos_id, path);
  c.bos_id = JsonInt(j, "bos_token_id", -1, path);
  c.eot_id = JsonInt(j, "eot_token_id", -1, path);
  c.qkv_bias = JsonBool(j, "include_qkv_bias", false, path);
  c.tied_embeddings = JsonBool(j, "weight_tying", false, path);
  return c;
}

nlohmann::ordered_json RandomConfig(const CheckpointShape& s) {
  return {{"model_type", "llada"},
          {"architectures", {"LLaDAModelLM"}},
          {"d_model", s.width},
          {"n_heads", s.heads},
          {"n_kv_heads", s.kv_heads},
          {"n_layers", s.layers},
          {"mlp_hidden_size", s.ffn},
          {"activation_type", "silu"},
          {"block_type", "llama"},
          {"layer_norm_type", "rms"},
          {"rms_norm_eps", 1e-5},
          {"rope", true},
          {"rope_theta", s.rope_theta},
          {"max_sequence_length", s.max_positions},
          {"vocab_size", s.vocab},
          {"embedding_size", s.vocab},
          {"include_bias", false},
          {"include_qkv_bias", false},
          {"weight_tying", false},
          {"mask_token_id", s.mask_id},
          {"eos_token_id", s.eos_id},
          {"pad_token_id", s.eos_id},
          {"bos_token_id", s.bos_id},
          {"eot_token_id", s.eot_id},
          {"polestar_random_weights", true}};
}

Architecture MakeLlada() {
  Architecture a;
  a.name = "llada";
  a.model_types = {"llada"};
  a.block.qkv_bias = QkvBias::kWhenConfigured;  // include_qkv_bias
  a.block.rope = RopeStyle::kRotateHalf;
  a.logits = LogitPositions::kSame;
  a.sampler = SamplerFamily::kLlada;
  a.hf_tensors = {.embedding = "model.transformer.wte.weight",
                  .final_norm = "model.transformer.ln_f.weight",
                  .lm_head = "model.transformer.ff_out.weight",
                  .layer_prefix = "model.transformer.blocks.{}.",
                  .q = "q_proj.weight",
                  .k = "k_proj.weight",
                  .v = "v_proj.weight",
                  .o = "attn_out.weight",
                  .gate = "ff_proj.weight",
                  .up = "up_proj.weight",
                  .down = "ff_out.weight",
                  .attn_norm = "attn_norm.weight",
                  .ffn_norm = "ff_norm.weight",
                  .q_bias = "q_proj.bias",
                  .k_bias = "k_proj.bias",
                  .v_bias = "v_proj.bias"};
  a.gguf_tensors = LlamaCppTensorNames();
  a.gguf = {.rope = RopeStyle::kInterleaved,
            .default_mask_id = 126336,
            // llama.cpp names the pre-tokenizer by hashing a probe tokenisation; LLaDA's is
            // the Llama-3 style regex.
            .tokenizer_pre = "llama-bpe",
            .context_length_key = "max_sequence_length",
            .writes_vocab_size = true,
            .writes_shift_logits = true,
            .adds_bos_token = true};
  a.parse_hf_config = ParseConfig;
  a.random_config = RandomConfig;
  a.random_shapes = {
      // LLaDA-8B-Instruct (model_specs.md §1).
      {"llada-8b", 126464, 4096, 32, 32, 32, 12288, 4096, 500000.0f, 126336, 126081, 126080,
       126348},
      // A ~1.3B LLaDA-shaped model (0.8B in the blocks, 0.5B in embedding and LM head).
      {"llada-1b", 126464, 2048, 16, 16, 16, 5632, 4096, 500000.0f, 126336, 126081, 126080, 126348},
      // A few MB, for tests.
      {"llada-tiny", 128, 64, 2, 4, 4, 128, 512, 10000.0f, 126, 125, 124, 123},
  };
  return a;
}

}  // namespace

const Architecture& LladaArchitecture() {
  static const Architecture llada = MakeLlada();
  return llada;
}

}  // namespace polestar
