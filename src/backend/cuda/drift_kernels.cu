// Drift kernels: the drift measurements (KL and cosine, accumulated in double), Elastic-Cache's
// key mass and ranking, Polestar's spherical k-means and centroid shift, and the NVFP4 residual
// store. Every sum a scalar twin takes in order is taken in that order by one thread, with the
// multiplies and adds rounded separately (__dmul_rn/__dadd_rn: no fused multiply-add, which
// the twins, built without FMA, never use), so a result differs from the twin's only where a
// device math function (log) rounds differently, and in MeanCrossHeadCosine's final mean
// (FixedOrderMeanKernel). The NVFP4 codes are bit-defined: the same
// float operations, each correctly rounded, give the twin's bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/drift_kernels.h"
#include "backend/cuda/launch.cuh"

namespace polestar::cuda {
namespace {

__device__ int64_t FirstItem() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t ItemStride() { return int64_t(gridDim.x) * blockDim.x; }

// --- Drift measurements -------------------------------------------------------------------

constexpr float kLogFloor = 1e-12f;  // reference::FlooredLogs' floor

// log(max(p, floor)) in double, as reference::FlooredLogs.
__device__ double FlooredLog(float p, double floor_log) {
  return p < kLogFloor ? floor_log : log(double(p));
}

// reference::CosineSimilarity of a[i * stride] and b[i * stride], i < n: 0 when either is 0.
__device__ double CosineSimilarity(const float* a, const float* b, int64_t n, int64_t stride) {
  double dot = 0, norm_a = 0, norm_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i * stride], y = b[i * stride];
    dot = __dadd_rn(dot, __dmul_rn(x, y));
    norm_a = __dadd_rn(norm_a, __dmul_rn(x, x));
    norm_b = __dadd_rn(norm_b, __dmul_rn(y, y));
  }
  if (norm_a == 0 || norm_b == 0) return 0;
  return dot / (sqrt(norm_a) * sqrt(norm_b));
}

// One thread per (row, head) pair, its L terms in order (reference::KlDivergenceFromLogs).
__global__ void HeadDriftKernel(bool kl, const float* now, const float* before, int64_t pairs,
                                int64_t l, double* now_logs, const double* before_logs,
                                double* head_drift) {
  const double floor_log = log(double(kLogFloor));
  for (int64_t pair = FirstItem(); pair < pairs; pair += ItemStride()) {
    const int64_t offset = pair * l;
    if (!kl) {
      head_drift[pair] = 1.0 - CosineSimilarity(now + offset, before + offset, l, 1);
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < l; ++j) {
      const float p = now[offset + j];
      const double now_log = FlooredLog(p, floor_log);
      if (now_logs != nullptr) now_logs[offset + j] = now_log;
      const double before_log = before_logs != nullptr ? before_logs[offset + j]
                                                       : FlooredLog(before[offset + j], floor_log);
      const float floored = p < kLogFloor ? kLogFloor : p;  // std::max(p, floor)
      sum = __dadd_rn(sum, __dmul_rn(double(floored), now_log - before_log));
    }
    head_drift[pair] = sum < 0.0 ? 0.0 : sum;  // std::max(sum, 0.0)
  }
}

// row_drift[r] = the sum over heads, in order, of head_drift[r, h], over H.
__global__ void HeadMeanKernel(const double* head_drift, int64_t rows, int heads,
                               double* row_drift) {
  for (int64_t r = FirstItem(); r < rows; r += ItemStride()) {
    double total = 0;
    for (int h = 0; h < heads; ++h) total += head_drift[r * heads + h];
    row_drift[r] = total / heads;
  }
}

// One thread per (i, key j): the cosine across heads of before row i and now row now_rows[i].
__global__ void CrossHeadCosineKernel(const float* now, const int* now_rows, int64_t count,
                                      const float* before, int heads, int64_t l, double* cosines) {
  for (int64_t item = FirstItem(); item < count * l; item += ItemStride()) {
    const int64_t i = item / l, j = item % l;
    const float* row_now = now + int64_t(now_rows[i]) * heads * l;  // [H, L]
    const float* row_before = before + i * heads * l;               // [H, L]
    cosines[item] = CosineSimilarity(row_before + j, row_now + j, heads, l);
  }
}

