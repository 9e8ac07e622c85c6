// Grouping, gates and compressed storage for the drift-aware policies (Polestar,
// Elastic-Cache): pure functions on rows of floats. Nothing here knows about models. The
// drift measurements themselves (proxy attention, KL and cosine drift) are the model's
// drift ops (model/forward.h) on the backend's kernels; the work here that runs over backend
// memory (k-means, the centroid shift, the NVFP4 store) is a backend op too, whose CPU
// implementation (and scalar twin) is this code.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace polestar {

// Spherical k-means on points[n, d]: points are assigned to the centroid of largest
// cosine similarity; centroids are the mean of their (un-normalised) members, computed as
// sum / (count + 1e-6) like the released code; an empty cluster keeps its centroid.
// Deterministic seeding: initial centroid i is point floor(i * n / k). With n <= k each
// point is its own cluster (centroids beyond n repeat the points cyclically).
// Writes centroids[k, d] and labels[n] (in [0, k)).
void SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                     float* centroids, int* labels);
struct Clustering {
  std::vector<float> centroids;  // [k, d]
  std::vector<int> labels;       // [n], in [0, k)
};
Clustering SphericalKMeans(std::span<const float> points, int64_t n, int64_t d, int k,
                           int iterations);

// Polestar's centroid shift: rows that changed move their clusters' centroids[K, width] by
// (sum of now - before) / (members + 1e-6), summed in double in the pairs' order. Pair i is
// now[now_rows[i]] and before[i] (before[|pairs|, width]) of cluster labels[i]; a cluster
// no pair names, or with no members, keeps its centroid.
void ShiftCentroids(const float* now, std::span<const int> now_rows, const float* before,
                    std::span<const int> labels, std::span<const float> members, int64_t width,
                    float* centroids);

// Polestar-Commit's gate: a masked position with floor < conf < tau_s commits early when
// alpha (tau_s - conf)^2 <= delta < cap (delta: its drift jump over the recent mean).
bool PassesDriftGate(double confidence, double delta, double floor, double tau_s, double alpha,
                     double cap);

// Polestar-Cache's trigger (tau_upd): refresh when more than one token was committed on
// the previous step, or when more than tau_upd have been committed since the last refresh.
class RefreshTrigger {
 public:
  explicit RefreshTrigger(int tau_upd) : tau_upd_(tau_upd) {}
  void Reset() { since_refresh_ = 0; }
  // Called once per decode step with the previous step's in-block commit count.
  bool Fire(int committed_last_step) {
    since_refresh_ += committed_last_step;
    const bool fire = committed_last_step > 1 || since_refresh_ > tau_upd_;
    if (fire) since_refresh_ = 0;
    return fire;
  }

 private:
  int tau_upd_;
  int since_refresh_ = 0;
};

// NVFP4: 4-bit E2M1 values in blocks of 16 with one FP8 E4M3 scale per block and one FP32
// scale per tensor (a row here). Dequantised value = e2m1 * e4m3_scale * tensor_scale.
float E2M1ToFloat(uint8_t code);   // code in [0, 16): sign bit 3, magnitude bits 0-2
uint8_t FloatToE2M1(float value);  // nearest, ties to the even code; saturates at 6
float E4M3ToFloat(uint8_t code);   // bias 7, no infinities, 0x7f / 0xff are NaN
uint8_t FloatToE4M3(float value);  // nearest, ties to even; saturates at 448

// The FP32 tensor scale for a tensor whose largest magnitude is `amax`: it maps the
// largest block scale (amax / 6) onto E4M3's largest value, 448.
float Nvfp4TensorScale(float amax);

// One row of n values of an NVFP4 tensor: scales[ceil(n / 16)] E4M3 block scales and
// values[ceil(n / 2)], two E2M1 codes per byte, low nibble first. The tensor scale is shared
// by all rows of the tensor.
constexpr int64_t Nvfp4ScaleBytes(int64_t n) { return (n + 15) / 16; }
constexpr int64_t Nvfp4ValueBytes(int64_t n) { return (n + 1) / 2; }
void QuantizeNvfp4(const float* x, int64_t n, float tensor_scale, uint8_t* scales, uint8_t* values);
void DequantizeNvfp4(const uint8_t* scales, const uint8_t* values, int64_t n, float tensor_scale,
                     float* out);

}  // namespace polestar
