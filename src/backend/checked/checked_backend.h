// The checking backend, for tests: the CPU kernels over memory that host code cannot reach.
// Its buffers live in one arena of address space that is mapped inaccessible except while
// one of its ops runs, so host code that reads or writes backend memory between ops faults
// at the culprit (the seam's rule, backend.h: host code never touches backend memory). And
// every op checks that each pointer it receives lies where the contract says: backend
// arguments inside a live allocation of the arena, over the extent the op touches; host
// arguments (index lists, Upload's source, Download's destination, the drift ops' and
// GreedyChoices' small outputs) outside it. Weights are copied in (ViewsHostWeights false), so a
// forward that ran reads only the model's resident copy.
//
// It computes with a CpuBackend of the same options, so its bits are the cpu backend's:
// POLESTAR_BACKEND=checked runs a test suite unchanged and compares the same fixtures. Ops
// may run on two threads at once (the side queue); the arena is open while any op runs.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace polestar {

class CheckedBackend final : public Backend {
 public:
  // Computes with `kernels`; reserves the arena's address space (fails when it cannot).
  explicit CheckedBackend(std::unique_ptr<CpuBackend> kernels);
  ~CheckedBackend() override;

  // Whether [data, data + bytes) lies inside one live allocation (tests).
  bool Holds(const void* data, int64_t bytes) const;

  std::string_view name() const override { return name_; }
  BackendContract contract() const override;
  bool ViewsHostWeights() const override { return false; }
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
  void AttentionBatch(std::span<const AttentionCall> calls, int heads, int kv_heads,
                      int head_dim) const override;
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
  class Op;  // one op's checks and its open arena (checked_backend.cpp)

  // With mutex_ held: every page handed out so far gets `protection` (PROT_*).
  void Protect(int protection) const;

  std::unique_ptr<CpuBackend> kernels_;
  std::string name_;  // "checked-" + the kernels' name
  uint8_t* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  // Under mutex_: the allocations (offset -> bytes asked for), the free blocks below top_
  // (offset -> bytes, neighbours merged), the end of the part ever handed out, and how many
  // ops run.
  mutable std::mutex mutex_;
  mutable std::map<int64_t, int64_t> live_, free_;
  mutable int64_t top_ = 0;
  mutable int running_ = 0;
};

// Its registration (backend/registry.cpp): "checked[:isa=...,activations=...]", the cpu
// backend's options.
struct BackendEntry;
BackendEntry CheckedBackendEntry();

}  // namespace polestar
