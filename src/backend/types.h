// The types the backend seam carries besides buffers: views of weight matrices, the RoPE
// table and a router's choice rule. Kernels (ops/) take them too, so they sit below both.
// A view points at memory someone else owns: the mapped checkpoint or host vectors of a
// loaded Model, or a backend's copy of them once the model is bound to it (ResidentWeights,
// model/model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/dtype.h"

namespace polestar {

// A weight matrix [N, K] (PyTorch Linear layout: one row per output) in its stored type.
// Rows are `row_bytes` apart.
struct WeightView {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  int64_t row_bytes = 0;

  const uint8_t* Row(int64_t n) const { return data + n * row_bytes; }
  int64_t Bytes() const { return rows * row_bytes; }
};

// cos/sin of every (position, frequency) pair, computed once per model as the reference
// does: angle = float(pos) * inv_freq[i] in fp32, inv_freq[i] = 1 / theta^(2i/R). RoPE turns
// the first R = rotary_dim dims of each D-dim head (R < D: partial rotary embeddings, as
// LLaDA-MoE's partial_rotary_factor); the rest pass unchanged.
//
// Built from (D, R, positions, theta) it owns host memory; a backend's resident copy views
// the backend's memory (WithAngles) and owns nothing. Copies share what they view.
struct RopeTable {
  int head_dim = 0;                 // D
  int rotary_dim = 0;               // R
  std::span<const float> cos, sin;  // [max_positions, R/2]

  RopeTable() = default;
  RopeTable(int head_dim, int rotary_dim, int max_positions, float theta);
  // The same dimensions over other memory holding the same angles.
  RopeTable WithAngles(std::span<const float> cos, std::span<const float> sin) const;

 private:
  std::shared_ptr<const std::vector<float>> storage_;  // [2, max_positions, R/2] when owned
};

// How a mixture-of-experts router turns its logits into expert scores.
enum class RouterScore { kSoftmax, kSigmoid };

// A router's choice rule, per row: scores s = softmax or sigmoid of the logits, selection
// values v = s + bias (bias[E] in the memory of whoever runs the rule, or null). With
// `groups` > 1 the experts form that many groups of consecutive indices, each ranked by the
// sum of its two largest v, and only the best `top_groups` groups stay eligible
// (DeepSeek-V3 / LLaDA 2.x). The `top_k` eligible experts with the largest v are chosen,
// weighted by v when `bias_in_weights` (LLaDA-MoE keeps the bias) or else by s; the weights
// are divided by their sum (+1e-20) when `normalize`, then multiplied by `scaling`.
struct RouterSpec {
  int experts = 0;  // E
  int top_k = 0;    // k
  RouterScore score = RouterScore::kSoftmax;
  const float* bias = nullptr;
  bool bias_in_weights = true;
  int groups = 1, top_groups = 1;
  bool normalize = false;
  float scaling = 1.0f;
};

// How a logit row gives the token and the confidence a commit rule's sampler takes from it at
// temperature 0 (decode/sampling.h; the row math is ops.h GreedyChoiceOf), so the backend
// can choose and the host read 16 bytes a row in place of the vocabulary's logits.
enum class GreedyConfidence {
  kNone,             // the argmax alone (LLaDA's random remasking draws its confidence)
  kFloat64Softmax,   // LLaDA: argmax of the logits, its float64 softmax probability
  kFp32Probability,  // Dream, LLaDA 2.x: argmax of the fp32 softmax, its probability
  kFp32Margin,       // ... the top-1 minus the top-2 probability
  kFp32NegEntropy,   // ... sum p log(p + 1e-10) over the row
};

struct GreedySpec {
  GreedyConfidence confidence = GreedyConfidence::kFloat64Softmax;
  int excluded = -1;  // a token never chosen (the mask token); -1: none
  bool operator==(const GreedySpec&) const = default;
};

// One row's choice (host memory).
struct GreedyChoice {
  int32_t token = 0;
  // The row's first NaN or infinite logit; 0 when every logit is finite (else token and
  // confidence mean nothing).
  float non_finite = 0;
  double confidence = 0;
};

}  // namespace polestar
