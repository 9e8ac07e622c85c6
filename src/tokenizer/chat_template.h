// Chat formats of the supported models, implemented natively (no Jinja interpreter):
//
//   llada   LLaDA-8B-Instruct (model_specs.md §1.5): bos_token once, then per message
//           <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>, and
//           always <|start_header_id|>assistant<|end_header_id|>\n\n at the end.
//   chatml  Dream / Qwen2: <|im_start|>{role}\n{content}<|im_end|>\n per message, then
//           <|im_start|>assistant\n when add_generation_prompt. When the model's template
//           carries a default system prompt (Qwen2-style "You are a helpful assistant."),
//           it opens a conversation that has no system message.
//
// The model's format is recognised from tokenizer_config.json's chat_template; a name can
// override it. The rendered text is encoded with Tokenizer::Encode, as the reference
// encodes apply_chat_template's string with add_special_tokens=False.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace polestar {

enum class ChatTemplateKind { kLlada, kChatMl };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;  // ChatML only; LLaDA's template always adds it
};

const char* ChatTemplateName(ChatTemplateKind kind);
// "llada" or "chatml"; throws Error listing the known names.
ChatTemplateKind ChatTemplateFromName(std::string_view name);
// The format of a Jinja chat template: LLaDA's by <|start_header_id|>, ChatML by
// <|im_start|>. Throws Error (suggesting a name) for a template the engine does not know.
ChatTemplateKind DetectChatTemplate(std::string_view jinja, const std::string& where);
// The tokenizer's own template, or `name` when not empty.
ChatTemplateKind ChatTemplateFor(const Tokenizer& tokenizer, std::string_view name = "");

// The default system prompt in a ChatML Jinja template ("" when it has none).
std::string ChatMlDefaultSystem(std::string_view jinja);

// The prompt text. Throws Error when the tokenizer lacks the format's marker tokens (for
// example llada with a ChatML tokenizer) or the conversation is empty.
std::string RenderChat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                       ChatTemplateKind kind, const ChatOptions& options = {});
std::vector<int> ApplyChatTemplate(const Tokenizer& tokenizer,
                                   const std::vector<ChatMessage>& messages, ChatTemplateKind kind,
                                   const ChatOptions& options = {});

}  // namespace polestar
