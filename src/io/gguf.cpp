#include "io/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>

#include "base/error.h"
#include "io/atomic_file.h"

namespace polestar {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxNameBytes = 63;  // ggml's GGML_MAX_NAME (64) less the terminator
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

  std::string ReadString(const std::string& what) {
    const uint64_t length = Read<uint64_t>(what + " length");
    if (length > remaining()) {
      Fail(origin_, ": ", what, " at byte ", position_ - 8, " claims ", length, " bytes, ",
           remaining(), " left in the file");
    }
    std::string text(reinterpret_cast<const char*>(data_ + position_), size_t(length));
    position_ += size_t(length);
    return text;
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
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kString:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
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
      const uint32_t element = in.Read<uint32_t>("element type of " + key);
      if (!IsKnownValueType(element)) {
        Fail(origin, ": key '", key, "': unknown array element type ", element);
      }
      value.element_type = GgufType(element);
      if (value.element_type == GgufType::kArray && depth >= kMaxArrayDepth) {
        Fail(origin, ": key '", key, "': arrays nested deeper than ", kMaxArrayDepth);
      }
      const uint64_t count = in.Read<uint64_t>("element count of " + key);
      if (count > in.remaining() / MinValueBytes(value.element_type)) {
        Fail(origin, ": key '", key, "': array of ", count, " ", GgufTypeName(value.element_type),
             " values does not fit in the ", in.remaining(), " bytes left");
      }
      std::vector<GgufValue> elements;
      elements.reserve(size_t(count));
      for (uint64_t i = 0; i < count; ++i) {
        elements.push_back(ReadValue(in, value.element_type, key, depth + 1, origin));
      }
      value.data = std::move(elements);
      break;
    }
  }
  return value;
}

struct GgmlType {
  uint32_t id;
  const char* name;
  bool supported;
  DType dtype;
};

// ggml's type ids (ggml.h), so unsupported types are named in errors.
constexpr GgmlType kGgmlTypes[] = {
    {0, "F32", true, DType::kF32},       {1, "F16", true, DType::kF16},
    {2, "Q4_0", true, DType::kQ4_0},     {3, "Q4_1", false, DType::kF32},
    {6, "Q5_0", false, DType::kF32},     {7, "Q5_1", false, DType::kF32},
    {8, "Q8_0", true, DType::kQ8_0},     {9, "Q8_1", false, DType::kF32},
    {10, "Q2_K", false, DType::kF32},    {11, "Q3_K", false, DType::kF32},
    {12, "Q4_K", true, DType::kQ4_K},    {13, "Q5_K", true, DType::kQ5_K},
    {14, "Q6_K", true, DType::kQ6_K},    {15, "Q8_K", false, DType::kF32},
    {16, "IQ2_XXS", false, DType::kF32}, {17, "IQ2_XS", false, DType::kF32},
    {18, "IQ3_XXS", false, DType::kF32}, {19, "IQ1_S", false, DType::kF32},
    {20, "IQ4_NL", false, DType::kF32},  {21, "IQ3_S", false, DType::kF32},
    {22, "IQ2_S", false, DType::kF32},   {23, "IQ4_XS", false, DType::kF32},
    {24, "I8", false, DType::kF32},      {25, "I16", false, DType::kF32},
    {26, "I32", true, DType::kI32},      {27, "I64", true, DType::kI64},
    {28, "F64", false, DType::kF32},     {29, "IQ1_M", false, DType::kF32},
    {30, "BF16", true, DType::kBF16},    {34, "TQ1_0", false, DType::kF32},
    {35, "TQ2_0", false, DType::kF32},   {39, "MXFP4", false, DType::kF32},
};

const GgmlType* FindGgmlType(uint32_t id) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::string NeText(const std::vector<int64_t>& ne) {
  std::string text = "[";
  for (size_t i = 0; i < ne.size(); ++i) text += (i ? ", " : "") + std::to_string(ne[i]);
  return text + "]";
}

