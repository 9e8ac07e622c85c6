#include "tokenizer/model_tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "io/tensor_store.h"
#include "tokenizer/tokenizer_json.h"

namespace polestar {

namespace {

namespace fs = std::filesystem;

// The rows of the model's embedding as its config.json gives them (LLaDA's embedding_size,
// else vocab_size): no token id may reach them. kMaxTokenIds when the folder does not say;
// a malformed config.json is for the model loader to report.
int ModelVocabSize(const fs::path& folder) {
  const fs::path config_path = folder / "config.json";
  if (!fs::exists(config_path)) return kMaxTokenIds;
  const nlohmann::json config = ReadJsonFile(config_path.string());
  if (!config.is_object()) return kMaxTokenIds;
  for (const char* key : {"embedding_size", "vocab_size"}) {
    auto it = config.find(key);
    if (it != config.end() && it->is_number_unsigned()) {
      return int(std::min<uint64_t>(it->get<uint64_t>(), kMaxTokenIds));
    }
  }
  return kMaxTokenIds;
}

}  // namespace

std::unique_ptr<Tokenizer> LoadModelTokenizer(const std::string& model_path) {
  if (fs::is_directory(model_path)) {
    if (!fs::exists(fs::path(model_path) / "tokenizer.json")) {
      Fail(model_path, ": no tokenizer.json (pass token ids with --prompt-ids instead)");
    }
    return Tokenizer::Load(model_path, ModelVocabSize(model_path));
  }
  // A GGUF vocabulary is a list: its ids are the list's indices.
  TensorStore store;
  const GgufFile file = ReadGgufFile(model_path, store);
  return std::make_unique<Tokenizer>(SpecFromGguf(ReadGgufVocab(file.metadata), model_path));
}

}  // namespace polestar
