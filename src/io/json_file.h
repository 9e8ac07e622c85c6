#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace polestar {

// Reads and parses a JSON file; throws Error naming the file on I/O or syntax errors.
nlohmann::json ReadJsonFile(const std::string& path);

}  // namespace polestar