// One block: mean[1] = the sum of values[n] over n, in double and in a fixed order (thread t
// sums values t, t + 256, ... in order, then thread 0 the 256 partial sums in order), so
// every call gives the same bits; not the twin's single running sum, whose chain of n
// dependent adds is too long for one thread.
__global__ void FixedOrderMeanKernel(const double* values, int64_t n, double* mean) {
  __shared__ double partial_sums[kThreads];
  const int thread = int(threadIdx.x);
  double sum = 0;
  for (int64_t i = thread; i < n; i += kThreads) sum += values[i];
  partial_sums[thread] = sum;
  __syncthreads();
  if (thread != 0) return;
  double total = 0;
  for (int t = 0; t < kThreads; ++t) total += partial_sums[t];
  *mean = total / double(n);
}

// --- Elastic-Cache's key mass and ranking -------------------------------------------------

// One thread per key: rows in the list's order, then heads, as the CPU backend.
__global__ void AttentionMassKernel(const float* probs, const int* rows, int64_t count, int heads,
                                    int64_t l, double* mass) {
  for (int64_t j = FirstItem(); j < l; j += ItemStride()) {
    double sum = 0;
    for (int64_t i = 0; i < count; ++i) {
      for (int h = 0; h < heads; ++h) sum += probs[(int64_t(rows[i]) * heads + h) * l + j];
    }
    mass[j] = sum;
  }
}

// A key's mass as ranked: a NaN (attention gone non-finite) as the least, so the order stays
// total.
__device__ double RankedMass(double mass) { return isnan(mass) ? -INFINITY : mass; }

// One thread per candidate: its place in the order (mass descending, key ascending; a
// repeated key after its earlier copies) is the number of candidates before it, so the places
// are a permutation and each of the first top_count is written once.
__global__ void TopKeysKernel(const double* mass, const int* keys, int64_t count, int* top,
                              int64_t top_count) {
  for (int64_t i = FirstItem(); i < count; i += ItemStride()) {
    const int key = keys[i];
    const double own = RankedMass(mass[key]);
    int64_t place = 0;
    for (int64_t t = 0; t < count; ++t) {
      const int other = keys[t];
      const double theirs = RankedMass(mass[other]);
      const bool before = theirs != own ? theirs > own : (other != key ? other < key : t < i);
      place += before;
    }
    if (place < top_count) top[place] = key;
  }
}

// --- Spherical k-means (drift.cpp SphericalKMeans) ----------------------------------------

// Centroid c = point c mod n when n <= k, else point c n / k; labels 0, 1, ... when n <= k
// (each point its own cluster), else all 0 (what no iteration leaves).
__global__ void SeedKernel(const float* points, int64_t n, int64_t d, int k, float* centroids,
                           int* labels) {
  for (int64_t item = FirstItem(); item < k * d; item += ItemStride()) {
    const int64_t c = item / d, j = item % d;
    const int64_t seed = n <= k ? c % n : c * n / k;
    centroids[item] = points[seed * d + j];
  }
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) labels[i] = n <= k ? int(i) : 0;
}

// inverse[r] = 1 / max(|row r|, 1e-12) in float, the norm summed in double in order.
__global__ void InverseNormsKernel(const float* rows, int64_t count, int64_t d, float* inverse) {
  for (int64_t r = FirstItem(); r < count; r += ItemStride()) {
    const float* row = rows + r * d;
    double norm = 0;
    for (int64_t j = 0; j < d; ++j) norm = __dadd_rn(norm, __dmul_rn(double(row[j]), row[j]));
    const double length = sqrt(norm);
    inverse[r] = __fdiv_rn(1.0f, float(length < 1e-12 ? 1e-12 : length));
  }
}

