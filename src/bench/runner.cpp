#include "bench/runner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "base/error.h"
#include "bench/machine.h"
#include "decode/generate.h"
#include "decode/option_schema.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

template <typename T>
T Field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) Fail("item record lacks '", key, "'");
  return j[key].get<T>();
}

template <typename Json>
void AppendLine(const std::string& path, const Json& value) {
  std::ofstream out(path, std::ios::app);
  if (!out) Fail(path, ": cannot append");
  out << value.dump() << '\n';
  out.flush();
  if (!out) Fail(path, ": write failed");
}

// Calls fn(json) for every line that parses; returns the number of lines that did not.
template <typename Fn>
int ReadLines(const std::string& path, Fn fn) {
  std::ifstream in(path);
  int skipped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json value = nlohmann::json::parse(line, nullptr, false);
    if (value.is_discarded() || !value.is_object() || !value.contains("key")) {
      ++skipped;
      continue;
    }
    try {
      fn(value);
    } catch (const std::exception&) {
      ++skipped;
    }
  }
  return skipped;
}

}  // namespace

nlohmann::json ItemRecord::ToJson() const {
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [name, correct] : metrics) m[name] = correct;
  return {{"id", id},
          {"task", task},
          {"nfe", nfe},
          {"rows_computed", rows_computed},
          {"seconds", seconds},
          {"positions", positions},
          {"tokens_until_eos", tokens_until_eos},
          {"non_eos_tokens", non_eos_tokens},
          {"cache_bytes", cache_bytes},
          {"peak_rss_bytes", peak_rss_bytes},
          {"step_kinds", step_kinds},
          {"transfers", TransfersJson(step_kinds, step_transfers)},
          {"metrics", m},
          {"metric_order",
           [&] {
             std::vector<std::string> names;
             for (const auto& [name, correct] : metrics) names.push_back(name);
             return names;
           }()},
          {"extracted", extracted},
          {"completion", completion}};
}

ItemRecord ItemRecord::FromJson(const nlohmann::json& j) {
  ItemRecord r;
  r.id = Field<std::string>(j, "id");
  r.task = Field<std::string>(j, "task");
  r.nfe = Field<int>(j, "nfe");
  r.rows_computed = Field<int64_t>(j, "rows_computed");
  r.seconds = Field<double>(j, "seconds");
  r.positions = Field<int>(j, "positions");
  r.tokens_until_eos = Field<int>(j, "tokens_until_eos");
  r.non_eos_tokens = Field<int>(j, "non_eos_tokens");
  r.cache_bytes = Field<int64_t>(j, "cache_bytes");
  r.peak_rss_bytes = Field<int64_t>(j, "peak_rss_bytes");
  // Records written before step kinds were counted have none.
  if (j.contains("step_kinds")) r.step_kinds = Field<std::map<std::string, int>>(j, "step_kinds");
  // ... nor transfers, counted later still.
  if (j.contains("transfers")) {
    for (const auto& [kind, bytes] : j.at("transfers").items()) {
      r.step_transfers[kind] = {Field<int64_t>(bytes, "bytes_to_backend"),
                                Field<int64_t>(bytes, "bytes_to_host")};
    }
  }
  const nlohmann::json& metrics = Field<nlohmann::json>(j, "metrics");
  for (const std::string& name : Field<std::vector<std::string>>(j, "metric_order")) {
    if (!metrics.contains(name)) Fail("item record lacks metric '", name, "'");
    r.metrics.emplace_back(name, metrics[name].get<bool>());
  }
  r.extracted = Field<std::string>(j, "extracted");
  r.completion = Field<std::string>(j, "completion");
  return r;
}

namespace {

ItemRecord GradedRecord(const BenchSuite& suite, std::size_t index, const GenerationResult& g,
                        double seconds) {
  const BenchItem& item = suite.items.at(index);
  ItemRecord r;
  r.peak_rss_bytes = PeakRssBytes();
  r.id = item.id;
  r.task = item.task;
  r.nfe = g.nfe;
  r.rows_computed = g.rows_computed;
  r.seconds = seconds;
  r.positions = int(g.generated.size());
  r.tokens_until_eos = g.tokens_until_eos;
  r.non_eos_tokens = g.non_eos_tokens;
  r.cache_bytes = g.cache_bytes;
  r.step_kinds = g.step_kinds;
  r.step_transfers = g.step_transfers;
  const ItemGrade graded = suite.grade(index, g.generated);
  for (const eval::MetricScore& m : graded.grade.metrics)
    r.metrics.emplace_back(m.metric, m.correct);
  r.extracted = graded.grade.extracted;
  r.completion = graded.completion;
  return r;
}

}  // namespace

