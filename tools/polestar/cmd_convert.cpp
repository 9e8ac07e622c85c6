// polestar convert -m HF_DIR -o OUT.gguf --type q4_k_m: a Hugging Face checkpoint to GGUF,
// quantised as llama.cpp's converter and llama-quantize would, without Python.
#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "commands.h"
#include "model/gguf_convert.h"

namespace polestar::cli {

void AddConvertCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face checkpoint to GGUF");
  struct Args {
    std::string model, output, type = "f16";
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-m,--model", args->model,
                  "Hugging Face model folder (config.json + safetensors)")
      ->required();
  cmd->add_option("-o,--output", args->output, "GGUF file to write")->required();
  cmd->add_option("--type", args->type, "f32, f16, bf16, q8_0, q4_0 or q4_k_m")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "do not list the tensors");
  cmd->callback([args] {
    const GgufFileType type = ParseGgufFileType(args->type);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::string> warnings =
        ConvertToGguf(args->model, args->output, type, [&](const std::string& line) {
          if (!args->quiet) std::fprintf(stderr, "%s\n", line.c_str());
        });
    for (const std::string& warning : warnings)
      std::fprintf(stderr, "polestar: warning: %s\n", warning.c_str());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s (%s) in %.1f s\n", args->output.c_str(), args->type.c_str(), seconds);
  });
}

}  // namespace polestar::cli
