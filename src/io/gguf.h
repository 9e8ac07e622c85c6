// GGUF (versions 2 and 3, little-endian), the llama.cpp / ggml model file:
//   u32 magic "GGUF"; u32 version; u64 tensor_count; u64 kv_count;
//   kv_count x (string key; u32 value_type; value);
//   tensor_count x (string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset);
//   padding to the alignment (general.alignment, default 32); tensor data.
// Strings are u64 length + bytes; arrays are u32 element type + u64 count + elements.
// Reading validates every count, length, type, shape and offset against the file and throws
// Error naming the file and the problem; nothing a file says is trusted before checking.
//
// gguf_format.cpp holds the values and metadata, gguf_reader.cpp the reader, gguf_writer.cpp
// the writer and gguf_vocab.cpp the tokenizer vocabulary.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "io/atomic_file.h"
#include "io/tensor_store.h"

namespace polestar {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

const char* GgufTypeName(GgufType type);

struct GgufValue;

// The elements of an array, held compactly (a vocabulary is 100,000s of them): numbers and
// bools packed as the file stores them, strings back to back in one blob, arrays of arrays
// as values.
struct GgufArray {
  GgufType element_type = GgufType::kU8;
  std::vector<uint8_t> packed;    // numbers, bools: size() x element width, little-endian
  std::string blob;               // strings: their bytes back to back
  std::vector<uint64_t> ends;     // strings: where each ends in blob
  std::vector<GgufValue> arrays;  // arrays

  size_t size() const;
  // Element i as a value of element_type (a copy).
  GgufValue At(size_t i) const;
  std::string_view StringAt(size_t i) const;  // strings only

  bool operator==(const GgufArray& other) const = default;
};

// One metadata value. Integers keep their signedness, floats are widened to double.
struct GgufValue {
  GgufType type = GgufType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> data;

  static GgufValue U32(uint32_t v);
  static GgufValue I32(int32_t v);
  static GgufValue U64(uint64_t v);
  static GgufValue F32(float v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue Strings(const std::vector<std::string>& v);
  static GgufValue I32s(const std::vector<int32_t>& v);
  static GgufValue F32s(const std::vector<float>& v);
  static GgufValue Arrays(std::vector<GgufValue> v);  // all arrays

  const GgufArray& array() const { return std::get<GgufArray>(data); }
  bool operator==(const GgufValue& other) const = default;
};

// Bytes of one number or bool of `type` in a file; 0 for strings and arrays.
size_t GgufScalarBytes(GgufType type);

// Key/value metadata in file order, with typed getters that throw Error naming the file
// and the key when a key is missing or holds another type.
class GgufMetadata {
 public:
  explicit GgufMetadata(std::string origin = "") : origin_(std::move(origin)) {}

  const GgufValue* Find(const std::string& key) const;
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  uint64_t GetUint(const std::string& key) const;  // any integer type, must be >= 0
  int64_t GetInt(const std::string& key) const;    // any integer type
  double GetFloat(const std::string& key) const;   // f32, f64 or an integer
  bool GetBool(const std::string& key) const;
  const std::string& GetString(const std::string& key) const;
  std::vector<std::string> GetStrings(const std::string& key) const;  // array of strings
  std::vector<int64_t> GetInts(const std::string& key) const;         // array of integers
  std::vector<double> GetFloats(const std::string& key) const;        // array of numbers

  // Throws Error when the key is already present.
  void Add(const std::string& key, GgufValue value);
  const std::vector<std::pair<std::string, GgufValue>>& entries() const { return entries_; }
  const std::string& origin() const { return origin_; }

 private:
  const GgufValue& Get(const std::string& key, const char* expected) const;

  std::string origin_;
  std::vector<std::pair<std::string, GgufValue>> entries_;
  std::map<std::string, size_t> index_;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] varies fastest
  uint64_t offset = 0;      // from the start of the data section
  uint64_t bytes = 0;
};

struct GgufFile {
  uint32_t version = 3;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // start of the data section in the file
  GgufMetadata metadata;
  std::vector<GgufTensorInfo> tensors;  // in file order
};

// Parses and validates the `size` bytes at `data` (a whole file); `origin` names it in errors.
GgufFile ParseGguf(const uint8_t* data, size_t size, const std::string& origin);

// Maps `path`, parses it and adds its tensors to `store` with shapes outermost first
// (ne reversed: a matrix of ne = [K, N] becomes [N, K]). The store keeps the map.
GgufFile ReadGgufFile(const std::string& path, TensorStore& store);

// ggml type ids of the tensor types polestar reads and writes.
uint32_t GgmlTypeId(DType type);

// Writes a GGUF v3 file front to back: metadata and tensor infos first, then each tensor's
// data in the order the tensors were added. Tensors are aligned to 32 bytes, as llama.cpp's
// writer does.
class GgufWriter {
 public:
  GgufMetadata& metadata() { return metadata_; }
  // `shape` outermost first, as in TensorRef.
  void AddTensor(const std::string& name, DType type, const std::vector<int64_t>& shape);
  // Starts the file (under a temporary name until Close) and writes everything up to the
  // first tensor's data.
  void Open(const std::string& path);
  // Writes the next tensor's data; `bytes` must match its type and shape.
  void WriteTensorData(const uint8_t* data, size_t bytes);
  // Checks every tensor was written and puts the complete file in place. Without it (an
  // exception on the way) no file is left behind.
  void Close();
  ~GgufWriter();

 private:
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unique_ptr<AtomicFile> file_;
  size_t written_ = 0;  // tensors whose data is written
  uint64_t position_ = 0;
};

// What tokenizer.ggml.* says: the vocabulary for a BPE tokenizer built from a GGUF file.
struct GgufVocab {
  std::string model;                 // tokenizer.ggml.model, "gpt2" for byte-level BPE
  std::string pre;                   // tokenizer.ggml.pre (pre-tokenizer name), may be empty
  std::vector<std::string> tokens;   // id -> token text (byte-level form)
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined,
                                     // 5 unused, 6 byte; all 1 when the file has none
  std::vector<std::string> merges;   // "left right", highest priority first
  int bos_id = -1, eos_id = -1, eot_id = -1, pad_id = -1, mask_id = -1, unk_id = -1;
  bool add_bos = false, add_eos = false;
  std::string chat_template;  // tokenizer.chat_template, empty when absent
};

// Throws Error naming the file and key when the vocabulary is missing or inconsistent
// (token types or special ids outside the vocabulary, merges that are not "a b").
GgufVocab ReadGgufVocab(const GgufMetadata& metadata);

}  // namespace polestar
