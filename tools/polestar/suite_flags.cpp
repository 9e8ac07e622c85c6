#include "suite_flags.h"

#include "decode_flags.h"

namespace polestar::cli {

void AddSuiteFlags(CLI::App* cmd, SuiteFlags& flags) {
  cmd->add_option("-m,--model", flags.model, "model folder (default: models/polestar-tiny)");
  std::string suites;
  for (const std::string& s : bench::BenchSuiteNames()) suites += (suites.empty() ? "" : ", ") + s;
  cmd->add_option("--suite", flags.suite, "suite: " + suites)->capture_default_str();
  // Item counts have long names only: -n is the generation length everywhere.
  cmd->add_option("--per-task", flags.per_task, "tiny, long: test items per task (default 50 / 84)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--limit", flags.limit,
                  "N items, taken from every task in turn (after --per-task)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--shard", flags.shard, "i/n: the i-th of n contiguous slices (0-based)");
  cmd->add_option("--data", flags.data_dir,
                  "data folder of gsm8k/math500/humaneval/mbpp (default: data/)");
  cmd->add_option("--batch", flags.batch,
                  "items decoded together, one forward for all (same tokens as one at a time)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--prompt-format", flags.prompt_format, "auto | chat | raw")
      ->capture_default_str();
}

bench::SuiteOptions ResolveSuiteFlags(const SuiteFlags& flags, uint64_t seed) {
  bench::SuiteOptions options;
  options.name = flags.suite;
  options.model_dir = flags.model.empty() ? DefaultModelPath() : flags.model;
  options.data_dir = flags.data_dir;
  options.limit = flags.limit;
  if (!flags.shard.empty())
    eval::ParseShard(flags.shard, &options.shard_index, &options.shard_count);
  options.per_task = flags.per_task;
  options.seed = seed;
  options.prompt_format = bench::PromptFormatFromName(flags.prompt_format);
  return options;
}

}  // namespace polestar::cli
