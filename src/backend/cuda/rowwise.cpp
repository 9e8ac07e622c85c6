// The row-wise ops of the CUDA backend (kernels in rowwise.cu): RMSNorm, SwiGLU's product,
// residual add, clamp, row copies, mixture routing and the greedy choices.
#include "backend/cuda/rowwise.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "base/error.h"

namespace polestar {

// The kernels write GreedyChoice through their own copy of its layout.
static_assert(sizeof(cuda::GreedyChoiceBits) == sizeof(GreedyChoice) &&
              offsetof(cuda::GreedyChoiceBits, token) == offsetof(GreedyChoice, token) &&
              offsetof(cuda::GreedyChoiceBits, non_finite) == offsetof(GreedyChoice, non_finite) &&
              offsetof(cuda::GreedyChoiceBits, confidence) == offsetof(GreedyChoice, confidence));
static_assert(int(cuda::GreedyKind::kNone) == int(GreedyConfidence::kNone) &&
              int(cuda::GreedyKind::kFloat64Softmax) == int(GreedyConfidence::kFloat64Softmax) &&
              int(cuda::GreedyKind::kFp32Probability) == int(GreedyConfidence::kFp32Probability) &&
              int(cuda::GreedyKind::kFp32Margin) == int(GreedyConfidence::kFp32Margin) &&
              int(cuda::GreedyKind::kFp32NegEntropy) == int(GreedyConfidence::kFp32NegEntropy));

namespace {

// The default dynamic shared memory a block may have without opting in.
constexpr int64_t kSharedBytes = 48 << 10;

// Grids of one block per row take at most INT_MAX rows.
void CheckRowGrid(const char* op, int64_t rows) {
  if (rows > INT_MAX) Fail(op, " on the cuda backend: ", rows, " rows exceed its ", INT_MAX);
}

}  // namespace

void CudaBackend::RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                          float* out) const {
  CheckRowGrid("RmsNorm", m);
  CUDA_CHECK(cuda::LaunchRmsNorm(x, m, c, weight, eps, out, nullptr, Stream()));
}

void CudaBackend::SiluMul(float* gate, const float* up, int64_t n) const {
  CUDA_CHECK(cuda::LaunchSiluMul(gate, up, n, Stream()));
}

void CudaBackend::AddInPlace(float* x, const float* y, int64_t n) const {
  CUDA_CHECK(cuda::LaunchAddInPlace(x, y, n, Stream()));
}

void CudaBackend::Clamp(float* x, int64_t n, float limit) const {
  CUDA_CHECK(cuda::LaunchClamp(x, n, limit, Stream()));
}

void CudaBackend::RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                            float* weights) const {
  // The twin's checks (ops.cpp RouteTopK).
  const int experts = spec.experts, k = spec.top_k;
  PS_CHECK(experts > 0 && k > 0 && k <= experts);
  PS_CHECK(spec.groups >= 1 && experts % spec.groups == 0 && spec.top_groups >= 1 &&
           spec.top_groups <= spec.groups);
  PS_CHECK(spec.groups == 1 || experts / spec.groups >= 2);
  const cuda::RouterRule rule = {.experts = experts,
                                 .top_k = k,
                                 .sigmoid = spec.score == RouterScore::kSigmoid,
                                 .bias = spec.bias,
                                 .bias_in_weights = spec.bias_in_weights,
                                 .groups = spec.groups,
                                 .top_groups = spec.top_groups,
                                 .normalize = spec.normalize,
                                 .scaling = spec.scaling};
  if (cuda::RouteTopKSharedBytes(rule) > kSharedBytes) {
    Fail("RouteTopK on the cuda backend: a router of ", experts, " experts needs ",
         cuda::RouteTopKSharedBytes(rule), " bytes of shared memory, more than ", kSharedBytes);
  }
  CheckRowGrid("RouteTopK", m);
  CUDA_CHECK(cuda::LaunchRouteTopK(logits, m, rule, chosen, weights, Stream()));
}

