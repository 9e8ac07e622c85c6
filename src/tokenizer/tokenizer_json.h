// Sources of a TokenizerSpec: Hugging Face tokenizer.json + tokenizer_config.json, and the
// tokenizer.ggml.* metadata of a GGUF file.
//
// Supported tokenizer.json components (anything else is an Error that names it):
//   model         BPE (merges as "a b" strings or ["a", "b"] pairs; ignore_merges,
//                 byte_fallback, unk_token, fuse_unk)
//   normalizer    null, NFC, NFD, NFKC, NFKD, Sequence of those
//   pre_tokenizer null, Split (Regex or String pattern, any behavior, invert), ByteLevel
//                 (add_prefix_space, use_regex), Sequence of those
//   decoder       ByteLevel, ByteFallback, Fuse, Sequence of those
//   post_processor ignored: encoding adds no BOS/EOS (add_special_tokens=False)
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace polestar {

// `where` names the file in error messages; every id must be below `id_limit` (the model's
// vocabulary size where known).
TokenizerSpec ParseTokenizerJson(const nlohmann::json& tokenizer, const std::string& where,
                                 int id_limit = kMaxTokenIds);
// Special tokens, clean_up_tokenization_spaces and chat_template from tokenizer_config.json.
void ApplyTokenizerConfig(const nlohmann::json& config, const std::string& where,
                          TokenizerSpec& spec);
// `path` is a folder with tokenizer.json (tokenizer_config.json and chat_template.jinja are
// read when present) or a tokenizer.json file.
TokenizerSpec ReadTokenizerFiles(const std::string& path, int id_limit = kMaxTokenIds);

// A bool GGUF key of polestar's own: the folder's clean_up_tokenization_spaces, which llama.cpp
// instead derives from tokenizer.ggml.pre (SetGgufPipeline sets llama.cpp's value).
inline constexpr char kGgufCleanUpSpacesKey[] = "polestar.tokenizer.clean_up_tokenization_spaces";

// A tokenizer from a GGUF file's tokenizer.ggml.* keys (model "gpt2", i.e. byte-level BPE);
// `where` names the file in messages.
TokenizerSpec SpecFromGguf(const GgufVocab& vocab, const std::string& where);

// Normalizers and pre-tokenizers of the Hugging Face tokenizer that llama.cpp's pre-tokenizer
// name stands for; throws Error for names not known here.
void SetGgufPipeline(std::string_view pre, const std::string& where, TokenizerSpec& spec);

// The llama.cpp pre-tokenizer name (tokenizer.ggml.pre) whose pipeline is `spec`'s own:
// `preferred` when it fits, else the first of gpt-2, llama-bpe, qwen2, bailingmoe that does;
// "" when none does.
std::string GgufPreTokenizerName(const TokenizerSpec& spec, std::string_view preferred);

}  // namespace polestar
