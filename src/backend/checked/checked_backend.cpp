#include "backend/checked/checked_backend.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/registry.h"
#include "base/error.h"
#include "drift/drift.h"

namespace polestar {
namespace {

// Address space reserved per backend: no memory until touched (MAP_NORESERVE).
constexpr int64_t kArenaBytes = int64_t(64) << 30;
constexpr int64_t kAlignment = 64;  // as CpuBackend's allocations: the AVX-512 kernels' width

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
// What an allocation of `bytes` takes of the arena: the next one starts aligned.
int64_t ReservedBytes(int64_t bytes) { return RoundUp(std::max<int64_t>(bytes, 1), kAlignment); }
// The unit the arena's protection changes by: a huge page. Every op opens and closes the
// whole arena in use, which costs one page-table entry per unit: 4 KB pages made the checked
// tests ten times slower than huge ones (where the kernel has them; else it stays correct).
constexpr int64_t kProtectionUnit = int64_t(2) << 20;

// The arenas alive, for the fault handler: a host access to one is named as such before the
// fault takes its usual course.
struct ArenaRange {
  std::atomic<uintptr_t> begin = 0, end = 0;
};
std::array<ArenaRange, 8> arena_ranges;
struct sigaction previous_segv_action;

void OnSegv(int, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const ArenaRange& range : arena_ranges) {
    if (address >= range.begin.load() && address < range.end.load()) {
      static const char message[] =
          "checked backend: host code touched backend memory outside the backend's ops (the "
          "seam's rule, backend/backend.h: host code moves it with Upload and Download only)\n";
      [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, message, sizeof message - 1);
      break;
    }
  }
  // The faulting access runs again under the handler there was before (the default: a crash).
  sigaction(SIGSEGV, &previous_segv_action, nullptr);
}

void WatchArena(const void* begin, int64_t bytes) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSegv;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv_action);
  });
  for (ArenaRange& range : arena_ranges) {
    uintptr_t free_slot = 0;
    if (range.begin.compare_exchange_strong(free_slot, reinterpret_cast<uintptr_t>(begin))) {
      range.end = reinterpret_cast<uintptr_t>(begin) + uintptr_t(bytes);
      return;
    }
  }  // more arenas than slots: the extra ones fault unnamed
}

void UnwatchArena(const void* begin) {
  for (ArenaRange& range : arena_ranges) {
    if (range.begin.load() == reinterpret_cast<uintptr_t>(begin)) {
      range.end = 0;
      range.begin = 0;
    }
  }
}

// The rows a row list reaches: its largest entry + 1, or `count` for an empty list (0, 1, ...).
int64_t RowsReached(std::span<const int> rows, int64_t count) {
  if (rows.empty()) return count;
  return int64_t(*std::ranges::max_element(rows)) + 1;
}

int64_t Sum(RowSegments segments) {
  int64_t total = 0;
  for (const int64_t rows : segments) total += rows;
  return total;
}

}  // namespace

// One op: its arguments checked against the contract, then its kernels run with the arena
// open (Run). A broken contract is a bug in the caller: it aborts, naming op and argument.
class CheckedBackend::Op {
 public:
  Op(const CheckedBackend& backend, const char* name) : backend_(backend), name_(name) {}

  // `data` is backend memory: [data, data + bytes) inside one live allocation. An empty
  // extent reaches no memory, wherever it points.
  Op& Device(const void* data, int64_t bytes, const char* argument) {
    if (bytes == 0) return *this;
    if (!backend_.Holds(data, bytes)) {
      Violation(argument, data, bytes,
                backend_.Holds(data, 1) ? "runs past the end of its allocation"
                                        : "is not in a live allocation of this backend");
    }
    return *this;
  }
  // `data` is host memory: [data, data + bytes) outside the arena.
  Op& Host(const void* data, int64_t bytes, const char* argument) {
    const auto* begin = static_cast<const uint8_t*>(data);
    if (bytes > 0 && begin < backend_.arena_ + backend_.arena_bytes_ &&
        begin + bytes > backend_.arena_) {
      Violation(argument, data, bytes, "is backend memory where the op takes host memory");
    }
    return *this;
  }
  Op& Weights(const WeightView& w, const char* argument) {
    return Device(w.data, w.Bytes(), argument);
  }

