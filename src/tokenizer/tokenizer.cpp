#include "tokenizer/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <tuple>

#include "base/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_json.h"

namespace polestar {

namespace {

// Pieces longer than this are rarely repeated; caching them would only cost memory.
constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kCacheCapacity = size_t(1) << 16;

// ByteLevel's own split (use_regex=true), GPT-2's pattern.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A Split pattern given as {"String": ...} matches literally.
std::string EscapeLiteral(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      out += '\\';
    }
    out += c;
  }
  return out;
}

// The code point that ends at byte `end` of valid UTF-8 `text` (end > 0), and its start.
std::pair<char32_t, size_t> CharBefore(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
  return {unicode::DecodeUtf8(text, begin).code_point, begin};
}

bool IsWordChar(char32_t c) { return c == '_' || u_isalnum(UChar32(c)); }

// "<0x41>" -> 0x41; -1 if `token` is not a byte-fallback token.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

// The UTF-8 of ByteToChar(b) for every byte: the ByteLevel map used on every pre-token.
struct ByteLevelTable {
  std::array<std::array<char, 2>, 256> bytes{};
  std::array<uint8_t, 256> length{};
  ByteLevelTable() {
    for (int b = 0; b < 256; ++b) {
      std::string utf8;
      unicode::AppendUtf8(utf8, unicode::ByteToChar(uint8_t(b)));
      length[size_t(b)] = uint8_t(utf8.size());
      for (size_t i = 0; i < utf8.size(); ++i) bytes[size_t(b)][i] = utf8[i];
    }
  }
};

const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable table;
  return table;
}

void ByteLevelEncode(std::string_view text, std::string& out) {
  const ByteLevelTable& table = ByteLevel();
  out.resize(2 * text.size());
  char* dst = out.data();
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    dst[0] = table.bytes[b][0];
    dst[1] = table.bytes[b][1];
    dst += table.length[b];
  }
  out.resize(size_t(dst - out.data()));
}

uint64_t PairKey(int left, int right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

void ReplaceAll(std::string& text, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, start)) {
    out.append(text, start, at - start);
    out.append(to);
    start = at + from.size();
  }
  if (start == 0) return;
  out.append(text, start, std::string::npos);
  text = std::move(out);
}

// Characters that occur in the clean-up patterns; text may be cut for streaming right after
// any other character without changing what the clean-up does (no pattern can span it).
bool InCleanUpPatterns(char c) {
  return std::string_view(" .?!,'ntmsver").find(c) != std::string_view::npos;
}

}  // namespace

std::string CleanUpTokenizationSpaces(std::string text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) ReplaceAll(text, from, to);
  return text;
}

// Added tokens in a byte trie, matched leftmost-longest like the reference's splitter.
struct Tokenizer::AddedTokenMatcher {
  struct Node {
    std::vector<std::pair<uint8_t, int>> children;  // byte -> node
    int token = -1;                                 // index into `tokens`
  };
  std::vector<Node> nodes = std::vector<Node>(1);
  std::array<bool, 256> first_byte{};
  std::vector<AddedToken> tokens;

  int Child(int node, uint8_t byte) const {
    for (const auto& [b, child] : nodes[size_t(node)].children) {
      if (b == byte) return child;
    }
    return -1;
  }

  void Add(const AddedToken& token) {
    int node = 0;
    for (char c : token.content) {
      int child = Child(node, uint8_t(c));
      if (child < 0) {
        child = int(nodes.size());
        nodes.emplace_back();
        nodes[size_t(node)].children.emplace_back(uint8_t(c), child);
      }
      node = child;
    }
    if (nodes[size_t(node)].token >= 0) {
      tokens[size_t(nodes[size_t(node)].token)] =
          token;  // the later entry wins, as in the reference
      return;
    }
    nodes[size_t(node)].token = int(tokens.size());
    tokens.push_back(token);
    first_byte[uint8_t(token.content[0])] = true;
  }

