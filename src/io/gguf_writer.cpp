// Writing a GGUF v3 file front to back.
#include "base/error.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/gguf_layout.h"

namespace polestar {
namespace {

void Append(std::string& out, const void* data, size_t bytes) {
  out.append(static_cast<const char*>(data), bytes);
}

template <typename T>
void AppendScalar(std::string& out, T value) {
  Append(out, &value, sizeof(T));
}

void AppendString(std::string& out, std::string_view text) {
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
      const GgufArray& array = v.array();
      AppendScalar(out, uint32_t(array.element_type));
      AppendScalar<uint64_t>(out, array.size());
      if (array.element_type == GgufType::kString) {
        for (size_t i = 0; i < array.size(); ++i) AppendString(out, array.StringAt(i));
      } else if (array.element_type == GgufType::kArray) {
        for (const GgufValue& e : array.arrays) AppendValue(out, e);
      } else {
        Append(out, array.packed.data(), array.packed.size());
      }
      break;
    }
  }
}

}  // namespace

void GgufWriter::AddTensor(const std::string& name, DType type, const std::vector<int64_t>& shape) {
  PS_CHECK(file_ == nullptr && name.size() <= kGgufMaxNameBytes && !shape.empty());
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
    info.offset = (last.offset + last.bytes + kGgufDefaultAlignment - 1) / kGgufDefaultAlignment *
                  kGgufDefaultAlignment;
  }
  tensors_.push_back(std::move(info));
}

void GgufWriter::Open(const std::string& path) {
  PS_CHECK(file_ == nullptr);
  PS_CHECK(!metadata_.Has("general.alignment") ||
           metadata_.GetUint("general.alignment") == kGgufDefaultAlignment);
  std::string header;
  AppendScalar(header, kGgufMagic);
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
  header.resize(
      (header.size() + kGgufDefaultAlignment - 1) / kGgufDefaultAlignment * kGgufDefaultAlignment,
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
  static const char kZeros[kGgufDefaultAlignment] = {};
  file_->Write(kZeros, size_t(t.offset - position_));
  file_->Write(data, bytes);
  position_ = t.offset + t.bytes;
  ++written_;
}

void GgufWriter::Close() {
  PS_CHECK(file_ != nullptr && written_ == tensors_.size());
  // llama.cpp's writer pads the last tensor as well.
  static const char kZeros[kGgufDefaultAlignment] = {};
  file_->Write(kZeros, size_t((kGgufDefaultAlignment - position_ % kGgufDefaultAlignment) %
                              kGgufDefaultAlignment));
  file_->Commit();
  file_.reset();
}

GgufWriter::~GgufWriter() = default;

}  // namespace polestar
