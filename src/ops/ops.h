// Math on plain row-major float buffers and weight views. Knows nothing of models, caches
// or policies. Legend: M rows (positions) computed, K input width, N output width,
// L canvas length, H query heads, Hkv key/value heads, D head dim.
//
// Every SIMD kernel has a scalar twin in ops/reference.h; tests compare the two. The
// threaded drivers that pick one set once and run it are the CPU backend's
// (backend/cpu/cpu_backend.h); what is left here needs no choice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/types.h"

namespace polestar {

// Converts row `n` of `w` to floats: out[K] (for loading weights; AVX2 when the CPU has it).
void DequantizeRow(const WeightView& w, int64_t n, float* out);

// out[n] = the dot products of n points stored dimension-major (x_by_dim[d, n]) with u[d],
// in double, each summed in order over d with no fused multiply-add: the same bits on every
// CPU (AVX2 when it has it), as Polestar's k-means labels need (drift/drift.cpp).
void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u, double* out);

// Rotary position embedding on x[M, heads * D] in place, row i at position positions[i].
// Rotate-half pairs (i, i + R/2) (HF LLaDA / Dream); interleaved pairs (2i, 2i+1) when
// `interleaved` (llama.cpp's permuted LLaDA q/k rows).
void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
               bool interleaved);
// The inverse rotation (for keys that must be compared un-rotated).
void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
              bool interleaved);

// chosen[M, k] and weights[M, k] (host) for logits[M, E], best first; ties go to the lower
// expert index (torch.topk's order on CPU). Scores are computed in fp32.
void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen, float* weights);

// x[n] clamped to [-limit, limit].
void Clamp(float* x, int64_t n, float limit);

// dst row r [width] += scales[p] * src row p for p = slots[r, 0], ..., slots[r, k - 1] in
// that order, for r < m (Backend::CombineExperts).
void CombineExperts(const float* src, const float* scales, const int* slots, int64_t m, int k,
                    int64_t width, float* dst);

// The commit rules' row math (decode/sampling.h), shared by the host samplers and every
// backend's GreedyChoices so that a token and its confidence have the same bits wherever
// they are computed.

// The first index of the largest x[i] over i != excluded (which may lie outside x).
size_t ArgMaxExcept(std::span<const float> x, int excluded);
// The float64 softmax probability of logits[index] (LLaDA's confidence).
double Float64SoftmaxProbability(std::span<const float> logits, size_t index);
// probs[V] = the fp32 softmax of logits[V], as torch.softmax on float32 (Dream's sampler).
void Fp32Softmax(std::span<const float> logits, std::span<float> probs);
// A kFp32* confidence of `token` from the fp32 softmax probs[V].
double Fp32Confidence(std::span<const float> probs, size_t token, GreedyConfidence kind);
// The greedy choice of logits[V] by `spec`; probs[V] is scratch for the kFp32* kinds.
GreedyChoice GreedyChoiceOf(std::span<const float> logits, const GreedySpec& spec,
                            std::span<float> probs);

}  // namespace polestar
