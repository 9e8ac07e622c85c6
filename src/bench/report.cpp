#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/error.h"
#include "bench/machine.h"
#include "io/atomic_file.h"

namespace polestar::bench {
namespace {

const nlohmann::json& Need(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) Fail("result row lacks '", key, "'");
  return j[key];
}

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string Megabytes(int64_t bytes) { return Fixed(double(bytes) / double(1 << 20), 1); }

// Double quotes for gnuplot strings.
std::string GnuplotString(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

// Colours per policy, stable across plots; others cycle through the rest.
std::string PolicyColour(const std::string& policy, size_t index) {
  static const std::map<std::string, std::string> known = {{"vanilla", "#555555"},
                                                           {"fast-dllm-prefix", "#1f77b4"},
                                                           {"fast-dllm-dual", "#2ca02c"},
                                                           {"elastic-cache", "#9467bd"},
                                                           {"polestar", "#d62728"}};
  static const char* spare[] = {"#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
  const auto it = known.find(policy);
  return it != known.end() ? it->second : spare[index % 5];
}

}  // namespace

ResultRow ResultRow::FromJson(const nlohmann::json& row) {
  ResultRow r;
  r.key = Need(row, "key").get<std::string>();
  r.policy = Need(row, "policy").get<std::string>();
  r.settings = Need(row, "settings").get<std::string>();
  const nlohmann::json& s = Need(row, "summary");
  r.items = Need(s, "items").get<int64_t>();
  r.batch = row.value("batch", 1);  // rows written before batching decoded one at a time
  const nlohmann::json& order = Need(row, "metric_names");
  for (const auto& name : order) {
    r.metrics.emplace_back(name.get<std::string>(),
                           Need(Need(s, "metrics"), name.get<std::string>().c_str()).get<double>());
  }
  const nlohmann::json& task_order = Need(row, "task_names");
  for (const auto& name : task_order) {
    const nlohmann::json& task = Need(Need(s, "per_task"), name.get<std::string>().c_str());
    r.task_accuracy.emplace_back(name.get<std::string>(), Need(task, "accuracy").get<double>());
  }
  r.nfe_mean = Need(s, "nfe_mean").get<double>();
  r.tpf_until_eos = Need(Need(s, "tpf"), "until_eos").get<double>();
  r.tpf_non_eos = Need(Need(s, "tpf"), "non_eos").get<double>();
  r.tpf_all = Need(Need(s, "tpf"), "all_positions").get<double>();
  r.tps_until_eos = Need(Need(s, "tps"), "until_eos").get<double>();
  r.tps_non_eos = Need(Need(s, "tps"), "non_eos").get<double>();
  r.rows_per_token = Need(s, "rows_per_token").get<double>();
  r.seconds = Need(s, "seconds").get<double>();
  r.peak_rss_bytes = Need(s, "peak_rss_bytes").get<int64_t>();
  r.cache_bytes = Need(s, "cache_bytes").get<int64_t>();
  return r;
}

Protocol ProtocolFromName(const std::string& name) {
  if (name == "until-eos") return Protocol::kUntilEos;
  if (name == "non-eos") return Protocol::kNonEos;
  Fail("unknown counting protocol '", name, "' (until-eos, non-eos)");
}

const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kUntilEos ? "until EOS" : "non-EOS";
}

double Tpf(const ResultRow& row, Protocol protocol) {
  return protocol == Protocol::kUntilEos ? row.tpf_until_eos : row.tpf_non_eos;
}

double Tps(const ResultRow& row, Protocol protocol) {
  return protocol == Protocol::kUntilEos ? row.tps_until_eos : row.tps_non_eos;
}

std::pair<double, double> WilsonInterval95(double p, int64_t n) {
  if (n <= 0) return {0.0, 1.0};
  const double z = 1.96, z2n = z * z / double(n);
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / double(n) + z2n / (4 * double(n)));
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

std::vector<bool> ParetoFront(const std::vector<std::pair<double, double>>& points) {
  std::vector<bool> front(points.size(), true);
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = 0; j < points.size() && front[i]; ++j) {
      const auto [xi, yi] = points[i];
      const auto [xj, yj] = points[j];
      if (xj >= xi && yj >= yi && (xj > xi || yj > yi)) front[i] = false;
    }
  }
  return front;
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string CsvTable(const std::vector<ResultRow>& rows) {
  std::vector<std::string> metric_names;
  for (const ResultRow& r : rows) {
    for (const auto& [name, value] : r.metrics) {
      if (std::find(metric_names.begin(), metric_names.end(), name) == metric_names.end()) {
        metric_names.push_back(name);
      }
    }
  }
  std::string csv = "policy,settings,items,batch,accuracy";
  for (const std::string& m : metric_names) {
    csv += ',';
    csv += CsvField(m);
  }
  csv +=
      ",nfe_mean,tpf_until_eos,tpf_non_eos,tpf_all_positions,tps_until_eos,tps_non_eos,"
      "items_per_second,rows_per_token,peak_rss_mb,cache_mb,seconds,key\n";
  for (const ResultRow& r : rows) {
    csv += CsvField(r.policy) + "," + CsvField(r.settings) + "," + std::to_string(r.items) + "," +
           std::to_string(r.batch) + "," + Fixed(r.accuracy(), 4);
    for (const std::string& m : metric_names) {
      const auto it = std::find_if(r.metrics.begin(), r.metrics.end(),
                                   [&](const auto& entry) { return entry.first == m; });
      csv += ',';
      if (it != r.metrics.end()) csv += Fixed(it->second, 4);
    }
    csv += "," + Fixed(r.nfe_mean, 2) + "," + Fixed(r.tpf_until_eos, 3) + "," +
           Fixed(r.tpf_non_eos, 3) + "," + Fixed(r.tpf_all, 3) + "," + Fixed(r.tps_until_eos, 2) +
           "," + Fixed(r.tps_non_eos, 2) + "," + Fixed(r.items_per_second(), 3) + "," +
           Fixed(r.rows_per_token, 1) + "," + Megabytes(r.peak_rss_bytes) + "," +
           Megabytes(r.cache_bytes) + "," + Fixed(r.seconds, 2) + "," + r.key + "\n";
  }
  return csv;
}

