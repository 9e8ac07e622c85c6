#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "backend/worker_queue.h"
#include "base/error.h"
#include "base/parallel.h"
#include "drift/drift.h"
#include "ops/avx2/avx2.h"
#include "ops/avx512/avx512.h"
#include "ops/bf16_matmul.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {
namespace {

// Work below this many multiply-adds is not worth waking another thread for.
constexpr int64_t kMinParallelWork = 1 << 16;

int64_t GrainFor(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(work_per_item, 1));
}

// Weight rows per column block of a batched product's calls: about 256 KB of weights, in
// whole 32-row panels (the widest kernel's).
int64_t ColumnBlockRows(const WeightView& w) {
  constexpr int64_t kBlockBytes = 1 << 18, kPanelRows = 32;
  return std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(w.row_bytes, 1) / kPanelRows) *
         kPanelRows;
}

}  // namespace

CpuBackend::CpuBackend(Isa isa, ActivationPrecision activations)
    : isa_(isa),
      activations_(activations),
      bf16_products_(activations == ActivationPrecision::kReduced && isa >= Isa::kAvx512 &&
                     Avx512Bf16Supported()),
      name_("cpu-" + std::string(IsaName(isa))) {
  if (!IsaSupported(isa)) Fail("this CPU does not run the ", IsaName(isa), " kernels");
  const bool avx2 = isa >= Isa::kAvx2;
  matmul_columns_ = isa >= Isa::kAvx512 ? avx512::MatMulColumns
                    : avx2              ? avx2::MatMulColumns
                                        : reference::MatMulColumns;
  // The scalar twin has one path for every M: all rows go through it together.
  dot_path_max_rows_ = isa >= Isa::kAvx512 ? avx512::DotPathMaxRows
                       : avx2              ? avx2::DotPathMaxRows
                                           : [](DType) { return int64_t(0); };
  dequantize_row_ = avx2 ? avx2::DequantizeRow : reference::DequantizeRow;
  rms_norm_ = avx2 ? avx2::RmsNorm : reference::RmsNorm;
  silu_mul_ = avx2 ? avx2::SiluMul : reference::SiluMul;
  add_in_place_ = avx2 ? avx2::AddInPlace : reference::AddInPlace;
  attend_head_ = avx2 ? avx2::AttendHead : reference::AttendHead;
}

const CpuBackend& CpuBackend::Host() {
  static const CpuBackend& backend = static_cast<const CpuBackend&>(BackendNamed("cpu"));
  return backend;
}

BackendEntry CpuBackendEntry() {
  return {
      .name = "cpu",
      .description = "the CPU kernels (AVX-512, AVX2 or scalar), threaded with OpenMP",
      .rank = 0,
      .options =
          {{"isa", "scalar|avx2|avx512",
            "the kernel set (default: the widest this CPU runs, capped by POLESTAR_MAX_ISA)"},
           {"activations", "reduced|f32",
            "reduced: 8-bit activations for quantised weights, BF16 for BF16 weights "
            "where the CPU has AVX512_BF16; f32: fp32 products everywhere (default: "
            "POLESTAR_ACTIVATIONS, else reduced)"}},
      .unavailable = [] { return std::string(); },
      .make = [](const BackendOptions& options) -> std::unique_ptr<Backend> {
        // The environment's choices are the defaults: read only for what the options leave.
        std::optional<Isa> isa;
        std::optional<ActivationPrecision> activations;
        for (const auto& [key, value] : options) {
          if (key == "isa") {
            if (value == "scalar") {
              isa = Isa::kScalar;
            } else if (value == "avx2") {
              isa = Isa::kAvx2;
            } else if (value == "avx512") {
              isa = Isa::kAvx512;
            } else {
              Fail("backend option isa=", value, ": expected scalar, avx2 or avx512");
            }
          } else {  // activations, the only other key
            if (value != "reduced" && value != "f32")
              Fail("backend option activations=", value, ": expected reduced or f32");
            activations =
                value == "f32" ? ActivationPrecision::kF32 : ActivationPrecision::kReduced;
          }
        }
        return std::make_unique<CpuBackend>(
            isa ? *isa : BestIsa(),
            activations ? *activations : ActivationPrecisionFromEnvironment());
      },
  };
}

BackendContract CpuBackend::contract() const {
  return {.exact_to_scalar_twins = true, .batch_invariant = true, .host_memory = true};
}

void* CpuBackend::Allocate(int64_t bytes, bool zero) const {
  // malloc's 16-byte alignment is what the kernels' unaligned loads need; aligned_alloc(64)
  // fragmented the heap of a long run (RSS grew by MBs over a suite's generations).
  void* data = std::malloc(size_t(std::max<int64_t>(bytes, 1)));
  if (data == nullptr) throw std::bad_alloc();
  if (zero) std::memset(data, 0, size_t(bytes));
  return data;
}

