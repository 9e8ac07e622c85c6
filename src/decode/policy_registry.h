// The decoding policies by name. Each policy's own file registers itself (a
// PolicyRegistration at namespace scope) with its names, factory, description, the options
// it reads and its own rules for them (defaults, combinations, block diffusion), so that a
// new policy is that one file; every list of policies (validation, --policy help, the
// server, the benchmark's default --policies, MakePolicy) comes from here. The library is
// linked whole (src/decode/CMakeLists.txt), so no registration is dropped by the linker.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decode/option_schema.h"
#include "decode/policy.h"

namespace polestar {

struct PolicyEntry {
  const char* name;
  const char* description;  // one line
  // The options the policy reads beyond the shared decoding loop's, as DecodeOptions
  // members (the schema, option_schema.h, names them).
  std::vector<OptionMember> options;
  // Where the policy stands in every list: the baselines first, in the order they appeared.
  int rank;
  std::unique_ptr<Policy> (*make)(const DecodeOptions& options, const Model& model);
  // Whether classifier-free guidance applies: its unconditional pass runs each step's plan
  // without the policy's layer hook, so policies that decide layer by layer cannot have it.
  bool guidance = true;
  // The threshold its paper reports it at: `bench` and `eval` decode with it unless told
  // otherwise (Fast-dLLM's and Elastic-Cache's parallel decoding at 0.9).
  std::optional<double> paper_threshold = std::nullopt;
  // How it decodes LLaDA 2.x's block diffusion, as the error refusing the others lists it
  // ("LLaDA 2.x's own sampler, ..."); nullptr: it does not.
  const char* block_diffusion = nullptr;
  // DecodeOptions::Resolved's hooks, each optional. `option_defaults` fills the
  // model-dependent defaults of the options it reads whichever policy decodes, so that
  // every record names one value (Elastic-Cache's window); `resolve` fills the defaults it
  // gives the shared options when it decodes (Polestar's commit threshold).
  void (*option_defaults)(DecodeOptions& options, const ModelConfig& config) = nullptr;
  void (*resolve)(DecodeOptions& options, const ModelConfig& config) = nullptr;
  // DecodeOptions::Validate's hook when it decodes, after the rules every policy shares:
  // throws OptionError naming the options of a combination it cannot decode on this model.
  void (*validate)(const DecodeOptions& options, const ModelConfig& config) = nullptr;
};

class PolicyRegistration {
 public:
  explicit PolicyRegistration(PolicyEntry entry);
};

// Every registered policy, by rank.
const std::vector<PolicyEntry>& RegisteredPolicies();
const PolicyEntry* FindPolicy(std::string_view name);
bool IsKnownPolicy(std::string_view name);
// "vanilla, fast-dllm-prefix, ..." (`separator` between the names).
std::string KnownPolicies(const char* separator = ", ");
// The policies that read option `name` (its canonical name), by rank.
std::vector<std::string> PoliciesReading(std::string_view name);
// Each policy with its description and options, then the options every policy shares:
// what --policy help prints.
std::string PolicyHelp();

}  // namespace polestar
