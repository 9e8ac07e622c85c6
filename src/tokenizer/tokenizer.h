// Byte-level BPE tokenizer compatible with Hugging Face tokenizer.json (model_specs.md §4).
//
// Encoding follows the reference pipeline (transformers.js / HF tokenizers with
// add_special_tokens=False): added tokens are split out of the raw text (leftmost-longest),
// each remaining section is normalized, pre-tokenized (Split regexes, ByteLevel) and run
// through BPE merges. Decoding concatenates token bytes and decodes UTF-8 with U+FFFD for
// ill-formed input; StreamingDecoder does the same incrementally.
//
// Build one from a model folder with Tokenizer::Load, or from vocabulary, merges and added
// tokens held in memory (a GGUF file) with Tokenizer(TokenizerSpec). A Tokenizer is
// immutable after construction; Encode and Decode may run on several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace polestar {

class Regex;

// Token ids must lie below the model's vocabulary size. Where that is unknown they must lie
// below this bound: above any real vocabulary, yet small enough that the tables kept per id
// (some 70 bytes each) fit in memory.
constexpr int kMaxTokenIds = 1 << 24;

struct AddedToken {
  std::string content;
  int id = -1;
  bool special = false;      // dropped by Decode with skip_special_tokens
  bool normalized = false;   // matched in normalized text (true) or in the raw text (false)
  bool lstrip = false;       // absorbs the whitespace on its left
  bool rstrip = false;       // absorbs the whitespace on its right
  bool single_word = false;  // matches only when not inside a word
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer of a Sequence.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit: `pattern` is a regex (Oniguruma/JavaScript syntax, see regex.h) or a literal.
  std::string pattern;
  bool pattern_is_regex = true;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;  // split with the GPT-2 pattern before mapping bytes to characters

  bool operator==(const PreTokenizerStep& other) const = default;
};

// Everything a Tokenizer is built from; filled from tokenizer.json + tokenizer_config.json
// (tokenizer_json.h) or from GGUF metadata.
struct TokenizerSpec {
  std::string source;           // where it came from, for messages
  int id_limit = kMaxTokenIds;  // every id is below this: the model's vocab_size where known
  // BPE model.
  std::vector<std::string> vocab;  // [id] -> token in its byte-level form; "" = unused id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added_tokens;
  bool ignore_merges = false;  // a pre-token found whole in the vocabulary skips the merges
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  bool fuse_unk = false;
  std::string unk_token;  // "" = none
  // Pipeline.
  std::vector<unicode::NormalForm> normalizers;  // applied in order
  std::vector<PreTokenizerStep> pre_tokenizers;  // applied in order
  bool decode_byte_level = true;                 // ByteLevel decoder
  bool decode_byte_fallback = false;             // ByteFallback decoder
  // tokenizer_config.json.
  bool clean_up_tokenization_spaces = false;
  std::string bos_token, eos_token, pad_token, mask_token, config_unk_token;
  std::vector<std::string> additional_special_tokens;
  std::string chat_template;  // Jinja source, rendered by chat_template.h
};

// Special token ids found in the tokenizer files; -1 when absent.
struct SpecialIds {
  int bos = -1;
  int eos = -1;
  int pad = -1;   // pad_token, else eos (as the reference does)
  int eot = -1;   // end of turn: <|eot_id|> (LLaDA) or <|im_end|> (ChatML), else eos
  int mask = -1;  // mask_token, else <|mdm_mask|> or <|mask|>
  int unk = -1;
};

struct DetokenizeOptions {
  bool skip_special_tokens = false;
  // Undo spaces before punctuation (" ." -> ".", " n't" -> "n't", ...); unset = the value of
  // clean_up_tokenization_spaces in tokenizer_config.json.
  std::optional<bool> clean_up_spaces;
};

