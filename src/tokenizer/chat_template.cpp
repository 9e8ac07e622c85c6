#include "tokenizer/chat_template.h"

#include "base/error.h"
#include "tokenizer/unicode.h"

namespace polestar {

namespace {

// Jinja's `trim`: Python's str.strip() of whitespace.
std::string_view Trim(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end) {
    const unicode::Utf8Step step = unicode::DecodeUtf8(text, begin);
    if (step.status != unicode::Utf8Status::kOk || !unicode::IsPythonWhitespace(step.code_point))
      break;
    begin += step.length;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    const unicode::Utf8Step step = unicode::DecodeUtf8(text, start);
    if (step.status != unicode::Utf8Status::kOk || !unicode::IsPythonWhitespace(step.code_point))
      break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

void RequireTokens(const Tokenizer& tokenizer, ChatTemplateKind kind,
                   std::initializer_list<const char*> tokens) {
  for (const char* token : tokens) {
    if (!tokenizer.TokenToId(token)) {
      Fail(tokenizer.source(), ": chat template ", ChatTemplateName(kind), " needs the token ",
           token, ", which this tokenizer does not have");
    }
  }
}

}  // namespace

const char* ChatTemplateName(ChatTemplateKind kind) {
  return kind == ChatTemplateKind::kLlada ? "llada" : "chatml";
}

ChatTemplateKind ChatTemplateFromName(std::string_view name) {
  if (name == "llada") return ChatTemplateKind::kLlada;
  if (name == "chatml") return ChatTemplateKind::kChatMl;
  Fail("unknown chat template \"", name, "\" (known: llada, chatml)");
}

ChatTemplateKind DetectChatTemplate(std::string_view jinja, const std::string& where) {
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplateKind::kLlada;
  if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplateKind::kChatMl;
  if (jinja.empty()) Fail(where, ": no chat_template; name one (llada or chatml)");
  Fail(where,
       ": chat_template is not a format the engine knows (LLaDA's <|start_header_id|> "
       "headers or ChatML's <|im_start|>); name one (llada or chatml)");
}

ChatTemplateKind ChatTemplateFor(const Tokenizer& tokenizer, std::string_view name) {
  if (!name.empty()) return ChatTemplateFromName(name);
  return DetectChatTemplate(tokenizer.chat_template(), tokenizer.source());
}

std::string ChatMlDefaultSystem(std::string_view jinja) {
  static constexpr std::string_view kOpen = "<|im_start|>system";
  static constexpr std::string_view kClose = "<|im_end|>";
  static constexpr std::string_view kNotLiteral = "'\"{}+";
  // The next close and the next character that ends a literal, at or after the current
  // opening; reused by later openings before them, so a hostile template with many openings
  // is read once instead of once per opening.
  size_t close = 0, not_literal = 0;
  for (size_t at = jinja.find(kOpen); at != std::string_view::npos;
       at = jinja.find(kOpen, at + 1)) {
    size_t begin = at + kOpen.size();
    if (jinja.substr(begin).starts_with("\\n")) {
      begin += 2;
    } else if (jinja.substr(begin).starts_with("\n")) {
      begin += 1;
    } else {
      continue;
    }
    if (close < begin) close = jinja.find(kClose, begin);
    if (close == std::string_view::npos) return "";  // no later opening has a close either
    if (not_literal < begin) not_literal = jinja.find_first_of(kNotLiteral, begin);
    // Only a constant inside one Jinja string literal counts, not '...' + messages[0]...
    if (close == begin || not_literal < close) continue;
    const std::string_view literal = jinja.substr(begin, close - begin);
    std::string text;
    for (size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'n') {
        text += '\n';
        ++i;
      } else {
        text += literal[i];
      }
    }
    return text;
  }
  return "";
}

std::string RenderChat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                       ChatTemplateKind kind, const ChatOptions& options) {
  if (messages.empty()) Fail("a chat needs at least one message");
  std::string text;
  if (kind == ChatTemplateKind::kLlada) {
    RequireTokens(tokenizer, kind, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
    text += tokenizer.bos_token();
    for (const ChatMessage& message : messages) {
      text += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n";
      text += Trim(message.content);
      text += "<|eot_id|>";
    }
    text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return text;
  }
  RequireTokens(tokenizer, kind, {"<|im_start|>", "<|im_end|>"});
  const std::string system = ChatMlDefaultSystem(tokenizer.chat_template());
  if (!system.empty() && messages.front().role != "system") {
    text += "<|im_start|>system\n" + system + "<|im_end|>\n";
  }
  for (const ChatMessage& message : messages) {
    text += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  }
  if (options.add_generation_prompt) text += "<|im_start|>assistant\n";
  return text;
}

std::vector<int> ApplyChatTemplate(const Tokenizer& tokenizer,
                                   const std::vector<ChatMessage>& messages, ChatTemplateKind kind,
                                   const ChatOptions& options) {
  return tokenizer.Encode(RenderChat(tokenizer, messages, kind, options));
}

}  // namespace polestar
