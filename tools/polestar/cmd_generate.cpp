// polestar generate: decode a prompt with any policy; text, JSON, or a live canvas.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "commands.h"
#include "decode/generate.h"
#include "decode_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"

namespace polestar::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, prompt_ids, chat_template, system;
  DecodeOptions options;
  bool raw = false, json = false, trace = false, visual = false;
  bool stop_at_eos = true;
  int threads = 0;
};

// The canvas as text: committed tokens decoded one by one, masks as a shaded block.
std::string RenderCanvas(const Tokenizer* tokenizer, std::span<const int> generated, int mask_id,
                         std::span<const int> fresh) {
  std::string text;
  for (size_t i = 0; i < generated.size(); ++i) {
    const int id = generated[i];
    if (id == mask_id) {
      text += "\u2592";
      continue;
    }
    std::string piece = tokenizer != nullptr ? tokenizer->Decode(std::span<const int>(&id, 1))
                                             : std::to_string(id) + " ";
    const bool is_new = std::find(fresh.begin(), fresh.end(), int(i)) != fresh.end();
    text += is_new ? "\x1b[1;32m" + piece + "\x1b[0m" : piece;
  }
  return text;
}

// Generated ids up to (not including) the first end token, when stopping at EOS.
std::vector<int> VisibleIds(const ModelConfig& config, const std::vector<int>& generated,
                            bool stop) {
  std::vector<int> ids;
  for (int id : generated) {
    if (stop && IsEndToken(config, id)) break;
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, const DecodeOptions& defaults) {
  auto* cmd = app.add_subcommand("generate", "Generate text with a diffusion LM");
  auto args = std::make_shared<GenerateArgs>();
  cmd->add_option("-m,--model", args->model,
                  "model folder or .gguf file (default: the bundled polestar-tiny)");
  auto* prompt = cmd->add_option("-p,--prompt", args->prompt,
                                 "prompt text (chat template applied unless --raw)")
                     ->check(Utf8Text());
  auto* ids = cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as token ids: 1,2,3");
  prompt->excludes(ids);
  cmd->add_flag("--raw", args->raw, "tokenize the prompt as is, without the chat template");
  cmd->add_option("--chat-template", args->chat_template,
                  "llada | chatml (default: from the model)");
  cmd->add_option("--system", args->system, "system message")->check(Utf8Text());
  cmd->add_option("--stop-at-eos", args->stop_at_eos, "cut the text at the first EOS / end of turn")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--trace", args->trace, "with --json: every step's commits and policy statistics");
  cmd->add_flag("--visual,--diffusion-visual", args->visual, "show the canvas as it fills");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024));
  args->options = defaults;
  AddDecodeFlags(cmd, args->options);
  cmd->callback([args, prompt, ids] {
    SetThreadCount(args->threads);
    if (prompt->count() == 0 && ids->count() == 0)
      Fail("give a prompt with -p TEXT or --prompt-ids 1,2,3");
    const std::string model_path = args->model.empty() ? DefaultModelPath() : args->model;
    auto model = Model::Load(model_path);
    const ModelConfig& config = model->config();
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<int> prompt_ids;
    if (prompt->count() > 0) {
      tokenizer = LoadModelTokenizer(model_path);
      if (args->raw) {
        prompt_ids = tokenizer->Encode(args->prompt);
      } else {
        std::vector<ChatMessage> messages;
        if (!args->system.empty()) messages.push_back({"system", args->system});
        messages.push_back({"user", args->prompt});
        prompt_ids = ApplyChatTemplate(*tokenizer, messages,
                                       ChatTemplateFor(*tokenizer, args->chat_template));
      }
    } else {
      prompt_ids = ParseIdList(args->prompt_ids, "--prompt-ids");
      if (std::filesystem::is_directory(model_path) &&
          std::filesystem::exists(std::filesystem::path(model_path) / "tokenizer.json")) {
        tokenizer = LoadModelTokenizer(model_path);
      }
    }
    const bool tty = isatty(STDERR_FILENO) != 0;
    StepCallback on_step;
    if (args->visual) {
      on_step = [&](const StepEvent& e) {
        std::span<const int> generated = e.canvas.subspan(prompt_ids.size());
        std::vector<int> fresh;
        for (int p : e.committed) fresh.push_back(p - int(prompt_ids.size()));
        if (tty) {
          std::fprintf(stderr, "\x1b[2J\x1b[H%s\n\n\x1b[2mstep %d  masks left %d  %.1f s\x1b[0m\n",
                       RenderCanvas(tokenizer.get(), generated, config.mask_id, fresh).c_str(),
                       e.nfe, e.masks_left, e.seconds);
        } else {
          std::fprintf(stderr, "step %d: committed %zu, masks left %d\n", e.nfe, e.committed.size(),
                       e.masks_left);
        }
        return true;
      };
    }
    const GenerationResult r = Generate(*model, prompt_ids, args->options, on_step, args->trace);
    const std::vector<int> visible = VisibleIds(config, r.generated, args->stop_at_eos);
    std::string text;
    if (tokenizer != nullptr)
      text = tokenizer->Decode(visible,
                               {.skip_special_tokens = true, .clean_up_spaces = std::nullopt});
    if (args->json) {
      nlohmann::json out = {{"tokens", r.tokens},
                            {"generated", r.generated},
                            {"nfe", r.nfe},
                            {"tpf",
                             {{"until_eos", r.TpfUntilEos()},
                              {"non_eos", r.TpfNonEos()},
                              {"all_positions", r.TpfAllPositions()}}},
                            {"tps", {{"until_eos", r.TpsUntilEos()}, {"non_eos", r.TpsNonEos()}}},
                            {"rows_computed", r.rows_computed},
                            {"seconds", r.seconds}};
      if (tokenizer != nullptr) out["text"] = text;
      if (args->trace) out["trace"] = r.trace;
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    if (tokenizer != nullptr) {
      std::printf("%s\n", text.c_str());
    } else {
      std::string list;
      for (int t : visible) list += (list.empty() ? "" : ",") + std::to_string(t);
      std::printf("%s\n", list.c_str());
    }
    std::fprintf(stderr, "[%s: nfe %d, %.2f tokens/forward, %.1f tokens/s, %.2f s]\n",
                 args->options.policy.c_str(), r.nfe, r.TpfUntilEos(), r.TpsUntilEos(), r.seconds);
  });
}

}  // namespace polestar::cli
