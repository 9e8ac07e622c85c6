// The seam between the model and the hardware it runs on: the op set one decoding step
// uses, and the buffers those ops read and write. Forward (model/forward.h) and the model's
// drift ops run against a Backend; kernels behind it know nothing of models, caches or
// policies. The CPU backend (backend/cpu_backend.h) is the first implementation.
//
// Pointers handed to the ops point into Buffers allocated by the same backend ("device
// memory": host memory on the CPU backend), except where an op says "host". Legend as in
// ops/ops.h: M rows computed, K input width, N output width, L canvas length, H query
// heads, Hkv key/value heads, D head dim, C model width.
//
// Per step, what crosses the seam for a device backend: the plan in (row lists, the tokens
// of the fresh rows), and out the logits of the logit rows (LmHead writes host memory) plus
// the small drift summaries policies ask for (attention rows of chosen queries, per-row
// drift). Weights, the KV cache, the hidden-state cache and the step's scratch stay on the
// device.
//
// Batches: a batch of sequences runs as one step whose rows are the concatenation of every
// sequence's rows, so the row-wise ops (RMSNorm, SwiGLU, add, row copies, embedding) take the
// batch's rows as they take one sequence's; RoPE takes each row's position. The matrix
// products also take the rows' split into sequences (RowSegments), because a kernel may
// choose its method by row count and every sequence must get the bits it gets alone.
// Attention runs per sequence, over that sequence's own cache.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "ops/ops.h"

namespace polestar {

class Backend;

// An owning array of floats in a backend's memory. Copies allocate on the same backend.
class Buffer {
 public:
  enum class Init { kZero, kNone };
  Buffer() = default;
  Buffer(const Backend& backend, int64_t size, Init init = Init::kZero);
  Buffer(const Buffer& other);
  Buffer& operator=(const Buffer& other);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  // Grows to at least `size` floats (scratch reuse across steps: no allocation once warm).
  // Growing does not keep the contents; a size within the current one keeps everything.
  void Reserve(int64_t size);

 private:
  void Release();

  const Backend* backend_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

enum class DriftMetric { kKl, kCosine };
// The KL's logs of HeadMeanDrift's two distributions, each [rows, H, L] (host), for a caller
// that compares every distribution twice: as `now`, then as the next call's `before`. `now`
// (if set) receives now's logs; `before` (if set) supplies before's, the `now` of the call
// before. Each log is then taken once; the drift keeps its bits.
struct DriftLogs {
  double* now = nullptr;
  const double* before = nullptr;
};

// The rows of a batched op, one count per sequence in order; they sum to the op's M.
using RowSegments = std::span<const int64_t>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Memory: `size` floats, zeroed when `zero`.
  virtual float* Allocate(int64_t size, bool zero) const = 0;
  virtual void Free(float* data) const = 0;
  virtual void Copy(const float* src, int64_t size, float* dst) const = 0;
  // x[n] = 0.
  virtual void Zero(float* x, int64_t n) const = 0;

  // y[M, N] = x[M, K] · w[N, K]^T (+ bias[N] when given), for every weight type, with the M
  // rows of x split into `segments` (one per sequence of a batch, in order): each segment's
  // rows of y are, bit for bit, what the product of that segment alone gives, whatever the
  // other segments hold (batch invariance: a sequence decodes the same tokens in any batch).
  virtual void MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                           const float* bias = nullptr) const = 0;
  // One sequence's M rows.
  void MatMul(const float* x, int64_t m, const WeightView& w, float* y,
              const float* bias = nullptr) const {
    const int64_t rows[] = {m};
    MatMulBatch(x, rows, w, y, bias);
  }
  // out[M, C] = x[M, C] / rms(x) * weight[C]. out may alias x.
  virtual void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                       float* out) const = 0;
  // x[M, heads * D] rotated in place (inverse: un-rotated), row i at position positions[i]
  // (host). See ops.h ApplyRope.
  virtual void ApplyRope(float* x, std::span<const int> positions, int heads,
                         const RopeTable& table, bool interleaved) const = 0;
  virtual void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
                        bool interleaved) const = 0;
  // Bidirectional attention of q[M, H*D] over k, v[L, Hkv*D] -> out[M, H*D]; query head h
  // reads key/value head h / (H / Hkv). probs, when non-null, receives [M, H, L].
  virtual void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l,
                         int heads, int kv_heads, int head_dim, float* out,
                         float* probs = nullptr) const = 0;
  // The probabilities alone: probs[M, H, L] = softmax_L(q · k^T / sqrt(D)). The drift
  // measurements run on it; the CPU backend computes it with the scalar kernel, bit for bit
  // what the drift-aware policies were validated with.
  virtual void AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l,
                                      int heads, int kv_heads, int head_dim,
                                      float* probs) const = 0;
  // gate[n] = silu(gate[n]) * up[n].
  virtual void SiluMul(float* gate, const float* up, int64_t n) const = 0;
  // x[n] += y[n].
  virtual void AddInPlace(float* x, const float* y, int64_t n) const = 0;
  // x[n] clamped to [-limit, limit].
  virtual void Clamp(float* x, int64_t n, float limit) const = 0;
  // Mixture-of-experts routing: chosen[M, k] and weights[M, k] (host) for router
  // logits[M, E] (see ops.h RouteTopK).
  virtual void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                         float* weights) const = 0;
  // dst row dst_rows[i] += scales[i] * src row i (scales and rows host): an expert's output
  // rows, weighted, into the rows that chose it.
  virtual void ScaleAddRows(const float* src, std::span<const float> scales, float* dst,
                            std::span<const int> dst_rows, int64_t width) const = 0;
  // dst row dst_rows[i] = src row src_rows[i] (rows of `width` floats); an empty list stands
  // for 0, 1, 2, ... so a gather passes no dst_rows and a scatter no src_rows. Row lists
  // are host memory; at least one must be non-empty, and both the same length when given.
  virtual void CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                        std::span<const int> dst_rows, int64_t width) const = 0;
  // dst row i [width] = src row i, rows `*_stride` floats apart (both backend memory): a
  // block of rows laid into a wider (or out of a wider) matrix.
  virtual void CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int64_t width) const = 0;
  // out[i, C] = embedding row of tokens[rows[i]] (tokens and rows host).
  virtual void Embed(const WeightView& embedding, std::span<const int> tokens,
                     std::span<const int> rows, float* out) const = 0;
  // logits[M, V] (host) = lm_head · rmsnorm(x[M, C]); x is normalised in place. Segments as
  // in MatMulBatch.
  virtual void LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm,
                           float eps, const WeightView& lm_head, float* logits) const = 0;
  void LmHead(float* x, int64_t m, int64_t c, const float* final_norm, float eps,
              const WeightView& lm_head, float* logits) const {
    const int64_t rows[] = {m};
    LmHeadBatch(x, rows, c, final_norm, eps, lm_head, logits);
  }
  // out[r] (host) = the mean over H heads of the drift between now and before, both
  // [rows, H, L] distributions: KL(now || before) with entries floored at 1e-12, or
  // 1 - cos(now, before). `logs` serves the KL only.
  virtual void HeadMeanDrift(DriftMetric metric, const float* now, const float* before,
                             int64_t rows, int heads, int64_t l, double* out,
                             DriftLogs logs = {}) const = 0;
  // The mean over rows i and keys j of cos(before[i, :, j], now[now_rows[i], :, j]), the
  // cosine taken across the H heads; before[|now_rows|, H, L], now[*, H, L].
  virtual double MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                     const float* before, int heads, int64_t l) const = 0;
};

}  // namespace polestar
