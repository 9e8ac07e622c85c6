// Row-wise and element-wise kernels: RMSNorm, SwiGLU's product, residual add, clamp, row
// copies, mixture routing and grouping, and the greedy choices. Each follows its scalar twin's
// formula (ops/reference.cpp, ops/ops.cpp, backend/cpu/cpu_backend.cpp) in the same precision.
// Long sums (RMSNorm's, softmax totals over a vocabulary) are reduced in a tree rather than in
// order, so they differ from the CPU's in the last bits; routing sums its few terms in the
// twin's order and rounds exp as the host does, so its choices and weights keep the twin's
// bits but for the rare exp glibc rounds the other way.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/rowwise.h"

namespace polestar::cuda {
namespace {

// exp and log of a float as glibc's expf/logf give them on the host: computed in double and
// rounded once, which is correctly rounded bar double-rounding cases (CUDA's expf may be 2 ulp
// off), so values the twins derive from them keep the twins' bits nearly always.
__device__ float ExpRounded(float x) { return float(exp(double(x))); }
__device__ float LogRounded(float x) { return float(log(double(x))); }

// A candidate for an argmax: ties go to the lower index, as torch.argmax, torch.topk on the
// CPU and the twins (ops.h ArgMaxExcept, RouteTopK). index < 0: none yet.
struct Candidate {
  float value;
  int index;
};
constexpr Candidate kNoCandidate = {0.0f, -1};

// Larger first, ties to the lower index; a NaN after every number (NaNs by index), so the order
// stays total and a row with NaN scores still yields k distinct experts in [0, E), as the twin's
// sort does, rather than no choice at all.
__device__ bool Before(Candidate a, Candidate b) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  if (isnan(a.value) || isnan(b.value)) {
    return isnan(a.value) == isnan(b.value) ? a.index < b.index : isnan(b.value);
  }
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// The two largest of a multiset (the twin's margin loop: duplicates count twice).
struct TopTwo {
  float first, second;
};

// Reductions' combining rules beyond launch.cuh's.
struct Min {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};
struct Best {
  __device__ Candidate operator()(Candidate a, Candidate b) const { return Before(b, a) ? b : a; }
};
struct Larger {
  __device__ TopTwo operator()(TopTwo a, TopTwo b) const {
    return {fmaxf(a.first, b.first), fmaxf(fminf(a.first, b.first), fmaxf(a.second, b.second))};
  }
};

// launch.cuh's overloads, beside these (a name declared here would hide them).
using cuda::ShuffleXor;
__device__ Candidate ShuffleXor(Candidate v, int offset) {
  return {ShuffleXor(v.value, offset), __shfl_xor_sync(kFullWarp, v.index, offset)};
}
__device__ TopTwo ShuffleXor(TopTwo v, int offset) {
  return {ShuffleXor(v.first, offset), ShuffleXor(v.second, offset)};
}

// One block per row. Each thread reads and writes the same columns, so out may alias x.
__global__ void RmsNormKernel(const float* x, int64_t c, const float* weight, float eps, float* out,
                              uint16_t* rounded) {
  const float* row = x + int64_t(blockIdx.x) * c;
  float* out_row = out + int64_t(blockIdx.x) * c;
  uint16_t* rounded_row = rounded == nullptr ? nullptr : rounded + int64_t(blockIdx.x) * c;
  float sum_sq = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) sum_sq += row[j] * row[j];
  const float inv = 1.0f / sqrtf(BlockReduce(sum_sq, Sum()) / float(c) + eps);
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float value = row[j] * inv * weight[j];
    out_row[j] = value;
    if (rounded_row != nullptr) rounded_row[j] = Bf16Bits(value);
  }
}

__global__ void SiluMulKernel(float* gate, const float* up, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const float g = gate[i];
    gate[i] = g / (1.0f + ExpRounded(-g)) * up[i];
  }
}

__global__ void AddInPlaceKernel(float* x, const float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    x[i] += y[i];
  }
}

__global__ void ClampKernel(float* x, int64_t n, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const float v = x[i];
    x[i] = v < -limit ? -limit : (limit < v ? limit : v);
  }
}

// Blocks stride over the rows, threads over a row's columns.
__global__ void CopyRowsKernel(const float* src, const int* src_rows, float* dst,
                               const int* dst_rows, int64_t n, int64_t width) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* from = src + (src_rows != nullptr ? int64_t(src_rows[i]) : i) * width;
    float* to = dst + (dst_rows != nullptr ? int64_t(dst_rows[i]) : i) * width;
    for (int64_t j = threadIdx.x; j < width; j += kThreads) to[j] = from[j];
  }
}

