// polestar generate: decode a prompt with any policy; text, JSON, or a live canvas; or a file
// of prompts, batched, JSONL in and out.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend_flags.h"
#include "base/error.h"
#include "base/json_nesting.h"
#include "base/parallel.h"
#include "bench/runner.h"
#include "canvas_view.h"
#include "commands.h"
#include "decode/generate.h"
#include "decode/policy_registry.h"
#include "decode_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/unicode.h"

namespace polestar::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, prompt_ids, prompts_file, chat_template, system;
  std::string compare;  // a second policy decoding the same prompt
  std::string backend;  // --backend
  int batch = 1;
  DecodeOptions options;
  bool raw = false, json = false, trace = false, visual = false;
  bool stop_at_eos = true;
  int threads = 0;
};

// The canvas as chips: committed tokens decoded one by one (ids without a tokenizer), masks,
// end tokens; `fresh` (canvas positions) are this step's commits.
std::vector<CanvasCell> CanvasCells(const Tokenizer* tokenizer, const ModelConfig& config,
                                    std::span<const int> generated, std::span<const int> fresh) {
  std::vector<CanvasCell> cells;
  for (size_t i = 0; i < generated.size(); ++i) {
    const int id = generated[i];
    if (id == config.mask_id) {
      cells.push_back({CanvasCell::Kind::kMask, ""});
    } else if (IsEndToken(config, id)) {
      cells.push_back({CanvasCell::Kind::kEnd, ""});
    } else {
      const bool is_new = std::find(fresh.begin(), fresh.end(), int(i)) != fresh.end();
      cells.push_back({is_new ? CanvasCell::Kind::kFresh : CanvasCell::Kind::kToken,
                       tokenizer != nullptr ? tokenizer->Decode(std::span<const int>(&id, 1))
                                            : std::to_string(id) + " "});
    }
  }
  return cells;
}

// Tokens per forward under both counting protocols, each named.
std::string TpfText(const GenerationResult& r) {
  char text[96];
  std::snprintf(text, sizeof(text), "TPF %.2f until EOS, %.2f non-EOS", r.TpfUntilEos(),
                r.TpfNonEos());
  return text;
}

