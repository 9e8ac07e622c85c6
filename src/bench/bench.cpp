#include "bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "decode/policy_registry.h"
#include "io/atomic_file.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Given(const std::set<std::string>& explicit_keys, const GridPoint& point,
           const std::string& key) {
  if (explicit_keys.count(key) != 0) return true;
  for (const auto& [k, v] : point.settings) {
    if (k == key) return true;
  }
  return false;
}

// The model folder and the size of its weights: a rewritten checkpoint gets new keys.
std::string ModelId(const std::string& model_dir) {
  const fs::path dir = fs::absolute(model_dir).lexically_normal();
  uintmax_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors" || entry.path().extension() == ".gguf") {
      bytes += entry.file_size(ec);
    }
  }
  return Cat(dir.string(), " (", bytes, " bytes)");
}

void WriteText(const std::string& path, const std::string& text) {
  WriteFileAtomically(path, text);
}

// The tables, run.json and the plot of `outcome.rows` in `out_dir`; adds the files to
// outcome.files.
void WriteReports(BenchOutcome& outcome, const ReportContext& context,
                  const nlohmann::ordered_json& run, const std::string& out_dir, bool plot) {
  const fs::path dir(out_dir);
  WriteText((dir / "results.csv").string(), CsvTable(outcome.rows));
  std::string markdown = MarkdownReport(outcome.rows, context);
  for (const auto& [label, error] : outcome.failed)
    markdown += "\nNot run: " + label + ": " + error + "\n";
  WriteText((dir / "results.md").string(), markdown);
  WriteText((dir / "run.json").string(), run.dump(2) + "\n");
  outcome.files = {(dir / "results.jsonl").string(), (dir / "items.jsonl").string(),
                   (dir / "results.csv").string(), (dir / "results.md").string(),
                   (dir / "run.json").string()};
  if (plot) {
    for (const std::string& f : WritePlot(outcome.rows, context, (dir / "pareto").string())) {
      outcome.files.push_back(f);
    }
  }
}

}  // namespace

DecodeOptions ResolvePoint(const DecodeOptions& base, const std::set<std::string>& explicit_keys,
                           const GridPoint& point, const BenchSuite& suite,
                           const OptionSetter& set) {
  DecodeOptions o = base;
  o.policy = point.policy;
  if (!Given(explicit_keys, point, "gen-length")) o.gen_length = suite.gen_length;
  if (!Given(explicit_keys, point, "block-length")) o.block_length = suite.block_length;
  for (const auto& [key, value] : point.settings) set(o, key, value);
  if (!Given(explicit_keys, point, "steps")) o.steps = o.gen_length;
  const PolicyEntry* entry = FindPolicy(o.policy);
  if (entry && entry->paper_threshold && !Given(explicit_keys, point, "threshold") &&
      !Given(explicit_keys, point, "factor")) {
    o.threshold = entry->paper_threshold;
  }
  return o;
}

RunSummary RunSuite(const Model& model, const BenchSuite& suite, const DecodeOptions& options,
                    const std::function<void(std::size_t, const ItemRecord&)>& on_item, Clock clock,
                    int batch) {
  std::vector<std::size_t> indices(suite.items.size());
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = i;
  std::vector<ItemRecord> records;
  DecodeItems(model, suite, indices, options, batch, clock, [&](const ItemRecord& record) {
    records.push_back(record);
    if (on_item) on_item(records.size(), records.back());
  });
  return Summarize(records, suite.metric_names);
}

