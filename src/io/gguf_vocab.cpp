// The tokenizer.ggml.* vocabulary of a GGUF file.
#include "base/error.h"
#include "io/gguf.h"

namespace polestar {

GgufVocab ReadGgufVocab(const GgufMetadata& m) {
  GgufVocab vocab;
  const std::string& origin = m.origin();
  vocab.model = m.GetString("tokenizer.ggml.model");
  if (m.Has("tokenizer.ggml.pre")) vocab.pre = m.GetString("tokenizer.ggml.pre");
  vocab.tokens = m.GetStrings("tokenizer.ggml.tokens");
  const int64_t size = int64_t(vocab.tokens.size());
  if (m.Has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> types = m.GetInts("tokenizer.ggml.token_type");
    if (int64_t(types.size()) != size) {
      Fail(origin, ": tokenizer.ggml.token_type has ", types.size(), " entries for ", size,
           " tokens");
    }
    for (int64_t t : types) {
      if (t < 0 || t > 6) Fail(origin, ": tokenizer.ggml.token_type holds unknown type ", t);
      vocab.token_types.push_back(int32_t(t));
    }
  } else {
    vocab.token_types.assign(size_t(size), 1);
  }
  if (m.Has("tokenizer.ggml.merges")) {
    vocab.merges = m.GetStrings("tokenizer.ggml.merges");
    for (const std::string& merge : vocab.merges) {
      const size_t space = merge.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == merge.size()) {
        Fail(origin, ": tokenizer.ggml.merges entry '", merge, "' is not of the form 'a b'");
      }
    }
  }
  auto special = [&](const char* key, int* id) {
    if (!m.Has(key)) return;
    const int64_t value = m.GetInt(key);
    if (value < 0 || value >= size) {
      Fail(origin, ": ", key, " = ", value, " lies outside the vocabulary of ", size);
    }
    *id = int(value);
  };
  special("tokenizer.ggml.bos_token_id", &vocab.bos_id);
  special("tokenizer.ggml.eos_token_id", &vocab.eos_id);
  special("tokenizer.ggml.eot_token_id", &vocab.eot_id);
  special("tokenizer.ggml.padding_token_id", &vocab.pad_id);
  special("tokenizer.ggml.mask_token_id", &vocab.mask_id);
  special("tokenizer.ggml.unknown_token_id", &vocab.unk_id);
  if (m.Has("tokenizer.ggml.add_bos_token"))
    vocab.add_bos = m.GetBool("tokenizer.ggml.add_bos_token");
  if (m.Has("tokenizer.ggml.add_eos_token"))
    vocab.add_eos = m.GetBool("tokenizer.ggml.add_eos_token");
  if (m.Has("tokenizer.chat_template"))
    vocab.chat_template = m.GetString("tokenizer.chat_template");
  return vocab;
}

}  // namespace polestar
