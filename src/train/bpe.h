// A GPT-2 style byte-level BPE tokenizer, trained on the task corpus and written as a
// standard Hugging Face tokenizer.json. This is the trainer's own encoder for building
// training data; it handles ASCII text (what the task suite produces) and throws Error on
// other input rather than guess at Unicode classes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polestar {

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
  void Finish();  // builds the lookup tables from vocab_ and merges_
  // Splits ASCII text like the GPT-2 pre-tokenizer regex.
  static std::vector<std::string_view> PreTokenize(std::string_view text);
  void EncodePiece(std::string_view piece, std::vector<int>& ids) const;

  std::vector<std::string> vocab_;                           // id -> token (byte-level chars)
  std::vector<std::pair<std::string, std::string>> merges_;  // in rank order
  std::vector<std::string> specials_;
  std::map<std::string, int, std::less<>> ids_;
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
};

// GPT-2's reversible byte -> printable character map, as UTF-8.
const std::string& ByteChar(unsigned char byte);

}  // namespace polestar