// GenerateBatch has the same refill rule but returns only once every request is done; here
// each item is graded and handed on as it finishes (the store stays resumable, progress
// moves), and each forward's time is shared out, which needs the steps one by one.
void DecodeItems(const Model& model, const BenchSuite& suite, std::span<const std::size_t> indices,
                 const DecodeOptions& options, int batch, Clock clock,
                 const std::function<void(const ItemRecord&)>& on_record) {
  if (batch < 1) Fail("the batch size must be at least 1, not ", batch);
  for (std::size_t index : indices)
    options.Validate(model.config(), int(suite.items.at(index).prompt.size()));
  struct Active {
    std::size_t slot;  // in `indices`
    std::unique_ptr<Sequence> sequence;
    double seconds = 0;  // its share of the forwards so far
  };
  std::vector<Active> active;
  std::map<std::size_t, ItemRecord> finished;  // by slot, until those before it are handed on
  std::vector<Sequence*> step;                 // [active.size()]
  std::vector<int64_t> rows;                   // [active.size()] each sequence's rows this step
  std::size_t next = 0, handed_on = 0;
  while (handed_on < indices.size()) {
    if (active.empty()) ResetPeakRss();
    while (active.size() < std::size_t(batch) && next < indices.size()) {
      active.push_back(
          {next, std::make_unique<Sequence>(model, suite.items[indices[next]].prompt, options)});
      ++next;
    }
    step.clear();
    rows.clear();
    int64_t total_rows = 0;
    for (Active& a : active) {
      step.push_back(a.sequence.get());
      rows.push_back(a.sequence->NextStepRows());
      total_rows += rows.back();
    }
    const double started = ClockSeconds(clock);
    StepBatch(step);
    const double elapsed = ClockSeconds(clock) - started;
    for (std::size_t i = 0; i < active.size(); ++i) {
      active[i].seconds += total_rows > 0 ? elapsed * double(rows[i]) / double(total_rows)
                                          : elapsed / double(active.size());
    }
    for (auto it = active.begin(); it != active.end();) {
      if (!it->sequence->done()) {
        ++it;
        continue;
      }
      it->sequence->RethrowFailure();
      finished.emplace(it->slot, GradedRecord(suite, indices[it->slot], it->sequence->TakeResult(),
                                              it->seconds));
      it = active.erase(it);
    }
    for (auto it = finished.find(handed_on); it != finished.end(); it = finished.find(handed_on)) {
      on_record(it->second);
      finished.erase(it);
      ++handed_on;
    }
  }
}

void Totals::Add(const ItemRecord& r) {
  items += 1;
  nfe += r.nfe;
  rows_computed += r.rows_computed;
  seconds += r.seconds;
  positions += r.positions;
  tokens_until_eos += r.tokens_until_eos;
  non_eos_tokens += r.non_eos_tokens;
  for (const auto& [metric, ok] : r.metrics) correct[metric] += ok ? 1 : 0;
  for (const auto& [kind, count] : r.step_kinds) step_kinds[kind] += count;
  for (const auto& [kind, bytes] : r.step_transfers) {
    step_transfers[kind].to_backend += bytes.to_backend;
    step_transfers[kind].to_host += bytes.to_host;
  }
}

double Totals::Accuracy(const std::string& metric) const {
  const auto it = correct.find(metric);
  return items && it != correct.end() ? double(it->second) / double(items) : 0;
}

