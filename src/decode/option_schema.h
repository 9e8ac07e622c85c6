// The decoding options' schema: every DecodeOptions field declared once, with its canonical
// name, CLI flags, request field, help text and valid values. The CLI flags and their --help,
// the server's request fields, the benchmark's grid keys and result records, and the range
// checks of DecodeOptions::Validate are all generated from it. Defaults are DecodeOptions'
// member initialisers (the schema reads them through the member); which policies read an
// option is declared by the policies themselves (policy_registry.h, PoliciesReading).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/error.h"
#include "decode/options.h"
#include "model/config.h"

namespace polestar {

// A DecodeOptions member. The enum ones are modes (OptionSpec::modes names their values).
using OptionMember = std::variant<
    int DecodeOptions::*, double DecodeOptions::*, std::optional<double> DecodeOptions::*,
    bool DecodeOptions::*, std::string DecodeOptions::*, uint64_t DecodeOptions::*,
    Remasking DecodeOptions::*, DreamAlg DecodeOptions::*, DriftMetric DecodeOptions::*>;

// An interval of valid numbers; the bounds are inclusive unless marked open.
struct Interval {
  double low, high;
  bool low_open = false, high_open = false;
  bool Contains(double value) const;  // false for NaN
  std::string Text() const;           // "(0, 1]", "[0, inf)"
};

// A bound of an option's range: a number, another option's value or the model's.
class Bound {
 public:
  Bound(int value) : source_(double(value)) {}
  Bound(double value) : source_(value) {}
  Bound(int DecodeOptions::*option) : source_(option) {}
  Bound(double DecodeOptions::*option) : source_(option) {}
  Bound(int ModelConfig::*model) : source_(model) {}
  double Of(const DecodeOptions& options, const ModelConfig& config) const;

 private:
  std::variant<double, int DecodeOptions::*, double DecodeOptions::*, int ModelConfig::*> source_;
};

struct ValueRange {
  Bound low, high;
  bool low_open = false, high_open = false;
  Interval Of(const DecodeOptions& options, const ModelConfig& config) const;
};

// Whose words an option is named in: the CLI's flags or the HTTP API's fields.
enum class Vocabulary { kCli, kHttp };

struct OptionSpec {
  // Canonical: the DecodeOptions member's name, the request and generation_config.json field,
  // the grid key (with '-' or '_') and the result-record key.
  const char* name;
  OptionMember member;
  // CLI11 names, canonical first ("--steps,--diffusion-steps"); the others are aliases.
  const char* flags;
  const char* help;
  // The numbers allowed, given the options as a whole and the model; none: any.
  std::optional<ValueRange> range = std::nullopt;
  // A mode's value names, in its enum's order: what flags, requests and records say ("":
  // the option is unset).
  std::vector<const char*> modes = {};
  // Request / grid names besides `name` and the flags' ("topk" for topk_clusters).
  std::vector<const char*> aliases = {};
  // --help shows the default ("INT=32").
  bool help_shows_default = true;
  // A CLI switch without a value (--refresh-all) rather than an option taking one.
  bool is_switch = false;
  // How the server names it when requests set it through another field (gen_length:
  // max_tokens); nullptr: `name`, and requests may set it by name.
  const char* http_name = nullptr;
};

// All options in DecodeOptions' order, which is also the order Validate checks them in.
const std::vector<OptionSpec>& OptionSchema();

// The option called `key` by its name, an alias or a long flag ('-' and '_' alike, leading
// dashes ignored): "block-length", "diffusion_steps", "topk". nullptr when there is none.
const OptionSpec* FindOption(std::string_view key);

// The option of a DecodeOptions member; every member has one (PS_CHECK).
const OptionSpec& OptionOf(const OptionMember& member);

// "--block-length" (CLI) or "block_length" (HTTP).
std::string OptionName(const OptionSpec& option, Vocabulary vocabulary);

// The canonical flag without dashes ("block-length").
std::string CanonicalFlag(const OptionSpec& option);

// `options`' value of `option` as JSON (null for an unset optional number).
nlohmann::json OptionValueJson(const OptionSpec& option, const DecodeOptions& options);

// Throws OptionError when `options`' value of `option` is outside its range.
void CheckOptionValue(const OptionSpec& option, const DecodeOptions& options,
                      const ModelConfig& config);

// The index of mode `option`'s value named `text`; throws OptionError listing the names
// when there is none.
size_t ModeIndex(const OptionSpec& option, std::string_view text);

// Mode `option`'s value named `text`: ParseMode<Remasking>(option, "random").
template <typename Mode>
Mode ParseMode(const OptionSpec& option, std::string_view text) {
  return Mode(ModeIndex(option, text));
}

// The name of mode `option`'s `value` ("random").
template <typename Mode>
const char* ModeName(const OptionSpec& option, Mode value) {
  PS_CHECK(size_t(value) < option.modes.size());
  return option.modes[size_t(value)];
}

// An invalid option value or combination. The message names options in either vocabulary;
// what() is the CLI's.
class OptionError : public Error {
 public:
  // A piece of the message: text, or (option != nullptr) an option's name.
  struct Part {
    std::string text;
    const OptionSpec* option = nullptr;
  };
  explicit OptionError(std::vector<Part> parts);
  // The option that failed: the first one the message names.
  const OptionSpec& option() const;
  std::string Message(Vocabulary vocabulary) const;

 private:
  static std::string Render(const std::vector<Part>& parts, Vocabulary vocabulary);
  std::vector<Part> parts_;
};

namespace option_error_detail {
inline OptionError::Part ToPart(const OptionSpec& option) { return {"", &option}; }
template <typename T>
OptionError::Part ToPart(const T& text) {
  return {Cat(text), nullptr};
}
}  // namespace option_error_detail

// Throws OptionError: FailOption(OptionOf(&DecodeOptions::threshold), " and ", ...).
template <typename... Args>
[[noreturn]] void FailOption(const Args&... args) {
  throw OptionError({option_error_detail::ToPart(args)...});
}

}  // namespace polestar