// unit[d, n] = points[n, d] scaled by their inverse norms, dimension-major (coalesced reads in
// SimilarityKernel).
__global__ void UnitPointsKernel(const float* points, int64_t n, int64_t d, const float* inverse,
                                 float* unit) {
  for (int64_t item = FirstItem(); item < n * d; item += ItemStride()) {
    const int64_t j = item / n, i = item % n;
    unit[item] = __fmul_rn(points[i * d + j], inverse[i]);
  }
}

// similarity[c, i] = unit point i · unit centroid c, summed in double over j in order
// (reference::DimensionMajorDots); the unit centroid is the float centroid times its inverse.
__global__ void SimilarityKernel(const float* unit, int64_t n, int64_t d, const float* centroids,
                                 const float* inverse, int k, double* similarity) {
  for (int64_t item = FirstItem(); item < k * n; item += ItemStride()) {
    const int64_t c = item / n, i = item % n;
    const float* centroid = centroids + c * d;
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double u = __fmul_rn(centroid[j], inverse[c]);
      dot = __dadd_rn(dot, __dmul_rn(double(unit[j * n + i]), u));
    }
    similarity[item] = dot;
  }
}

// labels[i] = the first cluster of largest similarity.
__global__ void AssignKernel(const double* similarity, int64_t n, int k, int* labels) {
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) {
    int best = 0;
    double best_similarity = -INFINITY;
    for (int c = 0; c < k; ++c) {
      if (similarity[c * n + i] > best_similarity) {
        best_similarity = similarity[c * n + i];
        best = c;
      }
    }
    labels[i] = best;
  }
}

// One block: the points grouped by label (a stable counting sort), so each centroid sums its
// members in ascending order. Thread c counts, then lists, cluster c's members.
__global__ void GroupMembersKernel(const int* labels, int64_t n, int k, int* offsets,
                                   int* members) {
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    int count = 0;
    for (int64_t i = 0; i < n; ++i) count += labels[i] == c;
    offsets[c + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int c = 0; c < k; ++c) offsets[c + 1] += offsets[c];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    int at = offsets[c];
    for (int64_t i = 0; i < n; ++i) {
      if (labels[i] == c) members[at++] = int(i);
    }
  }
}

// centroid c = the sum of its members (double, ascending) / (count + 1e-6); an empty cluster
// keeps its centroid.
__global__ void UpdateCentroidsKernel(const float* points, int64_t d, int k, const int* offsets,
                                      const int* members, float* centroids) {
  for (int64_t item = FirstItem(); item < k * d; item += ItemStride()) {
    const int64_t c = item / d, j = item % d;
    const int begin = offsets[c], end = offsets[c + 1];
    if (begin == end) continue;
    double sum = 0;
    for (int t = begin; t < end; ++t) sum += points[int64_t(members[t]) * d + j];
    centroids[item] = float(sum / (double(end - begin) + 1e-6));
  }
}

// --- Centroid shift (drift.cpp ShiftCentroids) --------------------------------------------

// One thread per (cluster, column): its pairs' now - before summed in double in pair order.
__global__ void ShiftCentroidsKernel(const float* now, const int* now_rows, const float* before,
                                     const int* labels, int64_t pairs, const float* members,
                                     int64_t clusters, int64_t width, float* centroids) {
  for (int64_t item = FirstItem(); item < clusters * width; item += ItemStride()) {
    const int64_t c = item / width, j = item % width;
    double shift = 0;
    bool moved = false;
    for (int64_t i = 0; i < pairs; ++i) {
      if (labels[i] != c) continue;
      shift += double(now[int64_t(now_rows[i]) * width + j]) - before[i * width + j];
      moved = true;
    }
    if (!moved || members[c] <= 0) continue;
    centroids[item] += float(shift / (members[c] + 1e-6));
  }
}

// --- NVFP4 (drift.cpp's E2M1, E4M3 and block rules) ---------------------------------------

constexpr int kBlock = 16;  // values per E4M3 block scale
__constant__ float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