BenchOutcome RunBench(const Model& model, const BenchSuite& suite, const BenchRequest& request) {
  if (suite.items.empty())
    Fail("suite ", suite.name, " has no items (check --limit / --shard / --per-task)");
  ResultStore store(request.out_dir);
  if (store.skipped_lines() > 0) {
    std::fprintf(stderr, "%s: skipped %d unreadable line(s) (an interrupted write?)\n",
                 request.out_dir.c_str(), store.skipped_lines());
  }
  const std::string model_id = ModelId(request.model_dir);
  nlohmann::json selection = suite.selection;
  selection["clock"] = ClockName(request.clock);
  // Batch 1 keeps the keys runs had before batching, so their results stay valid.
  if (request.batch > 1) selection["batch"] = request.batch;
  // A backend that gives the CPU's tokens shares its keys (its timings differ as a machine's
  // do); one that does not keeps its own results.
  const std::string backend(model.backend().name());
  if (!model.backend().contract().exact_to_scalar_twins) selection["backend"] = backend;

  struct Planned {
    GridPoint point;
    DecodeOptions options;
    std::string key;
    std::vector<ItemRecord> done;
  };
  std::vector<Planned> plan;
  BenchOutcome outcome;
  int64_t to_decode = 0;
  for (const GridPoint& point : request.points) {
    Planned p{point,
              ResolvePoint(request.base, request.explicit_keys, point, suite, request.setter),
              "",
              {}};
    // Validate every point before any work, so a typo in the last one fails at once.
    p.options.Validate(model.config(), int(suite.items[0].prompt.size()));
    p.key = RunKey(model_id, selection, OptionsToJson(p.options.Resolved(model.config())));
    if (store.Row(p.key) != nullptr) {
      ++outcome.runs_skipped;
    } else {
      p.done = store.Items(p.key);
      to_decode +=
          int64_t(suite.items.size()) - int64_t(std::min(p.done.size(), suite.items.size()));
    }
    plan.push_back(std::move(p));
  }

  ProgressBar progress(to_decode, request.progress);
  int64_t decoded = 0;
  for (size_t r = 0; r < plan.size(); ++r) {
    Planned& p = plan[r];
    if (store.Row(p.key) != nullptr) continue;
    std::vector<ItemRecord> records(suite.items.size());
    std::vector<std::size_t> to_run;  // items not decoded yet, in suite order
    for (size_t i = 0; i < suite.items.size(); ++i) {
      const auto it = std::find_if(p.done.begin(), p.done.end(),
                                   [&](const ItemRecord& d) { return d.id == suite.items[i].id; });
      if (it != p.done.end()) {
        records[i] = *it;
      } else {
        to_run.push_back(i);
      }
    }
    try {
      std::size_t handed_on = 0;
      progress.Update(decoded, Cat("run ", r + 1, "/", plan.size(), " ", p.point.Label()));
      DecodeItems(model, suite, to_run, p.options, request.batch, request.clock,
                  [&](const ItemRecord& record) {
                    store.AppendItem(p.key, record);
                    records[to_run[handed_on++]] = record;
                    progress.Update(++decoded,
                                    Cat("run ", r + 1, "/", plan.size(), " ", p.point.Label()));
                  });
    } catch (const Error& e) {
      // One policy that cannot run (not built yet, bad for this model) must not cost the
      // others; the run is retried by the next command.
      outcome.failed.emplace_back(p.point.Label(), e.what());
      std::fprintf(stderr, "%s%s: %s\n", request.progress ? "\n" : "", p.point.Label().c_str(),
                   e.what());
      continue;
    }
    const RunSummary summary = Summarize(records, suite.metric_names);
    std::vector<std::string> tasks;
    for (const auto& [task, totals] : summary.per_task) tasks.push_back(task);
    nlohmann::ordered_json row = {{"key", p.key},
                                  {"suite", suite.name},
                                  {"model", request.model_dir},
                                  {"model_id", model_id},
                                  {"batch", request.batch},
                                  {"backend", backend},
                                  {"policy", p.point.policy},
                                  {"settings", p.point.SettingsText()},
                                  {"label", p.point.Label()},
                                  {"metric_names", suite.metric_names},
                                  {"task_names", tasks},
                                  {"summary", summary.ToJson()},
                                  {"options", OptionsToJson(p.options.Resolved(model.config()))},
                                  {"selection", selection},
                                  {"machine", request.machine.ToJson()}};
    store.AppendRow(row);
  }
  progress.Update(decoded, "done");
  progress.Finish();
  outcome.items_decoded = int(decoded);

  for (const Planned& p : plan) {
    if (store.Row(p.key) != nullptr) outcome.rows.push_back(ResultRow::FromJson(*store.Row(p.key)));
  }
  if (outcome.rows.empty()) Fail("no run finished");
  ReportContext context;
  context.title = Cat(suite.name, " suite (", suite.items.size(), " items) on ", request.model_dir);
  context.command = request.machine.command;
  context.machine = request.machine.Summary();
  context.protocol = request.protocol;
  context.clock = request.clock;
  nlohmann::ordered_json run = {{"machine", request.machine.ToJson()},
                                {"suite", selection},
                                {"model", request.model_dir},
                                {"backend", backend},
                                {"runs", outcome.rows.size()},
                                {"runs_skipped", outcome.runs_skipped},
                                {"items_decoded", outcome.items_decoded}};
  WriteReports(outcome, context, run, request.out_dir, request.plot);
  return outcome;
}