  // single_word tokens only match where no word character touches them.
  static bool Accept(const AddedToken& token, std::string_view text, size_t begin, size_t end) {
    if (!token.single_word) return true;
    if (begin > 0 && IsWordChar(CharBefore(text, begin).first)) return false;
    if (end < text.size() && IsWordChar(unicode::DecodeUtf8(text, end).code_point)) return false;
    return true;
  }

  // Cuts `text` into plain runs, passed to on_text, and added tokens, passed to on_token.
  template <typename OnText, typename OnToken>
  void Split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t start = 0;  // first byte of the plain run not yet passed on
    size_t i = 0;
    while (i < text.size()) {
      if (!first_byte[static_cast<uint8_t>(text[i])]) {
        ++i;
        continue;
      }
      int best = -1;
      size_t best_end = 0;
      for (size_t j = i, node = 0; j < text.size(); ++j) {
        const int child = Child(int(node), static_cast<uint8_t>(text[j]));
        if (child < 0) break;
        node = size_t(child);
        const int t = nodes[node].token;
        if (t >= 0 && Accept(tokens[size_t(t)], text, i, j + 1)) best = t, best_end = j + 1;
      }
      if (best < 0) {
        ++i;
        continue;
      }
      const AddedToken& token = tokens[size_t(best)];
      size_t begin = i, end = best_end;
      while (token.lstrip && begin > start) {
        const auto [c, char_begin] = CharBefore(text, begin);
        if (!unicode::IsJsWhitespace(c)) break;
        begin = char_begin;
      }
      while (token.rstrip && end < text.size()) {
        const unicode::Utf8Step step = unicode::DecodeUtf8(text, end);
        if (!unicode::IsJsWhitespace(step.code_point)) break;
        end += step.length;
      }
      if (begin > start) on_text(text.substr(start, begin - start));
      on_token(token.id);
      start = i = end;
    }
    if (start < text.size()) on_text(text.substr(start));
  }
};

struct Tokenizer::PreTokenizer {
  PreTokenizerStep step;
  std::unique_ptr<Regex> regex;  // kSplit, or kByteLevel with use_regex

  using Emit = std::function<void(std::string_view)>;

  void Apply(std::string_view piece, const Emit& emit) const {
    if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
      std::string prefixed;
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        prefixed = " " + std::string(piece);
        piece = prefixed;
      }
      std::string mapped;  // reused for every output piece
      auto map = [&](std::string_view part) {
        ByteLevelEncode(part, mapped);
        emit(mapped);
      };
      if (!regex) {
        map(piece);
        return;
      }
      size_t previous = 0;
      regex->ForEachMatch(piece, [&](size_t begin, size_t end) {
        if (begin > previous) map(piece.substr(previous, begin - previous));
        map(piece.substr(begin, end - begin));
        previous = end;
      });
      if (previous < piece.size()) map(piece.substr(previous));
      return;
    }
    if (step.behavior == SplitBehavior::kIsolated) {  // the common case (invert changes nothing)
      size_t previous = 0;
      regex->ForEachMatch(piece, [&](size_t begin, size_t end) {
        if (begin > previous) emit(piece.substr(previous, begin - previous));
        emit(piece.substr(begin, end - begin));
        previous = end;
      });
      if (previous < piece.size()) emit(piece.substr(previous));
      return;
    }
    // As Hugging Face's Split: spans of matches and gaps, then the behaviour.
    struct Span {
      size_t begin, end;
      bool is_match;
    };
    std::vector<Span> spans;
    size_t previous = 0;
    regex->ForEachMatch(piece, [&](size_t begin, size_t end) {
      if (begin > previous) spans.push_back({previous, begin, false});
      spans.push_back({begin, end, true});
      previous = end;
    });
    if (previous < piece.size()) spans.push_back({previous, piece.size(), false});
    if (step.invert) {
      for (Span& span : spans) span.is_match = !span.is_match;
    }
    std::vector<Span> kept;
    bool previous_match = false;
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        kept = spans;
        break;
      case SplitBehavior::kRemoved:
        for (const Span& span : spans) {
          if (!span.is_match) kept.push_back(span);
        }
        break;
      case SplitBehavior::kContiguous:
        for (const Span& span : spans) {
          if (!kept.empty() && span.is_match == previous_match) {
            kept.back().end = span.end;
          } else {
            kept.push_back(span);
          }
          previous_match = span.is_match;
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Span& span : spans) {
          if (span.is_match && !previous_match && !kept.empty()) {
            kept.back().end = span.end;
          } else {
            kept.push_back(span);
          }
          previous_match = span.is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          if (it->is_match && !previous_match && !kept.empty()) {
            kept.back().begin = it->begin;
          } else {
            kept.push_back(*it);
          }
          previous_match = it->is_match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
    }
    for (const Span& span : kept) emit(piece.substr(span.begin, span.end - span.begin));
  }
};

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& path, int id_limit) {
  return std::make_unique<Tokenizer>(ReadTokenizerFiles(path, id_limit));
}