__device__ float E2M1ToFloat(uint8_t code) {
  const float magnitude = kE2M1Magnitudes[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

// Bias 7, no infinities; 0x7f and 0xff are NaN. Every finite value is exact in float.
__device__ float E4M3ToFloat(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return __int_as_float(0x7fc00000);  // quiet NaN
  const float magnitude = exponent == 0 ? ldexpf(float(mantissa) / 8.0f, -6)
                                        : ldexpf(1.0f + float(mantissa) / 8.0f, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// The code in [0, count) whose value (Decode, non-negative there) is nearest |value| saturated
// at `largest`, ties to the even code, with `sign_bit` for a negative value unless the code is
// 0 (so -0 and NaN give 0): drift.cpp's FloatToE2M1 and FloatToE4M3 search, step for step.
template <float (*Decode)(uint8_t)>
__device__ uint8_t NearestCode(float value, float largest, int count, uint8_t sign_bit) {
  const uint8_t sign = signbit(value) ? sign_bit : 0;
  const float absolute = fabsf(value);
  const float magnitude = largest < absolute ? largest : absolute;  // std::min(|value|, largest)
  uint8_t best = 0;
  float best_error = INFINITY;
  for (int code = 0; code < count; ++code) {
    const float error = fabsf(Decode(uint8_t(code)) - magnitude);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = uint8_t(code);
      best_error = error;
    }
  }
  return best == 0 ? 0 : uint8_t(sign | best);
}

// E2M1: nearest, saturating at 6. E4M3: nearest of every finite code, saturating at 448.
__device__ uint8_t FloatToE2M1(float value) { return NearestCode<E2M1ToFloat>(value, 6.0f, 8, 8); }
__device__ uint8_t FloatToE4M3(float value) {
  return NearestCode<E4M3ToFloat>(value, 448.0f, 0x7f, 0x80);
}

__host__ __device__ constexpr int64_t ScaleBytes(int64_t width) {
  return (width + kBlock - 1) / kBlock;
}
__host__ __device__ constexpr int64_t ValueBytes(int64_t width) { return (width + 1) / 2; }

// One block per grid-stride step: its largest |x - base|, then one atomic max. The values are
// non-negative floats (a NaN never replaces the running maximum, as in std::max(largest, v)),
// which order as their bits do.
__global__ void ResidualAbsMaxKernel(const float* x, const int* x_rows, const float* base,
                                     const int* labels, int64_t count, int64_t width, float* amax) {
  __shared__ float block_max[kThreads];
  float largest = 0;
  for (int64_t item = FirstItem(); item < count * width; item += ItemStride()) {
    const int64_t i = item / width, j = item % width;
    const float v = fabsf(x[int64_t(x_rows[i]) * width + j] - base[int64_t(labels[i]) * width + j]);
    if (largest < v) largest = v;
  }
  const int thread = int(threadIdx.x);
  block_max[thread] = largest;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (thread < half && block_max[thread] < block_max[thread + half]) {
      block_max[thread] = block_max[thread + half];
    }
    __syncthreads();
  }
  if (thread == 0) {
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(block_max[0]));
  }
}

// One thread per (stored row, block of 16): the block's scale byte and its 8 code bytes
// (blocks start at even columns, so no byte is shared), as drift.cpp QuantizeNvfp4.
__global__ void QuantizeResidualsKernel(const float* x, const int* x_rows, const float* base,
                                        const int* labels, int64_t count, int64_t width,
                                        float tensor_scale, uint8_t* scales, uint8_t* values,
                                        const int* store_rows) {
  const int64_t blocks = ScaleBytes(width);
  for (int64_t item = FirstItem(); item < count * blocks; item += ItemStride()) {
    const int64_t i = item / blocks, b = item % blocks;
    const float* row = x + int64_t(x_rows[i]) * width;
    const float* base_row = base + int64_t(labels[i]) * width;
    const int64_t begin = b * kBlock, end = begin + kBlock < width ? begin + kBlock : width;
    float block_max = 0;
    for (int64_t j = begin; j < end; ++j) {
      const float v = fabsf(row[j] - base_row[j]);
      if (block_max < v) block_max = v;  // std::max(block_max, v)
    }
    const uint8_t scale_code = FloatToE4M3(__fdiv_rn(__fdiv_rn(block_max, 6.0f), tensor_scale));
    scales[int64_t(store_rows[i]) * blocks + b] = scale_code;
    const float scale = __fmul_rn(E4M3ToFloat(scale_code), tensor_scale);
    uint8_t* out = values + int64_t(store_rows[i]) * ValueBytes(width);
    for (int64_t j = begin; j < end; j += 2) {
      uint8_t byte = 0;
      for (int64_t t = j; t < j + 2 && t < end; ++t) {
        const uint8_t code = scale > 0 ? FloatToE2M1(__fdiv_rn(row[t] - base_row[t], scale)) : 0;
        byte |= uint8_t(code << (4 * (t % 2)));
      }
      out[j / 2] = byte;
    }
  }
}

// One thread per (row, column): code * (block scale * tensor scale), then + base, each rounded.
__global__ void DequantizeResidualsKernel(const uint8_t* scales, const uint8_t* values,
                                          const int* store_rows, const float* base,
                                          const int* labels, int64_t count, int64_t width,
                                          float tensor_scale, float* out, const int* out_rows) {
  for (int64_t item = FirstItem(); item < count * width; item += ItemStride()) {
    const int64_t i = item / width, j = item % width;
    const int64_t stored = store_rows[i];
    const float scale =
        __fmul_rn(E4M3ToFloat(scales[stored * ScaleBytes(width) + j / kBlock]), tensor_scale);
    const uint8_t code = (values[stored * ValueBytes(width) + j / 2] >> (4 * (j % 2))) & 0xf;
    const float residual = __fmul_rn(E2M1ToFloat(code), scale);
    out[int64_t(out_rows[i]) * width + j] =
        __fadd_rn(residual, base[int64_t(labels[i]) * width + j]);
  }
}

}  // namespace