class Tokenizer {
 public:
  // `path` is a model folder holding tokenizer.json (and usually tokenizer_config.json), or
  // a tokenizer.json file. Throws Error naming the file and any unsupported component, and
  // for ids not below `id_limit` (the model's vocabulary size where known).
  static std::unique_ptr<Tokenizer> Load(const std::string& path, int id_limit = kMaxTokenIds);
  // Throws Error when merges or added tokens are inconsistent with the vocabulary, or an id
  // is not below spec.id_limit.
  explicit Tokenizer(TokenizerSpec spec);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, without BOS/EOS (add_special_tokens=False). Special-token text such
  // as "<|im_end|>" becomes its single id. Ill-formed UTF-8 is read as U+FFFD.
  std::vector<int> Encode(std::string_view text) const;
  // Throws Error for an id without a token.
  std::string Decode(std::span<const int> ids, const DetokenizeOptions& options = {}) const;

  // The pre-tokens BPE sees for `text`: normalized, split and mapped to byte-level
  // characters; added tokens are not split out here. For inspection and tests.
  std::vector<std::string> PreTokenize(std::string_view text) const;

  int vocab_size() const { return int(id_to_token_.size()); }  // highest id + 1
  std::optional<int> TokenToId(std::string_view token) const;  // model vocabulary or added
  const std::string& IdToToken(int id) const;                  // throws Error for an unknown id
  bool IsSpecial(int id) const;                                // dropped by skip_special_tokens
  const SpecialIds& special_ids() const { return special_ids_; }
  const std::string& chat_template() const { return spec_.chat_template; }
  const TokenizerSpec& spec() const { return spec_; }  // special token texts for templates
  const std::string& bos_token() const { return spec_.bos_token; }
  bool clean_up_tokenization_spaces() const { return spec_.clean_up_tokenization_spaces; }
  const std::string& source() const { return spec_.source; }

  // The bytes token `id` adds to decoded text (before UTF-8 decoding). Throws for unknown ids.
  std::string_view TokenBytes(int id) const;

 private:
  struct AddedTokenMatcher;
  struct PreTokenizer;

  void EncodeSection(std::string_view text, std::vector<int>& ids) const;
  void EncodeNormalized(std::string_view text, std::vector<int>& ids) const;
  void ForEachPiece(std::string_view text, size_t step,
                    const std::function<void(std::string_view)>& emit) const;
  void EncodePiece(std::string_view piece, std::vector<int>& ids) const;
  void MergeWord(std::string_view piece, std::vector<int>& ids) const;
  void CheckId(int id) const;

  TokenizerSpec spec_;
  std::vector<std::string> id_to_token_;  // [vocab_size]
  std::vector<std::string> token_bytes_;  // [vocab_size] what Decode emits per id
  std::vector<uint8_t> is_special_;       // [vocab_size]
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;
  StringMap vocab_;                     // model vocabulary
  StringMap added_ids_;                 // added token content -> id
  std::vector<int> low_char_ids_;       // [512] id of the one-character token U+0000..U+01FF
  std::vector<int> byte_fallback_ids_;  // [256] id of <0xXX>, -1 if missing
  int unk_id_ = -1;
  std::unordered_map<uint64_t, uint64_t> merges_;  // (left << 32 | right) -> (rank << 32 | merged)
  std::unique_ptr<AddedTokenMatcher> raw_added_, normalized_added_;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers_;
  SpecialIds special_ids_;

  // Pre-token -> ids, as in the reference implementations; bounded, cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>> cache_;
};

// Decodes ids one at a time for display while generating. Push returns the text that is now
// final: an incomplete UTF-8 sequence at the end is held back until its next bytes arrive,
// ill-formed bytes become U+FFFD, and with clean-up on, text that a later token could
// still change is held back too. The concatenation of all Push results and Finish equals
// Tokenizer::Decode of the same ids.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, const DetokenizeOptions& options = {});
  std::string Push(int id);
  std::string Push(std::span<const int> ids);
  std::string Finish();  // flushes what is held back; the decoder can then be reused

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_, clean_up_;
  std::string pending_bytes_;  // an incomplete UTF-8 sequence
  std::string held_text_;      // decoded text that clean-up may still change
};

// The clean_up_tokenization_spaces rewrite of the reference, in its order.
std::string CleanUpTokenizationSpaces(std::string text);

}  // namespace polestar
