// Helpers shared by the tests: where the fixtures live, temporary folders, running the CLI,
// expecting an error.
#pragma once

#include <gmock/gmock.h>

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace polestar::testing {

// ../shared beside the checkout, or $POLESTAR_SHARED.
std::string SharedDir();
// tests/data/fixtures/name (the fixtures this repository made), else SharedDir()/fixtures/name.
std::string FixtureDir(const std::string& name);
std::string SourceDir();
// A fresh empty folder under the build tree's test output, named after the current test.
std::string TempDir();
// Runs the polestar binary with `args` (shell-quoted by the caller); returns exit code,
// stdout in *out (stderr merged when merge_stderr).
int RunCli(const std::string& args, std::string* out, bool merge_stderr = false);

// The `count` floats at `data` in `backend`'s memory (a cache's rows), downloaded: host code
// never reads backend memory in place, and the checking backend crashes one that does.
std::vector<float> Download(const Backend& backend, const float* data, int64_t count);

// The values of an I64 tensor (a fixture's token ids) as ints.
std::vector<int> ToInts(const TensorRef& t);

// Every position's logits [L, V] of one bidirectional pass of `model` over `ids` on `backend`.
std::vector<float> FullPassLogits(const Model& model, std::span<const int> ids,
                                  const Backend& backend);

// Why the backend `spec` names cannot run on this machine ("" where it can), for a test to
// skip with; and the spec as a test name ("cuda:activations=f32" -> "cuda_activations_f32").
std::string BackendUnavailable(const std::string& spec);
std::string BackendTestName(const std::string& spec);

// Matches a callable that throws polestar::Error whose message holds every one of `parts`:
//   EXPECT_THAT([&] { Load(path); }, ThrowsErrorContaining({path, "truncated"}));
inline auto ThrowsErrorContaining(const std::vector<std::string>& parts) {
  std::vector<::testing::Matcher<std::string>> each;
  for (const std::string& part : parts) each.push_back(::testing::HasSubstr(part));
  return ::testing::ThrowsMessage<Error>(::testing::AllOfArray(each));
}

// What a block-diffusion reference run committed at each step: its record holds the token
// window fed to every forward (windows[nfe, T]), so step i committed the positions where
// window i + 1 differs from window i. Returns nfe - 1 ascending position lists.
std::vector<std::vector<int>> ReferenceCommits(std::span<const int> windows, int nfe);

// A checkpoint folder held in memory, to build broken or unusual models from a good one.
struct Checkpoint {
  nlohmann::json config;
  std::vector<TensorToWrite> tensors;

  TensorToWrite& Tensor(const std::string& name);  // throws when absent
  // The values of an F32 tensor, to edit in place.
  std::span<float> Floats(const std::string& name);
};
Checkpoint LoadCheckpoint(const std::string& fixture);  // a safetensors fixture folder
// Writes config.json and model.safetensors into `dir` (created); returns `dir`.
std::string WriteCheckpoint(const Checkpoint& checkpoint, const std::string& dir);

}  // namespace polestar::testing