GgufTensorInfo ReadTensorInfo(Cursor& in, size_t index, const std::string& origin) {
  GgufTensorInfo info;
  info.name = in.ReadString(Cat("name of tensor ", index));
  if (info.name.size() > kMaxNameBytes) {
    Fail(origin, ": tensor ", index, " has a name of ", info.name.size(), " bytes (at most ",
         kMaxNameBytes, ")");
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

const char* GgufTypeName(GgufType type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto index = uint32_t(type);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

GgufValue GgufValue::U32(uint32_t v) { return {GgufType::kU32, GgufType::kU8, uint64_t{v}}; }
GgufValue GgufValue::I32(int32_t v) { return {GgufType::kI32, GgufType::kU8, int64_t{v}}; }
GgufValue GgufValue::U64(uint64_t v) { return {GgufType::kU64, GgufType::kU8, v}; }
GgufValue GgufValue::F32(float v) { return {GgufType::kF32, GgufType::kU8, double{v}}; }
GgufValue GgufValue::Bool(bool v) { return {GgufType::kBool, GgufType::kU8, v}; }
GgufValue GgufValue::String(std::string v) {
  return {GgufType::kString, GgufType::kU8, std::move(v)};
}
GgufValue GgufValue::Strings(const std::vector<std::string>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const std::string& s : v) elements.push_back(String(s));
  return {GgufType::kArray, GgufType::kString, std::move(elements)};
}
GgufValue GgufValue::I32s(const std::vector<int32_t>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (int32_t x : v) elements.push_back(I32(x));
  return {GgufType::kArray, GgufType::kI32, std::move(elements)};
}
GgufValue GgufValue::F32s(const std::vector<float>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (float x : v) elements.push_back(F32(x));
  return {GgufType::kArray, GgufType::kF32, std::move(elements)};
}

const GgufValue* GgufMetadata::Find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void GgufMetadata::Add(const std::string& key, GgufValue value) {
  if (index_.count(key)) Fail(origin_, ": metadata key '", key, "' appears twice");
  index_.emplace(key, entries_.size());
  entries_.emplace_back(key, std::move(value));
}

const GgufValue& GgufMetadata::Get(const std::string& key, const char* expected) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) Fail(origin_, ": missing metadata key '", key, "' (", expected, ")");
  return *value;
}

int64_t GgufMetadata::GetInt(const std::string& key) const {
  const GgufValue& v = Get(key, "an integer");
  if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > uint64_t(std::numeric_limits<int64_t>::max())) {
      Fail(origin_, ": metadata key '", key, "' = ", *u, " is out of range");
    }
    return int64_t(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v.data)) return *i;
  Fail(origin_, ": metadata key '", key, "' is a ", GgufTypeName(v.type), ", expected an integer");
}

uint64_t GgufMetadata::GetUint(const std::string& key) const {
  const int64_t value = GetInt(key);
  if (value < 0) Fail(origin_, ": metadata key '", key, "' = ", value, " must not be negative");
  return uint64_t(value);
}

double GgufMetadata::GetFloat(const std::string& key) const {
  const GgufValue& v = Get(key, "a number");
  if (const auto* d = std::get_if<double>(&v.data)) return *d;
  if (v.type != GgufType::kBool && v.type != GgufType::kString && v.type != GgufType::kArray) {
    return double(GetInt(key));
  }
  Fail(origin_, ": metadata key '", key, "' is a ", GgufTypeName(v.type), ", expected a number");
}

bool GgufMetadata::GetBool(const std::string& key) const {
  const GgufValue& v = Get(key, "a bool");
  if (const auto* b = std::get_if<bool>(&v.data)) return *b;
  Fail(origin_, ": metadata key '", key, "' is a ", GgufTypeName(v.type), ", expected a bool");
}

const std::string& GgufMetadata::GetString(const std::string& key) const {
  const GgufValue& v = Get(key, "a string");
  if (const auto* s = std::get_if<std::string>(&v.data)) return *s;
  Fail(origin_, ": metadata key '", key, "' is a ", GgufTypeName(v.type), ", expected a string");
}

std::vector<std::string> GgufMetadata::GetStrings(const std::string& key) const {
  const GgufValue& v = Get(key, "an array of strings");
  if (v.type != GgufType::kArray || v.element_type != GgufType::kString) {
    Fail(origin_, ": metadata key '", key, "' is not an array of strings");
  }
  std::vector<std::string> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    out.push_back(std::get<std::string>(e.data));
  }
  return out;
}

std::vector<int64_t> GgufMetadata::GetInts(const std::string& key) const {
  const GgufValue& v = Get(key, "an array of integers");
  const bool integer = v.element_type != GgufType::kF32 && v.element_type != GgufType::kF64 &&
                       v.element_type != GgufType::kBool && v.element_type != GgufType::kString &&
                       v.element_type != GgufType::kArray;
  if (v.type != GgufType::kArray || !integer) {
    Fail(origin_, ": metadata key '", key, "' is not an array of integers");
  }
  std::vector<int64_t> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    if (const auto* u = std::get_if<uint64_t>(&e.data)) {
      if (*u > uint64_t(std::numeric_limits<int64_t>::max())) {
        Fail(origin_, ": metadata key '", key, "' holds the out-of-range value ", *u);
      }
      out.push_back(int64_t(*u));
    } else {
      out.push_back(std::get<int64_t>(e.data));
    }
  }
  return out;
}