void CpuBackend::Free(void* data) const { std::free(data); }

void CpuBackend::CopyBytes(const void* src, int64_t bytes, void* dst) const {
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}

void CpuBackend::Upload(const void* host, int64_t bytes, void* dst) const {
  CopyBytes(host, bytes, dst);
}

void CpuBackend::Download(const void* src, int64_t bytes, void* host) const {
  CopyBytes(src, bytes, host);
}

// Every op has finished when it returns.
void CpuBackend::Synchronize() const {}

// One persistent thread that runs one job at a time, so the OpenMP team its kernels use is
// created once, not per job. The side work is small: one OpenMP thread, so it overlaps the
// forward instead of competing with its threads.
std::unique_ptr<SideQueue> CpuBackend::MakeSideQueue() const {
  return std::make_unique<WorkerQueue>([](std::function<void()>& job) {
    SetThreadCount(1);
    job();
  });
}

void CpuBackend::Zero(float* x, int64_t n) const { std::fill(x, x + n, 0.0f); }

// Batch invariance rests on the kernels' per-output arithmetic: every output of a block-
// quantised or a BF16 product depends on its own row alone (activations are rounded per
// row, and every tile shape runs the same operations per output), and so does every output of
// MatMulColumns once its path (dot or panel, by the call's row count) is fixed. None depends
// on which thread's range of columns it falls in, so the grains may depend on M.
void CpuBackend::MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                              const int* counts, int64_t sequences, float* y) const {
  const int64_t groups = int64_t(weights.size());
  std::vector<int64_t> segments(
      static_cast<size_t>(sequences));  // [S] group g's rows of each sequence
  int64_t first = 0;                    // group g's first row
  for (int64_t g = 0; g < groups; ++g) {
    int64_t rows = 0;
    for (int64_t s = 0; s < sequences; ++s) {
      segments[size_t(s)] = counts[s * groups + g];
      rows += segments[size_t(s)];
    }
    PS_CHECK(rows >= 0 && first + rows <= n);
    if (rows == 0) continue;
    const WeightView& w = weights[size_t(g)];
    MatMulBatch(x + first * w.cols, segments, w, y + first * w.rows);
    first += rows;
  }
  PS_CHECK(first == n);
}

void CpuBackend::MatMulBatch(const float* x, RowSegments segments, const WeightView& w, float* y,
                             const float* bias) const {
  int64_t m = 0;
  for (const int64_t rows : segments) m += rows;
  if (QuantMatMul(x, m, w, y, bias, isa_, activations_))
    return;  // block-quantised weights (ops/quant.h): all rows in one product
  if (bf16_products_ && Bf16MatMul(x, m, w, y, bias))
    return;  // BF16 weights (ops/bf16_matmul.h): all rows in one product, each on its own
  // The kernel calls, each of consecutive rows on one path: a run of consecutive segments
  // above the dot path's limit as one panel call (alone, each of them takes the panel path
  // too), a run of segments at or below it in dot calls of up to that many rows (the dot
  // path's outputs do not depend on the call's row count either).
  const int64_t dot_max_rows = dot_path_max_rows_(w.dtype);
  auto for_each_call = [&](auto&& call) {
    int64_t run_begin = 0, row = 0;
    bool dot_run = false;
    auto finish_run = [&] {
      const int64_t step = dot_run ? dot_max_rows : row - run_begin;
      for (int64_t r = run_begin; r < row; r += step) call(r, std::min(step, row - r));
    };
    for (const int64_t rows : segments) {
      if (rows == 0) continue;
      if (const bool dot = rows <= dot_max_rows; dot != dot_run) {
        finish_run();
        run_begin = row;
        dot_run = dot;
      }
      row += rows;
    }
    finish_run();
  };
  int64_t calls = 0;
  for_each_call([&](int64_t, int64_t) { ++calls; });
  // Threads take whole 16-row panels of w, so every thread converts its own weights once.
  // With several calls, a thread's columns go through all of them a block at a time (about
  // 256 KB of weights, which stay in L2 from the first call to the last), so the weights
  // are read from memory once per product, not once per call.
  constexpr int64_t kPanel = 16;
  const int64_t block = calls > 1 ? ColumnBlockRows(w) : w.rows;
  const int64_t panels = (w.rows + kPanel - 1) / kPanel;
  ParallelFor(panels, GrainFor(kPanel * w.cols * m), [&](int64_t p_begin, int64_t p_end) {
    const int64_t n_end = std::min(p_end * kPanel, w.rows);
    for (int64_t n0 = p_begin * kPanel; n0 < n_end; n0 += block) {
      const int64_t n1 = std::min(n0 + block, n_end);
      for_each_call([&](int64_t row, int64_t rows) {
        matmul_columns_(x + row * w.cols, rows, w, n0, n1, y + row * w.rows + n0, w.rows);
      });
    }
  });
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) add_in_place_(y + i * w.rows, bias, w.rows);
  }
}