BenchOutcome MergeShards(const MergeRequest& request) {
  if (request.shard_dirs.empty()) Fail("--merge: name the shard folders");
  struct Shard {
    int index = 0, count = 1;
    std::string dir;
    nlohmann::json row;
    std::vector<ItemRecord> items;
  };
  struct Run {
    std::string key;  // of the unsharded run
    nlohmann::json selection;
    std::vector<Shard> shards;
  };
  std::vector<Run> runs;  // in the order the first folder lists them
  std::error_code ec;
  for (const std::string& dir : request.shard_dirs) {
    if (fs::exists(request.out_dir) && fs::equivalent(dir, request.out_dir, ec))
      Fail("--merge: the output folder ", request.out_dir, " is one of the shard folders");
    if (!fs::exists(fs::path(dir) / "results.jsonl"))
      Fail(dir, ": no results.jsonl (not a bench output folder, or no run finished there)");
    const ResultStore store(dir);
    if (store.row_keys().empty()) Fail(dir, ": no finished run in results.jsonl");
    for (const std::string& shard_key : store.row_keys()) {
      const nlohmann::json& row = *store.Row(shard_key);
      const std::string label = row.value("label", shard_key);
      if (!row.contains("model_id") || !row.contains("selection") || !row.contains("options"))
        Fail(dir, ": run '", label, "' was written before bench --merge existed; run it again");
      Shard shard{0, 1, dir, row, store.Items(shard_key)};
      nlohmann::json selection = row["selection"];
      eval::ParseShard(selection.value("shard", "0/1"), &shard.index, &shard.count);
      const int64_t items = row["summary"]["items"].get<int64_t>();
      if (int64_t(shard.items.size()) != items) {
        Fail(dir, ": run '", label, "' has ", shard.items.size(), " item(s) in items.jsonl but ",
             items, " in results.jsonl");
      }
      selection["shard"] = "0/1";
      const std::string key = RunKey(row["model_id"].get<std::string>(), selection, row["options"]);
      auto run = std::find_if(runs.begin(), runs.end(), [&](const Run& r) { return r.key == key; });
      if (run == runs.end()) run = runs.insert(runs.end(), Run{key, selection, {}});
      run->shards.push_back(std::move(shard));
    }
  }
  // Check every run before writing anything.
  for (Run& run : runs) {
    std::sort(run.shards.begin(), run.shards.end(),
              [](const Shard& a, const Shard& b) { return a.index < b.index; });
    const Shard& first = run.shards.front();
    const std::string what =
        Cat("run '", first.row.value("label", ""), "' of ", first.row.value("model", ""), " on ",
            first.row.value("suite", ""));
    std::string have;
    for (const Shard& s : run.shards) {
      have += Cat(have.empty() ? "" : ", ", s.index, "/", s.count, " in ", s.dir);
      if (s.count != first.count) {
        Fail("cannot merge ", what, ": its shards split it differently (", have, ")");
      }
    }
    for (size_t i = 1; i < run.shards.size(); ++i) {
      if (run.shards[i].index == run.shards[i - 1].index) {
        Fail("cannot merge ", what, ": shard ", run.shards[i].index, "/", first.count,
             " is in both ", run.shards[i - 1].dir, " and ", run.shards[i].dir,
             " (overlapping shards)");
      }
    }
    if (int(run.shards.size()) != first.count) {
      std::string missing;
      for (int i = 0, s = 0; i < first.count; ++i) {
        if (s < int(run.shards.size()) && run.shards[size_t(s)].index == i) {
          ++s;
        } else {
          missing += Cat(missing.empty() ? "" : ", ", i, "/", first.count);
        }
      }
      Fail("cannot merge ", what, ": shard(s) ", missing, " missing (have ", have,
           "); the folders hold runs of different models, suites or settings, or a shard has not "
           "finished");
    }
  }

  ResultStore store(request.out_dir);
  BenchOutcome outcome;
  for (const Run& run : runs) {
    if (store.Row(run.key) != nullptr) {
      ++outcome.runs_skipped;
    } else {
      std::vector<ItemRecord> records;
      nlohmann::ordered_json shards = nlohmann::ordered_json::array();
      for (const Shard& s : run.shards) {
        for (const ItemRecord& item : s.items) {
          store.AppendItem(run.key, item);
          records.push_back(item);
        }
        shards.push_back({{"shard", Cat(s.index, "/", s.count)},
                          {"folder", s.dir},
                          {"key", s.row["key"]},
                          {"machine", s.row["machine"]}});
      }
      const nlohmann::json& first = run.shards.front().row;
      const RunSummary summary =
          Summarize(records, first["metric_names"].get<std::vector<std::string>>());
      std::vector<std::string> tasks;
      for (const auto& [task, totals] : summary.per_task) tasks.push_back(task);
      nlohmann::ordered_json row;
      for (const auto& [field, value] : first.items()) row[field] = value;
      row["key"] = run.key;
      row["task_names"] = tasks;
      row["summary"] = summary.ToJson();
      row["selection"] = run.selection;
      row["machine"] = request.machine.ToJson();
      row["shards"] = shards;
      store.AppendRow(row);
      outcome.items_decoded += int(records.size());
    }
    outcome.rows.push_back(ResultRow::FromJson(*store.Row(run.key)));
  }
  const nlohmann::json& first = *store.Row(runs.front().key);
  ReportContext context;
  context.title = Cat(first["suite"].get<std::string>(), " suite (", outcome.rows.front().items,
                      " items) on ", first["model"].get<std::string>());
  context.command = request.machine.command;
  context.machine = Cat("merged from ", runs.front().shards.size(),
                        " shards (each shard's machine is in results.jsonl)");
  context.protocol = request.protocol;
  context.clock = ClockFromName(first["selection"].value("clock", "wall"));
  nlohmann::ordered_json run = {{"machine", request.machine.ToJson()},
                                {"merged_from", request.shard_dirs},
                                {"runs", outcome.rows.size()},
                                {"runs_skipped", outcome.runs_skipped}};
  WriteReports(outcome, context, run, request.out_dir, request.plot);
  return outcome;
}

ProgressBar::ProgressBar(int64_t total, bool enabled)
    : total_(total),
      enabled_(enabled && total > 0),
      tty_(isatty(STDERR_FILENO) != 0),
      started_(Now()) {}

ProgressBar::~ProgressBar() { Finish(); }

std::string ProgressBar::FormatDuration(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  }
  return text;
}

void ProgressBar::Update(int64_t done, const std::string& what) {
  if (!enabled_ || finished_) return;
  const double now = Now();
  if (!tty_ && now - last_print_ < 10 && done < total_) return;
  last_print_ = now;
  const double elapsed = now - started_;
  const double fraction = total_ > 0 ? double(done) / double(total_) : 1;
  constexpr int kWidth = 24;
  const int filled = int(fraction * kWidth);
  std::string bar = std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.');
  const std::string eta =
      done > 0 ? FormatDuration(elapsed / double(done) * double(total_ - done)) : "?";
  std::fprintf(stderr, "%s[%s] %lld/%lld items  %s elapsed  ETA %s  %s%s", tty_ ? "\r\033[K" : "",
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
               FormatDuration(elapsed).c_str(), eta.c_str(), what.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace polestar::bench
