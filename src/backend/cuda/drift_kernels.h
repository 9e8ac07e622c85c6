// The drift kernels' launchers (drift_kernels.cu; named so as not to be taken for
// drift/drift.h, whose math they run). As every kernel header of this folder: plain pointers
// to device memory (index lists staged there by the caller), C++17, each launch enqueued on
// `stream`, returning the first failing launch's status for the backend to check. Shapes and
// rules as in backend/backend.h; each kernel follows its scalar twin's operations in the same
// order (ops/reference.cpp, drift/drift.cpp, the CPU backend), without fused multiply-adds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace polestar::cuda {

// head_drift[rows, H] = the KL (kl) or 1 - cos drift of each (row, head) of now and before
// [rows, H, L]; now_logs [rows, H, L] (if set) receives now's floored logs, before_logs (if
// set) replaces before's. row_drift[rows] = the mean over heads of head_drift.
cudaError_t LaunchHeadMeanDrift(bool kl, const float* now, const float* before, int64_t rows,
                                int heads, int64_t l, double* now_logs, const double* before_logs,
                                double* head_drift, double* row_drift, cudaStream_t stream);

// cosines[count, L] = cos(before[i, :, j], now[now_rows[i], :, j]) across the H heads, and
// mean[1] = their mean, summed in double in a fixed order (not the twin's: see the kernel).
cudaError_t LaunchMeanCrossHeadCosine(const float* now, const int* now_rows, int64_t count,
                                      const float* before, int heads, int64_t l, double* cosines,
                                      double* mean, cudaStream_t stream);

// mass[L] = per key, the double sum over rows[count] (in order) and heads of probs[*, H, L].
cudaError_t LaunchAttentionMass(const float* probs, const int* rows, int64_t count, int heads,
                                int64_t l, double* mass, cudaStream_t stream);

// top[top_count] = the keys[count] of largest mass[key], largest first, ties to the lower key.
cudaError_t LaunchTopKeys(const double* mass, const int* keys, int64_t count, int* top,
                          int64_t top_count, cudaStream_t stream);

// SphericalKMeans' working memory (n points of width d, k clusters).
struct KMeansScratch {
  float* point_inverse_norms;     // [n]
  float* unit_points;             // [d, n] the unit points, dimension-major
  float* centroid_inverse_norms;  // [k]
  double* similarity;             // [k, n]
  int* member_offsets;            // [k + 1] cluster c's members: members[offsets[c], offsets[c+1])
  int* members;                   // [n] the points, grouped by cluster, ascending within each
};
// Spherical k-means of points[n, d] (drift.h SphericalKMeans): centroids[k, d], labels[n].
// The scratch is used only when n > k and iterations > 0.
cudaError_t LaunchSphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                                  const KMeansScratch& scratch, float* centroids, int* labels,
                                  cudaStream_t stream);

// centroids[K, width] shifted by the pairs (now row now_rows[i], before row i) of cluster
// labels[i], for i < pairs, over members[K] + 1e-6 (drift.h ShiftCentroids).
cudaError_t LaunchShiftCentroids(const float* now, const int* now_rows, const float* before,
                                 const int* labels, int64_t pairs, const float* members,
                                 int64_t clusters, int64_t width, float* centroids,
                                 cudaStream_t stream);

// amax[1] = the largest |x row x_rows[i] - base row labels[i]| over i < count (0 when none).
cudaError_t LaunchResidualAbsMax(const float* x, const int* x_rows, const float* base,
                                 const int* labels, int64_t count, int64_t width, float* amax,
                                 cudaStream_t stream);

// NVFP4 store row store_rows[i] = (x row x_rows[i] - base row labels[i]) quantised, i < count.
cudaError_t LaunchQuantizeResiduals(const float* x, const int* x_rows, const float* base,
                                    const int* labels, int64_t count, int64_t width,
                                    float tensor_scale, uint8_t* scales, uint8_t* values,
                                    const int* store_rows, cudaStream_t stream);

// out row out_rows[i] = store row store_rows[i] dequantised + base row labels[i], i < count.
cudaError_t LaunchDequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                      const int* store_rows, const float* base, const int* labels,
                                      int64_t count, int64_t width, float tensor_scale, float* out,
                                      const int* out_rows, cudaStream_t stream);

}  // namespace polestar::cuda
