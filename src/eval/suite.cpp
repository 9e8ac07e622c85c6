#include "eval/suite.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "base/error.h"
#include "eval/answers.h"
#include "eval/code_tasks.h"

namespace polestar::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kGsm8kShots = 5;
constexpr int kMbppShotIds[] = {2, 3, 4};
constexpr int kMbppFirstTestId = 11;
constexpr int kMbppLastTestId = 510;
constexpr const char* kMathInstruction =
    "\nPlease reason step by step, and put your final answer within \\boxed{}.";

// One parsed line of a JSONL file, with where it came from for error messages.
struct Row {
  json value;
  std::string where;  // "path:line"

  std::string String(const char* key) const {
    const auto it = value.find(key);
    if (it == value.end() || !it->is_string()) Fail(where, ": missing string field '", key, "'");
    return it->get<std::string>();
  }
  int Int(const char* key) const {
    const auto it = value.find(key);
    if (it == value.end() || !it->is_number_integer()) {
      Fail(where, ": missing integer field '", key, "'");
    }
    return it->get<int>();
  }
  std::vector<std::string> Strings(const char* key) const {
    const auto it = value.find(key);
    if (it == value.end() || !it->is_array()) Fail(where, ": missing list field '", key, "'");
    std::vector<std::string> out;
    for (const json& entry : *it) {
      if (!entry.is_string()) Fail(where, ": field '", key, "' holds a non-string");
      out.push_back(entry.get<std::string>());
    }
    return out;
  }
};

// Reads up to `max_rows` (0: all) JSON objects, one per non-empty line.
std::vector<Row> ReadJsonl(const fs::path& path, std::size_t max_rows = 0) {
  std::ifstream file(path, std::ios::binary);
  if (!file) Fail("cannot open ", path.string(), ": ", std::strerror(errno));
  std::vector<Row> rows;
  std::string line;
  for (std::size_t number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Row row{json(), path.string() + ":" + std::to_string(number)};
    try {
      row.value = json::parse(line);
    } catch (const json::parse_error& e) {
      Fail(row.where, ": invalid JSON: ", e.what());
    }
    if (!row.value.is_object()) Fail(row.where, ": expected a JSON object");
    rows.push_back(std::move(row));
    if (max_rows > 0 && rows.size() == max_rows) break;
  }
  return rows;
}

std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

// Builds the one-text and the multi-turn forms of a few-shot prompt.
void SetFewShotPrompt(EvalItem& item, const std::vector<std::pair<std::string, std::string>>& shots,
                      const std::string& question, std::string_view target_delimiter) {
  std::vector<std::string> blocks;
  for (const auto& [shot_question, shot_answer] : shots) {
    blocks.push_back(shot_question + std::string(target_delimiter) + shot_answer);
    item.messages.push_back({"user", shot_question});
    item.messages.push_back({"assistant", shot_answer});
  }
  blocks.push_back(question);
  item.messages.push_back({"user", question});
  item.prompt = Join(blocks, "\n\n");
}

GradeResult FromMetrics(std::vector<MetricScore> metrics, json details) {
  GradeResult result;
  result.correct = metrics.front().correct;
  result.extracted = metrics.front().extracted;
  result.metrics = std::move(metrics);
  result.details = std::move(details);
  return result;
}

Suite LoadGsm8k(const fs::path& dir) {
  const std::vector<Row> train = ReadJsonl(dir / "gsm8k_train.jsonl", kGsm8kShots);
  if (train.size() < kGsm8kShots) {
    Fail((dir / "gsm8k_train.jsonl").string(), ": needs ", kGsm8kShots, " few-shot examples, has ",
         train.size());
  }
  const auto question_text = [](const Row& row) {
    return "Question: " + row.String("question") + "\nAnswer:";
  };
  std::vector<std::pair<std::string, std::string>> shots;
  for (const Row& row : train) shots.emplace_back(question_text(row), row.String("answer"));

  Suite suite;
  suite.name = "gsm8k";
  suite.metric_names = {"flexible_extract", "strict_match"};
  suite.stop_sequences = {"Question:", "</s>", "<|im_end|>"};
  for (const Row& row : ReadJsonl(dir / "gsm8k_test.jsonl")) {
    EvalItem item;
    item.id = "gsm8k/" + std::to_string(suite.items.size());
    SetFewShotPrompt(item, shots, question_text(row), " ");
    const std::string solution = row.String("answer");
    const std::size_t marker = solution.rfind("#### ");
    if (marker == std::string::npos) Fail(row.where, ": answer has no '#### ' final answer");
    item.reference = NormalizeNumber(solution.substr(marker + 5));
    item.extra = {{"solution", solution}};
    suite.items.push_back(std::move(item));
  }
  suite.grader = [stops = suite.stop_sequences](const EvalItem& item, std::string_view completion) {
    const std::string_view text = TruncateAtStop(completion, stops);
    const auto score = [&](const char* metric, const std::optional<std::string>& extracted) {
      return MetricScore{metric, extracted && NumbersEqual(*extracted, item.reference),
                         extracted.value_or("")};
    };
    return FromMetrics({score("flexible_extract", ExtractGsm8kFlexible(text)),
                        score("strict_match", ExtractGsm8kStrict(text))},
                       {{"reference", item.reference}});
  };
  return suite;
}

