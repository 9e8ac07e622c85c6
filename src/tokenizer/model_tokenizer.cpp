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

// llama.cpp's vocabulary-less models say "none" (or the older "no_vocab").
bool GgufHasVocabulary(const GgufMetadata& m) {
  if (!m.Has("tokenizer.ggml.model")) return m.Has("tokenizer.ggml.tokens");
  const std::string& model = m.GetString("tokenizer.ggml.model");
  return model != "none" && model != "no_vocab";
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
  const GgufMetadata& m = file.metadata;
  if (!GgufHasVocabulary(m)) {
    Fail(model_path,
         ": no vocabulary in tokenizer.ggml.* (pass token ids with --prompt-ids instead)");
  }
  TokenizerSpec spec = SpecFromGguf(ReadGgufVocab(m), model_path);
  if (m.Has(kGgufCleanUpSpacesKey))
    spec.clean_up_tokenization_spaces = m.GetBool(kGgufCleanUpSpacesKey);
  return std::make_unique<Tokenizer>(std::move(spec));
}

bool ModelHasTokenizer(const std::string& model_path) {
  if (fs::is_directory(model_path)) return fs::exists(fs::path(model_path) / "tokenizer.json");
  TensorStore store;
  return GgufHasVocabulary(ReadGgufFile(model_path, store).metadata);
}

}  // namespace polestar
