// Parsing and validating a GGUF file, and adding its tensors to a TensorStore.
#include <algorithm>
#include <cstring>
#include <set>

#include "base/error.h"
#include "io/gguf.h"
#include "io/gguf_layout.h"

namespace polestar {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;
constexpr uint64_t kMaxElements = uint64_t{1} << 48;

// Reads little-endian values from a byte range, failing with the file name and offset
// instead of reading past the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& origin)
      : data_(data), size_(size), origin_(origin) {}

  size_t position() const { return position_; }
  size_t remaining() const { return size_ - position_; }

  template <typename T>
  T Read(const std::string& what) {
    if (remaining() < sizeof(T)) {
      Fail(origin_, ": truncated file: ", what, " at byte ", position_, " needs ", sizeof(T),
           " bytes, ", remaining(), " left");
    }
    T value;
    std::memcpy(&value, data_ + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }

  // The bytes of a string, in the file.
  std::string_view ReadStringView(const std::string& what) {
    const uint64_t length = Read<uint64_t>(what + " length");
    if (length > remaining()) {
      Fail(origin_, ": ", what, " at byte ", position_ - 8, " claims ", length, " bytes, ",
           remaining(), " left in the file");
    }
    return {reinterpret_cast<const char*>(ReadBytes(size_t(length))), size_t(length)};
  }
  std::string ReadString(const std::string& what) { return std::string(ReadStringView(what)); }

  // `bytes` the caller has checked are left.
  const uint8_t* ReadBytes(size_t bytes) {
    PS_CHECK(bytes <= remaining());
    const uint8_t* at = data_ + position_;
    position_ += bytes;
    return at;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
  const std::string& origin_;
};

bool IsKnownValueType(uint32_t type) { return type <= uint32_t(GgufType::kF64); }

// Smallest encoding of one value of `type`, to bound array counts by the bytes left.
size_t MinValueBytes(GgufType type) {
  if (type == GgufType::kString) return 8;  // the length
  if (type == GgufType::kArray) return 12;  // element type and count
  return GgufScalarBytes(type);
}

GgufValue ReadValue(Cursor& in, GgufType type, const std::string& key, int depth,
                    const std::string& origin) {
  GgufValue value;
  value.type = type;
  switch (type) {
    case GgufType::kU8:
      value.data = uint64_t{in.Read<uint8_t>(key)};
      break;
    case GgufType::kU16:
      value.data = uint64_t{in.Read<uint16_t>(key)};
      break;
    case GgufType::kU32:
      value.data = uint64_t{in.Read<uint32_t>(key)};
      break;
    case GgufType::kU64:
      value.data = in.Read<uint64_t>(key);
      break;
    case GgufType::kI8:
      value.data = int64_t{in.Read<int8_t>(key)};
      break;
    case GgufType::kI16:
      value.data = int64_t{in.Read<int16_t>(key)};
      break;
    case GgufType::kI32:
      value.data = int64_t{in.Read<int32_t>(key)};
      break;
    case GgufType::kI64:
      value.data = in.Read<int64_t>(key);
      break;
    case GgufType::kF32:
      value.data = double{in.Read<float>(key)};
      break;
    case GgufType::kF64:
      value.data = in.Read<double>(key);
      break;
    case GgufType::kBool:
      value.data = in.Read<uint8_t>(key) != 0;
      break;
    case GgufType::kString:
      value.data = in.ReadString("value of " + key);
      break;
    case GgufType::kArray: {
      GgufArray array;
      const uint32_t element = in.Read<uint32_t>("element type of " + key);
      if (!IsKnownValueType(element)) {
        Fail(origin, ": key '", key, "': unknown array element type ", element);
      }
      array.element_type = GgufType(element);
      if (array.element_type == GgufType::kArray && depth >= kMaxArrayDepth) {
        Fail(origin, ": key '", key, "': arrays nested deeper than ", kMaxArrayDepth);
      }
      const uint64_t count = in.Read<uint64_t>("element count of " + key);
      if (count > in.remaining() / MinValueBytes(array.element_type)) {
        Fail(origin, ": key '", key, "': array of ", count, " ", GgufTypeName(array.element_type),
             " values does not fit in the ", in.remaining(), " bytes left");
      }
      // Numbers and strings then take no more memory than their bytes in the file; an array
      // of arrays, at most sizeof(GgufValue) for each 12 bytes.
      if (const size_t width = GgufScalarBytes(array.element_type); width > 0) {
        const uint8_t* packed = in.ReadBytes(size_t(count) * width);
        array.packed.assign(packed, packed + size_t(count) * width);
        if (array.element_type == GgufType::kBool) {
          for (uint8_t& b : array.packed) b = b != 0;
        }
      } else if (array.element_type == GgufType::kString) {
        const std::string what = "value of " + key;
        array.ends.reserve(size_t(count));
        for (uint64_t i = 0; i < count; ++i) {
          array.blob += in.ReadStringView(what);
          array.ends.push_back(array.blob.size());
        }
        array.blob.shrink_to_fit();
      } else {
        array.arrays.reserve(size_t(count));
        for (uint64_t i = 0; i < count; ++i) {
          array.arrays.push_back(ReadValue(in, array.element_type, key, depth + 1, origin));
        }
      }
      value.data = std::move(array);
      break;
    }
  }
  return value;
}

std::string NeText(const std::vector<int64_t>& ne) {
  std::string text = "[";
  for (size_t i = 0; i < ne.size(); ++i) text += (i ? ", " : "") + std::to_string(ne[i]);
  return text + "]";
}

GgufTensorInfo ReadTensorInfo(Cursor& in, size_t index, const std::string& origin) {
  GgufTensorInfo info;
  info.name = in.ReadString(Cat("name of tensor ", index));
  if (info.name.size() > kGgufMaxNameBytes) {
    Fail(origin, ": tensor ", index, " has a name of ", info.name.size(), " bytes (at most ",
         kGgufMaxNameBytes, ")");
  }
  const std::string where = origin + ": tensor '" + info.name + "'";
  const uint32_t dims = in.Read<uint32_t>(Cat("dimension count of tensor ", index));
  if (dims < 1 || dims > kMaxDims) Fail(where, ": ", dims, " dimensions (1 to 4 supported)");
  uint64_t elements = 1;
  for (uint32_t d = 0; d < dims; ++d) {
    const uint64_t extent = in.Read<uint64_t>(Cat("shape of tensor ", index));
    if (extent > kMaxElements || (extent != 0 && elements > kMaxElements / extent)) {
      Fail(where, ": shape is too large (dimension ", d, " is ", extent, ")");
    }
    elements *= extent;
    info.ne.push_back(int64_t(extent));
  }
  info.ggml_type = in.Read<uint32_t>(Cat("type of tensor ", index));
  info.offset = in.Read<uint64_t>(Cat("offset of tensor ", index));
  const GgmlType* type = FindGgmlType(info.ggml_type);
  if (type == nullptr) Fail(where, ": unknown ggml tensor type ", info.ggml_type);
  if (!type->supported) {
    Fail(where, ": tensor type ", type->name, " (ggml type ", info.ggml_type,
         ") is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K are)");
  }
  info.dtype = type->dtype;
  if (info.ne[0] % BlockSize(info.dtype) != 0) {
    Fail(where, ": first dimension ", info.ne[0], " is not a multiple of the ", type->name,
         " block size ", BlockSize(info.dtype));
  }
  info.bytes = elements / uint64_t(BlockSize(info.dtype)) * uint64_t(BlockBytes(info.dtype));
  return info;
}

}  // namespace

GgufFile ParseGguf(const uint8_t* data, size_t size, const std::string& origin) {
  Cursor in(data, size, origin);
  GgufFile file;
  file.metadata = GgufMetadata(origin);
  const uint32_t magic = in.Read<uint32_t>("magic");
  if (magic != kGgufMagic) {
    Fail(origin, ": not a GGUF file (the first four bytes are not \"GGUF\")");
  }
  file.version = in.Read<uint32_t>("version");
  if (file.version != 2 && file.version != 3) {
    Fail(origin, ": GGUF version ", file.version, " is not supported (2 and 3 are)");
  }
  const uint64_t tensor_count = in.Read<uint64_t>("tensor count");
  const uint64_t kv_count = in.Read<uint64_t>("metadata count");
  // Each key/value takes at least 13 bytes and each tensor info at least 32.
  if (kv_count > in.remaining() / 13) {
    Fail(origin, ": metadata count ", kv_count, " cannot fit in a file of ", size, " bytes");
  }
  if (tensor_count > in.remaining() / 32) {
    Fail(origin, ": tensor count ", tensor_count, " cannot fit in a file of ", size, " bytes");
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key = in.ReadString(Cat("key of metadata entry ", i));
    const uint32_t type = in.Read<uint32_t>("value type of " + key);
    if (!IsKnownValueType(type)) Fail(origin, ": key '", key, "' has unknown value type ", type);
    file.metadata.Add(key, ReadValue(in, GgufType(type), key, 0, origin));
  }
  if (const GgufValue* alignment = file.metadata.Find("general.alignment")) {
    const auto* value = std::get_if<uint64_t>(&alignment->data);
    if (alignment->type != GgufType::kU32 || *value == 0 || (*value & (*value - 1)) != 0) {
      Fail(origin, ": general.alignment must be a u32 power of two");
    }
    file.alignment = *value;
  } else {
    file.alignment = kGgufDefaultAlignment;
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    file.tensors.push_back(ReadTensorInfo(in, size_t(i), origin));
    if (!names.insert(file.tensors.back().name).second) {
      Fail(origin, ": tensor '", file.tensors.back().name, "' appears twice");
    }
  }
  file.data_offset = (in.position() + file.alignment - 1) / file.alignment * file.alignment;
  // The data section may be empty, but it starts inside the file: a tensor's address, even an
  // empty one's, lies within the mapping.
  if (!file.tensors.empty() && file.data_offset > size) {
    Fail(origin, ": the tensor data would start at byte ", file.data_offset,
         ", past the end of the ", size, "-byte file (truncated file?)");
  }
  const uint64_t data_bytes = size - std::min<uint64_t>(size, file.data_offset);

  std::vector<std::pair<uint64_t, uint64_t>> extents;  // [begin, end) per tensor
  for (const GgufTensorInfo& t : file.tensors) {
    const std::string where = origin + ": tensor '" + t.name + "'";
    if (t.offset % file.alignment != 0) {
      Fail(where, ": offset ", t.offset, " is not a multiple of the alignment ", file.alignment);
    }
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset) {
      Fail(where, " (", NeText(t.ne), ", ", t.bytes, " bytes at data offset ", t.offset,
           ") extends past the end of the file (truncated file?)");
    }
    extents.emplace_back(t.offset, t.offset + t.bytes);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second) Fail(origin, ": tensor data regions overlap");
  }
  return file;
}

GgufFile ReadGgufFile(const std::string& path, TensorStore& store) {
  const MappedFile& mapped = store.AddFile(path);
  GgufFile file = ParseGguf(mapped.data(), mapped.size(), path);
  for (const GgufTensorInfo& info : file.tensors) {
    TensorRef tensor;
    tensor.name = info.name;
    tensor.dtype = info.dtype;
    tensor.shape.assign(info.ne.rbegin(), info.ne.rend());
    tensor.data = mapped.data() + file.data_offset + info.offset;
    tensor.bytes = size_t(info.bytes);
    tensor.file = &mapped.path();
    store.Add(std::move(tensor));
  }
  return file;
}

}  // namespace polestar
