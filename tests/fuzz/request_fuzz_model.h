// What the server's request fuzzers parse against: a codec that reads bytes as token ids (so
// every prompt encodes; chat turns are concatenated), a model of 512 positions over those
// ids, and the server's limits and defaults at a small scale.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "server/api.h"

namespace polestar::fuzz {

class ByteCodec : public TextCodec {
 public:
  std::vector<int> EncodeText(const std::string& text) const override {
    if (text.empty()) Fail("empty prompt");
    return std::vector<int>(text.begin(), text.end());
  }
  std::vector<int> EncodeChat(const std::vector<ChatTurn>& turns) const override {
    std::string all;
    for (const ChatTurn& turn : turns) all += turn.role + turn.content;
    return EncodeText(all);
  }
  std::unique_ptr<TextStream> NewTextStream() const override { return nullptr; }
  std::string TokenLabel(int) const override { return ""; }
};

inline ModelConfig FuzzModel() {
  ModelConfig config;
  config.vocab = 256 + 8;
  config.max_positions = 512;
  config.mask_id = 256;
  config.eos_id = 257;
  return config;
}

inline RequestLimits FuzzLimits() {
  RequestLimits limits;
  limits.max_prompt_tokens = 256;
  limits.max_tokens = 256;
  return limits;
}

// The server's decoding defaults: 32 positions in blocks of 8, a step per position.
inline DecodeOptions FuzzDefaults() {
  DecodeOptions defaults;
  defaults.gen_length = 32;
  defaults.block_length = 8;
  defaults.steps = 32;
  return defaults;
}

}  // namespace polestar::fuzz