  template <class Kernels>
  auto Run(Kernels&& kernels) {
    const Open open(backend_);
    return kernels();
  }

 private:
  // The arena is readable and writable from its first op's start to its last op's end.
  struct Open {
    explicit Open(const CheckedBackend& backend) : backend(backend) {
      std::lock_guard lock(backend.mutex_);
      if (backend.running_++ == 0) backend.Protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      std::lock_guard lock(backend.mutex_);
      if (--backend.running_ == 0) backend.Protect(PROT_NONE);
    }
    const CheckedBackend& backend;
  };

  [[noreturn]] void Violation(const char* argument, const void* data, int64_t bytes,
                              const char* what) const {
    std::fprintf(stderr, "checked backend: %s: argument %s (%p, %lld bytes) %s\n", name_, argument,
                 data, static_cast<long long>(bytes), what);
    std::abort();
  }

  const CheckedBackend& backend_;
  const char* name_;
};

CheckedBackend::CheckedBackend(std::unique_ptr<CpuBackend> kernels)
    : kernels_(std::move(kernels)), name_("checked-" + std::string(kernels_->name())) {
  // Reserved one unit larger, then trimmed to start on a unit.
  void* reserved = mmap(nullptr, size_t(kArenaBytes + kProtectionUnit), PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    Fail("the checked backend cannot reserve ", kArenaBytes >> 30,
         " GiB of address space: ", std::strerror(errno));
  }
  const auto start = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = RoundUp(int64_t(start), kProtectionUnit);
  if (aligned > start) munmap(reserved, aligned - start);
  arena_ = reinterpret_cast<uint8_t*>(aligned);
  arena_bytes_ = kArenaBytes;
  munmap(arena_ + arena_bytes_, size_t(kProtectionUnit - int64_t(aligned - start)));
  madvise(arena_, size_t(arena_bytes_), MADV_HUGEPAGE);  // advice: may be refused
  WatchArena(arena_, arena_bytes_);
}

CheckedBackend::~CheckedBackend() {
  UnwatchArena(arena_);
  munmap(arena_, size_t(arena_bytes_));
}

BackendEntry CheckedBackendEntry() {
  const BackendEntry cpu = CpuBackendEntry();
  return {
      .name = "checked",
      .description = "the CPU backend with its memory fenced off between ops, for testing a seam",
      .rank = cpu.rank - 1,
      .options = cpu.options,
      .unavailable = [] { return std::string(); },
      .make = [make_cpu = cpu.make](const BackendOptions& options) -> std::unique_ptr<Backend> {
        std::unique_ptr<Backend> kernels = make_cpu(options);
        return std::make_unique<CheckedBackend>(
            std::unique_ptr<CpuBackend>(static_cast<CpuBackend*>(kernels.release())));
      },
  };
}

// Its kernels' contract, but for where memory lives.
BackendContract CheckedBackend::contract() const {
  BackendContract contract = kernels_->contract();
  contract.host_memory = false;
  return contract;
}

void CheckedBackend::Protect(int protection) const {
  const int64_t bytes = RoundUp(top_, kProtectionUnit);
  if (bytes > 0) PS_CHECK(mprotect(arena_, size_t(bytes), protection) == 0);
}

bool CheckedBackend::Holds(const void* data, int64_t bytes) const {
  const auto* begin = static_cast<const uint8_t*>(data);
  if (begin < arena_ || begin >= arena_ + arena_bytes_) return false;
  const int64_t offset = begin - arena_;
  std::lock_guard lock(mutex_);
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return false;
  --it;
  return offset + bytes <= it->first + it->second;
}

