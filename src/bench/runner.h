// Running a suite under one decoding configuration, its items batched, and what is kept of
// it: a record per item, a summary per run, and an append-only store that makes runs resumable.
//
// Counting protocols (SPEC §3), all as ratios of sums over the items:
//   TPF until EOS  = tokens before the first EOS / forward passes   (Fast-dLLM's)
//   TPF non-EOS    = generated tokens that are not EOS / passes      (Polestar's)
//   TPF all        = canvas positions / passes
//   TPS            = the same token counts / wall seconds of decoding (grading excluded); in a
//                    batched run each forward's time is shared among its sequences, so the
//                    items' seconds add up to the wall time of the whole run
//   items/s        = items / the same seconds
//   rows per token = (layer, position) rows computed / canvas positions
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench/machine.h"
#include "bench/suites.h"
#include "decode/options.h"
#include "model/forward.h"
#include "model/model.h"

namespace polestar::bench {

// Bytes between host and backend by step kind, from step counts and byte sums per kind (a
// generation's, or several added up): {kind: {"steps", "bytes_to_backend", "bytes_to_host",
// "bytes_to_backend_per_step", "bytes_to_host_per_step"}}, per step as the mean over them.
template <typename Count>
nlohmann::ordered_json TransfersJson(const std::map<std::string, Count>& steps,
                                     const std::map<std::string, TransferBytes>& bytes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [kind, sum] : bytes) {
    const auto it = steps.find(kind);
    const int64_t n = it == steps.end() ? 0 : int64_t(it->second);
    out[kind] = {{"steps", n},
                 {"bytes_to_backend", sum.to_backend},
                 {"bytes_to_host", sum.to_host},
                 {"bytes_to_backend_per_step", n > 0 ? double(sum.to_backend) / double(n) : 0.0},
                 {"bytes_to_host_per_step", n > 0 ? double(sum.to_host) / double(n) : 0.0}};
  }
  return out;
}

struct ItemRecord {
  std::string id;
  std::string task;
  int nfe = 0;
  int64_t rows_computed = 0;
  double seconds = 0;
  int positions = 0;  // canvas length (gen_length)
  int tokens_until_eos = 0;
  int non_eos_tokens = 0;
  int64_t cache_bytes = 0;
  int64_t peak_rss_bytes = 0;
  std::map<std::string, int> step_kinds;                // forwards by cost class
  std::map<std::string, TransferBytes> step_transfers;  // host <-> backend bytes by cost class
  std::vector<std::pair<std::string, bool>> metrics;    // suite metrics in order
  std::string extracted;
  std::string completion;

  nlohmann::json ToJson() const;
  // Throws Error when a field is missing or has the wrong type.
  static ItemRecord FromJson(const nlohmann::json& j);
};

// Decodes and grades the items `indices` of `suite`, at most `batch` sequences per forward (a
// finished sequence's place goes to the next item), and calls `on_record` for each in the
// order of `indices`, once it and those before it are done. Each forward's time on `clock` is
// shared among its sequences in proportion to their rows, so an item's `seconds` is its share
// and the items' seconds add up to the decoding time of the whole run. An item's peak RSS is
// the process's since the batch was last empty (at batch 1: while decoding it alone).
// Throws Error for invalid options before any work, and the error of a sequence that fails.
void DecodeItems(const Model& model, const BenchSuite& suite, std::span<const std::size_t> indices,
                 const DecodeOptions& options, int batch, Clock clock,
                 const std::function<void(const ItemRecord&)>& on_record);

struct Totals {
  int64_t items = 0;
  int64_t nfe = 0;
  int64_t rows_computed = 0;
  double seconds = 0;
  int64_t positions = 0;
  int64_t tokens_until_eos = 0;
  int64_t non_eos_tokens = 0;
  std::map<std::string, int64_t> correct;               // per metric
  std::map<std::string, int64_t> step_kinds;            // forwards by cost class
  std::map<std::string, TransferBytes> step_transfers;  // host <-> backend bytes by cost class

  void Add(const ItemRecord& r);
  double Accuracy(const std::string& metric) const;
  double MeanNfe() const { return items ? double(nfe) / double(items) : 0; }
  double TpfUntilEos() const { return nfe ? double(tokens_until_eos) / double(nfe) : 0; }
  double TpfNonEos() const { return nfe ? double(non_eos_tokens) / double(nfe) : 0; }
  double TpfAll() const { return nfe ? double(positions) / double(nfe) : 0; }
  double TpsUntilEos() const { return seconds > 0 ? double(tokens_until_eos) / seconds : 0; }
  double TpsNonEos() const { return seconds > 0 ? double(non_eos_tokens) / seconds : 0; }
  double ItemsPerSecond() const { return seconds > 0 ? double(items) / seconds : 0; }
  double RowsPerToken() const { return positions ? double(rows_computed) / double(positions) : 0; }
};

struct RunSummary {
  std::vector<std::string> metric_names;
  Totals overall;
  std::vector<std::pair<std::string, Totals>> per_task;  // in the order tasks first appear
  int64_t peak_rss_bytes = 0;                            // the largest over the items
  int64_t cache_bytes = 0;                               // the largest over the items

  double Accuracy() const { return overall.Accuracy(metric_names.at(0)); }
  // {"items", "accuracy", "metrics": {m: acc}, "nfe_mean", "tpf": {...}, "tps": {...},
  //  "rows_per_token", "step_kinds", "transfers", "seconds", "items_per_second", "peak_rss_bytes",
  //  "cache_bytes", "per_task": {...}}
  nlohmann::ordered_json ToJson() const;
};

RunSummary Summarize(const std::vector<ItemRecord>& records,
                     const std::vector<std::string>& metric_names);

// Every decoding option by its canonical name (option_schema.h), for the record (and the
// result key).
nlohmann::json OptionsToJson(const DecodeOptions& options);

// A short stable hash of what determines a run's results: the model, the suite selection
// and the resolved options.
std::string RunKey(const std::string& model_id, const nlohmann::json& selection,
                   const nlohmann::json& options);

// items.jsonl (one line per decoded item) and results.jsonl (one line per finished run) in
// a folder. Lines are appended and flushed one at a time, a run's items in suite order, so an
// interrupted run loses at most the items in flight (and those finished after them); a torn
// last line is skipped when reading.
class ResultStore {
 public:
  // Creates `dir` when needed and reads what is there. Throws Error naming the folder.
  explicit ResultStore(std::string dir);

  const std::string& dir() const { return dir_; }
  std::vector<ItemRecord> Items(const std::string& run_key) const;
  const nlohmann::json* Row(const std::string& run_key) const;
  // The keys of the finished runs, in the order their lines were written.
  const std::vector<std::string>& row_keys() const { return row_keys_; }
  void AppendItem(const std::string& run_key, const ItemRecord& record);
  void AppendRow(const nlohmann::ordered_json& row);  // row["key"] names the run
  int skipped_lines() const { return skipped_lines_; }

 private:
  std::string dir_;
  std::map<std::string, std::vector<ItemRecord>> items_;
  std::map<std::string, nlohmann::json> rows_;
  std::vector<std::string> row_keys_;
  int skipped_lines_ = 0;
};

}  // namespace polestar::bench
