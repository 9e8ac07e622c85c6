// polestar tokenize -m DIR|FILE.gguf: text -> token ids (--text, --input-jsonl) and ids -> text
// (--decode).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "commands.h"
#include "decode_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace polestar::cli {

namespace {

std::string JoinIds(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

// "1,2,3" (commas and/or spaces) -> ids.
std::vector<int> ParseIds(const std::string& list) {
  std::vector<int> ids;
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t end = std::min(list.find_first_of(", ", pos), list.size());
    if (end > pos) {
      const std::string item = list.substr(pos, end - pos);
      size_t used = 0;
      long long value = -1;
      try {
        value = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || value < 0 || value > INT32_MAX) {
        Fail("--decode: \"", item, "\" is not a token id");
      }
      ids.push_back(int(value));
    }
    pos = end + 1;
  }
  return ids;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  struct Args {
    std::string model, text, input_jsonl, decode, chat_template, system;
    bool chat = false, skip_special = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-m,--model", args->model,
                  "model folder with tokenizer.json, a tokenizer.json or a .gguf file")
      ->required();
  auto* text =
      cmd->add_option("--text", args->text, "text to encode; prints the ids")->check(Utf8Text());
  auto* jsonl = cmd->add_option("--input-jsonl", args->input_jsonl,
                                "file of {\"text\": ...} lines (- for stdin); prints "
                                "{\"text\": ..., \"ids\": [...]} lines");
  auto* decode =
      cmd->add_option("--decode", args->decode, "ids to decode, e.g. 1,2,3; prints the text");
  text->excludes(jsonl)->excludes(decode);
  jsonl->excludes(decode);
  cmd->add_flag("--chat", args->chat, "encode each text as a user turn in the model's chat format");
  cmd->add_option(
      "--chat-template", args->chat_template,
      "built-in chat template instead of the model's own: llada or chatml (implies --chat)");
  cmd->add_option("--system", args->system, "system message for --chat")->check(Utf8Text());
  cmd->add_flag("--skip-special", args->skip_special, "leave special tokens out of --decode text");
  cmd->callback([args, text, jsonl, decode] {
    if (text->count() + jsonl->count() + decode->count() == 0) {
      Fail("tokenize: give --text, --input-jsonl or --decode");
    }
    // A .gguf file is a model as generate takes it; anything else the tokenizer files.
    auto tokenizer = std::filesystem::path(args->model).extension() == ".gguf"
                         ? LoadModelTokenizer(args->model)
                         : Tokenizer::Load(args->model);
    const bool chat = args->chat || !args->chat_template.empty();
    auto encode = [&](const std::string& input) {
      if (!chat) return tokenizer->Encode(input);
      std::vector<ChatMessage> messages;
      if (!args->system.empty()) messages.push_back({"system", args->system});
      messages.push_back({"user", input});
      return ApplyChatTemplate(*tokenizer, messages,
                               ChatTemplateFor(*tokenizer, args->chat_template));
    };
    if (decode->count()) {
      DetokenizeOptions options;
      options.skip_special_tokens = args->skip_special;
      const std::string out = tokenizer->Decode(ParseIds(args->decode), options);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fputc('\n', stdout);
    } else if (text->count()) {
      std::printf("%s\n", JoinIds(encode(args->text)).c_str());
    } else {
      std::ifstream file;
      if (args->input_jsonl != "-") {
        file.open(args->input_jsonl);
        if (!file) Fail(args->input_jsonl, ": cannot open");
      }
      std::istream& in = args->input_jsonl == "-" ? std::cin : file;
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json record;
        try {
          record = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          Fail(args->input_jsonl, ":", number, ": malformed JSON: ", e.what());
        }
        if (!record.is_object() || !record.contains("text") || !record["text"].is_string()) {
          Fail(args->input_jsonl, ":", number, ": expected an object with a string \"text\"");
        }
        const std::string input = record["text"].get<std::string>();
        const nlohmann::ordered_json out = {{"text", input}, {"ids", encode(input)}};
        std::printf("%s\n", out.dump().c_str());
      }
    }
  });
}

}  // namespace polestar::cli
