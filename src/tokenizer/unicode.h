// UTF-8 and Unicode helpers for the tokenizer: strict decoding with the standard
// replacement policy, whitespace classes of the reference implementations, GPT-2's
// byte <-> character map, and Unicode normalization (ICU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polestar::unicode {

constexpr char32_t kReplacement = 0xFFFD;

enum class Utf8Status { kOk, kInvalid, kIncomplete };

struct Utf8Step {
  Utf8Status status;
  // kOk: bytes of the code point. kInvalid: bytes of the maximal ill-formed subpart (>= 1),
  // which becomes one U+FFFD. kIncomplete: bytes of a valid prefix cut by the end of input.
  size_t length;
  char32_t code_point;  // valid for kOk only
};

// Reads one UTF-8 sequence at text[pos] (pos < text.size()), following Unicode's
// "maximal subpart" practice (the WHATWG decoder and Python's errors="replace" do the same).
Utf8Step DecodeUtf8(std::string_view text, size_t pos);
void AppendUtf8(std::string& out, char32_t code_point);
bool IsValidUtf8(std::string_view text);
// The UTF-8 sequences of `text` in order (an ill-formed subpart is one of them, as DecodeUtf8
// reads it): JavaScript's Array.from(string) on valid text.
std::vector<std::string_view> CodePoints(std::string_view text);
// Every ill-formed subsequence becomes U+FFFD; an incomplete tail too.
std::string ToValidUtf8(std::string_view bytes);

// JavaScript's \s (WhiteSpace + LineTerminator): the whitespace of the reference tokenizer
// (transformers.js) for regex \s and for lstrip/rstrip of added tokens.
bool IsJsWhitespace(char32_t c);
// Python's str.isspace(), which Jinja's `trim` filter uses in chat templates.
bool IsPythonWhitespace(char32_t c);

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100 + n in byte order.
char32_t ByteToChar(uint8_t byte);
// Inverse of ByteToChar; -1 for characters that no byte maps to.
int CharToByte(char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 text. Throws Error if ICU fails.
std::string Normalize(std::string_view text, NormalForm form);

}  // namespace polestar::unicode
