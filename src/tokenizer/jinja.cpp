#include "tokenizer/jinja.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "tokenizer/unicode.h"

namespace polestar::jinja {

namespace {

// Nesting of statements and expressions in the source, and of lists and dicts in values:
// far above any real template, far below what the recursive parser and evaluator can take.
constexpr int kMaxNesting = 96;

// ---------------------------------------------------------------------------------------
// Text helpers. Strings are valid UTF-8 (sources and variables are made so on entry).

// Bytes of the JavaScript whitespace character (\s) at text[at], 0 if there is none.
size_t SpaceAt(std::string_view text, size_t at) {
  if (at >= text.size()) return 0;
  const unicode::Utf8Step step = unicode::DecodeUtf8(text, at);
  return step.status == unicode::Utf8Status::kOk && unicode::IsJsWhitespace(step.code_point)
             ? step.length
             : 0;
}

// Start of the code point that ends at `end` (end > 0).
size_t PreviousCodePoint(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

std::string_view TrimStart(std::string_view text) {
  size_t begin = 0;
  while (size_t n = SpaceAt(text, begin)) begin += n;
  return text.substr(begin);
}

std::string_view TrimEnd(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    const size_t start = PreviousCodePoint(text, end);
    if (SpaceAt(text, start) != end - start) break;
    end = start;
  }
  return text.substr(0, end);
}

std::string_view Trim(std::string_view text) { return TrimEnd(TrimStart(text)); }

// Calls visit(piece) for each code point of `text` in order (an invalid byte is one piece),
// without building a table of them: a string may be as large as the render's budget.
template <typename Visit>
void ForEachCodePoint(std::string_view text, Visit&& visit) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = unicode::DecodeUtf8(text, at).length;
    visit(text.substr(at, length));
    at += length;
  }
}

// JavaScript's String length: UTF-16 code units.
int64_t Utf16Length(std::string_view text) {
  int64_t units = 0;
  for (size_t at = 0; at < text.size();) {
    const unicode::Utf8Step step = unicode::DecodeUtf8(text, at);
    units += step.code_point >= 0x10000 ? 2 : 1;
    at += step.length;
  }
  return units;
}

std::string ChangeCase(std::string_view text, bool upper) {
  icu::UnicodeString unicode =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size())));
  if (upper) {
    unicode.toUpper(icu::Locale::getRoot());
  } else {
    unicode.toLower(icu::Locale::getRoot());
  }
  std::string out;
  unicode.toUTF8String(out);
  return out;
}

bool IsAsciiWord(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// JavaScript's Number.prototype.toString().
std::string JsNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";
  std::string sign = value < 0 ? "-" : "";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(value),
                                    std::chars_format::scientific);
  const std::string_view text(buffer, size_t(result.ptr - buffer));  // d[.ddd]e±XX
  const size_t e = text.find('e');
  std::string digits(text.substr(0, e));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(std::string(text.substr(e + 1)));
  const int k = int(digits.size()), n = exponent + 1;
  if (k <= n && n <= 21) return sign + digits + std::string(size_t(n - k), '0');
  if (0 < n && n <= 21) return sign + digits.substr(0, size_t(n)) + "." + digits.substr(size_t(n));
  if (-6 < n && n <= 0) return sign + "0." + std::string(size_t(-n), '0') + digits;
  std::string mantissa = digits.substr(0, 1);
  if (k > 1) mantissa += "." + digits.substr(1);
  return sign + mantissa + "e" + (n - 1 >= 0 ? "+" : "-") + std::to_string(std::abs(n - 1));
}

// JSON.stringify(string), optionally with ensure_ascii's \uXXXX escapes of UTF-16 units.
void AppendJsonString(std::string& out, std::string_view text, bool ensure_ascii) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto escape_unit = [&](uint32_t unit) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(unit >> shift) & 0xF];
  };
  out += '"';
  for (size_t at = 0; at < text.size();) {
    const unicode::Utf8Step step = unicode::DecodeUtf8(text, at);
    const char32_t c = step.code_point;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          escape_unit(c);
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {
            escape_unit(0xD800 + ((c - 0x10000) >> 10));
            escape_unit(0xDC00 + ((c - 0x10000) & 0x3FF));
          } else {
            escape_unit(c);
          }
        } else {
          out.append(text.substr(at, step.length));
        }
    }
    at += step.length;
  }
  out += '"';
}

// ---------------------------------------------------------------------------------------
// Source positions. Preprocessing deletes characters; `origin` maps every offset of the
// preprocessed text back to the template as written, for line:column in messages.

struct Source {
  std::string where;
  std::string original;        // valid UTF-8
  std::string text;            // preprocessed
  std::vector<size_t> origin;  // [text.size() + 1] offset in `original`

  std::string At(size_t offset) const {
    const size_t at = origin[std::min(offset, text.size())];
    int line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if (original[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<uint8_t>(original[i]) & 0xC0) != 0x80) {
        ++column;
      }
    }
    return Cat(where, ":", line, ":", column);
  }
};

bool IsJsLineStart(std::string_view text, size_t at) {
  if (at == 0) return true;
  const char previous = text[at - 1];
  if (previous == '\n' || previous == '\r') return true;
  // U+2028 and U+2029 also end lines for JavaScript's multiline ^.
  return at >= 3 && text.substr(at - 3, 2) == "\xE2\x80" &&
         (text[at - 1] == '\xA8' || text[at - 1] == '\xA9');
}

// A transformers {% generation %} or {% endgeneration %} tag at text[at]: its length.
size_t GenerationTagAt(std::string_view text, size_t at, bool* strip_before, bool* strip_after) {
  if (text.substr(at, 2) != "{%") return 0;
  size_t i = at + 2;
  *strip_before = i < text.size() && text[i] == '-';
  if (*strip_before) ++i;
  while (size_t n = SpaceAt(text, i)) i += n;
  if (text.substr(i, 3) == "end") i += 3;
  if (text.substr(i, 10) != "generation") return 0;
  i += 10;
  while (size_t n = SpaceAt(text, i)) i += n;
  *strip_after = i < text.size() && text[i] == '-';
  if (*strip_after) ++i;
  if (text.substr(i, 2) != "%}") return 0;
  return i + 2 - at;
}

// @huggingface/jinja's preprocess() with lstrip_blocks and trim_blocks, in its order.
void Preprocess(Source& source) {
  std::string text = source.original;
  std::vector<size_t> origin(text.size() + 1);
  for (size_t i = 0; i <= text.size(); ++i) origin[i] = i;
  // Rewrites text keeping the characters `keep` says to keep.
  const auto filter = [&](const std::vector<bool>& drop) {
    std::string kept;
    std::vector<size_t> kept_origin;
    for (size_t i = 0; i < text.size(); ++i) {
      if (drop[i]) continue;
      kept += text[i];
      kept_origin.push_back(origin[i]);
    }
    kept_origin.push_back(origin[text.size()]);
    text = std::move(kept);
    origin = std::move(kept_origin);
  };
  if (!text.empty() && text.back() == '\n') {
    text.pop_back();
    origin.pop_back();
  }
  {  // lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1"
    std::vector<bool> drop(text.size(), false);
    for (size_t i = 0; i < text.size(); ++i) {
      if (!IsJsLineStart(text, i)) continue;
      size_t j = i;
      while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
      if (j + 1 < text.size() && text[j] == '{' &&
          (text[j + 1] == '#' || text[j + 1] == '%' || text[j + 1] == '-')) {
        for (size_t k = i; k < j; ++k) drop[k] = true;
      }
    }
    filter(drop);
  }
  {  // trim_blocks: /([#%-]})\n/g -> "$1"
    std::vector<bool> drop(text.size(), false);
    for (size_t i = 0; i + 2 < text.size(); ++i) {
      if ((text[i] == '#' || text[i] == '%' || text[i] == '-') && text[i + 1] == '}' &&
          text[i + 2] == '\n') {
        drop[i + 2] = true;
        i += 2;
      }
    }
    filter(drop);
  }
  {  // /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> before and after unless stripped
    std::vector<bool> drop(text.size(), false);
    size_t done = 0;  // end of the previous match
    for (size_t i = 0; i < text.size(); ++i) {
      bool strip_before = false, strip_after = false;
      const size_t length = GenerationTagAt(text, i, &strip_before, &strip_after);
      if (length == 0) continue;
      size_t begin = i;
      while (begin > done) {
        const size_t start = PreviousCodePoint(text, begin);
        if (SpaceAt(text, start) != begin - start) break;
        begin = start;
      }
      size_t end = i + length;
      while (size_t n = SpaceAt(text, end)) end += n;
      for (size_t k = i; k < i + length; ++k) drop[k] = true;
      if (strip_before)
        for (size_t k = begin; k < i; ++k) drop[k] = true;
      if (strip_after)
        for (size_t k = i + length; k < end; ++k) drop[k] = true;
      done = end;
      i = end - 1;
    }
    filter(drop);
  }
  source.text = std::move(text);
  source.origin = std::move(origin);
}

// ---------------------------------------------------------------------------------------
// Lexer

enum class Tok {
  kText,
  kNumber,
  kString,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a sign not followed by digits
  kComment,
};

struct Token {
  Tok type;
  std::string value;
  size_t at;  // offset in the preprocessed text
};

class Lexer {
 public:
  explicit Lexer(const Source& source) : source_(source), src_(source.text) {}

