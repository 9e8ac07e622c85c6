// polestar generate: decode a prompt with any policy; text, JSON, or a live canvas.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "commands.h"
#include "decode/generate.h"
#include "decode_flags.h"

namespace polestar::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt_ids;
  DecodeOptions options;
  bool json = false, trace = false, visual = false;
  int threads = 0;
};

void PrintCanvasLine(const StepEvent& event, int prompt_length, int mask_id) {
  std::string line;
  for (size_t p = size_t(prompt_length); p < event.canvas.size(); ++p) {
    line += event.canvas[p] == mask_id ? "_" : std::to_string(event.canvas[p]);
    line += ' ';
  }
  std::fprintf(stderr, "step %3d  masks %3d  %s\n", event.nfe, event.masks_left, line.c_str());
}

}  // namespace

void AddGenerateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text with a diffusion LM");
  auto args = std::make_shared<GenerateArgs>();
  cmd->add_option("-m,--model", args->model, "model folder or .gguf file")->required();
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as token ids: 1,2,3")->required();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--trace", args->trace, "with --json: every step's commits and policy statistics");
  cmd->add_flag("--visual,--diffusion-visual", args->visual, "show the canvas as it fills");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)");
  AddDecodeFlags(cmd, args->options);
  cmd->callback([args] {
    SetThreadCount(args->threads);
    const std::vector<int> prompt = ParseIdList(args->prompt_ids, "--prompt-ids");
    auto model = Model::Load(args->model);
    const ModelConfig& config = model->config();
    StepCallback on_step;
    if (args->visual) {
      on_step = [&](const StepEvent& e) {
        PrintCanvasLine(e, int(prompt.size()), config.mask_id);
        return true;
      };
    }
    GenerationResult r = Generate(*model, prompt, args->options, on_step, args->trace);
    if (args->json) {
      nlohmann::json out = {{"tokens", r.tokens},
                            {"generated", r.generated},
                            {"nfe", r.nfe},
                            {"tpf", {{"until_eos", r.TpfUntilEos()}, {"non_eos", r.TpfNonEos()}, {"all_positions", r.TpfAllPositions()}}},
                            {"tps", {{"until_eos", r.TpsUntilEos()}, {"non_eos", r.TpsNonEos()}}},
                            {"rows_computed", r.rows_computed},
                            {"seconds", r.seconds}};
      if (args->trace) out["trace"] = r.trace;
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::string ids;
      for (int t : r.generated) ids += (ids.empty() ? "" : ",") + std::to_string(t);
      std::printf("%s\n", ids.c_str());
      std::fprintf(stderr, "nfe %d  tpf %.2f  %.2f s\n", r.nfe, r.TpfAllPositions(), r.seconds);
    }
  });
}

}  // namespace polestar::cli
