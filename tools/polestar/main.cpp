// polestar: the command-line entry point. Errors in user input reach here as
// polestar::Error and are printed without a stack of noise.
#include <cstdio>

#include "base/error.h"
#include "commands.h"
#include "decode_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"polestar: a native inference engine for diffusion language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "polestar 0.1.0");
  polestar::DecodeOptions defaults;
  try {
    defaults = polestar::cli::CommandLineDecodeDefaults(argc, argv);
  } catch (const polestar::Error& e) {
    std::fprintf(stderr, "polestar: error: %s\n", e.what());
    return 1;
  }
  polestar::cli::AddInspectCommand(app);
  polestar::cli::AddForwardCommand(app);
  polestar::cli::AddGenerateCommand(app, defaults);
  polestar::cli::AddTokenizeCommand(app);
  polestar::cli::AddConvertCommand(app);
  polestar::cli::AddServeCommand(app, defaults);
  polestar::cli::AddMakeRandomModelCommand(app);
  polestar::cli::AddBenchCommand(app);
  polestar::cli::AddEvalCommand(app, defaults);
  polestar::cli::AddTasksCommand(app);
  polestar::cli::AddTrainCommand(app);
  polestar::cli::AddTasksEvalCommand(app, defaults);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const polestar::Error& e) {
    std::fprintf(stderr, "polestar: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
