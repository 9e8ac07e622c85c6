// The Jinja interpreter (src/tokenizer/jinja.h): renders of the models' chat templates
// byte-identical to @huggingface/jinja's (tests/data/chat_templates/goldens.jsonl, written by
// render_goldens.mjs), and hand-checked renders, errors with positions, hostile templates.
#include "tokenizer/jinja.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "test_support.h"

namespace polestar::jinja {
namespace {

using json = nlohmann::ordered_json;

std::string DataDir() { return std::string(POLESTAR_SOURCE_DIR) + "/tests/data/chat_templates"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Render(std::string_view source, const json& context = json::object(),
                   const RenderLimits& limits = {}) {
  return Template(source, "t").Render(context, limits);
}

TEST(JinjaGoldens, EveryTemplateRendersAsHuggingFaceJinjaDoes) {
  std::map<std::string, Template> templates;
  std::map<std::string, int> renders;
  std::ifstream in(DataDir() + "/goldens.jsonl");
  ASSERT_TRUE(in) << "missing goldens.jsonl";
  std::string line;
  while (std::getline(in, line)) {
    const json record = json::parse(line);
    const std::string file = record["template"];
    auto it = templates.find(file);
    if (it == templates.end()) {
      it = templates.emplace(file, Template(ReadFile(DataDir() + "/" + file), file)).first;
    }
    json context = record;
    context.erase("template");
    context.erase("text");
    context.erase("error");
    if (record.contains("error")) {  // what raise_exception raised
      EXPECT_THAT([&] { it->second.Render(context); },
                  testing::ThrowsErrorContaining({record["error"].get<std::string>()}))
          << line;
    } else {
      EXPECT_EQ(it->second.Render(context), record["text"].get<std::string>()) << line;
    }
    ++renders[file];
  }
  // Every template in the folder has its renders.
  for (const char* file :
       {"dream-v0-instruct-7b.jinja", "features.jinja", "ling-lite.jinja",
        "llada-8b-instruct.jinja", "llada2-mini.jinja", "qwen2-chatml.jinja", "qwen3.jinja"}) {
    EXPECT_GE(renders[file], 80) << file;
  }
}

TEST(Jinja, WhitespaceControlAndTheBlockOptionsOfHuggingFaceJinja) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before.
  EXPECT_EQ(Render("{% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a \n{%- if true -%}\n b {%- endif %}"), "ab");
  EXPECT_EQ(Render("x {#- comment -#} y"), "xy");
  EXPECT_EQ(Render("{{ 'one' }}\n"), "one");          // one trailing newline is dropped
  EXPECT_EQ(Render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // expressions keep theirs
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(Jinja, LoopsSetAndNamespaces) {
  const json context = {{"xs", {"a", "b", "c"}}, {"d", {{"k", 1}, {"j", 2}}}};
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}"
                   "{% endfor %}",
                   context),
            "1a,2b,3c");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", context), "k1j2");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(Render("{% for x in xs if x != 'b' %}{{ loop.index0 }}{{ x }}{% endfor %}", context),
            "0a1c");
  EXPECT_EQ(Render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}",
                   context),
            "a");
  // A set inside a loop stays in the loop; a namespace carries values out of it.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in xs %}"
                   "{% set n = n + 1 %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ n }}{{ ns.n }}",
                   context),
            "03");
  EXPECT_EQ(Render("{% set a, b = 1, 2 %}{{ a + b }}{% set t %}x{{ a }}{% endset %}{{ t }}"),
            "3x1");
  EXPECT_EQ(Render("{% for x in xs[::-1] %}{{ x }}{% endfor %}{{ xs[-1] }}{{ xs[1:] }}", context),
            "cbac[\"b\", \"c\"]");
}

