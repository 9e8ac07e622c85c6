// Held-out evaluation of a model on the task suite: each test item's chat prompt is decoded
// by the engine (decode/generate.h, any policy and commit rule) and the answer, cut at the
// first EOS / end-of-turn, is graded by the task's grader.
#pragma once

#include <string>
#include <vector>

#include "decode/options.h"
#include "model/model.h"
#include "train/bpe.h"

namespace polestar::train {

struct TaskScore {
  std::string task;
  int correct = 0, total = 0;
  double forwards = 0;  // mean forward passes per item
  double accuracy() const { return total ? double(correct) / total : 0.0; }
};

// Text of the generated ids up to the first EOS or end-of-turn token.
std::string AnswerText(const BpeTokenizer& tokenizer, const std::vector<int>& generated);

// `items` test items per task, indices 0.., generated with `seed`.
std::vector<TaskScore> EvaluateTasks(const Model& model, const BpeTokenizer& tokenizer,
                                     const std::vector<std::string>& tasks, int items,
                                     uint64_t seed, const DecodeOptions& options);

}  // namespace polestar::train
