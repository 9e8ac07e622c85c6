// The row-wise kernels' launchers (rowwise.cu). Like every kernel header of this folder: plain
// pointers to device memory, C++17 (nvcc compiles the .cu files; CMake 3.25 gives nvcc no
// C++20), each launch enqueued on `stream` and returning its status (cudaGetLastError) for
// the backend to check. Shapes as in backend/backend.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace polestar::cuda {

// out[M, C] = x[M, C] / sqrt(mean(x^2) + eps) * weight[C]; out may alias x. `rounded`
// [M, C], when not null, takes out's values as BF16 bits as well (LaunchRoundToBf16's).
cudaError_t LaunchRmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                          float* out, uint16_t* rounded, cudaStream_t stream);
// gate[n] = silu(gate[n]) * up[n].
cudaError_t LaunchSiluMul(float* gate, const float* up, int64_t n, cudaStream_t stream);
// x[n] += y[n].
cudaError_t LaunchAddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream);
// x[n] clamped to [-limit, limit]; NaN stays NaN (as std::clamp).
cudaError_t LaunchClamp(float* x, int64_t n, float limit, cudaStream_t stream);

// dst row dst_rows[i] = src row src_rows[i] for i < n (rows of `width` floats); a null list
// stands for 0, 1, 2, ...
cudaError_t LaunchCopyRows(const float* src, const int* src_rows, float* dst, const int* dst_rows,
                           int64_t n, int64_t width, cudaStream_t stream);
// dst row r += scales[p] * src row p for p = slots[r, 0 .. k) in order, for r < m
// (Backend::CombineExperts; the twin's roundings, no contraction).
cudaError_t LaunchCombineExperts(const float* src, const float* scales, const int* slots, int64_t m,
                                 int k, int64_t width, float* dst, cudaStream_t stream);

// RouterSpec (backend/types.h) in plain values; bias[E] device memory or null.
struct RouterRule {
  int experts = 0;  // E
  int top_k = 0;    // k
  bool sigmoid = false;
  const float* bias = nullptr;
  bool bias_in_weights = true;
  int groups = 1, top_groups = 1;
  bool normalize = false;
  float scaling = 1.0f;
};
// The dynamic shared memory one row of RouteTopK needs: the launcher fails past the default
// 48 KiB, so the backend checks it first.
int64_t RouteTopKSharedBytes(const RouterRule& rule);
// chosen[M, k] and weights[M, k] for logits[M, E] by ops.h RouteTopK's rule.
cudaError_t LaunchRouteTopK(const float* logits, int64_t m, const RouterRule& rule, int* chosen,
                            float* weights, cudaStream_t stream);

// The most experts GroupByExpert takes: one thread of its single block per expert.
constexpr int kMaxGroupedExperts = 1024;
// The stable counting sort of chosen[n = M * k] by expert (Backend::GroupByExpert):
// segment_ends[S] are the cumulative element counts (rows * k) of the S sequences.
cudaError_t LaunchGroupByExpert(const int* chosen, const float* weights, const int* segment_ends,
                                int sequences, int experts, int k, int64_t n, int* rows,
                                float* row_weights, int* counts, int* slots, cudaStream_t stream);

// GreedyConfidence (backend/types.h) by value, and GreedyChoice's layout (the backend checks
// both match), so the choices come back in one copy.
enum class GreedyKind { kNone, kFloat64Softmax, kFp32Probability, kFp32Margin, kFp32NegEntropy };
struct GreedyChoiceBits {
  int32_t token;
  float non_finite;
  double confidence;
};
// out[M] = the greedy choice of each row of logits[M, V] (ops.h GreedyChoiceOf).
cudaError_t LaunchGreedyChoices(const float* logits, int64_t m, int64_t vocab, GreedyKind kind,
                                int excluded, GreedyChoiceBits* out, cudaStream_t stream);

}  // namespace polestar::cuda
