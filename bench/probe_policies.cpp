// Accuracy and cost of decoding policies on the trained probe (fixtures/llada-probe): every
// prompt of reference.json, gen length 32, block length 8, threshold 0.9 unless a row says
// otherwise. Accuracy: the canvas cut at the first EOS equals the answer.
//
// Usage: probe_policies [probe folder] (default: ../shared/fixtures/llada-probe)
// Prints one JSON object per configuration, then a table.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "decode/generate.h"
#include "io/json_file.h"

namespace polestar {
namespace {

struct Row {
  std::string name;
  DecodeOptions options;
};

std::vector<Row> Configurations() {
  DecodeOptions base;
  base.gen_length = 32;
  base.block_length = 8;
  base.steps = 4;
  base.threshold = 0.9;
  std::vector<Row> rows;
  DecodeOptions vanilla = base;
  vanilla.steps = 32;
  vanilla.threshold.reset();
  rows.push_back({"vanilla, one token per step", vanilla});
  DecodeOptions dual = base;
  dual.policy = "fast-dllm-dual";
  rows.push_back({"fast-dllm-dual", dual});
  DecodeOptions elastic = base;
  elastic.policy = "elastic-cache";
  rows.push_back({"elastic-cache gamma 0.9", elastic});
  elastic.gamma = 0.99;
  rows.push_back({"elastic-cache gamma 0.99", elastic});
  elastic.gamma = 0.9;
  elastic.block_length = 0;
  rows.push_back({"elastic-cache gamma 0.9, no blocks", elastic});
  return rows;
}

int Run(const std::string& dir) {
  SetThreadCount(1);  // a 0.87 M-parameter model: threads only add synchronisation
  auto model = Model::Load(dir);
  const nlohmann::json reference = ReadJsonFile(dir + "/reference.json");
  const nlohmann::json vocab = ReadJsonFile(dir + "/vocab.json");
  const int eos = vocab["EOS"];
  std::vector<nlohmann::json> results;
  for (const Row& row : Configurations()) {
    int correct = 0, nfe = 0, non_eos = 0, positions = 0, refreshes = 0;
    int64_t rows_computed = 0;
    double seconds = 0;
    for (const nlohmann::json& item : reference["prompts"]) {
      const GenerationResult r = Generate(*model, item["prompt_ids"].get<std::vector<int>>(),
                                          row.options, nullptr, /*keep_trace=*/true);
      std::string text;
      for (int token : r.generated) {
        if (token == eos) break;
        text += vocab["chars"].at(size_t(token)).get<std::string>();
      }
      correct += text == item["answer"].get<std::string>();
      nfe += r.nfe;
      non_eos += r.non_eos_tokens;
      positions += int(r.generated.size());
      rows_computed += r.rows_computed;
      seconds += r.seconds;
      for (const nlohmann::json& step : r.trace) {
        refreshes += step.contains("policy") && step["policy"].value("refresh", "") == "from_layer";
      }
    }
    const int prompts = int(reference["prompts"].size());
    nlohmann::json result = {
        {"name", row.name},
        {"policy", row.options.policy},
        {"threshold",
         row.options.threshold ? nlohmann::json(*row.options.threshold) : nlohmann::json()},
        {"block_length", row.options.block_length},
        {"gamma", row.options.gamma},
        {"prompts", prompts},
        {"accuracy", double(correct) / prompts},
        {"nfe", nfe},
        {"tpf_all_positions", double(positions) / nfe},
        {"tpf_non_eos", double(non_eos) / nfe},
        {"rows_computed", rows_computed},
        {"refreshes", refreshes},
        {"seconds", seconds}};
    std::printf("%s\n", result.dump().c_str());
    results.push_back(result);
  }
  std::printf("\n%-36s %8s %6s %9s %9s %12s %9s\n", "configuration", "accuracy", "NFE", "TPF(all)",
              "TPF(text)", "rows", "refreshes");
  for (const nlohmann::json& r : results) {
    std::printf("%-36s %8.4f %6d %9.3f %9.3f %12lld %9d\n", r["name"].get<std::string>().c_str(),
                r["accuracy"].get<double>(), r["nfe"].get<int>(),
                r["tpf_all_positions"].get<double>(), r["tpf_non_eos"].get<double>(),
                static_cast<long long>(r["rows_computed"].get<int64_t>()),
                r["refreshes"].get<int>());
  }
  return 0;
}

}  // namespace
}  // namespace polestar

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "../shared/fixtures/llada-probe";
  try {
    return polestar::Run(dir);
  } catch (const polestar::Error& e) {
    std::fprintf(stderr, "probe_policies: %s\n", e.what());
    return 1;
  }
}
