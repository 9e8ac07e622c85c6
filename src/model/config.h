// The architecture-independent description of a model, filled from its config file
// (config.json or GGUF metadata) by its architecture's descriptor (model/architecture.h).
#pragma once

#include <string>
#include <vector>

#include "ops/ops.h"

namespace polestar {

struct Architecture;

// Whose reference sampler decodes a checkpoint: LLaDA's generate.py (low-confidence or
// random remasking), Dream's diffusion_generate (its --alg samplers and time schedule), or
// LLaDA 2.x's generate (block diffusion: blocks aligned from position 0, attention causal
// across blocks, per-block threshold commits). Decoding code asks this, never the
// architecture.
enum class SamplerFamily { kLlada, kDream, kLlada2 };

// A mixture-of-experts MLP (LLaDA-MoE, LLaDA 2.x): per row, a router picks
// `experts_per_token` of `experts` SwiGLU experts by score plus `expert_bias` (when the
// checkpoint has one), among the best `top_groups` of `groups` expert groups, and weights
// them as ops.h RouterSpec says. A shared expert, when `shared_ffn` > 0, adds its SwiGLU of
// the same input to every row.
struct MoeConfig {
  int experts = 0;            // E; 0: a dense model
  int experts_per_token = 0;  // k
  int expert_ffn = 0;         // Fe: each routed expert's inner width
  int shared_ffn = 0;         // Fs: the shared expert's inner width, 0 without one
  RouterScore score = RouterScore::kSoftmax;
  bool expert_bias = false;
  bool bias_in_weights = true;  // the bias stays in the weights (LLaDA-MoE) or only selects
  int groups = 1, top_groups = 1;
  bool normalize_top_k = false;
  float routed_scaling = 1.0f;
  std::vector<bool> moe_layers;  // [layers]: which layers route (the others are dense, F wide)
};

// The architecture's name ("llada"), or "unknown" for a config built by hand.
const char* ArchName(const Architecture* arch);

struct ModelConfig {
  const Architecture* arch = nullptr;  // the registered architecture that parsed the config
  int vocab = 0;                       // V: embedding / LM-head rows
  int width = 0;                       // C
  int layers = 0;
  int heads = 0;       // H
  int kv_heads = 0;    // Hkv (GQA when < H)
  int head_dim = 0;    // D = C / H
  int ffn = 0;         // F: SwiGLU inner width of the dense layers
  int rotary_dim = 0;  // R <= D: RoPE turns the first R dims of each head (D unless partial)
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int max_positions = 4096;
  int mask_id = -1;
  int eos_id = -1;
  int pad_id = -1;
  int bos_id = -1;
  int eot_id = -1;  // end of turn (LLaDA <|eot_id|>, Dream <|im_end|>), -1 when unknown
  bool qkv_bias = false;
  bool tied_embeddings = false;
  bool shift_logits = false;  // position p is predicted by output p-1 (Dream)
  SamplerFamily sampler = SamplerFamily::kLlada;
  bool rope_interleaved = false;  // RoPE pairs (2i, 2i+1): q/k rows permuted (GGUF LLaDA)
  bool qk_norm = false;           // RMSNorm over each head of q and k, before RoPE
  bool o_bias = false;            // the attention output projection has a bias
  float clip_qkv = 0;             // > 0: q, k (after their norms) and v clamped to +-clip_qkv
  MoeConfig moe;

  bool IsMoeLayer(int layer) const { return moe.experts > 0 && moe.moe_layers[size_t(layer)]; }

  static constexpr int kMaxPositions = 1 << 20;

  // The output row whose logits predict canvas position `position` (p, or p-1 when the
  // logits are shifted; position 0 then has no predicting row and maps to row 0).
  int PredictingRow(int position) const {
    return shift_logits && position > 0 ? position - 1 : position;
  }
  // Whether some output row predicts `position` (all but position 0 of a shifted model).
  bool HasPredictingRow(int position) const { return !shift_logits || position > 0; }
  // The canvas position whose token output row `row` predicts.
  int PredictedPosition(int row) const { return shift_logits ? row + 1 : row; }

  // Throws Error (prefixed with `where`) when the values cannot describe a model.
  void Validate(const std::string& where) const;
};

}  // namespace polestar