void* CheckedBackend::Allocate(int64_t bytes, bool zero) const {
  PS_CHECK(bytes >= 0);
  const int64_t size = ReservedBytes(bytes);
  int64_t offset = -1;
  {
    std::lock_guard lock(mutex_);
    // The first free block that fits, else the untouched space above top_.
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      offset = it->first;
      if (it->second > size) free_.emplace(offset + size, it->second - size);
      free_.erase(it);
      break;
    }
    if (offset < 0) {
      if (top_ + size > arena_bytes_) {
        Fail("the checked backend's ", arena_bytes_ >> 30, " GiB arena cannot hold ", bytes,
             " more bytes");
      }
      offset = top_;
      const int64_t opened = RoundUp(top_, kProtectionUnit);
      top_ += size;
      // Pages new to the arena while an op runs open at once, as the rest of it is.
      if (const int64_t end = RoundUp(top_, kProtectionUnit); running_ > 0 && end > opened) {
        PS_CHECK(mprotect(arena_ + opened, size_t(end - opened), PROT_READ | PROT_WRITE) == 0);
      }
    }
    live_.emplace(offset, bytes);
  }
  void* data = arena_ + offset;
  if (zero) Op(*this, "Allocate").Run([&] { std::memset(data, 0, size_t(size)); });
  return data;
}

void CheckedBackend::Free(void* data) const {
  if (data == nullptr) return;
  std::lock_guard lock(mutex_);
  const auto* begin = static_cast<const uint8_t*>(data);
  const auto it =
      begin >= arena_ && begin < arena_ + arena_bytes_ ? live_.find(begin - arena_) : live_.end();
  if (it == live_.end()) {
    std::fprintf(stderr, "checked backend: Free: %p is not an allocation of this backend\n", data);
    std::abort();
  }
  const int64_t offset = it->first;
  int64_t size = ReservedBytes(it->second);
  live_.erase(it);
  // Merged with the free blocks on either side.
  if (auto next = free_.find(offset + size); next != free_.end()) {
    size += next->second;
    free_.erase(next);
  }
  if (auto after = free_.upper_bound(offset); after != free_.begin()) {
    if (auto before = std::prev(after); before->first + before->second == offset) {
      before->second += size;
      return;
    }
  }
  free_.emplace(offset, size);
}

void CheckedBackend::CopyBytes(const void* src, int64_t bytes, void* dst) const {
  Op(*this, "CopyBytes").Device(src, bytes, "src").Device(dst, bytes, "dst").Run([&] {
    kernels_->CopyBytes(src, bytes, dst);
  });
}

void CheckedBackend::Zero(float* x, int64_t n) const {
  Op(*this, "Zero").Device(x, n * 4, "x").Run([&] { kernels_->Zero(x, n); });
}

void CheckedBackend::Upload(const void* host, int64_t bytes, void* dst) const {
  Op(*this, "Upload").Host(host, bytes, "host").Device(dst, bytes, "dst").Run([&] {
    kernels_->Upload(host, bytes, dst);
  });
}

void CheckedBackend::Download(const void* src, int64_t bytes, void* host) const {
  Op(*this, "Download").Device(src, bytes, "src").Host(host, bytes, "host").Run([&] {
    kernels_->Download(src, bytes, host);
  });
}

void CheckedBackend::Synchronize() const { kernels_->Synchronize(); }

std::unique_ptr<SideQueue> CheckedBackend::MakeSideQueue() const {
  return kernels_->MakeSideQueue();
}

void CheckedBackend::MatMulBatch(const float* x, RowSegments segments, const WeightView& w,
                                 float* y, const float* bias) const {
  const int64_t m = Sum(segments);
  Op op(*this, "MatMulBatch");
  op.Device(x, m * w.cols * 4, "x")
      .Host(segments.data(), int64_t(segments.size_bytes()), "segments")
      .Weights(w, "w")
      .Device(y, m * w.rows * 4, "y");
  if (bias != nullptr) op.Device(bias, w.rows * 4, "bias");
  op.Run([&] { kernels_->MatMulBatch(x, segments, w, y, bias); });
}

void CheckedBackend::MatMulGroups(const float* x, int64_t n, std::span<const WeightView> weights,
                                  const int* counts, int64_t sequences, float* y) const {
  Op op(*this, "MatMulGroups");
  const int64_t k = weights.empty() ? 0 : weights[0].cols,
                width = weights.empty() ? 0 : weights[0].rows;
  op.Device(x, n * k * 4, "x")
      .Host(weights.data(), int64_t(weights.size_bytes()), "weights")
      .Device(counts, sequences * int64_t(weights.size()) * 4, "counts")
      .Device(y, n * width * 4, "y");
  for (const WeightView& w : weights) op.Weights(w, "weights[g]");
  op.Run([&] { kernels_->MatMulGroups(x, n, weights, counts, sequences, y); });
}