// As CopyRowsKernel. The twin rounds the product, then the sum (ops.cpp has no FMA): so here.
__global__ void CombineExpertsKernel(const float* src, const float* scales, const int* slots,
                                     int64_t m, int k, int64_t width, float* dst) {
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    float* to = dst + r * width;
    for (int64_t j = threadIdx.x; j < width; j += kThreads) {
      float total = to[j];
      for (int i = 0; i < k; ++i) {
        const int64_t slot = slots[r * k + i];
        total = __fadd_rn(total, __fmul_rn(scales[slot], src[slot * width + j]));
      }
      to[j] = total;
    }
  }
}

// One warp (the block) per row, the row's values in shared memory. The twin's steps in its
// order: a lane per expert where the order cannot change a bit (exp, sigmoid, max, the
// choice under a total order), lane 0 alone for the sums.
__global__ void RouteTopKKernel(const float* logits, RouterRule rule, int* chosen, float* weights) {
  float* shared = DynamicShared<float>();
  const int experts = rule.experts, k = rule.top_k, lane = threadIdx.x;
  float* scores = shared;                           // [E] s
  float* selection = scores + experts;              // [E] v = s + bias
  float* group_scores = selection + experts;        // [groups]
  int* order = (int*)(group_scores + rule.groups);  // [k] the chosen experts, best first
  const float* row = logits + int64_t(blockIdx.x) * experts;

  if (rule.sigmoid) {
    for (int e = lane; e < experts; e += kWarp) scores[e] = 1.0f / (1.0f + ExpRounded(-row[e]));
  } else {
    float max = -INFINITY;
    for (int e = lane; e < experts; e += kWarp) max = fmaxf(max, row[e]);
    max = WarpReduce(max, Max());
    for (int e = lane; e < experts; e += kWarp) scores[e] = ExpRounded(row[e] - max);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0) {
      for (int e = 0; e < experts; ++e) sum += scores[e];
    }
    sum = __shfl_sync(kFullWarp, sum, 0);
    for (int e = lane; e < experts; e += kWarp) scores[e] /= sum;
  }
  for (int e = lane; e < experts; e += kWarp) {
    selection[e] = scores[e] + (rule.bias != nullptr ? rule.bias[e] : 0.0f);
  }
  __syncwarp();

  if (rule.groups > 1) {
    const int group_size = experts / rule.groups;
    for (int g = lane; g < rule.groups; g += kWarp) {
      const float* v = selection + g * group_size;
      float first = -INFINITY, second = -INFINITY;
      for (int i = 0; i < group_size; ++i) {
        if (v[i] > first) {
          second = first;
          first = v[i];
        } else if (v[i] > second) {
          second = v[i];
        }
      }
      group_scores[g] = first + second;
    }
    __syncwarp();
    // A group stays eligible when fewer than top_groups groups rank before it.
    for (int g = lane; g < rule.groups; g += kWarp) {
      int rank = 0;
      for (int h = 0; h < rule.groups; ++h) {
        rank += Before({group_scores[h], h}, {group_scores[g], g}) ? 1 : 0;
      }
      if (rank >= rule.top_groups) {
        for (int i = 0; i < group_size; ++i) selection[g * group_size + i] = -INFINITY;
      }
    }
    __syncwarp();
  }

  // The i-th choice is the best expert ranking after the (i-1)-th.
  Candidate previous = kNoCandidate;
  for (int i = 0; i < k; ++i) {
    Candidate best = kNoCandidate;
    for (int e = lane; e < experts; e += kWarp) {
      const Candidate c = {selection[e], e};
      if ((i == 0 || Before(previous, c)) && Before(c, best)) best = c;
    }
    previous = WarpReduce(best, Best());
    if (lane == 0) order[i] = previous.index;
  }

  if (lane == 0) {
    const float* weight_of = rule.bias_in_weights ? selection : scores;
    float total = 0.0f;
    for (int i = 0; i < k; ++i) total += weight_of[order[i]];
    for (int i = 0; i < k; ++i) {
      const int e = order[i];
      const float weight = rule.normalize ? weight_of[e] / (total + 1e-20f) : weight_of[e];
      chosen[int64_t(blockIdx.x) * k + i] = e;
      weights[int64_t(blockIdx.x) * k + i] = weight * rule.scaling;
    }
  }
}

