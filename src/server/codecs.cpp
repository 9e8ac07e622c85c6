#include "server/codecs.h"

#include <charconv>
#include <filesystem>

#include "base/error.h"
#include "io/json_file.h"
#include "server/utf8.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/unicode.h"

namespace polestar {
namespace {

// Generated text of IdTextCodec: ids separated by single spaces.
class IdTextStream : public TextStream {
 public:
  explicit IdTextStream(const IdTextCodec& codec) : codec_(codec) {}
  std::string Push(int token) override {
    std::string label = codec_.TokenLabel(token);
    if (label.empty()) return "";
    std::string text = first_ ? label : " " + label;
    first_ = false;
    return text;
  }
  std::string Finish() override { return ""; }

 private:
  const IdTextCodec& codec_;
  bool first_ = true;
};

class CharTextStream : public TextStream {
 public:
  explicit CharTextStream(const std::vector<std::string>& chars) : chars_(chars) {}
  std::string Push(int token) override {
    return token >= 0 && size_t(token) < chars_.size() ? chars_[size_t(token)] : "";
  }
  std::string Finish() override { return ""; }

 private:
  const std::vector<std::string>& chars_;
};

class TokenizerTextStream : public TextStream {
 public:
  TokenizerTextStream(const Tokenizer& tokenizer, const std::vector<bool>& known)
      : decoder_(tokenizer, {.skip_special_tokens = true, .clean_up_spaces = std::nullopt}),
        known_(known) {}
  std::string Push(int token) override {
    // An id the tokenizer has no token for (a padding row of the embedding) adds no text.
    if (token < 0 || size_t(token) >= known_.size() || !known_[size_t(token)]) return "";
    return decoder_.Push(token);
  }
  std::string Finish() override { return decoder_.Finish(); }

 private:
  StreamingDecoder decoder_;
  const std::vector<bool>& known_;
};

}  // namespace

IdTextCodec::IdTextCodec(const ModelConfig& config)
    : vocab_(config.vocab), eos_(config.eos_id), eot_(config.eot_id), pad_(config.pad_id) {}

std::vector<int> IdTextCodec::EncodeText(const std::string& text) const {
  std::vector<int> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',' || text[i] == '\n' || text[i] == '\t') {
      ++i;
      continue;
    }
    int id = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), id);
    if (ec != std::errc() || end == text.data() + i) {
      Fail("this model has no tokenizer: the prompt must be token ids such as \"12 7 9\" (found '",
           text.substr(i, 12), "')");
    }
    if (id < 0 || id >= vocab_) Fail("token id ", id, " is outside the vocabulary of ", vocab_);
    ids.push_back(id);
    i = size_t(end - text.data());
  }
  return ids;
}

