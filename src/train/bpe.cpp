#include "train/bpe.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"

namespace polestar {
namespace {

// GPT-2's printable character of `byte`, as UTF-8.
std::string ByteChar(uint8_t byte) {
  std::string out;
  unicode::AppendUtf8(out, unicode::ByteToChar(byte));
  return out;
}

// The characters of a pre-token in byte-level form (each one byte of the text).
std::vector<std::string> ByteLevelChars(std::string_view piece) {
  const std::vector<std::string_view> chars = unicode::CodePoints(piece);
  return {chars.begin(), chars.end()};
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

void CheckAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) Fail("tokenizer: non-ASCII text is not supported by the trainer's tokenizer");
  }
}

bool HasDigit(const std::string& symbol) {
  return std::any_of(symbol.begin(), symbol.end(), IsDigit);
}

const std::vector<std::string>& SpecialTokens() {
  static const std::vector<std::string> specials = {kEosToken,         kBosToken,       kMaskToken,
                                                    kStartHeaderToken, kEndHeaderToken, kEotToken};
  return specials;
}

// Splits `text` into (segment, is_special) around the special tokens.
std::vector<std::pair<std::string_view, bool>> SplitSpecials(std::string_view text) {
  std::vector<std::pair<std::string_view, bool>> parts;
  size_t begin = 0, at = 0;
  while (at < text.size()) {
    bool matched = false;
    if (text[at] == '<') {
      for (const std::string& special : SpecialTokens()) {
        if (text.substr(at).starts_with(special)) {
          if (at > begin) parts.push_back({text.substr(begin, at - begin), false});
          parts.push_back({text.substr(at, special.size()), true});
          at += special.size();
          begin = at;
          matched = true;
          break;
        }
      }
    }
    if (!matched) ++at;
  }
  if (begin < text.size()) parts.push_back({text.substr(begin), false});
  return parts;
}

}  // namespace

BpeTokenizer BpeTokenizer::Train(const std::vector<std::string>& corpus, int merges) {
  BpeTokenizer tok;
  for (int b = 0; b < 256; ++b) tok.vocab_.push_back(ByteChar(uint8_t(b)));

  // The corpus is split into pre-tokens by the engine's pre-tokenizer, that of the bytes-only
  // tokenizer (no merges yet), so the merges are learned on the pieces the engine will merge.
  BpeTokenizer bytes_only = tok;
  for (const std::string& special : SpecialTokens()) bytes_only.vocab_.push_back(special);
  bytes_only.specials_ = SpecialTokens();
  bytes_only.Finish();
  std::map<std::string, int64_t> counts;  // pre-token (byte-level form) -> frequency
  for (const std::string& text : corpus) {
    CheckAscii(text);
    for (const auto& [segment, special] : SplitSpecials(text)) {
      if (special) continue;
      for (std::string& piece : bytes_only.engine_->PreTokenize(segment))
        ++counts[std::move(piece)];
    }
  }
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [piece, count] : counts) words.push_back({ByteLevelChars(piece), count});

  for (int m = 0; m < merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        if (HasDigit(symbols[i]) || HasDigit(symbols[i + 1])) continue;
        pairs[{symbols[i], symbols[i + 1]}] += count;
      }
    }
    // Most frequent pair; ties go to the smallest pair, so training is deterministic.
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 1;
    for (const auto& [pair, count] : pairs) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    tok.merges_.push_back(merge);
    tok.vocab_.push_back(merge.first + merge.second);
    for (auto& [symbols, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == merge.first && symbols[i + 1] == merge.second) {
          merged.push_back(merge.first + merge.second);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }
  for (const std::string& special : SpecialTokens()) tok.vocab_.push_back(special);
  tok.specials_ = SpecialTokens();
  tok.Finish();
  return tok;
}

