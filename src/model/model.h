// A loaded model: its config, and views of its weights inside the mapped checkpoint.
// Matrices stay in their file type (F32/BF16/F16, or GGUF block types); only the small
// vectors (norm weights, biases) are converted to fp32 at load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/tensor_store.h"
#include "model/architecture.h"
#include "model/config.h"
#include "ops/ops.h"

namespace polestar {

// down(silu(gate x) * up x), F wide.
struct SwiGluWeights {
  WeightView gate, up, down;  // [F, C], [F, C], [C, F]
};

struct LayerWeights {
  WeightView wq, wk, wv, wo;          // [H*D, C], [Hkv*D, C], [Hkv*D, C], [C, H*D]
  std::vector<float> attn_norm;       // [C]
  std::vector<float> ffn_norm;        // [C]
  std::vector<float> bq, bk, bv;      // [H*D], [Hkv*D], [Hkv*D]; empty without q/k/v bias
  std::vector<float> bo;              // [C]; empty without an output bias
  std::vector<float> q_norm, k_norm;  // [D] each; empty without per-head q/k norms
  SwiGluWeights mlp;                  // dense layers: F wide
  // MoE layers (ModelConfig::IsMoeLayer): the router, its bias, the routed experts (Fe wide)
  // and the shared expert (Fs wide; rows 0 without one).
  WeightView router;                   // [E, C]
  std::vector<float> expert_bias;      // [E]; empty without
  std::vector<SwiGluWeights> experts;  // [E]
  SwiGluWeights shared;
};

class Model {
 public:
  // `path` is a Hugging Face folder (config.json + safetensors) or a .gguf file.
  static std::unique_ptr<Model> Load(const std::string& path);
  // Binds weights from `store` under `names`, checking every shape against `config`.
  Model(TensorStore store, ModelConfig config, const TensorNames& names, std::string source);

  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(int index) const { return layers_[size_t(index)]; }
  const WeightView& embedding() const { return embedding_; }            // [V, C]
  const WeightView& lm_head() const { return lm_head_; }                // [V, C]
  const std::vector<float>& final_norm() const { return final_norm_; }  // [C]
  const RopeTable& rope() const { return rope_; }
  const TensorStore& tensors() const { return store_; }
  const std::string& source() const { return source_; }
  int64_t ParameterCount() const;

 private:
  TensorStore store_;
  ModelConfig config_;
  std::string source_;
  std::vector<LayerWeights> layers_;
  WeightView embedding_, lm_head_;
  std::vector<float> final_norm_;
  RopeTable rope_;
};

// A GGUF file (arch_gguf.cpp): llama.cpp's layout of any registered architecture.
std::unique_ptr<Model> LoadGgufModel(const std::string& path);

}  // namespace polestar
