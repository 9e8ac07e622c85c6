#include "decode/policy_registry.h"

#include <algorithm>

#include "base/error.h"
#include "decode/option_schema.h"

namespace polestar {
namespace {

// Filled during static initialisation, hence a function-local static.
std::vector<PolicyEntry>& Registry() {
  static std::vector<PolicyEntry> entries;
  return entries;
}

}  // namespace

PolicyRegistration::PolicyRegistration(PolicyEntry entry) {
  PS_CHECK(!FindPolicy(entry.name));
  for (const OptionMember& option : entry.options) OptionOf(option);  // each in the schema
  std::vector<PolicyEntry>& entries = Registry();
  const auto at =
      std::upper_bound(entries.begin(), entries.end(), entry.rank,
                       [](int rank, const PolicyEntry& other) { return rank < other.rank; });
  entries.insert(at, std::move(entry));
}

const std::vector<PolicyEntry>& RegisteredPolicies() { return Registry(); }

const PolicyEntry* FindPolicy(std::string_view name) {
  for (const PolicyEntry& entry : Registry()) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

bool IsKnownPolicy(std::string_view name) { return FindPolicy(name) != nullptr; }

std::string KnownPolicies(const char* separator) {
  std::string names;
  for (const PolicyEntry& entry : Registry())
    names += Cat(names.empty() ? "" : separator, entry.name);
  return names;
}

std::vector<std::string> PoliciesReading(std::string_view name) {
  std::vector<std::string> readers;
  for (const PolicyEntry& entry : Registry()) {
    for (const OptionMember& option : entry.options) {
      if (name == OptionOf(option).name) readers.emplace_back(entry.name);
    }
  }
  return readers;
}

std::string PolicyHelp() {
  auto flags = [](const std::vector<const OptionSpec*>& options) {
    std::string text;
    for (const OptionSpec* option : options) {
      text += Cat(text.empty() ? "" : " ", OptionName(*option, Vocabulary::kCli));
    }
    return text;
  };
  std::string text;
  for (const PolicyEntry& entry : Registry()) {
    text += Cat(entry.name, ": ", entry.description, "\n");
    std::vector<const OptionSpec*> reads;
    for (const OptionMember& option : entry.options) reads.push_back(&OptionOf(option));
    if (!reads.empty()) text += Cat("    options: ", flags(reads), "\n");
  }
  std::vector<const OptionSpec*> shared;  // read by the decoding loop every policy runs in
  for (const OptionSpec& option : OptionSchema()) {
    if (PoliciesReading(option.name).empty()) shared.push_back(&option);
  }
  return text + Cat("every policy: ", flags(shared), "\n");
}

std::unique_ptr<Policy> MakePolicy(const DecodeOptions& options, const Model& model) {
  const PolicyEntry* entry = FindPolicy(options.policy);
  if (!entry) Fail("unknown policy '", options.policy, "' (known: ", KnownPolicies(), ")");
  return entry->make(options, model);
}

}  // namespace polestar
