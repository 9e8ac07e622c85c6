// The tokenizer that belongs to a model path: tokenizer.json (+ tokenizer_config.json) in a
// Hugging Face folder, or the tokenizer.ggml.* metadata of a .gguf file.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace polestar {

// Throws Error naming the path when the model has no tokenizer (use token ids then), or when a
// token id is outside the model's vocabulary (config.json's vocab_size).
std::unique_ptr<Tokenizer> LoadModelTokenizer(const std::string& model_path);

// Whether LoadModelTokenizer finds a tokenizer: a folder's tokenizer.json, or a GGUF file's
// vocabulary (not llama.cpp's vocabulary-less "none"). Throws Error for a damaged GGUF file.
bool ModelHasTokenizer(const std::string& model_path);

}  // namespace polestar