void CpuBackend::RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                         float* out) const {
  ParallelFor(m, GrainFor(c), [&](int64_t begin, int64_t end) {
    rms_norm_(x + begin * c, end - begin, c, weight, eps, out + begin * c);
  });
}

void CpuBackend::ApplyRope(float* x, std::span<const int> positions, int heads,
                           const RopeTable& table, bool interleaved) const {
  polestar::ApplyRope(x, positions, heads, table, interleaved);
}

void CpuBackend::UndoRope(float* x, std::span<const int> positions, int heads,
                          const RopeTable& table, bool interleaved) const {
  polestar::UndoRope(x, positions, heads, table, interleaved);
}

void CpuBackend::Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l,
                           int heads, int kv_heads, int head_dim, float* out, float* probs) const {
  PS_CHECK(kv_heads > 0 && heads % kv_heads == 0);
  const int group = heads / kv_heads;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  // Each (query row, head) pair is independent; pair p is row p / H, head p % H.
  ParallelFor(m * heads, GrainFor(2 * l * head_dim), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(probs == nullptr ? size_t(l) : 0);  // [L]
    for (int64_t pair = begin; pair < end; ++pair) {
      const int h = int(pair % heads);
      const int64_t kv_offset = int64_t(h / group) * head_dim;
      attend_head_(q + pair * head_dim, k + kv_offset, v + kv_offset, l, kv_stride, head_dim,
                   probs == nullptr ? scratch.data() : probs + pair * l, out + pair * head_dim);
    }
  });
}

void CpuBackend::AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l,
                                        int heads, int kv_heads, int head_dim, float* probs) const {
  PS_CHECK(kv_heads > 0 && heads % kv_heads == 0);
  const int group = heads / kv_heads;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  // The same bits on every kernel set: Polestar ranks clusters and gates commits on these
  // probabilities, and AttendHead's (equal but for the last bits) would change its traces.
  const auto head_probabilities = isa_ >= Isa::kAvx2 ? avx2::HeadProbabilitiesSideBySide
                                                     : reference::HeadProbabilitiesSideBySide;
  ParallelFor(m * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t kv_offset = int64_t(int(pair % heads) / group) * head_dim;
      head_probabilities(q + pair * head_dim, k + kv_offset, l, kv_stride, head_dim,
                         probs + pair * l);
    }
  });
}

void CpuBackend::SiluMul(float* gate, const float* up, int64_t n) const {
  ParallelFor(n, kMinParallelWork / 16, [&](int64_t begin, int64_t end) {
    silu_mul_(gate + begin, up + begin, end - begin);
  });
}

void CpuBackend::AddInPlace(float* x, const float* y, int64_t n) const { add_in_place_(x, y, n); }

void CpuBackend::Clamp(float* x, int64_t n, float limit) const { polestar::Clamp(x, n, limit); }

void CpuBackend::RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                           float* weights) const {
  polestar::RouteTopK(logits, m, spec, chosen, weights);
}

void CpuBackend::CombineExperts(const float* src, const float* scales, const int* slots, int64_t m,
                                int k, int64_t width, float* dst) const {
  polestar::CombineExperts(src, scales, slots, m, k, width, dst);
}

void CpuBackend::CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                          std::span<const int> dst_rows, int64_t width) const {
  PS_CHECK(!src_rows.empty() || !dst_rows.empty());
  PS_CHECK(src_rows.empty() || dst_rows.empty() || src_rows.size() == dst_rows.size());
  const size_t rows = std::max(src_rows.size(), dst_rows.size());
  for (size_t i = 0; i < rows; ++i) {
    const int64_t from = src_rows.empty() ? int64_t(i) : src_rows[i];
    const int64_t to = dst_rows.empty() ? int64_t(i) : dst_rows[i];
    std::memcpy(dst + to * width, src + from * width, size_t(width) * 4);
  }
}

void CpuBackend::CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                             int64_t rows, int64_t width) const {
  PS_CHECK(width >= 0 && width <= src_stride && width <= dst_stride);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, size_t(width) * 4);
  }
}

