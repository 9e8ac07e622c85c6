// The decoding flags shared by generate, eval, bench and serve, declared once.
#pragma once

#include <CLI/CLI.hpp>
#include <set>
#include <string>

#include "decode/options.h"

namespace polestar::cli {

void AddDecodeFlags(CLI::App* cmd, DecodeOptions& options);

// The bundled model (models/polestar-tiny), found from the working directory or the source
// tree this binary was built from; used when -m is omitted.
std::string DefaultModelPath();

// Sets one decoding option by its flag name without dashes ("threshold", "block-length",
// "early-commit"), exactly as the flag would; throws Error for an unknown name or a bad value.
void SetDecodeOption(DecodeOptions& options, const std::string& key, const std::string& value);

// The canonical flag name of `key` (its first long name: "diffusion-steps" -> "steps");
// throws Error listing the known names when there is no such flag.
std::string CanonicalDecodeFlag(const std::string& key);

// The long names (without dashes) of the decode flags given on `cmd`'s command line.
std::set<std::string> GivenDecodeFlags(const CLI::App* cmd);

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int> ParseIdList(const std::string& text, const char* flag);

}  // namespace polestar::cli
