#include "decode_flags.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "base/error.h"
#include "io/json_file.h"
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
  cmd->add_option("--policy", o.policy, std::string("decoding policy: ") + KnownPolicies())
      ->capture_default_str();
  cmd->add_option("--gen-length", o.gen_length, "generated positions (canvas length)")
      ->capture_default_str();
  cmd->add_option("--block-length,--diffusion-block-length", o.block_length,
                  "semi-autoregressive block length (0: one block)")
      ->capture_default_str();
  cmd->add_option("--steps,--diffusion-steps", o.steps, "steps over all blocks")
      ->capture_default_str();
  cmd->add_option_function<double>(
      "--threshold", [&o](double v) { o.threshold = v; },
      "confidence threshold commit (Fast-dLLM), in (0, 1], e.g. 0.9");
  cmd->add_option_function<double>(
      "--factor", [&o](double v) { o.factor = v; }, "factor commit rule (Fast-dLLM), > 0");
  cmd->add_option("--temperature,--temp", o.temperature, "sampling temperature")
      ->capture_default_str();
  AddUint64Option(cmd, "--seed,-s", o.seed, "random seed");
  cmd->add_option("--remasking", o.remasking, "LLaDA: low_confidence | random")
      ->capture_default_str();
  cmd->add_option(
      "--alg", o.alg,
      "Dream sampler: origin | maskgit_plus | topk_margin | entropy | confidence_threshold");
  cmd->add_option("--eps,--diffusion-eps", o.eps, "Dream time schedule epsilon")
      ->capture_default_str();
  cmd->add_option("--alg-temp,--diffusion-alg-temp", o.alg_temp,
                  "Dream: order sampling temperature");
  cmd->add_option("--cfg-scale,--diffusion-cfg-scale", o.cfg_scale,
                  "classifier-free guidance scale");
  cmd->add_option("--top-p", o.top_p, "Dream: nucleus sampling")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Dream: top-k sampling (0: off)")->capture_default_str();
  cmd->add_flag("--refresh-all", o.refresh_all, "cached policies: recompute everything every step");
  // Elastic-Cache.
  cmd->add_option("--track-num", o.track_num, "Elastic-Cache: most-attended tokens tracked")
      ->capture_default_str();
  cmd->add_option("--gamma", o.gamma, "Elastic-Cache: cosine trigger threshold")
      ->capture_default_str();
  cmd->add_option("--window", o.window, "Elastic-Cache: sliding window (0: 16 LLaDA, 32 Dream)");
  // Polestar.
  cmd->add_option("--tau-s", o.tau_s, "Polestar: commit threshold")->capture_default_str();
  cmd->add_option("--early-floor", o.early_floor, "Polestar: early-commit confidence floor")
      ->capture_default_str();
  cmd->add_option("--alpha", o.alpha, "Polestar: drift gate coefficient")->capture_default_str();
  cmd->add_option("--drift-cap", o.drift_cap, "Polestar: drift gate cap")->capture_default_str();
  cmd->add_option("--drift-history", o.drift_history, "Polestar: drift history steps")
      ->capture_default_str();
  cmd->add_option("--clusters", o.clusters, "Polestar: clusters per layer")->capture_default_str();
  cmd->add_option("--topk", o.topk_clusters, "Polestar: clusters refreshed per layer")
      ->capture_default_str();
  cmd->add_option("--kmeans-iters", o.kmeans_iters, "Polestar: k-means iterations")
      ->capture_default_str();
  cmd->add_option("--window-prefix-blocks", o.window_prefix_blocks,
                  "Polestar: prefix window blocks")
      ->capture_default_str();
  cmd->add_option("--window-suffix-blocks", o.window_suffix_blocks,
                  "Polestar: suffix window blocks")
      ->capture_default_str();
  cmd->add_option("--full-refresh-period", o.full_refresh_period,
                  "Polestar: every n-th block starts windowed")
      ->capture_default_str();
  cmd->add_option("--tau-upd", o.tau_upd, "Polestar: refresh after more than this many commits")
      ->capture_default_str();
  cmd->add_option("--polestar-cache", o.polestar_cache,
                  "Polestar: drift-aware sparse refresh (true/false)")
      ->capture_default_str();
  cmd->add_option("--early-commit", o.early_commit,
                  "Polestar: drift-gated early commit (true/false)")
      ->capture_default_str();
  cmd->add_option("--suffix-commit", o.suffix_commit,
                  "Polestar: commit refreshed suffix positions (true/false)")
      ->capture_default_str();
  cmd->add_option("--drift-metric", o.drift_metric, "Polestar: kl | cosine")->capture_default_str();
  cmd->add_option("--nvfp4", o.nvfp4_hidden,
                  "Polestar: NVFP4 residual hidden-state cache (true/false)")
      ->capture_default_str();
  cmd->add_option("--overlap", o.overlap,
                  "Polestar: auxiliary work on a worker thread (true/false)")
      ->capture_default_str();
}

namespace {

bool IsDecodeFlag(const std::string& name) {
  CLI::App parser;
  DecodeOptions unused;
  AddDecodeFlags(&parser, unused);
  const CLI::Option* option = parser.get_option_no_throw("--" + name);
  return option != nullptr && !option->get_lnames().empty() &&
         option->get_lnames().front() != "help";
}

}  // namespace

DecodeOptions ModelDecodeDefaults(const std::string& model_path) {
  namespace fs = std::filesystem;
  DecodeOptions options;
  const fs::path path = fs::path(model_path) / "generation_config.json";
  std::error_code ec;
  if (!fs::is_directory(model_path, ec) || !fs::exists(path, ec)) return options;
  const nlohmann::json config = ReadJsonFile(path.string());
  if (!config.is_object()) Fail(path.string(), ": not a JSON object");
  if (config.contains("max_new_tokens") && config.contains("gen_length")) {
    Fail(path.string(), ": give gen_length or max_new_tokens, not both");
  }
  for (const auto& [key, value] : config.items()) {
    std::string flag = key == "max_new_tokens" ? "gen-length" : key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (value.is_null() || !IsDecodeFlag(flag)) continue;
    if (value.is_object() || value.is_array()) {
      Fail(path.string(), ": '", key, "' must be a number, a string or a boolean");
    }
    try {
      SetDecodeOption(options, flag, value.is_string() ? value.get<std::string>() : value.dump());
    } catch (const Error& e) {
      Fail(path.string(), ": '", key, "': ", e.what());
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
  CLI::App parser;
  DecodeOptions unused;
  AddDecodeFlags(&parser, unused);
  const CLI::Option* option = key.empty() ? nullptr : parser.get_option_no_throw("--" + key);
  if (option == nullptr || option->get_lnames().empty() || option->get_lnames().front() == "help") {
    std::string known;
    for (const CLI::Option* o : parser.get_options()) {
      if (o->get_lnames().empty() || o->get_lnames().front() == "help") continue;
      known += (known.empty() ? "" : ", ") + o->get_lnames().front();
    }
    Fail("unknown decoding setting '", key, "' (known: ", known, ")");
  }
  return option->get_lnames().front();
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
  CLI::App probe;
  DecodeOptions unused;
  AddDecodeFlags(&probe, unused);
  std::set<std::string> given;
  for (const CLI::Option* option : probe.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      const CLI::Option* mine = cmd->get_option_no_throw("--" + name);
      if (mine != nullptr && mine->count() > 0) given.insert(option->get_lnames().front());
    }
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