void CpuBackend::Embed(const WeightView& embedding, std::span<const int> tokens,
                       std::span<const int> rows, float* out) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    PS_CHECK(rows[i] >= 0 && size_t(rows[i]) < tokens.size());
    const int token = tokens[size_t(rows[i])];
    PS_CHECK(token >= 0 && token < embedding.rows);
    dequantize_row_(embedding, token, out + int64_t(i) * embedding.cols);
  }
}

void CpuBackend::LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm,
                             float eps, const WeightView& lm_head, float* logits) const {
  int64_t m = 0;
  for (const int64_t rows : segments) m += rows;
  RmsNorm(x, m, c, final_norm, eps, x);
  MatMulBatch(x, segments, lm_head, logits);
}

// The drift metrics stay scalar (double accumulation, reference.h) on every kernel set:
// Polestar's cluster ranking and gate compare them, and the authors' code fixes their values.
void CpuBackend::HeadMeanDrift(DriftMetric metric, const float* now, const float* before,
                               int64_t rows, int heads, int64_t l, double* out,
                               DriftLogs logs) const {
  std::vector<double> now_logs, before_logs;  // [L] when the caller keeps none
  if (metric == DriftMetric::kKl && logs.now == nullptr) now_logs.resize(size_t(l));
  if (metric == DriftMetric::kKl && logs.before == nullptr) before_logs.resize(size_t(l));
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (int h = 0; h < heads; ++h) {
      const int64_t offset = (r * heads + h) * l;
      if (metric == DriftMetric::kCosine) {
        total += 1.0 - reference::CosineSimilarity(now + offset, before + offset, l);
        continue;
      }
      double* now_log = logs.now != nullptr ? logs.now + offset : now_logs.data();
      reference::FlooredLogs(now + offset, l, now_log);
      const double* before_log = before_logs.data();
      if (logs.before != nullptr) {
        before_log = logs.before + offset;
      } else {
        reference::FlooredLogs(before + offset, l, before_logs.data());
      }
      total += reference::KlDivergenceFromLogs(now + offset, now_log, before_log, l);
    }
    out[r] = total / heads;
  }
}

double CpuBackend::MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                       const float* before, int heads, int64_t l) const {
  std::vector<float> head_now(static_cast<size_t>(heads)),
      head_before(static_cast<size_t>(heads));  // [H]
  double sum = 0;
  for (size_t i = 0; i < now_rows.size(); ++i) {
    const float* row_now = now + int64_t(now_rows[i]) * heads * l;  // [H, L]
    const float* row_before = before + int64_t(i) * heads * l;      // [H, L]
    for (int64_t j = 0; j < l; ++j) {
      for (int h = 0; h < heads; ++h) {
        head_now[size_t(h)] = row_now[h * l + j];
        head_before[size_t(h)] = row_before[h * l + j];
      }
      sum += reference::CosineSimilarity(head_before.data(), head_now.data(), heads);
    }
  }
  return sum / double(int64_t(now_rows.size()) * l);
}

// Each key's sum runs over the rows in order, then the heads: the order the policy's host
// loop had, so the ranking and its ties keep their bits. Keys are independent.
void CpuBackend::AttentionMass(const float* probs, std::span<const int> rows, int heads, int64_t l,
                               double* mass) const {
  std::fill(mass, mass + l, 0.0);
  for (const int r : rows) {
    for (int h = 0; h < heads; ++h) {
      const float* paid = probs + (int64_t(r) * heads + h) * l;  // [L]
      for (int64_t j = 0; j < l; ++j) mass[j] += paid[j];
    }
  }
}

void CpuBackend::TopKeys(const double* mass, std::span<const int> keys, std::span<int> top) const {
  PS_CHECK(top.size() <= keys.size());
  std::partial_sort_copy(keys.begin(), keys.end(), top.begin(), top.end(), [&](int a, int b) {
    return mass[a] != mass[b] ? mass[a] > mass[b] : a < b;
  });
}

void CpuBackend::GroupByExpert(const int* chosen, const float* weights, RowSegments segments,
                               int experts, int k, int* rows, float* row_weights, int* counts,
                               int* slots) const {
  const int64_t sequences = int64_t(segments.size());
  std::fill(counts, counts + sequences * experts, 0);
  int64_t m = 0;
  for (int64_t s = 0; s < sequences; ++s) {
    for (int64_t end = m + segments[size_t(s)]; m < end; ++m) {
      for (int i = 0; i < k; ++i) {
        const int e = chosen[m * k + i];
        PS_CHECK(e >= 0 && e < experts);
        ++counts[s * experts + e];
      }
    }
  }
  // Expert e's rows start after every row of the experts before it; a row's place within
  // them follows the row order, so each expert's rows come out ascending.
  std::vector<int64_t> next(size_t(experts), 0);  // [E] the next free place of each expert
  for (int e = 1; e < experts; ++e) {
    next[size_t(e)] = next[size_t(e - 1)];
    for (int64_t s = 0; s < sequences; ++s) next[size_t(e)] += counts[s * experts + e - 1];
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int i = 0; i < k; ++i) {
      const int64_t at = next[size_t(chosen[r * k + i])]++;
      rows[at] = int(r);
      row_weights[at] = weights[r * k + i];
      slots[r * k + i] = int(at);
    }
    std::sort(slots + r * k, slots + (r + 1) * k);
  }
}

