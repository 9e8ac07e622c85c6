// A loaded model: its config, and views of its weights inside the mapped checkpoint.
// Matrices stay in their file type (F32/BF16/F16, or GGUF block types); only the small
// vectors (norm weights, biases) are converted to fp32 at load.
//
// The forward never reads these host weights: it reads the model's weights bound to the
// backend it runs on (ResidentWeights, from Model::On), which a backend that computes in host
// memory (the CPU) binds as the same views, without a copy, and any other copies into its own
// memory once.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/tensor_store.h"
#include "model/architecture.h"
#include "model/config.h"

namespace polestar {

// down(silu(gate x) * up x), F wide.
struct SwiGluWeights {
  WeightView gate, up, down;  // [F, C], [F, C], [C, F]
};

// fp32 vectors (norm weights, biases), viewed where their owner keeps them.
using FloatsView = std::span<const float>;

struct LayerWeights {
  WeightView wq, wk, wv, wo;  // [H*D, C], [Hkv*D, C], [Hkv*D, C], [C, H*D]
  FloatsView attn_norm;       // [C]
  FloatsView ffn_norm;        // [C]
  FloatsView bq, bk, bv;      // [H*D], [Hkv*D], [Hkv*D]; empty without q/k/v bias
  FloatsView bo;              // [C]; empty without an output bias
  FloatsView q_norm, k_norm;  // [D] each; empty without per-head q/k norms
  SwiGluWeights mlp;          // dense layers: F wide
  // MoE layers (ModelConfig::IsMoeLayer): the router, its bias, the routed experts (Fe wide)
  // and the shared expert (Fs wide; rows 0 without one).
  WeightView router;                   // [E, C]
  FloatsView expert_bias;              // [E]; empty without
  std::vector<SwiGluWeights> experts;  // [E]
  SwiGluWeights shared;
};

// Every weight of a model in one backend's memory, laid out as the model's own.
struct ResidentWeights {
  const Backend* backend = nullptr;
  std::vector<LayerWeights> layers;
  WeightView embedding, lm_head;  // [V, C] each
  FloatsView final_norm;          // [C]
  RopeTable rope;
  std::vector<Buffer> copies;  // the backend's copies (none where it views host memory)
  int64_t bytes = 0;           // bytes copied to the backend at binding
};

class Model {
 public:
  // `path` is a Hugging Face folder (config.json + safetensors) or a .gguf file.
  static std::unique_ptr<Model> Load(const std::string& path);
  // Binds weights from `store` under `names`, checking every shape against `config`.
  Model(TensorStore store, ModelConfig config, const TensorNames& names, std::string source);

  const ModelConfig& config() const { return config_; }
  // Host weights, for loading, conversion and tests; the forward reads On(backend)'s.
  const LayerWeights& layer(int index) const { return host_.layers[size_t(index)]; }
  const WeightView& embedding() const { return host_.embedding; }  // [V, C]
  const WeightView& lm_head() const { return host_.lm_head; }      // [V, C]
  FloatsView final_norm() const { return host_.final_norm; }       // [C]
  const RopeTable& rope() const { return host_.rope; }
  const TensorStore& tensors() const { return store_; }
  const std::string& source() const { return source_; }
  int64_t ParameterCount() const;

  // The backend this model's sequences run on unless told otherwise (MakeCache): the default
  // (DefaultBackendSpec(), backend/registry.h) until UseBackend names another (--backend).
  const Backend& backend() const;
  void UseBackend(const Backend& backend);
  // The weights bound to `backend`, bound on first use (thread-safe) and kept for the
  // model's life.
  const ResidentWeights& On(const Backend& backend) const;

 private:
  // A vector of the checkpoint converted to fp32, kept for the model's life.
  FloatsView Keep(std::vector<float> values);

  TensorStore store_;
  ModelConfig config_;
  std::string source_;
  std::vector<std::unique_ptr<const std::vector<float>>> vectors_;  // what host_ views
  ResidentWeights host_;  // views of the mapped file and of vectors_
  const Backend* backend_ = nullptr;
  mutable std::mutex binding_;
  mutable std::map<const Backend*, std::unique_ptr<ResidentWeights>> resident_;
};

// A GGUF file (arch_gguf.cpp): llama.cpp's layout of any registered architecture.
std::unique_ptr<Model> LoadGgufModel(const std::string& path);

}  // namespace polestar