std::string MarkdownReport(const std::vector<ResultRow>& rows, const ReportContext& context) {
  std::vector<std::pair<double, double>> by_tpf, by_tps;
  for (const ResultRow& r : rows) {
    by_tpf.emplace_back(Tpf(r, context.protocol), r.accuracy());
    by_tps.emplace_back(Tps(r, context.protocol), r.accuracy());
  }
  const std::vector<bool> front_tpf = ParetoFront(by_tpf), front_tps = ParetoFront(by_tps);
  const std::string primary =
      rows.empty() || rows[0].metrics.empty() ? "accuracy" : rows[0].metrics[0].first;
  std::string md;
  md += "### " + context.title + "\n\n";
  md += "Command: `" + context.command + "`  \n";
  md += "Machine: " + context.machine + "\n\n";
  md += "| policy | settings | items | batch | accuracy (" + primary +
        ") | 95% CI | NFE | TPF until EOS | TPF non-EOS | TPS until EOS | TPS non-EOS | items/s | "
        "rows/token | peak RSS MB | KV cache MB | Pareto |\n";
  md += "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ResultRow& r = rows[i];
    std::string front;
    if (front_tpf[i]) front = "TPF";
    if (front_tps[i]) front += front.empty() ? "TPS" : ", TPS";
    const auto [low, high] = WilsonInterval95(r.accuracy(), r.items);
    md += "| " + r.policy + " | " + r.settings + " | " + std::to_string(r.items) + " | " +
          std::to_string(r.batch) + " | " + Fixed(100 * r.accuracy(), 1) + "% | " +
          Fixed(100 * low, 1) + "-" + Fixed(100 * high, 1) + " | " + Fixed(r.nfe_mean, 1) + " | " +
          Fixed(r.tpf_until_eos, 2) + " | " + Fixed(r.tpf_non_eos, 2) + " | " +
          Fixed(r.tps_until_eos, 1) + " | " + Fixed(r.tps_non_eos, 1) + " | " +
          Fixed(r.items_per_second(), 2) + " | " + Fixed(r.rows_per_token, 0) + " | " +
          Megabytes(r.peak_rss_bytes) + " | " + Megabytes(r.cache_bytes) + " | " +
          (front.empty() ? "" : "**" + front + "**") + " |\n";
  }
  md += "\nPareto: on the accuracy/TPF or accuracy/TPS front (" +
        std::string(ProtocolName(context.protocol)) +
        " counts). 95% CI: the Wilson score interval of the accuracy over the items. TPF and TPS "
        "are ratios of sums over the items, TPS on " +
        (context.clock == Clock::kWall ? std::string("wall-clock") : std::string("process CPU")) +
        " time of decoding, as are items/s; batch = sequences per forward (in a batched run "
        "each forward's time is shared among its sequences in proportion to their rows, so "
        "TPS and items/s are over the wall time of the whole batched run); rows/token = "
        "(layer, position) rows computed per canvas position; peak RSS includes the mapped "
        "weights.\n";
  // Other metrics of the suite (gsm8k: strict_match) and the per-task breakdown.
  if (!rows.empty() && rows[0].metrics.size() > 1) {
    md += "\n| policy | settings |";
    std::string rule = "|---|---|";
    for (const auto& [name, value] : rows[0].metrics) {
      md += " " + name + " |";
      rule += "--:|";
    }
    md += "\n" + rule + "\n";
    for (const ResultRow& r : rows) {
      md += "| " + r.policy + " | " + r.settings + " |";
      for (const auto& [name, value] : r.metrics) md += " " + Fixed(100 * value, 1) + "% |";
      md += "\n";
    }
  }
  if (!rows.empty() && rows[0].task_accuracy.size() > 1) {
    md += "\nAccuracy per task:\n\n| policy | settings |";
    std::string rule = "|---|---|";
    for (const auto& [task, value] : rows[0].task_accuracy) {
      md += " " + task + " |";
      rule += "--:|";
    }
    md += "\n" + rule + "\n";
    for (const ResultRow& r : rows) {
      md += "| " + r.policy + " | " + r.settings + " |";
      for (const auto& [task, value] : r.task_accuracy) md += " " + Fixed(100 * value, 1) + "% |";
      md += "\n";
    }
  }
  return md;
}

