#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace polestar {

namespace {

struct Builtin {
  std::string_view name;
  std::string_view source;
  std::vector<std::string> required_tokens;
};

const std::vector<Builtin>& Builtins() {
  static const std::vector<Builtin> builtins = {
      // GSAI-ML/LLaDA-8B-Instruct's tokenizer_config.json, verbatim.
      {"llada",
       "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
       "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
       "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
       "{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' "
       "}}",
       {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}},
      {"chatml",
       "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
       "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
       "{{ '<|im_start|>assistant\n' }}{% endif %}",
       {"<|im_start|>", "<|im_end|>"}},
  };
  return builtins;
}

const Builtin& FindBuiltin(std::string_view name) {
  for (const Builtin& builtin : Builtins()) {
    if (builtin.name == name) return builtin;
  }
  Fail("unknown chat template \"", name, "\" (known: llada, chatml)");
}

}  // namespace

std::string_view BuiltinChatTemplate(std::string_view name) { return FindBuiltin(name).source; }

ChatTemplate::ChatTemplate(std::string_view source, std::string where,
                           std::vector<std::string> required_tokens)
    : template_(source, where),
      where_(std::move(where)),
      required_tokens_(std::move(required_tokens)) {}

std::string ChatTemplate::Render(const Tokenizer& tokenizer,
                                 const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options) const {
  if (messages.empty()) Fail("a chat needs at least one message");
  for (const std::string& token : required_tokens_) {
    if (!tokenizer.TokenToId(token)) {
      Fail(tokenizer.source(), ": ", where_, " needs the token ", token,
           ", which this tokenizer does not have");
    }
  }
  nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::array()},
                                    {"add_generation_prompt", options.add_generation_prompt}};
  for (const ChatMessage& message : messages) {
    context["messages"].push_back({{"role", message.role}, {"content", message.content}});
  }
  // The special tokens transformers passes; an absent one stays undefined.
  const TokenizerSpec& spec = tokenizer.spec();
  const std::pair<const char*, const std::string*> specials[] = {
      {"bos_token", &spec.bos_token},   {"eos_token", &spec.eos_token},
      {"pad_token", &spec.pad_token},   {"unk_token", &spec.config_unk_token},
      {"mask_token", &spec.mask_token},
  };
  for (const auto& [name, token] : specials) {
    if (!token->empty()) context[name] = *token;
  }
  if (!spec.additional_special_tokens.empty()) {
    context["additional_special_tokens"] = spec.additional_special_tokens;
  }
  return template_.Render(context);
}

ChatTemplate ChatTemplateFor(const Tokenizer& tokenizer, std::string_view name) {
  if (!name.empty()) {
    const Builtin& builtin = FindBuiltin(name);
    return ChatTemplate(builtin.source, Cat("chat template ", builtin.name),
                        builtin.required_tokens);
  }
  if (tokenizer.chat_template().empty()) {
    Fail(tokenizer.source(), ": no chat_template; name one (llada or chatml)");
  }
  return ChatTemplate(tokenizer.chat_template(), tokenizer.source() + " chat_template");
}

std::vector<int> ApplyChatTemplate(const Tokenizer& tokenizer,
                                   const std::vector<ChatMessage>& messages,
                                   const ChatTemplate& chat_template, const ChatOptions& options) {
  return tokenizer.Encode(chat_template.Render(tokenizer, messages, options));
}

}  // namespace polestar
