// polestar inspect -m DIR: what a checkpoint is, without running it.
#include <cstdio>
#include <map>

#include "commands.h"
#include "model/model.h"

namespace polestar::cli {

void AddInspectCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print a model's architecture, sizes and types");
  auto path = std::make_shared<std::string>();
  cmd->add_option("-m,--model", *path, "model folder or .gguf file")->required();
  cmd->callback([path] {
    auto model = Model::Load(*path);
    const ModelConfig& c = model->config();
    std::map<std::string, std::pair<int, int64_t>> by_type;  // dtype -> (tensors, bytes)
    int64_t bytes = 0;
    for (const auto& [name, t] : model->tensors().tensors()) {
      auto& entry = by_type[std::string(DTypeName(t.dtype))];
      entry.first++;
      entry.second += int64_t(t.bytes);
      bytes += int64_t(t.bytes);
    }
    std::printf("source        %s\n", model->source().c_str());
    std::printf("architecture  %s\n", ArchName(c.arch));
    std::printf("layers        %d\n", c.layers);
    std::printf("width         %d\n", c.width);
    std::printf("heads         %d (kv %d, head dim %d)\n", c.heads, c.kv_heads, c.head_dim);
    std::printf("ffn           %d\n", c.ffn);
    std::printf("vocab         %d\n", c.vocab);
    std::printf("rope theta    %g%s\n", c.rope_theta, c.rope_interleaved ? " (interleaved)" : "");
    std::printf("rms eps       %g\n", c.rms_eps);
    std::printf("max positions %d\n", c.max_positions);
    std::printf("logit shift   %s\n", c.shift_logits ? "yes (Dream)" : "no");
    std::printf("parameters    %lld\n", static_cast<long long>(model->ParameterCount()));
    std::printf("bytes         %lld\n", static_cast<long long>(bytes));
    for (const auto& [type, entry] : by_type) {
      std::printf("  %-6s      %d tensors, %lld bytes\n", type.c_str(), entry.first,
                  static_cast<long long>(entry.second));
    }
    std::printf("special ids   mask %d, eos %d, pad %d, bos %d, eot %d\n", c.mask_id, c.eos_id,
                c.pad_id, c.bos_id, c.eot_id);
  });
}

}  // namespace polestar::cli