Tokenizer::Tokenizer(TokenizerSpec spec)
    : spec_(std::move(spec)),
      raw_added_(std::make_unique<AddedTokenMatcher>()),
      normalized_added_(std::make_unique<AddedTokenMatcher>()) {
  const std::string where = spec_.source.empty() ? "tokenizer" : spec_.source;
  // Even a model's own vocab_size is input: the bound keeps the tables sized by the highest
  // id (checked before any is allocated) within memory.
  const auto id_limit = size_t(std::clamp(spec_.id_limit, 0, kMaxTokenIds));
  if (spec_.vocab.size() > id_limit) {
    Fail(where, ": the vocabulary has ", spec_.vocab.size(), " ids, more than the ", id_limit,
         " allowed");
  }
  size_t size = spec_.vocab.size();
  for (const AddedToken& token : spec_.added_tokens) {
    if (token.id < 0 || size_t(token.id) >= id_limit) {
      Fail(where, ": added token \"", token.content, "\" has id ", token.id,
           ", outside the vocabulary of ", id_limit, " ids");
    }
    if (token.content.empty()) Fail(where, ": added token ", token.id, " has empty content");
    // Text is matched as valid UTF-8: a token holding part of a character would cut one.
    if (!unicode::IsValidUtf8(token.content)) {
      Fail(where, ": added token ", token.id, " \"", unicode::ToValidUtf8(token.content),
           "\" is not valid UTF-8");
    }
    size = std::max(size, size_t(token.id) + 1);
  }
  id_to_token_.resize(size);
  token_bytes_.resize(size);
  is_special_.assign(size, 0);

  vocab_.reserve(spec_.vocab.size());
  for (size_t id = 0; id < spec_.vocab.size(); ++id) {
    const std::string& token = spec_.vocab[id];
    if (token.empty()) continue;
    const auto [it, inserted] = vocab_.emplace(token, int(id));
    if (!inserted) {
      Fail(where, ": token \"", token, "\" appears twice in the vocabulary (ids ", it->second,
           " and ", id, ")");
    }
    id_to_token_[id] = token;
    std::string& bytes = token_bytes_[id];
    const int fallback = spec_.decode_byte_fallback ? ByteFallbackValue(token) : -1;
    if (fallback >= 0) {
      bytes.assign(1, char(fallback));
    } else if (spec_.decode_byte_level) {
      // Characters outside the byte map keep their own UTF-8, as Hugging Face's decoder does.
      for (size_t pos = 0; pos < token.size();) {
        const unicode::Utf8Step step = unicode::DecodeUtf8(token, pos);
        const int byte =
            step.status == unicode::Utf8Status::kOk ? unicode::CharToByte(step.code_point) : -1;
        if (byte < 0) {
          bytes = token;
          break;
        }
        bytes += char(byte);
        pos += step.length;
      }
    } else {
      bytes = token;
    }
  }

  low_char_ids_.assign(512, -1);
  for (char32_t c = 0; c < 512; ++c) {
    std::string utf8;
    unicode::AppendUtf8(utf8, c);
    if (auto it = vocab_.find(utf8); it != vocab_.end()) low_char_ids_[c] = it->second;
  }
  byte_fallback_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    if (auto it = vocab_.find(name); it != vocab_.end()) byte_fallback_ids_[size_t(b)] = it->second;
  }
  if (!spec_.unk_token.empty()) {
    auto it = vocab_.find(spec_.unk_token);
    if (it == vocab_.end())
      Fail(where, ": unk_token \"", spec_.unk_token, "\" is not in the vocabulary");
    unk_id_ = it->second;
  }

  merges_.reserve(spec_.merges.size());
  for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    // Named references rather than a structured binding: clang 14 (the fuzz builds) cannot
    // capture those in a lambda.
    const std::string& left = spec_.merges[rank].first;
    const std::string& right = spec_.merges[rank].second;
    auto find = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end()) {
        Fail(where, ": merge ", rank, " (\"", left, "\" \"", right, "\") needs token \"", token,
             "\", which is not in the vocabulary");
      }
      return it->second;
    };
    const int left_id = find(left), right_id = find(right), merged_id = find(left + right);
    // A repeated pair takes its last rank, as in the reference implementations.
    merges_[PairKey(left_id, right_id)] = (uint64_t(rank) << 32) | uint32_t(merged_id);
  }

  for (const AddedToken& token : spec_.added_tokens) {
    id_to_token_[size_t(token.id)] = token.content;
    token_bytes_[size_t(token.id)] = token.content;  // added tokens decode verbatim
    is_special_[size_t(token.id)] = token.special;
    added_ids_[token.content] = token.id;
    if (token.normalized && !spec_.normalizers.empty()) {
      AddedToken normalized = token;
      for (unicode::NormalForm form : spec_.normalizers) {
        normalized.content = unicode::Normalize(normalized.content, form);
      }
      normalized_added_->Add(normalized);
    } else {
      raw_added_->Add(token);
    }
  }
  for (const std::string& name : spec_.additional_special_tokens) {
    if (auto id = TokenToId(name)) is_special_[size_t(*id)] = 1;
  }

  for (const PreTokenizerStep& step : spec_.pre_tokenizers) {
    auto pre = std::make_unique<PreTokenizer>();
    pre->step = step;
    if (step.kind == PreTokenizerStep::Kind::kSplit) {
      pre->regex = std::make_unique<Regex>(
          step.pattern_is_regex ? step.pattern : EscapeLiteral(step.pattern), where);
    } else if (step.use_regex) {
      pre->regex = std::make_unique<Regex>(kGpt2Pattern, where);
    }
    pre_tokenizers_.push_back(std::move(pre));
  }

  // The lookup tables now hold the vocabulary and merges.
  spec_.vocab = {};
  spec_.merges = {};

  auto id_of = [&](const std::string& token) {
    return token.empty() ? -1 : TokenToId(token).value_or(-1);
  };
  auto first_of = [&](std::initializer_list<const char*> names, int fallback) {
    for (const char* name : names) {
      if (auto id = TokenToId(name)) return *id;
    }
    return fallback;
  };
  special_ids_.bos = id_of(spec_.bos_token);
  special_ids_.eos = id_of(spec_.eos_token);
  special_ids_.pad = spec_.pad_token.empty() ? special_ids_.eos : id_of(spec_.pad_token);
  special_ids_.unk = spec_.config_unk_token.empty() ? unk_id_ : id_of(spec_.config_unk_token);
  special_ids_.eot = first_of({"<|eot_id|>", "<|im_end|>"}, special_ids_.eos);
  special_ids_.mask = spec_.mask_token.empty() ? first_of({"<|mdm_mask|>", "<|mask|>"}, -1)
                                               : id_of(spec_.mask_token);
}

