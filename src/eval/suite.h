// Evaluation suites for real checkpoints: the test items with their prompts, and the grader
// that scores a completion. The benchmark harness loads a suite, generates a completion for each
// item's prompt (stopping at any of the suite's stop sequences), and calls Suite::Grade.
// Nothing here knows about models or tokenizers.
//
// Suites (data in data/ of the repository, see data/README.md):
//   gsm8k      1319 items. 5-shot, lm-eval gsm8k v3 format: the shots are the first 5 items of
//              the train split, each "Question: {question}\nAnswer: {answer}", joined by "\n\n",
//              then "Question: {question}\nAnswer:". Metrics: flexible_extract (primary; the last
//              number) and strict_match (the number after "#### "), both compared with
//              NumbersEqual (answers.h).
//   math500    500 items. 0-shot: "{problem}\nPlease reason step by step, and put your final
//              answer within \boxed{}." Metric: boxed_match (last \boxed{} against the
//              dataset's answer with MathAnswersEqual).
//   humaneval  164 items. 0-shot, prompt = the function signature and docstring. Metric:
//              pass@1 (greedy, one completion) by running the program in the sandbox.
//   mbpp       500 items (task_ids 11-510). 3-shot with task_ids 2, 3, 4, lm-eval mbpp format.
//              Metric: pass@1 by running the task's test_list asserts.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eval/sandbox.h"

namespace polestar::eval {

struct Message {
  std::string role;  // "user" or "assistant"
  std::string content;
};

struct EvalItem {
  // Unique in its suite: "gsm8k/17", "test/algebra/1.json", "HumanEval/0", "mbpp/11".
  std::string id;
  // The whole prompt as one text, few-shot examples included, exactly as lm-eval builds it. A
  // base model continues it; an instruct model gets it as a single user turn (what Fast-dLLM
  // and the LLaDA evaluations do).
  std::string prompt;
  // The same prompt as chat turns (lm-eval --fewshot_as_multiturn): each shot a user/assistant
  // pair, then the question as the last user turn. Zero-shot suites have one user turn.
  std::vector<Message> messages;
  // The gold answer: gsm8k the final number, math500 the LaTeX answer, humaneval/mbpp the
  // canonical solution code (grading runs tests, it does not compare with this).
  std::string reference;
  // Suite-specific fields graders need: humaneval {entry_point, test}; mbpp {test_list,
  // test_setup_code}; gsm8k {solution}; math500 {subject, level, solution}.
  nlohmann::json extra;
};

// One metric's verdict on one completion.
struct MetricScore {
  std::string metric;
  bool correct = false;
  std::string extracted;  // the answer that metric took from the completion; "" when none
};

struct GradeResult {
  bool correct = false;              // the suite's primary metric (metrics[0])
  std::string extracted;             // metrics[0].extracted
  std::vector<MetricScore> metrics;  // every metric of the suite, primary first
  // What a person needs to see why: for code suites {status ("passed", "failed", "timed_out",
  // "signaled", "exited_early"), exit_code, signal, seconds, stdout, stderr (truncated),
  // output_truncated, program}; gsm8k {reference}; math500 {normalized,
  // normalized_reference}.
  nlohmann::json details;
};

using Grader = std::function<GradeResult(const EvalItem& item, std::string_view completion)>;

struct Suite {
  std::string name;
  std::vector<EvalItem> items;              // after --limit and --shard
  std::size_t full_size = 0;                // items in the whole test split
  std::vector<std::string> metric_names;    // primary first
  std::vector<std::string> stop_sequences;  // generation may end at any; graders cut there too
  Grader grader;

  // Thread-safe (graders hold no mutable state), so items may be graded in parallel.
  GradeResult Grade(const EvalItem& item, std::string_view completion) const {
    return grader(item, completion);
  }
};

struct LoadOptions {
  // Keep `limit` items of the test split, taken from every task in turn (LimitedIndices); 0
  // keeps all.
  std::size_t limit = 0;
  // Then keep the shard_index-th of shard_count contiguous slices (sizes differ by at most 1),
  // so the shards of one run are disjoint and together cover it, in order.
  int shard_index = 0;
  int shard_count = 1;
  SandboxOptions sandbox;  // for humaneval and mbpp
};

// The names LoadSuite knows.
std::vector<std::string> SuiteNames();

// Loads a suite from `data_dir` (DefaultDataDir() for the repository's data/). Throws
// polestar::Error for an unknown name, a missing or malformed file (naming the file and line),
// or bad options.
Suite LoadSuite(std::string_view name, const std::string& data_dir,
                const LoadOptions& options = {});

// $POLESTAR_DATA when set, else the data/ folder of the source tree this was built from.
std::string DefaultDataDir();

// Parses "--shard i/n" (0 <= i < n) into *index and *count; throws polestar::Error otherwise.
void ParseShard(std::string_view spec, int* index, int* count);

// The indices of the `limit` items a limited run keeps, given each item's task, in their
// order: the tasks (in order of first appearance) take turns giving their next item, so every
// task is sampled, each by its first items. All indices when limit is 0 or not below the count.
std::vector<std::size_t> LimitedIndices(std::span<const std::string> tasks, std::size_t limit);

// Applies LoadOptions::limit and the shard to a list whose item i belongs to task_of(item i)
// (the suites built elsewhere use the same rule). Throws polestar::Error for a shard outside
// 0 <= index < count.
template <typename T, typename TaskOf>
std::vector<T> LimitAndShard(std::vector<T> items, const LoadOptions& options, TaskOf task_of);

// Cuts `text` at the earliest occurrence of any stop sequence.
std::string_view TruncateAtStop(std::string_view text, const std::vector<std::string>& stops);

// Per-metric accuracy over graded items.
class ScoreBoard {
 public:
  void Add(const GradeResult& result);
  std::size_t count() const { return count_; }
  std::size_t correct(std::string_view metric) const;
  double accuracy(std::string_view metric) const;  // in [0, 1]; 0 when nothing was added
  // {"count": N, "metrics": {"<metric>": {"correct": K, "accuracy": K/N}, ...}}
  nlohmann::json ToJson() const;

 private:
  std::size_t count_ = 0;
  std::vector<std::pair<std::string, std::size_t>> correct_;  // in first-seen order
};

// ---- implementation of the template ---------------------------------------------------------

void CheckShard(int shard_index, int shard_count);

template <typename T, typename TaskOf>
std::vector<T> LimitAndShard(std::vector<T> items, const LoadOptions& options, TaskOf task_of) {
  CheckShard(options.shard_index, options.shard_count);
  if (options.limit > 0 && options.limit < items.size()) {
    std::vector<std::string> tasks;
    for (const T& item : items) tasks.push_back(task_of(item));
    std::vector<T> kept;
    for (const std::size_t i : LimitedIndices(tasks, options.limit))
      kept.push_back(std::move(items[i]));
    items = std::move(kept);
  }
  const std::size_t n = items.size();
  const auto count = static_cast<std::size_t>(options.shard_count);
  const auto index = static_cast<std::size_t>(options.shard_index);
  const std::size_t begin = n * index / count, end = n * (index + 1) / count;
  return std::vector<T>(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(begin)),
                        std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(end)));
}

}  // namespace polestar::eval
