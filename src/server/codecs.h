// Codecs for models without a tokenizer.json: the fixture checkpoints and anything served
// before the real tokenizer is wired in.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "server/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace polestar {

// Text is token ids written out: "12 7 9" (spaces or commas between ids). Generated text
// is the ids joined by single spaces; special ids (EOS, end of turn, padding) are skipped.
class IdTextCodec : public TextCodec {
 public:
  explicit IdTextCodec(const ModelConfig& config);
  std::vector<int> EncodeText(const std::string& text) const override;
  std::vector<int> EncodeChat(const std::vector<ChatTurn>& turns) const override;
  std::unique_ptr<TextStream> NewTextStream() const override;
  std::string TokenLabel(int token) const override;

 private:
  int vocab_, eos_, eot_, pad_;
};

// A character vocabulary as in llada-probe/vocab.json: {"chars": [...], "EOS", "MASK",
// "PAD", "P_LEN"}. Token i is chars[i]; prompts are left-padded with PAD to P_LEN tokens,
// as the model was trained. Chat turns have no template: their contents are concatenated.
class CharVocabCodec : public TextCodec {
 public:
  // Throws Error naming `path` when the file is not such a vocabulary.
  static std::unique_ptr<CharVocabCodec> Load(const std::string& path);
  CharVocabCodec(std::vector<std::string> chars, int eos, int mask, int pad, int prompt_length);

  std::vector<int> EncodeText(const std::string& text) const override;
  std::vector<int> EncodeChat(const std::vector<ChatTurn>& turns) const override;
  std::unique_ptr<TextStream> NewTextStream() const override;
  std::string TokenLabel(int token) const override;

 private:
  std::vector<std::string> chars_;  // [V'] one UTF-8 character per id
  int eos_, mask_, pad_, prompt_length_;
};

// The model's own tokenizer (tokenizer.json, or a GGUF file's vocabulary): completions
// are encoded as they are (no start token, as `generate --raw`), chat turns with the
// tokenizer's chat template, and generated text is decoded without special tokens.
class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer);
  std::vector<int> EncodeText(const std::string& text) const override;
  std::vector<int> EncodeChat(const std::vector<ChatTurn>& turns) const override;
  std::unique_ptr<TextStream> NewTextStream() const override;
  std::string TokenLabel(int token) const override;

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<bool> known_;  // [tokenizer vocab] the id has a token
};

// The codec for the model at `model_path`: its tokenizer when it has one (a folder with
// tokenizer.json, or a GGUF file), else the character vocabulary of a vocab.json of that
// form, else ids as text.
std::unique_ptr<TextCodec> LoadTextCodec(const std::string& model_path, const ModelConfig& config);

}  // namespace polestar
