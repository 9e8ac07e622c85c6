// GGUF's value types, metadata values and their typed getters, and ggml's tensor types.
#include <cstring>
#include <iterator>
#include <limits>

#include "base/error.h"
#include "io/gguf.h"
#include "io/gguf_layout.h"

namespace polestar {
namespace {

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

}  // namespace

const GgmlType* FindGgmlType(uint32_t id) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

uint32_t GgmlTypeId(DType type) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.supported && t.dtype == type) return t.id;
  }
  PS_CHECK(false);
  return 0;
}

const char* GgufTypeName(GgufType type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto index = uint32_t(type);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

size_t GgufScalarBytes(GgufType type) {
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
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

size_t GgufArray::size() const {
  if (element_type == GgufType::kString) return ends.size();
  if (element_type == GgufType::kArray) return arrays.size();
  return packed.size() / GgufScalarBytes(element_type);
}

std::string_view GgufArray::StringAt(size_t i) const {
  PS_CHECK(element_type == GgufType::kString && i < ends.size());
  const size_t begin = i == 0 ? 0 : size_t(ends[i - 1]);
  return std::string_view(blob).substr(begin, size_t(ends[i]) - begin);
}

namespace {

template <typename T>
T Unpack(const std::vector<uint8_t>& packed, size_t i) {
  T value;
  std::memcpy(&value, packed.data() + i * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
GgufValue PackedArray(GgufType element_type, const std::vector<T>& values) {
  GgufArray array;
  array.element_type = element_type;
  array.packed.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(array.packed.data(), values.data(), array.packed.size());
  return {GgufType::kArray, std::move(array)};
}

}  // namespace

GgufValue GgufArray::At(size_t i) const {
  PS_CHECK(i < size());
  switch (element_type) {
    case GgufType::kU8:
      return {element_type, uint64_t{Unpack<uint8_t>(packed, i)}};
    case GgufType::kU16:
      return {element_type, uint64_t{Unpack<uint16_t>(packed, i)}};
    case GgufType::kU32:
      return {element_type, uint64_t{Unpack<uint32_t>(packed, i)}};
    case GgufType::kU64:
      return {element_type, Unpack<uint64_t>(packed, i)};
    case GgufType::kI8:
      return {element_type, int64_t{Unpack<int8_t>(packed, i)}};
    case GgufType::kI16:
      return {element_type, int64_t{Unpack<int16_t>(packed, i)}};
    case GgufType::kI32:
      return {element_type, int64_t{Unpack<int32_t>(packed, i)}};
    case GgufType::kI64:
      return {element_type, Unpack<int64_t>(packed, i)};
    case GgufType::kF32:
      return {element_type, double{Unpack<float>(packed, i)}};
    case GgufType::kF64:
      return {element_type, Unpack<double>(packed, i)};
    case GgufType::kBool:
      return {element_type, packed[i] != 0};
    case GgufType::kString:
      return GgufValue::String(std::string(StringAt(i)));
    case GgufType::kArray:
      return arrays[i];
  }
  PS_CHECK(false);
  return {};
}

GgufValue GgufValue::U32(uint32_t v) { return {GgufType::kU32, uint64_t{v}}; }
GgufValue GgufValue::I32(int32_t v) { return {GgufType::kI32, int64_t{v}}; }
GgufValue GgufValue::U64(uint64_t v) { return {GgufType::kU64, v}; }
GgufValue GgufValue::F32(float v) { return {GgufType::kF32, double{v}}; }
GgufValue GgufValue::Bool(bool v) { return {GgufType::kBool, v}; }
GgufValue GgufValue::String(std::string v) { return {GgufType::kString, std::move(v)}; }
GgufValue GgufValue::Strings(const std::vector<std::string>& v) {
  GgufArray array;
  array.element_type = GgufType::kString;
  array.ends.reserve(v.size());
  for (const std::string& s : v) {
    array.blob += s;
    array.ends.push_back(array.blob.size());
  }
  return {GgufType::kArray, std::move(array)};
}
GgufValue GgufValue::I32s(const std::vector<int32_t>& v) { return PackedArray(GgufType::kI32, v); }
GgufValue GgufValue::F32s(const std::vector<float>& v) { return PackedArray(GgufType::kF32, v); }
GgufValue GgufValue::Arrays(std::vector<GgufValue> v) {
  GgufArray array;
  array.element_type = GgufType::kArray;
  for (const GgufValue& e : v) PS_CHECK(e.type == GgufType::kArray);
  array.arrays = std::move(v);
  return {GgufType::kArray, std::move(array)};
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
  if (v.type != GgufType::kArray || v.array().element_type != GgufType::kString) {
    Fail(origin_, ": metadata key '", key, "' is not an array of strings");
  }
  const GgufArray& array = v.array();
  std::vector<std::string> out;
  out.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) out.emplace_back(array.StringAt(i));
  return out;
}

std::vector<int64_t> GgufMetadata::GetInts(const std::string& key) const {
  const GgufValue& v = Get(key, "an array of integers");
  const GgufType element = v.type == GgufType::kArray ? v.array().element_type : GgufType::kArray;
  const bool integer = element != GgufType::kF32 && element != GgufType::kF64 &&
                       element != GgufType::kBool && element != GgufType::kString &&
                       element != GgufType::kArray;
  if (!integer) Fail(origin_, ": metadata key '", key, "' is not an array of integers");
  const GgufArray& array = v.array();
  std::vector<int64_t> out;
  out.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const GgufValue e = array.At(i);
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
  const GgufType element = v.type == GgufType::kArray ? v.array().element_type : GgufType::kArray;
  if (element == GgufType::kBool || element == GgufType::kString || element == GgufType::kArray) {
    Fail(origin_, ": metadata key '", key, "' is not an array of numbers");
  }
  const GgufArray& array = v.array();
  std::vector<double> out;
  out.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const GgufValue e = array.At(i);
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

}  // namespace polestar
