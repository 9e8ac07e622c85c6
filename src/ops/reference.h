// Scalar reference kernels: the test oracle for every SIMD kernel and the fallback on
// CPUs without AVX2. Written for clarity, single-threaded.
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace polestar::reference {

// One output column block: y[M, n_end - n_begin] for columns [n_begin, n_end) of w,
// written at y + i * ldy + (n - n_begin).
void MatMulColumns(const float* x, int64_t m, const WeightView& w, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy);

float Dot(const float* a, const float* b, int64_t n);

void DequantizeRow(const WeightView& w, int64_t n, float* out);

void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t count);
void AddInPlace(float* x, const float* y, int64_t n);
void SoftmaxRow(float* x, int64_t n);

// One query head's attention probabilities over all L cached rows:
// probs[L] = softmax(q·k_j / sqrt(D)). q[D]; k points at this head's slice of row 0 and rows
// are kv_stride floats apart.
void HeadProbabilities(const float* q, const float* k, int64_t l, int64_t kv_stride, int head_dim,
                       float* probs);

// HeadProbabilities, bit for bit, with eight keys' dot products accumulated side by side:
// each still sums its products over the dimensions in order, multiply then add, but eight
// independent sums keep the adder busy where one sum waits on itself. The backend's
// AttentionProbabilities (Polestar's proxy attention and drift capture) runs this.
void HeadProbabilitiesSideBySide(const float* q, const float* k, int64_t l, int64_t kv_stride,
                                 int head_dim, float* probs);

// One query head against all L cached rows: probs[L] = softmax(q·k_j / sqrt(D)) and
// out[D] = sum_j probs[j] v_j. q[D]; k and v point at this head's slice of row 0 and rows
// are kv_stride floats apart.
void AttendHead(const float* q, const float* k, const float* v, int64_t l, int64_t kv_stride,
                int head_dim, float* probs, float* out);

// Every (query row, head) pair of the backend's Attention, one after another.
void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
               int kv_heads, int head_dim, float* out, float* probs);

// Drift metrics of two rows of n floats, accumulated in double.
// KL(current || previous), each entry clamped to at least `floor` before the logs, the
// result clamped at >= 0.
double KlDivergence(const float* current, const float* previous, int64_t n, float floor = 1e-12f);
// out[n] = log(max(p[i], floor)) in double: the logs KlDivergence takes of one row. A caller
// that compares each distribution twice (as current, then as previous) keeps them, so every
// log is taken once.
void FlooredLogs(const float* p, int64_t n, double* out, float floor = 1e-12f);
// KlDivergence from both rows' FlooredLogs: the same terms in the same order, the same bits.
double KlDivergenceFromLogs(const float* current, const double* current_logs,
                            const double* previous_logs, int64_t n, float floor = 1e-12f);
// out[i] = sum over j < d of x_by_dim[j * n + i] * u[j], for i < n: the dot products of n
// points stored dimension-major ([d, n]) with u[d], each summed in order of j from 0.
void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u, double* out);
// cos(a, b); 0 when either is all zeros.
double CosineSimilarity(const float* a, const float* b, int64_t n);

}  // namespace polestar::reference
