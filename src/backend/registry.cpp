#include "backend/registry.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "backend/checked/checked_backend.h"
#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#if defined(POLESTAR_CUDA) || defined(POLESTAR_CUDA_EMULATION)
#include "backend/cuda/cuda_entry.h"
#endif

namespace polestar {

const std::vector<BackendEntry>& RegisteredBackends() {
  // The one place backends are registered, highest rank first.
  static const std::vector<BackendEntry> entries = {
#ifdef POLESTAR_CUDA
      CudaBackendEntry(),
#endif
      CpuBackendEntry(), CheckedBackendEntry(),
#ifdef POLESTAR_CUDA_EMULATION
      CudaBackendEntry(),  // over the host emulation: tests only, below the CPU
#endif
  };
  return entries;
}

namespace {

const BackendEntry* FindBackend(std::string_view name) {
  for (const BackendEntry& entry : RegisteredBackends()) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::string KnownBackends() {
  std::string names = "auto";
  for (const BackendEntry& entry : RegisteredBackends()) names += Cat(", ", entry.name);
  return names;
}

// "name:k=v,k=v" -> the entry and its options, each key known to it.
std::pair<const BackendEntry*, BackendOptions> Parse(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  BackendOptions options;
  const BackendEntry* entry = nullptr;
  if (name == "auto") {
    for (const BackendEntry& candidate : RegisteredBackends()) {
      if (candidate.unavailable().empty()) {
        entry = &candidate;
        break;
      }
    }
    if (entry == nullptr) Fail("no backend of this build runs on this machine");
    if (colon != std::string_view::npos) {
      Fail("backend 'auto' takes no options (got '", spec, "'); name the backend to set them");
    }
    return {entry, options};
  }
  entry = FindBackend(name);
  if (entry == nullptr) Fail("unknown backend '", name, "' (known: ", KnownBackends(), ")");
  if (const std::string why = entry->unavailable(); !why.empty()) {
    Fail("backend '", name, "' cannot run here: ", why);
  }
  if (colon == std::string_view::npos) return {entry, options};
  std::string_view rest = spec.substr(colon + 1);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      Fail("backend option '", item, "' in '", spec, "' is not KEY=VALUE");
    }
    const std::string_view key = item.substr(0, equals);
    bool known = false;
    std::string keys;
    for (const BackendOptionSpec& option : entry->options) {
      known = known || option.key == key;
      keys += Cat(keys.empty() ? "" : ", ", option.key);
    }
    if (!known) {
      Fail("backend '", name, "' has no option '", key,
           "' (its options: ", keys.empty() ? "none" : keys, ")");
    }
    options.emplace_back(key, item.substr(equals + 1));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return {entry, options};
}

}  // namespace

const Backend& BackendNamed(std::string_view spec) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Backend>, std::less<>> made;  // by spec
  std::lock_guard lock(mutex);
  if (auto it = made.find(spec); it != made.end()) return *it->second;
  auto [entry, options] = Parse(spec);
  // Under its own name, so "auto" and the name it picks share one backend.
  std::string canonical(entry->name);
  for (size_t i = 0; i < options.size(); ++i)
    canonical += Cat(i == 0 ? ":" : ",", options[i].first, "=", options[i].second);
  std::unique_ptr<Backend>& backend = made[canonical];
  if (!backend) backend = entry->make(options);
  return *backend;
}

std::string DefaultBackendSpec() {
  const char* env = std::getenv("POLESTAR_BACKEND");
  return env != nullptr && *env != '\0' ? env : "auto";
}

std::string BackendHelp() {
  std::string text = "  auto    the available backend of highest rank (default)\n";
  for (const BackendEntry& entry : RegisteredBackends()) {
    text += Cat("  ", entry.name, "     ", entry.description, "\n");
    for (const BackendOptionSpec& option : entry.options) {
      text += Cat("    :", option.key, "=", option.values, "  ", option.description, "\n");
    }
  }
  return text;
}

}  // namespace polestar