Suite LoadMath500(const fs::path& dir) {
  Suite suite;
  suite.name = "math500";
  suite.metric_names = {"boxed_match"};
  for (const Row& row : ReadJsonl(dir / "math500_test.jsonl")) {
    EvalItem item;
    item.id = row.String("unique_id");
    item.prompt = row.String("problem") + kMathInstruction;
    item.messages = {{"user", item.prompt}};
    item.reference = row.String("answer");
    item.extra = {{"subject", row.String("subject")},
                  {"level", row.Int("level")},
                  {"solution", row.String("solution")}};
    suite.items.push_back(std::move(item));
  }
  suite.grader = [](const EvalItem& item, std::string_view completion) {
    const std::optional<std::string> boxed = LastBoxedContent(completion);
    const bool correct = boxed && MathAnswersEqual(*boxed, item.reference);
    return FromMetrics({{"boxed_match", correct, boxed.value_or("")}},
                       {{"normalized", boxed ? NormalizeMathAnswer(*boxed) : ""},
                        {"normalized_reference", NormalizeMathAnswer(item.reference)}});
  };
  return suite;
}

Suite LoadHumanEval(const fs::path& dir, const SandboxOptions& sandbox) {
  const fs::path path = dir / "HumanEval.jsonl";
  if (!fs::exists(path) && fs::exists(dir / "HumanEval.jsonl.gz")) {
    Fail("cannot open ", path.string(),
         ": only HumanEval.jsonl.gz is there; decompress it "
         "(gunzip -k) or use the repository's data/ folder, which holds it decompressed");
  }
  Suite suite;
  suite.name = "humaneval";
  suite.metric_names = {"pass@1"};
  suite.stop_sequences = kHumanEvalStops;
  for (const Row& row : ReadJsonl(path)) {
    EvalItem item;
    item.id = row.String("task_id");
    item.prompt = row.String("prompt");
    item.messages = {{"user", item.prompt}};
    item.reference = row.String("canonical_solution");
    item.extra = {{"entry_point", row.String("entry_point")}, {"test", row.String("test")}};
    suite.items.push_back(std::move(item));
  }
  suite.grader = [sandbox](const EvalItem& item, std::string_view completion) {
    const std::string entry_point = item.extra.at("entry_point").get<std::string>();
    const std::string program = HumanEvalProgram(
        item.prompt, completion, item.extra.at("test").get<std::string>(), entry_point);
    return RunCodeTests(program, HumanEvalCode(completion, entry_point), sandbox);
  };
  return suite;
}

std::string MbppQuestion(const Row& row) {
  return "You are an expert Python programmer, and here is your task: " + row.String("text") +
         " Your code should pass these tests:\n\n" + Join(row.Strings("test_list"), "\n") +
         "\n[BEGIN]\n";
}

Suite LoadMbpp(const fs::path& dir, const SandboxOptions& sandbox) {
  const fs::path path = dir / "mbpp.jsonl";
  std::map<int, Row> by_id;
  for (Row& row : ReadJsonl(path)) {
    const int id = row.Int("task_id");
    by_id.emplace(id, std::move(row));
  }
  const auto task = [&](int id) -> const Row& {
    const auto it = by_id.find(id);
    if (it == by_id.end()) Fail(path.string(), ": has no task_id ", id);
    return it->second;
  };
  std::vector<std::pair<std::string, std::string>> shots;
  for (int id : kMbppShotIds) {
    shots.emplace_back(MbppQuestion(task(id)), task(id).String("code") + "\n[DONE]");
  }

  Suite suite;
  suite.name = "mbpp";
  suite.metric_names = {"pass@1"};
  suite.stop_sequences = kMbppStops;
  for (int id = kMbppFirstTestId; id <= kMbppLastTestId; ++id) {
    const Row& row = task(id);
    EvalItem item;
    item.id = "mbpp/" + std::to_string(id);
    SetFewShotPrompt(item, shots, MbppQuestion(row), "");
    item.reference = row.String("code");
    item.extra = {{"test_list", row.Strings("test_list")},
                  {"test_setup_code", row.String("test_setup_code")}};
    suite.items.push_back(std::move(item));
  }
  suite.grader = [sandbox](const EvalItem& item, std::string_view completion) {
    const std::string program =
        MbppProgram(completion, item.extra.at("test_list").get<std::vector<std::string>>(),
                    item.extra.at("test_setup_code").get<std::string>());
    return RunCodeTests(program, MbppCode(completion), sandbox);
  };
  return suite;
}

}  // namespace

