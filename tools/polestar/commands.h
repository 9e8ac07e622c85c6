// Subcommands of the polestar CLI. Each Add*Command registers its flags and callback; those
// that decode take the model's decoding defaults (CommandLineDecodeDefaults) as their flags'.
#pragma once

#include <CLI/CLI.hpp>

#include "decode/options.h"

namespace polestar::cli {

void AddInspectCommand(CLI::App& app);
void AddForwardCommand(CLI::App& app);
void AddGenerateCommand(CLI::App& app, const DecodeOptions& defaults);
void AddTokenizeCommand(CLI::App& app);
void AddConvertCommand(CLI::App& app);
void AddServeCommand(CLI::App& app, const DecodeOptions& defaults);
void AddMakeRandomModelCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddEvalCommand(CLI::App& app, const DecodeOptions& defaults);
void AddTasksCommand(CLI::App& app);
void AddTrainCommand(CLI::App& app);
void AddTasksEvalCommand(CLI::App& app, const DecodeOptions& defaults);

}  // namespace polestar::cli
