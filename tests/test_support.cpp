#include "test_support.h"

#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "backend/registry.h"
#include "io/json_file.h"
#include "model/forward.h"

namespace polestar::testing {

std::string SharedDir() {
  const char* env = std::getenv("POLESTAR_SHARED");
  return env != nullptr && *env != 0 ? env : POLESTAR_SHARED_DEFAULT;
}

std::string FixtureDir(const std::string& name) {
  const std::string ours = SourceDir() + "/tests/data/fixtures/" + name;
  return std::filesystem::exists(ours) ? ours : SharedDir() + "/fixtures/" + name;
}

std::string SourceDir() { return POLESTAR_SOURCE_DIR; }

std::string TempDir() {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() / "polestar-tests" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

int RunCli(const std::string& args, std::string* out, bool merge_stderr) {
  // $POLESTAR_BINARY, where the tests run away from their build tree (scripts/gpu-check.sh).
  const char* binary = std::getenv("POLESTAR_BINARY");
  std::string command = std::string(binary != nullptr && *binary != 0 ? binary : POLESTAR_BINARY) +
                        " " + args + (merge_stderr ? " 2>&1" : "");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buffer;
  std::string text;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) text.append(buffer.data(), n);
  const int status = pclose(pipe);
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TensorToWrite& Checkpoint::Tensor(const std::string& name) {
  for (TensorToWrite& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("test checkpoint lacks " + name);
}

std::span<float> Checkpoint::Floats(const std::string& name) {
  TensorToWrite& t = Tensor(name);
  EXPECT_EQ(t.dtype, DType::kF32) << name;
  return {reinterpret_cast<float*>(t.bytes.data()), t.bytes.size() / sizeof(float)};
}

Checkpoint LoadCheckpoint(const std::string& fixture) {
  const std::string dir = FixtureDir(fixture);
  Checkpoint checkpoint;
  checkpoint.config = ReadJsonFile(dir + "/config.json");
  const TensorStore store = ReadSafetensorsDir(dir);
  for (const auto& [tensor_name, t] : store.tensors()) {
    checkpoint.tensors.push_back(
        {tensor_name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
  }
  return checkpoint;
}

std::string WriteCheckpoint(const Checkpoint& checkpoint, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << checkpoint.config.dump(2);
  WriteSafetensors(dir + "/model.safetensors", checkpoint.tensors);
  return dir;
}

std::vector<float> Download(const Backend& backend, const float* data, int64_t count) {
  std::vector<float> host(static_cast<size_t>(count));  // [count]
  backend.Download(data, count * 4, host.data());
  return host;
}

std::vector<std::vector<int>> ReferenceCommits(std::span<const int> windows, int nfe) {
  const size_t width = windows.size() / size_t(nfe);
  std::vector<std::vector<int>> commits(size_t(nfe - 1));
  for (size_t step = 0; step + 1 < size_t(nfe); ++step) {
    for (size_t i = 0; i < width; ++i) {
      if (windows[step * width + i] != windows[(step + 1) * width + i])
        commits[step].push_back(int(i));
    }
  }
  return commits;
}

std::vector<int> ToInts(const TensorRef& t) {
  std::vector<int> v(static_cast<size_t>(t.NumElements()));
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x;
    std::memcpy(&x, t.data + 8 * i, 8);
    v[i] = int(x);
  }
  return v;
}

std::vector<float> FullPassLogits(const Model& model, std::span<const int> ids,
                                  const Backend& backend) {
  KvCache cache = MakeCache(model, int64_t(ids.size()), false, backend);
  Forward forward(model, cache);
  StepPlan plan;
  plan.input_rows.resize(ids.size());
  std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
  plan.logit_rows = plan.input_rows;
  return forward.Run(ids, plan).logits;
}

std::string BackendUnavailable(const std::string& spec) {
  const std::string name = spec.substr(0, spec.find(':'));
  for (const BackendEntry& entry : RegisteredBackends()) {
    if (entry.name == name) return entry.unavailable();
  }
  return "no backend '" + name + "' in this build";
}

std::string BackendTestName(const std::string& spec) {
  std::string name = spec;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace polestar::testing
