#include "decode_flags.h"

#include <charconv>
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/gguf_convert.h"
#include "tokenizer/unicode.h"

namespace polestar::cli {

CLI::Validator Within(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (value >= low && value <= high) return "";
        return Cat("Value ", text, " not in range ", low, " to ", high);
      },
      Cat("NUMBER in [", low, ", ", high, "]"));
}

CLI::Validator Utf8Text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return unicode::IsValidUtf8(text) ? "" : "the text is not valid UTF-8";
      },
      "UTF-8");
}

CLI::Option* AddUint64Option(CLI::App* cmd, const std::string& names, uint64_t& target,
                             const std::string& help) {
  const std::string flag = names.substr(0, names.find(','));
  return cmd
      ->add_option_function<std::string>(
          names,
          [&target, flag](const std::string& text) {
            uint64_t value = 0;
            const auto [end, error] =
                std::from_chars(text.data(), text.data() + text.size(), value);
            if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
              Fail(flag, " must be an integer in [0, 18446744073709551615] (got '", text, "')");
            }
            target = value;
          },
          help)
      ->default_str(std::to_string(target));
}

void AddDecodeFlags(CLI::App* cmd, DecodeOptions& o) {
  for (const OptionSpec& spec : OptionSchema()) {
    // The policy's help lists the registered policies; "--policy help" describes them.
    const std::string help =
        spec.member == OptionMember(&DecodeOptions::policy)
            ? Cat(spec.help, ": ", KnownPolicies(), " ('--policy help' describes them)")
            : std::string(spec.help);
    CLI::Option* option = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& target = o.*member;
          using T = std::remove_reference_t<decltype(target)>;
          if constexpr (std::is_same_v<T, std::optional<double>>) {
            return cmd->add_option_function<double>(
                spec.flags, [&target](double v) { target = v; }, help);
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            return AddUint64Option(cmd, spec.flags, target, help);
          } else if constexpr (std::is_same_v<T, bool>) {
            return spec.is_switch ? cmd->add_flag(spec.flags, target, help)
                                  : cmd->add_option(spec.flags, target, help);
          } else if constexpr (std::is_enum_v<T>) {
            return cmd
                ->add_option_function<std::string>(
                    spec.flags,
                    [&target, &spec](const std::string& text) {
                      target = ParseMode<T>(spec, text);
                    },
                    help)
                ->default_function([&target, &spec] { return ModeName(spec, target); });
          } else {
            return cmd->add_option(spec.flags, target, help);
          }
        },
        spec.member);
    if (spec.help_shows_default) option->capture_default_str();
  }
  // "--policy help" prints the policies and ends the command (CLI11's Success exits 0).
  cmd->get_option("--policy")->each([](const std::string& value) {
    if (value != "help") return;
    std::fputs(PolicyHelp().c_str(), stdout);
    throw CLI::Success();
  });
}

namespace {

// The model's generation_config.json: the folder's file, or the copy `convert` put in a GGUF
// file's kGgufGenerationConfigKey; null when there is none. `where` names it for messages.
nlohmann::json GenerationConfig(const std::string& model_path, std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    const fs::path path = fs::path(model_path) / "generation_config.json";
    if (!fs::exists(path, ec)) return nullptr;
    where = path.string();
    return ReadJsonFile(where);
  }
  if (fs::path(model_path).extension() != ".gguf" || !fs::is_regular_file(model_path, ec))
    return nullptr;
  TensorStore store;
  const GgufFile file = ReadGgufFile(model_path, store);
  if (!file.metadata.Has(kGgufGenerationConfigKey)) return nullptr;
  where = Cat(model_path, " (", kGgufGenerationConfigKey, ")");
  try {
    return nlohmann::json::parse(file.metadata.GetString(kGgufGenerationConfigKey));
  } catch (const nlohmann::json::parse_error& e) {
    Fail(where, ": not JSON: ", e.what());
  }
}

}  // namespace

DecodeOptions ModelDecodeDefaults(const std::string& model_path) {
  DecodeOptions options;
  std::string where;
  const nlohmann::json config = GenerationConfig(model_path, where);
  if (config.is_null()) return options;
  if (!config.is_object()) Fail(where, ": not a JSON object");
  if (config.contains("max_new_tokens") && config.contains("gen_length")) {
    Fail(where, ": give gen_length or max_new_tokens, not both");
  }
  for (const auto& [key, value] : config.items()) {
    const OptionSpec* option = FindOption(key == "max_new_tokens" ? "gen_length" : key);
    if (value.is_null() || option == nullptr) continue;
    if (value.is_object() || value.is_array()) {
      Fail(where, ": '", key, "' must be a number, a string or a boolean");
    }
    try {
      SetDecodeOption(options, CanonicalFlag(*option),
                      value.is_string() ? value.get<std::string>() : value.dump());
    } catch (const Error& e) {
      Fail(where, ": '", key, "': ", e.what());
    }
  }
  return options;
}

DecodeOptions CommandLineDecodeDefaults(int argc, const char* const* argv) {
  if (argc < 2) return {};
  const std::string command = argv[1];
  if (command != "generate" && command != "eval" && command != "serve" && command != "tasks-eval") {
    return {};
  }
  std::string model;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "-m" || arg == "--model") && i + 1 < argc) model = argv[i + 1];
    if (arg.rfind("--model=", 0) == 0) model = arg.substr(8);
  }
  if (model.empty()) {
    try {
      model = DefaultModelPath();
    } catch (const Error&) {
      return {};  // the command reports the missing model itself
    }
  }
  return ModelDecodeDefaults(model);
}

std::string DefaultModelPath() {
  namespace fs = std::filesystem;
  for (const fs::path& candidate :
       {fs::path("models/polestar-tiny"), fs::path(POLESTAR_SOURCE_DIR) / "models/polestar-tiny"}) {
    if (fs::exists(candidate / "config.json")) return candidate.string();
  }
  Fail("no model given (-m) and the bundled models/polestar-tiny was not found");
}

std::string CanonicalDecodeFlag(const std::string& key) {
  if (const OptionSpec* option = FindOption(key)) return CanonicalFlag(*option);
  std::string known;
  for (const OptionSpec& spec : OptionSchema()) {
    known += (known.empty() ? "" : ", ") + CanonicalFlag(spec);
  }
  Fail("unknown decoding setting '", key, "' (known: ", known, ")");
}

void SetDecodeOption(DecodeOptions& options, const std::string& key, const std::string& value) {
  const std::string name = CanonicalDecodeFlag(key);
  CLI::App parser;
  AddDecodeFlags(&parser, options);
  std::vector<std::string> args = {"--" + name + "=" + value};
  try {
    parser.parse(args);
  } catch (const CLI::ParseError& e) {
    Fail("bad value '", value, "' for ", name, ": ", e.what());
  }
}

std::set<std::string> GivenDecodeFlags(const CLI::App* cmd) {
  std::set<std::string> given;
  for (const OptionSpec& spec : OptionSchema()) {
    const std::string flag = CanonicalFlag(spec);
    const CLI::Option* option = cmd->get_option_no_throw("--" + flag);
    if (option != nullptr && option->count() > 0) given.insert(flag);
  }
  return given;
}

std::vector<int> ParseIdList(const std::string& text, const char* flag) {
  std::vector<int> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      Fail(flag, ": '", item, "' is not a token id (expected a comma-separated list like 1,2,3)");
    }
    ids.push_back(value);
    start = end + 1;
  }
  return ids;
}

}  // namespace polestar::cli
