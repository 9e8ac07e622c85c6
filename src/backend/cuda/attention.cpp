// RoPE and attention on the CUDA backend (kernels in attention.cu). With reduced activations
// attention is one fused launch (flash-style tiles on the tensor cores, BF16 operands, FP32
// sums and softmax): a cached step's few rows are then one launch a layer instead of three
// per head group, and the scores never reach memory. In the exact mode, and for heads too wide
// for the fused tiles, it is three steps per block of query rows, all FP32 (TF32 off): the
// scores q · k^T / sqrt(D) by a batched cuBLAS product into [rows, H, L], a softmax kernel per
// (row, head), then probs · v by a second batched product into out. Probabilities, when asked
// for, are the FP32 scores' softmax in both modes; out never depends on whether they are.
#include "backend/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "base/error.h"

namespace polestar {

namespace {

// The scores of at most this many bytes of query rows at once (always at least one row).
constexpr int64_t kScoreScratchBytes = int64_t(256) << 20;
// One call's attention shape. Query head h = g * group + j reads kv head g, so for each j
// the heads g * group + j (g < Hkv) sit at a fixed stride in q, scores and out and read the
// kv heads at stride D: one strided batched product per j, batched over g.
struct Heads {
  int heads = 0, kv_heads = 0, head_dim = 0;  // H, Hkv, D
  int group() const { return heads / kv_heads; }
};

// The products' sizes are cuBLAS ints (m, n, k, leading dimensions); the checks before them
// keep every one in range.
void CheckShape(int64_t m, int64_t l, const Heads& s) {
  PS_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && m >= 0 && l >= 0);
  if (m > INT_MAX || int64_t(s.heads) * l > INT_MAX || int64_t(s.heads) * s.head_dim > INT_MAX)
    Fail("cuda attention of ", m, " query rows over ", l, " keys with ", s.heads, " heads of ",
         s.head_dim, " dims: a size exceeds the cuBLAS limit of ", INT_MAX);
}

// scores[rows, H, L] = q[rows, H*D] · k[L, Hkv*D]^T per head, times 1/sqrt(D) (reference.cpp
// HeadProbabilities' scale). In cuBLAS's column-major terms each head's scores^T [L, rows]
// (ld H*L) = K_g [L, D] (k's rows seen transposed, ld Hkv*D) · Q_h^T [D, rows] (ld H*D).
void Scores(cublasHandle_t blas, const float* q, int rows, const float* k, int l, const Heads& s,
            float* scores) {
  const float scale = 1.0f / std::sqrt(float(s.head_dim));
  const float zero = 0.0f;
  const int d = s.head_dim, group = s.group();
  for (int j = 0; j < group; ++j) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas, CUBLAS_OP_T, CUBLAS_OP_N, l, rows, d, &scale, k, CUDA_R_32F, s.kv_heads * d, d,
        q + int64_t(j) * d, CUDA_R_32F, s.heads * d, int64_t(group) * d, &zero,
        scores + int64_t(j) * l, CUDA_R_32F, s.heads * l, int64_t(group) * l, s.kv_heads,
        CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  }
}

// out[rows, H*D] = probs[rows, H, L] · v[L, Hkv*D] per head: out_h^T [D, rows] (ld H*D) =
// V_g^T [D, L] (v's rows, ld Hkv*D) · P_h^T [L, rows] (ld H*L).
void WeightedValues(cublasHandle_t blas, const float* probs, int rows, const float* v, int l,
                    const Heads& s, float* out) {
  const float one = 1.0f, zero = 0.0f;
  const int d = s.head_dim, group = s.group();
  for (int j = 0; j < group; ++j) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas, CUBLAS_OP_N, CUBLAS_OP_N, d, rows, l, &one, v, CUDA_R_32F, s.kv_heads * d, d,
        probs + int64_t(j) * l, CUDA_R_32F, s.heads * l, int64_t(group) * l, &zero,
        out + int64_t(j) * d, CUDA_R_32F, s.heads * d, int64_t(group) * d, s.kv_heads,
        CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  }
}

// Whether attention runs as the fused kernel: with reduced activations, for heads it takes.
bool Fused(ActivationPrecision activations, int head_dim) {
  return activations == ActivationPrecision::kReduced && cuda::FusedAttentionFits(head_dim);
}

// Positions are checked on the host (the kernel cannot report one outside the table).
void CheckPositions(std::span<const int> positions, const RopeTable& table) {
  const int half = table.rotary_dim / 2;
  PS_CHECK(half > 0 && table.rotary_dim <= table.head_dim && table.sin.size() == table.cos.size());
  const int64_t table_positions = int64_t(table.cos.size()) / half;
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0 || positions[i] >= table_positions)
      Fail("RoPE position ", positions[i], " (row ", i, ") is outside the table's ",
           table_positions, " positions");
  }
}

}  // namespace

