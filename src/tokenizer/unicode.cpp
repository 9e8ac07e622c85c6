#include "tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <array>

#include "base/error.h"

namespace polestar::unicode {

namespace {

bool InRange(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

// The byte -> character table of GPT-2's bytes_to_unicode and its inverse over U+0000..U+01FF.
struct ByteCharTables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 512> char_to_byte{};
  ByteCharTables() {
    char_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_char[size_t(b)] = printable ? char32_t(b) : char32_t(256 + extra++);
      char_to_byte[byte_to_char[size_t(b)]] = int16_t(b);
    }
  }
};

const ByteCharTables& Tables() {
  static const ByteCharTables tables;
  return tables;
}

}  // namespace

Utf8Step DecodeUtf8(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const size_t avail = text.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Utf8Status::kOk, 1, b0};
  // Table 3-7 of the Unicode standard: the allowed range of the second byte depends on the
  // first; all later bytes are 80..BF.
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (InRange(b0, 0xC2, 0xDF)) {
    need = 2, cp = b0 & 0x1F;
  } else if (InRange(b0, 0xE0, 0xEF)) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (InRange(b0, 0xF0, 0xF4)) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Status::kInvalid, 1, 0};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= avail) return {Utf8Status::kIncomplete, i, 0};
    const uint8_t b = p[i];
    if (!InRange(b, i == 1 ? lo : 0x80, i == 1 ? hi : 0xBF)) return {Utf8Status::kInvalid, i, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Status::kOk, need, cp};
}

void AppendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::vector<std::string_view> CodePoints(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t at = 0; at < text.size();) {
    const size_t length = DecodeUtf8(text, at).length;
    out.push_back(text.substr(at, length));
    at += length;
  }
  return out;
}

bool IsValidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = DecodeUtf8(text, pos);
    if (step.status != Utf8Status::kOk) return false;
    pos += step.length;
  }
  return true;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Step step = DecodeUtf8(bytes, pos);
    if (step.status == Utf8Status::kOk) {
      out.append(bytes.substr(pos, step.length));
    } else {
      AppendUtf8(out, kReplacement);
    }
    pos += step.length;
  }
  return out;
}

bool IsJsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}

bool IsPythonWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

char32_t ByteToChar(uint8_t byte) { return Tables().byte_to_char[byte]; }

int CharToByte(char32_t c) { return c < 512 ? Tables().char_to_byte[c] : -1; }

std::string Normalize(std::string_view text, NormalForm form) {
  bool ascii = true;
  for (char ch : text) ascii = ascii && static_cast<uint8_t>(ch) < 0x80;
  if (ascii) return std::string(text);  // ASCII is invariant under all four forms
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status)) Fail("ICU normalizer unavailable: ", u_errorName(status));
  if (text.size() > size_t(INT32_MAX))
    Fail("text of ", text.size(), " bytes is too long to normalize");
  const icu::StringPiece source(text.data(), int32_t(text.size()));
  if (normalizer->isNormalizedUTF8(source, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  icu::StringByteSink<std::string> sink(&out);
  normalizer->normalizeUTF8(0, source, sink, nullptr, status);
  if (U_FAILURE(status)) Fail("ICU normalization failed: ", u_errorName(status));
  return out;
}

}  // namespace polestar::unicode