Tokenizer::~Tokenizer() = default;

std::optional<int> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

void Tokenizer::CheckId(int id) const {
  if (id < 0 || id >= vocab_size() || id_to_token_[size_t(id)].empty()) {
    Fail(spec_.source, ": token id ", id, " is not in the vocabulary (", vocab_size(), " ids)");
  }
}

const std::string& Tokenizer::IdToToken(int id) const {
  CheckId(id);
  return id_to_token_[size_t(id)];
}

bool Tokenizer::IsSpecial(int id) const {
  return id >= 0 && id < vocab_size() && is_special_[size_t(id)];
}

std::string_view Tokenizer::TokenBytes(int id) const {
  CheckId(id);
  return token_bytes_[size_t(id)];
}

std::vector<int> Tokenizer::Encode(std::string_view text) const {
  std::string repaired;
  if (!unicode::IsValidUtf8(text)) {
    repaired = unicode::ToValidUtf8(text);
    text = repaired;
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 1);
  raw_added_->Split(
      text, [&](std::string_view section) { EncodeSection(section, ids); },
      [&](int id) { ids.push_back(id); });
  return ids;
}

void Tokenizer::EncodeSection(std::string_view text, std::vector<int>& ids) const {
  std::string normalized;
  if (!spec_.normalizers.empty()) {
    normalized = text;
    for (unicode::NormalForm form : spec_.normalizers)
      normalized = unicode::Normalize(normalized, form);
    text = normalized;
  }
  if (text.empty()) return;
  normalized_added_->Split(
      text, [&](std::string_view section) { EncodeNormalized(section, ids); },
      [&](int id) { ids.push_back(id); });
}

