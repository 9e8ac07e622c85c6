// A GPT-2 style byte-level BPE tokenizer, trained on the task corpus and written as a
// standard Hugging Face tokenizer.json. Training (learning the merges) is the trainer's own;
// encoding and decoding are the engine's (tokenizer/tokenizer.h) on that tokenizer.json, so
// the ids a model is trained on are the ids inference feeds it. Text must be ASCII (what the
// task suite produces): the merges know nothing else, and other input is an Error.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polestar {

class Tokenizer;

// Special tokens in id order after the byte and merge tokens.
inline constexpr const char* kEosToken = "<|endoftext|>";  // EOS and padding
inline constexpr const char* kBosToken = "<|startoftext|>";
inline constexpr const char* kMaskToken = "<|mdm_mask|>";
inline constexpr const char* kStartHeaderToken = "<|start_header_id|>";
inline constexpr const char* kEndHeaderToken = "<|end_header_id|>";
inline constexpr const char* kEotToken = "<|eot_id|>";

class BpeTokenizer {
 public:
  // Learns `merges` merges from `corpus`. Pairs that would join a digit with anything are
  // never merged, so numbers stay one token per digit (arithmetic stays learnable).
  static BpeTokenizer Train(const std::vector<std::string>& corpus, int merges);

  // Reads the tokenizer.json that WriteFiles wrote into `dir` (byte-level BPE with the
  // special tokens above); throws Error naming the file otherwise.
  static BpeTokenizer Load(const std::string& dir);

  // Throws Error for non-ASCII text.
  std::vector<int> Encode(std::string_view text) const;
  // Concatenated text of the tokens; special tokens come out as their names.
  std::string Decode(const std::vector<int>& ids) const;

  int vocab_size() const { return int(vocab_.size()); }
  int TokenId(std::string_view token) const;  // throws Error when absent
  const std::string& token(int id) const { return vocab_[size_t(id)]; }
  int merge_count() const { return int(merges_.size()); }

  // tokenizer.json and tokenizer_config.json (LLaDA's chat template) into `dir`.
  void WriteFiles(const std::string& dir, int model_max_length) const;
  std::string TokenizerJson() const;

 private:
  std::string TokenizerConfigJson(int model_max_length) const;
  void Finish();  // builds the id lookup and the engine's tokenizer from vocab_ and merges_

  std::vector<std::string> vocab_;                           // id -> token (byte-level chars)
  std::vector<std::pair<std::string, std::string>> merges_;  // in rank order
  std::vector<std::string> specials_;
  std::map<std::string, int, std::less<>> ids_;
  // The engine's tokenizer of TokenizerJson(); immutable, so copies share it.
  std::shared_ptr<const Tokenizer> engine_;
};

}  // namespace polestar
