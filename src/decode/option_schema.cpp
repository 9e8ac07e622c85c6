#include "decode/option_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace polestar {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using O = DecodeOptions;
using C = ModelConfig;

// "block-length" and "block_length" name the same option.
std::string Normalised(std::string_view key) {
  while (!key.empty() && key.front() == '-') key.remove_prefix(1);
  std::string out(key);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

// The long flags of `option` without dashes, canonical first ("-s" is skipped).
std::vector<std::string> LongFlags(const OptionSpec& option) {
  std::vector<std::string> names;
  std::string_view flags = option.flags;
  while (!flags.empty()) {
    const size_t comma = flags.find(',');
    const std::string_view flag = flags.substr(0, comma);
    if (flag.substr(0, 2) == "--") names.emplace_back(flag.substr(2));
    flags = comma == std::string_view::npos ? "" : flags.substr(comma + 1);
  }
  return names;
}

std::vector<OptionSpec> BuildSchema() {
  // Ranges bounded by the context keep every schedule, window and count within what the
  // model can hold, so nothing downstream allocates or loops beyond it.
  return {
      {.name = "policy", .member = &O::policy, .flags = "--policy", .help = "decoding policy"},
      {.name = "gen_length",
       .member = &O::gen_length,
       .flags = "--gen-length",
       .help = "generated positions (canvas length)",
       .range = ValueRange{1, kInf, false, true},
       .http_name = "max_tokens (rounded up to the block length)"},
      {.name = "block_length",
       .member = &O::block_length,
       .flags = "--block-length,--diffusion-block-length",
       .help = "semi-autoregressive block length (0: one block)",
       .range = ValueRange{0, &O::gen_length}},
      {.name = "steps",
       .member = &O::steps,
       .flags = "--steps,--diffusion-steps",
       .help = "steps over all blocks (LLaDA 2.x: per block)",
       .range = ValueRange{1, &C::max_positions}},
      {.name = "threshold",
       .member = &O::threshold,
       .flags = "--threshold",
       .help = "confidence threshold commit (Fast-dLLM), in (0, 1], e.g. 0.9",
       .range = ValueRange{0, 1, true}},
      {.name = "factor",
       .member = &O::factor,
       .flags = "--factor",
       .help = "factor commit rule (Fast-dLLM), > 0",
       .range = ValueRange{0, kInf, true, true}},
      {.name = "temperature",
       .member = &O::temperature,
       .flags = "--temperature,--temp",
       .help = "sampling temperature",
       .range = ValueRange{0, kInf, false, true}},
      {.name = "seed", .member = &O::seed, .flags = "--seed,-s", .help = "random seed"},
      {.name = "remasking",
       .member = &O::remasking,
       .flags = "--remasking",
       .help = "LLaDA: low_confidence | random",
       .modes = {"low_confidence", "random"}},
      {.name = "alg",
       .member = &O::alg,
       .flags = "--alg",
       .help = "Dream sampler: origin | maskgit_plus | topk_margin | entropy | "
               "confidence_threshold",
       .modes = {"", "origin", "maskgit_plus", "topk_margin", "entropy", "confidence_threshold"},
       .help_shows_default = false},
      {.name = "eps",
       .member = &O::eps,
       .flags = "--eps,--diffusion-eps",
       .help = "Dream time schedule epsilon",
       .range = ValueRange{0, 1, true, true}},
      {.name = "alg_temp",
       .member = &O::alg_temp,
       .flags = "--alg-temp,--diffusion-alg-temp",
       .help = "Dream: order sampling temperature",
       .range = ValueRange{0, kInf, false, true},
       .help_shows_default = false},
      {.name = "cfg_scale",
       .member = &O::cfg_scale,
       .flags = "--cfg-scale,--diffusion-cfg-scale",
       .help = "classifier-free guidance scale",
       // Bounded so that (scale + 1) times a difference of finite logits stays finite.
       .range = ValueRange{0, 1000},
       .help_shows_default = false},
      {.name = "top_p",
       .member = &O::top_p,
       .flags = "--top-p",
       .help = "Dream: nucleus sampling",
       .range = ValueRange{0, 1, true}},
      {.name = "top_k",
       .member = &O::top_k,
       .flags = "--top-k",
       .help = "Dream: top-k sampling (0: off)",
       .range = ValueRange{0, &C::vocab}},
      {.name = "refresh_all",
       .member = &O::refresh_all,
       .flags = "--refresh-all",
       .help = "cached policies: recompute everything every step",
       .help_shows_default = false,
       .is_switch = true},
      {.name = "eos_early_stop",
       .member = &O::eos_early_stop,
       .flags = "--eos-early-stop",
       .help = "stop once an end token is committed with nothing masked before it",
       .help_shows_default = false,
       .is_switch = true},
      // Elastic-Cache.
      {.name = "track_num",
       .member = &O::track_num,
       .flags = "--track-num",
       .help = "Elastic-Cache: most-attended tokens tracked",
       .range = ValueRange{1, &O::gen_length}},
      {.name = "gamma",
       .member = &O::gamma,
       .flags = "--gamma",
       .help = "Elastic-Cache: cosine trigger threshold",
       .range = ValueRange{0, 1, true}},
      {.name = "window",
       .member = &O::window,
       .flags = "--window",
       .help = "Elastic-Cache: sliding window (0: 16 LLaDA, 32 Dream)",
       .range = ValueRange{0, &C::max_positions},
       .help_shows_default = false},
      // Polestar. tau_s comes before early_floor, whose range it bounds.
      {.name = "tau_s",
       .member = &O::tau_s,
       .flags = "--tau-s",
       .help = "Polestar: commit threshold",
       .range = ValueRange{0, 1, true}},
      {.name = "early_floor",
       .member = &O::early_floor,
       .flags = "--early-floor",
       .help = "Polestar: early-commit confidence floor",
       .range = ValueRange{0, &O::tau_s, false, true}},
      {.name = "alpha",
       .member = &O::alpha,
       .flags = "--alpha",
       .help = "Polestar: drift gate coefficient",
       .range = ValueRange{0, kInf, false, true}},
      {.name = "drift_cap",
       .member = &O::drift_cap,
       .flags = "--drift-cap",
       .help = "Polestar: drift gate cap",
       .range = ValueRange{0, kInf, false, true}},
      {.name = "drift_history",
       .member = &O::drift_history,
       .flags = "--drift-history",
       .help = "Polestar: drift history steps",
       .range = ValueRange{1, 1000}},
      {.name = "clusters",
       .member = &O::clusters,
       .flags = "--clusters",
       .help = "Polestar: clusters per layer",
       .range = ValueRange{2, 1024}},
      {.name = "topk_clusters",
       .member = &O::topk_clusters,
       .flags = "--topk-clusters,--topk",
       .help = "Polestar: clusters refreshed per layer",
       .range = ValueRange{1, &O::clusters}},
      {.name = "kmeans_iters",
       .member = &O::kmeans_iters,
       .flags = "--kmeans-iters",
       .help = "Polestar: k-means iterations",
       .range = ValueRange{1, 1000}},
      {.name = "window_prefix_blocks",
       .member = &O::window_prefix_blocks,
       .flags = "--window-prefix-blocks",
       .help = "Polestar: prefix window blocks",
       .range = ValueRange{0, &C::max_positions}},
      {.name = "window_suffix_blocks",
       .member = &O::window_suffix_blocks,
       .flags = "--window-suffix-blocks",
       .help = "Polestar: suffix window blocks",
       .range = ValueRange{0, &C::max_positions}},
      {.name = "full_refresh_period",
       .member = &O::full_refresh_period,
       .flags = "--full-refresh-period",
       .help = "Polestar: every n-th block starts windowed",
       .range = ValueRange{1, 1e6}},
      {.name = "tau_upd",
       .member = &O::tau_upd,
       .flags = "--tau-upd",
       .help = "Polestar: refresh after more than this many commits",
       .range = ValueRange{0, &O::gen_length}},
      {.name = "polestar_cache",
       .member = &O::polestar_cache,
       .flags = "--polestar-cache",
       .help = "Polestar: drift-aware sparse refresh (true/false)"},
      {.name = "early_commit",
       .member = &O::early_commit,
       .flags = "--early-commit",
       .help = "Polestar: drift-gated early commit (true/false)"},
      {.name = "suffix_commit",
       .member = &O::suffix_commit,
       .flags = "--suffix-commit",
       .help = "Polestar: commit refreshed suffix positions (true/false)"},
      {.name = "drift_metric",
       .member = &O::drift_metric,
       .flags = "--drift-metric",
       .help = "Polestar: kl | cosine",
       .modes = {"kl", "cosine"}},
      {.name = "nvfp4_hidden",
       .member = &O::nvfp4_hidden,
       .flags = "--nvfp4-hidden,--nvfp4",
       .help = "Polestar: NVFP4 residual hidden-state cache (true/false)"},
      {.name = "offload_residuals",
       .member = &O::offload_residuals,
       .flags = "--offload-residuals",
       .help = "Polestar: the NVFP4 residuals off the accelerator (pinned host memory on a GPU), "
               "read in place for the refreshed rows; needs --nvfp4-hidden (true/false)"},
      {.name = "overlap",
       .member = &O::overlap,
       .flags = "--overlap",
       .help = "Polestar: auxiliary work on a worker thread (true/false)"},
  };
}

}  // namespace

