// The trainer's LLaDA model: all parameters in one flat fp32 buffer (so AdamW, clipping and
// checkpoints are single loops), a forward pass that keeps every activation, and the
// hand-written backward. Exported as a LLaDA checkpoint (config.json + model.safetensors
// with the real tensor names) that Model::Load reads.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace polestar::train {

struct TinyConfig {
  int vocab = 0, width = 128, layers = 4, heads = 4, ffn = 384, max_positions = 256;
  float rms_eps = 1e-5f, rope_theta = 10000.0f;
  int mask_id = -1, eos_id = -1, pad_id = -1;

  int head_dim() const { return width / heads; }
  // LLaDA's config.json (the key set of LLaDA-8B-Instruct's, with this model's values).
  nlohmann::ordered_json LladaJson() const;
  void Validate() const;
};

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  bool decay = true;  // weight decay applies to matrices, not to norm weights
  int64_t size() const;
};

// Offsets of one block's parameters in the flat buffer. q|k|v and gate|up are stored
// stacked so each pair/triple is one matrix product; Export splits them.
struct LayerOffsets {
  int64_t attn_norm, qkv, attn_out, ffn_norm, gate_up, down;
};

// A packed batch: sequences concatenated without padding.
struct Batch {
  std::vector<int> tokens;       // [M] model input (answer tokens replaced by the mask id)
  std::vector<int> positions;    // [M] position within its sequence
  std::vector<int> starts;       // [B+1] row offsets of the sequences
  std::vector<int> target_rows;  // [R] masked rows that carry loss
  std::vector<int> targets;      // [R] their true tokens
  std::vector<float> weights;    // [R] loss weight (1/t / gen_length / B for LLaDA SFT)
};

class TinyModel {
 public:
  explicit TinyModel(const TinyConfig& config);

  // Normal(0, 0.02) matrices (output projections scaled by 1/sqrt(2 * layers)), unit norms.
  void Init(uint64_t seed);

  const TinyConfig& config() const { return config_; }
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  int64_t ParameterCount() const { return int64_t(params_.size()); }

  // Writes config.json and model.safetensors (F32) into `dir`.
  void Export(const std::string& dir) const;
  // Reads the parameters back from the model.safetensors that Export wrote (or any LLaDA
  // checkpoint of this shape in F32); throws Error naming the tensor that is missing or of
  // another shape. A source with fewer blocks grows this model in depth (see the .cpp); call
  // Init first, which the blocks it adds keep.
  void Import(const std::string& dir);

  // Forward (and, with grads non-null, backward accumulated into grads[params]).
  // Returns the weighted loss over the batch's target rows; logits of the target rows
  // [R, V] go to *logits when given (forward only).
  double Run(const Batch& batch, float* grads, std::vector<float>* logits = nullptr);

 private:
  int64_t Add(std::string name, std::vector<int64_t> shape, bool decay);
  // The checkpoint's tensors (the stacked q|k|v and gate|up matrices split into LLaDA's
  // q/k/v and ff_proj/up_proj) as (name, shape, offset in params_).
  void ForEachCheckpointTensor(
      const std::function<void(const std::string&, std::vector<int64_t>, int64_t)>& visit) const;

  TinyConfig config_;
  std::vector<float> params_;
  std::vector<ParamTensor> tensors_;
  int64_t embedding_ = 0, final_norm_ = 0, lm_head_ = 0;
  std::vector<LayerOffsets> layers_;
  RopeTable rope_;

  // Activations kept for the backward, per layer l: [M, ...] unless noted.
  struct LayerActs {
    std::vector<float> x, h1, inv1, qkv, probs, attn, x_mid, h2, inv2, gu, act;
  };
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, h_final_, inv_final_, h_target_, logits_;
  // Backward scratch.
  std::vector<float> dx_, dh_, dqkv_, dattn_, dgu_, dact_, dh_target_;
};

}  // namespace polestar::train
