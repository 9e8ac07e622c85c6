// Checkpoint readers on broken input: every case must end in a polestar::Error whose
// message names the file and the problem, never a crash or a foreign exception. Also a
// sharded checkpoint (model.safetensors.index.json) that must load exactly like one file.
// And the atomic writer: what it replaces, what it refuses, and what a signal leaves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "test_support.h"

namespace polestar {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A safetensors file from its parts: the u64 header length (as given, so it can lie), the
// header text and the data buffer.
std::string Safetensors(uint64_t header_length, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_length, 8);
  return bytes + header + std::string(data_bytes, '\x01');
}

std::string Safetensors(const std::string& header, size_t data_bytes) {
  return Safetensors(header.size(), header, data_bytes);
}

// Reads `bytes` written to a file in the test's folder; returns the file's path.
std::string WriteCase(const std::string& bytes) {
  const std::string path = testing::TempDir() + "/case.safetensors";
  WriteBytes(path, bytes);
  return path;
}

void Read(const std::string& path) {
  TensorStore store;
  ReadSafetensorsFile(path, store);
}

// ---------------------------------------------------------------------------------------
// One safetensors file

// The shared error matcher (test_support.h) holds only for a polestar::Error that names every
// part.
TEST(TestSupport, ThrowsErrorContainingNeedsAnErrorWithEveryPart) {
  const auto truncated = [] { Fail("file.bin: truncated at byte 4"); };
  EXPECT_THAT(truncated, testing::ThrowsErrorContaining({"file.bin", "truncated"}));
  EXPECT_THAT(truncated, ::testing::Not(testing::ThrowsErrorContaining({"file.bin", "overlap"})));
  EXPECT_THAT([] {}, ::testing::Not(testing::ThrowsErrorContaining({"file.bin"})));
  EXPECT_THAT([] { throw std::runtime_error("file.bin"); },
              ::testing::Not(testing::ThrowsErrorContaining({"file.bin"})));
}

TEST(SafetensorsRead, ValidFileRoundTrips) {
  const std::string path = testing::TempDir() + "/ok.safetensors";
  WriteSafetensors(path, {F32Tensor("b", {2, 2}, {1, 2, 3, 4}), I64Tensor("a", {3}, {7, -8, 9})},
                   {{"format", "pt"}});
  TensorStore store;
  ReadSafetensorsFile(path, store);
  ASSERT_EQ(store.tensors().size(), 2u);
  const TensorRef& b = store.Get("b");
  EXPECT_EQ(b.dtype, DType::kF32);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 2}));
  float values[4];
  std::memcpy(values, b.data, 16);
  EXPECT_EQ(values[3], 4.0f);
  int64_t a1;
  std::memcpy(&a1, store.Get("a").data + 8, 8);
  EXPECT_EQ(a1, -8);
}

TEST(SafetensorsRead, EmptyAndShortFilesAreTruncated) {
  const std::string path = WriteCase("");
  EXPECT_THAT([&] { Read(path); }, testing::ThrowsErrorContaining({path, "truncated", "0 bytes"}));
  const std::string short_path = WriteCase("12345");
  EXPECT_THAT([&] { Read(short_path); }, testing::ThrowsErrorContaining({short_path, "truncated"}));
}

TEST(SafetensorsRead, HeaderLengthOutOfRange) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  for (uint64_t length :
       {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40, uint64_t(header.size() + 5)}) {
    const std::string path = WriteCase(Safetensors(length, header, 4));
    EXPECT_THAT([&] { Read(path); },
                testing::ThrowsErrorContaining({path, "header length", "out of range"}));
  }
}