void Tokenizer::EncodeNormalized(std::string_view text, std::vector<int>& ids) const {
  ForEachPiece(text, 0, [&](std::string_view piece) { EncodePiece(piece, ids); });
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  std::string normalized = unicode::ToValidUtf8(text);
  for (unicode::NormalForm form : spec_.normalizers)
    normalized = unicode::Normalize(normalized, form);
  std::vector<std::string> pieces;
  ForEachPiece(normalized, 0, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

// Runs pre-tokenizer `step` and the ones after it on `text`, depth first, so that no list of
// pieces is ever built.
void Tokenizer::ForEachPiece(std::string_view text, size_t step,
                             const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return;
  if (step == pre_tokenizers_.size()) {
    emit(text);
    return;
  }
  if (step + 1 == pre_tokenizers_.size()) {
    pre_tokenizers_[step]->Apply(text, [&](std::string_view piece) {
      if (!piece.empty()) emit(piece);
    });
    return;
  }
  pre_tokenizers_[step]->Apply(
      text, [&](std::string_view piece) { ForEachPiece(piece, step + 1, emit); });
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<int>& ids) const {
  if (spec_.ignore_merges) {
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  MergeWord(piece, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(piece),
                   std::vector<int>(ids.begin() + std::ptrdiff_t(first), ids.end()));
  }
}

// BPE on one pre-token: start from one symbol per character and repeatedly apply the
// lowest-ranked merge, leftmost first on ties (Hugging Face's word.rs merge_all).
void Tokenizer::MergeWord(std::string_view piece, std::vector<int>& ids) const {
  std::vector<int> symbol;  // [n] token id; -1 once merged into its left neighbour
  bool last_is_unk = false;
  for (size_t pos = 0; pos < piece.size();) {
    const unicode::Utf8Step step = unicode::DecodeUtf8(piece, pos);
    const std::string_view text = piece.substr(pos, step.length);
    pos += step.length;
    int id = step.code_point < 512 ? low_char_ids_[step.code_point] : -1;
    if (id < 0 && step.code_point >= 512) {
      if (auto it = vocab_.find(text); it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      symbol.push_back(id);
      last_is_unk = false;
      continue;
    }
    if (spec_.byte_fallback && std::all_of(text.begin(), text.end(), [&](char c) {
          return byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
        })) {
      for (char c : text) symbol.push_back(byte_fallback_ids_[static_cast<uint8_t>(c)]);
      last_is_unk = false;
      continue;
    }
    // Unknown character: the unk token (consecutive ones fused), or nothing without one.
    if (unk_id_ >= 0 && !(spec_.fuse_unk && last_is_unk)) symbol.push_back(unk_id_);
    last_is_unk = unk_id_ >= 0;
  }
  const int n = int(symbol.size());
  std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));  // [n] live list
  for (int i = 0; i < n; ++i) next[size_t(i)] = i + 1 < n ? i + 1 : -1, prev[size_t(i)] = i - 1;

  struct Candidate {
    uint32_t rank;
    int pos;
    int merged;
    bool operator>(const Candidate& o) const {
      return std::tie(rank, pos) > std::tie(o.rank, o.pos);
    }
  };
  std::vector<Candidate> heap;  // min-heap on (rank, pos)
  auto push = [&](int pos) {
    if (pos < 0 || next[size_t(pos)] < 0) return;
    auto it = merges_.find(PairKey(symbol[size_t(pos)], symbol[size_t(next[size_t(pos)])]));
    if (it == merges_.end()) return;
    heap.push_back({uint32_t(it->second >> 32), pos, int(uint32_t(it->second))});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    const auto pos = size_t(top.pos);
    if (symbol[pos] < 0 || next[pos] < 0) continue;
    const auto right = size_t(next[pos]);
    // Stale entry: one side has changed since it was queued.
    auto it = merges_.find(PairKey(symbol[pos], symbol[right]));
    if (it == merges_.end() || int(uint32_t(it->second)) != top.merged) continue;
    symbol[pos] = top.merged;
    symbol[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[size_t(next[pos])] = top.pos;
    push(prev[pos]);
    push(top.pos);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[size_t(i)]) ids.push_back(symbol[size_t(i)]);
}

std::string Tokenizer::Decode(std::span<const int> ids, const DetokenizeOptions& options) const {
  std::string bytes;
  for (int id : ids) {
    CheckId(id);
    if (options.skip_special_tokens && is_special_[size_t(id)]) continue;
    bytes += token_bytes_[size_t(id)];
  }
  std::string text = unicode::IsValidUtf8(bytes) ? std::move(bytes) : unicode::ToValidUtf8(bytes);
  if (options.clean_up_spaces.value_or(spec_.clean_up_tokenization_spaces)) {
    text = CleanUpTokenizationSpaces(std::move(text));
  }
  return text;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, const DetokenizeOptions& options)
    : tokenizer_(tokenizer),
      skip_special_(options.skip_special_tokens),
      clean_up_(options.clean_up_spaces.value_or(tokenizer.clean_up_tokenization_spaces())) {}

std::string StreamingDecoder::Push(int id) { return Push(std::span<const int>(&id, 1)); }

std::string StreamingDecoder::Push(std::span<const int> ids) {
  for (int id : ids) {
    const std::string_view bytes = tokenizer_.TokenBytes(id);  // throws for unknown ids
    if (!(skip_special_ && tokenizer_.IsSpecial(id))) pending_bytes_ += bytes;
  }
  // Decode every complete sequence; keep a valid but unfinished one for the next token.
  std::string text;
  size_t pos = 0;
  while (pos < pending_bytes_.size()) {
    const unicode::Utf8Step step = unicode::DecodeUtf8(pending_bytes_, pos);
    if (step.status == unicode::Utf8Status::kIncomplete) break;
    if (step.status == unicode::Utf8Status::kOk) {
      text.append(pending_bytes_, pos, step.length);
    } else {
      unicode::AppendUtf8(text, unicode::kReplacement);
    }
    pos += step.length;
  }
  pending_bytes_.erase(0, pos);
  if (!clean_up_) return text;
  held_text_ += text;
  size_t cut = held_text_.size();
  while (cut > 0 && InCleanUpPatterns(held_text_[cut - 1])) --cut;
  std::string ready = CleanUpTokenizationSpaces(held_text_.substr(0, cut));
  held_text_.erase(0, cut);
  return ready;
}

std::string StreamingDecoder::Finish() {
  std::string text = held_text_ + unicode::ToValidUtf8(pending_bytes_);
  held_text_.clear();
  pending_bytes_.clear();
  return clean_up_ ? CleanUpTokenizationSpaces(std::move(text)) : text;
}

}  // namespace polestar
