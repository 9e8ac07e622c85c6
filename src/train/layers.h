// Forward and hand-written backward of every layer of a LLaDA block, in fp32, for the
// trainer. Backward functions *accumulate* into parameter gradients (so a batch can be
// summed) and *overwrite* input gradients unless noted. Legend: M rows (tokens of all
// sequences of a batch, packed without padding), C width, F SwiGLU width, H heads,
// D head dim, V vocabulary. Sequences are given by `starts` ([B+1] row offsets).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/ops.h"

namespace polestar::train {

// y[M, N] = x[M, K] · w[N, K]^T  (OpenBLAS sgemm)
void LinearForward(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y);
// dx[M, K] = dy · w (accumulated when accumulate_dx); dw[N, K] += dy^T · x
void LinearBackward(const float* dy, const float* x, const float* w, int64_t m, int64_t k,
                    int64_t n, float* dx, float* dw, bool accumulate_dx = false);

// y[M, C] = x / rms(x) * weight; inv_rms[M] keeps 1/rms for the backward.
void RmsNormForward(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* y,
                    float* inv_rms);
// dx[M, C] += ..., dweight[C] += ...
void RmsNormBackward(const float* dy, const float* x, const float* weight, const float* inv_rms,
                     int64_t m, int64_t c, float* dx, float* dweight);

// Rotate-half RoPE on x[M, heads * D] (row stride `stride` floats) in place, row r at
// position positions[r], with angle = pos * theta^(-2i/D) computed in fp32 like the engine.
// `inverse` applies the transposed rotation, which is also the backward of the forward.
// The angles are the engine's RopeTable, so trainer and engine agree bit for bit.
void Rope(float* x, int64_t m, int64_t stride, int heads, std::span<const int> positions,
          const RopeTable& table, bool inverse);

// Bidirectional attention within each sequence. qkv[M, 3*H*D] holds q | k | v (rotated);
// out[M, H*D]; probs receives softmax(q k^T / sqrt(D)) per (sequence, head), laid out
// sequence by sequence as [H, L_s, L_s].
int64_t AttentionProbsSize(std::span<const int> starts, int heads);
void AttentionForward(const float* qkv, std::span<const int> starts, int heads, int head_dim,
                      float* out, float* probs);
// dqkv[M, 3*H*D] (overwritten) from dout[M, H*D].
void AttentionBackward(const float* dout, const float* qkv, const float* probs,
                       std::span<const int> starts, int heads, int head_dim, float* dqkv);

// act[M, F] = silu(gu[:, :F]) * gu[:, F:] for gu[M, 2F] (gate | up).
void SwigluForward(const float* gu, int64_t m, int64_t f, float* act);
// dgu[M, 2F] (overwritten) from dact[M, F].
void SwigluBackward(const float* dact, const float* gu, int64_t m, int64_t f, float* dgu);

// Weighted cross-entropy over rows of logits[R, V]: returns sum_r weight[r] *
// (logsumexp(logits[r]) - logits[r, target[r]]) and writes dlogits[R, V] (may alias logits).
double CrossEntropy(const float* logits, int64_t rows, int64_t vocab, std::span<const int> targets,
                    std::span<const float> weights, float* dlogits);

}  // namespace polestar::train
