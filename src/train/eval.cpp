#include "train/eval.h"

#include "decode/generate.h"
#include "tasks/tasks.h"

namespace polestar::train {

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
    int64_t forwards = 0;
    for (int i = 0; i < items; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTest, uint64_t(i), seed);
      const std::vector<int> prompt = tokenizer.Encode(ChatPrompt(item.prompt));
      const GenerationResult result = Generate(model, prompt, options);
      forwards += result.nfe;
      score.correct += GradeAnswer(item, AnswerText(tokenizer, result.generated)) ? 1 : 0;
      ++score.total;
    }
    score.forwards = items ? double(forwards) / items : 0.0;
    scores.push_back(score);
  }
  return scores;
}

}  // namespace polestar::train
