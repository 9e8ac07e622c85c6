// polestar: the command-line entry point. Errors in user input reach here as
// polestar::Error and are printed without a stack of noise; any other exception ends the
// same way, so no command reaches std::terminate: status 1 for an error, 2 for bad usage.
#include <cstdio>
#include <exception>
#include <new>

#include "base/error.h"
#include "commands.h"
#include "decode_flags.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"polestar: a native inference engine for diffusion language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "polestar 0.1.0");
  const polestar::DecodeOptions defaults = polestar::cli::CommandLineDecodeDefaults(argc, argv);
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
    // CLI11 prints the usage error (or the help, status 0).
    return app.exit(e) == 0 ? 0 : 2;
  }
  return 0;
}

int Failed(const char* message) {
  std::fprintf(stderr, "polestar: error: %s\n", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const polestar::Error& e) {
    return Failed(e.what());
  } catch (const std::bad_alloc&) {
    return Failed("out of memory");
  } catch (const std::exception& e) {
    return Failed(e.what());
  } catch (...) {
    return Failed("an unknown exception");
  }
}