// One block; thread e handles expert e, reading the choices a chunk of blockDim at a time
// from shared memory. Pass 1 counts expert e's elements per segment, pass 2 lays them out
// after those of the experts before it, in element order (so rows ascend: the twin's order).
// An element naming no expert in [0, E) matches no thread and is left out.
__global__ void GroupByExpertKernel(const int* chosen, const float* weights,
                                    const int* segment_ends, int sequences, int experts, int k,
                                    int64_t n, int* rows, float* row_weights, int* counts,
                                    int* slots) {
  int* group_shared = DynamicShared<int>();
  int* chunk = group_shared;                // [blockDim] choices
  int* totals = group_shared + blockDim.x;  // [E] elements per expert
  const int e = threadIdx.x;
  const bool active = e < experts;

  // The segment the elements read lie in, and where it ends. Elements lie before the last
  // segment's end (n), so only segments before the last are passed.
  int segment = 0, count = 0, total = 0;
  int64_t segment_end = segment_ends[0];
  for (int64_t base = 0; base < n; base += blockDim.x) {
    if (base + threadIdx.x < n) chunk[threadIdx.x] = chosen[base + threadIdx.x];
    __syncthreads();
    const int64_t size = n - base < int64_t(blockDim.x) ? n - base : int64_t(blockDim.x);
    for (int64_t j = 0; active && j < size; ++j) {
      while (base + j >= segment_end) {
        counts[int64_t(segment) * experts + e] = count;
        total += count;
        count = 0;
        segment_end = segment_ends[++segment];
      }
      count += chunk[j] == e ? 1 : 0;
    }
    __syncthreads();
  }
  if (active) {
    for (; segment < sequences; ++segment) {  // the last non-empty segment and empty ones after
      counts[int64_t(segment) * experts + e] = count;
      total += count;
      count = 0;
    }
    totals[e] = total;
  }
  __syncthreads();

  int64_t next = 0;  // expert e's next place
  for (int earlier = 0; active && earlier < e; ++earlier) next += totals[earlier];
  for (int64_t base = 0; base < n; base += blockDim.x) {
    if (base + threadIdx.x < n) chunk[threadIdx.x] = chosen[base + threadIdx.x];
    __syncthreads();
    const int64_t size = n - base < int64_t(blockDim.x) ? n - base : int64_t(blockDim.x);
    for (int64_t j = 0; active && j < size; ++j) {
      if (chunk[j] != e) continue;
      // The row's slot for expert e: after those of its experts below e.
      const int64_t row = (base + j) / k;
      int rank = 0;
      for (int i = 0; i < k; ++i) rank += chosen[row * k + i] < e ? 1 : 0;
      slots[row * k + rank] = int(next);
      rows[next] = int(row);
      row_weights[next] = weights[base + j];
      ++next;
    }
    __syncthreads();
  }
}

// One block per row: a pass for the first non-finite logit, the largest logit and the first
// largest candidate; for the softmax kinds a pass for the total and, for the fp32 ones, a
// pass over the probabilities (recomputed, not stored).
__global__ void GreedyChoicesKernel(const float* logits, int64_t vocab, GreedyKind kind,
                                    int excluded, GreedyChoiceBits* out) {
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  int64_t first_non_finite = vocab;
  float max_logit = -INFINITY;
  Candidate best = kNoCandidate;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = row[i];
    if (!isfinite(l)) {
      if (first_non_finite == vocab) first_non_finite = i;
      continue;
    }
    max_logit = fmaxf(max_logit, l);
    if (i != excluded) best = Best()(best, {l, int(i)});
  }
  first_non_finite = BlockReduce(first_non_finite, Min());
  GreedyChoiceBits choice = {0, 0.0f, 0.0};
  if (first_non_finite < vocab) {  // the same for every thread
    if (threadIdx.x == 0) {
      choice.non_finite = row[first_non_finite];
      out[blockIdx.x] = choice;
    }
    return;
  }
  max_logit = BlockReduce(max_logit, Max());

  if (kind == GreedyKind::kNone || kind == GreedyKind::kFloat64Softmax) {
    best = BlockReduce(best, Best());
    choice.token = best.index;
    if (kind == GreedyKind::kFloat64Softmax) {
      double total = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        total += exp(double(row[i]) - double(max_logit));
      }
      total = BlockReduce(total, Sum());
      choice.confidence = exp(double(row[best.index]) - double(max_logit)) / total;
    }
  } else {
    // As Fp32Softmax: p = exp(l - max) / total in fp32; the token is the argmax of p.
    float total = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) total += ExpRounded(row[i] - max_logit);
    total = BlockReduce(total, Sum());
    Candidate best_p = kNoCandidate;
    TopTwo top = {-1.0f, -1.0f};  // over every token, the excluded one too (as the twin)
    float neg_entropy = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float p = ExpRounded(row[i] - max_logit) / total;
      if (i != excluded) best_p = Best()(best_p, {p, int(i)});
      top = Larger()(top, {p, -1.0f});
      neg_entropy += p * LogRounded(p + 1e-10f);
    }
    best_p = BlockReduce(best_p, Best());
    choice.token = best_p.index;
    if (kind == GreedyKind::kFp32Probability) {
      choice.confidence = double(best_p.value);
    } else if (kind == GreedyKind::kFp32Margin) {
      top = BlockReduce(top, Larger());
      choice.confidence = double(top.first - top.second);
    } else {
      choice.confidence = double(BlockReduce(neg_entropy, Sum()));
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = choice;
}

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                          float* out, uint16_t* rounded, cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (m > INT32_MAX) return cudaErrorInvalidConfiguration;
  return Launch(RmsNormKernel, unsigned(m), kThreads, 0, stream, x, c, weight, eps, out, rounded);
}