namespace {

nlohmann::ordered_json TotalsJson(const Totals& t, const std::vector<std::string>& metric_names) {
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
  for (const std::string& m : metric_names) metrics[m] = t.Accuracy(m);
  nlohmann::ordered_json j = {
      {"items", t.items},
      {"accuracy", metric_names.empty() ? 0.0 : t.Accuracy(metric_names[0])},
      {"metrics", metrics},
      {"nfe_mean", t.MeanNfe()},
      {"tpf",
       {{"until_eos", t.TpfUntilEos()}, {"non_eos", t.TpfNonEos()}, {"all_positions", t.TpfAll()}}},
      {"tps", {{"until_eos", t.TpsUntilEos()}, {"non_eos", t.TpsNonEos()}}},
      {"rows_per_token", t.RowsPerToken()},
      {"step_kinds", t.step_kinds},
      {"transfers", TransfersJson(t.step_kinds, t.step_transfers)},
      {"seconds", t.seconds},
      {"items_per_second", t.ItemsPerSecond()}};
  return j;
}

}  // namespace

nlohmann::ordered_json RunSummary::ToJson() const {
  nlohmann::ordered_json j = TotalsJson(overall, metric_names);
  j["peak_rss_bytes"] = peak_rss_bytes;
  j["cache_bytes"] = cache_bytes;
  nlohmann::ordered_json tasks = nlohmann::ordered_json::object();
  for (const auto& [task, totals] : per_task) tasks[task] = TotalsJson(totals, metric_names);
  j["per_task"] = tasks;
  return j;
}

RunSummary Summarize(const std::vector<ItemRecord>& records,
                     const std::vector<std::string>& metric_names) {
  RunSummary s;
  s.metric_names = metric_names;
  for (const ItemRecord& r : records) {
    s.overall.Add(r);
    auto it = std::find_if(s.per_task.begin(), s.per_task.end(),
                           [&](const auto& entry) { return entry.first == r.task; });
    if (it == s.per_task.end()) {
      s.per_task.emplace_back(r.task, Totals{});
      it = s.per_task.end() - 1;
    }
    it->second.Add(r);
    s.peak_rss_bytes = std::max(s.peak_rss_bytes, r.peak_rss_bytes);
    s.cache_bytes = std::max(s.cache_bytes, r.cache_bytes);
  }
  return s;
}

nlohmann::json OptionsToJson(const DecodeOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  for (const OptionSpec& option : OptionSchema()) j[option.name] = OptionValueJson(option, o);
  return j;
}

std::string RunKey(const std::string& model_id, const nlohmann::json& selection,
                   const nlohmann::json& options) {
  // nlohmann::json objects are ordered by key, so the dump is canonical.
  const std::string text =
      nlohmann::json{{"model", model_id}, {"suite", selection}, {"options", options}}.dump();
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

ResultStore::ResultStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) Fail(dir_, ": cannot create the output folder (", ec.message(), ")");
  skipped_lines_ +=
      ReadLines((fs::path(dir_) / "items.jsonl").string(), [&](const nlohmann::json& j) {
        items_[j["key"].get<std::string>()].push_back(ItemRecord::FromJson(j));
      });
  skipped_lines_ +=
      ReadLines((fs::path(dir_) / "results.jsonl").string(), [&](const nlohmann::json& j) {
        const std::string key = j["key"].get<std::string>();
        if (rows_.count(key) == 0) row_keys_.push_back(key);
        rows_[key] = j;
      });
}

std::vector<ItemRecord> ResultStore::Items(const std::string& run_key) const {
  const auto it = items_.find(run_key);
  return it == items_.end() ? std::vector<ItemRecord>{} : it->second;
}

const nlohmann::json* ResultStore::Row(const std::string& run_key) const {
  const auto it = rows_.find(run_key);
  return it == rows_.end() ? nullptr : &it->second;
}

void ResultStore::AppendItem(const std::string& run_key, const ItemRecord& record) {
  nlohmann::json line = record.ToJson();
  line["key"] = run_key;
  AppendLine((fs::path(dir_) / "items.jsonl").string(), line);
  items_[run_key].push_back(record);
}

void ResultStore::AppendRow(const nlohmann::ordered_json& row) {
  PS_CHECK(row.contains("key"));
  AppendLine((fs::path(dir_) / "results.jsonl").string(), row);
  const std::string key = row["key"].get<std::string>();
  if (rows_.count(key) == 0) row_keys_.push_back(key);
  rows_[key] = nlohmann::json(row);
}

}  // namespace polestar::bench
