// Subcommands of the polestar CLI. Each Add*Command registers its flags and callback.
#pragma once

#include <CLI/CLI.hpp>

namespace polestar::cli {

void AddInspectCommand(CLI::App& app);
void AddForwardCommand(CLI::App& app);
void AddGenerateCommand(CLI::App& app);
void AddTokenizeCommand(CLI::App& app);
void AddConvertCommand(CLI::App& app);
void AddServeCommand(CLI::App& app);
void AddMakeRandomModelCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddEvalCommand(CLI::App& app);
void AddTasksCommand(CLI::App& app);
void AddTrainCommand(CLI::App& app);
void AddTasksEvalCommand(CLI::App& app);

}  // namespace polestar::cli
