// The drift measurements, Elastic-Cache's key ranking, Polestar's clustering and its NVFP4
// store on the CUDA backend (kernels in drift_kernels.cu). Host lists are staged; host
// outputs are computed on the device and downloaded once; scratch comes from the pool.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/drift_kernels.h"
#include "base/error.h"

namespace polestar {

void CudaBackend::HeadMeanDrift(DriftMetric metric, const float* now, const float* before,
                                int64_t rows, int heads, int64_t l, double* out,
                                DriftLogs logs) const {
  if (rows <= 0) return;
  const bool kl = metric == DriftMetric::kKl;
  Buffer head_drift(*this, rows * heads, ElementType::kF64, Buffer::Init::kNone);  // [rows, H]
  Buffer row_drift(*this, rows, ElementType::kF64, Buffer::Init::kNone);           // [rows]
  CUDA_CHECK(cuda::LaunchHeadMeanDrift(kl, now, before, rows, heads, l, kl ? logs.now : nullptr,
                                       kl ? logs.before : nullptr, head_drift.As<double>(),
                                       row_drift.As<double>(), Stream()));
  Download(row_drift.As<double>(), row_drift.bytes(), out);
}

double CudaBackend::MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                        const float* before, int heads, int64_t l) const {
  const int64_t count = int64_t(now_rows.size());
  // The scalar twin's 0 / 0.
  if (count == 0 || l <= 0) return std::numeric_limits<double>::quiet_NaN();
  Buffer cosines(*this, count * l, ElementType::kF64, Buffer::Init::kNone);  // [|now_rows|, L]
  Buffer mean(*this, 1, ElementType::kF64, Buffer::Init::kNone);             // [1]
  CUDA_CHECK(cuda::LaunchMeanCrossHeadCosine(now, Stage(now_rows), count, before, heads, l,
                                             cosines.As<double>(), mean.As<double>(), Stream()));
  double result = 0;
  Download(mean.As<double>(), mean.bytes(), &result);
  return result;
}

void CudaBackend::AttentionMass(const float* probs, std::span<const int> rows, int heads, int64_t l,
                                double* mass) const {
  CUDA_CHECK(cuda::LaunchAttentionMass(probs, Stage(rows), int64_t(rows.size()), heads, l, mass,
                                       Stream()));
}

// The ranking stays on the device; only the |top| keys cross.
void CudaBackend::TopKeys(const double* mass, std::span<const int> keys, std::span<int> top) const {
  PS_CHECK(top.size() <= keys.size());
  if (top.empty()) return;
  Buffer chosen(*this, int64_t(top.size()), ElementType::kI32, Buffer::Init::kNone);  // [|top|]
  CUDA_CHECK(cuda::LaunchTopKeys(mass, Stage(keys), int64_t(keys.size()), chosen.As<int>(),
                                 int64_t(top.size()), Stream()));
  Download(chosen.As<int>(), chosen.bytes(), top.data());
}

void CudaBackend::SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                                  float* centroids, int* labels) const {
  PS_CHECK(k > 0 && n > 0);
  if (n > std::numeric_limits<int>::max()) Fail("SphericalKMeans: ", n, " points (labels are int)");
  const bool iterates = n > k && iterations > 0;
  // Only the iterations use scratch.
  const int64_t points_used = iterates ? n : 0, clusters_used = iterates ? k : 0;
  Buffer point_inverse_norms(*this, points_used, ElementType::kF32, Buffer::Init::kNone);  // [n]
  Buffer unit_points(*this, points_used * d, ElementType::kF32, Buffer::Init::kNone);      // [d, n]
  Buffer centroid_inverse_norms(*this, clusters_used, ElementType::kF32,
                                Buffer::Init::kNone);  // [k]
  Buffer similarity(*this, clusters_used * points_used, ElementType::kF64,
                    Buffer::Init::kNone);  // [k, n]
  Buffer member_offsets(*this, iterates ? k + 1 : 0, ElementType::kI32,
                        Buffer::Init::kNone);                                  // [k + 1]
  Buffer members(*this, points_used, ElementType::kI32, Buffer::Init::kNone);  // [n]
  const cuda::KMeansScratch scratch = {
      .point_inverse_norms = point_inverse_norms.As<float>(),
      .unit_points = unit_points.As<float>(),
      .centroid_inverse_norms = centroid_inverse_norms.As<float>(),
      .similarity = similarity.As<double>(),
      .member_offsets = member_offsets.As<int>(),
      .members = members.As<int>(),
  };
  CUDA_CHECK(cuda::LaunchSphericalKMeans(points, n, d, k, iterations, scratch, centroids, labels,
                                         Stream()));
}

void CudaBackend::ShiftCentroids(const float* now, std::span<const int> now_rows,
                                 const float* before, std::span<const int> labels,
                                 std::span<const float> members, int64_t width,
                                 float* centroids) const {
  PS_CHECK(now_rows.size() == labels.size());
  const int64_t clusters = int64_t(members.size());
  for (const int label : labels) PS_CHECK(label >= 0 && label < clusters);
  if (labels.empty() || width <= 0) return;
  Buffer members_in(*this, clusters, ElementType::kF32, Buffer::Init::kNone);  // [K]
  Upload(members.data(), members_in.bytes(), members_in.As<float>());
  const int* now_rows_in = Stage(now_rows);
  const int* labels_in = Stage(labels);
  CUDA_CHECK(cuda::LaunchShiftCentroids(now, now_rows_in, before, labels_in, int64_t(labels.size()),
                                        members_in.As<float>(), clusters, width, centroids,
                                        Stream()));
}

void CudaBackend::ResidualAbsMax(const float* x, std::span<const int> x_rows, const float* base,
                                 std::span<const int> labels, int64_t width, float* amax) const {
  PS_CHECK(x_rows.size() == labels.size());
  const int* x_rows_in = Stage(x_rows);
  const int* labels_in = Stage(labels);
  CUDA_CHECK(cuda::LaunchResidualAbsMax(x, x_rows_in, base, labels_in, int64_t(x_rows.size()),
                                        width, amax, Stream()));
}

void CudaBackend::QuantizeResiduals(const float* x, std::span<const int> x_rows, const float* base,
                                    std::span<const int> labels, int64_t width, float tensor_scale,
                                    uint8_t* scales, uint8_t* values,
                                    std::span<const int> store_rows) const {
  PS_CHECK(x_rows.size() == labels.size() && x_rows.size() == store_rows.size());
  const int* x_rows_in = Stage(x_rows);
  const int* labels_in = Stage(labels);
  const int* store_rows_in = Stage(store_rows);
  CUDA_CHECK(cuda::LaunchQuantizeResiduals(x, x_rows_in, base, labels_in, int64_t(x_rows.size()),
                                           width, tensor_scale, scales, values, store_rows_in,
                                           Stream()));
}

void CudaBackend::DequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                      std::span<const int> store_rows, const float* base,
                                      std::span<const int> labels, int64_t width,
                                      float tensor_scale, float* out,
                                      std::span<const int> out_rows) const {
  PS_CHECK(store_rows.size() == labels.size() && store_rows.size() == out_rows.size());
  const int* store_rows_in = Stage(store_rows);
  const int* labels_in = Stage(labels);
  const int* out_rows_in = Stage(out_rows);
  CUDA_CHECK(cuda::LaunchDequantizeResiduals(scales, values, store_rows_in, base, labels_in,
                                             int64_t(store_rows.size()), width, tensor_scale, out,
                                             out_rows_in, Stream()));
}

}  // namespace polestar
