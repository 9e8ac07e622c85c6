// The decoding flags shared by generate, eval, bench and serve, generated from the option schema.
#pragma once

#include <CLI/CLI.hpp>
#include <set>
#include <string>

#include "decode/options.h"

namespace polestar::cli {

// A CLI11 check that a number lies in [low, high]. CLI::Range lets NaN through (every
// comparison with NaN is false); this does not, nor infinities outside the bounds.
CLI::Validator Within(double low, double high);

// A CLI11 check that text is valid UTF-8: the tokenizers take Unicode text, and invalid bytes
// would otherwise be replaced silently.
CLI::Validator Utf8Text();

// Adds an unsigned 64-bit option parsed strictly: CLI11 would wrap "-1" and saturate values
// past 2^64 - 1 into a uint64_t silently.
CLI::Option* AddUint64Option(CLI::App* cmd, const std::string& names, uint64_t& target,
                             const std::string& help);

// Registers the decoding flags on `cmd`, one per option of the schema (option_schema.h) with
// its aliases, bound to `options`; their defaults (shown by --help) are the values `options`
// holds now. "--policy help" prints the registered policies and exits.
void AddDecodeFlags(CLI::App* cmd, DecodeOptions& options);

// The decoding defaults of a model: the built-in ones, overridden by the model folder's
// generation_config.json (Hugging Face's file for generation defaults; in a GGUF file written
// by `convert`, its copy in polestar.generation_config) where it names a
// decoding option by any of its names ("gen_length", "block_length", "steps",
// "threshold", ...; "max_new_tokens" as gen_length). Other keys (bos_token_id,
// transformers_version, ...) belong to Hugging Face and are ignored, as are null values.
// Throws Error naming the file and key for a bad value.
DecodeOptions ModelDecodeDefaults(const std::string& model_path);

// The decoding defaults for a command line: those of the model its -m/--model names, or
// of the bundled model when it names none and the command uses one (generate, eval, serve,
// tasks-eval). Read before the flags are registered, so --help shows the values a run would use.
DecodeOptions CommandLineDecodeDefaults(int argc, const char* const* argv);

// The bundled model (models/polestar-tiny), found from the working directory or the source
// tree this binary was built from; used when -m is omitted.
std::string DefaultModelPath();

// Sets one decoding option by any of its names ("threshold", "block-length", "block_length",
// "topk"), exactly as its flag would; throws Error for an unknown name or a bad value.
void SetDecodeOption(DecodeOptions& options, const std::string& key, const std::string& value);

// The canonical flag name of `key` ("diffusion-steps" -> "steps", "topk" ->
// "topk-clusters"); throws Error listing the known names when there is no such option.
std::string CanonicalDecodeFlag(const std::string& key);

// The canonical flags (without dashes) of the decode options given on `cmd`'s command line,
// by any of their names.
std::set<std::string> GivenDecodeFlags(const CLI::App* cmd);

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int> ParseIdList(const std::string& text, const char* flag);

}  // namespace polestar::cli
