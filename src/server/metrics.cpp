#include "server/metrics.h"

namespace polestar {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += value;
}

void Histogram::Render(std::ostringstream& out, const std::string& name) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cumulative << '\n';
  }
  cumulative += counts_.back();
  out << name << "_bucket{le=\"+Inf\"} " << cumulative << '\n';
  out << name << "_sum " << sum_ << '\n';
  out << name << "_count " << cumulative << '\n';
}

Metrics::Metrics()
    : step_seconds_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5}),
      batch_size_({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256}),
      batch_rows_({8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}) {}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::ObserveStep(double seconds, int sequences, int64_t rows) {
  forward_passes_ += sequences;
  std::lock_guard lock(mutex_);
  step_seconds_.Observe(seconds);
  batch_size_.Observe(sequences);
  batch_rows_.Observe(double(rows));
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
  header("forward_passes_total", "counter",
         "Denoising steps (NFE) over all requests; a batched forward counts one per sequence.");
  out << "polestar_forward_passes_total " << forward_passes_ << '\n';
  header("step_seconds", "histogram",
         "Latency of one batched step (one forward over every sequence in the batch).");
  step_seconds_.Render(out, "polestar_step_seconds");
  header("batch_size", "histogram", "Sequences in one batched forward.");
  batch_size_.Render(out, "polestar_batch_size");
  header("batch_rows", "histogram", "Input rows of one batched forward, all its sequences.");
  batch_rows_.Render(out, "polestar_batch_rows");
  header("kv_bytes_in_use", "gauge", "Cache bytes held by the running generations.");
  out << "polestar_kv_bytes_in_use " << kv_bytes_in_use_ << '\n';
  header("kv_budget_bytes", "gauge", "The cache bytes running generations may hold at once.");
  out << "polestar_kv_budget_bytes " << kv_budget_bytes_ << '\n';
  header("queue_depth", "gauge", "Generations admitted and waiting to run.");
  out << "polestar_queue_depth " << queue_depth << '\n';
  header("requests_processing", "gauge", "Generations running (in the batch or its turn).");
  out << "polestar_requests_processing " << processing_ << '\n';
  header("model_loaded", "gauge", "1 once the model is loaded and requests are served.");
  out << "polestar_model_loaded " << (model_loaded_ ? 1 : 0) << '\n';
  return out.str();
}

}  // namespace polestar
