// Held-out evaluation of an exported model on the task suite: the benchmark harness's tiny suite
// (bench/suites.h) for the given tasks, each item's chat prompt decoded by the engine
// (decode/generate.h, any policy and commit rule) and the answer graded by the suite.
#pragma once

#include <string>
#include <vector>

#include "decode/options.h"
#include "model/model.h"

namespace polestar::train {

struct TaskScore {
  std::string task;
  int correct = 0, total = 0;
  double forwards = 0;  // mean forward passes per item
  double accuracy() const { return total ? double(correct) / total : 0.0; }
};

// `items` (> 0) test items per task, indices 0.., generated with `seed`; `model` is the one in
// `model_dir`, whose tokenizer.json encodes the prompts.
std::vector<TaskScore> EvaluateTasks(const std::string& model_dir, const Model& model,
                                     const std::vector<std::string>& tasks, int items,
                                     uint64_t seed, const DecodeOptions& options);

}  // namespace polestar::train