TEST(SafetensorsRead, MalformedJsonHeader) {
  const std::string path = WriteCase(Safetensors(R"({"a":{"dtype":"F32",)", 4));
  EXPECT_THAT([&] { Read(path); }, testing::ThrowsErrorContaining({path, "malformed JSON"}));
  const std::string array_path = WriteCase(Safetensors("[1, 2]", 0));
  EXPECT_THAT([&] { Read(array_path); },
              testing::ThrowsErrorContaining({array_path, "not a JSON object"}));
  const std::string entry_path = WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[1]}})", 4));
  EXPECT_THAT([&] { Read(entry_path); },
              testing::ThrowsErrorContaining({entry_path, "'a'", "data_offsets"}));
}

TEST(SafetensorsRead, OffsetsOutsideTheFile) {
  const std::string path =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  EXPECT_THAT([&] { Read(path); },
              testing::ThrowsErrorContaining({path, "'a'", "outside the data buffer of 8 bytes"}));
  const std::string reversed =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8));
  EXPECT_THAT([&] { Read(reversed); }, testing::ThrowsErrorContaining({reversed, "'a'", "[8, 4)"}));
  const std::string negative =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8));
  EXPECT_THAT([&] { Read(negative); },
              testing::ThrowsErrorContaining({negative, "'a'", "data_offsets"}));
}

TEST(SafetensorsRead, TruncatedRealCheckpoint) {
  std::ifstream in(testing::FixtureDir("llada-tiny") + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  const std::string path = WriteCase(bytes.substr(0, bytes.size() / 2));
  EXPECT_THAT([&] { Read(path); },
              testing::ThrowsErrorContaining({path, "outside the data buffer", "truncated"}));
}

TEST(SafetensorsRead, OverlappingTensorsNameBoth) {
  const std::string path =
      WriteCase(Safetensors(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            12));
  EXPECT_THAT([&] { Read(path); },
              testing::ThrowsErrorContaining({path, "overlap", "'first'", "'second'"}));
}

TEST(SafetensorsRead, DtypeShapeAndByteCountMismatch) {
  const std::string path =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_THAT([&] { Read(path); },
              testing::ThrowsErrorContaining(
                  {path, "'a'", "8 bytes do not match dtype F32", "12 bytes expected"}));
  const std::string bf16 =
      WriteCase(Safetensors(R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8));
  EXPECT_THAT([&] { Read(bf16); },
              testing::ThrowsErrorContaining({bf16, "BF16", "12 bytes expected"}));
  const std::string bad_dim =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4));
  EXPECT_THAT([&] { Read(bad_dim); }, testing::ThrowsErrorContaining({bad_dim, "'a'", "shape"}));
  const std::string huge =
      WriteCase(Safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                            R"("data_offsets":[0,4]}})",
                            4));
  EXPECT_THAT([&] { Read(huge); }, testing::ThrowsErrorContaining({huge, "'a'", "too large"}));
}

TEST(SafetensorsRead, UnsupportedDtype) {
  const std::string path =
      WriteCase(Safetensors(R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4));
  EXPECT_THAT([&] { Read(path); },
              testing::ThrowsErrorContaining({path, "'a'", "unsupported dtype F8_E4M3"}));
}

// ---------------------------------------------------------------------------------------
// Model folders built from llada-tiny with one thing broken

using testing::Checkpoint;

Checkpoint LoadFixture(const std::string& name) { return testing::LoadCheckpoint(name); }

void WriteConfig(const std::string& dir, const nlohmann::json& config) {
  WriteBytes(dir + "/config.json", config.dump(2));
}

// Writes `checkpoint` as a single-file model folder under the test's folder.
std::string WriteModel(const Checkpoint& checkpoint, const std::string& name = "model") {
  return testing::WriteCheckpoint(checkpoint, testing::TempDir() + "/" + name);
}

TensorToWrite& Find(Checkpoint& checkpoint, const std::string& name) {
  return checkpoint.Tensor(name);
}

