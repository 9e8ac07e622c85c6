// polestar tasks: prints items of the verifiable task suite (src/tasks/tasks.h).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "decode_flags.h"
#include "tasks/tasks.h"
#include "tokenizer/model_tokenizer.h"

namespace polestar::cli {

void AddTasksCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("tasks", "List tasks or print generated task items");
  struct Args {
    std::string task, split = "test";
    int n = 5;
    uint64_t seed = 0, start = 0;
    bool json = false, chat = false;
    std::string tokenizer;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--task", args->task, "task name (without it: list the tasks)");
  cmd->add_option("--split", args->split, "train or test")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  cmd->add_option("-n,--n", args->n, "number of items")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  AddUint64Option(cmd, "--seed", args->seed, "generator seed");
  AddUint64Option(cmd, "--start", args->start, "index of the first item");
  cmd->add_flag("--json", args->json, "one JSON object per line");
  cmd->add_flag("--chat", args->chat, "print the prompt in the chat template");
  cmd->add_option(
      "--tokenizer", args->tokenizer,
      "with --json: add prompt_ids / answer_ids encoded by this model folder's tokenizer "
      "(the ids the trainer trains on and generate / eval feed the model)");
  cmd->callback([args] {
    if (args->task.empty()) {
      for (const std::string& task : AllTaskNames()) {
        std::printf("%-8s %s\n", task.c_str(), DescribeTask(task).c_str());
      }
      return;
    }
    CheckTaskName(args->task);
    const Split split = args->split == "train" ? Split::kTrain : Split::kTest;
    std::unique_ptr<Tokenizer> tokenizer;
    if (!args->tokenizer.empty()) tokenizer = LoadModelTokenizer(args->tokenizer);
    for (int i = 0; i < args->n; ++i) {
      const uint64_t index = args->start + uint64_t(i);
      const TaskItem item = MakeTaskItem(args->task, split, index, args->seed);
      const std::string prompt = args->chat ? ChatPrompt(item.prompt) : item.prompt;
      if (args->json) {
        nlohmann::ordered_json j = {{"task", item.task}, {"split", args->split},
                                    {"index", index},    {"seed", args->seed},
                                    {"prompt", prompt},  {"answer", item.answer}};
        if (tokenizer) {
          j["prompt_ids"] = tokenizer->Encode(prompt);
          j["answer_ids"] = tokenizer->Encode(item.answer);
        }
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("# %s %s %llu\n%s\n=> %s\n\n", item.task.c_str(), args->split.c_str(),
                    static_cast<unsigned long long>(index), prompt.c_str(), item.answer.c_str());
      }
    }
  });
}

}  // namespace polestar::cli