void CudaBackend::CombineExperts(const float* src, const float* scales, const int* slots, int64_t m,
                                 int k, int64_t width, float* dst) const {
  CUDA_CHECK(cuda::LaunchCombineExperts(src, scales, slots, m, k, width, dst, Stream()));
}

void CudaBackend::CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                           std::span<const int> dst_rows, int64_t width) const {
  // The CPU backend's checks.
  PS_CHECK(!src_rows.empty() || !dst_rows.empty());
  PS_CHECK(src_rows.empty() || dst_rows.empty() || src_rows.size() == dst_rows.size());
  const int64_t rows = int64_t(std::max(src_rows.size(), dst_rows.size()));
  CUDA_CHECK(
      cuda::LaunchCopyRows(src, Stage(src_rows), dst, Stage(dst_rows), rows, width, Stream()));
}

void CudaBackend::CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                              int64_t rows, int64_t width) const {
  PS_CHECK(width >= 0 && width <= src_stride && width <= dst_stride);
  if (rows <= 0 || width == 0) return;
  constexpr int64_t kFloat = sizeof(float);
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_stride * kFloat), src, size_t(src_stride * kFloat),
                               size_t(width * kFloat), size_t(rows), cudaMemcpyDeviceToDevice,
                               Stream()));
}

void CudaBackend::GroupByExpert(const int* chosen, const float* weights, RowSegments segments,
                                int experts, int k, int* rows, float* row_weights, int* counts,
                                int* slots) const {
  PS_CHECK(experts > 0 && k > 0);
  if (experts > cuda::kMaxGroupedExperts) {
    Fail("GroupByExpert on the cuda backend: ", experts, " experts, more than its ",
         cuda::kMaxGroupedExperts);
  }
  if (segments.empty()) return;
  // [S] where each sequence's choices end, counted in elements of chosen[M, k].
  std::vector<int> segment_ends(segments.size());
  int64_t elements = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    PS_CHECK(segments[s] >= 0);
    elements += segments[s] * k;
    if (elements > INT_MAX) {
      Fail("GroupByExpert on the cuda backend: more than ", INT_MAX, " routed rows");
    }
    segment_ends[s] = int(elements);
  }
  CUDA_CHECK(cuda::LaunchGroupByExpert(chosen, weights, Stage(segment_ends), int(segments.size()),
                                       experts, k, elements, rows, row_weights, counts, slots,
                                       Stream()));
}

void CudaBackend::GatherRows(const float* src, const int* rows, int64_t n, float* dst,
                             int64_t width) const {
  CUDA_CHECK(cuda::LaunchCopyRows(src, rows, dst, nullptr, n, width, Stream()));
}

void CudaBackend::GreedyChoices(const float* logits, int64_t m, int64_t vocab,
                                const GreedySpec& spec, GreedyChoice* out) const {
  if (m <= 0) return;
  // A candidate besides the excluded token (the twin's ArgMaxExcept check).
  PS_CHECK(vocab > (spec.excluded >= 0 && spec.excluded < vocab ? 1 : 0));
  CheckRowGrid("GreedyChoices", m);
  if (vocab > INT_MAX) Fail("GreedyChoices on the cuda backend: a vocabulary of ", vocab);
  // [M] GreedyChoice, as bytes.
  Buffer choices(*this, m * int64_t(sizeof(GreedyChoice)), ElementType::kU8, Buffer::Init::kNone);
  auto* device_choices = reinterpret_cast<cuda::GreedyChoiceBits*>(choices.As<uint8_t>());
  CUDA_CHECK(cuda::LaunchGreedyChoices(logits, m, vocab, cuda::GreedyKind(int(spec.confidence)),
                                       spec.excluded, device_choices, Stream()));
  Download(device_choices, choices.bytes(), out);
}

}  // namespace polestar