void CheckedBackend::RmsNorm(const float* x, int64_t m, int64_t c, const float* weight, float eps,
                             float* out) const {
  Op(*this, "RmsNorm")
      .Device(x, m * c * 4, "x")
      .Device(weight, c * 4, "weight")
      .Device(out, m * c * 4, "out")
      .Run([&] { kernels_->RmsNorm(x, m, c, weight, eps, out); });
}

void CheckedBackend::ApplyRope(float* x, std::span<const int> positions, int heads,
                               const RopeTable& table, bool interleaved) const {
  Op(*this, "ApplyRope")
      .Device(x, int64_t(positions.size()) * heads * table.head_dim * 4, "x")
      .Host(positions.data(), int64_t(positions.size_bytes()), "positions")
      .Device(table.cos.data(), int64_t(table.cos.size_bytes()), "table.cos")
      .Device(table.sin.data(), int64_t(table.sin.size_bytes()), "table.sin")
      .Run([&] { kernels_->ApplyRope(x, positions, heads, table, interleaved); });
}

void CheckedBackend::UndoRope(float* x, std::span<const int> positions, int heads,
                              const RopeTable& table, bool interleaved) const {
  Op(*this, "UndoRope")
      .Device(x, int64_t(positions.size()) * heads * table.head_dim * 4, "x")
      .Host(positions.data(), int64_t(positions.size_bytes()), "positions")
      .Device(table.cos.data(), int64_t(table.cos.size_bytes()), "table.cos")
      .Device(table.sin.data(), int64_t(table.sin.size_bytes()), "table.sin")
      .Run([&] { kernels_->UndoRope(x, positions, heads, table, interleaved); });
}

void CheckedBackend::Attention(const float* q, int64_t m, const float* k, const float* v, int64_t l,
                               int heads, int kv_heads, int head_dim, float* out,
                               float* probs) const {
  const int64_t q_bytes = m * heads * head_dim * 4, kv_bytes = l * kv_heads * head_dim * 4;
  Op op(*this, "Attention");
  op.Device(q, q_bytes, "q")
      .Device(k, kv_bytes, "k")
      .Device(v, kv_bytes, "v")
      .Device(out, q_bytes, "out");
  if (probs != nullptr) op.Device(probs, m * heads * l * 4, "probs");
  op.Run([&] { kernels_->Attention(q, m, k, v, l, heads, kv_heads, head_dim, out, probs); });
}

void CheckedBackend::AttentionBatch(std::span<const AttentionCall> calls, int heads, int kv_heads,
                                    int head_dim) const {
  Op op(*this, "AttentionBatch");
  op.Host(calls.data(), int64_t(calls.size_bytes()), "calls");
  for (const AttentionCall& call : calls) {
    const int64_t q_bytes = call.rows * heads * head_dim * 4;
    const int64_t kv_bytes = call.keys * kv_heads * head_dim * 4;
    op.Device(call.q, q_bytes, "q")
        .Device(call.k, kv_bytes, "k")
        .Device(call.v, kv_bytes, "v")
        .Device(call.out, q_bytes, "out");
  }
  op.Run([&] { kernels_->AttentionBatch(calls, heads, kv_heads, head_dim); });
}

void CheckedBackend::AttentionProbabilities(const float* q, int64_t m, const float* k, int64_t l,
                                            int heads, int kv_heads, int head_dim,
                                            float* probs) const {
  Op(*this, "AttentionProbabilities")
      .Device(q, m * heads * head_dim * 4, "q")
      .Device(k, l * kv_heads * head_dim * 4, "k")
      .Device(probs, m * heads * l * 4, "probs")
      .Run([&] { kernels_->AttentionProbabilities(q, m, k, l, heads, kv_heads, head_dim, probs); });
}

void CheckedBackend::SiluMul(float* gate, const float* up, int64_t n) const {
  Op(*this, "SiluMul").Device(gate, n * 4, "gate").Device(up, n * 4, "up").Run([&] {
    kernels_->SiluMul(gate, up, n);
  });
}

