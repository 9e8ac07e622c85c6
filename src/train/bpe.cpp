#include "train/bpe.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"

namespace polestar {
namespace {

std::string Utf8(int codepoint) {
  std::string out;
  if (codepoint < 0x80) {
    out += char(codepoint);
  } else {  // the map only uses code points below 0x800
    out += char(0xC0 | (codepoint >> 6));
    out += char(0x80 | (codepoint & 0x3F));
  }
  return out;
}

bool IsLetter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}
bool IsOther(char c) { return !IsLetter(c) && !IsDigit(c) && !IsSpace(c); }

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

const std::string& ByteChar(unsigned char byte) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[size_t(b)] = Utf8(printable ? b : next++);
    }
    return t;
  }();
  return table[byte];
}

// The GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// restricted to ASCII.
std::vector<std::string_view> BpeTokenizer::PreTokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  const size_t n = text.size();
  for (unsigned char c : text) {
    if (c >= 0x80) Fail("tokenizer: non-ASCII text is not supported by the training encoder");
  }
  auto run = [&](size_t from, bool (*in_class)(char)) {
    while (from < n && in_class(text[from])) ++from;
    return from;
  };
  while (i < n) {
    const char c = text[i];
    size_t end = i;
    if (c == '\'') {
      for (std::string_view tail : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        if (text.substr(i + 1).starts_with(tail)) {
          end = i + 1 + tail.size();
          break;
        }
      }
    }
    if (end == i) {
      const size_t body = (c == ' ' && i + 1 < n && !IsSpace(text[i + 1])) ? i + 1 : i;
      if (body < n && IsLetter(text[body])) {
        end = run(body, IsLetter);
      } else if (body < n && IsDigit(text[body])) {
        end = run(body, IsDigit);
      } else if (body < n && IsOther(text[body])) {
        end = run(body, IsOther);
      } else {  // whitespace: leave the last one to prefix the next word
        end = run(i, IsSpace);
        if (end < n && end - i > 1) --end;
      }
    }
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

BpeTokenizer BpeTokenizer::Train(const std::vector<std::string>& corpus, int merges) {
  BpeTokenizer tok;
  for (int b = 0; b < 256; ++b) tok.vocab_.push_back(ByteChar(static_cast<unsigned char>(b)));

  std::map<std::string, int64_t> counts;  // pre-tokenized piece -> frequency
  for (const std::string& text : corpus) {
    for (const auto& [segment, special] : SplitSpecials(text)) {
      if (special) continue;
      for (std::string_view piece : PreTokenize(segment)) ++counts[std::string(piece)];
    }
  }
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [piece, count] : counts) {
    std::vector<std::string> symbols;
    for (unsigned char c : piece) symbols.push_back(ByteChar(c));
    words.push_back({std::move(symbols), count});
  }

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
  merge_rank_.clear();
  for (size_t i = 0; i < merges_.size(); ++i) merge_rank_[merges_[i]] = int(i);
}

int BpeTokenizer::TokenId(std::string_view token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) Fail("tokenizer: no token '", token, "'");
  return it->second;
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<int>& ids) const {
  std::vector<std::string> symbols;
  for (unsigned char c : piece) symbols.push_back(ByteChar(c));
  while (symbols.size() > 1) {
    int best_rank = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find({symbols[i], symbols[i + 1]});
      if (it != merge_rank_.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best_at = i;
      }
    }
    if (best_rank < 0) break;
    const auto& merge = merges_[size_t(best_rank)];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i >= best_at && i + 1 < symbols.size() && symbols[i] == merge.first &&
          symbols[i + 1] == merge.second) {
        merged.push_back(merge.first + merge.second);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols = std::move(merged);
  }
  for (const std::string& symbol : symbols) ids.push_back(TokenId(symbol));
}

std::vector<int> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  for (const auto& [segment, special] : SplitSpecials(text)) {
    if (special) {
      ids.push_back(TokenId(segment));
      continue;
    }
    for (std::string_view piece : PreTokenize(segment)) EncodePiece(piece, ids);
  }
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int>& ids) const {
  static const std::map<std::string, unsigned char> byte_of = [] {
    std::map<std::string, unsigned char> m;
    for (int b = 0; b < 256; ++b)
      m[ByteChar(static_cast<unsigned char>(b))] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string text;
  for (int id : ids) {
    PS_CHECK(id >= 0 && id < vocab_size());
    const std::string& token = vocab_[size_t(id)];
    if (std::find(specials_.begin(), specials_.end(), token) != specials_.end()) {
      text += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      const size_t len = (static_cast<unsigned char>(token[i]) < 0x80) ? 1 : 2;
      text += char(byte_of.at(token.substr(i, len)));
      i += len;
    }
  }
  return text;
}

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

void BpeTokenizer::WriteFiles(const std::string& dir, int model_max_length) const {
  using nlohmann::ordered_json;
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    WriteFileAtomically((std::filesystem::path(dir) / name).string(), text + "\n");
  };
  write("tokenizer.json", TokenizerJson());
  ordered_json decoder = ordered_json::object();
  for (const std::string& special : specials_) {
    decoder[std::to_string(TokenId(special))] = {{"content", special},   {"lstrip", false},
                                                 {"normalized", false},  {"rstrip", false},
                                                 {"single_word", false}, {"special", true}};
  }
  // LLaDA-8B-Instruct's template: BOS once, every turn trimmed and closed with <|eot_id|>,
  // the assistant header always appended.
  const std::string chat_template =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
      "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
      "{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' "
      "}}";
  const ordered_json config = {{"add_bos_token", false},
                               {"add_eos_token", false},
                               {"added_tokens_decoder", decoder},
                               {"bos_token", kBosToken},
                               {"chat_template", chat_template},
                               {"clean_up_tokenization_spaces", false},
                               {"eos_token", kEosToken},
                               {"mask_token", kMaskToken},
                               {"model_max_length", model_max_length},
                               {"pad_token", kEosToken},
                               {"tokenizer_class", "PreTrainedTokenizerFast"}};
  write("tokenizer_config.json", config.dump(2));
}

}  // namespace polestar
