// libFuzzer target: the Jinja chat renderer on arbitrary templates and messages. The input is
// split at NUL bytes into the Jinja template, a flags field (first byte: bit 0 picks the
// built-in, bit 1 add_generation_prompt, bit 2 renders the template itself instead of a
// built-in) and then role/content pairs. Rendering must either throw polestar::Error or give a
// prompt whose encoding decodes back to it.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "byte_level_tokenizer.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polestar;
  std::vector<std::string> fields(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      fields.emplace_back();
    } else {
      fields.back() += char(data[i]);
    }
  }
  const uint8_t flags = fields.size() > 1 && !fields[1].empty() ? uint8_t(fields[1][0]) : 0;
  std::vector<ChatMessage> messages;
  for (size_t i = 2; i + 1 < fields.size(); i += 2) messages.push_back({fields[i], fields[i + 1]});
  try {
    TokenizerSpec spec = fuzz::ByteLevelSpec();
    spec.chat_template = fields[0];
    spec.bos_token = "<|startoftext|>";
    const Tokenizer tokenizer(std::move(spec));
    const ChatTemplate chat_template =
        flags & 4 ? ChatTemplateFor(tokenizer)
                  : ChatTemplateFor(tokenizer, flags & 1 ? "chatml" : "llada");
    ChatOptions options;
    options.add_generation_prompt = (flags & 2) != 0;
    const std::string prompt = chat_template.Render(tokenizer, messages, options);
    fuzz::CheckRoundTrip(tokenizer, prompt);
    if (ApplyChatTemplate(tokenizer, messages, chat_template, options) !=
        tokenizer.Encode(prompt)) {
      std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}
