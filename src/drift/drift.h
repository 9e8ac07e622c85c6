// Grouping, gates and compressed storage for the drift-aware policies (Polestar,
// Elastic-Cache): pure functions on rows of floats. Nothing here knows about models. The
// drift measurements themselves (proxy attention, KL and cosine drift) are the model's
// drift ops (model/forward.h) on the backend's kernels.
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
struct Clustering {
  std::vector<float> centroids;  // [k, d]
  std::vector<int> labels;       // [n], in [0, k)
};
Clustering SphericalKMeans(std::span<const float> points, int64_t n, int64_t d, int k,
                           int iterations);

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

// One row of an NVFP4 tensor; the tensor scale is shared by all rows of the tensor.
struct Nvfp4Row {
  std::vector<uint8_t> scales;  // [ceil(n / 16)] E4M3
  std::vector<uint8_t> values;  // [ceil(n / 2)] two E2M1 codes per byte, low nibble first
};
Nvfp4Row QuantizeNvfp4(const float* x, int64_t n, float tensor_scale);
void DequantizeNvfp4(const Nvfp4Row& row, int64_t n, float tensor_scale, float* out);

}  // namespace polestar
