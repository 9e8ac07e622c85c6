#include "tokenizer/model_tokenizer.h"

#include <filesystem>

#include "base/error.h"
#include "io/gguf.h"
#include "io/tensor_store.h"
#include "tokenizer/tokenizer_json.h"

namespace polestar {

std::unique_ptr<Tokenizer> LoadModelTokenizer(const std::string& model_path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model_path)) {
    if (!fs::exists(fs::path(model_path) / "tokenizer.json")) {
      Fail(model_path, ": no tokenizer.json (pass token ids with --prompt-ids instead)");
    }
    return Tokenizer::Load(model_path);
  }
  TensorStore store;
  const GgufFile file = ReadGgufFile(model_path, store);
  return std::make_unique<Tokenizer>(SpecFromGguf(ReadGgufVocab(file.metadata), model_path));
}

}  // namespace polestar