std::vector<double> GgufMetadata::GetFloats(const std::string& key) const {
  const GgufValue& v = Get(key, "an array of numbers");
  if (v.type != GgufType::kArray || v.element_type == GgufType::kBool ||
      v.element_type == GgufType::kString || v.element_type == GgufType::kArray) {
    Fail(origin_, ": metadata key '", key, "' is not an array of numbers");
  }
  std::vector<double> out;
  for (const GgufValue& e : std::get<std::vector<GgufValue>>(v.data)) {
    if (const auto* d = std::get_if<double>(&e.data)) {
      out.push_back(*d);
    } else if (const auto* u = std::get_if<uint64_t>(&e.data)) {
      out.push_back(double(*u));
    } else {
      out.push_back(double(std::get<int64_t>(e.data)));
    }
  }
  return out;
}

GgufFile ParseGguf(const uint8_t* data, size_t size, const std::string& origin) {
  Cursor in(data, size, origin);
  GgufFile file;
  file.metadata = GgufMetadata(origin);
  const uint32_t magic = in.Read<uint32_t>("magic");
  if (magic != kMagic) {
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
    file.alignment = kDefaultAlignment;
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    file.tensors.push_back(ReadTensorInfo(in, size_t(i), origin));
    if (!names.insert(file.tensors.back().name).second) {
      Fail(origin, ": tensor '", file.tensors.back().name, "' appears twice");
    }
  }
  file.data_offset = (in.position() + file.alignment - 1) / file.alignment * file.alignment;
  const uint64_t data_bytes = size > file.data_offset ? size - file.data_offset : 0;

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

uint32_t GgmlTypeId(DType type) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.supported && t.dtype == type) return t.id;
  }
  PS_CHECK(false);
  return 0;
}

// --- writing ---

namespace {

void Append(std::string& out, const void* data, size_t bytes) {
  out.append(static_cast<const char*>(data), bytes);
}

template <typename T>
void AppendScalar(std::string& out, T value) {
  Append(out, &value, sizeof(T));
}

void AppendString(std::string& out, const std::string& text) {
  AppendScalar<uint64_t>(out, text.size());
  out += text;
}

void AppendValue(std::string& out, const GgufValue& v) {
  auto as_unsigned = [&] { return std::get<uint64_t>(v.data); };
  auto as_signed = [&] { return std::get<int64_t>(v.data); };
  switch (v.type) {
    case GgufType::kU8:
      AppendScalar(out, uint8_t(as_unsigned()));
      break;
    case GgufType::kU16:
      AppendScalar(out, uint16_t(as_unsigned()));
      break;
    case GgufType::kU32:
      AppendScalar(out, uint32_t(as_unsigned()));
      break;
    case GgufType::kU64:
      AppendScalar(out, as_unsigned());
      break;
    case GgufType::kI8:
      AppendScalar(out, int8_t(as_signed()));
      break;
    case GgufType::kI16:
      AppendScalar(out, int16_t(as_signed()));
      break;
    case GgufType::kI32:
      AppendScalar(out, int32_t(as_signed()));
      break;
    case GgufType::kI64:
      AppendScalar(out, as_signed());
      break;
    case GgufType::kF32:
      AppendScalar(out, float(std::get<double>(v.data)));
      break;
    case GgufType::kF64:
      AppendScalar(out, std::get<double>(v.data));
      break;
    case GgufType::kBool:
      AppendScalar(out, uint8_t(std::get<bool>(v.data) ? 1 : 0));
      break;
    case GgufType::kString:
      AppendString(out, std::get<std::string>(v.data));
      break;
    case GgufType::kArray: {
      const auto& elements = std::get<std::vector<GgufValue>>(v.data);
      AppendScalar(out, uint32_t(v.element_type));
      AppendScalar<uint64_t>(out, elements.size());
      for (const GgufValue& e : elements) AppendValue(out, e);
      break;
    }
  }
}

}  // namespace