TEST(Jinja, ExpressionsFiltersAndTests) {
  const json context = {{"s", "  Hi There  "}, {"m", {{"role", "user"}}}};
  EXPECT_EQ(Render("{{ s | trim }}|{{ s.strip() | lower }}|{{ s | length }}", context),
            "Hi There|hi there|12");
  EXPECT_EQ(Render("{{ m.role }}{{ m['role'] }}{{ m.get('x', 'd') }}{{ m.missing }}", context),
            "useruserd");
  EXPECT_EQ(Render("{{ m.missing is defined }}{{ m.missing.deeper is undefined }}", context),
            "falsetrue");
  EXPECT_EQ(Render("{{ 'a' + 'b' ~ 3 }}{{ 10 // 3 }}{{ -7 // 2 }}{{ 2 * 3 + 1 }}"), "ab33-47");
  EXPECT_EQ(Render("{{ 'yes' if 1 < 2 else 'no' }}{{ 'x' if false }}"), "yes");
  EXPECT_EQ(Render("{{ [1, 2] + [3] }}{{ 3 in [1, 2, 3] }}{{ 'b' not in 'abc' }}"),
            "[1, 2, 3]truefalse");
  EXPECT_EQ(Render("{{ \"q\\\"\\\\\\n\" | tojson }}"), "\"q\\\"\\\\\\n\"");
  EXPECT_EQ(Render("{{ {'a': [1, none]} | tojson }}"), "{\"a\": [1, null]}");
  EXPECT_EQ(Render("{{ 'a,b,,c'.split(',') | join('-') }}{{ 'x_y'.replace('_', ' ') }}"),
            "a-b--cx y");
  EXPECT_EQ(Render("{{ [1, 2, 3][::9223372036854775807] }}{{ 'abc'[::-2] }}{{ [1, 2][5:] }}"),
            "[1]ca[]");
  EXPECT_EQ(Render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1 if false else 2.50 }}"),
            "1.0 0.30000000000000004 2.5");
}

TEST(Jinja, ErrorsNameTheLineAndColumn) {
  EXPECT_THAT([] { Render("line one\n{{ x + }}"); },
              testing::ThrowsErrorContaining({"t:2:", "unexpected"}));
  EXPECT_THAT([] { Render("{% if true %}never closed"); },
              testing::ThrowsErrorContaining({"t:1:1", "{% if %} is not closed"}));
  EXPECT_THAT([] { Render("ok\n  {{ 'unterminated }}"); },
              testing::ThrowsErrorContaining({"t:2:", "unterminated string"}));
  EXPECT_THAT([] { Render("{# no end"); },
              testing::ThrowsErrorContaining({"t:1:1", "unterminated comment"}));
  EXPECT_THAT([] { Render("{% macro m() %}{% endmacro %}"); },
              testing::ThrowsErrorContaining({"t:1:1", "not supported"}));
  EXPECT_THAT(
      [] {
        Render("{{ x | nosuchfilter }}", {{"x", "s"}});
      },
      testing::ThrowsErrorContaining({"t:1:", "nosuchfilter"}));
  EXPECT_THAT([] { Render("\n\n   {{ raise_exception('bad role') }}"); },
              testing::ThrowsErrorContaining({"t:3:", "bad role"}));
  EXPECT_THAT([] { Render("{{ 1 // 0 }}"); }, testing::ThrowsErrorContaining({"division by zero"}));
  EXPECT_THAT([] { Render("{{ undefined_thing + 1 }}"); },
              testing::ThrowsErrorContaining({"undefined"}));
  EXPECT_THAT([] { Render("{% break %}"); }, testing::ThrowsErrorContaining({"outside a loop"}));
}

TEST(Jinja, HostileTemplatesFailWithinTheirLimits) {
  const std::string deep_parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_THAT([&] { Render("{{ " + deep_parens + " }}"); },
              testing::ThrowsErrorContaining({"nesting deeper"}));
  std::string deep_ifs;
  for (int i = 0; i < 3000; ++i) deep_ifs += "{% if true %}";
  EXPECT_THAT([&] { Render(deep_ifs); }, testing::ThrowsErrorContaining({"nesting deeper"}));
  EXPECT_THAT([] { Render("{% for i in range(100000000) %}x{% endfor %}"); },
              testing::ThrowsErrorContaining({"a list grew beyond"}));
  RenderLimits few_steps;
  few_steps.max_steps = 100000;
  EXPECT_THAT(
      [&] {
        Render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
               json::object(), few_steps);
      },
      testing::ThrowsErrorContaining({"more than 100000 steps"}));
  EXPECT_THAT(
      [] {
        Render(
            "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}");
      },
      testing::ThrowsErrorContaining({"a string grew beyond"}));
  EXPECT_THAT(
      [] {
        Render(
            "{% set ns = namespace(x=[]) %}{% for i in range(500) %}{% set ns.x = [ns.x] %}"
            "{% endfor %}");
      },
      testing::ThrowsErrorContaining({"nested deeper"}));
  EXPECT_THAT([] { Render("{% set ns = namespace() %}{% set ns.self = [ns] %}"); },
              testing::ThrowsErrorContaining({"cannot hold a namespace"}));
  RenderLimits small;
  small.max_string_bytes = 100;
  EXPECT_THAT([&] { Render("{% for i in range(200) %}x{% endfor %}", json::object(), small); },
              testing::ThrowsErrorContaining({"beyond 100 bytes"}));
  for (const char* unterminated : {"{{", "{%", "{{ 'a", "{% for x in", "{% set x = [1,", "{{ (1"}) {
    EXPECT_THROW(Render(unterminated), Error) << unterminated;
  }
}

