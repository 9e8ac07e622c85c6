// A small tokenizer for the fuzz targets: the 256 byte-level characters, no merges, and the
// marker tokens of both chat formats, so that Decode(Encode(text)) gives text back (with
// ill-formed UTF-8 as U+FFFD).
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace polestar::fuzz {

inline TokenizerSpec ByteLevelSpec() {
  TokenizerSpec spec;
  spec.source = "fuzz/tokenizer.json";
  for (int b = 0; b < 256; ++b) {
    std::string token;
    unicode::AppendUtf8(token, unicode::ByteToChar(uint8_t(b)));
    spec.vocab.push_back(token);
  }
  int id = 256;
  for (const char* marker :
       {"<|startoftext|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>",
        "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|mdm_mask|>"}) {
    AddedToken token;
    token.content = marker;
    token.id = id++;
    token.special = true;
    spec.added_tokens.push_back(token);
  }
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  spec.pre_tokenizers = {byte_level};
  return spec;
}

// Aborts unless `ids` decode to `text` (ill-formed UTF-8 read as U+FFFD) without clean-up.
inline void CheckRoundTrip(const Tokenizer& tokenizer, std::string_view text) {
  const std::vector<int> ids = tokenizer.Encode(text);
  DetokenizeOptions verbatim;
  verbatim.clean_up_spaces = false;
  if (tokenizer.Decode(ids, verbatim) != unicode::ToValidUtf8(text)) std::abort();
}

}  // namespace polestar::fuzz