TEST(AtomicFile, TheDestinationIsTheOldFileOrTheWholeNewOne) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/out.bin";
  WriteBytes(path, "old contents");
  {
    AtomicFile file(path);
    file.Write("new, but never committed");
    // An exception here (disk full, a bad tensor) unwinds without Commit.
  }
  EXPECT_EQ(ReadBytes(path), "old contents");
  {
    AtomicFile file(path);
    file.Write("new ");
    file.Write("contents");
    EXPECT_EQ(ReadBytes(path), "old contents");  // nothing shows until the file is whole
    file.Commit();
  }
  EXPECT_EQ(ReadBytes(path), "new contents");
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir)) entries += entry.is_regular_file();
  EXPECT_EQ(entries, 1u);  // no temporary file left behind
  EXPECT_THAT([&] { AtomicFile(dir + "/missing/out.bin"); },
              testing::ThrowsErrorContaining({dir + "/missing/out.bin", "cannot create"}));
}

// The names in `dir` (hidden ones too), sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AtomicFile, WritesThroughALinkAndKeepsIt) {
  const std::string dir = testing::TempDir();
  fs::create_directories(dir + "/a");
  fs::create_directories(dir + "/b");
  WriteBytes(dir + "/b/real.bin", "old");
  // A chain of two relative links, across folders: each resolves against its own folder.
  fs::create_symlink("../b/real.bin", dir + "/a/hop.bin");
  fs::create_symlink("a/hop.bin", dir + "/link.bin");
  WriteFileAtomically(dir + "/link.bin", "new");
  EXPECT_EQ(ReadBytes(dir + "/b/real.bin"), "new");
  EXPECT_TRUE(fs::is_symlink(dir + "/link.bin"));
  EXPECT_EQ(fs::read_symlink(dir + "/link.bin"), "a/hop.bin");
  EXPECT_TRUE(fs::is_symlink(dir + "/a/hop.bin"));
  EXPECT_EQ(Names(dir + "/b"), std::vector<std::string>{"real.bin"});  // no temporary left
  // A dangling link's target is created, as a shell's `>` would.
  fs::create_symlink("b/new.bin", dir + "/dangling.bin");
  WriteFileAtomically(dir + "/dangling.bin", "created");
  EXPECT_EQ(ReadBytes(dir + "/b/new.bin"), "created");
  EXPECT_TRUE(fs::is_symlink(dir + "/dangling.bin"));
  fs::create_symlink("loop.bin", dir + "/loop.bin");
  EXPECT_THAT([&] { AtomicFile(dir + "/loop.bin"); },
              testing::ThrowsErrorContaining({dir + "/loop.bin", "too many levels"}));
}

// A directory, a FIFO and a device are refused up front: never opened (a FIFO would block),
// never renamed over or removed.
TEST(AtomicFile, RefusesWhatIsNotARegularFile) {
  const std::string dir = testing::TempDir();
  fs::create_directory(dir + "/folder");
  EXPECT_THAT([&] { WriteFileAtomically(dir + "/folder", "x"); },
              testing::ThrowsErrorContaining({dir + "/folder", "is a directory"}));
  EXPECT_TRUE(fs::is_directory(dir + "/folder"));

  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_THAT([&] { WriteFileAtomically(dir + "/fifo", "x"); },
              testing::ThrowsErrorContaining({dir + "/fifo", "is a FIFO"}));
  EXPECT_TRUE(fs::is_fifo(dir + "/fifo"));
  fs::create_symlink("fifo", dir + "/to-fifo");
  EXPECT_THAT([&] { WriteFileAtomically(dir + "/to-fifo", "x"); },
              testing::ThrowsErrorContaining({dir + "/to-fifo", "through links", "is a FIFO"}));
  EXPECT_TRUE(fs::is_fifo(dir + "/fifo"));
  EXPECT_TRUE(fs::is_symlink(dir + "/to-fifo"));

  // A character device: /dev/null's twin where we may make one, so that a broken writer
  // could only harm the test's own node; else /dev/null itself, unless we are root (who could
  // replace it).
  std::string device = dir + "/null";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    device = geteuid() == 0 ? "" : "/dev/null";
  if (!device.empty()) {
    EXPECT_THAT([&] { WriteFileAtomically(device, "x"); },
                testing::ThrowsErrorContaining({device, "is a character device"}));
    EXPECT_TRUE(fs::is_character_file(device));
  }
  for (const std::string& name : Names(dir)) EXPECT_EQ(name.find("polestar-tmp"), name.npos);
}

