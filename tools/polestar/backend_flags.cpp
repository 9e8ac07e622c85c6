#include "backend_flags.h"

#include <cstdlib>

#include "backend/registry.h"
#include "base/error.h"

namespace polestar::cli {

void AddBackendFlag(CLI::App* cmd, std::string& spec) {
  spec = DefaultBackendSpec();
  std::string backends = BackendHelp();  // a line each, the last ending in '\n' too
  if (!backends.empty() && backends.back() == '\n') backends.pop_back();
  cmd->add_option(
         "--backend", spec,
         "the backend the model runs on (default: POLESTAR_BACKEND, else auto):\n" + backends)
      ->type_name("NAME[:KEY=VALUE,...]")
      ->capture_default_str();
}

const Backend& ChosenBackend(const std::string& spec) {
  try {
    return BackendNamed(spec);
  } catch (const Error& e) {
    // CLI11's usage error (main.cpp: status 2), naming where the spec came from.
    const char* env = std::getenv("POLESTAR_BACKEND");
    const bool from_env = env != nullptr && *env != '\0' && spec == DefaultBackendSpec();
    throw CLI::ValidationError(from_env ? "POLESTAR_BACKEND" : "--backend", e.what());
  }
}

std::unique_ptr<Model> LoadModelOnBackend(const std::string& path, const std::string& spec) {
  const Backend& backend = ChosenBackend(spec);
  std::unique_ptr<Model> model = Model::Load(path);
  model->UseBackend(backend);
  return model;
}

}  // namespace polestar::cli
