// Pre-tokenizer regexes on PCRE2 (JIT, UTF mode).
//
// tokenizer.json patterns are written for Oniguruma (Hugging Face tokenizers) and run by the
// reference implementation (transformers.js) as JavaScript regexes. PCRE2 handles their
// syntax natively: \p{L}, \p{N}, lookahead such as (?!\S), and possessive quantifiers (?+,
// ++) that JavaScript lacks. Where the engines' meanings differ, the pattern is rewritten to
// the reference's meaning before compiling:
//   \s, \S       JavaScript's whitespace set (includes U+FEFF, excludes U+0085)
//   (?i:...)     ASCII-only case folding, as transformers.js rewrites (?i:'s|'t|...)
//   \uHHHH       \x{HHHH}
//   .            any character except \n \r U+2028 U+2029
// \d, \w and \b stay ASCII (PCRE2 without UCP), as in JavaScript.
//
// A Regex is immutable after construction and safe to use from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace polestar {

class Regex {
 public:
  // Throws Error naming `origin` (the file the pattern comes from, if any), the pattern and the
  // position of a syntax error.
  explicit Regex(std::string_view pattern, const std::string& origin = "");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each successive non-empty, non-overlapping match in
  // `text` (valid UTF-8), scanning left to right like JavaScript's matchAll. Each match is
  // bounded (kMatchLimit backtracking steps, kHeapLimitKib of backtracking memory): a
  // pattern that backtracks catastrophically throws Error instead of running for hours.
  // The JIT and the interpreter count steps differently, so a borderline match may fail in
  // one of them only; the reference regexes stay many orders of magnitude below.
  void ForEachMatch(std::string_view text,
                    const std::function<void(size_t begin, size_t end)>& on_match) const;

  static constexpr uint32_t kMatchLimit = 10'000'000;
  static constexpr uint32_t kHeapLimitKib = 64 * 1024;

  const std::string& pattern() const { return pattern_; }
  // The pattern as handed to PCRE2 after rewriting.
  const std::string& compiled_pattern() const { return compiled_; }

 private:
  std::string Name() const;  // "origin: regex pattern", for messages

  std::string origin_, pattern_, compiled_;
  struct Code;
  std::unique_ptr<Code> code_;
};

// The rewriting described above; exposed for tests.
std::string TranslateRegex(std::string_view pattern);

}  // namespace polestar