bool Interval::Contains(double value) const {
  return (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
}

double Bound::Of(const DecodeOptions& options, const ModelConfig& config) const {
  return std::visit(
      [&](auto source) -> double {
        if constexpr (std::is_same_v<decltype(source), double>) {
          return source;
        } else if constexpr (std::is_same_v<decltype(source), int ModelConfig::*>) {
          return double(config.*source);
        } else {
          return double(options.*source);
        }
      },
      source_);
}

Interval ValueRange::Of(const DecodeOptions& options, const ModelConfig& config) const {
  return {low.Of(options, config), high.Of(options, config), low_open, high_open};
}

std::string Interval::Text() const {
  auto bound = [](double b) {
    return std::isinf(b) ? std::string(b < 0 ? "-inf" : "inf") : Cat(b);
  };
  return Cat(low_open ? "(" : "[", bound(low), ", ", bound(high), high_open ? ")" : "]");
}

nlohmann::json OptionValueJson(const OptionSpec& option, const DecodeOptions& options) {
  return std::visit(
      [&](auto member) {
        const auto& value = options.*member;
        using T = std::remove_cvref_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::optional<double>>) {
          return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
        } else if constexpr (std::is_enum_v<T>) {
          return nlohmann::json(ModeName(option, value));
        } else {
          return nlohmann::json(value);
        }
      },
      option.member);
}

