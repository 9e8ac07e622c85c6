#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "base/error.h"

namespace polestar {

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseJsonText(buffer.str(), path);
}

nlohmann::json ParseJsonText(std::string_view text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    Fail(where, ": malformed JSON: ", e.what());
  }
}

}  // namespace polestar