std::vector<std::string> WritePlot(const std::vector<ResultRow>& rows, const ReportContext& context,
                                   const std::string& stem) {
  if (rows.empty()) Fail("nothing to plot");
  // Data: one gnuplot index per policy, then the two fronts sorted by x.
  std::vector<std::string> policies;
  for (const ResultRow& r : rows) {
    if (std::find(policies.begin(), policies.end(), r.policy) == policies.end())
      policies.push_back(r.policy);
  }
  std::vector<std::pair<double, double>> by_tpf, by_tps;
  for (const ResultRow& r : rows) {
    by_tpf.emplace_back(Tpf(r, context.protocol), 100 * r.accuracy());
    by_tps.emplace_back(Tps(r, context.protocol), 100 * r.accuracy());
  }
  const std::vector<bool> front_tpf = ParetoFront(by_tpf), front_tps = ParetoFront(by_tps);
  double min_acc = 100, max_acc = 0;
  for (const auto& [x, y] : by_tpf) {
    min_acc = std::min(min_acc, y);
    max_acc = std::max(max_acc, y);
  }
  const double pad = std::max(2.0, (max_acc - min_acc) * 0.15);
  const double y_low = std::max(0.0, min_acc - pad), y_high = std::min(100.0, max_acc + pad) + 0.5;
  // Room on the right for the labels of the rightmost points.
  auto x_limit = [](const std::vector<std::pair<double, double>>& points) {
    double x = 0;
    for (const auto& [px, py] : points) x = std::max(x, px);
    return x > 0 ? 1.3 * x : 1.0;
  };
  const double tpf_max = x_limit(by_tpf), tps_max = x_limit(by_tps);
  // Label heights per panel: a label that would overlap one placed before it moves down a
  // line, so settings of coinciding points stay readable.
  auto label_heights = [&](const std::vector<std::pair<double, double>>& points, double x_max) {
    const double line = 0.045 * (y_high - y_low);
    std::vector<double> heights(points.size());
    std::vector<std::pair<double, double>> placed;
    for (size_t i = 0; i < points.size(); ++i) {
      double y = points[i].second;
      if (rows[i].settings != "defaults") {
        for (bool moved = true; moved;) {
          moved = false;
          for (const auto& [px, py] : placed) {
            if (std::fabs(px - points[i].first) < 0.16 * x_max && std::fabs(py - y) < line) {
              y = py - 1.001 * line;  // strictly below, whatever the rounding
              moved = true;
            }
          }
        }
        placed.emplace_back(points[i].first, y);
      }
      heights[i] = y;
    }
    return heights;
  };
  const std::vector<double> label_tpf = label_heights(by_tpf, tpf_max);
  const std::vector<double> label_tps = label_heights(by_tps, tps_max);
  std::string data = "# tpf tps accuracy_percent label label_y_tpf label_y_tps (" +
                     std::string(ProtocolName(context.protocol)) + ")\n";
  for (const std::string& policy : policies) {
    data += "# " + policy + "\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const ResultRow& r = rows[i];
      if (r.policy != policy) continue;
      data += Fixed(by_tpf[i].first, 4) + " " + Fixed(by_tps[i].first, 4) + " " +
              Fixed(by_tpf[i].second, 3) + " " +
              GnuplotString(r.settings == "defaults" ? "" : r.settings) + " " +
              Fixed(label_tpf[i], 3) + " " + Fixed(label_tps[i], 3) + "\n";
    }
    data += "\n\n";
  }
  auto front_block = [&](const std::vector<std::pair<double, double>>& points,
                         const std::vector<bool>& front, const char* name) {
    std::vector<size_t> members;
    for (size_t i = 0; i < points.size(); ++i) {
      if (front[i]) members.push_back(i);
    }
    std::sort(members.begin(), members.end(),
              [&](size_t a, size_t b) { return points[a] < points[b]; });
    std::string block = std::string("# Pareto front, ") + name + "\n";
    for (size_t i : members) {
      block += Fixed(points[i].first, 4) + " " + Fixed(points[i].second, 3) + " " +
               GnuplotString(rows[i].policy +
                             (rows[i].settings == "defaults" ? "" : " " + rows[i].settings)) +
               "\n";
    }
    return block + "\n\n";
  };
  data += front_block(by_tpf, front_tpf, "TPF");
  data += front_block(by_tps, front_tps, "TPS");
  // The script names its files relative to its folder, where gnuplot runs, so the folder
  // can be moved and the plot redrawn with `gnuplot NAME.gp` there.
  const std::filesystem::path stem_path(stem);
  const std::string folder =
      stem_path.parent_path().empty() ? "." : stem_path.parent_path().string();
  const std::string name = stem_path.filename().string();
  const std::string data_path = stem + ".dat";
  WriteFileAtomically(data_path, data);

  const std::string yrange = "[" + Fixed(y_low, 1) + ":" + Fixed(y_high, 1) + "]";
  const size_t policy_count = policies.size();
  const std::string front_tpf_index = std::to_string(policy_count);
  const std::string front_tps_index = std::to_string(policy_count + 1);
  auto panel = [&](const std::string& x_column, const std::string& label_column,
                   const std::string& xlabel, const std::string& front_index, double x_max,
                   bool with_key) {
    std::string p;
    p += "set xlabel " + GnuplotString(xlabel) + "\n";
    p += "set ylabel \"accuracy (%)\"\n";
    p += "set yrange " + yrange + "\n";
    p += "set xrange [0:" + Fixed(x_max, 4) + "]\n";
    // One legend for both panels, centred below them.
    p += with_key
             ? "set key at screen 0.5, screen 0.05 center center horizontal box samplen 2 width 1\n"
             : "unset key\n";
    p += "plot ";
    p += "'" + name + ".dat' index " + front_index +
         " using 1:2 with lines dashtype 2 linewidth 2 linecolor rgb '#888888' title 'Pareto front "
         "(circled)', \\\n";
    p += "     '' index " + front_index +
         " using 1:2 with points pointtype 6 pointsize 3.2 linewidth 1.5 linecolor rgb '#222222' "
         "notitle";
    for (size_t i = 0; i < policy_count; ++i) {
      p += ", \\\n     '' index " + std::to_string(i) + " using " + x_column +
           ":3 with points pointtype 7 pointsize 1.8 linecolor rgb '" +
           PolicyColour(policies[i], i) + "' title " + GnuplotString(policies[i]);
      p += ", \\\n     '' index " + std::to_string(i) + " using " + x_column + ":" + label_column +
           ":4 with labels offset char 0.8,0.9 left font ',9' textcolor rgb '" +
           PolicyColour(policies[i], i) + "' notitle";
    }
    return p + "\n";
  };
  auto script_for = [&](const std::string& terminal, const std::string& output) {
    std::string s;
    s += "set terminal " + terminal + "\n";
    s += "set output " + GnuplotString(output) + "\n";
    s += "set grid linecolor rgb '#cccccc' dashtype 3\n";
    s += "set multiplot layout 1,2 title " + GnuplotString(context.title) +
         " font ',13' margins 0.06, 0.98, 0.22, 0.9 spacing 0.07, 0\n";
    s += panel("1", "5",
               std::string("tokens per forward (TPF, ") + ProtocolName(context.protocol) + ")",
               front_tpf_index, tpf_max, true);
    s += panel("2", "6",
               std::string("tokens per second (TPS, ") + ProtocolName(context.protocol) +
                   (context.clock == Clock::kCpu ? ", CPU time)" : ")"),
               front_tps_index, tps_max, false);
    s += "unset multiplot\n";
    return s;
  };
  const std::string script_path = stem + ".gp";
  {
    WriteFileAtomically(
        script_path,
        "# cd to this folder, then: gnuplot " + name + ".gp  (writes " + name + ".svg and " + name +
            ".png)\n" +
            script_for("svg size 1400,560 dynamic font 'Helvetica,12' background rgb 'white'",
                       name + ".svg") +
            script_for("pngcairo size 1400,560 font 'Helvetica,11' background rgb 'white'",
                       name + ".png"));
  }
  const std::string command =
      "cd " + ShellQuote(folder) + " && gnuplot " + ShellQuote(name + ".gp") + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr)
    Fail("cannot run gnuplot (install gnuplot-nox); the script is ", script_path);
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  if (status != 0) {
    Fail("gnuplot failed on ", script_path, " (status ", status, "): ", output,
         status == 127 * 256 ? " (is gnuplot installed? apt-get install gnuplot-nox)" : "");
  }
  return {data_path, script_path, stem + ".svg", stem + ".png"};
}

}  // namespace polestar::bench
