// GGUF: reading llama.cpp's files (fixtures written by ggml), rejecting damaged ones,
// writing, running the fixtures' models against the PyTorch reference logits, and
// converting Hugging Face checkpoints bit for bit as llama.cpp does.
#include "io/gguf.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "bench/random_model.h"
#include "decode/generate.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "model/gguf_convert.h"
#include "ops/quant.h"
#include "test_support.h"
#include "tokenizer/model_tokenizer.h"

namespace polestar {
namespace {

namespace fs = std::filesystem;

std::string FixtureGguf(const std::string& name) {
  return testing::FixtureDir(name) + "/model.gguf";
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// --- reading ---

TEST(GgufRead, FixtureHeaderMetadataAndTensors) {
  TensorStore store;
  const GgufFile file = ReadGgufFile(FixtureGguf("gguf-llada-q8_0"), store);
  EXPECT_EQ(file.version, 3u);
  EXPECT_EQ(file.alignment, 32u);
  EXPECT_EQ(file.data_offset % 32, 0u);
  const GgufMetadata& m = file.metadata;
  EXPECT_EQ(m.GetString("general.architecture"), "llada");
  EXPECT_EQ(m.GetUint("llada.block_count"), 2u);
  EXPECT_EQ(m.GetUint("llada.embedding_length"), 64u);
  EXPECT_EQ(m.GetUint("llada.attention.head_count_kv"), 4u);
  EXPECT_FLOAT_EQ(float(m.GetFloat("llada.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(m.GetFloat("llada.rope.freq_base"), 10000.0);
  EXPECT_FALSE(m.GetBool("diffusion.shift_logits"));
  ASSERT_EQ(file.tensors.size(), 21u);
  EXPECT_EQ(file.tensors[0].name, "token_embd.weight");
  EXPECT_EQ(file.tensors[0].ne, (std::vector<int64_t>{64, 160}));
  const TensorRef& embedding = store.Get("token_embd.weight");
  EXPECT_EQ(embedding.dtype, DType::kQ8_0);
  EXPECT_EQ(embedding.shape, (std::vector<int64_t>{160, 64}));  // outermost first
  EXPECT_EQ(embedding.bytes, 160u * 2 * 34);
  const TensorRef& norm = store.Get("blk.1.ffn_norm.weight");
  EXPECT_EQ(norm.dtype, DType::kF32);
  EXPECT_EQ(norm.shape, (std::vector<int64_t>{64}));
  EXPECT_EQ((norm.data - embedding.data) % 32, 0);
  EXPECT_THAT([&] { m.GetString("llada.block_count"); },
              testing::ThrowsErrorContaining({"llada.block_count", "u32"}));
  EXPECT_THAT([&] { m.GetUint("no.such.key"); },
              testing::ThrowsErrorContaining({"missing metadata key 'no.such.key'"}));
}

TEST(GgufRead, VocabularyMetadata) {
  TensorStore store;
  const GgufFile file = ReadGgufFile(FixtureGguf("gguf-dream-q8_0"), store);
  const GgufVocab vocab = ReadGgufVocab(file.metadata);
  EXPECT_EQ(vocab.model, "gpt2");
  EXPECT_EQ(vocab.pre, "default");
  ASSERT_EQ(vocab.tokens.size(), 160u);
  EXPECT_EQ(vocab.tokens[42], "<t42>");
  EXPECT_EQ(vocab.token_types[42], 1);
  EXPECT_EQ(vocab.token_types[156], 3);
  EXPECT_EQ(vocab.mask_id, 156);
  EXPECT_EQ(vocab.eos_id, 157);
  EXPECT_EQ(vocab.pad_id, 157);
  EXPECT_EQ(vocab.bos_id, -1);
  EXPECT_TRUE(vocab.merges.empty());
  EXPECT_TRUE(vocab.chat_template.empty());
}

// --- writing ---

TEST(GgufWrite, RoundTripsEveryValueTypeAndTensorData) {
  const std::string path = testing::TempDir() + "/all.gguf";
  GgufWriter writer;
  GgufMetadata& m = writer.metadata();
  m.Add("u8", {GgufType::kU8, uint64_t{200}});
  m.Add("i8", {GgufType::kI8, int64_t{-100}});
  m.Add("u16", {GgufType::kU16, uint64_t{60000}});
  m.Add("i16", {GgufType::kI16, int64_t{-30000}});
  m.Add("u32", GgufValue::U32(4000000000u));
  m.Add("i32", GgufValue::I32(-2000000000));
  m.Add("f32", GgufValue::F32(0.1f));
  m.Add("bool", GgufValue::Bool(true));
  m.Add("string", GgufValue::String("h\xC3\xA9llo"));
  m.Add("u64", GgufValue::U64(uint64_t{1} << 60));
  m.Add("i64", {GgufType::kI64, int64_t{-(int64_t{1} << 60)}});
  m.Add("f64", {GgufType::kF64, 1.0 / 3});
  m.Add("strings", GgufValue::Strings({"a b", "", "c"}));
  m.Add("ints", GgufValue::I32s({1, -2, 3}));
  m.Add("floats", GgufValue::F32s({0.5f, -1.5f}));
  m.Add("nested", GgufValue::Arrays({GgufValue::I32s({7}), GgufValue::I32s({8, 9})}));
  std::vector<float> values(2 * 64);
  std::iota(values.begin(), values.end(), -10.0f);
  std::vector<uint8_t> q8(static_cast<size_t>(RowBytes(DType::kQ8_0, 64) * 2));
  QuantizeValues(DType::kQ8_0, values.data(), 128, q8.data());
  writer.AddTensor("vector", DType::kF32, {3});
  writer.AddTensor("matrix", DType::kQ8_0, {2, 64});
  writer.Open(path);
  writer.WriteTensorData(reinterpret_cast<const uint8_t*>(values.data()), 12);
  writer.WriteTensorData(q8.data(), q8.size());
  writer.Close();

  TensorStore store;
  const GgufFile file = ReadGgufFile(path, store);
  ASSERT_EQ(file.metadata.entries().size(), m.entries().size());
  for (size_t i = 0; i < m.entries().size(); ++i) {
    EXPECT_EQ(file.metadata.entries()[i].first, m.entries()[i].first);
    EXPECT_TRUE(file.metadata.entries()[i].second == m.entries()[i].second) << m.entries()[i].first;
  }
  EXPECT_EQ(file.metadata.GetInts("ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(file.metadata.GetFloats("floats"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(file.metadata.GetStrings("strings"), (std::vector<std::string>{"a b", "", "c"}));
  EXPECT_EQ(file.metadata.GetInt("i64"), -(int64_t{1} << 60));
  EXPECT_EQ(file.metadata.GetFloat("u16"), 60000.0);
  const TensorRef& vector = store.Get("vector");
  EXPECT_EQ(std::memcmp(vector.data, values.data(), 12), 0);
  const TensorRef& matrix = store.Get("matrix");
  EXPECT_EQ(matrix.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(file.tensors[1].offset, 32u);  // 12 bytes padded to the 32-byte alignment
  EXPECT_EQ(std::memcmp(matrix.data, q8.data(), q8.size()), 0);
  EXPECT_EQ(fs::file_size(path) % 32, 0u);
}

TEST(GgufRead, VocabularyWithMergesAndErrors) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, auto&& add) {
    GgufWriter writer;
    GgufMetadata& m = writer.metadata();
    m.Add("tokenizer.ggml.model", GgufValue::String("gpt2"));
    m.Add("tokenizer.ggml.tokens", GgufValue::Strings({"a", "b", "ab", "<eos>"}));
    add(m);
    writer.Open(dir + "/" + name);
    writer.Close();
    TensorStore store;
    return ReadGgufFile(dir + "/" + name, store).metadata;
  };
  const GgufMetadata good = write("good.gguf", [](GgufMetadata& m) {
    m.Add("tokenizer.ggml.token_type", GgufValue::I32s({1, 1, 1, 3}));
    m.Add("tokenizer.ggml.merges", GgufValue::Strings({"a b"}));
    m.Add("tokenizer.ggml.eos_token_id", GgufValue::U32(3));
    m.Add("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
    m.Add("tokenizer.chat_template", GgufValue::String("{{ messages }}"));
  });
  const GgufVocab vocab = ReadGgufVocab(good);
  EXPECT_EQ(vocab.merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(vocab.token_types, (std::vector<int32_t>{1, 1, 1, 3}));
  EXPECT_EQ(vocab.eos_id, 3);
  EXPECT_TRUE(vocab.add_bos);
  EXPECT_EQ(vocab.chat_template, "{{ messages }}");

  const GgufMetadata short_types = write("types.gguf", [](GgufMetadata& m) {
    m.Add("tokenizer.ggml.token_type", GgufValue::I32s({1, 1}));
  });
  EXPECT_THAT([&] { ReadGgufVocab(short_types); },
              testing::ThrowsErrorContaining({"types.gguf", "token_type has 2 entries"}));
  const GgufMetadata bad_id = write(
      "id.gguf", [](GgufMetadata& m) { m.Add("tokenizer.ggml.eos_token_id", GgufValue::U32(4)); });
  EXPECT_THAT([&] { ReadGgufVocab(bad_id); },
              testing::ThrowsErrorContaining({"id.gguf", "eos_token_id = 4"}));
  const GgufMetadata bad_merge = write("merge.gguf", [](GgufMetadata& m) {
    m.Add("tokenizer.ggml.merges", GgufValue::Strings({"ab"}));
  });
  EXPECT_THAT([&] { ReadGgufVocab(bad_merge); },
              testing::ThrowsErrorContaining({"merge.gguf", "'ab'"}));
}

// --- damaged files ---

// A small valid file: four metadata keys, a Q8_0 matrix and an F32 vector that ends the
// file exactly (so every shorter prefix is a truncated file).
std::vector<uint8_t> SmallGguf() {
  const std::string path = testing::TempDir() + "/small.gguf";
  GgufWriter writer;
  writer.metadata().Add("general.architecture", GgufValue::String("llada"));
  writer.metadata().Add("general.alignment", GgufValue::U32(32));
  writer.metadata().Add("test.aaaa", GgufValue::U32(1));
  writer.metadata().Add("test.bbbb", GgufValue::U32(2));
  writer.metadata().Add("test.array", GgufValue::I32s({1, 2, 3}));
  writer.AddTensor("tensor_a", DType::kQ8_0, {2, 32});
  writer.AddTensor("tensor_b", DType::kF32, {8});
  writer.Open(path);
  const std::vector<uint8_t> a(68, 0x11), b(32, 0);
  writer.WriteTensorData(a.data(), a.size());
  writer.WriteTensorData(b.data(), b.size());
  writer.Close();
  return ReadBytes(path);
}

size_t Find(const std::vector<uint8_t>& bytes, const std::string& text) {
  const auto it = std::search(bytes.begin(), bytes.end(), text.begin(), text.end());
  PS_CHECK(it != bytes.end());
  return size_t(it - bytes.begin());
}

template <typename T>
std::vector<uint8_t> Patched(std::vector<uint8_t> bytes, size_t position, T value) {
  std::memcpy(bytes.data() + position, &value, sizeof(T));
  return bytes;
}

void ExpectParseError(const std::vector<uint8_t>& bytes, const std::string& part) {
  EXPECT_THAT([&] { ParseGguf(bytes.data(), bytes.size(), "bad.gguf"); },
              testing::ThrowsErrorContaining({"bad.gguf", part}));
}

TEST(GgufBadFiles, HeaderProblems) {
  const std::vector<uint8_t> good = SmallGguf();
  ASSERT_NO_THROW(ParseGguf(good.data(), good.size(), "good.gguf"));
  ExpectParseError(Patched(good, 0, uint8_t{'X'}), "not a GGUF file");
  ExpectParseError(Patched(good, 4, uint32_t{1}), "version 1");
  ExpectParseError(Patched(good, 4, uint32_t{4}), "version 4");
  ExpectParseError(Patched(good, 8, uint64_t{1} << 60), "tensor count");
  ExpectParseError(Patched(good, 16, uint64_t{1} << 60), "metadata count");
  ExpectParseError(Patched(good, 24, uint64_t{1} << 62), "claims");
}

TEST(GgufBadFiles, MetadataProblems) {
  const std::vector<uint8_t> good = SmallGguf();
  const size_t aaaa = Find(good, "test.aaaa");
  ExpectParseError(Patched(good, aaaa + 9, uint32_t{99}), "unknown value type 99");
  const size_t array = Find(good, "test.array");
  ExpectParseError(Patched(good, array + 14, uint32_t{99}), "unknown array element type 99");
  ExpectParseError(Patched(good, array + 18, uint64_t{1} << 40), "does not fit");
  const size_t alignment = Find(good, "general.alignment");
  ExpectParseError(Patched(good, alignment + 21, uint32_t{48}), "power of two");
  ExpectParseError(Patched(good, alignment + 21, uint32_t{0}), "power of two");
  std::vector<uint8_t> duplicate = good;
  std::memcpy(duplicate.data() + Find(good, "test.bbbb"), "test.aaaa", 9);
  ExpectParseError(duplicate, "'test.aaaa' appears twice");
}

TEST(GgufBadFiles, TensorInfoProblems) {
  const std::vector<uint8_t> good = SmallGguf();
  const size_t a = Find(good, "tensor_a"), b = Find(good, "tensor_b");
  ExpectParseError(Patched(good, b + 8, uint32_t{0}), "0 dimensions");
  ExpectParseError(Patched(good, b + 8, uint32_t{5}), "5 dimensions");
  ExpectParseError(Patched(Patched(good, a + 12, uint64_t{1} << 40), a + 20, uint64_t{1} << 40),
                   "too large");
  ExpectParseError(Patched(good, b + 20, uint32_t{77}), "unknown ggml tensor type 77");
  ExpectParseError(Patched(good, b + 20, uint32_t{3}), "Q4_1");
  ExpectParseError(Patched(good, a + 12, uint64_t{33}), "block size");
  ExpectParseError(Patched(good, b + 24, uint64_t{100}), "alignment");
  ExpectParseError(Patched(good, b + 24, uint64_t{1} << 20), "past the end");
  ExpectParseError(Patched(good, b + 24, uint64_t{1} << 63), "past the end");
  ExpectParseError(Patched(good, b + 24, uint64_t{64}), "overlap");
  std::vector<uint8_t> duplicate = good;
  std::memcpy(duplicate.data() + b, "tensor_a", 8);
  ExpectParseError(duplicate, "'tensor_a' appears twice");
}

TEST(GgufBadFiles, EveryTruncationIsAnError) {
  const std::vector<uint8_t> good = SmallGguf();
  for (size_t length = 0; length < good.size(); ++length) {
    const std::vector<uint8_t> prefix(good.begin(), good.begin() + long(length));
    EXPECT_THROW(ParseGguf(prefix.data(), prefix.size(), "cut.gguf"), Error) << length;
  }
}

TEST(GgufBadFiles, ByteFlipsInTheHeaderNeverCrash) {
  const std::vector<uint8_t> good = SmallGguf();
  const size_t header = Find(good, "tensor_b") + 40;
  for (size_t i = 0; i < header; ++i) {
    for (uint8_t value : {uint8_t{0}, uint8_t{0x7f}, uint8_t{0xff}}) {
      const std::vector<uint8_t> bytes = Patched(good, i, value);
      try {
        ParseGguf(bytes.data(), bytes.size(), "flip.gguf");
      } catch (const Error&) {
      }
    }
  }
}

// A GGUF file with no tensors and one metadata array, "a": element type, count, then `body`.
std::vector<uint8_t> OneArrayGguf(GgufType element, uint64_t count, const std::string& body) {
  std::vector<uint8_t> bytes;
  const auto put = [&](auto value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  put(uint32_t{0x46554747});
  put(uint32_t{3});
  put(uint64_t{0});  // tensors
  put(uint64_t{1});  // metadata entries
  put(uint64_t{1});
  bytes.push_back('a');
  put(uint32_t(GgufType::kArray));
  put(uint32_t(element));
  put(count);
  bytes.insert(bytes.end(), body.begin(), body.end());
  return bytes;
}

// Heap bytes in use (glibc), to see what parsed metadata holds.
size_t HeapInUse() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

TEST(GgufRead, ArraysAreHeldCompactly) {
  // A million numbers: 4 bytes each, as in the file (each was a 48-byte variant before).
  const int kNumbers = 1000000;
  std::vector<int32_t> numbers(kNumbers);
  std::iota(numbers.begin(), numbers.end(), -500000);
  std::string packed(reinterpret_cast<const char*>(numbers.data()), numbers.size() * 4);
  std::vector<uint8_t> bytes = OneArrayGguf(GgufType::kI32, kNumbers, packed);
  size_t before = HeapInUse();
  GgufFile file = ParseGguf(bytes.data(), bytes.size(), "numbers.gguf");
  EXPECT_LT(HeapInUse() - before, size_t{5} * kNumbers);
  EXPECT_EQ(file.metadata.Find("a")->array().size(), size_t(kNumbers));
  EXPECT_EQ(file.metadata.GetInts("a"), std::vector<int64_t>(numbers.begin(), numbers.end()));

  // 100,000 strings of 9 bytes: their bytes and one 8-byte end each (48 bytes before).
  const int kStrings = 100000;
  std::string body;
  std::vector<std::string> strings;
  for (int i = 0; i < kStrings; ++i) {
    strings.push_back(Cat("s", 1000000 + i, "x"));
    const uint64_t length = strings.back().size();
    body.append(reinterpret_cast<const char*>(&length), 8);
    body += strings.back();
  }
  bytes = OneArrayGguf(GgufType::kString, kStrings, body);
  file.metadata = GgufMetadata();
  before = HeapInUse();
  file = ParseGguf(bytes.data(), bytes.size(), "strings.gguf");
  EXPECT_LT(HeapInUse() - before, size_t{20} * kStrings);
  EXPECT_EQ(file.metadata.GetStrings("a"), strings);

  // Through the writer and back, every kind, bools read as 0 or 1.
  bytes = OneArrayGguf(GgufType::kBool, 3, std::string("\0\1\2", 3));
  file = ParseGguf(bytes.data(), bytes.size(), "bools.gguf");
  const GgufArray& bools = file.metadata.Find("a")->array();
  EXPECT_EQ(bools.packed, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_TRUE(bools.At(2) == GgufValue::Bool(true));
  const std::string path = testing::TempDir() + "/arrays.gguf";
  GgufWriter writer;
  writer.metadata().Add("bools", file.metadata.entries()[0].second);
  writer.metadata().Add("strings", GgufValue::Strings({"", "a b", "\xC3\xA9", ""}));
  writer.metadata().Add("floats", GgufValue::F32s({-0.5f, 3.25f}));
  writer.metadata().Add("empty", GgufValue::I32s({}));
  writer.metadata().Add("nested", GgufValue::Arrays({GgufValue::Strings({"x"}),
                                                     GgufValue::Arrays({GgufValue::I32s({9})})}));
  writer.Open(path);
  writer.Close();
  TensorStore store;
  const GgufFile back = ReadGgufFile(path, store);
  ASSERT_EQ(back.metadata.entries().size(), writer.metadata().entries().size());
  for (size_t i = 0; i < back.metadata.entries().size(); ++i) {
    EXPECT_TRUE(back.metadata.entries()[i] == writer.metadata().entries()[i]) << i;
  }
  EXPECT_EQ(back.metadata.GetStrings("strings"),
            (std::vector<std::string>{"", "a b", "\xC3\xA9", ""}));
  EXPECT_EQ(back.metadata.GetFloats("floats"), (std::vector<double>{-0.5, 3.25}));
  EXPECT_TRUE(back.metadata.GetInts("empty").empty());
  EXPECT_EQ(back.metadata.Find("nested")->array().arrays[1].array().arrays[0].array().At(0),
            GgufValue::I32(9));
}

// An array's count is checked against the bytes left before anything is allocated for it, and
// what is allocated is no more than those bytes.
TEST(GgufBadFiles, HostileArrayCountsAreRefused) {
  const std::string sixteen(16, '\0');
  for (const GgufType element :
       {GgufType::kU8, GgufType::kBool, GgufType::kU64, GgufType::kString, GgufType::kArray}) {
    for (const uint64_t count : {uint64_t{17}, uint64_t{1} << 40, ~uint64_t{0}}) {
      ExpectParseError(OneArrayGguf(element, count, sixteen), "does not fit in the 16 bytes left");
    }
  }
  // A string claiming more bytes than are left.
  std::string claim(8, '\0');
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(claim.data(), &huge, 8);
  ExpectParseError(OneArrayGguf(GgufType::kString, 1, claim + sixteen), "claims");
}

// Copies a fixture with edits, to check what the model loader says about bad metadata.
void RewriteGguf(const std::string& from, const std::string& to,
                 const std::function<void(GgufMetadata&)>& edit_metadata,
                 const std::string& drop_tensor = "") {
  TensorStore store;
  const GgufFile file = ReadGgufFile(from, store);
  GgufMetadata metadata;
  for (const auto& [key, value] : file.metadata.entries()) metadata.Add(key, value);
  edit_metadata(metadata);
  GgufWriter writer;
  for (const auto& [key, value] : metadata.entries()) writer.metadata().Add(key, value);
  std::vector<const TensorRef*> kept;
  for (const GgufTensorInfo& info : file.tensors) {
    if (info.name == drop_tensor) continue;
    kept.push_back(&store.Get(info.name));
    writer.AddTensor(info.name, info.dtype, kept.back()->shape);
  }
  writer.Open(to);
  for (const TensorRef* t : kept) writer.WriteTensorData(t->data, t->bytes);
  writer.Close();
}

GgufMetadata Without(const GgufMetadata& m, const std::string& key) {
  GgufMetadata out;
  for (const auto& [k, v] : m.entries()) {
    if (k != key) out.Add(k, v);
  }
  return out;
}

// A GGUF file rewritten from a good one (metadata edited, a tensor dropped) and the error
// loading it must name.
struct BadModelFile {
  std::string file;
  std::function<void(GgufMetadata&)> edit;
  std::string drop_tensor;
  std::string message;
};

// Each case written into `dir` from `source`; loading it throws an Error naming the file and
// the case's message.
void ExpectLoadErrors(const std::string& source, const std::string& dir,
                      std::span<const BadModelFile> cases) {
  for (const BadModelFile& c : cases) {
    const std::string path = dir + "/" + c.file;
    RewriteGguf(source, path, c.edit, c.drop_tensor);
    EXPECT_THAT([&] { Model::Load(path); }, testing::ThrowsErrorContaining({path, c.message}))
        << c.file;
  }
}

TEST(GgufBadFiles, ModelLoaderNamesTheProblem) {
  const std::string dir = testing::TempDir();
  const std::string source = FixtureGguf("gguf-llada-q8_0");
  const BadModelFile cases[] = {
      {"no_blocks.gguf", [](GgufMetadata& m) { m = Without(m, "llada.block_count"); }, "",
       "missing metadata key 'llada.block_count'"},
      {"no_eps.gguf",
       [](GgufMetadata& m) { m = Without(m, "llada.attention.layer_norm_rms_epsilon"); }, "",
       "llada.attention.layer_norm_rms_epsilon"},
      {"arch.gguf",
       [](GgufMetadata& m) {
         m = Without(m, "general.architecture");
         m.Add("general.architecture", GgufValue::String("gpt2"));
       },
       "", "'gpt2' is not supported"},
      {"heads.gguf",
       [](GgufMetadata& m) {
         m = Without(m, "llada.attention.head_count");
         m.Add("llada.attention.head_count", GgufValue::U32(3));
       },
       "", "head count"},
      {"mask.gguf",
       [](GgufMetadata& m) {
         m = Without(m, "tokenizer.ggml.mask_token_id");
         m.Add("tokenizer.ggml.mask_token_id", GgufValue::U32(1000));
       },
       "", "mask token id"},
      {"causal.gguf",
       [](GgufMetadata& m) {
         m = Without(m, "llada.attention.causal");
         m.Add("llada.attention.causal", GgufValue::Bool(true));
       },
       "", "causal"},
      {"tensor.gguf", [](GgufMetadata&) {}, "blk.1.ffn_up.weight",
       "missing tensor 'blk.1.ffn_up.weight'"},
  };
  ExpectLoadErrors(source, dir, cases);
  EXPECT_THAT([&] { Model::Load(dir + "/absent.gguf"); },
              testing::ThrowsErrorContaining({"absent.gguf"}));
}

// --- the fixtures' models against the PyTorch reference ---

std::vector<float> ToFloats(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.NumElements()));
  std::memcpy(v.data(), t.data, t.bytes);
  return v;
}

// Largest |logit error| over largest |reference logit| for one full forward pass.
double RelativeLogitError(const Model& model, const std::string& expected_path,
                          const Backend& backend = CpuBackend::Host()) {
  TensorStore expected;
  ReadSafetensorsFile(expected_path, expected);
  const std::vector<int> ids = testing::ToInts(expected.Get("forward.input_ids"));
  const std::vector<float> want = ToFloats(expected.Get("forward.logits"));
  const std::vector<float> got = testing::FullPassLogits(model, ids, backend);
  EXPECT_EQ(got.size(), want.size());
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, double(std::fabs(want[i])));
  }
  return max_err / max_abs;
}

class GgufFixture : public ::testing::TestWithParam<const char*> {};

// With fp32 activations the logits follow the dequantised weights to fp32 rounding; with
// int8 activations (the default) the rounding of the activations adds its own error
// (1.3-1.8e-2 of the largest logit on these fixtures; 0 for F16 weights, which have no
// integer path), bounded here with some room.
TEST_P(GgufFixture, LogitsMatchReferenceOnDequantisedWeights) {
  const std::string dir = testing::FixtureDir(GetParam());
  auto model = Model::Load(dir + "/model.gguf");
  const std::string arch = ArchName(model->config().arch);
  EXPECT_EQ(model->config().rope_interleaved, arch == "llada");
  EXPECT_EQ(model->config().shift_logits, arch == "dream");
  const CpuBackend exact(BestIsa(), ActivationPrecision::kF32), int8(BestIsa());
  const double error = RelativeLogitError(*model, dir + "/expected.safetensors", exact);
  const double int8_error = RelativeLogitError(*model, dir + "/expected.safetensors", int8);
  std::printf("%s: max |logit error| / max |logit| = %.2e (f32 activations), %.2e (int8)\n",
              GetParam(), error, int8_error);
  EXPECT_LE(error, 1e-3);
  EXPECT_LE(int8_error, 3e-2);
  if (std::string(GetParam()).find("f16") != std::string::npos) {
    EXPECT_EQ(int8_error, error);
  } else {
    EXPECT_GT(int8_error, error);  // the integer path ran
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufFixture,
                         ::testing::Values("gguf-llada-q8_0", "gguf-llada-f16", "gguf-dream-q8_0",
                                           "gguf-llada-q4_k_m"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(GgufCli, InspectAndForwardAcceptGgufFiles) {
  const std::string dir = testing::FixtureDir("gguf-dream-q8_0");
  std::string out;
  ASSERT_EQ(testing::RunCli("inspect -m " + dir + "/model.gguf", &out), 0);
  EXPECT_NE(out.find("dream"), std::string::npos);
  EXPECT_NE(out.find("Q8_0"), std::string::npos);
  const std::string logits = testing::TempDir() + "/logits.safetensors";
  ASSERT_EQ(testing::RunCli("forward -m " + dir + "/model.gguf --input " + dir +
                                "/expected.safetensors --output " + logits,
                            &out, true),
            0)
      << out;
  TensorStore store;
  ReadSafetensorsFile(logits, store);
  EXPECT_EQ(store.Get("logits").shape, (std::vector<int64_t>{1, 40, 160}));
  EXPECT_EQ(testing::RunCli("inspect -m " + dir + "/expected.json", &out, true), 1);
  EXPECT_NE(out.find(".gguf file"), std::string::npos) << out;
}

// --- conversion ---

struct Conversion {
  const char* source;
  GgufFileType type;
  const char* fixture;
};

void PrintTo(const Conversion& c, std::ostream* out) { *out << c.source << " -> " << c.fixture; }

class GgufConvert : public ::testing::TestWithParam<Conversion> {};

TEST_P(GgufConvert, TensorBytesAndMetadataMatchLlamaCpp) {
  const Conversion& c = GetParam();
  const std::string out = testing::TempDir() + "/out.gguf";
  ConvertToGguf(testing::FixtureDir(c.source), out, c.type);
  TensorStore ours_store, theirs_store;
  const GgufFile ours = ReadGgufFile(out, ours_store);
  const GgufFile theirs = ReadGgufFile(FixtureGguf(c.fixture), theirs_store);
  ASSERT_EQ(ours.tensors.size(), theirs.tensors.size());
  for (size_t i = 0; i < theirs.tensors.size(); ++i) {
    const GgufTensorInfo& want = theirs.tensors[i];
    const GgufTensorInfo& got = ours.tensors[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.ggml_type, want.ggml_type) << want.name;
    EXPECT_EQ(got.ne, want.ne) << want.name;
    EXPECT_EQ(got.offset, want.offset) << want.name;
    const TensorRef& a = ours_store.Get(want.name);
    const TensorRef& b = theirs_store.Get(want.name);
    ASSERT_EQ(a.bytes, b.bytes) << want.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes), 0) << want.name << " differs";
  }
  for (const auto& [key, value] : theirs.metadata.entries()) {
    if (key == "general.name" || key == "general.alignment") continue;
    // The fixtures carry a placeholder vocabulary without merges, which llama.cpp refuses;
    // their sources have no tokenizer, which we write as llama.cpp's vocabulary-less model.
    if (key.starts_with("tokenizer.ggml.") && !key.ends_with("_token_id")) continue;
    const GgufValue* mine = ours.metadata.Find(key);
    ASSERT_NE(mine, nullptr) << key;
    EXPECT_TRUE(*mine == value) << key;
  }
  EXPECT_EQ(ours.metadata.GetString("tokenizer.ggml.model"), "none");
  EXPECT_FALSE(ours.metadata.Has("tokenizer.ggml.tokens"));
  EXPECT_EQ(ours.metadata.GetUint(ours.metadata.GetString("general.architecture") + ".vocab_size"),
            theirs.metadata.GetStrings("tokenizer.ggml.tokens").size());
  EXPECT_EQ(ours.metadata.GetUint("general.quantization_version"), 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufConvert,
    ::testing::Values(Conversion{"llada-tiny", GgufFileType::kQ8_0, "gguf-llada-q8_0"},
                      Conversion{"llada-tiny", GgufFileType::kF16, "gguf-llada-f16"},
                      Conversion{"dream-tiny", GgufFileType::kQ8_0, "gguf-dream-q8_0"},
                      Conversion{"llada-c", GgufFileType::kQ4_K_M, "gguf-llada-q4_k_m"}),
    [](const auto& info) {
      std::string name = std::string(info.param.fixture);
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// llama.cpp's LLaDA permutation from its definition: within each head of D rows, row 2i + j
// holds the source row j * D/2 + i.
int64_t PermutedSourceRow(int64_t row, int64_t head_dim) {
  const int64_t within = row % head_dim;
  return row - within + (within % 2) * (head_dim / 2) + within / 2;
}

TEST(GgufConvertQ4_K_M, QuantisationErrorNoWorseThanGgml) {
  const std::string out = testing::TempDir() + "/q4km.gguf";
  ConvertToGguf(testing::FixtureDir("llada-c"), out, GgufFileType::kQ4_K_M);
  const TensorStore source = ReadSafetensorsDir(testing::FixtureDir("llada-c"));
  TensorStore ours, ggml;
  ReadGgufFile(out, ours);
  ReadGgufFile(FixtureGguf("gguf-llada-q4_k_m"), ggml);
  const int64_t head_dim = 64;
  double ours_sq = 0, ggml_sq = 0, count = 0;
  std::map<std::string, std::string> hf_names = {
      {"token_embd.weight", "model.transformer.wte.weight"},
      {"output.weight", "model.transformer.ff_out.weight"}};
  const std::pair<const char*, const char*> leaves[] = {
      {"attn_q.weight", "q_proj.weight"},    {"attn_k.weight", "k_proj.weight"},
      {"attn_v.weight", "v_proj.weight"},    {"attn_output.weight", "attn_out.weight"},
      {"ffn_gate.weight", "ff_proj.weight"}, {"ffn_up.weight", "up_proj.weight"},
      {"ffn_down.weight", "ff_out.weight"}};
  for (int l = 0; l < 2; ++l) {
    for (const auto& [gguf_leaf, hf_leaf] : leaves) {
      hf_names["blk." + std::to_string(l) + "." + gguf_leaf] =
          "model.transformer.blocks." + std::to_string(l) + "." + hf_leaf;
    }
  }
  for (const auto& [name, t] : ggml.tensors()) {
    if (!IsBlockQuantized(t.dtype)) continue;
    const bool permuted =
        name.find("attn_q") != std::string::npos || name.find("attn_k") != std::string::npos;
    const TensorRef& src = source.Get(hf_names.at(name));
    const TensorRef& mine = ours.Get(name);
    ASSERT_EQ(mine.dtype, t.dtype) << name;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> a(static_cast<size_t>(cols)), b(a.size());
    double tensor_ours = 0, tensor_ggml = 0;
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeValues(t.dtype, mine.data + r * RowBytes(t.dtype, cols), cols, a.data());
      DequantizeValues(t.dtype, t.data + r * RowBytes(t.dtype, cols), cols, b.data());
      const float* x = reinterpret_cast<const float*>(src.data) +
                       (permuted ? PermutedSourceRow(r, head_dim) : r) * cols;
      for (int64_t j = 0; j < cols; ++j) {
        tensor_ours += double(a[j] - x[j]) * (a[j] - x[j]);
        tensor_ggml += double(b[j] - x[j]) * (b[j] - x[j]);
      }
    }
    EXPECT_LE(tensor_ours, tensor_ggml * 1.0201) << name;  // RMS within 1%
    ours_sq += tensor_ours;
    ggml_sq += tensor_ggml;
    count += double(rows * cols);
  }
  const double ours_rms = std::sqrt(ours_sq / count), ggml_rms = std::sqrt(ggml_sq / count);
  std::printf("Q4_K_M RMS quantisation error over %.0f weights: polestar %.6e, ggml %.6e\n", count,
              ours_rms, ggml_rms);
  RecordProperty("rms_polestar", std::to_string(ours_rms));
  RecordProperty("rms_ggml", std::to_string(ggml_rms));
  EXPECT_LE(ours_rms, ggml_rms * 1.01);
}

TEST(GgufConvertTypes, Bf16AndQ4_0FilesRunCloseToTheF32Model) {
  const std::string dir = testing::TempDir();
  const std::string expected = testing::FixtureDir("llada-tiny") + "/expected.safetensors";
  const struct {
    const char* name;
    GgufFileType type;
    double tolerance;
  } cases[] = {{"bf16", GgufFileType::kBF16, 2e-2}, {"q4_0", GgufFileType::kQ4_0, 0.3}};
  for (const auto& c : cases) {
    const std::string path = dir + "/" + c.name + ".gguf";
    ConvertToGguf(testing::FixtureDir("llada-tiny"), path, c.type);
    auto model = Model::Load(path);
    const double error = RelativeLogitError(*model, expected);
    std::printf("llada-tiny as %s: max |logit error| / max |logit| = %.2e\n", c.name, error);
    EXPECT_LE(error, c.tolerance) << c.name;
    EXPECT_GT(error, 1e-5) << c.name;  // it was quantised
  }
  // Widths of 64 do not fit Q4_K / Q6_K blocks: llama.cpp falls back to a 32-block type.
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.attn_q.weight", 64, false), DType::kQ8_0);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.attn_q.weight", 256, false), DType::kQ4_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.3.ffn_down.weight", 512, false),
            DType::kQ6_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_0, "output.weight", 4096, false), DType::kQ6_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ8_0, "blk.0.ffn_norm.weight", 64, true), DType::kF32);
}

TEST(GgufConvertTokenizer, WritesTokenizerJsonAsGgufVocabulary) {
  const std::string dir = testing::TempDir();
  const std::string hf = dir + "/hf";
  fs::create_directories(hf);
  fs::copy_file(testing::FixtureDir("llada-tiny") + "/config.json", hf + "/config.json");
  fs::create_symlink(testing::FixtureDir("llada-tiny") + "/model.safetensors",
                     hf + "/model.safetensors");
  nlohmann::json tokenizer;
  tokenizer["model"]["type"] = "BPE";
  for (int i = 0; i < 150; ++i) tokenizer["model"]["vocab"][Cat("t", i)] = i;
  tokenizer["model"]["merges"] = {"t1 t2", nlohmann::json::array({"t3", "t4"})};
  tokenizer["decoder"] = {{"type", "ByteLevel"}};  // and no pre-tokenizer
  tokenizer["added_tokens"] = {{{"id", 156}, {"content", "<|mdm_mask|>"}, {"special", true}},
                               {{"id", 157}, {"content", "<|eot_id|>"}, {"special", true}},
                               {{"id", 150}, {"content", "<user>"}, {"special", false}}};
  std::ofstream(hf + "/tokenizer.json") << tokenizer.dump();
  std::ofstream(hf + "/tokenizer_config.json") << R"({"chat_template": "{{ bos_token }}"})";
  std::string out;
  ASSERT_EQ(
      testing::RunCli("convert -q -m " + hf + " -o " + dir + "/tok.gguf --type q8_0", &out, true),
      0)
      << out;
  TensorStore store;
  const GgufVocab vocab = ReadGgufVocab(ReadGgufFile(dir + "/tok.gguf", store).metadata);
  ASSERT_EQ(vocab.tokens.size(), 160u);
  EXPECT_EQ(vocab.tokens[7], "t7");
  EXPECT_EQ(vocab.token_types[7], 1);
  EXPECT_EQ(vocab.tokens[156], "<|mdm_mask|>");
  EXPECT_EQ(vocab.token_types[156], 3);  // special added token: control
  EXPECT_EQ(vocab.token_types[150], 4);  // user-defined
  EXPECT_EQ(vocab.tokens[158], "[PAD158]");
  EXPECT_EQ(vocab.token_types[158], 5);  // unused
  EXPECT_EQ(vocab.merges, (std::vector<std::string>{"t1 t2", "t3 t4"}));
  EXPECT_EQ(vocab.mask_id, 156);
  EXPECT_EQ(vocab.eos_id, 157);
  EXPECT_TRUE(vocab.add_bos);
  EXPECT_EQ(vocab.chat_template, "{{ bos_token }}");
  // No pre-tokenizer at all is none llama.cpp names: the architecture's name, with a warning.
  EXPECT_EQ(vocab.pre, "llama-bpe");
  EXPECT_NE(out.find("none polestar can name for llama.cpp"), std::string::npos) << out;
  std::ofstream(hf + "/tokenizer.json") << R"({"model": {"type": 5, "vocab": {}}})";
  EXPECT_THAT([&] { ConvertToGguf(hf, dir + "/bad.gguf", GgufFileType::kF16); },
              testing::ThrowsErrorContaining({"tokenizer.json", "\"type\" must be a string"}));
  std::ofstream(hf + "/tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"x": 999}}})";
  EXPECT_THAT([&] { ConvertToGguf(hf, dir + "/bad.gguf", GgufFileType::kF16); },
              testing::ThrowsErrorContaining({"tokenizer.json", "\"x\" has id 999"}));
  EXPECT_EQ(testing::RunCli("convert -m " + hf + " -o " + dir + "/x.gguf --type q3_k", &out, true),
            1);
  EXPECT_NE(out.find("unknown GGUF type 'q3_k'"), std::string::npos) << out;
}

// The generated tokens and text of a `generate --json` run (its timings differ run to run).
nlohmann::json Generated(const std::string& json_line) {
  const nlohmann::json result = nlohmann::json::parse(json_line);
  return {{"tokens", result.at("tokens")}, {"text", result.at("text")}, {"nfe", result.at("nfe")}};
}

// The bundled model through convert: the file carries the tokenizer (gpt-2 pre-tokenizer,
// merges, the BOS its chat template writes), the chat template and generation_config.json,
// so generate, tokenize and --help give what the folder gives. F32 keeps the weights as they
// are, so the logits, and with them the decoded tokens, are the folder's exactly.
TEST(GgufConvertTokenizer, BundledModelGeneratesAndTokenizesAsItsFolder) {
  const std::string folder = testing::SourceDir() + "/models/polestar-tiny";
  const std::string gguf = testing::TempDir() + "/tiny.gguf";
  std::string out;
  ASSERT_EQ(testing::RunCli("convert -q -m " + folder + " -o " + gguf + " --type f32", &out, true),
            0)
      << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  TensorStore store;
  const GgufMetadata meta = ReadGgufFile(gguf, store).metadata;
  EXPECT_EQ(meta.GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(meta.GetStrings("tokenizer.ggml.merges").size(), 298u);
  EXPECT_EQ(meta.GetUint("tokenizer.ggml.bos_token_id"), 555u);  // <|startoftext|>
  EXPECT_FALSE(meta.GetBool("tokenizer.ggml.add_bos_token"));
  const nlohmann::json tokenizer_config =
      nlohmann::json::parse(std::ifstream(folder + "/tokenizer_config.json"));
  EXPECT_EQ(meta.GetString("tokenizer.chat_template"), tokenizer_config["chat_template"]);
  EXPECT_EQ(nlohmann::json::parse(meta.GetString(kGgufGenerationConfigKey)),
            nlohmann::json::parse(std::ifstream(folder + "/generation_config.json")));

  const std::string text = "\"Compute 362 + 376.\"";
  const std::vector<std::string> same_output = {
      "tokenize --text " + text, "tokenize --chat --text " + text,
      "tokenize --decode 554,555,100,17,300", "tokenize --decode 100,17,300,554 --skip-special",
      "generate --help"};
  // CLI11 lists a flag's exclusions in the order of their addresses, which differ from run
  // to run; the defaults are what must agree.
  auto without_exclusions = [](std::string help) {
    for (size_t at; (at = help.find(" Excludes:")) != std::string::npos;)
      help.erase(at, help.find('\n', at) - at);
    return help;
  };
  for (const std::string& args : same_output) {
    std::string from_folder, from_gguf;
    ASSERT_EQ(testing::RunCli(args + " -m " + folder, &from_folder), 0) << args;
    ASSERT_EQ(testing::RunCli(args + " -m " + gguf, &from_gguf), 0) << args;
    EXPECT_EQ(without_exclusions(from_gguf), without_exclusions(from_folder)) << args;
  }
  const std::vector<std::string> same_tokens = {"generate --json -p " + text,
                                                "generate --json --raw -p " + text};
  for (const std::string& args : same_tokens) {
    std::string from_folder, from_gguf;
    ASSERT_EQ(testing::RunCli(args + " -m " + folder, &from_folder), 0) << from_folder;
    ASSERT_EQ(testing::RunCli(args + " -m " + gguf, &from_gguf), 0) << from_gguf;
    EXPECT_EQ(Generated(from_gguf), Generated(from_folder)) << args;
    std::printf("%s: %s\n", args.c_str(), Generated(from_gguf).dump().c_str());
  }
}

// Without a tokenizer there is nothing to write a vocabulary from: the file is llama.cpp's
// vocabulary-less model, which loads and runs on token ids, and text is refused clearly.
TEST(GgufConvertTokenizer, FolderWithoutTokenizerGivesAVocabularylessModel) {
  const std::string gguf = testing::TempDir() + "/no-vocab.gguf";
  ConvertToGguf(testing::FixtureDir("llada-tiny"), gguf, GgufFileType::kF16);
  TensorStore store;
  const GgufMetadata meta = ReadGgufFile(gguf, store).metadata;
  EXPECT_EQ(meta.GetString("tokenizer.ggml.model"), "none");
  EXPECT_EQ(meta.GetUint("llada.vocab_size"), 160u);
  EXPECT_EQ(meta.GetUint("tokenizer.ggml.mask_token_id"), 156u);
  EXPECT_FALSE(ModelHasTokenizer(gguf));
  EXPECT_THAT([&] { LoadModelTokenizer(gguf); },
              testing::ThrowsErrorContaining({gguf, "no vocabulary", "--prompt-ids"}));
  std::string out;
  ASSERT_EQ(
      testing::RunCli("generate -m " + gguf +
                          " --prompt-ids 1,2,3 --gen-length 4 --block-length 4 --steps 4 --json",
                      &out),
      0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out).count("text"), 0u) << out;
  EXPECT_EQ(testing::RunCli("tokenize -m " + gguf + " --text hi", &out, true), 1);
  EXPECT_NE(out.find("no vocabulary"), std::string::npos) << out;
}

// --- mixtures of experts (LLaDA-MoE) ---

// The bytes of `rows` x `cols` values of `source` (rows from `first_row`) quantised to `type`
// one row at a time: what llama.cpp's converter writes for them.
std::vector<uint8_t> QuantizedRows(const TensorRef& source, int64_t first_row, int64_t rows,
                                   int64_t cols, DType type) {
  std::vector<uint8_t> out(size_t(rows * RowBytes(type, cols)));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeValues(source.dtype, source.data + (first_row + r) * cols * BlockBytes(source.dtype),
                     cols, row.data());
    QuantizeValues(type, row.data(), cols, out.data() + r * RowBytes(type, cols));
  }
  return out;
}

// lladamoe-b has everything LLaDA-MoE's config can switch on: a dense first layer, a shared
// expert, an expert bias, partial RoPE and GQA.
TEST(GgufConvertMoe, StacksEachLayersExpertsAsLlamaCppDoes) {
  const std::string hf = testing::FixtureDir("lladamoe-b");
  const std::string out = testing::TempDir() + "/moe.gguf";
  ConvertToGguf(hf, out, GgufFileType::kQ8_0);
  TensorStore store;
  const GgufFile file = ReadGgufFile(out, store);
  const TensorStore source = ReadSafetensorsDir(hf);
  const GgufMetadata& m = file.metadata;
  EXPECT_EQ(m.GetString("general.architecture"), "llada-moe");
  EXPECT_EQ(m.GetUint("llada-moe.expert_count"), 6u);
  EXPECT_EQ(m.GetUint("llada-moe.expert_used_count"), 3u);
  EXPECT_EQ(m.GetUint("llada-moe.expert_feed_forward_length"), 48u);
  EXPECT_EQ(m.GetUint("llada-moe.expert_shared_feed_forward_length"), 40u);
  EXPECT_EQ(m.GetUint("llada-moe.feed_forward_length"), 128u);
  EXPECT_EQ(m.GetUint("llada-moe.rope.dimension_count"), 8u);  // 96 / 6 * 0.5
  EXPECT_FALSE(m.GetBool("llada-moe.attention.causal"));
  EXPECT_EQ(m.GetUint("tokenizer.ggml.mask_token_id"), 196u);
  std::map<std::string, const GgufTensorInfo*> infos;
  for (const GgufTensorInfo& t : file.tensors) infos[t.name] = &t;
  // The dense layer keeps llama.cpp's dense names and has no router.
  EXPECT_TRUE(infos.contains("blk.0.ffn_gate.weight"));
  EXPECT_FALSE(infos.contains("blk.0.ffn_gate_inp.weight"));
  EXPECT_FALSE(infos.contains("blk.1.ffn_gate.weight"));
  EXPECT_EQ(infos.at("blk.1.ffn_gate_inp.weight")->dtype, DType::kF32);  // the router
  EXPECT_EQ(infos.at("blk.1.exp_probs_b.bias")->dtype, DType::kF32);
  EXPECT_EQ(infos.at("blk.1.attn_q_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(infos.at("blk.2.ffn_up_shexp.weight")->dtype, DType::kQ8_0);
  const struct {
    const char* leaf;
    const char* hf_leaf;
    int64_t rows, cols;
    DType type;
  } stacked[] = {{"ffn_gate_exps", "gate_proj", 48, 96, DType::kQ8_0},
                 {"ffn_up_exps", "up_proj", 48, 96, DType::kQ8_0},
                 // Rows of 48 fit no Q8_0 block: F16, as llama.cpp falls back.
                 {"ffn_down_exps", "down_proj", 96, 48, DType::kF16}};
  for (int l = 1; l < 3; ++l) {
    for (const auto& t : stacked) {
      const std::string name = Cat("blk.", l, ".", t.leaf, ".weight");
      const GgufTensorInfo& info = *infos.at(name);
      EXPECT_EQ(info.ne, (std::vector<int64_t>{t.cols, t.rows, 6}))
          << name;  // ne0 = the columns, ne2 = the experts
      ASSERT_EQ(info.dtype, t.type) << name;
      const TensorRef& got = store.Get(name);
      const size_t slice = size_t(t.rows * RowBytes(t.type, t.cols));
      ASSERT_EQ(got.bytes, 6 * slice) << name;
      for (int e = 0; e < 6; ++e) {
        const TensorRef& expert =
            source.Get(Cat("model.layers.", l, ".mlp.experts.", e, ".", t.hf_leaf, ".weight"));
        const std::vector<uint8_t> want = QuantizedRows(expert, 0, t.rows, t.cols, t.type);
        EXPECT_EQ(std::memcmp(got.data + e * slice, want.data(), slice), 0)
            << name << " expert " << e;
      }
    }
  }
  // The Hugging Face and GGUF forms describe the same model.
  auto from_hf = Model::Load(hf);
  auto from_gguf = Model::Load(out);
  const ModelConfig& a = from_hf->config();
  const ModelConfig& b = from_gguf->config();
  EXPECT_EQ(
      std::tie(a.ffn, a.rotary_dim, a.qk_norm, a.mask_id, a.moe.experts, a.moe.experts_per_token,
               a.moe.expert_ffn, a.moe.shared_ffn, a.moe.expert_bias, a.moe.moe_layers),
      std::tie(b.ffn, b.rotary_dim, b.qk_norm, b.mask_id, b.moe.experts, b.moe.experts_per_token,
               b.moe.expert_ffn, b.moe.shared_ffn, b.moe.expert_bias, b.moe.moe_layers));
  EXPECT_FALSE(b.rope_interleaved);  // llama.cpp runs LLaDA-MoE with NEOX RoPE, unpermuted
  EXPECT_EQ(from_hf->ParameterCount(), from_gguf->ParameterCount());
}

struct MoeConversion {
  const char* source;
  GgufFileType type;
  const char* type_name;
  double tolerance;  // max |logit error| / max |logit| against the PyTorch reference
};

void PrintTo(const MoeConversion& c, std::ostream* out) {
  *out << c.source << " as " << c.type_name;
}

class GgufMoeConvert : public ::testing::TestWithParam<MoeConversion> {};

// The converted files against the reference logits of the original (unquantised) weights:
// the error is the weights' rounding, within the bounds the dense conversions meet (F16
// and Q8_0 as BF16 does, Q4_K_M as Q4_0 does); with F16 weights the int8 activation path
// does not run, so both backends agree exactly.
TEST_P(GgufMoeConvert, LogitsStayCloseToTheReference) {
  const MoeConversion& c = GetParam();
  const std::string dir = testing::FixtureDir(c.source);
  const std::string out = testing::TempDir() + "/" + c.source + "-" + c.type_name + ".gguf";
  ConvertToGguf(dir, out, c.type);
  auto model = Model::Load(out);
  EXPECT_EQ(std::string(ArchName(model->config().arch)), "llada-moe");
  const CpuBackend exact(BestIsa(), ActivationPrecision::kF32), int8(BestIsa());
  const double error = RelativeLogitError(*model, dir + "/expected.safetensors", exact);
  const double int8_error = RelativeLogitError(*model, dir + "/expected.safetensors", int8);
  std::printf("%s as %s: max |logit error| / max |logit| = %.2e (f32 activations), %.2e (int8)\n",
              c.source, c.type_name, error, int8_error);
  EXPECT_LE(error, c.tolerance);
  EXPECT_GT(error, 1e-6);  // the weights were rounded
  EXPECT_LE(int8_error, c.tolerance + 3e-2);
  if (c.type == GgufFileType::kF16) {
    EXPECT_EQ(int8_error, error);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufMoeConvert,
    ::testing::Values(MoeConversion{"lladamoe-a", GgufFileType::kF16, "f16", 2e-3},
                      MoeConversion{"lladamoe-a", GgufFileType::kQ8_0, "q8_0", 3e-2},
                      MoeConversion{"lladamoe-a", GgufFileType::kQ4_K_M, "q4_k_m", 3e-2},
                      MoeConversion{"lladamoe-b", GgufFileType::kF16, "f16", 2e-3},
                      MoeConversion{"lladamoe-b", GgufFileType::kQ8_0, "q8_0", 3e-2},
                      MoeConversion{"lladamoe-b", GgufFileType::kQ4_K_M, "q4_k_m", 3e-2},
                      // q/k/v/o biases and clip_qkv (attention.clamp_kqv; it binds).
                      MoeConversion{"lladamoe-d", GgufFileType::kF16, "f16", 2e-3}),
    [](const auto& info) {
      std::string name = Cat(info.param.source, "_", info.param.type_name);
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// F16 experts keep the reference decode traces token for token (every run of each fixture's
// expected.json: vanilla LLaDA sampling, with and without a confidence threshold).
TEST(GgufConvertMoe, F16FilesReproduceTheReferenceDecodeTraces) {
  int runs = 0;
  for (const char* fixture : {"lladamoe-a", "lladamoe-b"}) {
    const std::string dir = testing::FixtureDir(fixture);
    const std::string path = testing::TempDir() + "/" + fixture + ".gguf";
    ConvertToGguf(dir, path, GgufFileType::kF16);
    const nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
    TensorStore tensors;
    ReadSafetensorsFile(dir + "/expected.safetensors", tensors);
    std::string prompt;
    for (int id : testing::ToInts(tensors.Get("prompt")))
      prompt += (prompt.empty() ? "" : ",") + Cat(id);
    for (const auto& [run, p] : expected["runs"].items()) {
      SCOPED_TRACE(std::string(fixture) + " " + run);
      ASSERT_EQ(run.rfind("vanilla", 0), 0u);
      std::string flags =
          Cat(" --gen-length ", p["gen_length"].get<int>(), " --steps ", p["steps"].get<int>(),
              " --block-length ", p["block_length"].get<int>());
      if (p.contains("threshold")) flags += Cat(" --threshold ", p["threshold"].get<double>());
      std::string out;
      ASSERT_EQ(testing::RunCli("generate -t 1 -m " + path + " --prompt-ids " + prompt +
                                    " --json --policy vanilla" + flags,
                                &out),
                0);
      const nlohmann::json got = nlohmann::json::parse(out);
      EXPECT_EQ(got["tokens"].get<std::vector<int>>(),
                testing::ToInts(tensors.Get(run + ".tokens")));
      EXPECT_EQ(got["nfe"], p["nfe"]);
      ++runs;
    }
  }
  EXPECT_EQ(runs, 4);
}

// The fixtures' widths fit no K-quant block (Q4_K_M falls back to Q8_0 there, as llama.cpp
// does); a random checkpoint of width 256 runs Q4_K and Q6_K experts.
TEST(GgufConvertMoe, KQuantExpertsRunCloseToTheirSource) {
  const std::string dir = testing::TempDir();
  bench::RandomModelOptions options;
  options.shape = bench::ShapeByName("llada-moe-tiny");
  bench::ModelShape& s = options.shape;
  s.width = s.ffn = s.expert_ffn = s.shared_ffn = 256;
  options.dtype = DType::kF32;
  options.seed = 3;
  bench::WriteRandomModel(dir + "/hf", options);
  ConvertToGguf(dir + "/hf", dir + "/q4km.gguf", GgufFileType::kQ4_K_M);
  auto hf = Model::Load(dir + "/hf");
  auto gguf = Model::Load(dir + "/q4km.gguf");
  EXPECT_EQ(gguf->tensors().Get("blk.1.ffn_gate_exps.weight").dtype, DType::kQ4_K);
  EXPECT_EQ(gguf->tensors().Get("blk.1.ffn_down_exps.weight").dtype, DType::kQ6_K);
  EXPECT_EQ(gguf->tensors().Get("blk.1.ffn_down_shexp.weight").dtype, DType::kQ6_K);
  EXPECT_EQ(gguf->tensors().Get("blk.1.ffn_gate_inp.weight").dtype, DType::kF32);
  const CpuBackend exact(BestIsa(), ActivationPrecision::kF32);
  std::vector<int> ids(24);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int(i * 37 % 150);
  const std::vector<float> want = testing::FullPassLogits(*hf, ids, exact),
                           got = testing::FullPassLogits(*gguf, ids, exact);
  ASSERT_EQ(got.size(), want.size());
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, double(std::fabs(want[i])));
  }
  std::printf("random MoE, width 256, as Q4_K_M: max |logit error| / max |logit| = %.2e\n",
              max_err / max_abs);
  EXPECT_LE(max_err / max_abs, 0.3);  // the Q4_0 bound of the dense conversions
  EXPECT_GT(max_err / max_abs, 1e-4);
}

TEST(GgufConvertMoe, ExpertTensorTypesFollowTheirDenseCounterparts) {
  // llama.cpp's router stays F32 whatever the file type.
  for (GgufFileType type : {GgufFileType::kF16, GgufFileType::kQ8_0, GgufFileType::kQ4_K_M}) {
    EXPECT_EQ(GgufTensorType(type, "blk.0.ffn_gate_inp.weight", 2048, false), DType::kF32);
  }
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.ffn_gate_exps.weight", 2048, false),
            DType::kQ4_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.ffn_down_exps.weight", 1024, false),
            DType::kQ6_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.ffn_down_shexp.weight", 1024, false),
            DType::kQ6_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ8_0, "blk.0.ffn_up_exps.weight", 2048, false),
            DType::kQ8_0);
}

TEST(GgufBadFiles, MoeLoaderNamesTheProblem) {
  const std::string dir = testing::TempDir();
  const std::string source = dir + "/moe-a.gguf";
  ConvertToGguf(testing::FixtureDir("lladamoe-a"), source, GgufFileType::kF16);
  auto set = [](const char* key, uint32_t value) {
    return [=](GgufMetadata& m) {
      m = Without(m, key);
      m.Add(key, GgufValue::U32(value));
    };
  };
  const BadModelFile cases[] = {
      {"top_k.gguf", set("llada-moe.expert_used_count", 9), "", "experts per token (9)"},
      {"top_k0.gguf", set("llada-moe.expert_used_count", 0), "", "experts per token (0)"},
      {"experts0.gguf", set("llada-moe.expert_count", 0), "", "llada-moe.expert_count is 0"},
      {"no_top_k.gguf", [](GgufMetadata& m) { m = Without(m, "llada-moe.expert_used_count"); }, "",
       "missing metadata key 'llada-moe.expert_used_count'"},
      {"no_expert_ffn.gguf",
       [](GgufMetadata& m) { m = Without(m, "llada-moe.expert_feed_forward_length"); }, "",
       "missing metadata key 'llada-moe.expert_feed_forward_length'"},
      // Metadata that disagrees with the stacked tensors' shapes.
      {"expert_ffn.gguf", set("llada-moe.expert_feed_forward_length", 16), "",
       "'blk.0.ffn_gate_exps.weight' has shape [8, 32, 64], expected [8, 16, 64]"},
      {"experts.gguf", set("llada-moe.expert_count", 7), "", "blk.0.ffn_gate_inp.weight"},
      {"huge_blocks.gguf", set("llada-moe.block_count", 0x7fffffff), "", "tensors"},
      {"clamp.gguf",
       [](GgufMetadata& m) { m.Add("llada-moe.attention.clamp_kqv", GgufValue::F32(-1.0f)); }, "",
       "llada-moe.attention.clamp_kqv must be positive"},
      {"no_experts.gguf", [](GgufMetadata&) {}, "blk.1.ffn_down_exps.weight",
       "missing tensor 'blk.1.ffn_down_exps.weight'"},
      // A layer without a router is dense, and then needs the dense tensors.
      {"no_router.gguf", [](GgufMetadata&) {}, "blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate"},
      // Without expert_count the file reads as dense and the expert tensors are left over.
      {"dense.gguf", [](GgufMetadata& m) { m = Without(m, "llada-moe.expert_count"); }, "",
       "blk.0.ffn_gate"},
  };
  ExpectLoadErrors(source, dir, cases);
}

// --- LLaDA 2.x (llama.cpp's llada2: its BailingMoeV2 layout) ---

// llada2-b has everything LLaDA 2.x's config switches: a dense first layer, GQA (one K/V head),
// a head dimension other than C / H (24, not 12), partial RoPE, two shared experts, expert
// groups (2 of 4 kept), a scaling factor and a nonzero expert bias.
TEST(GgufConvertLlada2, WritesTheBailingMoeV2Layout) {
  const std::string hf = testing::FixtureDir("llada2-b");
  const std::string out = testing::TempDir() + "/llada2.gguf";
  ConvertToGguf(hf, out, GgufFileType::kQ8_0);
  TensorStore store;
  const GgufFile file = ReadGgufFile(out, store);
  const TensorStore source = ReadSafetensorsDir(hf);
  const GgufMetadata& m = file.metadata;
  EXPECT_EQ(m.GetString("general.architecture"), "llada2");
  // The values of llada2-b's config.json, under llama.cpp's BailingMoeV2 key names.
  const std::pair<const char*, uint64_t> counts[] = {
      {"llada2.context_length", 512},
      {"llada2.embedding_length", 48},
      {"llada2.feed_forward_length", 80},
      {"llada2.block_count", 3},
      {"llada2.attention.head_count", 4},
      {"llada2.attention.head_count_kv", 1},
      {"llada2.attention.key_length", 24},
      {"llada2.attention.value_length", 24},
      {"llada2.rope.dimension_count", 12},  // 24 * 0.5
      {"llada2.vocab_size", 200},
      {"llada2.leading_dense_block_count", 1},
      {"llada2.expert_count", 8},
      {"llada2.expert_used_count", 3},
      {"llada2.expert_feed_forward_length", 16},
      {"llada2.expert_shared_feed_forward_length", 32},  // 16 x 2 shared experts
      {"llada2.expert_shared_count", 2},
      {"llada2.expert_gating_func", 2},  // sigmoid
      {"llada2.expert_group_count", 4},
      {"llada2.expert_group_used_count", 2},
      {"tokenizer.ggml.mask_token_id", 195},
      {"tokenizer.ggml.eos_token_id", 192},
  };
  for (const auto& [key, value] : counts) EXPECT_EQ(m.GetUint(key), value) << key;
  EXPECT_FLOAT_EQ(float(m.GetFloat("llada2.expert_weights_scale")), 2.5f);
  EXPECT_TRUE(m.GetBool("llada2.expert_weights_norm"));
  EXPECT_FLOAT_EQ(float(m.GetFloat("llada2.rope.freq_base")), 10000.0f);
  EXPECT_FLOAT_EQ(float(m.GetFloat("llada2.attention.layer_norm_rms_epsilon")), 1e-6f);
  std::map<std::string, const GgufTensorInfo*> infos;
  for (const GgufTensorInfo& t : file.tensors) infos[t.name] = &t;
  EXPECT_FALSE(infos.contains("blk.0.attn_q.weight"));  // q/k/v stay fused
  // Rows: 4 q heads, 1 k head, 1 v head of 24; 48 columns fit no Q8_0 block, so F16.
  EXPECT_EQ(infos.at("blk.0.attn_qkv.weight")->ne, (std::vector<int64_t>{48, 144}));
  EXPECT_EQ(infos.at("blk.0.attn_output.weight")->ne, (std::vector<int64_t>{96, 48}));
  EXPECT_EQ(infos.at("blk.0.attn_q_norm.weight")->ne, (std::vector<int64_t>{24}));
  EXPECT_TRUE(infos.contains("blk.0.ffn_gate.weight"));
  EXPECT_FALSE(infos.contains("blk.0.ffn_gate_inp.weight"));
  EXPECT_EQ(infos.at("blk.1.ffn_gate_inp.weight")->dtype, DType::kF32);
  EXPECT_EQ(infos.at("blk.2.exp_probs_b.bias")->dtype, DType::kF32);
  EXPECT_EQ(infos.at("blk.2.ffn_gate_exps.weight")->ne, (std::vector<int64_t>{48, 16, 8}));
  EXPECT_EQ(infos.at("blk.2.ffn_down_exps.weight")->ne, (std::vector<int64_t>{16, 48, 8}));
  EXPECT_EQ(infos.at("blk.2.ffn_up_shexp.weight")->ne, (std::vector<int64_t>{48, 32}));
  // The fused projection is the checkpoint's, row for row (no RoPE permutation), and so is
  // the expert bias.
  const TensorRef& qkv = store.Get("blk.1.attn_qkv.weight");
  const TensorRef& hf_qkv = source.Get("model.layers.1.attention.query_key_value.weight");
  const std::vector<uint8_t> want = QuantizedRows(hf_qkv, 0, 144, 48, qkv.dtype);
  ASSERT_EQ(qkv.bytes, want.size());
  EXPECT_EQ(std::memcmp(qkv.data, want.data(), want.size()), 0);
  const TensorRef& bias = store.Get("blk.2.exp_probs_b.bias");
  const TensorRef& hf_bias = source.Get("model.layers.2.mlp.gate.expert_bias");
  ASSERT_EQ(bias.bytes, hf_bias.bytes);
  EXPECT_EQ(std::memcmp(bias.data, hf_bias.data, bias.bytes), 0);
  EXPECT_NE(ToFloats(hf_bias), std::vector<float>(8, 0.0f));  // the bias binds

  // The Hugging Face and GGUF forms describe the same model.
  auto from_hf = Model::Load(hf);
  auto from_gguf = Model::Load(out);
  const ModelConfig& a = from_hf->config();
  const ModelConfig& b = from_gguf->config();
  EXPECT_EQ(std::tie(a.head_dim, a.rotary_dim, a.qk_norm, a.qkv_bias, a.o_bias, a.mask_id, a.eos_id,
                     a.sampler, a.moe.experts, a.moe.experts_per_token, a.moe.expert_ffn,
                     a.moe.shared_ffn, a.moe.expert_bias, a.moe.bias_in_weights, a.moe.score,
                     a.moe.groups, a.moe.top_groups, a.moe.normalize_top_k, a.moe.routed_scaling,
                     a.moe.moe_layers),
            std::tie(b.head_dim, b.rotary_dim, b.qk_norm, b.qkv_bias, b.o_bias, b.mask_id, b.eos_id,
                     b.sampler, b.moe.experts, b.moe.experts_per_token, b.moe.expert_ffn,
                     b.moe.shared_ffn, b.moe.expert_bias, b.moe.bias_in_weights, b.moe.score,
                     b.moe.groups, b.moe.top_groups, b.moe.normalize_top_k, b.moe.routed_scaling,
                     b.moe.moe_layers));
  EXPECT_EQ(b.sampler, SamplerFamily::kLlada2);
  EXPECT_FALSE(b.rope_interleaved);
  EXPECT_EQ(from_hf->ParameterCount(), from_gguf->ParameterCount());
}

struct Llada2Conversion {
  MoeConversion conversion;
  // Rows allowed past the tolerance, where the rounding flips a router's pick (measured: rows
  // 31 and 32 of llada2-a in Q8_0, off by 15% while every other row stays within 2%; its only
  // routed layer is the last, so a flip moves its own row alone).
  int flipped_rows = 0;
};

void PrintTo(const Llada2Conversion& c, std::ostream* out) { PrintTo(c.conversion, out); }

// Per output row, the largest |logit error| over the largest |reference logit|, sorted
// descending.
std::vector<double> SortedRowErrors(const std::vector<float>& got, const std::vector<float>& want,
                                    size_t vocab) {
  double max_abs = 0;
  for (float w : want) max_abs = std::max(max_abs, double(std::fabs(w)));
  std::vector<double> rows(want.size() / vocab, 0.0);
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    rows[i / vocab] = std::max(rows[i / vocab], double(std::fabs(got[i] - want[i])) / max_abs);
  }
  std::sort(rows.rbegin(), rows.rend());
  return rows;
}

class GgufLlada2Convert : public ::testing::TestWithParam<Llada2Conversion> {};

// As for LLaDA-MoE: the converted files against the reference logits of the original weights,
// for the fully bidirectional forward and the sampler's block-causal one (block length 8),
// every row within the tolerance but the ones where a router's pick flips.
TEST_P(GgufLlada2Convert, LogitsStayCloseToTheReference) {
  const MoeConversion& c = GetParam().conversion;
  const int flipped = GetParam().flipped_rows;
  const std::string dir = testing::FixtureDir(c.source);
  const std::string out = testing::TempDir() + "/" + c.source + "-" + c.type_name + ".gguf";
  ConvertToGguf(dir, out, c.type);
  auto model = Model::Load(out);
  EXPECT_EQ(std::string(ArchName(model->config().arch)), "llada2");
  TensorStore expected;
  ReadSafetensorsFile(dir + "/expected.safetensors", expected);
  const std::vector<int> ids = testing::ToInts(expected.Get("forward.input_ids"));
  const size_t vocab = size_t(model->config().vocab);
  const CpuBackend exact(BestIsa(), ActivationPrecision::kF32), int8(BestIsa());
  struct Pass {
    const char* name;
    const char* logits;
    int attention_block;
    const Backend* backend;
    double tolerance;
  } passes[] = {{"bidirectional", "forward.logits", 0, &exact, c.tolerance},
                {"bidirectional, int8", "forward.logits", 0, &int8, c.tolerance + 3e-2},
                {"block-causal", "forward_block.logits", 8, &exact, c.tolerance}};
  std::vector<double> exact_errors;
  for (const Pass& pass : passes) {
    KvCache cache = MakeCache(*model, int64_t(ids.size()), false, *pass.backend);
    Forward forward(*model, cache);
    StepPlan plan;
    plan.input_rows.resize(ids.size());
    std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
    plan.logit_rows = plan.input_rows;
    plan.attention_block = pass.attention_block;
    const std::vector<double> errors =
        SortedRowErrors(forward.Run(ids, plan).logits, ToFloats(expected.Get(pass.logits)), vocab);
    ASSERT_EQ(errors.size(), ids.size());
    std::printf("%s as %s, %s: max |logit error| / max |logit| = %.2e, %.2e past %d rows\n",
                c.source, c.type_name, pass.name, errors[0], errors[size_t(flipped)], flipped);
    EXPECT_LE(errors[size_t(flipped)], pass.tolerance) << pass.name;
    EXPECT_GT(errors[0], 1e-6) << pass.name;  // the weights were rounded
    if (pass.backend == &exact && pass.attention_block == 0) exact_errors = errors;
    // F16 weights have no integer path: both backends agree exactly.
    if (c.type == GgufFileType::kF16 && pass.backend == &int8) {
      EXPECT_EQ(errors, exact_errors);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufLlada2Convert,
    ::testing::Values(Llada2Conversion{{"llada2-a", GgufFileType::kF16, "f16", 2e-3}},
                      Llada2Conversion{{"llada2-a", GgufFileType::kQ8_0, "q8_0", 3e-2}, 2},
                      Llada2Conversion{{"llada2-a", GgufFileType::kQ4_K_M, "q4_k_m", 3e-2}, 2},
                      Llada2Conversion{{"llada2-b", GgufFileType::kF16, "f16", 2e-3}},
                      Llada2Conversion{{"llada2-b", GgufFileType::kQ8_0, "q8_0", 3e-2}},
                      Llada2Conversion{{"llada2-b", GgufFileType::kQ4_K_M, "q4_k_m", 3e-2}}),
    [](const auto& info) {
      std::string name = Cat(info.param.conversion.source, "_", info.param.conversion.type_name);
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// A copy of the Hugging Face checkpoint `dir` whose tensors are rounded as an F16 GGUF file
// stores them: every matrix but the router in F16 (used in place by the loader), the router,
// norms and biases kept in F32.
std::string F16RoundedCheckpoint(const std::string& dir, const std::string& out) {
  fs::create_directories(out);
  fs::copy_file(dir + "/config.json", out + "/config.json", fs::copy_options::overwrite_existing);
  const TensorStore source = ReadSafetensorsDir(dir);
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : source.tensors()) {
    const bool router = name.ends_with(".mlp.gate.weight");
    if (t.shape.size() != 2 || router || t.dtype != DType::kF32) {
      tensors.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
      continue;
    }
    const std::vector<float> values = ToFloats(t);
    TensorToWrite rounded{name, DType::kF16, t.shape,
                          std::vector<uint8_t>(size_t(RowBytes(DType::kF16, t.NumElements())))};
    QuantizeValues(DType::kF16, values.data(), t.NumElements(), rounded.bytes.data());
    tensors.push_back(std::move(rounded));
  }
  WriteSafetensors(out + "/model.safetensors", tensors);
  return out;
}

// F16 files against the reference block-diffusion traces (every run of each fixture's
// expected.json: LLaDA2MoeModelLM.generate's per-block threshold commits, with and without its
// fixed schedule and eos_early_stop). The F16 file decodes exactly as the Hugging Face form
// with the same rounded weights does, token for token and commit for commit, on every run; and
// that reproduces the reference traces on 5 of the 8 runs. On the other three the rounding
// (5e-4 of a weight, 50 times the noise the fixtures' traces were checked stable under) moves
// a confidence across the threshold somewhere (these random routers' picks are fragile:
// Q8_0 flips two rows' picks on llada2-a, see GgufLlada2Convert).
TEST(GgufConvertLlada2, F16FilesDecodeAsTheirRoundedCheckpointAndFollowTheReference) {
  int runs = 0, exact_runs = 0;
  for (const char* fixture : {"llada2-a", "llada2-b"}) {
    const std::string dir = testing::FixtureDir(fixture);
    const std::string path = testing::TempDir() + "/" + fixture + ".gguf";
    ConvertToGguf(dir, path, GgufFileType::kF16);
    auto model = Model::Load(path);
    auto rounded =
        Model::Load(F16RoundedCheckpoint(dir, testing::TempDir() + "/" + fixture + "-f16"));
    const nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
    TensorStore tensors;
    ReadSafetensorsFile(dir + "/expected.safetensors", tensors);
    const std::vector<int> prompt = testing::ToInts(tensors.Get("prompt"));
    for (const auto& [run, p] : expected["runs"].items()) {
      SCOPED_TRACE(std::string(fixture) + " " + run);
      DecodeOptions options;
      options.gen_length = p["gen_length"];
      options.block_length = p["block_length"];
      options.steps = p["steps"];
      options.threshold = p["threshold"].get<double>();
      options.eos_early_stop = p["eos_early_stop"];
      const GenerationResult got = Generate(*model, prompt, options, nullptr, true);
      const GenerationResult want = Generate(*rounded, prompt, options, nullptr, true);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.trace, want.trace);
      ++runs;
      const int nfe = p["nfe"];
      if (got.nfe != nfe || got.tokens != testing::ToInts(tensors.Get(run + ".tokens"))) {
        std::printf("%s %s: F16 weights leave the reference trace (nfe %d, reference %d)\n",
                    fixture, run.c_str(), got.nfe, nfe);
        continue;
      }
      // Token for token, and every step commits what the reference's did.
      const std::vector<int> windows = testing::ToInts(tensors.Get(run + ".inputs"));  // [nfe, T]
      const std::vector<std::vector<int>> commits = testing::ReferenceCommits(windows, nfe);
      for (size_t step = 0; step < commits.size(); ++step) {
        EXPECT_EQ(got.trace[step]["committed"].get<std::vector<int>>(), commits[step])
            << "step " << step;
      }
      ++exact_runs;
    }
  }
  EXPECT_EQ(runs, 8);
  // Every run of the fixed schedule (threshold 1) and of threshold 0.5 among them.
  EXPECT_GE(exact_runs, 5);
}

TEST(GgufConvertLlada2, FusedQkvTakesLlamaQuantsQ5_K) {
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.attn_qkv.weight", 2048, false),
            DType::kQ5_K);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.0.attn_qkv.weight", 64, false),
            DType::kQ8_0);  // no 256-block fits
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ8_0, "blk.0.attn_qkv.weight", 2048, false),
            DType::kQ8_0);
  EXPECT_EQ(GgufTensorType(GgufFileType::kQ4_K_M, "blk.1.exp_probs_b.bias", 256, true),
            DType::kF32);
}

TEST(GgufBadFiles, Llada2LoaderNamesTheProblem) {
  const std::string dir = testing::TempDir();
  const std::string source = dir + "/llada2-b.gguf";
  ConvertToGguf(testing::FixtureDir("llada2-b"), source, GgufFileType::kF16);
  auto set = [](const char* key, uint32_t value) {
    return [=](GgufMetadata& m) {
      m = Without(m, key);
      m.Add(key, GgufValue::U32(value));
    };
  };
  auto without = [](const char* key) { return [=](GgufMetadata& m) { m = Without(m, key); }; };
  const BadModelFile cases[] = {
      {"gating.gguf", set("llada2.expert_gating_func", 3), "",
       "llada2.expert_gating_func = 3 is not a router scoring"},
      {"no_gating.gguf", without("llada2.expert_gating_func"), "",
       "missing metadata key 'llada2.expert_gating_func'"},
      {"no_norm.gguf", without("llada2.expert_weights_norm"), "",
       "missing metadata key 'llada2.expert_weights_norm'"},
      {"no_scale.gguf", without("llada2.expert_weights_scale"), "",
       "missing metadata key 'llada2.expert_weights_scale'"},
      {"groups.gguf", set("llada2.expert_group_count", 3), "",
       "expert groups (3) must divide the 8 experts"},
      {"kept_groups.gguf", set("llada2.expert_group_used_count", 5), "",
       "kept expert groups (5) must lie in [1, 4]"},
      {"no_groups.gguf", without("llada2.expert_group_count"), "",
       "missing metadata key 'llada2.expert_group_count'"},
      // Keys that disagree with the tensors.
      {"dense_count.gguf", set("llada2.leading_dense_block_count", 2), "",
       "llada2.leading_dense_block_count = 2 but layer 1 has a router (ffn_gate_inp.weight)"},
      {"dense_count0.gguf", set("llada2.leading_dense_block_count", 0), "",
       "llada2.leading_dense_block_count = 0 but layer 0 has no router"},
      {"shared_count.gguf", set("llada2.expert_shared_count", 0), "",
       "llada2.expert_shared_count = 0 but llada2.expert_shared_feed_forward_length = 32"},
      {"head_dim.gguf",
       [&](GgufMetadata& m) {
         set("llada2.attention.key_length", 12)(m);
         set("llada2.attention.value_length", 12)(m);
       },
       "", "'blk.0.attn_qkv.weight' has shape [144, 48], expected [72, 48]"},
      {"value_length.gguf", set("llada2.attention.value_length", 12), "",
       "llada2.attention.value_length = 12 differs from llada2.attention.key_length = 24"},
      {"no_head_dim.gguf", without("llada2.attention.key_length"), "",
       "'blk.0.attn_qkv.weight' has shape [144, 48], expected [72, 48]"},
      {"rope_dims.gguf", set("llada2.rope.dimension_count", 30), "", "rotary"},
      {"vocab.gguf", set("llada2.vocab_size", 300), "",
       "llada2.vocab_size = 300 but token_embd.weight has 200 rows"},
      {"no_qkv.gguf", [](GgufMetadata&) {}, "blk.1.attn_qkv.weight",
       "missing tensor 'blk.1.attn_qkv.weight'"},
      {"no_shared.gguf", [](GgufMetadata&) {}, "blk.2.ffn_up_shexp.weight",
       "missing tensor 'blk.2.ffn_up_shexp.weight'"},
      {"no_router.gguf", [](GgufMetadata&) {}, "blk.2.ffn_gate_inp.weight",
       "llada2.leading_dense_block_count = 1 but layer 2 has no router"},
  };
  ExpectLoadErrors(source, dir, cases);
}

}  // namespace
}  // namespace polestar
