// Helpers shared by the tests: where the fixtures live, temporary folders, running the CLI.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace polestar::testing {

// ../shared beside the checkout, or $POLESTAR_SHARED.
std::string SharedDir();
std::string FixtureDir(const std::string& name);  // SharedDir()/fixtures/name
std::string SourceDir();
// A fresh empty folder under the build tree's test output, named after the current test.
std::string TempDir();
// Runs the polestar binary with `args` (shell-quoted by the caller); returns exit code,
// stdout in *out (stderr merged when merge_stderr).
int RunCli(const std::string& args, std::string* out, bool merge_stderr = false);

// A safetensors checkpoint as named F32 tensors (name -> values, shape beside).
struct EditableTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using EditableCheckpoint = std::map<std::string, EditableTensor>;

// Writes a copy of an F32 safetensors fixture into `dir` after `edit` changed its config.json
// and tensors (hostile or unusual checkpoints built from a known-good one); returns `dir`.
std::string WriteEditedFixture(const std::string& fixture, const std::string& dir,
                               const std::function<void(nlohmann::json& config,
                                                        EditableCheckpoint& tensors)>& edit);

}  // namespace polestar::testing
