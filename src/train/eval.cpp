#include "train/eval.h"

#include "base/error.h"
#include "bench/suites.h"
#include "decode/generate.h"

namespace polestar::train {

std::vector<TaskScore> EvaluateTasks(const std::string& model_dir, const Model& model,
                                     const std::vector<std::string>& tasks, int items,
                                     uint64_t seed, const DecodeOptions& options) {
  PS_CHECK(items > 0);
  bench::SuiteOptions selection;
  selection.name = "tiny";
  selection.model_dir = model_dir;
  selection.tasks = tasks;
  selection.per_task = items;
  selection.seed = seed;
  const bench::BenchSuite suite = bench::LoadBenchSuite(selection, model.config());
  // The suite holds `items` items per task, task after task in the order of `tasks`.
  PS_CHECK(suite.items.size() == tasks.size() * size_t(items));
  std::vector<TaskScore> scores;
  for (size_t t = 0; t < tasks.size(); ++t) {
    TaskScore score{tasks[t]};
    int64_t forwards = 0;
    for (size_t i = t * size_t(items); i < (t + 1) * size_t(items); ++i) {
      const GenerationResult result = Generate(model, suite.items[i].prompt, options);
      forwards += result.nfe;
      score.correct += suite.grade(i, result.generated).grade.correct ? 1 : 0;
      ++score.total;
    }
    score.forwards = double(forwards) / items;
    scores.push_back(score);
  }
  return scores;
}

}  // namespace polestar::train