// The line each finished generation ends with on stderr.
std::string StatsLine(const std::string& policy, const GenerationResult& r) {
  char text[128];
  std::snprintf(text, sizeof(text), "nfe %d, %.1f tokens/s until EOS, %.2f s", r.nfe,
                r.TpsUntilEos(), r.seconds);
  return "[" + policy + ": " + TpfText(r) + ", " + text + "]";
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

// The text of the visible ids ("" without a tokenizer).
std::string VisibleText(const Tokenizer* tokenizer, const std::vector<int>& visible) {
  if (tokenizer == nullptr) return "";
  return tokenizer->Decode(visible, {.skip_special_tokens = true, .clean_up_spaces = std::nullopt});
}

// The prompt file's name in messages.
std::string PromptsName(const GenerateArgs& args) {
  return args.prompts_file == "-" ? "stdin" : args.prompts_file;
}

// The prompt ids of -p TEXT or of a "prompt" line: the chat template unless --raw.
std::vector<int> EncodeTextPrompt(const Tokenizer& tokenizer, const GenerateArgs& args,
                                  const std::string& text) {
  if (args.raw) return tokenizer.Encode(text);
  std::vector<ChatMessage> messages;
  if (!args.system.empty()) messages.push_back({"system", args.system});
  messages.push_back({"user", text});
  return ApplyChatTemplate(tokenizer, messages, ChatTemplateFor(tokenizer, args.chat_template));
}

// The JSON of one generation on `model`'s backend, as --json prints it; "text" when there is
// a tokenizer.
nlohmann::ordered_json ResultJson(const GenerationResult& r, const Model& model,
                                  const Tokenizer* tokenizer, const std::string& text, bool trace) {
  nlohmann::ordered_json out = {
      {"tokens", r.tokens},
      {"generated", r.generated},
      {"nfe", r.nfe},
      {"tpf",
       {{"until_eos", r.TpfUntilEos()},
        {"non_eos", r.TpfNonEos()},
        {"all_positions", r.TpfAllPositions()}}},
      {"tps", {{"until_eos", r.TpsUntilEos()}, {"non_eos", r.TpsNonEos()}}},
      {"tokens_generated", r.tokens_until_eos},
      {"rows_computed", r.rows_computed},
      {"seconds", r.seconds},
      {"backend", model.backend().name()},
      {"transfers", bench::TransfersJson(r.step_kinds, r.step_transfers)}};
  if (tokenizer != nullptr) out["text"] = text;
  if (trace) out["trace"] = r.trace;
  return out;
}

// One line of a --prompts file.
struct PromptLine {
  int line = 0;  // in the file, from 1
  nlohmann::json id;
  std::vector<int> prompt;
};

// Deepest nesting of arrays and objects a --prompts line may have.
constexpr int kMaxPromptLineDepth = 64;

// Reads a JSONL file of prompts ("-": stdin): an object a line with "prompt" (text, as -p),
// "messages" (a chat: [{"role", "content"}, ...], the template applied) or "prompt_ids"
// (each in [0, vocab)), and optionally "id". Blank lines are skipped. Throws Error naming the
// line of a bad one.
std::vector<PromptLine> ReadPrompts(const GenerateArgs& args, const Tokenizer* tokenizer,
                                    int vocab) {
  std::ifstream file;
  if (args.prompts_file != "-") {
    file.open(args.prompts_file, std::ios::binary);
    if (!file) Fail("cannot open --prompts ", args.prompts_file);
  }
  std::istream& in = args.prompts_file == "-" ? std::cin : file;
  const std::string name = PromptsName(args);
  std::vector<PromptLine> prompts;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = Cat(name, ":", number);
    if (!unicode::IsValidUtf8(text)) Fail(where, ": the line is not valid UTF-8");
    if (JsonNestingDepth(text, kMaxPromptLineDepth) > kMaxPromptLineDepth) {
      Fail(where, ": nests arrays and objects deeper than ", kMaxPromptLineDepth, " levels");
    }
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) Fail(where, ": invalid JSON");
    if (!j.is_object()) Fail(where, ": expected a JSON object");
    PromptLine p{number, j.value("id", nlohmann::json()), {}};
    const int given =
        int(j.contains("prompt")) + int(j.contains("messages")) + int(j.contains("prompt_ids"));
    if (given != 1) Fail(where, ": needs exactly one of \"prompt\", \"messages\", \"prompt_ids\"");
    if (j.contains("prompt_ids")) {
      if (!j["prompt_ids"].is_array()) Fail(where, ": \"prompt_ids\" must be a list of ids");
      for (const nlohmann::json& id : j["prompt_ids"]) {
        if (!id.is_number_integer()) Fail(where, ": \"prompt_ids\" must be a list of ids");
        // Checked before narrowing: 4294967297 must not become id 1.
        if (!id.is_number_unsigned() || id.get<uint64_t>() >= uint64_t(vocab)) {
          Fail(where, ": prompt id ", id.dump(), " lies outside the vocabulary [0, ", vocab, ")");
        }
        p.prompt.push_back(id.get<int>());
      }
      prompts.push_back(std::move(p));
      continue;
    }
    if (tokenizer == nullptr) Fail(where, ": text prompts need a model with a tokenizer");
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) Fail(where, ": \"prompt\" must be a string");
      p.prompt = EncodeTextPrompt(*tokenizer, args, j["prompt"].get<std::string>());
    } else {
      if (!j["messages"].is_array() || j["messages"].empty())
        Fail(where, ": \"messages\" must be a non-empty list of {\"role\", \"content\"}");
      std::vector<ChatMessage> messages;
      for (const nlohmann::json& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
            !m.contains("content") || !m["content"].is_string()) {
          Fail(where, ": each message needs string \"role\" and \"content\"");
        }
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
      try {
        p.prompt = ApplyChatTemplate(*tokenizer, messages,
                                     ChatTemplateFor(*tokenizer, args.chat_template));
      } catch (const Error& e) {
        Fail(where, ": ", e.what());
      }
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) Fail("--prompts ", name, " has no prompts");
  return prompts;
}