void GgufWriter::AddTensor(const std::string& name, DType type, const std::vector<int64_t>& shape) {
  PS_CHECK(file_ == nullptr && name.size() <= kMaxNameBytes && !shape.empty());
  GgufTensorInfo info;
  info.name = name;
  info.dtype = type;
  info.ggml_type = GgmlTypeId(type);
  info.ne.assign(shape.rbegin(), shape.rend());
  PS_CHECK(info.ne[0] % BlockSize(type) == 0);
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  info.bytes = uint64_t(elements / BlockSize(type) * BlockBytes(type));
  info.offset = 0;
  if (!tensors_.empty()) {
    const GgufTensorInfo& last = tensors_.back();
    info.offset =
        (last.offset + last.bytes + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
  }
  tensors_.push_back(std::move(info));
}

void GgufWriter::Open(const std::string& path) {
  PS_CHECK(file_ == nullptr);
  PS_CHECK(!metadata_.Has("general.alignment") ||
           metadata_.GetUint("general.alignment") == kDefaultAlignment);
  std::string header;
  AppendScalar(header, kMagic);
  AppendScalar<uint32_t>(header, 3);
  AppendScalar<uint64_t>(header, tensors_.size());
  AppendScalar<uint64_t>(header, metadata_.entries().size());
  for (const auto& [key, value] : metadata_.entries()) {
    AppendString(header, key);
    AppendScalar(header, uint32_t(value.type));
    AppendValue(header, value);
  }
  for (const GgufTensorInfo& t : tensors_) {
    AppendString(header, t.name);
    AppendScalar<uint32_t>(header, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) AppendScalar<uint64_t>(header, uint64_t(d));
    AppendScalar(header, t.ggml_type);
    AppendScalar(header, t.offset);
  }
  header.resize((header.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment,
                '\0');
  file_ = std::make_unique<AtomicFile>(path);
  file_->Write(header);
  position_ = 0;
  written_ = 0;
}

void GgufWriter::WriteTensorData(const uint8_t* data, size_t bytes) {
  PS_CHECK(file_ != nullptr && written_ < tensors_.size());
  const GgufTensorInfo& t = tensors_[written_];
  PS_CHECK(bytes == t.bytes);
  static const char kZeros[kDefaultAlignment] = {};
  file_->Write(kZeros, size_t(t.offset - position_));
  file_->Write(data, bytes);
  position_ = t.offset + t.bytes;
  ++written_;
}

void GgufWriter::Close() {
  PS_CHECK(file_ != nullptr && written_ == tensors_.size());
  // llama.cpp's writer pads the last tensor as well.
  static const char kZeros[kDefaultAlignment] = {};
  file_->Write(kZeros,
               size_t((kDefaultAlignment - position_ % kDefaultAlignment) % kDefaultAlignment));
  file_->Commit();
  file_.reset();
}

GgufWriter::~GgufWriter() = default;

// --- vocabulary ---

GgufVocab ReadGgufVocab(const GgufMetadata& m) {
  GgufVocab vocab;
  const std::string& origin = m.origin();
  vocab.model = m.GetString("tokenizer.ggml.model");
  if (m.Has("tokenizer.ggml.pre")) vocab.pre = m.GetString("tokenizer.ggml.pre");
  vocab.tokens = m.GetStrings("tokenizer.ggml.tokens");
  const int64_t size = int64_t(vocab.tokens.size());
  if (m.Has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> types = m.GetInts("tokenizer.ggml.token_type");
    if (int64_t(types.size()) != size) {
      Fail(origin, ": tokenizer.ggml.token_type has ", types.size(), " entries for ", size,
           " tokens");
    }
    for (int64_t t : types) {
      if (t < 0 || t > 6) Fail(origin, ": tokenizer.ggml.token_type holds unknown type ", t);
      vocab.token_types.push_back(int32_t(t));
    }
  } else {
    vocab.token_types.assign(size_t(size), 1);
  }
  if (m.Has("tokenizer.ggml.merges")) {
    vocab.merges = m.GetStrings("tokenizer.ggml.merges");
    for (const std::string& merge : vocab.merges) {
      const size_t space = merge.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == merge.size()) {
        Fail(origin, ": tokenizer.ggml.merges entry '", merge, "' is not of the form 'a b'");
      }
    }
  }
  auto special = [&](const char* key, int* id) {
    if (!m.Has(key)) return;
    const int64_t value = m.GetInt(key);
    if (value < 0 || value >= size) {
      Fail(origin, ": ", key, " = ", value, " lies outside the vocabulary of ", size);
    }
    *id = int(value);
  };
  special("tokenizer.ggml.bos_token_id", &vocab.bos_id);
  special("tokenizer.ggml.eos_token_id", &vocab.eos_id);
  special("tokenizer.ggml.eot_token_id", &vocab.eot_id);
  special("tokenizer.ggml.padding_token_id", &vocab.pad_id);
  special("tokenizer.ggml.mask_token_id", &vocab.mask_id);
  special("tokenizer.ggml.unknown_token_id", &vocab.unk_id);
  if (m.Has("tokenizer.ggml.add_bos_token"))
    vocab.add_bos = m.GetBool("tokenizer.ggml.add_bos_token");
  if (m.Has("tokenizer.ggml.add_eos_token"))
    vocab.add_eos = m.GetBool("tokenizer.ggml.add_eos_token");
  if (m.Has("tokenizer.chat_template"))
    vocab.chat_template = m.GetString("tokenizer.chat_template");
  return vocab;
}

}  // namespace polestar