// Each launcher returns at its first failing launch.
#define RETURN_IF_FAILED(launch)                                                   \
  do {                                                                             \
    if (const cudaError_t status = (launch); status != cudaSuccess) return status; \
  } while (false)

cudaError_t LaunchHeadMeanDrift(bool kl, const float* now, const float* before, int64_t rows,
                                int heads, int64_t l, double* now_logs, const double* before_logs,
                                double* head_drift, double* row_drift, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int64_t pairs = rows * heads;
  if (pairs > 0) {
    RETURN_IF_FAILED(Launch(HeadDriftKernel, GridBlocks(pairs), kThreads, 0, stream, kl, now,
                            before, pairs, l, now_logs, before_logs, head_drift));
  }
  return Launch(HeadMeanKernel, GridBlocks(rows), kThreads, 0, stream, head_drift, rows, heads,
                row_drift);
}

cudaError_t LaunchMeanCrossHeadCosine(const float* now, const int* now_rows, int64_t count,
                                      const float* before, int heads, int64_t l, double* cosines,
                                      double* mean, cudaStream_t stream) {
  if (count <= 0 || l <= 0) return cudaSuccess;
  RETURN_IF_FAILED(Launch(CrossHeadCosineKernel, GridBlocks(count * l), kThreads, 0, stream, now,
                          now_rows, count, before, heads, l, cosines));
  return Launch(FixedOrderMeanKernel, 1, kThreads, 0, stream, cosines, count * l, mean);
}

cudaError_t LaunchAttentionMass(const float* probs, const int* rows, int64_t count, int heads,
                                int64_t l, double* mass, cudaStream_t stream) {
  if (l <= 0) return cudaSuccess;
  return Launch(AttentionMassKernel, GridBlocks(l), kThreads, 0, stream, probs, rows, count, heads,
                l, mass);
}

cudaError_t LaunchTopKeys(const double* mass, const int* keys, int64_t count, int* top,
                          int64_t top_count, cudaStream_t stream) {
  if (count <= 0 || top_count <= 0) return cudaSuccess;
  return Launch(TopKeysKernel, GridBlocks(count), kThreads, 0, stream, mass, keys, count, top,
                top_count);
}

