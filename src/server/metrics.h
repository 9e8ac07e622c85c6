// Server counters in the Prometheus text format (namespace polestar_). Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace polestar {

class Metrics {
 public:
  void CountRequest(const std::string& endpoint, int status);
  void AddPromptTokens(int64_t n) { prompt_tokens_ += n; }
  void AddGeneratedTokens(int64_t n) { generated_tokens_ += n; }
  void ObserveStep(double seconds);  // one forward pass: its latency, and the pass itself
  void SetModelLoaded(bool loaded) { model_loaded_ = loaded; }
  void AddProcessing(int delta) { processing_ += delta; }

  int64_t RequestCount(const std::string& endpoint, int status) const;
  int64_t ForwardPasses() const { return forward_passes_; }

  // `queue_depth`: requests admitted and waiting for a worker, sampled by the caller.
  std::string Render(int queue_depth) const;

 private:
  static constexpr std::array<double, 12> kStepBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                          0.05,   0.1,   0.25,   0.5,   1.0,  2.5};
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;      // (endpoint, status) -> count
  std::array<int64_t, kStepBuckets.size() + 1> step_buckets_{};  // last: +Inf
  double step_seconds_sum_ = 0;
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, forward_passes_{0};
  std::atomic<int> processing_{0};
  std::atomic<bool> model_loaded_{false};
};

}  // namespace polestar
