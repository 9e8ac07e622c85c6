// GGUF's value types, metadata values and their typed getters, and ggml's tensor types.
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

}  // namespace polestar