TEST(AtomicFile, RemovesTheStaleTemporariesOfItsDestination) {
  const std::string dir = testing::TempDir();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its PID names no process now
  const std::string dead = Cat(".out.bin.polestar-tmp.", child, ".AbC123");
  const std::string running = Cat(".out.bin.polestar-tmp.", getpid(), ".AbC123");
  const std::string other = Cat(".other.bin.polestar-tmp.", child, ".AbC123");
  for (const std::string& name : {dead, running, other}) WriteBytes(dir + "/" + name, "partial");
  WriteFileAtomically(dir + "/out.bin", "whole");
  EXPECT_EQ(ReadBytes(dir + "/out.bin"), "whole");
  std::vector<std::string> expected = {running, other, "out.bin"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(Names(dir), expected);
}

// A process killed by SIGINT or SIGTERM in the middle of a write dies of that signal and
// leaves the destination as it was, without its temporary file.
TEST(AtomicFile, ASignalMidWriteRemovesTheTemporary) {
  for (const int signal : {SIGTERM, SIGINT}) {
    const std::string dir = testing::TempDir();
    WriteBytes(dir + "/out.bin", "old");
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // As a command starts: the test runner may have left SIGINT ignored.
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      try {
        AtomicFile file(dir + "/out.bin");
        file.Write("the first half of a slow write");
        const char byte = 1;
        if (write(ready[1], &byte, 1) != 1) _exit(2);
        pause();  // the rest of the write never comes
      } catch (...) {
      }
      _exit(1);
    }
    close(ready[1]);
    pollfd wait_ready{ready[0], POLLIN, 0};
    ASSERT_EQ(poll(&wait_ready, 1, 10000), 1) << "the writer did not start";
    char byte = 0;
    ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the writer failed";
    close(ready[0]);
    // Mid-write: the temporary is there, named after the destination and the writer.
    const std::vector<std::string> during = Names(dir);
    ASSERT_EQ(during.size(), 2u);
    EXPECT_TRUE(during[0].starts_with(Cat(".out.bin.polestar-tmp.", child, "."))) << during[0];
    ASSERT_EQ(kill(child, signal), 0);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (waitpid(child, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        FAIL() << "the writer outlived signal " << signal;
      }
      usleep(1000);
    }
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal) << status;
    EXPECT_EQ(Names(dir), std::vector<std::string>{"out.bin"}) << "signal " << signal;
    EXPECT_EQ(ReadBytes(dir + "/out.bin"), "old");
  }
}

TEST(AtomicFile, AFailedGgufConversionLeavesNoFile) {
  const std::string out = testing::TempDir() + "/model.gguf";
  {
    GgufWriter writer;
    writer.AddTensor("a", DType::kF32, {4});
    writer.AddTensor("b", DType::kF32, {4});
    writer.Open(out);
    const float values[4] = {1, 2, 3, 4};
    writer.WriteTensorData(reinterpret_cast<const uint8_t*>(values), sizeof(values));
    // The second tensor never comes: the conversion failed.
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(testing::TempDir()));
}

TEST(ModelLoad, FixtureCopyLoads) {  // the control for the broken cases below
  auto model = Model::Load(WriteModel(LoadFixture("llada-tiny")));
  EXPECT_EQ(model->config().layers, 2);
  EXPECT_EQ(model->config().vocab, 160);
}

