// Every backend other than the CPU's against the CPU backend in fp32 (cpu:activations=f32) on
// the reference fixtures, the way a device backend is judged (docs/architecture.md,
// "Backends"):
// * exact mode (activations=f32, or a backend without that option): full-pass logits within
//   1e-4 of the CPU's (the fixtures' own tolerance against the PyTorch reference), and every
//   reference run (vanilla, Fast-dLLM prefix and dual, Dream's samplers, LLaDA 2.x's block
//   diffusion) decoding the CPU's tokens with the CPU's number of forwards;
// * reduced mode (BF16 activations in the products): logits within a bound stated per
//   fixture, relative to the largest logit, and the share of runs decoding the CPU's tokens
//   recorded (RecordProperty: the test's XML/JSON output carries it);
// * both modes: Polestar and Elastic-Cache on the trained probe within the margins the CPU
//   itself meets against the reference policies: accuracy within 2 points, TPF within 10%.
// The checking backend runs here as such a backend (it must agree exactly); the CUDA backend
// runs where a GPU is, and is skipped with the reason elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "decode/generate.h"
#include "decode/option_schema.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "test_support.h"

namespace polestar {
namespace {

// A registered backend other than "cpu", per activation mode where it takes one.
struct Case {
  std::string spec;
  bool exact = true;  // fp32 products: held to the CPU's tokens
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const BackendEntry& entry : RegisteredBackends()) {
    if (entry.name == "cpu") continue;
    const bool has_activations = std::ranges::any_of(
        entry.options, [](const BackendOptionSpec& option) { return option.key == "activations"; });
    if (!has_activations) {
      cases.push_back({std::string(entry.name), true});
      continue;
    }
    cases.push_back({std::string(entry.name) + ":activations=f32", true});
    cases.push_back({std::string(entry.name) + ":activations=reduced", false});
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return testing::BackendTestName(info.param.spec);
}

// The fixtures with a reference full pass and reference runs, and the bound on reduced
// mode's largest logit error relative to the largest |logit| of the pass. The bounds are
// what BF16 activations cost these few-layer models: every product's inputs rounded to 8
// bits of mantissa (2^-9 relative) in every layer. GGUF fixtures hold block-quantised weights
// whose reduced products the CPU runs on 8-bit activations: the CPU's own reduced mode is
// that far from its exact one too.
struct Fixture {
  const char* name;
  double reduced_bound;
};
constexpr Fixture kFixtures[] = {
    {"llada-tiny", 0.02},        {"llada-tiny-bf16", 0.02}, {"llada-c", 0.02},
    {"dream-tiny", 0.02},        {"gguf-llada-q8_0", 0.03}, {"gguf-llada-f16", 0.02},
    {"gguf-llada-q4_k_m", 0.03}, {"gguf-dream-q8_0", 0.03}, {"lladamoe-a", 0.02},
    {"lladamoe-b", 0.02},        {"lladamoe-d", 0.02},      {"llada2-a", 0.02},
    {"llada2-b", 0.02},
};

std::string ModelPath(const std::string& fixture) {
  const std::string dir = testing::FixtureDir(fixture);
  return fixture.rfind("gguf-", 0) == 0 ? dir + "/model.gguf" : dir;
}

// The DecodeOptions of one run of a fixture's expected.json (decode_test's RunFlags, as
// options): its policy from the run's name, its parameters from the record.
DecodeOptions RunOptions(const std::string& run, const nlohmann::json& p) {
  DecodeOptions options;
  if (run.rfind("prefix", 0) == 0) options.policy = "fast-dllm-prefix";
  if (run.rfind("dual", 0) == 0) options.policy = "fast-dllm-dual";
  options.gen_length = p["gen_length"];
  options.steps = p["steps"];
  options.block_length = p.value("block_length", 0);
  if (p.contains("threshold") && !p["threshold"].is_null()) options.threshold = p["threshold"];
  options.eos_early_stop = p.value("eos_early_stop", false);
  if (p.contains("alg")) {
    options.alg = ParseMode<DreamAlg>(*FindOption("alg"), p["alg"].get<std::string>());
    options.eps = p["eps"];
  }
  return options;
}

class DeviceAgreement : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::BackendUnavailable(GetParam().spec); !why.empty()) {
      GTEST_SKIP() << "backend '" << GetParam().spec << "' cannot run here: " << why;
    }
    device_ = &BackendNamed(GetParam().spec);
  }
  const Backend& device() const { return *device_; }
  const Backend& cpu() const { return BackendNamed("cpu:activations=f32"); }

  const Backend* device_ = nullptr;
};