cudaError_t LaunchSphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                                  const KMeansScratch& scratch, float* centroids, int* labels,
                                  cudaStream_t stream) {
  if (n <= 0 || k <= 0) return cudaSuccess;
  RETURN_IF_FAILED(Launch(SeedKernel, GridBlocks(std::max<int64_t>(k * d, n)), kThreads, 0, stream,
                          points, n, d, k, centroids, labels));
  if (n <= k || iterations <= 0) return cudaSuccess;
  RETURN_IF_FAILED(Launch(InverseNormsKernel, GridBlocks(n), kThreads, 0, stream, points, n, d,
                          scratch.point_inverse_norms));
  RETURN_IF_FAILED(Launch(UnitPointsKernel, GridBlocks(n * d), kThreads, 0, stream, points, n, d,
                          scratch.point_inverse_norms, scratch.unit_points));
  for (int iteration = 0; iteration < iterations; ++iteration) {
    RETURN_IF_FAILED(Launch(InverseNormsKernel, GridBlocks(k), kThreads, 0, stream, centroids, k, d,
                            scratch.centroid_inverse_norms));
    RETURN_IF_FAILED(Launch(SimilarityKernel, GridBlocks(k * n), kThreads, 0, stream,
                            scratch.unit_points, n, d, centroids, scratch.centroid_inverse_norms, k,
                            scratch.similarity));
    RETURN_IF_FAILED(
        Launch(AssignKernel, GridBlocks(n), kThreads, 0, stream, scratch.similarity, n, k, labels));
    RETURN_IF_FAILED(Launch(GroupMembersKernel, 1, kThreads, 0, stream, labels, n, k,
                            scratch.member_offsets, scratch.members));
    RETURN_IF_FAILED(Launch(UpdateCentroidsKernel, GridBlocks(k * d), kThreads, 0, stream, points,
                            d, k, scratch.member_offsets, scratch.members, centroids));
  }
  return cudaSuccess;
}

cudaError_t LaunchShiftCentroids(const float* now, const int* now_rows, const float* before,
                                 const int* labels, int64_t pairs, const float* members,
                                 int64_t clusters, int64_t width, float* centroids,
                                 cudaStream_t stream) {
  if (pairs <= 0 || clusters * width <= 0) return cudaSuccess;
  return Launch(ShiftCentroidsKernel, GridBlocks(clusters * width), kThreads, 0, stream, now,
                now_rows, before, labels, pairs, members, clusters, width, centroids);
}

cudaError_t LaunchResidualAbsMax(const float* x, const int* x_rows, const float* base,
                                 const int* labels, int64_t count, int64_t width, float* amax,
                                 cudaStream_t stream) {
  if (const cudaError_t status = cudaMemsetAsync(amax, 0, sizeof(float), stream);
      status != cudaSuccess) {
    return status;
  }
  if (count <= 0 || width <= 0) return cudaSuccess;
  return Launch(ResidualAbsMaxKernel, GridBlocks(count * width), kThreads, 0, stream, x, x_rows,
                base, labels, count, width, amax);
}

cudaError_t LaunchQuantizeResiduals(const float* x, const int* x_rows, const float* base,
                                    const int* labels, int64_t count, int64_t width,
                                    float tensor_scale, uint8_t* scales, uint8_t* values,
                                    const int* store_rows, cudaStream_t stream) {
  if (count <= 0 || width <= 0) return cudaSuccess;
  return Launch(QuantizeResidualsKernel, GridBlocks(count * ScaleBytes(width)), kThreads, 0, stream,
                x, x_rows, base, labels, count, width, tensor_scale, scales, values, store_rows);
}

cudaError_t LaunchDequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                      const int* store_rows, const float* base, const int* labels,
                                      int64_t count, int64_t width, float tensor_scale, float* out,
                                      const int* out_rows, cudaStream_t stream) {
  if (count <= 0 || width <= 0) return cudaSuccess;
  return Launch(DequantizeResidualsKernel, GridBlocks(count * width), kThreads, 0, stream, scales,
                values, store_rows, base, labels, count, width, tensor_scale, out, out_rows);
}

#undef RETURN_IF_FAILED

}  // namespace polestar::cuda
