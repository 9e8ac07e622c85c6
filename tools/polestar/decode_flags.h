// The decoding flags shared by generate, eval, bench and serve, declared once.
#pragma once

#include <CLI/CLI.hpp>

#include "decode/options.h"

namespace polestar::cli {

void AddDecodeFlags(CLI::App* cmd, DecodeOptions& options);

// The bundled model (models/polestar-tiny), found from the working directory or the source
// tree this binary was built from; used when -m is omitted.
std::string DefaultModelPath();

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int> ParseIdList(const std::string& text, const char* flag);

}  // namespace polestar::cli