std::vector<int> IdTextCodec::EncodeChat(const std::vector<ChatTurn>& turns) const {
  std::vector<int> ids;
  for (const ChatTurn& turn : turns) {
    const std::vector<int> part = EncodeText(turn.content);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::unique_ptr<TextStream> IdTextCodec::NewTextStream() const {
  return std::make_unique<IdTextStream>(*this);
}

std::string IdTextCodec::TokenLabel(int token) const {
  if (token == eos_ || token == eot_ || token == pad_) return "";
  return std::to_string(token);
}

std::unique_ptr<CharVocabCodec> CharVocabCodec::Load(const std::string& path) {
  const nlohmann::json vocab = ReadJsonFile(path);
  if (!vocab.is_object() || !vocab.contains("chars") || !vocab["chars"].is_array()) {
    Fail(path, ": expected an object with a \"chars\" array");
  }
  std::vector<std::string> chars;
  for (const auto& c : vocab["chars"]) {
    if (!c.is_string() || !IsValidUtf8(c.get<std::string>()) ||
        Utf8CharCount(c.get<std::string>()) != 1) {
      Fail(path, ": every entry of \"chars\" must be a single character (got ", c.dump(), ")");
    }
    chars.push_back(c.get<std::string>());
  }
  auto id = [&](const char* key, int fallback) {
    if (!vocab.contains(key)) return fallback;
    if (!vocab[key].is_number_integer()) Fail(path, ": \"", key, "\" must be an integer");
    return vocab[key].get<int>();
  };
  return std::make_unique<CharVocabCodec>(std::move(chars), id("EOS", -1), id("MASK", -1),
                                          id("PAD", -1), id("P_LEN", 0));
}

CharVocabCodec::CharVocabCodec(std::vector<std::string> chars, int eos, int mask, int pad,
                               int prompt_length)
    : chars_(std::move(chars)), eos_(eos), mask_(mask), pad_(pad), prompt_length_(prompt_length) {}

std::vector<int> CharVocabCodec::EncodeText(const std::string& text) const {
  if (!IsValidUtf8(text)) Fail("the prompt is not valid UTF-8");
  std::vector<int> ids;
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(static_cast<unsigned char>(text[i]));
    const std::string c = text.substr(i, length);
    size_t id = 0;
    while (id < chars_.size() && chars_[id] != c) ++id;
    if (id == chars_.size()) Fail("character '", c, "' is not in this model's vocabulary");
    ids.push_back(int(id));
    i += length;
  }
  if (pad_ >= 0 && int(ids.size()) < prompt_length_) {
    ids.insert(ids.begin(), size_t(prompt_length_) - ids.size(), pad_);
  }
  return ids;
}

std::vector<int> CharVocabCodec::EncodeChat(const std::vector<ChatTurn>& turns) const {
  std::string text;
  for (const ChatTurn& turn : turns) text += turn.content;
  return EncodeText(text);
}

std::unique_ptr<TextStream> CharVocabCodec::NewTextStream() const {
  return std::make_unique<CharTextStream>(chars_);
}

std::string CharVocabCodec::TokenLabel(int token) const {
  if (token >= 0 && size_t(token) < chars_.size()) return chars_[size_t(token)];
  if (token == eos_) return "<eos>";
  if (token == pad_) return "<pad>";
  if (token == mask_) return "<mask>";
  return Cat("<", token, ">");
}

TokenizerCodec::TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)), known_(size_t(tokenizer_->vocab_size())) {
  for (int id = 0; id < tokenizer_->vocab_size(); ++id) {
    try {
      known_[size_t(id)] = !tokenizer_->IdToToken(id).empty();
    } catch (const Error&) {
      known_[size_t(id)] = false;
    }
  }
}

std::vector<int> TokenizerCodec::EncodeText(const std::string& text) const {
  return tokenizer_->Encode(text);
}

std::vector<int> TokenizerCodec::EncodeChat(const std::vector<ChatTurn>& turns) const {
  std::vector<ChatMessage> messages;
  for (const ChatTurn& turn : turns) messages.push_back({turn.role, turn.content});
  return ApplyChatTemplate(*tokenizer_, messages, ChatTemplateFor(*tokenizer_));
}

std::unique_ptr<TextStream> TokenizerCodec::NewTextStream() const {
  return std::make_unique<TokenizerTextStream>(*tokenizer_, known_);
}

std::string TokenizerCodec::TokenLabel(int token) const {
  // The model's vocabulary may have rows past the tokenizer's (padding to a round size).
  if (token < 0 || size_t(token) >= known_.size() || !known_[size_t(token)]) {
    return Cat("<", token, ">");
  }
  if (tokenizer_->IsSpecial(token)) return tokenizer_->IdToToken(token);
  return unicode::ToValidUtf8(tokenizer_->TokenBytes(token));
}

std::unique_ptr<TextCodec> LoadTextCodec(const std::string& model_path, const ModelConfig& config) {
  namespace fs = std::filesystem;
  if (ModelHasTokenizer(model_path)) {
    return std::make_unique<TokenizerCodec>(LoadModelTokenizer(model_path));
  }
  const fs::path vocab = fs::path(model_path) / "vocab.json";
  // A Hugging Face folder may hold a BPE vocab.json (token -> id); only the character
  // vocabulary form is a codec on its own.
  if (fs::is_directory(model_path) && fs::exists(vocab) &&
      ReadJsonFile(vocab.string()).contains("chars")) {
    return CharVocabCodec::Load(vocab.string());
  }
  return std::make_unique<IdTextCodec>(config);
}

}  // namespace polestar
