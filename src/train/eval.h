// Held-out evaluation of a model folder on the task suite: each test item's chat prompt is
// decoded with LLaDA's semi-autoregressive low-confidence remasking (blocks left to right,
// the most confident masked positions of the current block committed each step) through
// the engine's Forward::Run, and the answer (cut at the first EOS / end-of-turn) graded.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "tasks/tasks.h"
#include "train/bpe.h"

namespace polestar::train {

struct DecodeOptions {
  int gen_length = 32;
  int block_length = 8;
  int tokens_per_step = 1;  // fixed-count rule: commits per step
  float threshold = 0.0f;   // > 0: commit every masked position of the block above it (at least one)
};

struct TaskScore {
  std::string task;
  int correct = 0, total = 0;
  double forwards = 0;  // mean forward passes per item
  double accuracy() const { return total ? double(correct) / total : 0.0; }
};

// Decodes one prompt (token ids) and returns the generated token ids (the canvas after the
// prompt), counting forward passes into *forwards.
std::vector<int> DecodeVanilla(const Model& model, const std::vector<int>& prompt,
                               const DecodeOptions& options, int* forwards);

// Text of the generated ids up to the first EOS or end-of-turn token.
std::string AnswerText(const BpeTokenizer& tokenizer, const std::vector<int>& generated);

std::vector<TaskScore> EvaluateTasks(const Model& model, const BpeTokenizer& tokenizer,
                                     const std::vector<std::string>& tasks, int items,
                                     uint64_t seed, const DecodeOptions& options);

}  // namespace polestar::train
