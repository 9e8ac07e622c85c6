// How the server turns text into token ids and generated ids back into text. The server
// knows nothing about tokenizers: it talks to this interface, so a real tokenizer plugs in
// with a small adapter (see LoadTextCodec in codecs.h), and the HTTP behaviour is testable
// with the trivial codecs of the fixture models.
//
// A codec is shared by every request: its const methods must be safe to call from several
// threads at once. A TextStream belongs to one request.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace polestar {

struct ChatTurn {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Decodes one generation's ids left to right. Push returns the text that became final with
// this token (possibly empty); text once returned is never revised. Finish returns whatever
// was held back. The concatenation of everything returned is the decoded text.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string Push(int token) = 0;
  virtual std::string Finish() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // The prompt of /v1/completions, with whatever start token the model expects.
  // Throws Error for text the codec cannot encode.
  virtual std::vector<int> EncodeText(const std::string& text) const = 0;
  // The prompt of /v1/chat/completions: the conversation in the model's chat format,
  // ending where the assistant's reply begins. Throws Error for an unusable conversation.
  virtual std::vector<int> EncodeChat(const std::vector<ChatTurn>& turns) const = 0;
  // Decoding of generated ids; special tokens (padding, end of text) produce no text.
  virtual std::unique_ptr<TextStream> NewTextStream() const = 0;
  // One token as a short readable label for the live canvas (valid UTF-8, may be empty).
  virtual std::string TokenLabel(int token) const = 0;
};

}  // namespace polestar