TEST_P(DeviceAgreement, FullPassLogitsAgreeWithTheCpu) {
  for (const Fixture& fixture : kFixtures) {
    SCOPED_TRACE(fixture.name);
    const std::string dir = testing::FixtureDir(fixture.name);
    const auto model = Model::Load(ModelPath(fixture.name));
    TensorStore expected;
    ReadSafetensorsFile(dir + "/expected.safetensors", expected);
    const std::vector<int> ids = testing::ToInts(expected.Get("forward.input_ids"));
    const std::vector<float> want = testing::FullPassLogits(*model, ids, cpu());
    const std::vector<float> got = testing::FullPassLogits(*model, ids, device());
    ASSERT_EQ(got.size(), want.size());
    double max_error = 0, max_logit = 0;
    int64_t argmax_agree = 0;
    const int64_t vocab = model->config().vocab, rows = int64_t(want.size()) / vocab;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i;
      max_error = std::max(max_error, std::fabs(double(got[i]) - want[i]));
      max_logit = std::max(max_logit, std::fabs(double(want[i])));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = [&](const std::vector<float>& v) { return v.begin() + r * vocab; };
      argmax_agree += std::max_element(row(got), row(got) + vocab) - row(got) ==
                      std::max_element(row(want), row(want) + vocab) - row(want);
    }
    RecordProperty(std::string(fixture.name) + ".max_error", std::to_string(max_error));
    RecordProperty(std::string(fixture.name) + ".max_logit", std::to_string(max_logit));
    RecordProperty(std::string(fixture.name) + ".argmax_agreement",
                   std::to_string(double(argmax_agree) / double(rows)));
    if (GetParam().exact) {
      EXPECT_LE(max_error, 1e-4) << "max |logit| " << max_logit;
    } else {
      EXPECT_LE(max_error, fixture.reduced_bound * max_logit) << "max |logit| " << max_logit;
    }
  }
}

TEST_P(DeviceAgreement, ReferenceRunsDecodeTheCpuTokens) {
  int runs = 0, agreeing = 0;
  for (const Fixture& fixture : kFixtures) {
    const std::string dir = testing::FixtureDir(fixture.name);
    const auto model = Model::Load(ModelPath(fixture.name));
    const nlohmann::json expected = ReadJsonFile(dir + "/expected.json");
    TensorStore tensors;
    ReadSafetensorsFile(dir + "/expected.safetensors", tensors);
    const std::vector<int> prompt = testing::ToInts(tensors.Get("prompt"));
    for (const auto& [run, params] : expected["runs"].items()) {
      SCOPED_TRACE(std::string(fixture.name) + " " + run);
      const DecodeOptions options = RunOptions(run, params);
      model->UseBackend(cpu());
      const GenerationResult want = Generate(*model, prompt, options);
      model->UseBackend(device());
      const GenerationResult got = Generate(*model, prompt, options);
      ASSERT_EQ(got.tokens.size(), want.tokens.size());
      const bool same = got.tokens == want.tokens && got.nfe == want.nfe;
      if (GetParam().exact) {
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(got.nfe, want.nfe);
      }
      ++runs;
      agreeing += same;
    }
  }
  EXPECT_EQ(runs, 54);
  RecordProperty("runs", runs);
  RecordProperty("runs_decoding_the_cpu_tokens", agreeing);
  std::printf("%s: %d of %d reference runs decode the CPU's tokens and NFE\n",
              GetParam().spec.c_str(), agreeing, runs);
}

// Accuracy and TPF (every canvas position) of `policy` on the first `limit` probe items,
// through the CLI (eval --json), on `backend`.
std::pair<double, double> ProbeScore(const std::string& policy, const std::string& backend,
                                     int limit) {
  std::string out;
  const int status = testing::RunCli(
      "eval -m " + testing::FixtureDir("llada-probe") + " --suite probe -t 1 -q --json --limit " +
          std::to_string(limit) + " --policy " + policy + " --backend " + backend,
      &out, true);
  EXPECT_EQ(status, 0) << out;
  if (status != 0) return {0, 0};
  const nlohmann::json summary = nlohmann::json::parse(out)["summary"];
  return {summary["accuracy"].get<double>(), summary["tpf"]["all_positions"].get<double>()};
}

TEST_P(DeviceAgreement, DriftAwarePoliciesOnTheProbeWithinTheCpuMargins) {
  // A backend exact to the scalar twins (the checking backend) gives the CPU's bits in the
  // same activation mode, so its scores are the CPU's: a few items test this test's logic.
  // Any other is held to the margins on 60 of the probe's 120 items: enough that 2 points
  // are a little over one item.
  const std::string& spec = GetParam().spec;
  const bool exact_twin = device().contract().exact_to_scalar_twins;
  const std::string cpu_spec = exact_twin
                                   ? "cpu" + spec.substr(std::min(spec.find(':'), spec.size()))
                                   : "cpu:activations=f32";
  const int items = exact_twin ? 6 : 60;
  for (const char* policy : {"polestar", "elastic-cache"}) {
    SCOPED_TRACE(policy);
    const auto [cpu_accuracy, cpu_tpf] = ProbeScore(policy, cpu_spec, items);
    const auto [accuracy, tpf] = ProbeScore(policy, spec, items);
    RecordProperty(std::string(policy) + ".accuracy", std::to_string(accuracy));
    RecordProperty(std::string(policy) + ".tpf", std::to_string(tpf));
    std::printf("%s on %s: accuracy %.3f (%s %.3f), TPF %.3f (%.3f)\n", policy, spec.c_str(),
                accuracy, cpu_spec.c_str(), cpu_accuracy, tpf, cpu_tpf);
    if (exact_twin) {
      EXPECT_EQ(accuracy, cpu_accuracy);
      EXPECT_EQ(tpf, cpu_tpf);
    } else {
      EXPECT_NEAR(accuracy, cpu_accuracy, 0.02);
      EXPECT_NEAR(tpf, cpu_tpf, 0.1 * cpu_tpf);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, DeviceAgreement, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace polestar
