// The CPU backend: the CPU kernels behind the Backend seam. The instruction set is chosen
// once, when the backend is built; every op then runs the widest kernel it has at or below
// that set, threaded with ParallelFor. The scalar kernels (ops/reference.h) stay the test
// oracle: CpuBackend(Isa::kScalar) runs them alone.
#pragma once

#include <string>

#include "backend/backend.h"
#include "ops/isa.h"
#include "ops/quant.h"

namespace polestar {

class CpuBackend final : public Backend {
 public:
  // Fails when this CPU does not run `isa`. `activations`: how matrix products treat their
  // inputs (ops/isa.h): kReduced rounds them to 8 bits for block-quantised weights and, on
  // the kAvx512 set where the CPU has AVX512_BF16, to BF16 for BF16 weights.
  explicit CpuBackend(Isa isa, ActivationPrecision activations = ActivationPrecision::kReduced);
  // The process-wide backend "cpu" (backend/registry.h): the widest kernels this CPU runs
  // (BestIsa()) and the environment's ActivationPrecision (ActivationPrecisionFromEnvironment()).
  static const CpuBackend& Host();

  Isa isa() const { return isa_; }
  ActivationPrecision activations() const { return activations_; }
  // Whether BF16 weights multiply BF16-rounded activations (ops/bf16_matmul.h).
  bool bf16_products() const { return bf16_products_; }

  std::string_view name() const override { return name_; }
  BackendContract contract() const override;
  bool ViewsHostWeights() const override { return true; }
  void* Allocate(int64_t bytes, bool zero) const override;
  void Free(void* data) const override;
  void CopyBytes(const void* src, int64_t bytes, void* dst) const override;
  void Zero(float* x, int64_t n) const override;
  void Upload(const void* host, int64_t bytes, void* dst) const override;
  void Download(const void* src, int64_t bytes, void* host) const override;
  void Synchronize() const override;
  std::unique_ptr<SideQueue> MakeSideQueue() const override;

  void MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                   const float* bias = nullptr) const override;
  void MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                    const int* counts, int64_t sequences, float* y) const override;
  void RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
               float* out) const override;
  void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
                 bool interleaved) const override;
  void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
                bool interleaved) const override;
  void Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l, int heads,
                 int kv_heads, int head_dim, float* out, float* probs = nullptr) const override;
  void AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l, int heads,
                              int kv_heads, int head_dim, float* probs) const override;
  void SiluMul(float* gate, const float* up, int64_t n) const override;
  void AddInPlace(float* x, const float* y, int64_t n) const override;
  void Clamp(float* x, int64_t n, float limit) const override;
  void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                 float* weights) const override;
  void CombineExperts(const float* src, const float* scales, const int* slots, int64_t m, int k,
                      int64_t width, float* dst) const override;
  void CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                std::span<const int> dst_rows, int64_t width) const override;
  void CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                   int64_t rows, int64_t width) const override;
  void Embed(const WeightView& embedding, std::span<const int> tokens, std::span<const int> rows,
             float* out) const override;
  void LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm, float eps,
                   const WeightView& lm_head, float* logits) const override;
  void HeadMeanDrift(DriftMetric metric, const float* now, const float* before, int64_t rows,
                     int heads, int64_t l, double* out, DriftLogs logs = {}) const override;
  double MeanCrossHeadCosine(const float* now, std::span<const int> now_rows, const float* before,
                             int heads, int64_t l) const override;

  void AttentionMass(const float* probs, std::span<const int> rows, int heads, int64_t l,
                     double* mass) const override;
  void TopKeys(const double* mass, std::span<const int> keys, std::span<int> top) const override;
  void GroupByExpert(const int* chosen, const float* weights, RowSegments segments, int experts,
                     int k, int* rows, float* row_weights, int* counts, int* slots) const override;
  void GatherRows(const float* src, const int* rows, int64_t n, float* dst,
                  int64_t width) const override;

  // Polestar's clustering and NVFP4 store: drift/drift.h's code.
  void SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                       float* centroids, int* labels) const override;
  void ShiftCentroids(const float* now, std::span<const int> now_rows, const float* before,
                      std::span<const int> labels, std::span<const float> members, int64_t width,
                      float* centroids) const override;
  void ResidualAbsMax(const float* x, std::span<const int> x_rows, const float* base,
                      std::span<const int> labels, int64_t width, float* amax) const override;
  void QuantizeResiduals(const float* x, std::span<const int> x_rows, const float* base,
                         std::span<const int> labels, int64_t width, float tensor_scale,
                         uint8_t* scales, uint8_t* values,
                         std::span<const int> store_rows) const override;
  void DequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                           std::span<const int> store_rows, const float* base,
                           std::span<const int> labels, int64_t width, float tensor_scale,
                           float* out, std::span<const int> out_rows) const override;

  void GreedyChoices(const float* logits, int64_t m, int64_t vocab, const GreedySpec& spec,
                     GreedyChoice* out) const override;

 private:
  using MatMulColumnsFn = void (*)(const float*, int64_t, const WeightView&, int64_t, int64_t,
                                   float*, int64_t);
  using DotPathMaxRowsFn = int64_t (*)(DType);
  using RowsFn = void (*)(const float*, int64_t, int64_t, const float*, float, float*);
  using BinaryFn = void (*)(float*, const float*, int64_t);
  using DequantizeRowFn = void (*)(const WeightView&, int64_t, float*);
  using AttendHeadFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int,
                                float*, float*);

  Isa isa_;
  ActivationPrecision activations_;
  bool bf16_products_;
  std::string name_;  // "cpu-" + the set's name
  MatMulColumnsFn
      matmul_columns_;  // F32, F16, BF16 weights (but Bf16MatMul's); blocks: QuantMatMul
  DotPathMaxRowsFn dot_path_max_rows_;  // matmul_columns_'s dot path limit, by weight type
  DequantizeRowFn dequantize_row_;
  RowsFn rms_norm_;
  BinaryFn silu_mul_, add_in_place_;
  AttendHeadFn attend_head_;
};

// The CPU backend's registration (backend/registry.cpp): "cpu[:isa=...,activations=...]".
struct BackendEntry;
BackendEntry CpuBackendEntry();

}  // namespace polestar
