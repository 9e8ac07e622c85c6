// The flags eval and bench share to choose a model, a suite's items and how many of them
// decode together, declared once.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "bench/bench.h"

namespace polestar::cli {

struct SuiteFlags {
  std::string model, suite = "tiny", data_dir, shard, prompt_format = "auto";
  int per_task = 0;
  std::size_t limit = 0;
  int batch = 1;  // items per forward
};

void AddSuiteFlags(CLI::App* cmd, SuiteFlags& flags);

// The suite options the flags ask for: the model folder (the bundled model when -m is
// omitted), the slice, and `seed`, which picks the tiny suite's test items. Throws Error on
// a bad --shard or --prompt-format.
bench::SuiteOptions ResolveSuiteFlags(const SuiteFlags& flags, uint64_t seed);

}  // namespace polestar::cli
