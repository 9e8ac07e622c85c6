// --backend, shared by the commands that run a model (generate, eval, bench, serve, forward,
// tasks-eval): which backend (backend/registry.h) the model runs on.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "model/model.h"

namespace polestar::cli {

// Registers --backend NAME[:KEY=VALUE,...] on `cmd`, bound to `spec`, which starts as
// DefaultBackendSpec() (POLESTAR_BACKEND, else "auto"); its help lists the registered
// backends and their options.
void AddBackendFlag(CLI::App* cmd, std::string& spec);

// The backend `spec` names. One the registry refuses (an unknown name or option, a value
// this machine cannot run) is a usage error, status 2, with the registry's message: call this
// before any slow work.
const Backend& ChosenBackend(const std::string& spec);

// Model::Load(path), its sequences bound to the backend `spec` names, resolved first so that
// a bad spec costs no load.
std::unique_ptr<Model> LoadModelOnBackend(const std::string& path, const std::string& spec);

}  // namespace polestar::cli
