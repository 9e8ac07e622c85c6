#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"

namespace polestar {
namespace {

// The reference implementation rejects headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

bool ParseDType(const std::string& name, DType* type) {
  static const std::map<std::string, DType> kTypes = {{"F32", DType::kF32},
                                                      {"F16", DType::kF16},
                                                      {"BF16", DType::kBF16},
                                                      {"I64", DType::kI64},
                                                      {"I32", DType::kI32}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) return false;
  *type = it->second;
  return true;
}

}  // namespace

void ReadSafetensorsFile(const std::string& path, TensorStore& store) {
  const MappedFile& file = store.AddFile(path);
  if (file.size() < 8) Fail(path, ": truncated safetensors file (", file.size(), " bytes)");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  if (header_bytes < 2 || header_bytes > kMaxHeaderBytes || header_bytes > file.size() - 8) {
    Fail(path, ": header length ", header_bytes, " is out of range for a file of ", file.size(),
         " bytes");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.data() + 8, file.data() + 8 + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    Fail(path, ": malformed JSON header: ", e.what());
  }
  if (!header.is_object()) Fail(path, ": header is not a JSON object");

  const uint8_t* buffer = file.data() + 8 + header_bytes;
  const uint64_t buffer_bytes = file.size() - 8 - header_bytes;
  struct Extent {
    uint64_t begin, end;  // [begin, end) in the data buffer
    std::string name;
    bool operator<(const Extent& other) const { return begin < other.begin; }
  };
  std::vector<Extent> extents;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "'";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      Fail(where, ": entry needs string dtype, array shape and two data_offsets");
    }
    TensorRef tensor;
    tensor.name = name;
    tensor.file = &file.path();
    const std::string dtype = info["dtype"];
    if (!ParseDType(dtype, &tensor.dtype)) Fail(where, ": unsupported dtype ", dtype);
    uint64_t elements = 1;
    for (const auto& dim : info["shape"]) {
      if (!dim.is_number_unsigned()) Fail(where, ": shape entries must be non-negative integers");
      const uint64_t d = dim.get<uint64_t>();
      if (d != 0 && elements > (uint64_t{1} << 48) / d) Fail(where, ": shape is too large");
      elements *= d;
      tensor.shape.push_back(int64_t(d));
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      Fail(where, ": data_offsets must be non-negative integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > buffer_bytes) {
      Fail(where, ": data_offsets [", begin, ", ", end, ") lie outside the data buffer of ",
           buffer_bytes, " bytes (truncated file?)");
    }
    const uint64_t expected = elements * uint64_t(BlockBytes(tensor.dtype));
    if (end - begin != expected) {
      Fail(where, ": ", end - begin, " bytes do not match dtype ", dtype, " and shape (", expected,
           " bytes expected)");
    }
    tensor.data = buffer + begin;
    tensor.bytes = end - begin;
    extents.push_back({begin, end, name});
    store.Add(std::move(tensor));
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    const Extent& a = extents[i - 1];
    const Extent& b = extents[i];
    if (b.begin < a.end) {
      Fail(path, ": data of tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name,
           "' [", b.begin, ", ", b.end, ") overlap");
    }
  }
}

TensorStore ReadSafetensorsDir(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorStore store;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    const nlohmann::json json = ReadJsonFile(index.string());
    if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
      Fail(index.string(), ": no weight_map object");
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : json["weight_map"].items()) {
      if (!shard.is_string()) {
        Fail(index.string(), ": weight_map entry for '", tensor, "' is not a file name");
      }
      const std::string name = shard;
      if (name.find('/') != std::string::npos)
        Fail(index.string(), ": shard name ", name, " has a path");
      shards.insert(name);
    }
    store.set_origin(std::to_string(shards.size()) + " safetensors shards in " + dir);
    for (const std::string& shard : shards) {
      const std::string shard_path = (fs::path(dir) / shard).string();
      if (!fs::exists(shard_path)) Fail(shard_path, ": missing, but ", index.string(), " names it");
      ReadSafetensorsFile(shard_path, store);
    }
    for (const auto& [tensor, shard] : json["weight_map"].items()) {
      const TensorRef* found = store.Find(tensor);
      if (found == nullptr)
        Fail(index.string(), ": tensor ", tensor, " is not in shard ", shard.get<std::string>());
    }
  } else if (fs::exists(single)) {
    store.set_origin(single.string());
    ReadSafetensorsFile(single.string(), store);
  } else {
    Fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  return store;
}

void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : sorted) {
    int64_t elements = 1;
    for (int64_t d : t->shape) elements *= d;
    PS_CHECK(uint64_t(elements) * BlockBytes(t->dtype) == t->bytes.size());
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the Python writer aligns the buffer to 8
  AtomicFile out(path);
  const uint64_t length = text.size();
  out.Write(&length, 8);
  out.Write(text);
  for (const TensorToWrite* t : sorted) out.Write(t->bytes.data(), t->bytes.size());
  out.Commit();
}

TensorToWrite F32Tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  TensorToWrite t{std::move(name), DType::kF32, std::move(shape), {}};
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

TensorToWrite I64Tensor(std::string name, std::vector<int64_t> shape,
                        const std::vector<int64_t>& v) {
  TensorToWrite t{std::move(name), DType::kI64, std::move(shape), {}};
  t.bytes.resize(v.size() * 8);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

}  // namespace polestar