cudaError_t LaunchSiluMul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return Launch(SiluMulKernel, GridBlocks(n), kThreads, 0, stream, gate, up, n);
}

cudaError_t LaunchAddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return Launch(AddInPlaceKernel, GridBlocks(n), kThreads, 0, stream, x, y, n);
}

cudaError_t LaunchClamp(float* x, int64_t n, float limit, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return Launch(ClampKernel, GridBlocks(n), kThreads, 0, stream, x, n, limit);
}

cudaError_t LaunchCopyRows(const float* src, const int* src_rows, float* dst, const int* dst_rows,
                           int64_t n, int64_t width, cudaStream_t stream) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  return Launch(CopyRowsKernel, RowBlocks(n), kThreads, 0, stream, src, src_rows, dst, dst_rows, n,
                width);
}

cudaError_t LaunchCombineExperts(const float* src, const float* scales, const int* slots, int64_t m,
                                 int k, int64_t width, float* dst, cudaStream_t stream) {
  if (m <= 0 || width <= 0 || k <= 0) return cudaSuccess;
  return Launch(CombineExpertsKernel, RowBlocks(m), kThreads, 0, stream, src, scales, slots, m, k,
                width, dst);
}

int64_t RouteTopKSharedBytes(const RouterRule& rule) {
  return (2 * int64_t(rule.experts) + rule.groups) * int64_t(sizeof(float)) +
         int64_t(rule.top_k) * int64_t(sizeof(int));
}

cudaError_t LaunchRouteTopK(const float* logits, int64_t m, const RouterRule& rule, int* chosen,
                            float* weights, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (m > INT32_MAX) return cudaErrorInvalidConfiguration;
  return Launch(RouteTopKKernel, unsigned(m), kWarp, size_t(RouteTopKSharedBytes(rule)), stream,
                logits, rule, chosen, weights);
}

cudaError_t LaunchGroupByExpert(const int* chosen, const float* weights, const int* segment_ends,
                                int sequences, int experts, int k, int64_t n, int* rows,
                                float* row_weights, int* counts, int* slots, cudaStream_t stream) {
  if (sequences <= 0 || experts <= 0) return cudaSuccess;
  if (experts > kMaxGroupedExperts) return cudaErrorInvalidConfiguration;
  const int threads = (experts + kWarp - 1) / kWarp * kWarp;
  const size_t shared = size_t(threads + experts) * sizeof(int);
  return Launch(GroupByExpertKernel, 1, threads, shared, stream, chosen, weights, segment_ends,
                sequences, experts, k, n, rows, row_weights, counts, slots);
}

cudaError_t LaunchGreedyChoices(const float* logits, int64_t m, int64_t vocab, GreedyKind kind,
                                int excluded, GreedyChoiceBits* out, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (m > INT32_MAX || vocab > INT32_MAX) return cudaErrorInvalidConfiguration;
  return Launch(GreedyChoicesKernel, unsigned(m), kThreads, 0, stream, logits, vocab, kind,
                excluded, out);
}

}  // namespace polestar::cuda
