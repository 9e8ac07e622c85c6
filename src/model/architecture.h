// One descriptor per model architecture, each defined in its own arch_*.cpp file and listed
// in the registry (architecture.cpp). A descriptor says everything the rest of src/model/
// needs about a family: how config.json becomes a ModelConfig, its tensor names in Hugging
// Face and GGUF layouts, its block structure, how its logits map to canvas positions, what
// the GGUF converter writes for it, and the config.json of a random checkpoint of its kind.
// Code outside src/model/ never branches on the architecture: it reads ModelConfig (sampler,
// logit rows) and prints the architecture's name.
//
// Adding an architecture: a new arch_<name>.cpp defining `const Architecture&
// <Name>Architecture()`, one line for it in the registry and in src/model/CMakeLists.txt,
// and its fixtures; the registry tests then round-trip it like every other.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace polestar {

// Tensor names of one checkpoint layout; `layer_prefix` contains "{}" for the layer index.
struct TensorNames {
  std::string embedding, final_norm, lm_head, layer_prefix;
  std::string q, k, v, o, gate, up, down, attn_norm, ffn_norm, q_bias, k_bias, v_bias;
  // Only for architectures with fused q/k/v projections (rows: the H q heads, then the Hkv k
  // heads, then the Hkv v heads; when set, q/k/v and their biases are unused), an output
  // bias, per-head q/k norms or mixtures of experts:
  std::string qkv = {}, qkv_bias = {}, o_bias = {};
  std::string q_norm = {}, k_norm = {};       // per-head norm weights [D]
  std::string router = {}, expert_bias = {};  // [E, C], [E]
  // The routed experts' SwiGLU matrices: with "{}" (the expert index), one [Fe, C] or
  // [C, Fe] tensor per expert (Hugging Face); without, one stacked [E, Fe, C] or [E, C, Fe]
  // tensor (llama.cpp).
  std::string expert_gate = {}, expert_up = {}, expert_down = {};
  std::string shared_gate = {}, shared_up = {}, shared_down = {};
};

enum class NormKind { kRms };
// kPre: norm(x) feeds attention and the MLP, each inside a residual (Llama-style blocks).
enum class NormPlacement { kPre };
// Whether q/k/v projections carry biases: always (Qwen2), or when the config asks for them.
enum class QkvBias { kWhenConfigured, kAlways };
// kRotateHalf pairs dimensions (i, i + D/2) of each head, kInterleaved pairs (2i, 2i + 1).
enum class RopeStyle { kRotateHalf, kInterleaved };
// Which rows a query row attends to. Diffusion models attend both ways; LLaDA 2.x's
// block-causal attention will be a second pattern.
enum class AttentionPattern { kBidirectional };
// Which canvas position output row r predicts: r itself, or r + 1 (logits shifted right).
enum class LogitPositions { kSame, kNext };

struct BlockStructure {
  NormKind norm = NormKind::kRms;
  NormPlacement norm_placement = NormPlacement::kPre;
  QkvBias qkv_bias = QkvBias::kWhenConfigured;
  RopeStyle rope = RopeStyle::kRotateHalf;  // in the Hugging Face checkpoint
  AttentionPattern attention = AttentionPattern::kBidirectional;
};

// What llama.cpp's converter for this architecture writes, and what a GGUF reader assumes
// when a key is absent.
struct GgufLayout {
  // kInterleaved: the converter permutes each head's q/k rows so that the checkpoint's
  // rotate-half RoPE becomes interleaved, and GGUF files run interleaved RoPE.
  RopeStyle rope = RopeStyle::kRotateHalf;
  int default_mask_id = -1;          // without tokenizer.ggml.mask_token_id
  std::string tokenizer_pre;         // tokenizer.ggml.pre when a tokenizer.json is converted
  std::string context_length_key;    // config.json key written, uncapped, as *.context_length
  bool writes_vocab_size = false;    // {name}.vocab_size
  bool writes_shift_logits = false;  // diffusion.shift_logits
  bool adds_bos_token = false;       // tokenizer.ggml.add_bos_token = true
  // {name}.attention.key_length / value_length (the head dimension, which may differ from
  // C / H); read whenever present.
  bool writes_head_dim = false;
  // llama.cpp's BailingMoeV2 router keys: {name}.expert_gating_func (1 softmax, 2 sigmoid),
  // expert_weights_norm, expert_weights_scale, expert_group_count, expert_group_used_count,
  // expert_shared_count and leading_dense_block_count. Written by the converter and required
  // by the reader; without them the router is MoeConfig's default (softmax, no grouping).
  bool writes_router_keys = false;
  // Whether the expert bias (exp_probs_b) stays in the routing weights or only selects: fixed
  // by the architecture's modeling code, no GGUF key records it.
  bool expert_bias_in_weights = true;
};

