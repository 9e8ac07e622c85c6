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
                    const std::function<void(std::size_t, const ItemRecord&)>& on_item,
                    Clock clock) {
  std::vector<ItemRecord> records;
  for (size_t i = 0; i < suite.items.size(); ++i) {
    records.push_back(RunItem(model, suite, i, options, clock));
    if (on_item) on_item(i + 1, records.back());
  }
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
    std::vector<ItemRecord> records;
    try {
      for (size_t i = 0; i < suite.items.size(); ++i) {
        const auto it = std::find_if(p.done.begin(), p.done.end(), [&](const ItemRecord& d) {
          return d.id == suite.items[i].id;
        });
        if (it != p.done.end()) {
          records.push_back(*it);
          continue;
        }
        progress.Update(decoded, Cat("run ", r + 1, "/", plan.size(), " ", p.point.Label()));
        ItemRecord record = RunItem(model, suite, i, p.options, request.clock);
        store.AppendItem(p.key, record);
        records.push_back(std::move(record));
        ++decoded;
      }
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
  const fs::path dir(request.out_dir);
  ReportContext context;
  context.title = Cat(suite.name, " suite (", suite.items.size(), " items) on ", request.model_dir);
  context.command = request.machine.command;
  context.machine = request.machine.Summary();
  context.protocol = request.protocol;
  context.clock = request.clock;
  WriteText((dir / "results.csv").string(), CsvTable(outcome.rows));
  std::string markdown = MarkdownReport(outcome.rows, context);
  for (const auto& [label, error] : outcome.failed)
    markdown += "\nNot run: " + label + ": " + error + "\n";
  WriteText((dir / "results.md").string(), markdown);
  nlohmann::ordered_json run = {
      {"machine", request.machine.ToJson()},  {"suite", selection},
      {"model", request.model_dir},           {"runs", outcome.rows.size()},
      {"runs_skipped", outcome.runs_skipped}, {"items_decoded", outcome.items_decoded}};
  WriteText((dir / "run.json").string(), run.dump(2) + "\n");
  outcome.files = {(dir / "results.jsonl").string(), (dir / "items.jsonl").string(),
                   (dir / "results.csv").string(), (dir / "results.md").string(),
                   (dir / "run.json").string()};
  if (request.plot) {
    for (const std::string& f : WritePlot(outcome.rows, context, (dir / "pareto").string())) {
      outcome.files.push_back(f);
    }
  }
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