// The most this process has held resident since the last reset, in bytes (Linux's VmHWM).
size_t PeakRssSinceReset() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
  }
  return 0;
}
// Starts a new peak (writing 5 to clear_refs resets VmHWM); false where that is not allowed.
bool ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return bool(clear);
}

// A 2^doublings byte string of x's as ns.s, built by doubling (jinja has no string repeat).
std::string BuildBigString(int doublings) {
  return "{% set ns = namespace(s='x', items=[]) %}{% for i in range(" + std::to_string(doublings) +
         ") %}{% set ns.s = ns.s + ns.s %}{% endfor %}";
}

TEST(Jinja, TheBytesHeldAtOnceAreBounded) {
  const size_t kMaxPeak = size_t{256} << 20;
  const bool measured = ResetPeakRss();
  // 1000 distinct strings of 1 MiB each, every one under the per-string limit: 1 GiB.
  EXPECT_THAT(
      [] {
        Render(BuildBigString(20) +
               "{% for i in range(1000) %}{% set ns.items = ns.items + [ns.s ~ i] %}{% endfor %}");
      },
      testing::ThrowsErrorContaining({"t:1:", "would hold more than 134217728 bytes at once"}));
  if (measured) {
    EXPECT_LT(PeakRssSinceReset(), kMaxPeak);
  }
  ResetPeakRss();
  // Slices of a 16 MiB string: each one a new 16 MiB string, and no table of code points.
  EXPECT_THAT(
      [] {
        Render(BuildBigString(24) +
               "{% for i in range(100) %}{% set ns.items = ns.items + [ns.s[i:]] %}{% endfor %}");
      },
      testing::ThrowsErrorContaining({"would hold more than 134217728 bytes at once"}));
  if (measured) {
    EXPECT_LT(PeakRssSinceReset(), kMaxPeak);
  }
  // Output buffers count too: each nested loop holds its iteration's text.
  RenderLimits small;
  small.max_total_bytes = 1 << 20;
  std::string nested = BuildBigString(17);  // 128 KiB
  for (int i = 0; i < 12; ++i) nested += "{% for a in [1] %}{{ ns.s }}";
  for (int i = 0; i < 12; ++i) nested += "{% endfor %}";
  EXPECT_THAT([&] { Render(nested, json::object(), small); },
              testing::ThrowsErrorContaining({"would hold more than 1048576 bytes at once"}));
  // What is freed is given back: 1000 strings of 1 MiB built, one held at a time.
  EXPECT_EQ(
      Render(BuildBigString(20) + "{% for i in range(1000) %}{% set ns.t = ns.s ~ i %}{% endfor %}"
                                  "{{ ns.t | length }}"),
      std::to_string((1 << 20) + 3));
}

TEST(Jinja, StringSlicesAndIndexesWalkCodePoints) {
  const json s = {{"s", "a\xC3\xA9z\xE2\x82\xAC"}};  // a é z €
  EXPECT_EQ(Render("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ s[-1:0:-2] }}|{{ s[3:1] }}", s),
            "\xC3\xA9z|\xE2\x82\xAC"
            "z\xC3\xA9"
            "a|az|\xE2\x82\xAC\xC3\xA9|");
  EXPECT_EQ(Render("{{ s[1] }}{{ s[-1] }}{{ s[9] }}|{{ s | join('-') }}", s),
            "\xC3\xA9\xE2\x82\xAC|a-\xC3\xA9-z-\xE2\x82\xAC");
  EXPECT_EQ(Render("{{ s[::-9223372036854775807] }}{{ s[1::9223372036854775807] }}", s),
            "\xE2\x82\xAC\xC3\xA9");
}

TEST(Jinja, InvalidUtf8IsReadAsReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Render("a\xFF{{ s }}\xC3", {{"s", "\xE2\x82"}}), "a" + fffd + fffd + fffd);
  EXPECT_EQ(Render("{{ s | length }}{{ s | tojson }}", {{"s", "\xF0\x9F\x98\x80x"}}),
            "3\"\xF0\x9F\x98\x80x\"");
  EXPECT_THROW(Render("{{ \xFF }}"), Error);
}

}  // namespace
}  // namespace polestar::jinja