// --prompts: every line decoded through GenerateBatch, one JSON line out per prompt in order.
void GeneratePromptFile(const GenerateArgs& args, const Model& model, const Tokenizer* tokenizer) {
  const std::vector<PromptLine> prompts = ReadPrompts(args, tokenizer, model.config().vocab);
  std::vector<GenerationRequest> requests;
  for (const PromptLine& p : prompts) requests.push_back({p.prompt, args.options});
  const auto started = std::chrono::steady_clock::now();
  std::vector<GenerationResult> results;
  try {
    results = GenerateBatch(model, requests, args.batch, args.trace);
  } catch (const Error&) {
    // GenerateBatch checks every request before any work; find the line it refused (a
    // Sequence checks its prompt and options as it is built).
    for (const PromptLine& p : prompts) {
      try {
        Sequence check(model, p.prompt, args.options);
      } catch (const Error& line_error) {
        Fail(PromptsName(args), ":", p.line, ": ", line_error.what());
      }
    }
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  int64_t tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult& r = results[i];
    const std::string text =
        VisibleText(tokenizer, VisibleIds(model.config(), r.generated, args.stop_at_eos));
    nlohmann::ordered_json out = {{"index", i}};
    if (!prompts[i].id.is_null()) out["id"] = prompts[i].id;
    const nlohmann::ordered_json result = ResultJson(r, model, tokenizer, text, args.trace);
    for (const auto& [key, value] : result.items()) out[key] = value;
    std::printf("%s\n", out.dump().c_str());
    tokens += r.tokens_until_eos;
  }
  std::fprintf(stderr,
               "[%s: %zu prompts, batch %d: %.2f s, %.2f prompts/s, %.1f tokens/s until EOS]\n",
               args.options.policy.c_str(), prompts.size(), args.batch, seconds,
               double(prompts.size()) / seconds, double(tokens) / seconds);
}

// One policy's decoding in a --visual run: its sequence and its canvas after its latest step.
struct Lane {
  std::string policy;
  std::unique_ptr<Sequence> sequence;
  std::vector<int> generated, fresh;  // [gen_length]; this step's commits, canvas positions
  std::string progress;               // "step 3, 12 masks left"
  double seconds = 0;                 // in its own steps; drawing and pacing left out
};

// Columns of the terminal on stderr (80 when it does not say).
int TerminalColumns() {
  winsize size{};
  return ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 80;
}

// Draws the lanes side by side over the previous frame (`*drawn_lines` high), leaving
// what the terminal showed before the first frame in place.
void DrawFrame(std::span<const Lane> lanes, std::span<const GenerationResult> results,
               const Tokenizer* tokenizer, const ModelConfig& config, int* drawn_lines) {
  std::vector<CanvasPanel> panels;
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = lanes[i];
    CanvasPanel panel{
        lane.policy, CanvasCells(tokenizer, config, lane.generated, lane.fresh), {lane.progress}};
    if (i < results.size()) {
      char done[64];
      std::snprintf(done, sizeof(done), "done: nfe %d, %.2f s", results[i].nfe, lane.seconds);
      panel.status = {done, TpfText(results[i])};
    }
    panels.push_back(std::move(panel));
  }
  const int gaps = 3 * int(lanes.size() - 1);  // " | " between columns
  // One column spare: a line filling the terminal would wrap early on some terminals.
  const int width = (TerminalColumns() - 1 - gaps) / int(lanes.size());
  std::string frame;
  if (*drawn_lines > 0) frame = Cat("\r\x1b[", *drawn_lines, "A\x1b[J");
  const std::vector<std::string> lines = LayOutPanels(panels, width, /*colour=*/true);
  for (const std::string& line : lines) frame += line + "\n";
  frame += Cat("\x1b[2m", kMaskGlyph, " mask  ", kEndGlyph,
               " end of text  \x1b[0;1;32mgreen\x1b[0;2m: committed this step\x1b[0m\n");
  *drawn_lines = int(lines.size()) + 1;
  std::fputs(frame.c_str(), stderr);
  std::fflush(stderr);
}

