// Turning finished runs into what people read: the Pareto front, a CSV, a Markdown table
// and a plot of accuracy against TPF and TPS (gnuplot, SVG and PNG).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/machine.h"

namespace polestar::bench {

// One finished run, as stored in results.jsonl.
struct ResultRow {
  std::string key, policy, settings;
  int64_t items = 0;
  int batch = 1;                                              // sequences per forward
  std::vector<std::pair<std::string, double>> metrics;        // accuracy per metric, primary first
  std::vector<std::pair<std::string, double>> task_accuracy;  // primary metric per task
  double nfe_mean = 0, tpf_until_eos = 0, tpf_non_eos = 0, tpf_all = 0;
  double tps_until_eos = 0, tps_non_eos = 0, rows_per_token = 0, seconds = 0;
  int64_t peak_rss_bytes = 0, cache_bytes = 0;

  double accuracy() const { return metrics.empty() ? 0 : metrics.front().second; }
  // Over the decoding time of the whole run (batched runs share each forward's time).
  double items_per_second() const { return seconds > 0 ? double(items) / seconds : 0; }
  // Throws Error naming the missing field.
  static ResultRow FromJson(const nlohmann::json& row);
};

// Which token count TPF/TPS use in the plot and the front.
enum class Protocol { kUntilEos, kNonEos };
Protocol ProtocolFromName(const std::string& name);  // until-eos | non-eos
const char* ProtocolName(Protocol protocol);
double Tpf(const ResultRow& row, Protocol protocol);
double Tps(const ResultRow& row, Protocol protocol);

// The Wilson score interval, at 95% (z = 1.96), of a proportion p observed over n items:
// {low, high}, within [0, 1]; {0, 1} when n is 0.
std::pair<double, double> WilsonInterval95(double p, int64_t n);

// on_front[i]: no other point is at least as good in both coordinates and better in one
// (both maximised). Equal points are all on the front.
std::vector<bool> ParetoFront(const std::vector<std::pair<double, double>>& points);

// Where the run came from, printed above the tables.
struct ReportContext {
  std::string title;  // "tiny suite on models/polestar-tiny"
  std::string command;
  std::string machine;  // MachineInfo::Summary()
  Protocol protocol = Protocol::kUntilEos;
  Clock clock = Clock::kWall;  // of TPS
};

// One header line and one line per row; fields with commas or quotes are quoted.
std::string CsvTable(const std::vector<ResultRow>& rows);
// A results table (with the Pareto membership in TPF and TPS) and, when the suite has
// several tasks, a per-task accuracy table.
std::string MarkdownReport(const std::vector<ResultRow>& rows, const ReportContext& context);

// Writes `stem`.dat and `stem`.gp and runs gnuplot for `stem`.svg and `stem`.png. Returns
// the files written; throws Error when gnuplot is missing or fails (the message says how to
// rerun it by hand).
std::vector<std::string> WritePlot(const std::vector<ResultRow>& rows, const ReportContext& context,
                                   const std::string& stem);

// Quotes a CSV field when needed.
std::string CsvField(const std::string& text);

}  // namespace polestar::bench