void CheckedBackend::AddInPlace(float* x, const float* y, int64_t n) const {
  Op(*this, "AddInPlace").Device(x, n * 4, "x").Device(y, n * 4, "y").Run([&] {
    kernels_->AddInPlace(x, y, n);
  });
}

void CheckedBackend::Clamp(float* x, int64_t n, float limit) const {
  Op(*this, "Clamp").Device(x, n * 4, "x").Run([&] { kernels_->Clamp(x, n, limit); });
}

void CheckedBackend::RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
                               float* weights) const {
  Op op(*this, "RouteTopK");
  op.Device(logits, m * spec.experts * 4, "logits")
      .Device(chosen, m * spec.top_k * 4, "chosen")
      .Device(weights, m * spec.top_k * 4, "weights");
  if (spec.bias != nullptr) op.Device(spec.bias, spec.experts * 4, "spec.bias");
  op.Run([&] { kernels_->RouteTopK(logits, m, spec, chosen, weights); });
}

// Row lists in backend memory cannot be read here (before the op): src is checked to hold
// every slot the routed rows can name (M*k rows).
void CheckedBackend::CombineExperts(const float* src, const float* scales, const int* slots,
                                    int64_t m, int k, int64_t width, float* dst) const {
  Op(*this, "CombineExperts")
      .Device(src, m * k * width * 4, "src")
      .Device(scales, m * k * 4, "scales")
      .Device(slots, m * k * 4, "slots")
      .Device(dst, m * width * 4, "dst")
      .Run([&] { kernels_->CombineExperts(src, scales, slots, m, k, width, dst); });
}

void CheckedBackend::CopyRows(const float* src, std::span<const int> src_rows, float* dst,
                              std::span<const int> dst_rows, int64_t width) const {
  const int64_t rows = int64_t(std::max(src_rows.size(), dst_rows.size()));
  Op(*this, "CopyRows")
      .Device(src, RowsReached(src_rows, rows) * width * 4, "src")
      .Host(src_rows.data(), int64_t(src_rows.size_bytes()), "src_rows")
      .Device(dst, RowsReached(dst_rows, rows) * width * 4, "dst")
      .Host(dst_rows.data(), int64_t(dst_rows.size_bytes()), "dst_rows")
      .Run([&] { kernels_->CopyRows(src, src_rows, dst, dst_rows, width); });
}

void CheckedBackend::CopyStrided(const float* src, int64_t src_stride, float* dst,
                                 int64_t dst_stride, int64_t rows, int64_t width) const {
  // The last row ends `width` after its start.
  auto extent = [&](int64_t stride) { return rows == 0 ? 0 : ((rows - 1) * stride + width) * 4; };
  Op(*this, "CopyStrided")
      .Device(src, extent(src_stride), "src")
      .Device(dst, extent(dst_stride), "dst")
      .Run([&] { kernels_->CopyStrided(src, src_stride, dst, dst_stride, rows, width); });
}

void CheckedBackend::Embed(const WeightView& embedding, std::span<const int> tokens,
                           std::span<const int> rows, float* out) const {
  Op(*this, "Embed")
      .Weights(embedding, "embedding")
      .Host(tokens.data(), int64_t(tokens.size_bytes()), "tokens")
      .Host(rows.data(), int64_t(rows.size_bytes()), "rows")
      .Device(out, int64_t(rows.size()) * embedding.cols * 4, "out")
      .Run([&] { kernels_->Embed(embedding, tokens, rows, out); });
}

void CheckedBackend::LmHeadBatch(float* x, RowSegments segments, int64_t c, const float* final_norm,
                                 float eps, const WeightView& lm_head, float* logits) const {
  const int64_t m = Sum(segments);
  Op(*this, "LmHeadBatch")
      .Device(x, m * c * 4, "x")
      .Host(segments.data(), int64_t(segments.size_bytes()), "segments")
      .Device(final_norm, c * 4, "final_norm")
      .Weights(lm_head, "lm_head")
      .Device(logits, m * lm_head.rows * 4, "logits")
      .Run([&] { kernels_->LmHeadBatch(x, segments, c, final_norm, eps, lm_head, logits); });
}