TEST(ModelLoad, PathsThatAreNotModels) {
  const std::string missing = testing::TempDir() + "/nowhere";
  EXPECT_THAT([&] { Model::Load(missing); },
              testing::ThrowsErrorContaining({missing, "no such file"}));
  const std::string empty = testing::TempDir();
  EXPECT_THAT([&] { Model::Load(empty); },
              testing::ThrowsErrorContaining({empty, "no config.json"}));
  WriteConfig(empty, LoadFixture("llada-tiny").config);
  EXPECT_THAT([&] { Model::Load(empty); },
              testing::ThrowsErrorContaining({empty, "no model.safetensors"}));
}

TEST(ModelLoad, MissingTensor) {
  Checkpoint checkpoint = LoadFixture("llada-tiny");
  const std::string gone = "model.transformer.blocks.1.ff_out.weight";
  std::erase_if(checkpoint.tensors, [&](const TensorToWrite& t) { return t.name == gone; });
  const std::string dir = WriteModel(checkpoint);
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir, "missing tensor", gone}));
}

TEST(ModelLoad, TensorsTheConfigDoesNotAccountFor) {
  Checkpoint checkpoint = LoadFixture("llada-tiny");
  checkpoint.config["n_layers"] = 1;  // the checkpoint has 2
  std::string dir = WriteModel(checkpoint, "fewer-layers");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining(
                  {dir, "9 tensor(s) are not part of the model", "model.transformer.blocks.1."}));
  checkpoint = LoadFixture("llada-tiny");
  checkpoint.tensors.push_back(F32Tensor("model.transformer.extra.weight", {2}, {1, 2}));
  dir = WriteModel(checkpoint, "extra");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir, "'model.transformer.extra.weight'"}));
  // An LM head beside tied embeddings is ignored, as Hugging Face ignores it.
  checkpoint = LoadFixture("llada-tiny");
  checkpoint.config["weight_tying"] = true;
  EXPECT_NO_THROW(Model::Load(WriteModel(checkpoint, "tied")));
}

TEST(ModelLoad, MisshapenTensor) {
  Checkpoint checkpoint = LoadFixture("llada-tiny");
  TensorToWrite& q = Find(checkpoint, "model.transformer.blocks.0.q_proj.weight");
  q.shape = {32, 128};  // same bytes, wrong shape
  const std::string dir = WriteModel(checkpoint);
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir, "model.transformer.blocks.0.q_proj.weight",
                                              "[32, 128]", "expected [64, 64]"}));
}

TEST(ModelLoad, IntegerTensorWhereWeightsBelong) {
  Checkpoint checkpoint = LoadFixture("llada-tiny");
  TensorToWrite& norm = Find(checkpoint, "model.transformer.ln_f.weight");
  norm = I64Tensor(norm.name, {64}, std::vector<int64_t>(64, 1));
  const std::string dir = WriteModel(checkpoint);
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir, "model.transformer.ln_f.weight", "I64"}));
}

TEST(ModelLoad, UnknownOrMissingModelType) {
  Checkpoint checkpoint = LoadFixture("llada-tiny");
  checkpoint.config["model_type"] = "gpt2";
  std::string dir = WriteModel(checkpoint, "gpt2");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", "unknown model_type 'gpt2'"}));
  checkpoint.config["model_type"] = 5;
  dir = WriteModel(checkpoint, "number");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", "model_type"}));
  checkpoint.config.erase("model_type");
  dir = WriteModel(checkpoint, "none");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", "model_type"}));
}

TEST(ModelLoad, ConfigThatIsNotAnObject) {
  const std::string dir = testing::TempDir();
  WriteBytes(dir + "/config.json", "[1, 2, 3]");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", "not a JSON object"}));
  WriteBytes(dir + "/config.json", "{\"model_type\": \"llada\",");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", "malformed JSON"}));
}

struct BadConfig {
  const char* label;
  const char* arch;  // fixture
  nlohmann::json changes;
  const char* message;
};

class ModelConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ModelConfigTest, NamesFileAndProblem) {
  const BadConfig& bad = GetParam();
  Checkpoint checkpoint = LoadFixture(bad.arch);
  checkpoint.config.merge_patch(bad.changes);
  const std::string dir = WriteModel(checkpoint);
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({dir + "/config.json", bad.message}));
}

INSTANTIATE_TEST_SUITE_P(
    Nonsense, ModelConfigTest,
    ::testing::Values(
        BadConfig{"zero_heads",
                  "llada-tiny",
                  {{"n_heads", 0}, {"n_kv_heads", 0}},
                  "head count (0) must be positive"},
        BadConfig{"heads_not_dividing_width",
                  "llada-tiny",
                  {{"n_heads", 5}, {"n_kv_heads", 5}},
                  "head count (5) must divide the hidden width (64)"},
        BadConfig{"kv_heads_not_dividing_heads",
                  "llada-tiny",
                  {{"n_kv_heads", 3}},
                  "key/value head count (3) must divide the head count (4)"},
        BadConfig{"mask_outside_vocab",
                  "llada-tiny",
                  {{"mask_token_id", 160}},
                  "mask token id (160) must lie inside the vocabulary (160)"},
        BadConfig{"negative_mask", "llada-tiny", {{"mask_token_id", -2}}, "mask token id (-2)"},
        BadConfig{"eos_outside_vocab", "llada-tiny", {{"eos_token_id", 1000}}, "eos 1000"},
        BadConfig{
            "zero_layers", "llada-tiny", {{"n_layers", 0}}, "layer count (0) must be positive"},
        BadConfig{
            "string_layers", "llada-tiny", {{"n_layers", "2"}}, "n_layers must be an integer"},
        BadConfig{"huge_layers", "llada-tiny", {{"n_layers", 1000000000000}}, "n_layers"},
        BadConfig{"string_bias_flag",
                  "llada-tiny",
                  {{"include_qkv_bias", "yes"}},
                  "include_qkv_bias must be true or false"},
        BadConfig{"huge_context",
                  "llada-tiny",
                  {{"max_sequence_length", 2000000000}},
                  "maximum sequence length (2000000000)"},
        BadConfig{"negative_eps", "llada-tiny", {{"rms_norm_eps", -1.0}}, "rms_norm_eps"},
        BadConfig{"dream_kv_heads",
                  "dream-tiny",
                  {{"num_key_value_heads", 3}},
                  "key/value head count (3) must divide the head count (4)"},
        BadConfig{"dream_zero_width", "dream-tiny", {{"hidden_size", 0}}, "hidden width (0)"},
        BadConfig{"dream_string_sliding",
                  "dream-tiny",
                  {{"use_sliding_window", "no"}},
                  "use_sliding_window must be true or false"},
        BadConfig{"moe_top_k_above_experts",
                  "lladamoe-a",
                  {{"num_experts_per_tok", 9}},
                  "experts per token (9) must lie in [1, 8]"},
        BadConfig{"moe_layer_list_short",
                  "lladamoe-a",
                  {{"moe_layer_freq", nlohmann::json::array({1})}},
                  "the MoE layer list has 1 entries for 2 layers"},
        BadConfig{"moe_layer_flag_2",
                  "lladamoe-a",
                  {{"moe_layer_freq", nlohmann::json::array({1, 2})}},
                  "0 or 1"},
        BadConfig{"moe_no_rotary_dims",
                  "lladamoe-a",
                  {{"partial_rotary_factor", 0.01}},
                  "partial_rotary_factor 0.01 leaves no rotary dimension of the 16-dim heads"},
        BadConfig{"llada2_groups_not_dividing",
                  "llada2-a",
                  {{"n_group", 3}, {"topk_group", 1}},
                  "expert groups (3) must divide the 8 experts"},
        BadConfig{"llada2_kept_groups",
                  "llada2-b",
                  {{"topk_group", 5}},
                  "kept expert groups (5) must lie in [1, 4]"},
        BadConfig{"llada2_no_kv_heads",
                  "llada2-a",
                  {{"num_key_value_heads", 0}},
                  "key/value head count (0) must be positive"}),
    [](const auto& info) { return std::string(info.param.label); });

