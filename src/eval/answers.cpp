#include "eval/answers.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <utility>

namespace polestar::eval {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool IsAlnum(char c) { return IsDigit(c) || IsAlpha(c); }
bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

void ReplaceAll(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  std::size_t start = 0;
  for (std::size_t pos; (pos = s.find(from, start)) != std::string::npos;
       start = pos + from.size()) {
    out.append(s, start, pos - start);
    out.append(to);
  }
  out.append(s, start);
  s = std::move(out);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Removes `command` (e.g. "\left") wherever it is not the start of a longer command name.
void RemoveCommand(std::string& s, std::string_view command) {
  std::size_t pos = 0;
  while ((pos = s.find(command, pos)) != std::string::npos) {
    const std::size_t end = pos + command.size();
    if (end < s.size() && IsAlpha(s[end])) {
      pos = end;
    } else {
      s.erase(pos, command.size());
    }
  }
}

// Index of the "}" closing the group that opens at s[open] == '{', skipping escaped braces;
// npos when the group never closes.
std::size_t MatchingBrace(std::string_view s, std::size_t open) {
  int depth = 0;
  for (std::size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '{') {
      ++depth;
    } else if (s[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

// Replaces every `command{X}` (command includes the "{") by X, innermost groups included.
void UnwrapCommand(std::string& s, std::string_view command_with_brace) {
  std::size_t pos;
  while ((pos = s.find(command_with_brace)) != std::string::npos) {
    const std::size_t open = pos + command_with_brace.size() - 1;
    const std::size_t close = MatchingBrace(s, open);
    if (close == std::string::npos) return;
    s.erase(close, 1);
    s.erase(pos, command_with_brace.size());
  }
}

// "-?\d+(\.\d*)?" or "-?\.\d+" as its shortest exact decimal; nullopt for anything else.
std::optional<std::string> CanonicalDecimal(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  const std::size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  std::string_view fraction = dot == std::string_view::npos ? "" : s.substr(dot + 1);
  if (whole.empty() && fraction.empty()) return std::nullopt;
  for (std::string_view part : {whole, fraction}) {
    if (!std::all_of(part.begin(), part.end(), IsDigit)) return std::nullopt;
  }
  while (whole.size() > 1 && whole[0] == '0') whole.remove_prefix(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  std::string result = whole.empty() ? "0" : std::string(whole);
  if (!fraction.empty()) {
    result += '.';
    result.append(fraction);
  }
  if (negative && result != "0") result.insert(0, 1, '-');
  return result;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Words dropped when they trail a number ("18dollars" after spaces are gone).
constexpr std::array<std::string_view, 38> kUnitWords = {
    "dollars", "dollar", "cents",   "cent",   "degrees",  "degree", "inches", "inch",
    "feet",    "foot",   "ft",      "meters", "meter",    "cm",     "km",     "mm",
    "miles",   "mile",   "yards",   "yard",   "units",    "unit",   "hours",  "hour",
    "minutes", "minute", "seconds", "second", "days",     "mph",    "pounds", "pound",
    "square",  "sq",     "ways",    "points", "students", "percent"};

void RemoveTrailingUnit(std::string& s) {
  for (std::string_view unit : kUnitWords) {
    for (std::string_view power : {"", "^2", "^3"}) {
      const std::size_t length = unit.size() + power.size();
      if (s.size() <= length) continue;
      if (std::string_view(s).substr(s.size() - length, unit.size()) != unit) continue;
      if (!EndsWith(s, power)) continue;
      const char before = s[s.size() - length - 1];
      if (IsDigit(before) || before == '}') {
        s.erase(s.size() - length);
        return;
      }
    }
  }
}

// Reads one \frac / \sqrt argument at s[i]: a braced group or a single alphanumeric
// character. Returns the argument text and advances i; nullopt when neither is there.
std::optional<std::string> ReadArgument(std::string_view s, std::size_t& i) {
  if (i >= s.size()) return std::nullopt;
  if (s[i] == '{') {
    const std::size_t close = MatchingBrace(s, i);
    if (close == std::string_view::npos) return std::nullopt;
    std::string argument(s.substr(i + 1, close - i - 1));
    i = close + 1;
    return argument;
  }
  if (IsAlnum(s[i])) return std::string(1, s[i++]);
  return std::nullopt;
}

// "\frac12" -> "\frac{1}{2}", "\sqrt3" -> "\sqrt{3}" (arguments already braced stay; an
// argument that is neither a group nor one alphanumeric character, as in "\sqrt[3]{x}",
// leaves the command as it is).
std::string BraceShorthandArguments(std::string_view s) {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    const bool frac = StartsWith(s.substr(i), "\\frac");
    if (frac || StartsWith(s.substr(i), "\\sqrt")) {
      std::size_t j = i + 5;
      std::string rebuilt(s.substr(i, 5));
      bool ok = true;
      for (int k = 0; k < (frac ? 2 : 1) && ok; ++k) {
        const std::optional<std::string> argument = ReadArgument(s, j);
        ok = argument.has_value();
        if (ok) {
          rebuilt += '{';
          rebuilt += BraceShorthandArguments(*argument);
          rebuilt += '}';
        }
      }
      if (ok) {
        out += rebuilt;
        i = j;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// Inserts the 0 of ".5" at the start or after an opening delimiter, separator or sign.
std::string AddLeadingZeros(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool opens = i == 0 || std::string_view("{(,[-=").find(s[i - 1]) != std::string::npos;
    if (s[i] == '.' && opens && i + 1 < s.size() && IsDigit(s[i + 1])) out += '0';
    out += s[i];
  }
  return out;
}

// "12,345,678" or "12,345.5": one number with thousands separators.
bool IsGroupedNumber(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  const std::size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  if (dot != std::string_view::npos) {
    std::string_view fraction = s.substr(dot + 1);
    if (fraction.empty() || !std::all_of(fraction.begin(), fraction.end(), IsDigit)) return false;
  }
  const std::size_t first_comma = whole.find(',');
  if (first_comma == std::string_view::npos || first_comma == 0 || first_comma > 3) return false;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const bool comma_slot = i >= first_comma && (i - first_comma) % 4 == 0;
    if (comma_slot ? whole[i] != ',' : !IsDigit(whole[i])) return false;
  }
  return (whole.size() - first_comma) % 4 == 0;
}

bool IsInteger(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), IsDigit);
}

// An exact rational p/q (q > 0) for integers, decimals, and \frac{a}{b} with integer a, b
// (optionally negated); nullopt when the text is anything else or too long for 64 bits.
std::optional<std::pair<std::int64_t, std::int64_t>> ParseRational(std::string_view s) {
  constexpr std::size_t kMaxDigits = 18;
  bool negative = false;
  if (!s.empty() && s[0] == '-') {
    negative = true;
    s.remove_prefix(1);
  }
  std::int64_t numerator = 0, denominator = 1;
  if (StartsWith(s, "\\frac{")) {
    std::size_t i = 5;
    const std::optional<std::string> top = ReadArgument(s, i);
    const std::optional<std::string> bottom = ReadArgument(s, i);
    if (!top || !bottom || i != s.size() || !IsInteger(*top) || !IsInteger(*bottom)) {
      return std::nullopt;
    }
    if (top->size() > kMaxDigits || bottom->size() > kMaxDigits) return std::nullopt;
    numerator = std::stoll(*top);
    denominator = std::stoll(*bottom);
    if (denominator == 0) return std::nullopt;
  } else {
    const std::optional<std::string> decimal = CanonicalDecimal(s);
    if (!decimal || (*decimal)[0] == '-') return std::nullopt;
    const std::size_t dot = decimal->find('.');
    std::string digits = *decimal;
    if (dot != std::string::npos) digits.erase(dot, 1);
    const std::size_t scale = dot == std::string::npos ? 0 : decimal->size() - dot - 1;
    if (digits.size() > kMaxDigits) return std::nullopt;
    numerator = std::stoll(digits);
    for (std::size_t k = 0; k < scale; ++k) denominator *= 10;
  }
  if (denominator < 0) {
    denominator = -denominator;
    numerator = -numerator;
  }
  if (negative) numerator = -numerator;
  return std::make_pair(numerator, denominator);
}

}  // namespace

std::optional<std::string> ExtractGsm8kStrict(std::string_view text) {
  constexpr std::string_view kMarker = "#### ";
  for (std::size_t pos = text.find(kMarker); pos != std::string_view::npos;
       pos = text.find(kMarker, pos + 1)) {
    const std::size_t start = pos + kMarker.size();
    std::size_t body = start;
    if (body < text.size() && text[body] == '-') ++body;
    std::size_t end = body;
    while (end < text.size() && (IsDigit(text[end]) || text[end] == '.' || text[end] == ',')) ++end;
    if (end > body) return std::string(text.substr(start, end - start));
  }
  return std::nullopt;
}

std::optional<std::string> ExtractGsm8kFlexible(std::string_view text) {
  const auto in_class = [](char c) { return IsDigit(c) || c == '$' || c == '.' || c == ','; };
  std::optional<std::string> last;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t body = text[i] == '-' ? i + 1 : i;
    std::size_t end = body;
    while (end < text.size() && in_class(text[end])) ++end;
    if (end - body < 2) {  // first alternative needs 2+ characters; try -?[0-9]+
      end = body;
      while (end < text.size() && IsDigit(text[end])) ++end;
    }
    if (end == body) {
      ++i;
      continue;
    }
    const std::string_view match = text.substr(i, end - i);
    if (std::any_of(match.begin(), match.end(), IsDigit)) last = std::string(match);
    i = end;
  }
  return last;
}

std::string NormalizeNumber(std::string_view answer) {
  std::string compact;
  for (char c : answer) {
    if (!IsSpace(c) && c != '$' && c != ',') compact += c;
  }
  while (!compact.empty() && compact.back() == '.') compact.pop_back();
  if (std::optional<std::string> decimal = CanonicalDecimal(compact)) return *decimal;
  return Lower(compact);
}

bool NumbersEqual(std::string_view answer, std::string_view reference) {
  return NormalizeNumber(answer) == NormalizeNumber(reference);
}

std::optional<std::string> LastBoxedContent(std::string_view text) {
  const std::size_t boxed = text.rfind("\\boxed");
  const std::size_t fbox = text.rfind("\\fbox");
  std::size_t start;
  if (boxed != std::string_view::npos && (fbox == std::string_view::npos || boxed > fbox)) {
    start = boxed + 6;
  } else if (fbox != std::string_view::npos) {
    start = fbox + 5;
  } else {
    return std::nullopt;
  }
  if (start < text.size() && text[start] == '{') {
    const std::size_t close = MatchingBrace(text, start);
    if (close == std::string_view::npos) return std::nullopt;
    return std::string(text.substr(start + 1, close - start - 1));
  }
  if (start < text.size() && text[start] == ' ') {
    std::size_t end = start;
    while (end < text.size() && text[end] != '$' && text[end] != '\n') ++end;
    std::string_view content = text.substr(start, end - start);
    while (!content.empty() && IsSpace(content.front())) content.remove_prefix(1);
    while (!content.empty() && IsSpace(content.back())) content.remove_suffix(1);
    if (!content.empty()) return std::string(content);
  }
  return std::nullopt;
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string s(answer);
  // 1. Spacing and presentation commands.
  ReplaceAll(s, "\\!", "");
  for (std::string_view space : {"\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\ ", "~"}) {
    ReplaceAll(s, space, " ");
  }
  ReplaceAll(s, "\\dfrac", "\\frac");
  ReplaceAll(s, "\\tfrac", "\\frac");
  RemoveCommand(s, "\\left");
  RemoveCommand(s, "\\right");
  RemoveCommand(s, "\\displaystyle");
  for (std::string_view text_like : {"\\mbox{", "\\textrm{", "\\textbf{", "\\mathrm{"}) {
    ReplaceAll(s, text_like, "\\text{");
  }
  // 2. Dollars, percent, degrees.
  ReplaceAll(s, "\\$", "");
  ReplaceAll(s, "$", "");
  ReplaceAll(s, "\\%", "");
  ReplaceAll(s, "%", "");
  ReplaceAll(s, "^{\\circ}", "");
  ReplaceAll(s, "^\\circ", "");
  ReplaceAll(s, "\xc2\xb0", "");  // °
  // 3. Units in text after the value, then text and box wrappers.
  if (const std::size_t units = s.find("\\text{ ");
      units != std::string::npos && units > 0 &&
      std::any_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(units),
                  [](char c) { return !IsSpace(c); })) {
    s.erase(units);
  }
  UnwrapCommand(s, "\\text{");
  UnwrapCommand(s, "\\boxed{");
  // 4. Whitespace and "{,}" thousands separators.
  std::erase_if(s, IsSpace);
  ReplaceAll(s, "{,}", "");
  // 5. Trailing unit words and sentence periods.
  RemoveTrailingUnit(s);
  while (!s.empty() && s.back() == '.') s.pop_back();
  // 6. "x=5" -> "5"; "x\in[a,b]" -> "[a,b]".
  if (const std::size_t eq = s.find('=');
      eq != std::string::npos && eq <= 2 && s.find('=', eq + 1) == std::string::npos) {
    s.erase(0, eq + 1);
  }
  if (s.size() > 4 && IsAlpha(s[0]) && StartsWith(std::string_view(s).substr(1), "\\in") &&
      !IsAlpha(s[4])) {
    s.erase(0, 4);
  }
  // 7-8. Brace shorthand arguments, leading zeros.
  s = BraceShorthandArguments(s);
  s = AddLeadingZeros(s);
  // 9. Thousands separators.
  if (IsGroupedNumber(s)) std::erase(s, ',');
  // 10. Whole-answer forms.
  if (const std::size_t slash = s.find('/');
      slash != std::string::npos && IsInteger(s.substr(0, slash)) &&
      IsInteger(s.substr(slash + 1)) && s[slash + 1] != '-') {
    const std::size_t sign = s[0] == '-' ? 1 : 0;
    std::string fraction(s.substr(0, sign));
    fraction.append("\\frac{").append(s, sign, slash - sign).append("}{");
    fraction.append(s, slash + 1).append("}");
    s = std::move(fraction);
  }
  if (s.size() == 3 && s[0] == '(' && IsAlpha(s[1]) && s[2] == ')') s = s.substr(1, 1);
  if (std::optional<std::string> decimal = CanonicalDecimal(s)) s = *decimal;
  return s;
}

bool MathAnswersEqual(std::string_view answer, std::string_view reference) {
  const std::string a = NormalizeMathAnswer(answer);
  const std::string b = NormalizeMathAnswer(reference);
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  const auto x = ParseRational(a);
  const auto y = ParseRational(b);
  if (!x || !y) return false;
  return static_cast<__int128>(x->first) * y->second == static_cast<__int128>(y->first) * x->second;
}

}  // namespace polestar::eval
