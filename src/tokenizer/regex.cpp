#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>
#include <vector>

#include "base/error.h"
#include "tokenizer/unicode.h"

namespace polestar {

namespace {

// JavaScript's \s as code point ranges, sorted.
constexpr std::pair<char32_t, char32_t> kJsSpace[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

std::string ClassItem(char32_t lo, char32_t hi) {
  std::string item = Cat("\\x{", std::hex, uint32_t(lo), "}");
  if (hi != lo) item += Cat("-\\x{", std::hex, uint32_t(hi), "}");
  return item;
}

// The members of a bracket class (without brackets) for \s, or for \S when `negate`.
std::string SpaceClassBody(bool negate) {
  std::string body;
  if (!negate) {
    for (const auto& [lo, hi] : kJsSpace) body += ClassItem(lo, hi);
    return body;
  }
  char32_t next = 0;
  for (const auto& [lo, hi] : kJsSpace) {
    if (lo > next) body += ClassItem(next, lo - 1);
    next = hi + 1;
  }
  body += ClassItem(next, 0x10FFFF);
  return body;
}

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
char FlipCase(char c) { return char(c ^ 0x20); }

}  // namespace

std::string TranslateRegex(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  std::vector<bool> groups;  // one per open parenthesis: does it fold case?
  int folding = 0;           // open (?i: groups
  bool in_class = false;
  size_t class_start = 0;  // index of the first member of the current class in `p`
  auto fail = [&](size_t at, const char* what) {
    Fail("regex ", p, ": ", what, " at offset ", at, " is not supported");
  };
  // Copies a {...} block starting at p[i] == '{'; returns the index after '}'.
  auto copy_braces = [&](size_t i) {
    const size_t close = p.find('}', i);
    if (close == std::string_view::npos) fail(i, "unterminated {");
    out.append(p.substr(i, close + 1 - i));
    return close + 1;
  };
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) fail(i, "trailing backslash");
      const char e = p[i + 1];
      if (e == 's' || e == 'S') {
        const std::string body = SpaceClassBody(e == 'S');
        out += in_class ? body : "[" + body + "]";
        i += 2;
      } else if (e == 'u') {
        if (i + 2 < p.size() && p[i + 2] == '{') {
          out += "\\x";
          i = copy_braces(i + 2);
        } else {
          if (i + 6 > p.size() || !IsHex(p[i + 2]) || !IsHex(p[i + 3]) || !IsHex(p[i + 4]) ||
              !IsHex(p[i + 5])) {
            fail(i, "malformed \\u escape");
          }
          out += Cat("\\x{", p.substr(i + 2, 4), "}");
          i += 6;
        }
      } else if ((e == 'p' || e == 'P' || e == 'x') && i + 2 < p.size() && p[i + 2] == '{') {
        out.append(p.substr(i, 2));
        i = copy_braces(i + 2);
      } else {
        // Any other escape, including multi-byte escaped characters, is copied as is.
        const size_t length = unicode::DecodeUtf8(p, i + 1).length;
        out.append(p.substr(i, 1 + length));
        i += 1 + length;
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i != class_start) {
        in_class = false;
        out += c;
        ++i;
      } else if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) fail(i, "unterminated POSIX class");
        out.append(p.substr(i, close + 2 - i));
        i = close + 2;
      } else if (folding > 0 && IsAsciiLetter(c)) {
        out += c;
        out += FlipCase(c);
        ++i;
      } else {
        out += c;
        ++i;
      }
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      class_start = i;
    } else if (c == '(') {
      bool fold = false;
      if (p.substr(i, 4) == "(?i:") {
        fold = true;
        out += "(?:";
        i += 4;
      } else if (i + 2 < p.size() && p[i + 1] == '?' &&
                 (IsAsciiLetter(p[i + 2]) || p[i + 2] == '-') && p[i + 2] != 'P') {
        fail(i, "inline flag group");
      } else {
        out += c;
        ++i;
      }
      groups.push_back(fold);
      folding += fold;
    } else if (c == ')') {
      if (groups.empty()) fail(i, "unbalanced )");
      folding -= groups.back();
      groups.pop_back();
      out += c;
      ++i;
    } else if (c == '.') {
      out += "[^\\n\\r\\x{2028}\\x{2029}]";
      ++i;
    } else if (folding > 0 && IsAsciiLetter(c)) {
      out += '[';
      out += c;
      out += FlipCase(c);
      out += ']';
      ++i;
    } else {
      out += c;
      ++i;
    }
  }
  if (in_class) fail(p.size(), "unterminated [");
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  pcre2_match_context* limits = nullptr;
  bool jit = false;
  ~Code() {
    pcre2_match_context_free(limits);
    pcre2_code_free(code);
  }
};

std::string Regex::Name() const {
  return origin_.empty() ? Cat("regex ", pattern_) : Cat(origin_, ": regex ", pattern_);
}

Regex::Regex(std::string_view pattern, const std::string& origin)
    : origin_(origin), pattern_(pattern), code_(std::make_unique<Code>()) {
  try {
    compiled_ = TranslateRegex(pattern);
  } catch (const Error& e) {
    // TranslateRegex names the pattern; only the caller knows the file.
    if (origin_.empty()) throw;
    Fail(origin_, ": ", e.what());
  }
  code_->limits = pcre2_match_context_create(nullptr);
  if (code_->limits == nullptr) Fail(Name(), ": out of memory");
  pcre2_set_match_limit(code_->limits, kMatchLimit);
  pcre2_set_depth_limit(code_->limits, kMatchLimit);
  pcre2_set_heap_limit(code_->limits, kHeapLimitKib);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_.data()), compiled_.size(),
                              PCRE2_UTF, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    Fail(Name(), ": ", reinterpret_cast<const char*>(message), " (at offset ", offset,
         " of the rewritten pattern ", compiled_, ")");
  }
  // Without JIT (an unsupported CPU) the interpreter gives the same matches, only slower.
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::ForEachMatch(std::string_view text,
                         const std::function<void(size_t, size_t)>& on_match) const {
  struct MatchData {
    pcre2_match_data* data;
    ~MatchData() { pcre2_match_data_free(data); }
  } match{pcre2_match_data_create_from_pattern(code_->code, nullptr)};
  if (match.data == nullptr) Fail(Name(), ": out of memory for a match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), pos, 0, match.data,
                                          code_->limits)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
    // The JIT's fixed stack can run out on long backtracking runs; the interpreter keeps its
    // frames on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK,
                       match.data, code_->limits);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      Fail(Name(), ": matching failed: ", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      pos = end;
    } else {
      // An empty match is dropped and the scan resumes one character later, as matchAll does.
      if (end >= text.size()) return;
      pos = end + unicode::DecodeUtf8(text, end).length;
    }
  }
}

}  // namespace polestar
