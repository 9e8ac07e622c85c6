// The backends this build has, and how a user names one: "--backend NAME[:KEY=VALUE,...]".
// Each backend folder (backend/cpu/, ...) describes itself with a BackendEntry, and
// registry.cpp lists the entries: adding a backend is its folder plus one line there.
//
//   auto             the available backend of highest rank (the default)
//   cpu              the CPU kernels (cpu:isa=avx2,activations=f32: options of the CPU backend)
//   checked          the CPU kernels over memory fenced off between ops, for tests (never auto)
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace polestar {

// A backend's options as given after its name: key=value pairs, in order.
using BackendOptions = std::vector<std::pair<std::string, std::string>>;

struct BackendOptionSpec {
  std::string_view key;
  std::string_view values;       // e.g. "scalar|avx2|avx512"
  std::string_view description;  // one line, for --help and docs
};

struct BackendEntry {
  std::string_view name;  // what --backend takes
  std::string_view description;
  int rank = 0;  // "auto" picks the available backend with the highest rank
  std::vector<BackendOptionSpec> options;
  // "" where this machine runs the backend; otherwise why not (shown by errors and skips).
  std::function<std::string()> unavailable;
  // Builds one; options were checked against `options`' keys. Throws Error for bad values.
  std::function<std::unique_ptr<Backend>(const BackendOptions&)> make;
};

// Every backend compiled in, highest rank first.
const std::vector<BackendEntry>& RegisteredBackends();

// The backend `spec` names ("auto", "cpu", "cpu:isa=avx2"), made on first use and kept for
// the process's life: every caller naming the same spec gets the same backend. Throws Error
// for an unknown name or option, a bad value, or a backend this machine cannot run.
const Backend& BackendNamed(std::string_view spec);

// What runs a model when nothing names a backend: the environment variable POLESTAR_BACKEND
// when set (so a whole test run, CLI and server included, can move to another backend),
// else "auto". --backend's default.
std::string DefaultBackendSpec();

// The backends and their options, for --help ("cpu  the CPU kernels ...").
std::string BackendHelp();

}  // namespace polestar
