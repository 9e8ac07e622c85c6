// polestar eval: one policy over a suite's test split; accuracy, NFE, TPF and TPS per task.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend_flags.h"
#include "base/error.h"
#include "base/parallel.h"
#include "bench/bench.h"
#include "commands.h"
#include "decode_flags.h"
#include "suite_flags.h"

namespace polestar::cli {
namespace {

struct EvalArgs {
  SuiteFlags suite;
  std::string clock = "wall";
  std::string backend;
  DecodeOptions options;
  int threads = 0;
  bool json = false, quiet = false, items = false;
};

void PrintTotalsLine(const char* name, const bench::Totals& t, const std::string& metric) {
  std::printf("%-12s %6lld  %7.1f%%  %7.1f  %13.2f  %11.2f  %13.1f  %11.1f\n", name,
              static_cast<long long>(t.items), 100 * t.Accuracy(metric), t.MeanNfe(),
              t.TpfUntilEos(), t.TpfNonEos(), t.TpsUntilEos(), t.TpsNonEos());
}

}  // namespace

void AddEvalCommand(CLI::App& app, const DecodeOptions& defaults) {
  auto* cmd = app.add_subcommand(
      "eval", "Run a suite's test split through one policy: accuracy, NFE, TPF, TPS per task");
  auto args = std::make_shared<EvalArgs>();
  AddSuiteFlags(cmd, args->suite);
  cmd->add_option("--clock", args->clock, "time TPS on the wall clock or the process's CPU time")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--items", args->items, "with --json: every item's record too");
  cmd->add_flag("-q,--quiet", args->quiet, "no progress on stderr");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024));
  AddBackendFlag(cmd, args->backend);
  args->options = defaults;
  AddDecodeFlags(cmd, args->options);
  cmd->footer(
      "--seed also picks the tiny and long suites' test items. Unless given: "
      "--gen-length/--block-length "
      "follow the suite (tiny and probe 32/8, long 128/32, others 256/32), --steps equals "
      "--gen-length, and "
      "fast-dllm-prefix/dual and elastic-cache use --threshold 0.9.");
  cmd->callback([args, cmd] {
    SetThreadCount(args->threads);
    const bench::SuiteOptions so = ResolveSuiteFlags(args->suite, args->options.seed);
    const std::string& model_dir = so.model_dir;
    auto model = LoadModelOnBackend(model_dir, args->backend);
    const bench::BenchSuite suite = bench::LoadBenchSuite(so, model->config());
    if (suite.items.empty())
      Fail("suite ", suite.name, " has no items (check --limit / --shard / --per-task)");
    const bench::GridPoint point{args->options.policy, {}};
    const DecodeOptions options =
        bench::ResolvePoint(args->options, GivenDecodeFlags(cmd), point, suite, SetDecodeOption);
    std::vector<bench::ItemRecord> records;
    bench::ProgressBar progress(int64_t(suite.items.size()), !args->quiet);
    const bench::RunSummary summary = bench::RunSuite(
        *model, suite, options,
        [&](std::size_t done, const bench::ItemRecord& r) {
          if (args->items) records.push_back(r);
          progress.Update(int64_t(done), r.id);
        },
        bench::ClockFromName(args->clock), args->suite.batch);
    progress.Finish();
    if (args->json) {
      nlohmann::ordered_json out = {
          {"model", model_dir},
          {"suite", suite.selection},
          {"batch", args->suite.batch},
          {"backend", model->backend().name()},
          {"options", bench::OptionsToJson(options.Resolved(model->config()))},
          {"summary", summary.ToJson()}};
      if (args->items) {
        out["items"] = nlohmann::ordered_json::array();
        for (const bench::ItemRecord& r : records)
          out["items"].push_back(nlohmann::ordered_json(r.ToJson()));
      }
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    const std::string& metric = suite.metric_names.at(0);
    std::printf("%s on %s (%s), policy %s (%s)\n", suite.name.c_str(), model_dir.c_str(),
                std::string(model->backend().name()).c_str(), options.policy.c_str(),
                metric.c_str());
    // Both counting protocols: tokens before the first EOS (Fast-dLLM's), all non-EOS tokens.
    std::printf("%-12s %6s  %8s  %7s  %13s  %11s  %13s  %11s\n", "task", "items", "accuracy", "NFE",
                "TPF until EOS", "TPF non-EOS", "TPS until EOS", "TPS non-EOS");
    for (const auto& [task, totals] : summary.per_task)
      PrintTotalsLine(task.c_str(), totals, metric);
    if (summary.per_task.size() > 1) PrintTotalsLine("overall", summary.overall, metric);
    for (size_t m = 1; m < suite.metric_names.size(); ++m) {
      std::printf("%s: %.1f%%\n", suite.metric_names[m].c_str(),
                  100 * summary.overall.Accuracy(suite.metric_names[m]));
    }
    // In a batched run the items' seconds are shares of the forwards: their sum is the run's.
    std::printf("batch %d: %.2f items/s (%lld items in %.2f s of decoding, %s clock)\n",
                args->suite.batch, summary.overall.ItemsPerSecond(),
                static_cast<long long>(summary.overall.items), summary.overall.seconds,
                args->clock.c_str());
  });
}

}  // namespace polestar::cli