std::vector<std::string> SuiteNames() { return {"gsm8k", "math500", "humaneval", "mbpp"}; }

Suite LoadSuite(std::string_view name, const std::string& data_dir, const LoadOptions& options) {
  CheckShard(options.shard_index, options.shard_count);
  const fs::path dir(data_dir);
  if (!fs::is_directory(dir)) Fail("data folder ", data_dir, " does not exist");
  Suite suite;
  if (name == "gsm8k") {
    suite = LoadGsm8k(dir);
  } else if (name == "math500") {
    suite = LoadMath500(dir);
  } else if (name == "humaneval") {
    suite = LoadHumanEval(dir, options.sandbox);
  } else if (name == "mbpp") {
    suite = LoadMbpp(dir, options.sandbox);
  } else {
    Fail("unknown evaluation suite '", name, "' (known: ", Join(SuiteNames(), ", "), ")");
  }
  suite.full_size = suite.items.size();
  // Each of these suites is one task.
  suite.items =
      LimitAndShard(std::move(suite.items), options, [](const EvalItem&) { return std::string(); });
  return suite;
}

std::string DefaultDataDir() {
  const char* env = std::getenv("POLESTAR_DATA");
  return env != nullptr && *env != 0 ? env : POLESTAR_DATA_DIR;
}

std::vector<std::size_t> LimitedIndices(std::span<const std::string> tasks, std::size_t limit) {
  // Each task's item indices in order, the tasks in order of first appearance.
  std::vector<std::string> names;
  std::vector<std::vector<std::size_t>> by_task;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const auto found = std::find(names.begin(), names.end(), tasks[i]);
    if (found == names.end()) {
      names.push_back(tasks[i]);
      by_task.push_back({i});
    } else {
      by_task[std::size_t(found - names.begin())].push_back(i);
    }
  }
  if (limit == 0) limit = tasks.size();
  std::vector<std::size_t> kept;
  for (std::size_t turn = 0; kept.size() < limit && kept.size() < tasks.size(); ++turn) {
    for (const std::vector<std::size_t>& indices : by_task) {
      if (turn < indices.size() && kept.size() < limit) kept.push_back(indices[turn]);
    }
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

void CheckShard(int shard_index, int shard_count) {
  if (shard_count < 1 || shard_index < 0 || shard_index >= shard_count) {
    Fail("shard ", shard_index, "/", shard_count, " is invalid: need 0 <= i < n");
  }
}

void ParseShard(std::string_view spec, int* index, int* count) {
  const std::size_t slash = spec.find('/');
  const auto parse = [&](std::string_view digits, int* out) {
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *out);
    return !digits.empty() && error == std::errc() && end == digits.data() + digits.size();
  };
  if (slash == std::string_view::npos || !parse(spec.substr(0, slash), index) ||
      !parse(spec.substr(slash + 1), count)) {
    Fail("--shard '", spec, "' is invalid: expected i/n, e.g. 0/4");
  }
  CheckShard(*index, *count);
}

std::string_view TruncateAtStop(std::string_view text, const std::vector<std::string>& stops) {
  std::size_t end = text.size();
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    end = std::min(end, text.substr(0, end).find(stop));
  }
  return text.substr(0, end);
}

void ScoreBoard::Add(const GradeResult& result) {
  ++count_;
  for (const MetricScore& score : result.metrics) {
    auto it = std::find_if(correct_.begin(), correct_.end(),
                           [&](const auto& entry) { return entry.first == score.metric; });
    if (it == correct_.end()) it = correct_.insert(correct_.end(), {score.metric, 0});
    it->second += score.correct ? 1 : 0;
  }
}

std::size_t ScoreBoard::correct(std::string_view metric) const {
  for (const auto& [name, correct] : correct_) {
    if (name == metric) return correct;
  }
  return 0;
}

double ScoreBoard::accuracy(std::string_view metric) const {
  return count_ == 0 ? 0.0 : static_cast<double>(correct(metric)) / static_cast<double>(count_);
}

nlohmann::json ScoreBoard::ToJson() const {
  json metrics = json::object();
  for (const auto& [name, correct] : correct_) {
    metrics[name] = {{"correct", correct}, {"accuracy", accuracy(name)}};
  }
  return {{"count", count_}, {"metrics", metrics}};
}

}  // namespace polestar::eval