const std::vector<OptionSpec>& OptionSchema() {
  static const std::vector<OptionSpec> schema = BuildSchema();
  return schema;
}

const OptionSpec* FindOption(std::string_view key) {
  const std::string wanted = Normalised(key);
  if (wanted.empty()) return nullptr;
  for (const OptionSpec& option : OptionSchema()) {
    if (wanted == option.name) return &option;
    for (const char* alias : option.aliases) {
      if (wanted == Normalised(alias)) return &option;
    }
    for (const std::string& flag : LongFlags(option)) {
      if (wanted == Normalised(flag)) return &option;
    }
  }
  return nullptr;
}

const OptionSpec& OptionOf(const OptionMember& member) {
  for (const OptionSpec& option : OptionSchema()) {
    if (option.member == member) return option;
  }
  CheckFailed(__FILE__, __LINE__, "every DecodeOptions member is in the schema");
}

std::string OptionName(const OptionSpec& option, Vocabulary vocabulary) {
  if (vocabulary == Vocabulary::kCli) return "--" + CanonicalFlag(option);
  return option.http_name ? option.http_name : option.name;
}

std::string CanonicalFlag(const OptionSpec& option) { return LongFlags(option).front(); }

void CheckOptionValue(const OptionSpec& option, const DecodeOptions& options,
                      const ModelConfig& config) {
  std::visit(
      [&](auto member) {
        const auto& value = options.*member;
        using T = std::remove_cvref_t<decltype(value)>;
        // Modes were checked where they were read (ParseMode), the policy by the registry.
        if constexpr ((std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) ||
                      std::is_same_v<T, std::optional<double>>) {
          if (!option.range) return;
          double number = 0;
          if constexpr (std::is_same_v<T, std::optional<double>>) {
            if (!value) return;
            number = *value;
          } else {
            number = double(value);
          }
          const Interval range = option.range->Of(options, config);
          if (range.Contains(number)) return;
          const bool integral =
              std::isfinite(number) && std::fabs(number) < 1e15 && number == std::floor(number);
          FailOption(option, " must lie in ", range.Text(), " (got ",
                     integral ? Cat(int64_t(number)) : Cat(number), ")");
        }
      },
      option.member);
}

size_t ModeIndex(const OptionSpec& option, std::string_view text) {
  PS_CHECK(!option.modes.empty());
  std::string known;  // the names a user may give; "" (unset) goes without saying
  for (size_t i = 0; i < option.modes.size(); ++i) {
    if (text == option.modes[i]) return i;
    if (*option.modes[i]) known += Cat(known.empty() ? "" : ", ", option.modes[i]);
  }
  FailOption("unknown ", option, " '", text, "' (", known, ")");
}

OptionError::OptionError(std::vector<Part> parts)
    : Error(Render(parts, Vocabulary::kCli)), parts_(std::move(parts)) {
  PS_CHECK(std::any_of(parts_.begin(), parts_.end(), [](const Part& p) { return p.option; }));
}

const OptionSpec& OptionError::option() const {
  return *std::find_if(parts_.begin(), parts_.end(), [](const Part& p) {
            return p.option;
          })->option;
}

std::string OptionError::Message(Vocabulary vocabulary) const { return Render(parts_, vocabulary); }

std::string OptionError::Render(const std::vector<Part>& parts, Vocabulary vocabulary) {
  std::string text;
  for (const Part& part : parts) {
    text += part.option ? OptionName(*part.option, vocabulary) : part.text;
  }
  return text;
}

}  // namespace polestar
