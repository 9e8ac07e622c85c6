#include "model/architecture.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace polestar {

// The architecture files.
const Architecture& LladaArchitecture();
const Architecture& DreamArchitecture();
const Architecture& LladaMoeArchitecture();
const Architecture& Llada2Architecture();

const std::vector<const Architecture*>& Architectures() {
  static const std::vector<const Architecture*> registry = {
      &LladaArchitecture(), &DreamArchitecture(), &LladaMoeArchitecture(), &Llada2Architecture()};
  return registry;
}

namespace {

std::string SupportedModelTypes() {
  std::string listed;
  for (const Architecture* arch : Architectures())
    listed += (listed.empty() ? "" : ", ") + arch->model_types.front();
  return listed;
}

}  // namespace

const Architecture& ArchitectureOfHfConfig(const nlohmann::json& config,
                                           const std::string& config_path) {
  if (!config.contains("model_type") || !config["model_type"].is_string()) {
    Fail(config_path, ": no model_type string (supported: ", SupportedModelTypes(), ")");
  }
  const std::string& model_type = config["model_type"].get_ref<const std::string&>();
  for (const Architecture* arch : Architectures()) {
    for (const std::string& type : arch->model_types) {
      if (type == model_type) return *arch;
    }
  }
  Fail(config_path, ": unknown model_type '", model_type, "' (supported: ", SupportedModelTypes(),
       ")");
}

const Architecture& ArchitectureOfGguf(std::string_view name, const std::string& origin) {
  std::string listed;
  for (const Architecture* arch : Architectures()) {
    if (arch->name == name) return *arch;
    listed += (listed.empty() ? "" : ", ") + arch->name;
  }
  Fail(origin, ": general.architecture '", name, "' is not supported (", listed, ")");
}

ModelConfig ParseHfConfig(const Architecture& arch, const nlohmann::json& config,
                          const std::string& path) {
  ModelConfig c = arch.parse_hf_config(config, path);
  c.arch = &arch;
  if (arch.block.qkv_bias == QkvBias::kAlways) c.qkv_bias = true;
  c.rope_interleaved = arch.block.rope == RopeStyle::kInterleaved;
  c.shift_logits = arch.logits == LogitPositions::kNext;
  c.sampler = arch.sampler;
  if (c.head_dim == 0) c.head_dim = DefaultHeadDim(c, path);
  if (c.rotary_dim == 0) c.rotary_dim = c.head_dim;
  c.Validate(path);
  return c;
}

int DefaultHeadDim(const ModelConfig& c, const std::string& where) {
  if (c.heads <= 0) return 0;  // Validate names the head count
  if (c.width % c.heads != 0) {
    Fail(where, ": head count (", c.heads, ") must divide the hidden width (", c.width, ")");
  }
  return c.width / c.heads;
}

int PartialRotaryDim(const nlohmann::json& config, float fallback, int head_dim,
                     const std::string& path) {
  const float factor = JsonFloat(config, "partial_rotary_factor", fallback, path);
  if (!(factor > 0.0f && factor <= 1.0f)) Fail(path, ": partial_rotary_factor must lie in (0, 1]");
  const int dims = int(float(head_dim) * factor);
  if (dims == 0 && head_dim > 0) {
    Fail(path, ": partial_rotary_factor ", factor, " leaves no rotary dimension of the ", head_dim,
         "-dim heads");
  }
  return dims;
}

std::string LayerTensorName(const TensorNames& names, int layer, const std::string& leaf) {
  std::string prefix = names.layer_prefix;
  const size_t slot = prefix.find("{}");
  PS_CHECK(slot != std::string::npos);
  prefix.replace(slot, 2, std::to_string(layer));
  return prefix + leaf;
}