// --visual: the policies take their steps in turn, one forward each, and after each round a
// terminal on stderr shows their canvases side by side as they fill in (elsewhere a line per
// step). Frames come at most every 150 ms, so that a small model's steps can be followed; the
// results' seconds count each policy's own steps only.
std::vector<GenerationResult> DecodeVisually(const GenerateArgs& args, const Model& model,
                                             const Tokenizer* tokenizer,
                                             std::span<const int> prompt,
                                             std::span<const std::string> policies) {
  const ModelConfig& config = model.config();
  const bool tty = isatty(STDERR_FILENO) != 0;
  const int prompt_length = int(prompt.size());
  std::vector<Lane> lanes(policies.size());
  for (size_t i = 0; i < policies.size(); ++i) {
    Lane& lane = lanes[i];
    lane.policy = policies[i];
    DecodeOptions options = args.options;
    options.policy = lane.policy;
    lane.progress = "step 0";
    auto on_step = [&lane, tty, prompt_length](const StepEvent& e) {
      lane.generated.assign(e.canvas.begin() + prompt_length, e.canvas.end());
      lane.fresh.clear();
      for (int p : e.committed) lane.fresh.push_back(p - prompt_length);
      lane.progress = Cat("step ", e.nfe, ", ", e.masks_left, " masks left");
      if (!tty) {
        std::fprintf(stderr, "%s step %d: committed %zu, masks left %d\n", lane.policy.c_str(),
                     e.nfe, e.committed.size(), e.masks_left);
      }
      return true;
    };
    lane.sequence = std::make_unique<Sequence>(model, prompt, options, on_step, args.trace);
    lane.generated.assign(size_t(options.gen_length), config.mask_id);  // valid: checked above
  }
  using Clock = std::chrono::steady_clock;
  const auto frame_interval = std::chrono::milliseconds(150);
  auto last_frame = Clock::now() - frame_interval;
  int drawn_lines = 0;
  auto running = [&] {
    return std::any_of(lanes.begin(), lanes.end(),
                       [](const Lane& l) { return !l.sequence->done(); });
  };
  while (running()) {
    for (Lane& lane : lanes) {
      if (lane.sequence->done()) continue;
      Sequence* const batch[] = {lane.sequence.get()};
      const auto started = Clock::now();
      StepBatch(batch);
      lane.seconds += std::chrono::duration<double>(Clock::now() - started).count();
    }
    if (!tty) continue;
    std::this_thread::sleep_until(last_frame + frame_interval);
    last_frame = Clock::now();
    DrawFrame(lanes, {}, tokenizer, config, &drawn_lines);
  }
  std::vector<GenerationResult> results;
  for (Lane& lane : lanes) {
    lane.sequence->RethrowFailure();
    results.push_back(lane.sequence->TakeResult());
    results.back().seconds = lane.seconds;
    lane.fresh.clear();
  }
  if (tty) DrawFrame(lanes, results, tokenizer, config, &drawn_lines);
  return results;
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
  auto* prompts = cmd->add_option("--prompts", args->prompts_file,
                                  "JSONL file of prompts (- for stdin): {\"prompt\": TEXT} or "
                                  "{\"messages\": [...]} or {\"prompt_ids\": [...]}, "
                                  "optional \"id\"; one JSON line out per prompt");
  prompts->excludes(prompt)->excludes(ids);
  cmd->add_option("--batch", args->batch,
                  "with --prompts: prompts decoded together, one forward for all")
      ->check(CLI::Range(1, 4096))
      ->needs(prompts)
      ->capture_default_str();
  cmd->add_flag("--raw", args->raw, "tokenize the prompt as is, without the chat template");
  cmd->add_option("--chat-template", args->chat_template,
                  "built-in chat template llada | chatml (default: the model's own)");
  cmd->add_option("--system", args->system, "system message")->check(Utf8Text());
  cmd->add_option("--stop-at-eos", args->stop_at_eos, "cut the text at the first EOS / end of turn")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--trace", args->trace, "with --json: every step's commits and policy statistics");
  cmd->add_flag("--visual,--diffusion-visual", args->visual, "show the canvas as it fills")
      ->excludes(prompts);
  auto* compare =
      cmd->add_option("--compare", args->compare,
                      "a second policy to decode the same prompt with the same flags: with "
                      "--visual the two canvases fill in side by side; each policy's text and "
                      "statistics follow in turn")
          ->check(CLI::Validator(
              [](const std::string& name) {
                return IsKnownPolicy(name) ? "" : Cat("unknown policy (", KnownPolicies(), ")");
              },
              "POLICY"))
          ->excludes(prompts)
          ->excludes("--json");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024));
  AddBackendFlag(cmd, args->backend);
  args->options = defaults;
  AddDecodeFlags(cmd, args->options);
  cmd->callback([args, prompt, ids, prompts, compare] {
    SetThreadCount(args->threads);
    if (prompt->count() == 0 && ids->count() == 0 && prompts->count() == 0)
      Fail("give a prompt with -p TEXT, --prompt-ids 1,2,3 or --prompts FILE.jsonl");
    const std::string model_path = args->model.empty() ? DefaultModelPath() : args->model;
    auto model = LoadModelOnBackend(model_path, args->backend);
    const ModelConfig& config = model->config();
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<int> prompt_ids;
    if (prompt->count() > 0) {
      tokenizer = LoadModelTokenizer(model_path);
      prompt_ids = EncodeTextPrompt(*tokenizer, *args, args->prompt);
    } else {
      if (ModelHasTokenizer(model_path)) tokenizer = LoadModelTokenizer(model_path);
      if (prompts->count() > 0) return GeneratePromptFile(*args, *model, tokenizer.get());
      prompt_ids = ParseIdList(args->prompt_ids, "--prompt-ids");
    }
    std::vector<std::string> policies = {args->options.policy};
    if (compare->count() > 0) policies.push_back(args->compare);
    std::vector<GenerationResult> results;
    if (args->visual) {
      results = DecodeVisually(*args, *model, tokenizer.get(), prompt_ids, policies);
    } else {
      for (const std::string& policy : policies) {
        DecodeOptions options = args->options;
        options.policy = policy;
        results.push_back(Generate(*model, prompt_ids, options, nullptr, args->trace));
      }
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const GenerationResult& r = results[i];
      const std::vector<int> visible = VisibleIds(config, r.generated, args->stop_at_eos);
      const std::string text = VisibleText(tokenizer.get(), visible);
      if (args->json) {
        std::printf("%s\n",
                    ResultJson(r, *model, tokenizer.get(), text, args->trace).dump().c_str());
        continue;
      }
      if (tokenizer != nullptr) {
        std::printf("%s\n", text.c_str());
      } else {
        std::string list;
        for (int t : visible) list += (list.empty() ? "" : ",") + std::to_string(t);
        std::printf("%s\n", list.c_str());
      }
      std::fflush(stdout);  // each text right above its statistics on a terminal
      std::fprintf(stderr, "%s\n", StatsLine(policies[i], r).c_str());
    }
  });
}

}  // namespace polestar::cli