  std::vector<Token> Run() {
    while (at_ < src_.size()) Step();
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void Throw(size_t at, const std::string& message) const {
    Fail(source_.At(at), ": ", message);
  }

  bool Starts(std::string_view prefix) const { return src_.substr(at_, prefix.size()) == prefix; }
  const Token* Last() const { return tokens_.empty() ? nullptr : &tokens_.back(); }
  void Push(Tok type, std::string value, size_t at) {
    tokens_.push_back({type, std::move(value), at});
  }

  void SkipSpaces() {
    while (size_t n = SpaceAt(src_, at_)) at_ += n;
  }

  void StripTrailingSpaces() {
    if (tokens_.empty() || tokens_.back().type != Tok::kText) return;
    std::string& text = tokens_.back().value;
    text.resize(TrimEnd(text).size());
    if (text.empty()) tokens_.pop_back();
  }

  // A string literal's characters up to `quote`, with escapes.
  std::string StringBody(char quote, size_t start) {
    std::string out;
    while (true) {
      if (at_ >= src_.size()) Throw(start, "unterminated string literal");
      const char c = src_[at_];
      if (c == quote) {
        ++at_;
        return out;
      }
      if (c != '\\') {
        out += c;
        ++at_;
        continue;
      }
      if (++at_ >= src_.size()) Throw(start, "unterminated string literal");
      const char escaped = src_[at_++];
      switch (escaped) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case 'x':
        case 'u': {
          const size_t length = escaped == 'x' ? 2 : 4;
          const std::string_view hex = src_.substr(at_, length);
          uint32_t unit = 0;
          const auto parsed = std::from_chars(hex.data(), hex.data() + hex.size(), unit, 16);
          if (hex.size() != length || parsed.ptr != hex.data() + hex.size()) {
            Throw(at_ - 2, Cat("invalid escape \\", escaped, hex));
          }
          // JavaScript strings hold UTF-16 units: a surrogate pair written as two \u
          // escapes is one character; a lone surrogate becomes U+FFFD in UTF-8.
          if (unit >= 0xD800 && unit < 0xDC00 && src_.substr(at_ + length, 2) == "\\u") {
            uint32_t low = 0;
            const std::string_view next = src_.substr(at_ + length + 2, 4);
            const auto low_parsed =
                std::from_chars(next.data(), next.data() + next.size(), low, 16);
            if (next.size() == 4 && low_parsed.ptr == next.data() + 4 && low >= 0xDC00 &&
                low < 0xE000) {
              unicode::AppendUtf8(out, 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00));
              at_ += length + 6;
              break;
            }
          }
          unicode::AppendUtf8(
              out, unit >= 0xD800 && unit < 0xE000 ? unicode::kReplacement : char32_t(unit));
          at_ += length;
          break;
        }
        default:
          Throw(at_ - 2, Cat("unknown escape \\", escaped, " in a string literal"));
      }
    }
  }

  std::string Digits() {
    const size_t begin = at_;
    while (at_ < src_.size() && IsDigit(src_[at_])) ++at_;
    return std::string(src_.substr(begin, at_ - begin));
  }

  void Step() {
    const Token* last = Last();
    if (last == nullptr || last->type == Tok::kCloseStatement ||
        last->type == Tok::kCloseExpression || last->type == Tok::kComment) {
      const size_t begin = at_;
      while (at_ < src_.size() &&
             !(src_[at_] == '{' && at_ + 1 < src_.size() &&
               (src_[at_ + 1] == '%' || src_[at_ + 1] == '{' || src_[at_ + 1] == '#'))) {
        ++at_;
      }
      if (at_ > begin) {
        Push(Tok::kText, std::string(src_.substr(begin, at_ - begin)), begin);
        return;
      }
    }
    const size_t start = at_;
    if (Starts("{#")) {
      at_ += 2;
      const bool strip_before = at_ < src_.size() && src_[at_] == '-';
      if (strip_before) ++at_;
      const size_t end = src_.find("#}", at_);
      if (end == std::string_view::npos) Throw(start, "unterminated comment {# ... #}");
      const bool strip_after = end > at_ && src_[end - 1] == '-';
      if (strip_before) StripTrailingSpaces();
      Push(Tok::kComment, "", start);
      at_ = end + 2;
      if (strip_after) SkipSpaces();
      return;
    }
    if (Starts("{%-")) {
      StripTrailingSpaces();
      Push(Tok::kOpenStatement, "{%", start);
      at_ += 3;
      return;
    }
    if (Starts("{{-")) {
      StripTrailingSpaces();
      Push(Tok::kOpenExpression, "{{", start);
      brace_depth_ = 0;
      at_ += 3;
      return;
    }
    SkipSpaces();
    if (at_ >= src_.size()) return;  // the parser reports the unclosed tag
    const size_t here = at_;
    if (Starts("-%}")) {
      Push(Tok::kCloseStatement, "%}", here);
      at_ += 3;
      SkipSpaces();
      return;
    }
    if (Starts("-}}")) {
      Push(Tok::kCloseExpression, "}}", here);
      at_ += 3;
      SkipSpaces();
      return;
    }
    const char c = src_[at_];
    if (c == '-' || c == '+') {
      last = Last();
      if (last == nullptr || last->type == Tok::kText) Throw(here, Cat("unexpected '", c, "'"));
      const Tok t = last->type;
      if (t != Tok::kIdentifier && t != Tok::kNumber && t != Tok::kString &&
          t != Tok::kCloseParen && t != Tok::kCloseBracket) {
        ++at_;
        std::string number = Digits();
        if (!number.empty() && at_ + 1 < src_.size() && src_[at_] == '.' &&
            IsDigit(src_[at_ + 1])) {
          ++at_;
          number += "." + Digits();
        }
        if (number.empty()) {
          Push(Tok::kUnary, std::string(1, c), here);
        } else {
          Push(Tok::kNumber, c + number, here);
        }
        return;
      }
    }
    static constexpr std::pair<std::string_view, Tok> kTable[] = {
        {"{%", Tok::kOpenStatement},  {"%}", Tok::kCloseStatement},
        {"{{", Tok::kOpenExpression}, {"}}", Tok::kCloseExpression},
        {"(", Tok::kOpenParen},       {")", Tok::kCloseParen},
        {"{", Tok::kOpenBrace},       {"}", Tok::kCloseBrace},
        {"[", Tok::kOpenBracket},     {"]", Tok::kCloseBracket},
        {",", Tok::kComma},           {".", Tok::kDot},
        {":", Tok::kColon},           {"|", Tok::kPipe},
        {"<=", Tok::kComparison},     {">=", Tok::kComparison},
        {"==", Tok::kComparison},     {"!=", Tok::kComparison},
        {"<", Tok::kComparison},      {">", Tok::kComparison},
        {"+", Tok::kAdditive},        {"-", Tok::kAdditive},
        {"~", Tok::kAdditive},        {"**", Tok::kPower},
        {"*", Tok::kMultiplicative},  {"//", Tok::kMultiplicative},
        {"/", Tok::kMultiplicative},  {"%", Tok::kMultiplicative},
        {"=", Tok::kEquals},
    };
    for (const auto& [sequence, type] : kTable) {
      if (sequence == "}}" && brace_depth_ > 0) continue;  // closes a dict literal instead
      if (!Starts(sequence)) continue;
      Push(type, std::string(sequence), here);
      if (type == Tok::kOpenExpression) brace_depth_ = 0;
      if (type == Tok::kOpenBrace) ++brace_depth_;
      if (type == Tok::kCloseBrace) --brace_depth_;
      at_ += sequence.size();
      return;
    }
    if (c == '\'' || c == '"') {
      ++at_;
      Push(Tok::kString, StringBody(c, here), here);
      return;
    }
    if (IsDigit(c)) {
      std::string number = Digits();
      last = Last();
      if ((last == nullptr || last->type != Tok::kDot) && at_ + 1 < src_.size() &&
          src_[at_] == '.' && IsDigit(src_[at_ + 1])) {
        ++at_;
        number += "." + Digits();
      }
      Push(Tok::kNumber, number, here);
      return;
    }
    if (IsAsciiWord(c)) {
      while (at_ < src_.size() && IsAsciiWord(src_[at_])) ++at_;
      Push(Tok::kIdentifier, std::string(src_.substr(here, at_ - here)), here);
      return;
    }
    const size_t length = unicode::DecodeUtf8(src_, at_).length;
    Throw(here, Cat("unexpected character '", src_.substr(at_, length), "'"));
  }

  const Source& source_;
  std::string_view src_;
  size_t at_ = 0;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------
// Syntax tree

enum class NodeType {
  // Statements
  kText,    // text
  kOutput,  // {{ a }}
  kIf,      // a = test, body, alternate
  kFor,     // a = target, b = iterable, c = filter test (or null), body, alternate = else
  kSet,     // a = target, b = value (or null: body renders the value)
  kBreak,
  kContinue,
  // Expressions
  kString,      // text
  kInteger,     // integer
  kFloat,       // number
  kIdentifier,  // text
  kList,        // items
  kTuple,       // items
  kDict,        // items = key, value, key, value...
  kMember,      // a = object, b = property (a kSlice when slicing), computed
  kSlice,       // a, b, c = start, stop, step (each may be null)
  kCall,        // a = callee, items = arguments (kKeyword for name=value)
  kKeyword,     // text = name, a = value
  kFilter,      // a = operand, text = name, called, items = arguments
  kTest,        // a = operand, text = name, negate
  kUnary,       // text = operator, a
  kBinary,      // text = operator, a, b
  kTernary,     // a = condition, b = if true, c = if false
  kSelect,      // a = value, b = condition (`a if b` without else)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeType type;
  size_t at = 0;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  bool computed = false, called = false, negate = false;
  NodePtr a, b, c;
  std::vector<NodePtr> items, body, alternate;
};

NodePtr MakeNode(NodeType type, size_t at) {
  auto node = std::make_unique<Node>();
  node->type = type;
  node->at = at;
  return node;
}

// ---------------------------------------------------------------------------------------
// Parser: @huggingface/jinja's grammar and operator precedence (tests bind tighter than
// * and /, filters tighter than tests).

class Parser {
 public:
  Parser(const Source& source, std::vector<Token> tokens)
      : source_(source), tokens_(std::move(tokens)) {}

  std::vector<NodePtr> Run() {
    std::vector<NodePtr> program;
    while (current_ < tokens_.size()) {
      if (NodePtr node = ParseAny()) program.push_back(std::move(node));
    }
    return program;
  }

