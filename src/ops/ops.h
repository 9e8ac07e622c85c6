// Math on plain row-major float buffers and weight views. Knows nothing of models, caches
// or policies. Legend: M rows (positions) computed, K input width, N output width,
// L canvas length, H query heads, Hkv key/value heads, D head dim.
//
// Every SIMD kernel has a scalar twin in ops/reference.h; tests compare the two. The
// threaded drivers that pick one set once and run it are the CPU backend's
// (backend/cpu_backend.h); what is left here needs no choice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/dtype.h"

namespace polestar {

// A weight matrix [N, K] (PyTorch Linear layout: one row per output), used in place from
// the mapped file in its stored type. Rows are `row_bytes` apart.
struct WeightView {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  int64_t row_bytes = 0;

  const uint8_t* Row(int64_t n) const { return data + n * row_bytes; }
};

// Converts row `n` of `w` to floats: out[K] (for loading weights; AVX2 when the CPU has it).
void DequantizeRow(const WeightView& w, int64_t n, float* out);

// out[n] = the dot products of n points stored dimension-major (x_by_dim[d, n]) with u[d],
// in double, each summed in order over d with no fused multiply-add: the same bits on every
// CPU (AVX2 when it has it), as Polestar's k-means labels need (drift/drift.cpp).
void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u, double* out);

// cos/sin of every (position, frequency) pair, computed once per model as the reference
// does: angle = float(pos) * inv_freq[i] in fp32, inv_freq[i] = 1 / theta^(2i/R). RoPE turns
// the first R = rotary_dim dims of each D-dim head (R < D: partial rotary embeddings, as
// LLaDA-MoE's partial_rotary_factor); the rest pass unchanged.
struct RopeTable {
  int head_dim = 0;             // D
  int rotary_dim = 0;           // R
  std::vector<float> cos, sin;  // [max_positions, R/2]

  RopeTable() = default;
  RopeTable(int head_dim, int rotary_dim, int max_positions, float theta);
};

// Rotary position embedding on x[M, heads * D] in place, row i at position positions[i].
// Rotate-half pairs (i, i + R/2) (HF LLaDA / Dream); interleaved pairs (2i, 2i+1) when
// `interleaved` (llama.cpp's permuted LLaDA q/k rows).
void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
               bool interleaved);
// The inverse rotation (for keys that must be compared un-rotated).
void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
              bool interleaved);

// How a mixture-of-experts router turns its logits into expert scores.
enum class RouterScore { kSoftmax, kSigmoid };

// A router's choice rule, per row: scores s = softmax or sigmoid of the logits, selection
// values v = s + bias (bias[E] host, or null). With `groups` > 1 the experts form that many
// groups of consecutive indices, each ranked by the sum of its two largest v, and only the
// best `top_groups` groups stay eligible (DeepSeek-V3 / LLaDA 2.x). The `top_k` eligible
// experts with the largest v are chosen, weighted by v when `bias_in_weights` (LLaDA-MoE keeps
// the bias) or else by s; the weights are divided by their sum (+1e-20) when `normalize`,
// then multiplied by `scaling`.
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

// chosen[M, k] and weights[M, k] (host) for logits[M, E], best first; ties go to the lower
// expert index (torch.topk's order on CPU). Scores are computed in fp32.
void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen, float* weights);

// x[n] clamped to [-limit, limit].
void Clamp(float* x, int64_t n, float limit);

// dst row dst_rows[i] += scales[i] * src row i (rows of `width` floats; scales host).
void ScaleAddRows(const float* src, std::span<const float> scales, float* dst,
                  std::span<const int> dst_rows, int64_t width);

}  // namespace polestar