// The sizes of a checkpoint: what make-random-model needs to write one.
struct CheckpointShape {
  std::string name;  // "llada-8b"
  int vocab = 0, width = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0;
  int max_positions = 4096;
  float rope_theta = 10000.0f;
  int mask_id = 0, eos_id = 0, bos_id = -1, eot_id = -1;
  // Mixture of experts (experts > 0): routed experts, their inner width, the shared expert's
  // (0: none), and how many leading layers stay dense (ffn wide).
  int experts = 0, experts_per_token = 0, expert_ffn = 0, shared_ffn = 0, dense_layers = 0;
  int groups = 1, top_groups = 1;  // expert groups, and how many a row may route to
};

struct Architecture {
  std::string name;  // printed; GGUF general.architecture and the prefix of its keys
  // config.json model_type values that select this architecture; errors list the first.
  std::vector<std::string> model_types;
  BlockStructure block;
  LogitPositions logits = LogitPositions::kSame;
  SamplerFamily sampler = SamplerFamily::kLlada;
  TensorNames hf_tensors, gguf_tensors;
  GgufLayout gguf;
  // config.json -> the sizes, special ids and options of a ModelConfig (ParseHfConfig adds
  // what the descriptor fixes and validates). Throws Error, prefixed with `path`, for
  // options the model does not implement.
  ModelConfig (*parse_hf_config)(const nlohmann::json& config, const std::string& path);
  // The config.json of a random-weight checkpoint of `shape`, in this architecture's format.
  nlohmann::ordered_json (*random_config)(const CheckpointShape& shape);
  std::vector<CheckpointShape> random_shapes;  // make-random-model --like presets
};

// Every registered architecture, in registry order.
const std::vector<const Architecture*>& Architectures();
// The architecture of a config.json (its model_type); throws Error prefixed with
// `config_path` that lists the supported model types when there is none.
const Architecture& ArchitectureOfHfConfig(const nlohmann::json& config,
                                           const std::string& config_path);
// The architecture a GGUF file's general.architecture names; throws Error prefixed with
// `origin` that lists the registered names when there is none.
const Architecture& ArchitectureOfGguf(std::string_view name, const std::string& origin);
// A validated ModelConfig from a config.json of `arch`.
ModelConfig ParseHfConfig(const Architecture& arch, const nlohmann::json& config,
                          const std::string& path);

// One tensor of a checkpoint in file order (llama.cpp's: embedding, blocks, final norm, head).
struct CheckpointTensor {
  enum class Kind { kMatrix, kNorm, kBias };
  std::string name;
  std::vector<int64_t> shape;  // [rows, cols], [E, rows, cols] (stacked experts) or [n]
  Kind kind = Kind::kMatrix;
  int rope_heads = 0;  // q/k weights and biases: the heads their rows are grouped in
};
// The tensors a checkpoint of config `c` holds under `names` (without an LM head when tied).
std::vector<CheckpointTensor> CheckpointTensors(const ModelConfig& c, const TensorNames& names);
// llama.cpp's tensor names (token_embd, blk.N.attn_q, ...), which its converters write for
// every registered architecture (arch_gguf.cpp).
TensorNames LlamaCppTensorNames();
// C / H, the head dimension of configs that do not give one; throws Error prefixed with
// `where` when H does not divide C.
int DefaultHeadDim(const ModelConfig& c, const std::string& where);
// The rotary dims of a `head_dim` head per partial_rotary_factor (`fallback` when absent), as
// Hugging Face's default RoPE init counts them: int(head_dim * factor). Throws Error prefixed
// with `path` for a factor outside (0, 1] or one that leaves no dims (never a silent full RoPE).
int PartialRotaryDim(const nlohmann::json& config, float fallback, int head_dim,
                     const std::string& path);
// `names.layer_prefix` + `leaf` for layer `layer`.
std::string LayerTensorName(const TensorNames& names, int layer, const std::string& leaf);

// config.json values, with `fallback` when the key is absent or null; throw Error prefixed
// with `path` for a value of the wrong type (or an integer outside int).
int JsonInt(const nlohmann::json& j, const char* key, int fallback, const std::string& path);
bool JsonBool(const nlohmann::json& j, const char* key, bool fallback, const std::string& path);
float JsonFloat(const nlohmann::json& j, const char* key, float fallback, const std::string& path);

}  // namespace polestar
