// The CUDA backend: device memory from the device's stream-ordered pool, ops issued on a CUDA
// stream per queue (the main one, and a second for SideQueue jobs). Built only with
// POLESTAR_CUDA. The C++20 files (this class's methods, one file per group of ops) see only
// the CUDA runtime API; kernels live in .cu files (C++17) behind plain-pointer headers:
//
//   cuda_backend.cpp  memory, transfers, queues, index staging, recorded steps, registration
//   scratch.cpp       the scratch ops use between their launches, one set per stream
//   products.cpp      MatMulBatch, MatMulAddBatch, MatMulGroups, RmsNormProducts, LmHeadBatch,
//                     Embed (weights of every stored type)
//   attention.cpp     RoPE, attention (a step's sequences in one launch) and its probabilities
//   rowwise.cpp       RMSNorm, SwiGLU, add, clamp, row copies, routing, greedy choices
//   drift.cpp         the drift measurements, Elastic-Cache's key ranking, k-means, NVFP4
//
// Threads. Every thread issues on the same main stream (ops are ordered at least as the
// seam requires), except a SideQueue's worker thread, which issues on the second stream; the
// state ops share (index staging, the cuBLAS handle) is guarded.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "backend/backend.h"
#include "ops/isa.h"

struct cublasContext;  // cublas_api.h: cublasHandle_t

namespace polestar {

class IndexStaging;  // cuda_backend.cpp
namespace cuda {
class BlasCalls;      // blas.h
class StreamScratch;  // scratch.h
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  // Fails (Error) when `device` cannot be used: no driver, no such device, device busy.
  // `activations`: kReduced multiplies BF16 (or F16) activations with FP32 accumulation;
  // kF32 runs every product in FP32 with TF32 off (the exact mode conformance runs).
  // `records`: whether Record captures CUDA graphs (else it runs the ops as issued).
  CudaBackend(int device, ActivationPrecision activations, bool records = true);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // The stream the calling thread's ops go to: a SideQueue job's own, else the main one.
  cudaStream_t Stream() const;
  int device() const { return device_; }
  ActivationPrecision activations() const { return activations_; }
  // A host list (an op's row or position list: the step's plan) in device memory, for ops
  // issued next on Stream(): valid until a later Stage on that stream wraps its ring, which
  // is stream-ordered after every op issued before it. An op may stage up to four lists
  // before it launches: the ring never wraps past the first of them. Empty lists give
  // nullptr.
  const int* Stage(std::span<const int> host) const;
  // The scratch of the calling thread's stream (scratch.h).
  cuda::StreamScratch& Scratch() const;
  // Whether the calling thread is recording a step (Record) on the stream it issues to: its
  // ops then may not allocate, free, or wait.
  bool Recording() const;

  std::string_view name() const override { return "cuda"; }
  BackendContract contract() const override;
  bool ViewsHostWeights() const override { return false; }
  void* Allocate(int64_t bytes, bool zero) const override;
  void Free(void* data) const override;
  // Pinned host memory mapped into the device's address space (the same address on both,
  // unified addressing): kernels read and write it over the bus, a row at a time.
  void* AllocateOffloaded(int64_t bytes, bool zero) const override;
  void FreeOffloaded(void* data) const override;
  // held and peak: the device's memory pool (Allocate's), which also holds the uploaded weights.
  MemoryUse Memory() const override;
  void ResetMemoryPeak() const override;
  void CopyBytes(const void* src, int64_t bytes, void* dst) const override;
  void Zero(float* x, int64_t n) const override;
  void Upload(const void* host, int64_t bytes, void* dst) const override;
  void Download(const void* src, int64_t bytes, void* host) const override;
  void Synchronize() const override;
  std::unique_ptr<SideQueue> MakeSideQueue() const override;
  // A CUDA graph captured from the main stream. A recording that fails (an op the capture
  // refuses) runs the ops as issued instead, and Record stops capturing: it says so once.
  std::unique_ptr<OpGraph> Record(const std::function<void()>& issue) const override;
  bool Replay(const OpGraph& graph) const override;

  void MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                   const float* bias = nullptr) const override;
  void MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                    const int* counts, int64_t sequences, float* y) const override;
  // cuBLAS adds with beta = 1, the kernels as they store.
  void MatMulAddBatch(const float* x, RowSegments segments, const WeightView& w,
                      float* y) const override;
  // With reduced activations the norm's kernel also writes the BF16 rows the products read.
  void RmsNormProducts(const float* x, RowSegments segments, int64_t c, const float* weight,
                       float eps, float* normed,
                       std::span<const NormedProduct> products) const override;
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
  int device_;
  ActivationPrecision activations_;
  // What MatMulBatch, MatMulAddBatch and RmsNormProducts share (products.cpp): y[M, N] =
  // x · w^T (+ bias), or y += x · w^T when `accumulate` (no bias then). x_bf16 [M, K] is x
  // rounded to BF16 where the caller has it (null: the product rounds x where its path
  // multiplies BF16 rows).
  void Product(cuda::BlasCalls& blas, const float* x, const uint16_t* x_bf16, int64_t m,
               const WeightView& w, float* y, const float* bias, bool accumulate) const;
  // Whether Product multiplies x as BF16 rows over w.
  bool ProductTakesBf16(const WeightView& w) const;
  // The kind of a copy from src to dst that `kind` names for backend memory.
  cudaMemcpyKind KindOf(const void* src, const void* dst, cudaMemcpyKind kind) const;

  cudaStream_t stream_ = nullptr;  // the main queue
  mutable std::mutex staging_mutex_;
  std::unique_ptr<IndexStaging> staging_;                // the main stream's
  std::unique_ptr<cuda::StreamScratch> scratch_;         // the main stream's
  mutable std::atomic<bool> records_;                    // Record captures graphs
  mutable std::atomic<size_t> recorded_list_bytes_ = 0;  // the last recording's staged lists
  // cuBLAS (blas.h): created by the first product; each op binds it under the mutex.
  friend class cuda::BlasCalls;
  mutable std::mutex blas_mutex_;
  mutable cublasContext* blas_ = nullptr;
  mutable std::mutex offloaded_mutex_;
  mutable std::map<uintptr_t, size_t> offloaded_;  // AllocateOffloaded's: address -> bytes
  mutable int64_t offloaded_bytes_ = 0, offloaded_peak_ = 0;  // their sum, its high mark
};

}  // namespace polestar
