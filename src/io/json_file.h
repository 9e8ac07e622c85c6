#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace polestar {

// Reads and parses a JSON file; throws Error naming the file on I/O or syntax errors.
nlohmann::json ReadJsonFile(const std::string& path);
// Parses JSON held in memory; `where` names its origin in the Error for a syntax error.
nlohmann::json ParseJsonText(std::string_view text, const std::string& where);

}  // namespace polestar