// ---------------------------------------------------------------------------------------
// Sharded checkpoints

// Splits the checkpoint's tensors alternately across two shards with an index.
std::string WriteSharded(const Checkpoint& checkpoint, const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  fs::create_directories(dir);
  WriteConfig(dir, checkpoint.config);
  const std::string shard_names[2] = {"model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors"};
  std::vector<TensorToWrite> shards[2];
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < checkpoint.tensors.size(); ++i) {
    shards[i % 2].push_back(checkpoint.tensors[i]);
    weight_map[checkpoint.tensors[i].name] = shard_names[i % 2];
  }
  for (int s = 0; s < 2; ++s) WriteSafetensors(dir + "/" + shard_names[s], shards[s]);
  WriteBytes(dir + "/model.safetensors.index.json",
             nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2));
  return dir;
}

std::vector<int> FixtureInputIds() {
  TensorStore expected;
  ReadSafetensorsFile(testing::FixtureDir("llada-tiny") + "/expected.safetensors", expected);
  return testing::ToInts(expected.Get("forward.input_ids"));
}

TEST(ShardedCheckpoint, LoadsLikeTheSingleFile) {
  const Checkpoint checkpoint = LoadFixture("llada-tiny");
  const std::string dir = WriteSharded(checkpoint, "sharded");
  auto sharded = Model::Load(dir);
  auto single = Model::Load(testing::FixtureDir("llada-tiny"));
  EXPECT_THAT(sharded->tensors().origin(), HasSubstr("2 safetensors shards"));
  EXPECT_EQ(sharded->ParameterCount(), single->ParameterCount());
  const std::vector<int> ids = FixtureInputIds();
  const std::vector<float> want = testing::FullPassLogits(*single, ids, single->backend());
  const std::vector<float> got = testing::FullPassLogits(*sharded, ids, sharded->backend());
  ASSERT_EQ(got.size(), ids.size() * 160);
  EXPECT_EQ(got, want);  // same weights, same kernels: bit for bit
}

TEST(ShardedCheckpoint, IndexNamingAMissingShard) {
  const std::string dir = WriteSharded(LoadFixture("llada-tiny"), "sharded");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining(
                  {dir + "/model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
}

TEST(ShardedCheckpoint, IndexNamingATensorTheShardLacks) {
  const std::string dir = WriteSharded(LoadFixture("llada-tiny"), "sharded");
  const std::string index_path = dir + "/model.safetensors.index.json";
  nlohmann::json index = ReadJsonFile(index_path);
  index["weight_map"]["model.transformer.blocks.9.q_proj.weight"] =
      "model-00001-of-00002.safetensors";
  WriteBytes(index_path, index.dump());
  EXPECT_THAT(
      [&] { Model::Load(dir); },
      testing::ThrowsErrorContaining({index_path, "model.transformer.blocks.9.q_proj.weight",
                                      "model-00001-of-00002.safetensors"}));
}

TEST(ShardedCheckpoint, MalformedIndex) {
  const std::string dir = WriteSharded(LoadFixture("llada-tiny"), "sharded");
  const std::string index_path = dir + "/model.safetensors.index.json";
  WriteBytes(index_path, R"({"weight_map": ["model-00001-of-00002.safetensors"]})");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({index_path, "weight_map"}));
  WriteBytes(index_path, R"({"weight_map": {"a": "../model.safetensors"}})");
  EXPECT_THAT([&] { Model::Load(dir); },
              testing::ThrowsErrorContaining({index_path, "../model.safetensors"}));
  WriteBytes(index_path, R"({"weight_map": {"a": 3}})");
  EXPECT_THAT([&] { Model::Load(dir); }, testing::ThrowsErrorContaining({index_path, "'a'"}));
}

}  // namespace
}  // namespace polestar