void CpuBackend::GatherRows(const float* src, const int* rows, int64_t n, float* dst,
                            int64_t width) const {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * width, src + int64_t(rows[i]) * width, size_t(width) * 4);
  }
}

void CpuBackend::SphericalKMeans(const float* points, int64_t n, int64_t d, int k, int iterations,
                                 float* centroids, int* labels) const {
  polestar::SphericalKMeans(points, n, d, k, iterations, centroids, labels);
}

void CpuBackend::ShiftCentroids(const float* now, std::span<const int> now_rows,
                                const float* before, std::span<const int> labels,
                                std::span<const float> members, int64_t width,
                                float* centroids) const {
  polestar::ShiftCentroids(now, now_rows, before, labels, members, width, centroids);
}

void CpuBackend::ResidualAbsMax(const float* x, std::span<const int> x_rows, const float* base,
                                std::span<const int> labels, int64_t width, float* amax) const {
  PS_CHECK(x_rows.size() == labels.size());
  float largest = 0;
  for (size_t i = 0; i < x_rows.size(); ++i) {
    const float* row = x + int64_t(x_rows[i]) * width;
    const float* base_row = base + int64_t(labels[i]) * width;
    for (int64_t j = 0; j < width; ++j)
      largest = std::max(largest, std::fabs(row[j] - base_row[j]));
  }
  *amax = largest;
}

void CpuBackend::QuantizeResiduals(const float* x, std::span<const int> x_rows, const float* base,
                                   std::span<const int> labels, int64_t width, float tensor_scale,
                                   uint8_t* scales, uint8_t* values,
                                   std::span<const int> store_rows) const {
  PS_CHECK(x_rows.size() == labels.size() && x_rows.size() == store_rows.size());
  std::vector<float> residual(static_cast<size_t>(width));  // [width]
  for (size_t i = 0; i < x_rows.size(); ++i) {
    const float* row = x + int64_t(x_rows[i]) * width;
    const float* base_row = base + int64_t(labels[i]) * width;
    for (int64_t j = 0; j < width; ++j) residual[size_t(j)] = row[j] - base_row[j];
    QuantizeNvfp4(residual.data(), width, tensor_scale,
                  scales + store_rows[i] * Nvfp4ScaleBytes(width),
                  values + store_rows[i] * Nvfp4ValueBytes(width));
  }
}

void CpuBackend::DequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                     std::span<const int> store_rows, const float* base,
                                     std::span<const int> labels, int64_t width, float tensor_scale,
                                     float* out, std::span<const int> out_rows) const {
  PS_CHECK(store_rows.size() == labels.size() && store_rows.size() == out_rows.size());
  for (size_t i = 0; i < store_rows.size(); ++i) {
    float* row = out + int64_t(out_rows[i]) * width;
    const float* base_row = base + int64_t(labels[i]) * width;
    DequantizeNvfp4(scales + store_rows[i] * Nvfp4ScaleBytes(width),
                    values + store_rows[i] * Nvfp4ValueBytes(width), width, tensor_scale, row);
    for (int64_t j = 0; j < width; ++j) row[j] += base_row[j];
  }
}

void CpuBackend::GreedyChoices(const float* logits, int64_t m, int64_t vocab,
                               const GreedySpec& spec, GreedyChoice* out) const {
  const bool fp32 = spec.confidence != GreedyConfidence::kNone &&
                    spec.confidence != GreedyConfidence::kFloat64Softmax;
  ParallelFor(m, GrainFor(vocab), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> probs;  // [V] the fp32 kinds' softmax, kept across calls
    if (fp32 && probs.size() < size_t(vocab)) probs.resize(size_t(vocab));
    const std::span<float> scratch(probs.data(), fp32 ? size_t(vocab) : 0);
    for (int64_t r = begin; r < end; ++r) {
      out[r] = GreedyChoiceOf({logits + r * vocab, size_t(vocab)}, spec, scratch);
    }
  });
}

}  // namespace polestar
