#include "server/utf8.h"

namespace polestar {
namespace {

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed character at text[i], or 0 when ill-formed or cut short
// (Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
size_t WellFormedLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  const size_t length = Utf8SequenceLength(lead);
  if (length == 1 || i + length > text.size()) return 0;
  const unsigned char second = byte(1);
  unsigned char low = 0x80, high = 0xBF;
  if (lead == 0xE0) low = 0xA0;
  if (lead == 0xED) high = 0x9F;
  if (lead == 0xF0) low = 0x90;
  if (lead == 0xF4) high = 0x8F;
  if (second < low || second > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (!IsContinuation(byte(k))) return 0;
  }
  return length;
}

}  // namespace

size_t Utf8SequenceLength(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = WellFormedLength(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

size_t Utf8CharCount(std::string_view text) {
  size_t count = 0;
  for (char c : text) count += !IsContinuation(static_cast<unsigned char>(c));
  return count;
}

size_t IncompleteUtf8Tail(std::string_view text) {
  // Walk back over at most three continuation bytes to a lead byte.
  for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if (IsContinuation(c)) continue;
    const size_t length = Utf8SequenceLength(c);
    if (length <= back) return 0;  // complete, or not a lead byte at all
    // A prefix of a character only if what arrived so far could still be well formed.
    std::string_view tail = text.substr(text.size() - back);
    std::string padded(tail);
    padded.append(length - back, '\x80');
    if (c == 0xE0 && back == 1) padded[1] = '\xA0';
    if (c == 0xF0 && back == 1) padded[1] = '\x90';
    return WellFormedLength(padded, 0) == length ? back : 0;
  }
  return 0;
}

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = WellFormedLength(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

}  // namespace polestar