void CudaBackend::ApplyRope(float* x, std::span<const int> positions, int heads,
                            const RopeTable& table, bool interleaved) const {
  CheckPositions(positions, table);
  CUDA_CHECK(cuda::LaunchRope(x, int64_t(positions.size()), Stage(positions), heads, table.head_dim,
                              table.rotary_dim, table.cos.data(), table.sin.data(), interleaved,
                              /*inverse=*/false, Stream()));
}

void CudaBackend::UndoRope(float* x, std::span<const int> positions, int heads,
                           const RopeTable& table, bool interleaved) const {
  CheckPositions(positions, table);
  CUDA_CHECK(cuda::LaunchRope(x, int64_t(positions.size()), Stage(positions), heads, table.head_dim,
                              table.rotary_dim, table.cos.data(), table.sin.data(), interleaved,
                              /*inverse=*/true, Stream()));
}

void CudaBackend::Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l,
                            int heads, int kv_heads, int head_dim, float* out, float* probs) const {
  const Heads s{heads, kv_heads, head_dim};
  CheckShape(m, l, s);
  if (m == 0 || heads == 0) return;
  if (l == 0) {  // no keys: the scalar twin's weighted sum is empty
    Zero(out, m * heads * head_dim);
    return;
  }
  if (Fused(activations_, head_dim)) {
    const AttentionCall call{.q = q, .rows = m, .k = k, .v = v, .keys = l, .out = out};
    AttentionBatch({&call, 1}, heads, kv_heads, head_dim);
    if (probs != nullptr) AttentionProbabilities(q, m, k, l, heads, kv_heads, head_dim, probs);
    return;
  }
  const int64_t row_scores = int64_t(heads) * l;  // one query row's [H, L]
  const int64_t chunk =
      std::clamp<int64_t>(kScoreScratchBytes / (row_scores * int64_t(sizeof(float))), 1, m);
  cuda::BlasCalls calls(*this);
  const cublasHandle_t blas = calls.handle();
  // [chunk, H, L]
  float* scores = calls.scratch().Get<float>(cuda::ScratchKind::kScores, chunk * row_scores);
  for (int64_t first = 0; first < m; first += chunk) {
    const int rows = int(std::min(chunk, m - first));
    Scores(blas, q + first * heads * head_dim, rows, k, int(l), s, scores);
    CUDA_CHECK(cuda::LaunchSoftmaxRows(scores, int64_t(rows) * heads, l,
                                       probs == nullptr ? nullptr : probs + first * row_scores,
                                       Stream()));
    WeightedValues(blas, scores, rows, v, int(l), s, out + first * heads * head_dim);
  }
}

void CudaBackend::AttentionBatch(std::span<const AttentionCall> calls, int heads, int kv_heads,
                                 int head_dim) const {
  if (!Fused(activations_, head_dim)) {
    Backend::AttentionBatch(calls, heads, kv_heads, head_dim);
    return;
  }
  const Heads s{heads, kv_heads, head_dim};
  cuda::AttentionSegment segments[cuda::kFusedAttentionSegments];
  int count = 0;
  auto launch = [&] {
    if (count > 0) {
      CUDA_CHECK(cuda::LaunchFusedAttention(segments, count, heads, kv_heads, head_dim, Stream()));
    }
    count = 0;
  };
  for (const AttentionCall& call : calls) {
    CheckShape(call.rows, call.keys, s);
    if (call.rows == 0 || heads == 0) continue;
    if (call.keys == 0) {  // no keys: the scalar twin's weighted sum is empty
      Zero(call.out, call.rows * heads * head_dim);
      continue;
    }
    segments[count++] = {.q = call.q,
                         .k = call.k,
                         .v = call.v,
                         .out = call.out,
                         .rows = int(call.rows),
                         .keys = int(call.keys)};
    if (count == cuda::kFusedAttentionSegments) launch();
  }
  launch();
}

void CudaBackend::AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l,
                                         int heads, int kv_heads, int head_dim,
                                         float* probs) const {
  const Heads s{heads, kv_heads, head_dim};
  CheckShape(m, l, s);
  if (m == 0 || heads == 0 || l == 0) return;
  const cuda::BlasCalls calls(*this);
  Scores(calls.handle(), q, int(m), k, int(l), s, probs);
  CUDA_CHECK(cuda::LaunchSoftmaxRows(probs, m * heads, l, nullptr, Stream()));
}

}  // namespace polestar
