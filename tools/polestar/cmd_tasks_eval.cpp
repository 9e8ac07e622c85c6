// polestar tasks-eval: held-out accuracy of a model on the task suite (src/tasks) under any
// decoding policy; the model folder must hold the tokenizer.json it was trained with.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend_flags.h"
#include "base/error.h"
#include "base/parallel.h"
#include "commands.h"
#include "decode_flags.h"
#include "tasks/tasks.h"
#include "train/eval.h"
#include "train/trainer.h"

namespace polestar::cli {

void AddTasksEvalCommand(CLI::App& app, const DecodeOptions& defaults) {
  auto* cmd =
      app.add_subcommand("tasks-eval", "Held-out accuracy per task of a polestar-tiny model");
  struct Args {
    std::string model, backend;
    std::vector<std::string> tasks;
    int items = 50;
    uint64_t item_seed = 1000;
    bool json = false;
    int threads = 0;
    DecodeOptions decode;
  };
  auto args = std::make_shared<Args>();
  args->decode.gen_length = 32;
  args->decode.block_length = 8;
  args->decode.steps = 32;
  cmd->add_option("-m,--model", args->model, "model folder (config, weights, tokenizer)")
      ->required();
  cmd->add_option("--tasks", args->tasks, "tasks (default: all)");
  cmd->add_option("--items", args->items, "test items per task")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  AddUint64Option(cmd, "--item-seed", args->item_seed, "seed of the test items");
  cmd->add_flag("--json", args->json, "print JSON instead of a table");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  AddBackendFlag(cmd, args->backend);
  args->decode = defaults;
  AddDecodeFlags(cmd, args->decode);
  cmd->callback([args] {
    SetThreadCount(args->threads);
    auto model = LoadModelOnBackend(args->model, args->backend);
    const std::vector<std::string> tasks = args->tasks.empty() ? TaskNames() : args->tasks;
    for (const std::string& task : tasks) CheckTaskName(task);
    const auto scores = train::EvaluateTasks(args->model, *model, tasks, args->items,
                                             args->item_seed, args->decode);
    int correct = 0, total = 0;
    double forwards = 0;
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& s : scores) {
      correct += s.correct;
      total += s.total;
      forwards += s.forwards * s.total;
      out.push_back({{"task", s.task},
                     {"correct", s.correct},
                     {"total", s.total},
                     {"accuracy", s.accuracy()},
                     {"nfe", s.forwards}});
      if (!args->json) {
        std::printf("%-8s %5.1f%%  (%d/%d)  nfe %.1f\n", s.task.c_str(), 100 * s.accuracy(),
                    s.correct, s.total, s.forwards);
      }
    }
    const double overall = total ? double(correct) / total : 0.0;
    if (args->json) {
      std::printf("%s\n", nlohmann::ordered_json({{"tasks", out},
                                                  {"accuracy", overall},
                                                  {"nfe", total ? forwards / total : 0.0},
                                                  {"backend", model->backend().name()}})
                              .dump()
                              .c_str());
    } else {
      std::printf("%-8s %5.1f%%  (%d/%d)  nfe %.1f\n", "overall", 100 * overall, correct, total,
                  total ? forwards / total : 0.0);
    }
  });
}

}  // namespace polestar::cli
