// Server counters in the Prometheus text format (namespace polestar_). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace polestar {

// Observations counted by the least upper bound they fall under, and their sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // ascending; +Inf follows them
  void Observe(double value);
  // The _bucket (cumulative), _sum and _count lines of `name`.
  void Render(std::ostringstream& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1]: per bucket, not cumulative; last: +Inf
  double sum_ = 0;
};

class Metrics {
 public:
  Metrics();
  void CountRequest(const std::string& endpoint, int status);
  void AddPromptTokens(int64_t n) { prompt_tokens_ += n; }
  void AddGeneratedTokens(int64_t n) { generated_tokens_ += n; }
  // One batched forward: its latency, its sequences (each a step, one NFE, of its request)
  // and its input rows.
  void ObserveStep(double seconds, int sequences, int64_t rows);
  void SetModelLoaded(bool loaded) { model_loaded_ = loaded; }
  void AddProcessing(int delta) { processing_ += delta; }
  void SetKvBytesInUse(int64_t bytes) { kv_bytes_in_use_ = bytes; }
  void SetKvBudget(int64_t bytes) { kv_budget_bytes_ = bytes; }

  int64_t RequestCount(const std::string& endpoint, int status) const;
  int64_t ForwardPasses() const { return forward_passes_; }  // sequence steps, all requests

  // `queue_depth`: requests admitted and waiting to run, sampled by the caller.
  std::string Render(int queue_depth) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (endpoint, status) -> count
  Histogram step_seconds_, batch_size_, batch_rows_;         // guarded by mutex_
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, forward_passes_{0};
  std::atomic<int64_t> kv_bytes_in_use_{0}, kv_budget_bytes_{0};
  std::atomic<int> processing_{0};
  std::atomic<bool> model_loaded_{false};
};

}  // namespace polestar
