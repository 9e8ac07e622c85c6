// The decoding flags shared by generate, eval, bench and serve, declared once.
#pragma once

#include <CLI/CLI.hpp>

#include "decode/options.h"

namespace polestar::cli {

void AddDecodeFlags(CLI::App* cmd, DecodeOptions& options);

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int> ParseIdList(const std::string& text, const char* flag);

}  // namespace polestar::cli
