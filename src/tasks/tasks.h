// The verifiable task suite that polestar-tiny is trained and judged on. Every item is a
// pure function of (task, split, index, seed), so training data and held-out sets are
// reproducible without files. Train and test are disjoint by construction: an item belongs
// to the test split exactly when the hash of its prompt is divisible by kTestModulus, and
// each split's generator redraws until it lands on its own side.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polestar {

enum class Split { kTrain, kTest };

struct TaskItem {
  std::string task;    // task name, e.g. "add"
  std::string prompt;  // the user message (without the chat template)
  std::string answer;  // one reference answer (for multi-answer tasks, one of the valid ones)
};

// Prompts whose hash % kTestModulus == 0 are test items, all others train items.
inline constexpr uint64_t kTestModulus = 8;

// Two families of tasks. kTiny: short answers (at most 30 tokens) for polestar-tiny, decoded
// with gen 32 in blocks of 8: add, sub, copy, reverse, sort, insert, remove, replace, latin,
// word. kLong: answers of 20-70 tokens whose tokens depend on each other, for polestar-long,
// decoded with gen 128 in blocks of 32: mul, chain, longsort, longedit, sudoku, totals.
enum class TaskFamily { kTiny, kLong };

// A family's task names in a fixed order.
const std::vector<std::string>& TaskNames(TaskFamily family = TaskFamily::kTiny);
// Both families, kTiny's first.
const std::vector<std::string>& AllTaskNames();
// Throws Error for an unknown name, listing the known ones.
void CheckTaskName(std::string_view task);
// One line per task for help texts: what it asks and how it is graded.
std::string DescribeTask(std::string_view task);

TaskItem MakeTaskItem(std::string_view task, Split split, uint64_t index, uint64_t seed);

// Whether `output` (the decoded answer, trimmed) is a correct answer to `item`: exact match
// for deterministic tasks, validity for the Latin square and the sudoku (any completion of
// the given grid counts) and the final number for word problems and products.
bool GradeAnswer(const TaskItem& item, std::string_view output);

// FNV-1a 64 of the prompt; decides the split.
uint64_t PromptHash(std::string_view prompt);
Split SplitOf(std::string_view prompt);

// LLaDA's chat template for a single user turn, as text (special tokens spelled out):
// <|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>
// <|start_header_id|>assistant<|end_header_id|>\n\n
std::string ChatPrompt(std::string_view user_message);

// A small deterministic generator (SplitMix64) used by the tasks and the trainer.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform integer in [lo, hi].
  int Range(int lo, int hi);
  // Uniform float in [0, 1).
  double Uniform();
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Mixes several values into one seed (for per-(task, index, attempt) streams).
uint64_t MixSeed(std::initializer_list<uint64_t> values);

}  // namespace polestar
