// polestar forward: one full bidirectional pass, raw (unshifted) logits for every position.
#include <cstring>
#include <numeric>

#include "backend_flags.h"
#include "base/error.h"
#include "commands.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/forward.h"

namespace polestar::cli {

void AddForwardCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("forward", "Run one full forward pass: input_ids -> logits");
  struct Args {
    std::string model, input, output, backend;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-m,--model", args->model, "model folder or .gguf file")->required();
  cmd->add_option("--input", args->input, "safetensors with I64 input_ids [1, L]")->required();
  cmd->add_option("--output", args->output, "safetensors to write F32 logits [1, L, V]")
      ->required();
  AddBackendFlag(cmd, args->backend);
  cmd->callback([args] {
    auto model = LoadModelOnBackend(args->model, args->backend);
    FailIfOutputIsAnInput(args->output, {args->input});
    TensorStore input;
    input.set_origin(args->input);
    ReadSafetensorsFile(args->input, input);
    const TensorRef* ids = input.Find("input_ids");
    if (ids == nullptr) ids = input.Find("forward.input_ids");
    if (ids == nullptr) Fail(args->input, ": no tensor input_ids (or forward.input_ids)");
    if (ids->dtype != DType::kI64 || ids->shape.size() != 2 || ids->shape[0] != 1 ||
        ids->shape[1] < 1) {
      Fail(args->input, ": input_ids must be I64 of shape [1, L]");
    }
    const ModelConfig& c = model->config();
    const int64_t length = ids->shape[1];
    if (length > c.max_positions) {
      Fail(args->input, ": ", length, " tokens exceed the model's context of ", c.max_positions);
    }
    std::vector<int> canvas(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) {
      int64_t id;
      std::memcpy(&id, ids->data + 8 * i, 8);
      if (id < 0 || id >= c.vocab)
        Fail(args->input, ": token id ", id, " at position ", i, " is outside the vocabulary of ",
             c.vocab);
      canvas[size_t(i)] = int(id);
    }
    KvCache cache = MakeCache(*model, length, false);
    Forward forward(*model, cache);
    StepPlan plan;
    plan.input_rows.resize(size_t(length));
    std::iota(plan.input_rows.begin(), plan.input_rows.end(), 0);
    plan.logit_rows = plan.input_rows;
    StepResult result = forward.Run(canvas, plan);
    WriteSafetensors(args->output, {F32Tensor("logits", {1, length, c.vocab}, result.logits)});
  });
}

}  // namespace polestar::cli
