// A Jinja interpreter for chat templates, matching @huggingface/jinja (the implementation
// transformers.js uses) byte for byte on the subset chat templates use.
//
// Like @huggingface/jinja's Template, the source is preprocessed with trim_blocks and
// lstrip_blocks (as Python transformers' apply_chat_template also sets them), one trailing
// newline is dropped and transformers' {% generation %} tags are removed; then it is lexed,
// parsed to a syntax tree and evaluated. What it supports:
//   text, {{ expr }}, {% stmt %} and {# comments #}, with `-` whitespace control;
//   if / elif / else, for (loop.index, index0, revindex, revindex0, first, last, length,
//   previtem, nextitem; `for k, v in ...` unpacking; `for x in xs if test`; for-else;
//   break / continue), set (tuples, `ns.attr = ...` on a namespace(), {% set x %}...{% endset %});
//   literals (strings with escapes, integers, floats, true/false/none, lists, tuples, dicts),
//   attribute and subscript access, slices, calls with keyword arguments, filters, `is` tests,
//   + - * / // % ** ~ == != < <= > >= and or not in `not in`, `a if b else c`;
//   the globals raise_exception, namespace and range; the string, dict and list methods and
//   filters of @huggingface/jinja (see jinja.cpp).
// Macros, call and filter blocks and `*args` unpacking are not supported: a template using
// them fails to parse with a clear error. Integers are 64-bit (JavaScript's are doubles):
// overflow and division by zero are errors instead of JavaScript's lossy results.
//
// Errors (malformed or unsupported templates, raise_exception, a type error while
// rendering) throw polestar::Error naming the template, line and column. Hostile templates
// are bounded: nesting depth, output and string sizes, list lengths, evaluation steps and
// the bytes the render holds at once all have limits that fail with an Error. Invalid UTF-8, in the
// template or in the variables, is read as U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace polestar::jinja {

struct RenderLimits {
  size_t max_string_bytes = size_t{32} << 20;  // the output and every string built
  size_t max_list_items = size_t{1} << 16;
  uint64_t max_steps = 2'000'000;  // expressions evaluated and loop iterations
  // All the strings, lists, dicts and output held at once: values each under the limits
  // above cannot add up to more.
  size_t max_total_bytes = size_t{128} << 20;
};

class Template {
 public:
  // Parses `source`; `where` names it in error messages (a file, "chat template llada").
  Template(std::string_view source, std::string where);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context`, a JSON object (strings, numbers, booleans,
  // null, lists, objects).
  std::string Render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  struct Program;
  std::unique_ptr<const Program> program_;
};

}  // namespace polestar::jinja