void CheckedBackend::HeadMeanDrift(DriftMetric metric, const float* now, const float* before,
                                   int64_t rows, int heads, int64_t l, double* out,
                                   DriftLogs logs) const {
  const int64_t entries = rows * heads * l;  // [rows, H, L]
  Op(*this, "HeadMeanDrift")
      .Device(now, entries * 4, "now")
      .Device(before, entries * 4, "before")
      .Host(out, rows * 8, "out")
      .Device(logs.now, logs.now != nullptr ? entries * 8 : 0, "logs.now")
      .Device(logs.before, logs.before != nullptr ? entries * 8 : 0, "logs.before")
      .Run([&] { kernels_->HeadMeanDrift(metric, now, before, rows, heads, l, out, logs); });
}

double CheckedBackend::MeanCrossHeadCosine(const float* now, std::span<const int> now_rows,
                                           const float* before, int heads, int64_t l) const {
  const int64_t row_bytes = int64_t(heads) * l * 4;  // [H, L]
  return Op(*this, "MeanCrossHeadCosine")
      .Device(now, RowsReached(now_rows, 0) * row_bytes, "now")
      .Host(now_rows.data(), int64_t(now_rows.size_bytes()), "now_rows")
      .Device(before, int64_t(now_rows.size()) * row_bytes, "before")
      .Run([&] { return kernels_->MeanCrossHeadCosine(now, now_rows, before, heads, l); });
}

void CheckedBackend::AttentionMass(const float* probs, std::span<const int> rows, int heads,
                                   int64_t l, double* mass) const {
  Op(*this, "AttentionMass")
      .Device(probs, RowsReached(rows, 0) * heads * l * 4, "probs")
      .Host(rows.data(), int64_t(rows.size_bytes()), "rows")
      .Device(mass, l * 8, "mass")
      .Run([&] { kernels_->AttentionMass(probs, rows, heads, l, mass); });
}

void CheckedBackend::TopKeys(const double* mass, std::span<const int> keys,
                             std::span<int> top) const {
  Op(*this, "TopKeys")
      .Device(mass, RowsReached(keys, 0) * 8, "mass")
      .Host(keys.data(), int64_t(keys.size_bytes()), "keys")
      .Host(top.data(), int64_t(top.size_bytes()), "top")
      .Run([&] { kernels_->TopKeys(mass, keys, top); });
}

void CheckedBackend::GroupByExpert(const int* chosen, const float* weights, RowSegments segments,
                                   int experts, int k, int* rows, float* row_weights, int* counts,
                                   int* slots) const {
  const int64_t m = Sum(segments);
  Op(*this, "GroupByExpert")
      .Device(chosen, m * k * 4, "chosen")
      .Device(weights, m * k * 4, "weights")
      .Host(segments.data(), int64_t(segments.size_bytes()), "segments")
      .Device(rows, m * k * 4, "rows")
      .Device(row_weights, m * k * 4, "row_weights")
      .Device(counts, int64_t(segments.size()) * experts * 4, "counts")
      .Device(slots, m * k * 4, "slots")
      .Run([&] {
        kernels_->GroupByExpert(chosen, weights, segments, experts, k, rows, row_weights, counts,
                                slots);
      });
}

void CheckedBackend::GatherRows(const float* src, const int* rows, int64_t n, float* dst,
                                int64_t width) const {
  Op(*this, "GatherRows")
      .Device(src, n > 0 ? width * 4 : 0, "src")
      .Device(rows, n * 4, "rows")
      .Device(dst, n * width * 4, "dst")
      .Run([&] { kernels_->GatherRows(src, rows, n, dst, width); });
}

void CheckedBackend::SphericalKMeans(const float* points, int64_t n, int64_t d, int k,
                                     int iterations, float* centroids, int* labels) const {
  Op(*this, "SphericalKMeans")
      .Device(points, n * d * 4, "points")
      .Device(centroids, int64_t(k) * d * 4, "centroids")
      .Device(labels, n * 4, "labels")
      .Run([&] { kernels_->SphericalKMeans(points, n, d, k, iterations, centroids, labels); });
}

