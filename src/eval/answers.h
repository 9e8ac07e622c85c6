// Answer extraction and comparison for the text suites (GSM8K, MATH-500). Pure functions, no
// I/O; the suites in suite.h call them and the tests pin their behaviour case by case.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace polestar::eval {

// ---- GSM8K --------------------------------------------------------------------------------
// lm-eval gsm8k v3 "strict-match": the first match of `#### (-?[0-9.,]+)`, i.e. the number
// right after the first "#### " that is followed by one. No "$" or units are allowed there.
std::optional<std::string> ExtractGsm8kStrict(std::string_view text);

// lm-eval gsm8k v3 "flexible-extract": the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`, i.e.
// the last number in the text, with "$", thousands commas and a trailing "." attached. One
// deviation: a match without any digit ("...", "$,") is skipped instead of being taken as the
// answer. Units after the number ("18 dollars") are never part of a match.
std::optional<std::string> ExtractGsm8kFlexible(std::string_view text);

// The canonical form of a numeric answer: drops whitespace, "$", "," and trailing "."; a
// decimal number becomes its shortest exact decimal ("018.50" -> "18.5", "18.00" -> "18",
// "-0" -> "0"); anything else is returned lower-cased. lm-eval compares strings after removing
// "," "$" and a final "." only, so it rejects "18.00" for 18; this comparison accepts it.
std::string NormalizeNumber(std::string_view answer);
bool NumbersEqual(std::string_view answer, std::string_view reference);

// ---- MATH-500 -----------------------------------------------------------------------------
// The content of the last \boxed{...} (or \fbox{...}) in `text`, braces matched so nested
// groups such as \boxed{\frac{1}{2}} are kept whole (escaped \{ \} do not count). The
// "\boxed 5" form (no braces) runs to the next "$" or line end. nullopt when there is no box
// or the last one is never closed (a cut-off generation).
std::optional<std::string> LastBoxedContent(std::string_view text);

// Canonical form of a LaTeX final answer, following the Hendrycks MATH `strip_string` and the
// Minerva `normalize_final_answer`, in this order:
//  1. "\!" and the spacing commands "\," "\;" "\:" "\ " "\quad" "\qquad" "~" go; "\dfrac" and
//     "\tfrac" become "\frac"; "\left" / "\right" before a delimiter go; "\displaystyle" goes;
//     "\mbox" "\textrm" "\textbf" "\mathrm" become "\text".
//  2. Dollars: "\$" and math "$" delimiters go. Percent: "\%" and "%" go. Degrees: "^\circ",
//     "^{\circ}" and "°" go.
//  3. Units: from the first "\text{ " (text starting with a space, as in "5.4 \text{ cents}")
//     to the end goes (Hendrycks `_remove_right_units`); then \text{X} and \boxed{X} become X.
//  4. All whitespace goes; "{,}" goes.
//  5. A trailing unit word after a number goes ("18dollars", "864inches^2"; the list is
//     kUnitWords in answers.cpp) and so does a trailing ".".
//  6. "x=5" -> "5" when the left side has at most 2 characters (Hendrycks); "x\in[a,b]" ->
//     "[a,b]".
//  7. "\sqrt3" -> "\sqrt{3}", "\frac12" -> "\frac{1}{2}", "\frac1{2}" and "\frac{1}2" likewise.
//  8. ".5" -> "0.5" at the start and after "{", "(", "," or "-".
//  9. Thousands separators: "10,080" -> "10080" when the whole answer is one grouped number.
// 10. A whole answer "a/b" (integers) -> "\frac{a}{b}"; a whole "(A)" -> "A"; a whole decimal
//     number -> its shortest exact decimal ("18.00" -> "18").
std::string NormalizeMathAnswer(std::string_view answer);

// True when the normalized strings are equal, or both are exact rationals of equal value
// (integers, decimals, a/b, \frac{a}{b}, -\frac{a}{b}: "0.5" equals "\frac{1}{2}").
// No symbolic algebra: "2\sqrt{2}" and "\sqrt{8}" differ.
bool MathAnswersEqual(std::string_view answer, std::string_view reference);

}  // namespace polestar::eval
