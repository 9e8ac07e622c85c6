// `polestar bench` and `polestar eval` as a library: a grid of decoding configurations run
// over a suite, resumable through a ResultStore, reported as JSON lines, CSV, Markdown and a
// Pareto plot.
//
// Defaults a run gets unless its flags or grid set them (so each policy runs as published):
//   --gen-length, --block-length  the suite's suggestion (probe 32/8, tiny 32/8, long 128/32,
//   others 256/32)
//   --steps                       = gen length (the fixed-count rule commits one token a step)
//   --threshold                   0.9 for fast-dllm-prefix, fast-dllm-dual and elastic-cache
//                                 (Fast-dLLM's parallel decoding); polestar uses --tau-s
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "bench/grid.h"
#include "bench/machine.h"
#include "bench/report.h"
#include "bench/runner.h"

namespace polestar::bench {

// The options of one grid point: `base` (the command's decoding flags, of which
// `explicit_keys` were given), the suite's and the policies' defaults, then the point.
DecodeOptions ResolvePoint(const DecodeOptions& base, const std::set<std::string>& explicit_keys,
                           const GridPoint& point, const BenchSuite& suite,
                           const OptionSetter& set);

struct BenchRequest {
  std::string model_dir;
  std::vector<GridPoint> points;
  DecodeOptions base;
  std::set<std::string> explicit_keys;  // decode flags given on the command line (dash form)
  OptionSetter setter;
  std::string out_dir;
  MachineInfo machine;
  Protocol protocol = Protocol::kUntilEos;
  Clock clock = Clock::kWall;  // of TPS; part of the result key
  int batch = 1;               // sequences per forward; part of the result key when above 1
  bool plot = true;
  bool progress = true;  // a progress bar with ETA on stderr
};

struct BenchOutcome {
  std::vector<ResultRow> rows;                              // one per grid point, in grid order
  std::vector<std::string> files;                           // written
  std::vector<std::pair<std::string, std::string>> failed;  // (label, error) of runs that threw
  int runs_skipped = 0;                                     // already finished in the output folder
  int items_decoded = 0;                                    // decoded by this call
};

// Runs every point not yet finished in request.out_dir (items already decoded for a point are
// reused), then writes results.csv, results.md, pareto.{dat,gp,svg,png} and run.json.
BenchOutcome RunBench(const Model& model, const BenchSuite& suite, const BenchRequest& request);

// Runs one configuration over the suite without storing anything (polestar eval), `batch`
// items per forward. `on_item` (optional) sees each record as it finishes, in suite order.
RunSummary RunSuite(
    const Model& model, const BenchSuite& suite, const DecodeOptions& options,
    const std::function<void(std::size_t done, const ItemRecord&)>& on_item = nullptr,
    Clock clock = Clock::kWall, int batch = 1);

struct MergeRequest {
  std::vector<std::string> shard_dirs;  // output folders of bench --shard i/n runs
  std::string out_dir;
  MachineInfo machine;  // of the merging command
  Protocol protocol = Protocol::kUntilEos;
  bool plot = true;
};

// Joins the shards of every run found in request.shard_dirs (any number of shards a folder)
// into the run the same command without --shard makes: its items in order, its summary, its
// key, so out_dir holds what the unsharded command writes (results.jsonl, items.jsonl, the
// tables and the plot; run.json names the shard folders), and a rerun of that command there
// finds it done. Runs already in out_dir are kept. Throws Error, before writing, when a run
// lacks a shard (the folders hold runs of different models, suites or settings, or a shard
// has not finished), when two folders hold the same shard, when shards of one run split it
// differently, or when a folder holds no finished run.
BenchOutcome MergeShards(const MergeRequest& request);

// Progress over a known number of items: a bar with rate and ETA, redrawn in place on a
// terminal and printed every 10 s otherwise.
class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled);
  ~ProgressBar();
  void Update(int64_t done, const std::string& what);
  void Finish();
  // "1h02m", "4m05s", "12s".
  static std::string FormatDuration(double seconds);

 private:
  int64_t total_;
  bool enabled_, tty_;
  double started_;
  double last_print_ = -1e9;
  bool finished_ = false;
};

}  // namespace polestar::bench
