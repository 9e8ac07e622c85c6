#include "test_support.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/json_file.h"
#include "io/safetensors.h"

namespace polestar::testing {

std::string SharedDir() {
  const char* env = std::getenv("POLESTAR_SHARED");
  return env != nullptr && *env != 0 ? env : POLESTAR_SHARED_DEFAULT;
}

std::string FixtureDir(const std::string& name) { return SharedDir() + "/fixtures/" + name; }

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

std::string WriteEditedFixture(const std::string& fixture, const std::string& dir,
                               const std::function<void(nlohmann::json& config,
                                                        EditableCheckpoint& tensors)>& edit) {
  const std::string source = FixtureDir(fixture);
  nlohmann::json config = ReadJsonFile(source + "/config.json");
  EditableCheckpoint tensors;
  const TensorStore store = ReadSafetensorsDir(source);
  for (const auto& [name, t] : store.tensors()) {
    EXPECT_EQ(t.dtype, DType::kF32) << name;
    EditableTensor& e = tensors[name];
    e.shape = t.shape;
    e.values.resize(size_t(t.NumElements()));
    std::memcpy(e.values.data(), t.data, e.values.size() * sizeof(float));
  }
  edit(config, tensors);
  std::vector<TensorToWrite> out;
  for (const auto& [name, e] : tensors) out.push_back(F32Tensor(name, e.shape, e.values));
  std::filesystem::create_directories(dir);
  WriteSafetensors(dir + "/model.safetensors", out);
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

}  // namespace polestar::testing
