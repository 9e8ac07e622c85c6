#include "server/metrics.h"

#include <sstream>

namespace polestar {

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::ObserveStep(double seconds) {
  ++forward_passes_;
  std::lock_guard lock(mutex_);
  size_t bucket = 0;
  while (bucket < kStepBuckets.size() && seconds > kStepBuckets[bucket]) ++bucket;
  ++step_buckets_[bucket];
  step_seconds_sum_ += seconds;
}

int64_t Metrics::RequestCount(const std::string& endpoint, int status) const {
  std::lock_guard lock(mutex_);
  const auto it = requests_.find({endpoint, status});
  return it == requests_.end() ? 0 : it->second;
}

std::string Metrics::Render(int queue_depth) const {
  std::ostringstream out;
  out.precision(10);
  auto header = [&](const char* name, const char* type, const char* help) {
    out << "# HELP polestar_" << name << ' ' << help << "\n# TYPE polestar_" << name << ' ' << type
        << '\n';
  };
  std::lock_guard lock(mutex_);
  header("requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
  for (const auto& [key, count] : requests_) {
    out << "polestar_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second
        << "\"} " << count << '\n';
  }
  header("prompt_tokens_total", "counter", "Prompt tokens of admitted generations.");
  out << "polestar_prompt_tokens_total " << prompt_tokens_ << '\n';
  header("tokens_generated_total", "counter", "Completion tokens returned to clients.");
  out << "polestar_tokens_generated_total " << generated_tokens_ << '\n';
  header("forward_passes_total", "counter", "Model forward passes (NFE) over all requests.");
  out << "polestar_forward_passes_total " << forward_passes_ << '\n';
  header("step_seconds", "histogram", "Latency of one denoising step (one forward pass).");
  int64_t cumulative = 0;
  for (size_t i = 0; i < kStepBuckets.size(); ++i) {
    cumulative += step_buckets_[i];
    out << "polestar_step_seconds_bucket{le=\"" << kStepBuckets[i] << "\"} " << cumulative << '\n';
  }
  cumulative += step_buckets_.back();
  out << "polestar_step_seconds_bucket{le=\"+Inf\"} " << cumulative << '\n';
  out << "polestar_step_seconds_sum " << step_seconds_sum_ << '\n';
  out << "polestar_step_seconds_count " << cumulative << '\n';
  header("queue_depth", "gauge", "Generations admitted and waiting for a worker.");
  out << "polestar_queue_depth " << queue_depth << '\n';
  header("requests_processing", "gauge", "Generations running on a worker.");
  out << "polestar_requests_processing " << processing_ << '\n';
  header("model_loaded", "gauge", "1 once the model is loaded and requests are served.");
  out << "polestar_model_loaded " << (model_loaded_ ? 1 : 0) << '\n';
  return out.str();
}

}  // namespace polestar
