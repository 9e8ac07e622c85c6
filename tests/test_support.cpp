#include "test_support.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/json_file.h"

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
  std::string command = std::string(POLESTAR_BINARY) + " " + args + (merge_stderr ? " 2>&1" : "");
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

}  // namespace polestar::testing