 private:
  // Counts nesting on the C++ stack.
  struct Nest {
    explicit Nest(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxNesting) {
        parser_.Throw(parser_.Here(), Cat("nesting deeper than ", kMaxNesting, " levels"));
      }
    }
    ~Nest() { --parser_.depth_; }
    Parser& parser_;
  };

  [[noreturn]] void Throw(size_t at, const std::string& message) const {
    Fail(source_.At(at), ": ", message);
  }
  size_t Here() const {
    return current_ < tokens_.size() ? tokens_[current_].at : source_.text.size();
  }
  bool Is(Tok type, size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].type == type;
  }
  bool IsIdentifier(std::string_view name, size_t ahead = 0) const {
    return Is(Tok::kIdentifier, ahead) && tokens_[current_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!Is(Tok::kOpenStatement) || !Is(Tok::kIdentifier, 1)) return false;
    const std::string& name = tokens_[current_ + 1].value;
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  std::string Describe() const {
    if (current_ >= tokens_.size()) return "the end of the template";
    const Token& token = tokens_[current_];
    if (token.type == Tok::kText) return "text";
    if (token.type == Tok::kString) return "a string";
    return "'" + token.value + "'";
  }
  const Token& Expect(Tok type, std::string_view what) {
    if (!Is(type)) Throw(Here(), Cat("expected ", what, ", found ", Describe()));
    return tokens_[current_++];
  }
  void ExpectIdentifier(std::string_view name) {
    if (!IsIdentifier(name)) Throw(Here(), Cat("expected '", name, "', found ", Describe()));
    ++current_;
  }
  // Statements up to one of `ends` (not consumed); `opening` names the block for errors.
  std::vector<NodePtr> Block(std::initializer_list<std::string_view> ends, size_t opening,
                             std::string_view what) {
    std::vector<NodePtr> body;
    while (!IsStatement(ends)) {
      if (current_ >= tokens_.size()) {
        Throw(opening, Cat("{% ", what, " %} is not closed (expected {% ", *ends.begin(), " %})"));
      }
      if (NodePtr node = ParseAny()) body.push_back(std::move(node));
    }
    return body;
  }
  void ExpectEnd(std::string_view name) {
    Expect(Tok::kOpenStatement, "{%");
    ExpectIdentifier(name);
    Expect(Tok::kCloseStatement, "%}");
  }

  NodePtr ParseAny() {
    Nest nest(*this);
    const Token& token = tokens_[current_];
    switch (token.type) {
      case Tok::kComment:
        ++current_;
        return nullptr;
      case Tok::kText: {
        NodePtr node = MakeNode(NodeType::kText, token.at);
        node->text = token.value;
        ++current_;
        return node;
      }
      case Tok::kOpenStatement:
        return ParseStatement();
      case Tok::kOpenExpression: {
        NodePtr node = MakeNode(NodeType::kOutput, token.at);
        ++current_;
        node->a = ParseExpression();
        Expect(Tok::kCloseExpression, "}}");
        return node;
      }
      default:
        Throw(token.at, Cat("unexpected ", Describe(), " outside {{ }} and {% %}"));
    }
  }

  NodePtr ParseStatement() {
    const size_t opening = Here();
    Expect(Tok::kOpenStatement, "{%");
    if (!Is(Tok::kIdentifier)) Throw(Here(), Cat("expected a statement name, found ", Describe()));
    const std::string name = tokens_[current_++].value;
    if (name == "set") return ParseSet(opening);
    if (name == "if") {
      NodePtr node = ParseIf(opening);
      ExpectEnd("endif");
      return node;
    }
    if (name == "for") {
      NodePtr node = ParseFor(opening);
      ExpectEnd("endfor");
      return node;
    }
    if (name == "break" || name == "continue") {
      Expect(Tok::kCloseStatement, "%}");
      return MakeNode(name == "break" ? NodeType::kBreak : NodeType::kContinue, opening);
    }
    if (name == "macro" || name == "call" || name == "filter") {
      Throw(opening, Cat("{% ", name, " %} blocks are not supported"));
    }
    Throw(opening, Cat("unknown statement '", name, "'"));
  }

  NodePtr ParseSet(size_t opening) {
    NodePtr node = MakeNode(NodeType::kSet, opening);
    node->a = ParseExpressionSequence(false);
    if (Is(Tok::kEquals)) {
      ++current_;
      node->b = ParseExpressionSequence(false);
    } else {
      Expect(Tok::kCloseStatement, "'=' or %}");
      node->body = Block({"endset"}, opening, "set");
      Expect(Tok::kOpenStatement, "{%");
      ExpectIdentifier("endset");
    }
    Expect(Tok::kCloseStatement, "%}");
    const NodeType target = node->a->type;
    if (target != NodeType::kIdentifier && target != NodeType::kTuple &&
        target != NodeType::kMember) {
      Throw(node->a->at, "cannot assign to this expression");
    }
    return node;
  }

  NodePtr ParseIf(size_t opening) {
    NodePtr node = MakeNode(NodeType::kIf, opening);
    node->a = ParseExpression();
    Expect(Tok::kCloseStatement, "%}");
    node->body = Block({"elif", "else", "endif"}, opening, "if");
    if (IsStatement({"elif"})) {
      const size_t elif = Here();
      current_ += 2;
      node->alternate.push_back(ParseIf(elif));
    } else if (IsStatement({"else"})) {
      current_ += 2;
      Expect(Tok::kCloseStatement, "%}");
      node->alternate = Block({"endif"}, opening, "if");
    }
    return node;
  }

  NodePtr ParseFor(size_t opening) {
    NodePtr node = MakeNode(NodeType::kFor, opening);
    node->a = ParseExpressionSequence(true);
    if (node->a->type != NodeType::kIdentifier && node->a->type != NodeType::kTuple) {
      Throw(node->a->at, "expected a loop variable or a tuple of them");
    }
    ExpectIdentifier("in");
    NodePtr iterable = ParseExpression();
    if (iterable->type == NodeType::kSelect) {
      node->b = std::move(iterable->a);
      node->c = std::move(iterable->b);
    } else {
      node->b = std::move(iterable);
    }
    Expect(Tok::kCloseStatement, "%}");
    node->body = Block({"endfor", "else"}, opening, "for");
    if (IsStatement({"else"})) {
      current_ += 2;
      Expect(Tok::kCloseStatement, "%}");
      node->alternate = Block({"endfor"}, opening, "for");
    }
    return node;
  }

  NodePtr ParseExpressionSequence(bool primary) {
    const size_t at = Here();
    NodePtr first = primary ? ParsePrimary() : ParseExpression();
    if (!Is(Tok::kComma)) return first;
    NodePtr tuple = MakeNode(NodeType::kTuple, at);
    tuple->items.push_back(std::move(first));
    while (Is(Tok::kComma)) {
      ++current_;
      tuple->items.push_back(primary ? ParsePrimary() : ParseExpression());
    }
    return tuple;
  }

  NodePtr ParseExpression() {
    Nest nest(*this);
    NodePtr value = ParseOr();
    if (!IsIdentifier("if")) return value;
    const size_t at = Here();
    ++current_;
    NodePtr test = ParseOr();
    if (IsIdentifier("else")) {
      ++current_;
      NodePtr node = MakeNode(NodeType::kTernary, at);
      node->a = std::move(test);
      node->b = std::move(value);
      node->c = ParseExpression();
      return node;
    }
    NodePtr node = MakeNode(NodeType::kSelect, at);
    node->a = std::move(value);
    node->b = std::move(test);
    return node;
  }

  NodePtr Binary(std::string op, size_t at, NodePtr left, NodePtr right) {
    NodePtr node = MakeNode(NodeType::kBinary, at);
    node->text = std::move(op);
    node->a = std::move(left);
    node->b = std::move(right);
    return node;
  }

  NodePtr ParseOr() {
    NodePtr left = ParseAnd();
    while (IsIdentifier("or")) {
      const size_t at = Here();
      ++current_;
      left = Binary("or", at, std::move(left), ParseAnd());
    }
    return left;
  }

  NodePtr ParseAnd() {
    NodePtr left = ParseNot();
    while (IsIdentifier("and")) {
      const size_t at = Here();
      ++current_;
      left = Binary("and", at, std::move(left), ParseNot());
    }
    return left;
  }

  NodePtr ParseNot() {
    if (!IsIdentifier("not")) return ParseComparison();
    Nest nest(*this);
    NodePtr node = MakeNode(NodeType::kUnary, Here());
    ++current_;
    node->text = "not";
    node->a = ParseNot();
    return node;
  }

  NodePtr ParseComparison() {
    NodePtr left = ParseAdditive();
    while (true) {
      const size_t at = Here();
      std::string op;
      if (IsIdentifier("not") && IsIdentifier("in", 1)) {
        op = "not in";
        current_ += 2;
      } else if (IsIdentifier("in") || Is(Tok::kComparison)) {
        op = tokens_[current_++].value;
      } else {
        return left;
      }
      left = Binary(std::move(op), at, std::move(left), ParseAdditive());
    }
  }

  NodePtr ParseAdditive() {
    NodePtr left = ParseMultiplicative();
    while (Is(Tok::kAdditive)) {
      const Token& op = tokens_[current_++];
      left = Binary(op.value, op.at, std::move(left), ParseMultiplicative());
    }
    return left;
  }

  NodePtr ParseMultiplicative() {
    NodePtr left = ParsePower();
    while (Is(Tok::kMultiplicative)) {
      const Token& op = tokens_[current_++];
      left = Binary(op.value, op.at, std::move(left), ParsePower());
    }
    return left;
  }

  NodePtr ParsePower() {
    NodePtr left = ParseTest();
    while (Is(Tok::kPower)) {
      const Token& op = tokens_[current_++];
      left = Binary(op.value, op.at, std::move(left), ParseTest());
    }
    return left;
  }

  NodePtr ParseTest() {
    NodePtr operand = ParseFilter();
    while (IsIdentifier("is")) {
      NodePtr node = MakeNode(NodeType::kTest, Here());
      ++current_;
      node->negate = IsIdentifier("not");
      if (node->negate) ++current_;
      if (!Is(Tok::kIdentifier)) Throw(Here(), Cat("expected a test name, found ", Describe()));
      node->text = tokens_[current_++].value;
      node->a = std::move(operand);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr ParseFilter() {
    NodePtr operand = ParseUnarySign();
    while (Is(Tok::kPipe)) {
      NodePtr node = MakeNode(NodeType::kFilter, Here());
      ++current_;
      if (!Is(Tok::kIdentifier)) Throw(Here(), Cat("expected a filter name, found ", Describe()));
      node->text = tokens_[current_++].value;
      if (Is(Tok::kOpenParen)) {
        node->called = true;
        node->items = ParseArguments();
      }
      node->a = std::move(operand);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr ParseUnarySign() {
    if ((Is(Tok::kUnary) || Is(Tok::kAdditive)) &&
        (tokens_[current_].value == "-" || tokens_[current_].value == "+")) {
      Nest nest(*this);
      NodePtr node = MakeNode(NodeType::kUnary, Here());
      node->text = tokens_[current_++].value;
      node->a = ParseUnarySign();
      return node;
    }
    return ParseCallMember();
  }

  NodePtr ParseCallMember() {
    NodePtr node = ParseMember(ParsePrimary());
    while (Is(Tok::kOpenParen)) {
      NodePtr call = MakeNode(NodeType::kCall, Here());
      call->items = ParseArguments();
      call->a = std::move(node);
      node = ParseMember(std::move(call));
    }
    return node;
  }

  std::vector<NodePtr> ParseArguments() {
    Expect(Tok::kOpenParen, "(");
    std::vector<NodePtr> arguments;
    bool keywords = false;
    while (!Is(Tok::kCloseParen)) {
      if (current_ >= tokens_.size()) Throw(Here(), "expected ')'");
      if (Is(Tok::kPower) || (Is(Tok::kMultiplicative) && tokens_[current_].value == "*")) {
        Throw(Here(), "argument unpacking (* and **) is not supported");
      }
      NodePtr argument = ParseExpression();
      if (Is(Tok::kEquals)) {
        ++current_;
        if (argument->type != NodeType::kIdentifier) {
          Throw(argument->at, "expected an identifier for a keyword argument");
        }
        NodePtr keyword = MakeNode(NodeType::kKeyword, argument->at);
        keyword->text = argument->text;
        keyword->a = ParseExpression();
        argument = std::move(keyword);
        keywords = true;
      } else if (keywords) {
        Throw(argument->at, "positional arguments must come before keyword arguments");
      }
      arguments.push_back(std::move(argument));
      if (Is(Tok::kComma)) ++current_;
    }
    ++current_;
    return arguments;
  }

  NodePtr ParseMember(NodePtr object) {
    while (Is(Tok::kDot) || Is(Tok::kOpenBracket)) {
      NodePtr node = MakeNode(NodeType::kMember, Here());
      node->computed = Is(Tok::kOpenBracket);
      ++current_;
      if (node->computed) {
        node->b = ParseSubscript();
        Expect(Tok::kCloseBracket, "]");
      } else {
        node->b = ParsePrimary();
        if (node->b->type != NodeType::kIdentifier && node->b->type != NodeType::kInteger) {
          Throw(node->b->at, "expected a name or an integer after '.'");
        }
      }
      node->a = std::move(object);
      object = std::move(node);
    }
    return object;
  }

  // The inside of [...]: an index or a slice start:stop:step.
  NodePtr ParseSubscript() {
    const size_t at = Here();
    std::vector<NodePtr> parts;
    bool slice = false;
    while (!Is(Tok::kCloseBracket)) {
      if (current_ >= tokens_.size()) Throw(at, "expected ']'");
      if (Is(Tok::kColon)) {
        parts.push_back(nullptr);
        ++current_;
        slice = true;
      } else {
        parts.push_back(ParseExpression());
        if (Is(Tok::kColon)) {
          ++current_;
          slice = true;
        }
      }
    }
    if (parts.empty()) Throw(at, "expected an index or a slice inside [ ]");
    if (!slice) {
      if (parts.size() > 1) Throw(at, "expected one index inside [ ]");
      return std::move(parts[0]);
    }
    if (parts.size() > 3) Throw(at, "a slice takes at most start:stop:step");
    NodePtr node = MakeNode(NodeType::kSlice, at);
    parts.resize(3);
    node->a = std::move(parts[0]);
    node->b = std::move(parts[1]);
    node->c = std::move(parts[2]);
    return node;
  }

  NodePtr ParsePrimary() {
    Nest nest(*this);
    if (current_ >= tokens_.size()) Throw(Here(), "unexpected end of the template");
    const Token& token = tokens_[current_++];
    switch (token.type) {
      case Tok::kNumber: {
        const std::string& text = token.value;
        if (text.find('.') != std::string::npos) {
          NodePtr node = MakeNode(NodeType::kFloat, token.at);
          node->number = std::strtod(text.c_str(), nullptr);
          return node;
        }
        NodePtr node = MakeNode(NodeType::kInteger, token.at);
        const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
        const auto parsed = std::from_chars(begin, text.data() + text.size(), node->integer);
        if (parsed.ec != std::errc()) Throw(token.at, Cat("integer ", text, " is too large"));
        return node;
      }
      case Tok::kString: {
        NodePtr node = MakeNode(NodeType::kString, token.at);
        node->text = token.value;
        while (Is(Tok::kString)) node->text += tokens_[current_++].value;  // 'a' 'b' == 'ab'
        return node;
      }
      case Tok::kIdentifier: {
        NodePtr node = MakeNode(NodeType::kIdentifier, token.at);
        node->text = token.value;
        return node;
      }
      case Tok::kOpenParen: {
        NodePtr node = ParseExpressionSequence(false);
        Expect(Tok::kCloseParen, ")");
        return node;
      }
      case Tok::kOpenBracket: {
        NodePtr node = MakeNode(NodeType::kList, token.at);
        while (!Is(Tok::kCloseBracket)) {
          if (current_ >= tokens_.size()) Throw(token.at, "expected ']'");
          node->items.push_back(ParseExpression());
          if (Is(Tok::kComma)) ++current_;
        }
        ++current_;
        return node;
      }
      case Tok::kOpenBrace: {
        NodePtr node = MakeNode(NodeType::kDict, token.at);
        while (!Is(Tok::kCloseBrace)) {
          if (current_ >= tokens_.size()) Throw(token.at, "expected '}'");
          node->items.push_back(ParseExpression());
          Expect(Tok::kColon, "':' between a key and its value");
          node->items.push_back(ParseExpression());
          if (Is(Tok::kComma)) ++current_;
        }
        ++current_;
        return node;
      }
      default:
        --current_;
        Throw(token.at, Cat("unexpected ", Describe()));
    }
  }

  const Source& source_;
  std::vector<Token> tokens_;
  size_t current_ = 0;
  int depth_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Values

namespace {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Interpreter;

struct CallArgs {
  std::vector<Value>* positional;
  std::vector<std::pair<std::string, Value>>* keywords;
};
using Builtin = std::function<Value(Interpreter&, size_t at, CallArgs args)>;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunction
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::shared_ptr<const std::string> string;
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // kDict and kNamespace (the only mutable value)
  std::shared_ptr<const Builtin> function;
  int depth = 0;                 // nesting of lists and dicts inside
  bool holds_namespace = false;  // is or contains a namespace

  const std::string& str() const { return *string; }
};

// Insertion-ordered, like a JavaScript Map.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  std::unordered_map<std::string, size_t> index;

  const Value* Find(const std::string& key) const {
    const auto it = index.find(key);
    return it == index.end() ? nullptr : &entries[it->second].second;
  }
  void Set(const std::string& key, Value value) {
    const auto [it, added] = index.emplace(key, entries.size());
    if (added) {
      entries.emplace_back(key, std::move(value));
    } else {
      entries[it->second].second = std::move(value);
    }
  }
};

Value Undefined() { return Value{}; }
Value None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value Int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value Float(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}
Value Function(Builtin fn) {
  Value v;
  v.kind = Kind::kFunction;
  v.function = std::make_shared<const Builtin>(std::move(fn));
  return v;
}

bool IsNumber(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kFloat; }
double AsDouble(const Value& v) {
  return v.kind == Kind::kFloat ? v.number : v.kind == Kind::kBool ? v.boolean : double(v.integer);
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer != 0;
    case Kind::kFloat:
      return v.number != 0 && !std::isnan(v.number);
    case Kind::kString:
      return !v.str().empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------
// Interpreter

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> variables;

  Value Lookup(const std::string& name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent) {
      const auto it = scope->variables.find(name);
      if (it != scope->variables.end()) return it->second;
    }
    return Undefined();
  }
};

// Loop control, thrown from {% break %} / {% continue %} to the enclosing loop.
struct LoopControl {
  bool is_break;
};

// The bytes a render holds at once (RenderLimits::max_total_bytes). Every string, list and
// dict a value owns and every output buffer is charged while it lives and given back when it
// is freed, so the budget counts what is live, not what was ever built. It outlives every
// value of the render.
struct MemoryBudget {
  size_t limit;
  size_t held = 0;
};

// The bytes one heap object is charged; given back when the object is freed.
class Charge {
 public:
  Charge(MemoryBudget& budget, size_t bytes) : budget_(budget), bytes_(bytes) {}
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() { budget_.held -= bytes_; }

  size_t bytes() const { return bytes_; }
  // After Interpreter::Reserve has charged `more`.
  void Grow(size_t more) { bytes_ += more; }
  void GiveBack() {
    budget_.held -= bytes_;
    bytes_ = 0;
  }

 private:
  MemoryBudget& budget_;
  size_t bytes_;
};

// A value's heap object and its charge, freed together.
template <typename T>
struct Charged {
  Charged(T object, MemoryBudget& budget, size_t bytes)
      : object(std::move(object)), charge(budget, bytes) {}
  T object;
  Charge charge;
};

// Text being rendered (the output, a loop iteration's, a {% set %} block's), charged by its
// capacity as it grows.
struct Output {
  explicit Output(MemoryBudget& budget) : charge(budget, 0) {}
  // The text, its charge given back: a value made of it is charged anew.
  std::string Take() {
    charge.GiveBack();
    return std::move(text);
  }

  std::string text;
  Charge charge;
};

struct Interpreter {
  const Source& source;
  const RenderLimits& limits;
  MemoryBudget& budget;
  uint64_t steps = 0;

  [[noreturn]] void Throw(size_t at, const std::string& message) const {
    Fail(source.At(at), ": ", message);
  }

  void Step(size_t at) {
    if (++steps > limits.max_steps) {
      Throw(at, Cat("rendering took more than ", limits.max_steps, " steps"));
    }
  }
  [[noreturn]] void ThrowOverBudget(size_t at) const {
    Throw(at, Cat("rendering would hold more than ", limits.max_total_bytes, " bytes at once"));
  }
  void CheckLength(size_t bytes, size_t at) const {
    if (bytes > limits.max_string_bytes) {
      Throw(at, Cat("a string grew beyond ", limits.max_string_bytes, " bytes"));
    }
  }
  // A string being built of `bytes`: within the per-string limit, and within what the
  // budget has left, as it is not yet charged.
  void CheckSize(size_t bytes, size_t at) const {
    CheckLength(bytes, at);
    if (bytes > budget.limit - budget.held) ThrowOverBudget(at);
  }
  void Reserve(size_t bytes, size_t at) const {
    if (bytes > budget.limit - budget.held) ThrowOverBudget(at);
    budget.held += bytes;
  }

  // `object` on the heap, charged `bytes` (its own heap memory) besides its holder.
  template <typename T>
  std::shared_ptr<T> Hold(std::remove_const_t<T> object, size_t bytes, size_t at) const {
    using Holder = Charged<std::remove_const_t<T>>;
    Reserve(sizeof(Holder) + bytes, at);
    const auto holder = std::make_shared<Holder>(std::move(object), budget, sizeof(Holder) + bytes);
    return std::shared_ptr<T>(holder, &holder->object);
  }

  // Appends to rendered text, charging its growth.
  void Write(Output& out, std::string_view text, size_t at) const {
    const size_t size = out.text.size() + text.size();
    CheckLength(size, at);
    if (size > out.text.capacity()) {
      const size_t capacity =
          std::max(size, std::min(2 * out.text.capacity(), limits.max_string_bytes));
      Reserve(capacity - out.charge.bytes(), at);
      out.charge.Grow(capacity - out.charge.bytes());
      out.text.reserve(capacity);
    }
    out.text += text;
  }

  Value String(std::string text, size_t at) const {
    CheckSize(text.size(), at);
    Value v;
    v.kind = Kind::kString;
    const size_t bytes = text.capacity();
    v.string = Hold<const std::string>(std::move(text), bytes, at);
    return v;
  }

  Value MakeList(List items, size_t at) const {
    if (items.size() > limits.max_list_items) {
      Throw(at, Cat("a list grew beyond ", limits.max_list_items, " items"));
    }
    Value v;
    v.kind = Kind::kList;
    for (const Value& item : items) {
      v.depth = std::max(v.depth, item.depth + 1);
      v.holds_namespace |= item.holds_namespace;
    }
    if (v.depth > kMaxNesting) Throw(at, Cat("lists nested deeper than ", kMaxNesting, " levels"));
    const size_t bytes = items.capacity() * sizeof(Value);
    v.list = Hold<const List>(std::move(items), bytes, at);
    return v;
  }

  Value MakeDict(Dict dict, size_t at, Kind kind = Kind::kDict) const {
    Value v;
    v.kind = kind;
    v.holds_namespace = kind == Kind::kNamespace;
    for (const auto& [key, item] : dict.entries) {
      v.depth = std::max(v.depth, item.depth + 1);
      v.holds_namespace |= item.holds_namespace;
    }
    if (v.depth > kMaxNesting) Throw(at, Cat("dicts nested deeper than ", kMaxNesting, " levels"));
    // Each key is held twice (entries and index); a namespace's later attributes are few,
    // one per `ns.name` the template spells, so they are not charged.
    size_t bytes = dict.entries.capacity() * sizeof(dict.entries[0]) +
                   dict.index.bucket_count() * sizeof(void*) +
                   dict.index.size() * (sizeof(*dict.index.begin()) + 2 * sizeof(void*));
    for (const auto& [key, item] : dict.entries) bytes += 2 * key.capacity();
    v.dict = Hold<Dict>(std::move(dict), bytes, at);
    return v;
  }

  Value FromJson(const nlohmann::ordered_json& j, int depth) const {
    if (depth > kMaxNesting) Fail(source.where, ": variables nested deeper than ", kMaxNesting);
    switch (j.type()) {
      case nlohmann::json::value_t::null:
        return None();
      case nlohmann::json::value_t::boolean:
        return Bool(j.get<bool>());
      case nlohmann::json::value_t::number_integer:
        return Int(j.get<int64_t>());
      case nlohmann::json::value_t::number_unsigned: {
        const uint64_t u = j.get<uint64_t>();
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) return Float(double(u));
        return Int(int64_t(u));
      }
      case nlohmann::json::value_t::number_float: {
        const double d = j.get<double>();
        // JavaScript has one number type: an integral value is an integer to the template.
        if (std::floor(d) == d && std::fabs(d) < 9.007199254740992e15) return Int(int64_t(d));
        return Float(d);
      }
      case nlohmann::json::value_t::string:
        return String(unicode::ToValidUtf8(j.get_ref<const std::string&>()), 0);
      case nlohmann::json::value_t::array: {
        List items;
        for (const auto& item : j) items.push_back(FromJson(item, depth + 1));
        return MakeList(std::move(items), 0);
      }
      case nlohmann::json::value_t::object: {
        Dict dict;
        for (const auto& [key, item] : j.items()) {
          dict.Set(unicode::ToValidUtf8(key), FromJson(item, depth + 1));
        }
        return MakeDict(std::move(dict), 0);
      }
      default:
        Fail(source.where, ": variables must be JSON values");
    }
  }

  // ---- Conversions to text

  // What {{ v }} prints (RuntimeValue.toString()).
  std::string Display(const Value& v, size_t at) const {
    switch (v.kind) {
      case Kind::kUndefined:
        return "undefined";
      case Kind::kNone:
        return "null";
      case Kind::kBool:
        return v.boolean ? "true" : "false";
      case Kind::kInt:
        return std::to_string(v.integer);
      case Kind::kFloat: {
        const double d = v.number;
        if (d == 0 && std::signbit(d)) return "-0.0";
        if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 1e21) {
          char buffer[64];
          std::snprintf(buffer, sizeof(buffer), "%.1f", d);
          return buffer;
        }
        return JsNumber(d);
      }
      case Kind::kString:
        return v.str();
      case Kind::kList:
      case Kind::kDict:
      case Kind::kNamespace: {
        std::string out;
        AppendJson(out, v, JsonStyle{}, 0, false, at);
        return out;
      }
      case Kind::kFunction:
        Throw(at, "cannot print a function");
    }
    return "";
  }

  // JavaScript's String(v.value), which + and ~ concatenate.
  std::string Raw(const Value& v, size_t at) const {
    switch (v.kind) {
      case Kind::kFloat:
        return JsNumber(v.number);
      case Kind::kList: {
        std::string out;
        for (size_t i = 0; i < v.list->size(); ++i) {
          if (i > 0) out += ',';
          out += Display((*v.list)[i], at);
          CheckSize(out.size(), at);
        }
        return out;
      }
      case Kind::kDict:
      case Kind::kNamespace:
        return "[object Map]";
      default:
        return Display(v, at);
    }
  }

  struct JsonStyle {
    std::optional<int64_t> indent;
    bool ensure_ascii = false;
    std::string item_separator = ", ", key_separator = ": ";
  };

  void AppendJson(std::string& out, const Value& v, const JsonStyle& style, int depth,
                  bool undefined_as_null, size_t at) const {
    CheckSize(out.size(), at);
    switch (v.kind) {
      case Kind::kUndefined:
        out += undefined_as_null ? "null" : "undefined";
        return;
      case Kind::kNone:
        out += "null";
        return;
      case Kind::kBool:
        out += v.boolean ? "true" : "false";
        return;
      case Kind::kInt:
        out += std::to_string(v.integer);
        return;
      case Kind::kFloat:
        out += std::isfinite(v.number) ? JsNumber(v.number) : "null";
        return;
      case Kind::kString:
        AppendJsonString(out, v.str(), style.ensure_ascii);
        return;
      case Kind::kFunction:
        Throw(at, "cannot convert a function to JSON");
      case Kind::kList:
      case Kind::kDict:
      case Kind::kNamespace:
        break;
    }
    const bool indented = style.indent && *style.indent > 0;
    const std::string unit = indented ? std::string(size_t(*style.indent), ' ') : "";
    std::string base = "\n", child = "\n";
    if (indented) {
      for (int i = 0; i < depth; ++i) base += unit;
      child = base + unit;
    }
    const bool is_list = v.kind == Kind::kList;
    const size_t count = is_list ? v.list->size() : v.dict->entries.size();
    out += is_list ? '[' : '{';
    for (size_t i = 0; i < count; ++i) {
      if (i > 0) out += style.item_separator;
      if (indented) out += child;
      if (is_list) {
        AppendJson(out, (*v.list)[i], style, depth + 1, undefined_as_null, at);
      } else {
        const auto& [key, item] = v.dict->entries[i];
        AppendJsonString(out, key, style.ensure_ascii);
        out += style.key_separator;
        AppendJson(out, item, style, depth + 1, undefined_as_null, at);
      }
    }
    if (indented && count > 0) out += base;
    out += is_list ? ']' : '}';
  }

  // ---- Statements

  void Execute(const std::vector<NodePtr>& block, Scope& scope, Output& out) {
    for (const NodePtr& node : block) Execute(*node, scope, out);
  }

  void Emit(Output& out, const Value& value, size_t at) const {
    if (value.kind == Kind::kNone || value.kind == Kind::kUndefined) return;
    Write(out, Display(value, at), at);
  }

  void Execute(const Node& node, Scope& scope, Output& out) {
    Step(node.at);
    switch (node.type) {
      case NodeType::kText:
        Write(out, node.text, node.at);
        return;
      case NodeType::kOutput:
        Emit(out, Evaluate(*node.a, scope), node.a->at);
        return;
      case NodeType::kIf:
        Execute(Truthy(Evaluate(*node.a, scope)) ? node.body : node.alternate, scope, out);
        return;
      case NodeType::kFor:
        ExecuteFor(node, scope, out);
        return;
      case NodeType::kSet:
        ExecuteSet(node, scope);
        return;
      case NodeType::kBreak:
        throw LoopControl{true};
      case NodeType::kContinue:
        throw LoopControl{false};
      default:
        PS_CHECK(false);  // the parser puts only statements in blocks
    }
  }

  void Assign(const Node& target, const Value& value, Scope& scope, const char* what) {
    if (target.type == NodeType::kIdentifier) {
      scope.variables[target.text] = value;
      return;
    }
    if (target.type != NodeType::kTuple) Throw(target.at, Cat("cannot ", what, " to this"));
    if (value.kind != Kind::kList) {
      Throw(target.at, Cat("cannot unpack a ", KindName(value.kind)));
    }
    if (value.list->size() != target.items.size()) {
      Throw(target.at, Cat("too ", value.list->size() < target.items.size() ? "few" : "many",
                           " values to unpack (expected ", target.items.size(), ", got ",
                           value.list->size(), ")"));
    }
    for (size_t i = 0; i < target.items.size(); ++i) {
      if (target.items[i]->type != NodeType::kIdentifier) {
        Throw(target.items[i]->at, "can only unpack into names");
      }
      scope.variables[target.items[i]->text] = (*value.list)[i];
    }
  }

  void ExecuteSet(const Node& node, Scope& scope) {
    Value value;
    if (node.b) {
      value = Evaluate(*node.b, scope);
    } else {
      Output text(budget);
      Execute(node.body, scope, text);
      value = String(text.Take(), node.at);
    }
    if (node.a->type != NodeType::kMember) {
      Assign(*node.a, value, scope, "assign");
      return;
    }
    const Node& member = *node.a;
    const Value object = Evaluate(*member.a, scope);
    if (object.kind != Kind::kNamespace) {
      Throw(member.at, Cat("cannot set an attribute of a ", KindName(object.kind),
                           " (only of a namespace())"));
    }
    if (member.computed || member.b->type != NodeType::kIdentifier) {
      Throw(member.at, "a namespace attribute must be set as ns.name");
    }
    if (value.holds_namespace) Throw(member.at, "a namespace cannot hold a namespace");
    object.dict->Set(member.b->text, value);
  }

  void ExecuteFor(const Node& node, Scope& outer, Output& out) {
    Scope scope{&outer, {}};
    Value iterable = Evaluate(*node.b, scope);
    if (iterable.kind == Kind::kDict) {
      List keys;
      for (const auto& [key, item] : iterable.dict->entries) keys.push_back(String(key, node.at));
      iterable = MakeList(std::move(keys), node.at);
    }
    if (iterable.kind != Kind::kList) {
      Throw(node.b->at, Cat("cannot loop over a ", KindName(iterable.kind)));
    }
    if (node.c) {
      List kept;
      for (const Value& item : *iterable.list) {
        Step(node.at);
        Scope test_scope{&scope, {}};
        Assign(*node.a, item, test_scope, "unpack");
        if (Truthy(Evaluate(*node.c, test_scope))) kept.push_back(item);
      }
      iterable = MakeList(std::move(kept), node.at);
    }
    const List& items = *iterable.list;
    bool iterated = false;
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Step(node.at);
      Dict loop;
      loop.Set("index", Int(i + 1));
      loop.Set("index0", Int(i));
      loop.Set("revindex", Int(n - i));
      loop.Set("revindex0", Int(n - i - 1));
      loop.Set("first", Bool(i == 0));
      loop.Set("last", Bool(i == n - 1));
      loop.Set("length", Int(n));
      loop.Set("previtem", i > 0 ? items[size_t(i - 1)] : Undefined());
      loop.Set("nextitem", i < n - 1 ? items[size_t(i + 1)] : Undefined());
      scope.variables["loop"] = MakeDict(std::move(loop), node.at);
      Assign(*node.a, items[size_t(i)], scope, "unpack");
      // A break or continue ends the iteration before it counts, as in @huggingface/jinja:
      // a loop whose every iteration breaks or continues renders its else block.
      Output body(budget);
      try {
        Execute(node.body, scope, body);
      } catch (const LoopControl& control) {
        // The iteration's output so far is dropped, as in @huggingface/jinja.
        if (control.is_break) break;
        continue;
      }
      Write(out, body.text, node.at);
      iterated = true;
    }
    if (!iterated) Execute(node.alternate, scope, out);
  }

  // ---- Expressions

  Value Evaluate(const Node& node, Scope& scope) {
    Step(node.at);
    switch (node.type) {
      case NodeType::kString:
        return String(node.text, node.at);
      case NodeType::kInteger:
        return Int(node.integer);
      case NodeType::kFloat:
        return Float(node.number);
      case NodeType::kIdentifier:
        return scope.Lookup(node.text);
      case NodeType::kList:
      case NodeType::kTuple: {
        List items;
        for (const NodePtr& item : node.items) items.push_back(Evaluate(*item, scope));
        return MakeList(std::move(items), node.at);
      }
      case NodeType::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < node.items.size(); i += 2) {
          const Value key = Evaluate(*node.items[i], scope);
          if (key.kind != Kind::kString) {
            Throw(node.items[i]->at, Cat("dict keys must be strings, not ", KindName(key.kind)));
          }
          dict.Set(key.str(), Evaluate(*node.items[i + 1], scope));
        }
        return MakeDict(std::move(dict), node.at);
      }
      case NodeType::kMember:
        return EvaluateMember(node, scope);
      case NodeType::kCall:
        return EvaluateCall(node, scope);
      case NodeType::kFilter:
        return ApplyFilter(node, Evaluate(*node.a, scope), scope);
      case NodeType::kTest: {
        const Value operand = Evaluate(*node.a, scope);
        return Bool(RunTest(node.text, operand, Undefined(), node.at) != node.negate);
      }
      case NodeType::kUnary:
        return EvaluateUnary(node, scope);
      case NodeType::kBinary:
        return EvaluateBinary(node, scope);
      case NodeType::kTernary:
        return Truthy(Evaluate(*node.a, scope)) ? Evaluate(*node.b, scope)
                                                : Evaluate(*node.c, scope);
      case NodeType::kSelect:
        return Truthy(Evaluate(*node.b, scope)) ? Evaluate(*node.a, scope) : Undefined();
      case NodeType::kKeyword:
        Throw(node.at, "a keyword argument outside a call");
      case NodeType::kSlice:
        Throw(node.at, "a slice outside [ ]");
      default:
        Throw(node.at, "a statement where an expression was expected");
    }
  }

  // Arguments in order: positional first, then keywords (as Python evaluates them).
  void EvaluateArguments(const std::vector<NodePtr>& nodes, Scope& scope, List& positional,
                         std::vector<std::pair<std::string, Value>>& keywords) {
    for (const NodePtr& n : nodes) {
      if (n->type != NodeType::kKeyword) positional.push_back(Evaluate(*n, scope));
    }
    for (const NodePtr& n : nodes) {
      if (n->type != NodeType::kKeyword) continue;
      for (const auto& [name, value] : keywords) {
        if (name == n->text) Throw(n->at, Cat("keyword argument '", n->text, "' given twice"));
      }
      keywords.emplace_back(n->text, Evaluate(*n->a, scope));
    }
  }

  Value EvaluateCall(const Node& node, Scope& scope) {
    List positional;
    std::vector<std::pair<std::string, Value>> keywords;
    EvaluateArguments(node.items, scope, positional, keywords);
    const Value callee = Evaluate(*node.a, scope);
    if (callee.kind != Kind::kFunction) {
      Throw(node.at, Cat("cannot call a ", KindName(callee.kind)));
    }
    return (*callee.function)(*this, node.at, CallArgs{&positional, &keywords});
  }

  // Index into a list or string, negative from the end (JavaScript's .at()).
  static std::optional<size_t> At(int64_t index, size_t size) {
    if (index < 0) index += int64_t(size);
    if (index < 0 || index >= int64_t(size)) return std::nullopt;
    return size_t(index);
  }

  Value EvaluateMember(const Node& node, Scope& scope) {
    const Value object = Evaluate(*node.a, scope);
    if (node.computed && node.b->type == NodeType::kSlice) return Slice(node, object, scope);
    Value property;
    if (node.computed) {
      property = Evaluate(*node.b, scope);
    } else if (node.b->type == NodeType::kInteger) {
      property = Int(node.b->integer);
    } else {
      property = String(node.b->text, node.at);
    }
    switch (object.kind) {
      case Kind::kDict:
      case Kind::kNamespace: {
        if (property.kind != Kind::kString) {
          Throw(node.at,
                Cat("cannot look up a ", KindName(property.kind), " in a ", KindName(object.kind)));
        }
        if (const Value* found = object.dict->Find(property.str())) return *found;
        return object.kind == Kind::kDict ? DictMethod(object, property.str()) : Undefined();
      }
      case Kind::kList:
      case Kind::kString: {
        if (property.kind == Kind::kInt) {
          if (object.kind == Kind::kList) {
            const auto index = At(property.integer, object.list->size());
            return index ? (*object.list)[*index] : Undefined();
          }
          return StringIndex(object.str(), property.integer, node.at);
        }
        if (property.kind != Kind::kString) {
          Throw(node.at,
                Cat("cannot index a ", KindName(object.kind), " with a ", KindName(property.kind)));
        }
        if (object.kind == Kind::kList) {
          return property.str() == "length" ? Int(int64_t(object.list->size())) : Undefined();
        }
        return StringMethod(object, property.str(), node.at);
      }
      default:
        if (property.kind != Kind::kString) {
          Throw(node.at,
                Cat("cannot index a ", KindName(object.kind), " with a ", KindName(property.kind)));
        }
        return Undefined();  // attributes of undefined, none and numbers are undefined
    }
  }

  // One UTF-16 unit of JavaScript's string.at(): code points here; a character beyond the
  // Basic Multilingual Plane, which JavaScript splits in two, is an error.
  Value StringIndex(const std::string& text, int64_t index, size_t at) const {
    size_t count = 0;
    ForEachCodePoint(text, [&](std::string_view) { ++count; });
    if (int64_t(count) != Utf16Length(text)) {
      Throw(at, "indexing a string with characters beyond U+FFFF is not supported");
    }
    const auto i = At(index, count);
    if (!i) return Undefined();
    std::string point;
    size_t n = 0;
    ForEachCodePoint(text, [&](std::string_view piece) {
      if (n++ == *i) point = piece;
    });
    return String(std::move(point), at);
  }

  Value Slice(const Node& node, const Value& object, Scope& scope) {
    const Node& slice = *node.b;
    std::optional<int64_t> bounds[3];
    const Node* parts[3] = {slice.a.get(), slice.b.get(), slice.c.get()};
    for (int i = 0; i < 3; ++i) {
      if (parts[i] == nullptr) continue;
      const Value v = Evaluate(*parts[i], scope);
      if (v.kind == Kind::kUndefined) continue;
      if (v.kind != Kind::kInt) Throw(parts[i]->at, "slice bounds must be integers");
      bounds[i] = v.integer;
    }
    // Python's slice of a sequence of `length`: the indices start, start + step, ... short
    // of stop.
    struct Range {
      int64_t start, stop, step;
      bool Has(int64_t i) const {
        if (step > 0) return i >= start && i < stop && (i - start) % step == 0;
        // start - i cannot overflow (both are in [-1, length)); -step can, so it is unsigned.
        if (step < 0) return i <= start && i > stop && uint64_t(start - i) % -uint64_t(step) == 0;
        return false;
      }
    };
    const auto range = [&](int64_t length) {
      Range r{0, 0, bounds[2].value_or(1)};
      if (r.step >= 0) {
        r.start = bounds[0].value_or(0);
        r.start = r.start < 0 ? std::max(length + r.start, int64_t{0}) : std::min(r.start, length);
        r.stop = bounds[1].value_or(length);
        r.stop = r.stop < 0 ? std::max(length + r.stop, int64_t{0}) : std::min(r.stop, length);
      } else {
        r.start = bounds[0].value_or(length - 1);
        r.start =
            r.start < 0 ? std::max(length + r.start, int64_t{-1}) : std::min(r.start, length - 1);
        r.stop = bounds[1].value_or(-1);
        r.stop =
            r.stop < -1 ? std::max(length + r.stop, int64_t{-1}) : std::min(r.stop, length - 1);
      }
      return r;
    };
    if (object.kind == Kind::kList) {
      const Range r = range(int64_t(object.list->size()));
      const int64_t direction = r.step > 0 ? 1 : r.step < 0 ? -1 : 0;
      List items;
      for (int64_t i = r.start; direction * i < direction * r.stop;) {
        items.push_back((*object.list)[size_t(i)]);
        if (__builtin_add_overflow(i, r.step, &i)) break;
      }
      return MakeList(std::move(items), node.at);
    }
    if (object.kind == Kind::kString) {
      // The code points are walked, not tabulated: a table would take 16 bytes for each.
      const std::string& source = object.str();
      int64_t length = 0;
      ForEachCodePoint(source, [&](std::string_view) { ++length; });
      const Range r = range(length);
      std::string text;
      int64_t i = 0;
      if (r.step >= 0) {
        ForEachCodePoint(source, [&](std::string_view piece) {
          if (r.Has(i++)) text += piece;
        });
        return String(std::move(text), node.at);
      }
      // Backwards: the picked code points, met in forward order, fill the text from its end.
      size_t bytes = 0;
      ForEachCodePoint(source, [&](std::string_view piece) {
        if (r.Has(i++)) bytes += piece.size();
      });
      CheckSize(bytes, node.at);
      text.resize(bytes);
      i = 0;
      ForEachCodePoint(source, [&](std::string_view piece) {
        if (!r.Has(i++)) return;
        bytes -= piece.size();
        text.replace(bytes, piece.size(), piece);
      });
      return String(std::move(text), node.at);
    }
    Throw(node.at, Cat("cannot slice a ", KindName(object.kind)));
  }

  Value EvaluateUnary(const Node& node, Scope& scope) {
    const Value v = Evaluate(*node.a, scope);
    if (node.text == "not") return Bool(!Truthy(v));
    const bool minus = node.text == "-";
    if (v.kind == Kind::kFloat) return Float(minus ? -v.number : v.number);
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
      const int64_t i = v.kind == Kind::kBool ? int64_t{v.boolean} : v.integer;
      if (minus && i == std::numeric_limits<int64_t>::min()) Throw(node.at, "integer overflow");
      return Int(minus ? -i : i);
    }
    Throw(node.at, Cat("cannot apply unary ", node.text, " to a ", KindName(v.kind)));
  }

  // JavaScript's loose == on the values @huggingface/jinja compares.
  bool LooseEquals(const Value& a, const Value& b, size_t at) const {
    const auto nullish = [](const Value& v) {
      return v.kind == Kind::kUndefined || v.kind == Kind::kNone;
    };
    if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
    const auto scalar = [](const Value& v) {
      return v.kind == Kind::kBool || v.kind == Kind::kInt || v.kind == Kind::kFloat ||
             v.kind == Kind::kString;
    };
    if (scalar(a) && scalar(b)) {
      if (a.kind == Kind::kString && b.kind == Kind::kString) return a.str() == b.str();
      if (a.kind == Kind::kInt && b.kind == Kind::kInt) return a.integer == b.integer;
      return ToNumber(a) == ToNumber(b);
    }
    if (a.kind != b.kind) {
      if (scalar(a) || scalar(b)) {
        Throw(at, Cat("comparing a ", KindName(a.kind), " with a ", KindName(b.kind),
                      " is not supported"));
      }
      return false;
    }
    switch (a.kind) {
      case Kind::kList:
        return a.list == b.list;
      case Kind::kDict:
      case Kind::kNamespace:
        return a.dict == b.dict;
      default:
        return a.function == b.function;
    }
  }

  // JavaScript's Number(v) for booleans, numbers and strings.
  static double ToNumber(const Value& v) {
    if (v.kind != Kind::kString) return AsDouble(v);
    const std::string text(Trim(v.str()));
    if (text.empty()) return 0;
    if (text == "Infinity" || text == "+Infinity") return INFINITY;
    if (text == "-Infinity") return -INFINITY;
    double result = 0;
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    const char* end = text.data() + text.size();
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
      uint64_t hex = 0;
      const auto parsed = std::from_chars(begin + 2, end, hex, 16);
      return parsed.ptr == end ? double(hex) : NAN;
    }
    const auto parsed = std::from_chars(begin, end, result);
    return parsed.ec == std::errc() && parsed.ptr == end ? result : NAN;
  }

  static bool ListContains(const List& list, const Value& needle) {
    // JavaScript's ===: strings and numbers by value, containers by identity.
    for (const Value& item : list) {
      if (item.kind == needle.kind || (IsNumber(item) && IsNumber(needle))) {
        switch (needle.kind) {
          case Kind::kUndefined:
          case Kind::kNone:
            return true;
          case Kind::kBool:
            if (item.boolean == needle.boolean) return true;
            break;
          case Kind::kInt:
          case Kind::kFloat:
            if (AsDouble(item) == AsDouble(needle)) return true;
            break;
          case Kind::kString:
            if (item.str() == needle.str()) return true;
            break;
          case Kind::kList:
            if (item.list == needle.list) return true;
            break;
          case Kind::kDict:
          case Kind::kNamespace:
            if (item.dict == needle.dict) return true;
            break;
          case Kind::kFunction:
            if (item.function == needle.function) return true;
            break;
        }
      }
    }
    return false;
  }

  Value Arithmetic(const std::string& op, const Value& a, const Value& b, size_t at) const {
    const bool floats = a.kind == Kind::kFloat || b.kind == Kind::kFloat;
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      const double x = AsDouble(a), y = AsDouble(b);
      if (!floats) {
        const int64_t i = a.integer, j = b.integer;
        return Bool(op == "<" ? i < j : op == ">" ? i > j : op == "<=" ? i <= j : i >= j);
      }
      return Bool(op == "<" ? x < y : op == ">" ? x > y : op == "<=" ? x <= y : x >= y);
    }
    if (op == "/") {
      if (AsDouble(b) == 0) Throw(at, "division by zero");
      return Float(AsDouble(a) / AsDouble(b));
    }
    if (floats) {
      const double x = AsDouble(a), y = AsDouble(b);
      if ((op == "//" || op == "%") && y == 0) Throw(at, "division by zero");
      if (op == "+") return Float(x + y);
      if (op == "-") return Float(x - y);
      if (op == "*") return Float(x * y);
      if (op == "//") return Float(std::floor(x / y));
      return Float(std::fmod(x, y));  // JavaScript's %: the sign of the dividend
    }
    const int64_t x = a.integer, y = b.integer;
    int64_t result = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(x, y, &result);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(x, y, &result);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(x, y, &result);
    } else {
      if (y == 0) Throw(at, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) Throw(at, "integer overflow");
      if (op == "//") {
        result = x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0);
      } else {
        result = x % y;
      }
    }
    if (overflow) Throw(at, "integer overflow");
    return Int(result);
  }

  Value Power(const Value& a, const Value& b, size_t at) const {
    const double x = AsDouble(a), y = AsDouble(b);
    if (x == 0 && y < 0) Throw(at, "0.0 cannot be raised to a negative power");
    const double result = std::pow(x, y);
    if (!std::isfinite(result)) Throw(at, "exponentiation result is not a finite real number");
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat || y < 0) return Float(result);
    if (std::fabs(result) >= 9.2e18) Throw(at, "integer overflow");
    return Int(int64_t(result));
  }

  Value EvaluateBinary(const Node& node, Scope& scope) {
    const std::string& op = node.text;
    const Value left = Evaluate(*node.a, scope);
    if (op == "and") return Truthy(left) ? Evaluate(*node.b, scope) : left;
    if (op == "or") return Truthy(left) ? left : Evaluate(*node.b, scope);
    const Value right = Evaluate(*node.b, scope);
    if (op == "==") return Bool(LooseEquals(left, right, node.at));
    if (op == "!=") return Bool(!LooseEquals(left, right, node.at));
    const bool membership = op == "in" || op == "not in";
    if (left.kind == Kind::kUndefined || right.kind == Kind::kUndefined) {
      if (right.kind == Kind::kUndefined && membership) return Bool(op == "not in");
      Throw(node.at, Cat("cannot apply ", op, " to an undefined value"));
    }
    if (left.kind == Kind::kNone || right.kind == Kind::kNone) {
      Throw(node.at, Cat("cannot apply ", op, " to none"));
    }
    if (op == "~") return String(Raw(left, node.at) + Raw(right, node.at), node.at);
    const auto numeric_like = [](const Value& v) { return IsNumber(v) || v.kind == Kind::kBool; };
    if (op == "**" && numeric_like(left) && numeric_like(right)) {
      return Power(left, right, node.at);
    }
    if (IsNumber(left) && IsNumber(right) && op != "**" && !membership) {
      return Arithmetic(op, left, right, node.at);
    }
    if (left.kind == Kind::kList && right.kind == Kind::kList) {
      if (op == "+") {
        if (left.list->size() + right.list->size() > limits.max_list_items) {
          Throw(node.at, Cat("a list grew beyond ", limits.max_list_items, " items"));
        }
        List items = *left.list;
        items.insert(items.end(), right.list->begin(), right.list->end());
        return MakeList(std::move(items), node.at);
      }
    } else if (right.kind == Kind::kList && membership) {
      return Bool(ListContains(*right.list, left) == (op == "in"));
    }
    if ((left.kind == Kind::kString || right.kind == Kind::kString) && op == "+") {
      std::string text = Raw(left, node.at);
      text += Raw(right, node.at);
      return String(std::move(text), node.at);
    }
    if (left.kind == Kind::kString && right.kind == Kind::kString && membership) {
      return Bool((right.str().find(left.str()) != std::string::npos) == (op == "in"));
    }
    if (left.kind == Kind::kString && right.kind == Kind::kDict && membership) {
      return Bool((right.dict->Find(left.str()) != nullptr) == (op == "in"));
    }
    Throw(node.at, Cat("operator ", op, " is not defined between a ", KindName(left.kind),
                       " and a ", KindName(right.kind)));
  }

  // ---- Tests

  bool RunTest(const std::string& name, const Value& v, const Value& argument, size_t at) const {
    if (name == "defined") return v.kind != Kind::kUndefined;
    if (name == "undefined") return v.kind == Kind::kUndefined;
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "number") return IsNumber(v);
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.boolean;
    if (name == "false") return v.kind == Kind::kBool && !v.boolean;
    if (name == "callable") return v.kind == Kind::kFunction;
    if (name == "iterable") return v.kind == Kind::kList || v.kind == Kind::kString;
    if (name == "mapping") return v.kind == Kind::kDict;
    if (name == "sequence") {
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString;
    }
    if (name == "odd" || name == "even") {
      if (v.kind != Kind::kInt) Throw(at, Cat("cannot test ", name, " on a ", KindName(v.kind)));
      return (v.integer % 2 != 0) == (name == "odd");
    }
    if (name == "lower" || name == "upper") {
      return v.kind == Kind::kString && v.str() == ChangeCase(v.str(), name == "upper");
    }
    if (name == "eq" || name == "equalto") return StrictEquals(v, argument);
    Throw(at, Cat("unknown test '", name, "'"));
  }

  // JavaScript's === on the values.
  static bool StrictEquals(const Value& a, const Value& b) {
    if (a.kind == Kind::kUndefined || b.kind == Kind::kUndefined) {
      return a.kind == Kind::kUndefined && b.kind == Kind::kUndefined;
    }
    return ListContains(List{a}, b);
  }

  // ---- Methods

  static const Value* Keyword(const CallArgs& args, std::string_view name) {
    for (const auto& [key, value] : *args.keywords) {
      if (key == name) return &value;
    }
    return nullptr;
  }

  // The positional argument i, else the keyword `name`, else null.
  static const Value* Argument(const CallArgs& args, size_t i, std::string_view name) {
    if (i < args.positional->size()) return &(*args.positional)[i];
    return Keyword(args, name);
  }

  void NoKeywords(const CallArgs& args, std::string_view method, size_t at,
                  std::initializer_list<std::string_view> allowed = {}) const {
    for (const auto& [key, value] : *args.keywords) {
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        Throw(at, Cat(method, "() got an unexpected keyword argument '", key, "'"));
      }
    }
  }

  Value DictMethod(const Value& object, const std::string& name) const {
    const std::shared_ptr<Dict> dict = object.dict;
    if (name == "get") {
      return Function([dict](Interpreter& in, size_t call_at, CallArgs args) {
        in.NoKeywords(args, "get", call_at);
        if (args.positional->empty() || (*args.positional)[0].kind != Kind::kString) {
          in.Throw(call_at, "get() needs a string key");
        }
        if (const Value* found = dict->Find((*args.positional)[0].str())) return *found;
        return args.positional->size() > 1 ? (*args.positional)[1] : None();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      return Function([dict, name](Interpreter& in, size_t call_at, CallArgs args) {
        in.NoKeywords(args, name, call_at);
        return in.DictView(*dict, name, call_at);
      });
    }
    return Undefined();
  }

  Value DictView(const Dict& dict, const std::string& name, size_t at) const {
    List items;
    for (const auto& [key, item] : dict.entries) {
      if (name == "items") {
        items.push_back(MakeList({String(key, at), item}, at));
      } else if (name == "keys") {
        items.push_back(String(key, at));
      } else {
        items.push_back(item);
      }
    }
    return MakeList(std::move(items), at);
  }

  Value StringMethod(const Value& object, const std::string& name, size_t at) const {
    const std::shared_ptr<const std::string> text = object.string;
    if (name == "length") return Int(Utf16Length(*text));
    const auto method = [&](std::function<Value(Interpreter&, size_t, CallArgs)> body) {
      return Function([body = std::move(body)](Interpreter& in, size_t call_at, CallArgs args) {
        return body(in, call_at, args);
      });
    };
    if (name == "upper" || name == "lower") {
      return method([text, name](Interpreter& in, size_t call_at, CallArgs) {
        return in.String(ChangeCase(*text, name == "upper"), call_at);
      });
    }
    // @huggingface/jinja's strip, lstrip and rstrip ignore their argument: they always
    // remove whitespace (so strip('\n') also strips spaces).
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return method([text, name](Interpreter& in, size_t call_at, CallArgs) {
        const std::string_view t = name == "strip"    ? Trim(*text)
                                   : name == "lstrip" ? TrimStart(*text)
                                                      : TrimEnd(*text);
        return in.String(std::string(t), call_at);
      });
    }
    if (name == "title" || name == "capitalize") {
      return method([text, name](Interpreter& in, size_t call_at, CallArgs) {
        return in.String(name == "title" ? TitleCase(*text) : Capitalize(*text), call_at);
      });
    }
    if (name == "startswith" || name == "endswith") {
      return method([text, name](Interpreter& in, size_t call_at, CallArgs args) {
        in.NoKeywords(args, name, call_at);
        if (args.positional->empty()) in.Throw(call_at, Cat(name, "() needs an argument"));
        const Value& pattern = (*args.positional)[0];
        const auto matches = [&](const Value& p) {
          if (p.kind != Kind::kString) in.Throw(call_at, Cat(name, "() takes strings"));
          return name == "startswith" ? std::string_view(*text).starts_with(p.str())
                                      : std::string_view(*text).ends_with(p.str());
        };
        if (pattern.kind == Kind::kList) {
          for (const Value& p : *pattern.list) {
            if (matches(p)) return Bool(true);
          }
          return Bool(false);
        }
        return Bool(matches(pattern));
      });
    }
    if (name == "split") {
      return method([text](Interpreter& in, size_t call_at, CallArgs args) {
        return in.Split(*text, args, call_at);
      });
    }
    if (name == "replace") {
      return method([text](Interpreter& in, size_t call_at, CallArgs args) {
        return in.Replace(*text, args, call_at);
      });
    }
    return Undefined();
  }

  static std::string TitleCase(const std::string& text) {
    // /\b\w/g upper-cased: an ASCII word character after a non-word character.
    std::string out = text;
    for (size_t i = 0; i < out.size(); ++i) {
      if (IsAsciiWord(out[i]) && (i == 0 || !IsAsciiWord(out[i - 1])) && out[i] >= 'a' &&
          out[i] <= 'z') {
        out[i] = char(out[i] - 'a' + 'A');
      }
    }
    return out;
  }

  static std::string Capitalize(const std::string& text) {
    // charAt(0).toUpperCase() + slice(1): the first code point, the rest unchanged.
    if (text.empty()) return text;
    const size_t n = unicode::DecodeUtf8(text, 0).length;
    if (unicode::DecodeUtf8(text, 0).code_point >= 0x10000) {
      return text;  // JavaScript upper-cases half a surrogate pair: nothing changes
    }
    return ChangeCase(std::string_view(text).substr(0, n), true) + text.substr(n);
  }

  Value Split(const std::string& text, CallArgs args, size_t at) const {
    NoKeywords(args, "split", at);
    const Value separator = args.positional->size() > 0 ? (*args.positional)[0] : None();
    const Value maxsplit_value = args.positional->size() > 1 ? (*args.positional)[1] : Int(-1);
    if (separator.kind != Kind::kString && separator.kind != Kind::kNone) {
      Throw(at, "split() separator must be a string or none");
    }
    if (maxsplit_value.kind != Kind::kInt) Throw(at, "split() maxsplit must be an integer");
    const int64_t maxsplit = maxsplit_value.integer;
    List parts;
    const auto add = [&](std::string_view part) {
      parts.push_back(String(std::string(part), at));
      if (parts.size() > limits.max_list_items) {
        Throw(at, Cat("a list grew beyond ", limits.max_list_items, " items"));
      }
    };
    if (separator.kind == Kind::kNone) {
      const std::string_view rest = TrimStart(text);
      size_t i = 0;
      while (i < rest.size()) {
        size_t begin = i;
        while (size_t n = SpaceAt(rest, begin)) begin += n;
        if (begin >= rest.size()) break;
        if (maxsplit != -1 && int64_t(parts.size()) >= maxsplit) {
          add(rest.substr(begin));
          break;
        }
        size_t end = begin;
        while (end < rest.size() && SpaceAt(rest, end) == 0) {
          end += unicode::DecodeUtf8(rest, end).length;
        }
        add(rest.substr(begin, end - begin));
        i = end;
      }
    } else {
      const std::string& sep = separator.str();
      if (sep.empty()) Throw(at, "split() separator is empty");
      size_t begin = 0;
      while (true) {
        const size_t found = text.find(sep, begin);
        if (found == std::string::npos || (maxsplit != -1 && int64_t(parts.size()) >= maxsplit)) {
          add(std::string_view(text).substr(begin));
          break;
        }
        add(std::string_view(text).substr(begin, found - begin));
        begin = found + sep.size();
      }
    }
    return MakeList(std::move(parts), at);
  }

  Value Replace(const std::string& text, CallArgs args, size_t at) const {
    NoKeywords(args, "replace", at, {"count"});
    if (args.positional->size() < 2) Throw(at, "replace() needs two arguments");
    const Value& old_value = (*args.positional)[0];
    const Value& new_value = (*args.positional)[1];
    if (old_value.kind != Kind::kString || new_value.kind != Kind::kString) {
      Throw(at, "replace() arguments must be strings");
    }
    const Value* count_value = Argument(args, 2, "count");
    int64_t remaining = std::numeric_limits<int64_t>::max();
    if (count_value != nullptr && count_value->kind != Kind::kNone) {
      if (count_value->kind != Kind::kInt) Throw(at, "replace() count must be an integer");
      if (count_value->integer >= 0) remaining = count_value->integer;
    }
    const std::string& from = old_value.str();
    const std::string& to = new_value.str();
    std::string out;
    const auto append = [&](std::string_view piece) {
      out += piece;
      CheckSize(out.size(), at);
    };
    if (from.empty()) {  // between every two code points and at both ends
      for (size_t i = 0;; i += unicode::DecodeUtf8(text, i).length) {
        if (remaining > 0) {
          append(to);
          --remaining;
        }
        if (i >= text.size()) break;
        append(std::string_view(text).substr(i, unicode::DecodeUtf8(text, i).length));
      }
      return String(std::move(out), at);
    }
    size_t begin = 0;
    while (remaining > 0) {
      const size_t found = text.find(from, begin);
      if (found == std::string::npos) break;
      append(std::string_view(text).substr(begin, found - begin));
      append(to);
      begin = found + from.size();
      --remaining;
    }
    append(std::string_view(text).substr(begin));
    return String(std::move(out), at);
  }

  // ---- Filters

  Value ApplyFilter(const Node& node, const Value& operand, Scope& scope) {
    const std::string& name = node.text;
    const size_t at = node.at;
    if (name == "safe") return operand;
    List positional;
    std::vector<std::pair<std::string, Value>> keywords;
    EvaluateArguments(node.items, scope, positional, keywords);
    const CallArgs args{&positional, &keywords};
    if (name == "tojson") {
      JsonStyle style;
      if (node.called) {
        NoKeywords(args, "tojson", at, {"indent", "ensure_ascii", "sort_keys", "separators"});
        if (const Value* indent = Keyword(args, "indent"); indent && indent->kind != Kind::kNone) {
          if (indent->kind != Kind::kInt) Throw(at, "tojson indent must be an integer");
          if (indent->integer > 64) Throw(at, "tojson indent above 64 is not supported");
          style.indent = indent->integer;
          if (indent->integer > 0) style.item_separator = ",";
        }
        if (const Value* ascii = Keyword(args, "ensure_ascii")) {
          if (ascii->kind != Kind::kBool) Throw(at, "tojson ensure_ascii must be a boolean");
          style.ensure_ascii = ascii->boolean;
        }
        if (const Value* sort = Keyword(args, "sort_keys"); sort && Truthy(*sort)) {
          Throw(at, "tojson sort_keys is not supported");
        }
        if (const Value* separators = Keyword(args, "separators");
            separators && separators->kind != Kind::kNone) {
          if (separators->kind != Kind::kList || separators->list->size() != 2 ||
              (*separators->list)[0].kind != Kind::kString ||
              (*separators->list)[1].kind != Kind::kString) {
            Throw(at, "tojson separators must be two strings");
          }
          style.item_separator = (*separators->list)[0].str();
          style.key_separator = (*separators->list)[1].str();
        }
      }
      std::string out;
      AppendJson(out, operand, style, 0, true, at);
      return String(std::move(out), at);
    }
    if (node.called) {
      if (name == "join") return Join(operand, args, at);
      if (name == "int" || name == "float") {
        const Value* fallback = Argument(args, 0, "default");
        const Value default_value = fallback ? *fallback : name == "int" ? Int(0) : Float(0);
        return ToNumberFilter(name, operand, default_value, at);
      }
      if (name == "default") {
        const Value default_value = positional.empty() ? String("", at) : positional[0];
        const Value* boolean = Argument(args, 1, "boolean");
        if (boolean && boolean->kind != Kind::kBool)
          Throw(at, "default's boolean must be a boolean");
        const bool falsy_counts = boolean && boolean->boolean;
        if (operand.kind == Kind::kUndefined || (falsy_counts && !Truthy(operand))) {
          return default_value;
        }
        return operand;
      }
      if (operand.kind == Kind::kList) {
        if (name == "selectattr" || name == "rejectattr") {
          return SelectAttr(node, operand, positional, name == "selectattr");
        }
        if (name == "map") return MapAttribute(operand, args, at);
      }
      if (operand.kind == Kind::kString && name == "replace") {
        return Replace(operand.str(), args, at);
      }
      if (operand.kind == Kind::kString && name == "indent") return Indent(operand.str(), args, at);
      Throw(at, Cat("filter '", name, "(...)' is not supported on a ", KindName(operand.kind)));
    }
    switch (operand.kind) {
      case Kind::kList: {
        const List& list = *operand.list;
        if (name == "list") return operand;
        if (name == "first") return list.empty() ? Undefined() : list.front();
        if (name == "last") return list.empty() ? Undefined() : list.back();
        if (name == "length") return Int(int64_t(list.size()));
        if (name == "reverse") return MakeList(List(list.rbegin(), list.rend()), at);
        if (name == "join") return Join(operand, args, at);
        if (name == "string") {
          std::string out;
          AppendJson(out, operand, JsonStyle{}, 0, false, at);
          return String(std::move(out), at);
        }
        break;
      }
      case Kind::kString: {
        const std::string& text = operand.str();
        if (name == "length") return Int(Utf16Length(text));
        if (name == "upper" || name == "lower")
          return String(ChangeCase(text, name == "upper"), at);
        if (name == "title") return String(TitleCase(text), at);
        if (name == "capitalize") return String(Capitalize(text), at);
        if (name == "trim") return String(std::string(Trim(text)), at);
        if (name == "indent") return Indent(text, args, at);
        if (name == "join" || name == "string") return operand;
        if (name == "int" || name == "float") {
          return ToNumberFilter(name, operand, name == "int" ? Int(0) : Float(0), at);
        }
        break;
      }
      case Kind::kInt:
      case Kind::kFloat:
        if (name == "abs") {
          if (operand.kind == Kind::kFloat) return Float(std::fabs(operand.number));
          if (operand.integer == std::numeric_limits<int64_t>::min()) Throw(at, "integer overflow");
          return Int(std::abs(operand.integer));
        }
        if (name == "int") {
          if (operand.kind == Kind::kInt) return operand;
          return ToNumberFilter(name, operand, Int(0), at);
        }
        if (name == "float") return Float(AsDouble(operand));
        if (name == "string") return String(Display(operand, at), at);
        break;
      case Kind::kDict:
        if (name == "items") return DictView(*operand.dict, "items", at);
        if (name == "length") return Int(int64_t(operand.dict->entries.size()));
        if (name == "keys" || name == "values") return DictView(*operand.dict, name, at);
        break;
      case Kind::kBool:
        if (name == "bool") return operand;
        if (name == "int") return Int(operand.boolean ? 1 : 0);
        if (name == "float") return Float(operand.boolean ? 1 : 0);
        if (name == "string") return String(operand.boolean ? "true" : "false", at);
        break;
      default:
        break;
    }
    Throw(at, Cat("filter '", name, "' is not supported on a ", KindName(operand.kind)));
  }

  Value ToNumberFilter(const std::string& name, const Value& operand, const Value& fallback,
                       size_t at) const {
    if (operand.kind == Kind::kBool) {
      return name == "int" ? Int(operand.boolean) : Float(operand.boolean);
    }
    if (IsNumber(operand)) {
      if (name == "float" || operand.kind == Kind::kInt) return operand;
      const double d = std::floor(operand.number);  // Math.floor
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) Throw(at, "int of a non-finite float");
      return Int(int64_t(d));
    }
    if (operand.kind != Kind::kString) {
      Throw(at, Cat("filter '", name, "' is not supported on a ", KindName(operand.kind)));
    }
    // parseInt(s, 10) / parseFloat(s): the longest numeric prefix after whitespace.
    const std::string text(TrimStart(operand.str()));
    size_t i = 0;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    const size_t digits_begin = i;
    while (i < text.size() && IsDigit(text[i])) ++i;
    if (name == "int") {
      if (i == digits_begin) return fallback;
      int64_t value = 0;
      const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
      if (std::from_chars(begin, text.data() + i, value).ec != std::errc()) {
        Throw(at, Cat("integer ", text.substr(0, i), " is too large"));
      }
      return Int(value);
    }
    double value = 0;
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    const auto parsed = std::from_chars(begin, text.data() + text.size(), value);
    if (parsed.ec != std::errc() || parsed.ptr == begin) return fallback;
    return Float(value);
  }

  Value Join(const Value& operand, CallArgs args, size_t at) const {
    NoKeywords(args, "join", at, {"separator"});
    const Value* separator_value = Argument(args, 0, "separator");
    std::string separator;
    if (separator_value != nullptr) {
      if (separator_value->kind != Kind::kString) Throw(at, "join's separator must be a string");
      separator = separator_value->str();
    }
    std::string out;
    const auto add = [&](size_t i, std::string_view piece) {
      if (i > 0) out += separator;
      out += piece;
      CheckSize(out.size(), at);
    };
    if (operand.kind == Kind::kString) {
      size_t i = 0;
      ForEachCodePoint(operand.str(), [&](std::string_view piece) { add(i++, piece); });
    } else if (operand.kind == Kind::kList) {
      // Array.join of the raw values: null and undefined join as empty strings.
      for (size_t i = 0; i < operand.list->size(); ++i) {
        const Value& item = (*operand.list)[i];
        const bool empty = item.kind == Kind::kUndefined || item.kind == Kind::kNone;
        add(i, empty ? "" : Raw(item, at));
      }
    } else {
      Throw(at, Cat("filter 'join' is not supported on a ", KindName(operand.kind)));
    }
    return String(std::move(out), at);
  }

  Value Indent(const std::string& text, CallArgs args, size_t at) const {
    NoKeywords(args, "indent", at, {"width", "first", "blank"});
    const Value* width_value = Argument(args, 0, "width");
    int64_t width = 4;
    if (width_value != nullptr) {
      if (width_value->kind != Kind::kInt || width_value->integer < 0 ||
          width_value->integer > 1024) {
        Throw(at, "indent width must be an integer from 0 to 1024");
      }
      width = width_value->integer;
    }
    const Value* first = Argument(args, 1, "first");
    const Value* blank = Argument(args, 2, "blank");
    const bool indent_first = first && Truthy(*first), indent_blank = blank && Truthy(*blank);
    const std::string pad(size_t(width), ' ');
    std::string out;
    size_t begin = 0;
    for (size_t line = 0;; ++line) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      const std::string_view piece = std::string_view(text).substr(begin, end - begin);
      if (line > 0) out += '\n';
      if ((indent_first || line > 0) && (indent_blank || !piece.empty())) out += pad;
      out += piece;
      CheckSize(out.size(), at);
      if (end >= text.size()) break;
      begin = end + 1;
    }
    return String(std::move(out), at);
  }

  Value SelectAttr(const Node& node, const Value& operand, const List& arguments, bool select) {
    for (const Value& item : *operand.list) {
      if (item.kind != Kind::kDict && item.kind != Kind::kNamespace) {
        Throw(node.at, Cat(node.text, " needs a list of dicts"));
      }
    }
    for (const NodePtr& argument : node.items) {
      if (argument->type != NodeType::kString) {
        Throw(argument->at, Cat("the arguments of ", node.text, " must be string literals"));
      }
    }
    if (arguments.empty()) Throw(node.at, Cat(node.text, " needs an attribute name"));
    const std::string& attribute = arguments[0].str();
    List kept;
    for (const Value& item : *operand.list) {
      Step(node.at);
      const Value* found = item.dict->Find(attribute);
      bool result = false;
      if (found != nullptr) {
        result = arguments.size() > 1
                     ? RunTest(arguments[1].str(), *found,
                               arguments.size() > 2 ? arguments[2] : Undefined(), node.at)
                     : Truthy(*found);
      }
      if (result == select) kept.push_back(item);
    }
    return MakeList(std::move(kept), node.at);
  }

  Value MapAttribute(const Value& operand, CallArgs args, size_t at) const {
    const Value* attribute = Keyword(args, "attribute");
    if (attribute == nullptr) Throw(at, "map is supported only with attribute=");
    if (attribute->kind != Kind::kString) Throw(at, "map's attribute must be a string");
    const Value* fallback = Keyword(args, "default");
    List mapped;
    for (const Value& item : *operand.list) {
      if (item.kind != Kind::kDict && item.kind != Kind::kNamespace) {
        Throw(at, "map(attribute=...) needs a list of dicts");
      }
      // A dotted path: "a.b" or "items.0".
      Value value = item;
      std::string_view path = attribute->str();
      while (true) {
        const size_t dot = path.find('.');
        const std::string part(path.substr(0, dot));
        if (value.kind == Kind::kDict || value.kind == Kind::kNamespace) {
          const Value* found = value.dict->Find(part);
          value = found ? *found : Undefined();
        } else if (value.kind == Kind::kList) {
          int64_t index = -1;
          const auto parsed = std::from_chars(part.data(), part.data() + part.size(), index);
          value = parsed.ec == std::errc() && index >= 0 && size_t(index) < value.list->size()
                      ? (*value.list)[size_t(index)]
                      : Undefined();
        } else {
          value = Undefined();
        }
        if (dot == std::string_view::npos) break;
        path.remove_prefix(dot + 1);
      }
      if (value.kind == Kind::kUndefined && fallback != nullptr) value = *fallback;
      mapped.push_back(value);
    }
    return MakeList(std::move(mapped), at);
  }

  // ---- Globals

  void AddGlobals(Scope& scope) const {
    scope.variables["true"] = Bool(true);
    scope.variables["false"] = Bool(false);
    scope.variables["none"] = None();
    scope.variables["True"] = Bool(true);
    scope.variables["False"] = Bool(false);
    scope.variables["None"] = None();
    scope.variables["raise_exception"] = Function([](Interpreter& in, size_t at, CallArgs args) {
      std::string message;
      if (!args.positional->empty()) message = in.Raw((*args.positional)[0], at);
      in.Throw(at, "the chat template raised an error: " + message);
      return Undefined();
    });
    scope.variables["range"] = Function([](Interpreter& in, size_t at, CallArgs args) {
      in.NoKeywords(args, "range", at);
      const List& p = *args.positional;
      if (p.empty() || p.size() > 3) in.Throw(at, "range() takes 1 to 3 integers");
      for (const Value& v : p) {
        if (v.kind != Kind::kInt) in.Throw(at, "range() takes integers");
      }
      const int64_t start = p.size() == 1 ? 0 : p[0].integer;
      const int64_t stop = p.size() == 1 ? p[0].integer : p[1].integer;
      const int64_t step = p.size() == 3 ? p[2].integer : 1;
      if (step == 0) in.Throw(at, "range() step must not be zero");
      List items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (items.size() >= in.limits.max_list_items) {
          in.Throw(at, Cat("a list grew beyond ", in.limits.max_list_items, " items"));
        }
        items.push_back(Int(i));
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return in.MakeList(std::move(items), at);
    });
    scope.variables["namespace"] = Function([](Interpreter& in, size_t at, CallArgs args) {
      if (args.positional->size() > 1) in.Throw(at, "namespace() takes at most 1 argument");
      Dict entries;
      if (!args.positional->empty()) {
        const Value& source = (*args.positional)[0];
        if (source.kind == Kind::kDict) {
          entries = *source.dict;
        } else if (source.kind == Kind::kList) {
          for (const Value& pair : *source.list) {
            if (pair.kind != Kind::kList || pair.list->size() != 2 ||
                (*pair.list)[0].kind != Kind::kString) {
              in.Throw(at, "namespace() takes a dict or a list of [key, value] pairs");
            }
            entries.Set((*pair.list)[0].str(), (*pair.list)[1]);
          }
        } else {
          in.Throw(at, Cat("namespace() cannot read a ", KindName(source.kind)));
        }
      }
      for (const auto& [key, value] : *args.keywords) entries.Set(key, value);
      for (const auto& [key, value] : entries.entries) {
        if (value.holds_namespace) in.Throw(at, "a namespace cannot hold a namespace");
      }
      return in.MakeDict(std::move(entries), at, Kind::kNamespace);
    });
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Template

struct Template::Program {
  Source source;
  std::vector<NodePtr> body;
};

Template::Template(std::string_view source, std::string where) {
  auto program = std::make_unique<Program>();
  program->source.where = std::move(where);
  program->source.original = unicode::ToValidUtf8(source);
  Preprocess(program->source);
  Parser parser(program->source, Lexer(program->source).Run());
  program->body = parser.Run();
  program_ = std::move(program);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::Render(const nlohmann::ordered_json& context,
                             const RenderLimits& limits) const {
  if (!context.is_object()) Fail(program_->source.where, ": the variables must be a JSON object");
  MemoryBudget budget{limits.max_total_bytes};
  Interpreter interpreter{program_->source, limits, budget};
  Scope globals;
  interpreter.AddGlobals(globals);
  for (const auto& [key, value] : context.items()) {
    globals.variables[unicode::ToValidUtf8(key)] = interpreter.FromJson(value, 0);
  }
  Scope scope{&globals, {}};
  Output out(budget);
  try {
    interpreter.Execute(program_->body, scope, out);
  } catch (const LoopControl&) {
    Fail(program_->source.where, ": {% break %} or {% continue %} outside a loop");
  }
  return out.Take();
}

}  // namespace polestar::jinja