BpeTokenizer BpeTokenizer::Load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  const nlohmann::json j = ReadJsonFile(path);
  if (!j.contains("model") || j["model"].value("type", "") != "BPE" ||
      !j["model"]["vocab"].is_object() || !j["model"]["merges"].is_array()) {
    Fail(path, ": not a byte-level BPE tokenizer.json");
  }
  BpeTokenizer tok;
  const auto& vocab = j["model"]["vocab"];
  tok.vocab_.resize(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<size_t>() >= vocab.size() ||
        !tok.vocab_[id.get<size_t>()].empty()) {
      Fail(path, ": vocabulary ids must be 0..", vocab.size() - 1, " without gaps");
    }
    tok.vocab_[id.get<size_t>()] = token;
  }
  for (const auto& merge : j["model"]["merges"]) {
    const std::string text = merge.is_string() ? merge.get<std::string>() : "";
    const size_t space = text.find(' ');
    if (space == std::string::npos) Fail(path, ": merge '", text, "' is not 'left right'");
    tok.merges_.push_back({text.substr(0, space), text.substr(space + 1)});
  }
  tok.specials_ = SpecialTokens();
  tok.Finish();
  for (const std::string& special : tok.specials_) tok.TokenId(special);
  return tok;
}

void BpeTokenizer::Finish() {
  ids_.clear();
  for (size_t i = 0; i < vocab_.size(); ++i) {
    if (!ids_.emplace(vocab_[i], int(i)).second)
      Fail("tokenizer: duplicate token '", vocab_[i], "'");
  }
  // What the engine reads back from the files WriteFiles writes.
  TokenizerSpec spec =
      ParseTokenizerJson(nlohmann::json::parse(TokenizerJson()), "the trainer's tokenizer.json");
  ApplyTokenizerConfig(nlohmann::json::parse(TokenizerConfigJson(0)),
                       "the trainer's tokenizer_config.json", spec);
  engine_ = std::make_shared<const Tokenizer>(std::move(spec));
}

int BpeTokenizer::TokenId(std::string_view token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) Fail("tokenizer: no token '", token, "'");
  return it->second;
}

std::vector<int> BpeTokenizer::Encode(std::string_view text) const {
  CheckAscii(text);
  return engine_->Encode(text);
}

std::string BpeTokenizer::Decode(const std::vector<int>& ids) const { return engine_->Decode(ids); }

std::string BpeTokenizer::TokenizerJson() const {
  using nlohmann::ordered_json;
  ordered_json added = ordered_json::array();
  for (const std::string& special : specials_) {
    added.push_back({{"id", TokenId(special)},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  for (size_t i = 0; i < vocab_.size(); ++i) vocab[vocab_[i]] = i;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : merges_) merges.push_back(a + " " + b);
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
  ordered_json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", byte_level},
                    {"post_processor", nullptr},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", ""},
                      {"end_of_word_suffix", ""},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  return j.dump(1);
}

std::string BpeTokenizer::TokenizerConfigJson(int model_max_length) const {
  using nlohmann::ordered_json;
  ordered_json decoder = ordered_json::object();
  for (const std::string& special : specials_) {
    decoder[std::to_string(TokenId(special))] = {{"content", special},   {"lstrip", false},
                                                 {"normalized", false},  {"rstrip", false},
                                                 {"single_word", false}, {"special", true}};
  }
  const ordered_json config = {{"add_bos_token", false},
                               {"add_eos_token", false},
                               {"added_tokens_decoder", decoder},
                               {"bos_token", kBosToken},
                               {"chat_template", std::string(BuiltinChatTemplate("llada"))},
                               {"clean_up_tokenization_spaces", false},
                               {"eos_token", kEosToken},
                               {"mask_token", kMaskToken},
                               {"model_max_length", model_max_length},
                               {"pad_token", kEosToken},
                               {"tokenizer_class", "PreTrainedTokenizerFast"}};
  return config.dump(2);
}

void BpeTokenizer::WriteFiles(const std::string& dir, int model_max_length) const {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    WriteFileAtomically((std::filesystem::path(dir) / name).string(), text + "\n");
  };
  write("tokenizer.json", TokenizerJson());
  write("tokenizer_config.json", TokenizerConfigJson(model_max_length));
}

}  // namespace polestar