std::vector<CheckpointTensor> CheckpointTensors(const ModelConfig& c, const TensorNames& names) {
  using Kind = CheckpointTensor::Kind;
  const int64_t q_width = int64_t(c.heads) * c.head_dim;
  const int64_t kv_width = int64_t(c.kv_heads) * c.head_dim;
  std::vector<CheckpointTensor> tensors;
  tensors.push_back({names.embedding, {c.vocab, c.width}});
  for (int l = 0; l < c.layers; ++l) {
    auto add = [&](const std::string& leaf, std::vector<int64_t> shape, Kind kind,
                   int rope_heads = 0) {
      tensors.push_back({LayerTensorName(names, l, leaf), std::move(shape), kind, rope_heads});
    };
    add(names.attn_norm, {c.width}, Kind::kNorm);
    if (names.qkv.empty()) {
      add(names.q, {q_width, c.width}, Kind::kMatrix, c.heads);
      if (c.qkv_bias) add(names.q_bias, {q_width}, Kind::kBias, c.heads);
      add(names.k, {kv_width, c.width}, Kind::kMatrix, c.kv_heads);
      if (c.qkv_bias) add(names.k_bias, {kv_width}, Kind::kBias, c.kv_heads);
      add(names.v, {kv_width, c.width}, Kind::kMatrix);
      if (c.qkv_bias) add(names.v_bias, {kv_width}, Kind::kBias);
    } else {
      add(names.qkv, {q_width + 2 * kv_width, c.width}, Kind::kMatrix);
      if (c.qkv_bias) add(names.qkv_bias, {q_width + 2 * kv_width}, Kind::kBias);
    }
    add(names.o, {c.width, q_width}, Kind::kMatrix);
    if (c.o_bias) add(names.o_bias, {c.width}, Kind::kBias);
    if (c.qk_norm) {
      add(names.q_norm, {c.head_dim}, Kind::kNorm);
      add(names.k_norm, {c.head_dim}, Kind::kNorm);
    }
    add(names.ffn_norm, {c.width}, Kind::kNorm);
    if (!c.IsMoeLayer(l)) {
      add(names.gate, {c.ffn, c.width}, Kind::kMatrix);
      add(names.up, {c.ffn, c.width}, Kind::kMatrix);
      add(names.down, {c.width, c.ffn}, Kind::kMatrix);
      continue;
    }
    const MoeConfig& moe = c.moe;
    add(names.router, {moe.experts, c.width}, Kind::kMatrix);
    if (moe.expert_bias) add(names.expert_bias, {moe.experts}, Kind::kBias);
    // Per expert (a name with "{}" for its index) or stacked [E, rows, cols].
    auto experts = [&](const std::string& leaf, int64_t rows, int64_t cols) {
      const size_t slot = leaf.find("{}");
      if (slot == std::string::npos) return add(leaf, {moe.experts, rows, cols}, Kind::kMatrix);
      for (int e = 0; e < moe.experts; ++e) {
        std::string expert_leaf = leaf;
        add(expert_leaf.replace(slot, 2, std::to_string(e)), {rows, cols}, Kind::kMatrix);
      }
    };
    experts(names.expert_gate, moe.expert_ffn, c.width);
    experts(names.expert_up, moe.expert_ffn, c.width);
    experts(names.expert_down, c.width, moe.expert_ffn);
    if (moe.shared_ffn > 0) {
      add(names.shared_gate, {moe.shared_ffn, c.width}, Kind::kMatrix);
      add(names.shared_up, {moe.shared_ffn, c.width}, Kind::kMatrix);
      add(names.shared_down, {c.width, moe.shared_ffn}, Kind::kMatrix);
    }
  }
  tensors.push_back({names.final_norm, {c.width}, Kind::kNorm});
  if (!c.tied_embeddings) tensors.push_back({names.lm_head, {c.vocab, c.width}});
  return tensors;
}

int JsonInt(const nlohmann::json& j, const char* key, int fallback, const std::string& path) {
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

bool JsonBool(const nlohmann::json& j, const char* key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) Fail(path, ": ", key, " must be true or false");
  return j[key].get<bool>();
}

float JsonFloat(const nlohmann::json& j, const char* key, float fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) Fail(path, ": ", key, " must be a number");
  return j[key].get<float>();
}

}  // namespace polestar
