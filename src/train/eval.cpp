#include "train/eval.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "model/forward.h"

namespace polestar::train {

std::vector<int> DecodeVanilla(const Model& model, const std::vector<int>& prompt,
                               const DecodeOptions& options, int* forwards) {
  const ModelConfig& c = model.config();
  if (options.gen_length % options.block_length != 0) {
    Fail("decode: gen length ", options.gen_length, " is not a multiple of block length ",
         options.block_length);
  }
  const int p = int(prompt.size());
  std::vector<int> canvas(prompt);
  canvas.resize(size_t(p + options.gen_length), c.mask_id);
  KvCache cache = MakeCache(model, int64_t(canvas.size()), false);
  Forward forward(model, cache);
  StepPlan plan;
  plan.input_rows.resize(canvas.size());
  std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
  for (int block = p; block < p + options.gen_length; block += options.block_length) {
    plan.logit_rows.resize(size_t(options.block_length));
    std::iota(plan.logit_rows.begin(), plan.logit_rows.end(), block);
    while (true) {
      // (confidence, position, token) of every still-masked position of the block.
      std::vector<std::tuple<float, int, int>> candidates;
      for (int i = 0; i < options.block_length; ++i) {
        if (canvas[size_t(block + i)] == c.mask_id) candidates.push_back({0.0f, block + i, 0});
      }
      if (candidates.empty()) break;
      StepResult result = forward.Run(canvas, plan);
      ++*forwards;
      for (auto& [confidence, position, token] : candidates) {
        const float* row = &result.logits[size_t(position - block) * size_t(c.vocab)];
        token = int(std::max_element(row, row + c.vocab) - row);
        double sum = 0.0;
        for (int v = 0; v < c.vocab; ++v) sum += std::exp(double(row[v] - row[token]));
        confidence = float(1.0 / sum);
      }
      // Most confident first; ties to the leftmost position, as torch.topk on equal values.
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
      size_t commit = std::min<size_t>(size_t(options.tokens_per_step), candidates.size());
      if (options.threshold > 0.0f) {
        commit = 1;
        while (commit < candidates.size() && std::get<0>(candidates[commit]) > options.threshold) {
          ++commit;
        }
      }
      for (size_t i = 0; i < commit; ++i) {
        canvas[size_t(std::get<1>(candidates[i]))] = std::get<2>(candidates[i]);
      }
    }
  }
  return std::vector<int>(canvas.begin() + p, canvas.end());
}

std::string AnswerText(const BpeTokenizer& tokenizer, const std::vector<int>& generated) {
  const int eos = tokenizer.TokenId(kEosToken), eot = tokenizer.TokenId(kEotToken);
  std::vector<int> kept;
  for (int id : generated) {
    if (id == eos || id == eot) break;
    kept.push_back(id);
  }
  return tokenizer.Decode(kept);
}

std::vector<TaskScore> EvaluateTasks(const Model& model, const BpeTokenizer& tokenizer,
                                     const std::vector<std::string>& tasks, int items,
                                     uint64_t seed, const DecodeOptions& options) {
  std::vector<TaskScore> scores;
  for (const std::string& task : tasks) {
    TaskScore score{task};
    int forwards = 0;
    for (int i = 0; i < items; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTest, uint64_t(i), seed);
      const std::vector<int> prompt = tokenizer.Encode(ChatPrompt(item.prompt));
      const std::vector<int> generated = DecodeVanilla(model, prompt, options, &forwards);
      score.correct += GradeAnswer(item, AnswerText(tokenizer, generated)) ? 1 : 0;
      ++score.total;
    }
    score.forwards = items ? double(forwards) / items : 0.0;
    scores.push_back(score);
  }
  return scores;
}

}  // namespace polestar::train