void CheckedBackend::ShiftCentroids(const float* now, std::span<const int> now_rows,
                                    const float* before, std::span<const int> labels,
                                    std::span<const float> members, int64_t width,
                                    float* centroids) const {
  Op(*this, "ShiftCentroids")
      .Device(now, RowsReached(now_rows, 0) * width * 4, "now")
      .Host(now_rows.data(), int64_t(now_rows.size_bytes()), "now_rows")
      .Device(before, int64_t(now_rows.size()) * width * 4, "before")
      .Host(labels.data(), int64_t(labels.size_bytes()), "labels")
      .Host(members.data(), int64_t(members.size_bytes()), "members")
      .Device(centroids, int64_t(members.size()) * width * 4, "centroids")
      .Run([&] {
        kernels_->ShiftCentroids(now, now_rows, before, labels, members, width, centroids);
      });
}

void CheckedBackend::ResidualAbsMax(const float* x, std::span<const int> x_rows, const float* base,
                                    std::span<const int> labels, int64_t width, float* amax) const {
  Op(*this, "ResidualAbsMax")
      .Device(x, RowsReached(x_rows, 0) * width * 4, "x")
      .Host(x_rows.data(), int64_t(x_rows.size_bytes()), "x_rows")
      .Device(base, RowsReached(labels, 0) * width * 4, "base")
      .Host(labels.data(), int64_t(labels.size_bytes()), "labels")
      .Device(amax, 4, "amax")
      .Run([&] { kernels_->ResidualAbsMax(x, x_rows, base, labels, width, amax); });
}

void CheckedBackend::QuantizeResiduals(const float* x, std::span<const int> x_rows,
                                       const float* base, std::span<const int> labels,
                                       int64_t width, float tensor_scale, uint8_t* scales,
                                       uint8_t* values, std::span<const int> store_rows) const {
  const int64_t stored = RowsReached(store_rows, 0);
  Op(*this, "QuantizeResiduals")
      .Device(x, RowsReached(x_rows, 0) * width * 4, "x")
      .Host(x_rows.data(), int64_t(x_rows.size_bytes()), "x_rows")
      .Device(base, RowsReached(labels, 0) * width * 4, "base")
      .Host(labels.data(), int64_t(labels.size_bytes()), "labels")
      .Device(scales, stored * Nvfp4ScaleBytes(width), "scales")
      .Device(values, stored * Nvfp4ValueBytes(width), "values")
      .Host(store_rows.data(), int64_t(store_rows.size_bytes()), "store_rows")
      .Run([&] {
        kernels_->QuantizeResiduals(x, x_rows, base, labels, width, tensor_scale, scales, values,
                                    store_rows);
      });
}

void CheckedBackend::DequantizeResiduals(const uint8_t* scales, const uint8_t* values,
                                         std::span<const int> store_rows, const float* base,
                                         std::span<const int> labels, int64_t width,
                                         float tensor_scale, float* out,
                                         std::span<const int> out_rows) const {
  const int64_t stored = RowsReached(store_rows, 0);
  Op(*this, "DequantizeResiduals")
      .Device(scales, stored * Nvfp4ScaleBytes(width), "scales")
      .Device(values, stored * Nvfp4ValueBytes(width), "values")
      .Host(store_rows.data(), int64_t(store_rows.size_bytes()), "store_rows")
      .Device(base, RowsReached(labels, 0) * width * 4, "base")
      .Host(labels.data(), int64_t(labels.size_bytes()), "labels")
      .Device(out, RowsReached(out_rows, int64_t(store_rows.size())) * width * 4, "out")
      .Host(out_rows.data(), int64_t(out_rows.size_bytes()), "out_rows")
      .Run([&] {
        kernels_->DequantizeResiduals(scales, values, store_rows, base, labels, width, tensor_scale,
                                      out, out_rows);
      });
}

void CheckedBackend::GreedyChoices(const float* logits, int64_t m, int64_t vocab,
                                   const GreedySpec& spec, GreedyChoice* out) const {
  Op(*this, "GreedyChoices")
      .Device(logits, m * vocab * 4, "logits")
      .Host(out, m * int64_t(sizeof(GreedyChoice)), "out")
      .Run([&] { kernels_->GreedyChoices(logits, m, vocab, spec, out); });
}

}  // namespace polestar
