// Chat templates: the model's own Jinja chat_template (tokenizer_config.json or
// chat_template.jinja), rendered by the Jinja interpreter (jinja.h) with the variables
// transformers' apply_chat_template passes: messages (role, content), add_generation_prompt,
// bos_token, eos_token, pad_token, unk_token and mask_token where the tokenizer has them
// (tools and documents absent). The rendered text is encoded with Tokenizer::Encode, as the
// reference encodes apply_chat_template's string with add_special_tokens=False.
//
// A tokenizer without a template (or a caller that wants another format) names a built-in,
// itself Jinja text rendered the same way:
//   llada   LLaDA-8B-Instruct's template: bos_token once, every turn
//           <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>, and the
//           assistant header always at the end (whatever add_generation_prompt says).
//   chatml  ChatML: <|im_start|>{role}\n{content}<|im_end|>\n per message, then
//           <|im_start|>assistant\n when add_generation_prompt.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace polestar {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
};

// The Jinja source of a built-in template ("llada" or "chatml"); throws Error listing them.
std::string_view BuiltinChatTemplate(std::string_view name);

class ChatTemplate {
 public:
  // Parses `source`; `where` names it in errors. `required_tokens` must be tokens of the
  // tokenizer it renders for (the built-ins' markers).
  ChatTemplate(std::string_view source, std::string where,
               std::vector<std::string> required_tokens = {});

  // The prompt text. Throws Error for an empty conversation, a tokenizer without the
  // template's marker tokens, or what the template raises (raise_exception) or does wrong.
  std::string Render(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                     const ChatOptions& options = {}) const;

 private:
  jinja::Template template_;
  std::string where_;
  std::vector<std::string> required_tokens_;
};

// The tokenizer's own template, or the built-in `name` when not empty. Throws Error when
// the tokenizer has no template (suggesting a built-in) or the template does not parse.
ChatTemplate ChatTemplateFor(const Tokenizer& tokenizer, std::string_view name = "");

std::vector<int> ApplyChatTemplate(const Tokenizer& tokenizer,
                                   const std::vector<ChatMessage>& messages,
                                   const ChatTemplate& chat_template,
                                   const ChatOptions& options = {});

}  // namespace polestar
