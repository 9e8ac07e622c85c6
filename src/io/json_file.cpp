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
  try {
    return nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    Fail(path, ": malformed JSON: ", e.what());
  }
}

}  // namespace polestar
