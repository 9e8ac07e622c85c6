// Helpers shared by the tests: where the fixtures live, temporary folders, running the CLI.
#pragma once

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

}  // namespace polestar::testing
