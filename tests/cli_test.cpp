// The polestar binary end to end: inspect's report, forward's logits against the fixture's
// reference, the bundled model as the default one doing what its card says, and bad input
// ending in a non-zero exit with a message (never a crash).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/dtype.h"
#include "canvas_view.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"
#include "decode_flags.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test_support.h"

namespace polestar {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Quote(const std::string& path) { return "'" + path + "'"; }

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

CliResult Polestar(const std::string& args) {
  CliResult result;
  result.exit_code = testing::RunCli(args, &result.output, /*merge_stderr=*/true);
  return result;
}

// Parameter counts worked out by hand from the fixture configs (see the comments).
TEST(CliInspect, LladaTinyReport) {
  const CliResult r = Polestar("inspect -m " + Quote(testing::FixtureDir("llada-tiny")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("architecture  llada"));
  EXPECT_THAT(r.output, HasSubstr("layers        2"));
  EXPECT_THAT(r.output, HasSubstr("width         64"));
  EXPECT_THAT(r.output, HasSubstr("heads         4 (kv 4, head dim 16)"));
  EXPECT_THAT(r.output, HasSubstr("ffn           96"));
  EXPECT_THAT(r.output, HasSubstr("vocab         160"));
  EXPECT_THAT(r.output, HasSubstr("logit shift   no"));
  // wte + LM head 2 * 160 * 64, ln_f 64, per layer q/k/v/o 4 * 64 * 64, gate/up 2 * 96 * 64,
  // down 64 * 96, two norms 2 * 64: 20544 + 2 * 34944.
  EXPECT_THAT(r.output, HasSubstr("parameters    90432"));
  EXPECT_THAT(r.output, HasSubstr("F32         21 tensors, 361728 bytes"));
  EXPECT_THAT(r.output, HasSubstr("mask 156, eos 157"));
}

// make-random-model prints a mixture of experts' sizes; its GGUF conversion inspects as
// llama.cpp's architecture name with the experts stacked.
TEST(CliMakeRandomModel, MixtureOfExpertsSizesAndItsGgufConversion) {
  const std::string dir = testing::TempDir() + "/moe";
  const CliResult made = Polestar("make-random-model --like llada-moe-tiny -o " + Quote(dir));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_THAT(made.output,
              HasSubstr("8 experts, 2 per token, expert ffn 32, shared expert ffn 24, 1 dense "
                        "layers"));
  const CliResult converted =
      Polestar("convert -q -m " + Quote(dir) + " -o " + Quote(dir + ".gguf") + " --type q8_0");
  ASSERT_EQ(converted.exit_code, 0) << converted.output;
  const CliResult inspected = Polestar("inspect -m " + Quote(dir + ".gguf"));
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  EXPECT_THAT(inspected.output, HasSubstr("architecture  llada-moe"));
}

TEST(CliInspect, Bf16AndDreamReports) {
  CliResult r = Polestar("inspect -m " + Quote(testing::FixtureDir("llada-tiny-bf16")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("parameters    90432"));
  EXPECT_THAT(r.output, HasSubstr("BF16        21 tensors, 180864 bytes"));
  EXPECT_THAT(r.output, Not(HasSubstr("F32 ")));

  r = Polestar("inspect -m " + Quote(testing::FixtureDir("dream-tiny")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("architecture  dream"));
  EXPECT_THAT(r.output, HasSubstr("heads         4 (kv 2, head dim 16)"));
  EXPECT_THAT(r.output, HasSubstr("logit shift   yes"));
  // As LLaDA but k/v are 32 * 64 (two kv heads) and q/k/v carry biases (64 + 32 + 32):
  // 20544 + 2 * 30976.
  EXPECT_THAT(r.output, HasSubstr("parameters    82496"));
}

TEST(CliForward, LogitsMatchTheReference) {
  for (const char* fixture : {"llada-tiny", "dream-tiny"}) {
    const std::string dir = testing::FixtureDir(fixture);
    const std::string out = testing::TempDir() + "/logits.safetensors";
    const CliResult r = Polestar("forward -m " + Quote(dir) + " --input " +
                                 Quote(dir + "/expected.safetensors") + " --output " + Quote(out));
    ASSERT_EQ(r.exit_code, 0) << r.output;

    TensorStore expected, got;
    ReadSafetensorsFile(dir + "/expected.safetensors", expected);
    ReadSafetensorsFile(out, got);
    const TensorRef& want = expected.Get("forward.logits");  // [1, 40, V]
    const TensorRef& logits = got.Get("logits");
    ASSERT_EQ(logits.dtype, DType::kF32);
    ASSERT_EQ(logits.shape, want.shape) << fixture;
    std::vector<float> a(static_cast<size_t>(want.NumElements())), b(a.size());
    std::memcpy(a.data(), want.data, want.bytes);
    std::memcpy(b.data(), logits.data, logits.bytes);
    float max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) max_err = std::max(max_err, std::fabs(a[i] - b[i]));
    EXPECT_LE(max_err, 1e-4f) << fixture;
  }
}

// models/polestar-tiny is the default model of eval and generate, and on held-out items
// (test-split prompts, never trained on) it does what its model card reports; Polestar keeps
// that accuracy in a fraction of the forwards.
TEST(CliBundledModel, IsTheDefaultAndSolvesItsHeldOutTasks) {
  auto eval = [](const std::string& policy) {
    std::string out;
    EXPECT_EQ(
        testing::RunCli(
            "eval --suite tiny --per-task 10 --seed 4242 -t 1 --json -q --policy " + policy, &out),
        0)
        << out;
    return nlohmann::json::parse(out)["summary"];
  };
  const nlohmann::json vanilla = eval("vanilla");
  EXPECT_EQ(vanilla["items"], 100);
  EXPECT_EQ(vanilla["nfe_mean"], 32.0);  // one token per step
  EXPECT_GE(vanilla["accuracy"], 0.9);   // 0.97 when written; the card: 0.974 on 500 items
  for (const auto& [task, score] : vanilla["per_task"].items())
    EXPECT_GE(score["accuracy"], 0.6) << task;
  const nlohmann::json polestar = eval("polestar");
  EXPECT_GE(polestar["accuracy"].get<double>(), vanilla["accuracy"].get<double>() - 0.05);
  EXPECT_LT(polestar["nfe_mean"].get<double>(), 32.0 / 4);

  // The first command a new user types: the model's own generation defaults apply.
  const CliResult sum = Polestar("generate -p 'Compute 755 + 136.' -t 1");
  EXPECT_EQ(sum.exit_code, 0) << sum.output;
  EXPECT_THAT(sum.output, HasSubstr("0891\n"));
}

TEST(CliModelDefaults, GenerationConfigSetsTheDefaultsFlagsOverrideAndHelpShows) {
  // The bundled model's generation_config.json says 32 / 8 / 32.
  CliResult help = Polestar("generate --help");
  EXPECT_THAT(help.output, HasSubstr("--gen-length INT=32 "));
  EXPECT_THAT(help.output, HasSubstr("--steps,--diffusion-steps INT=32\n"));
  // A model folder without one: the built-in defaults.
  const std::string tiny = testing::FixtureDir("llada-tiny");
  help = Polestar("generate -m " + Quote(tiny) + " --help");
  EXPECT_THAT(help.output, HasSubstr("--gen-length INT=128 "));

  testing::Checkpoint checkpoint = testing::LoadCheckpoint("llada-tiny");
  const std::string dir = testing::WriteCheckpoint(checkpoint, testing::TempDir() + "/model");
  std::ofstream(dir + "/generation_config.json")
      << R"({"max_new_tokens": 16, "block_length": 4, "steps": 8, "threshold": 0.5,
            "bos_token_id": 1, "transformers_version": "4.46.3", "top_p": null})";
  help = Polestar("serve -m " + Quote(dir) + " --help");
  EXPECT_THAT(help.output, HasSubstr("--gen-length INT=16 "));
  EXPECT_THAT(help.output, HasSubstr("--block-length,--diffusion-block-length INT=4\n"));
  auto nfe_and_length = [&](const std::string& flags) {
    const CliResult r =
        Polestar("generate -m " + Quote(dir) + " --prompt-ids 1,2,3 --json" + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output);
    return std::pair<int, size_t>(j["nfe"], j["generated"].size());
  };
  const auto [nfe, length] = nfe_and_length("");
  EXPECT_EQ(length, 16u);
  EXPECT_LE(nfe, 8);  // threshold 0.5 commits at least the 2 tokens a step of 8 steps asks
  EXPECT_EQ(nfe_and_length(" --gen-length 8 --block-length 8 --steps 8").second, 8u);

  std::ofstream(dir + "/generation_config.json") << R"({"steps": "many"})";
  CliResult r = Polestar("generate -m " + Quote(dir) + " --prompt-ids 1,2,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(dir + "/generation_config.json: 'steps'"));
  std::ofstream(dir + "/generation_config.json") << R"({"threshold": 0})";
  r = Polestar("generate -m " + Quote(dir) + " --prompt-ids 1,2,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--threshold must lie in (0, 1] (got 0)"));
}

// Numbers that would silently mean something else are errors naming the flag.
TEST(CliErrors, OutOfRangeAndNonFiniteNumbers) {
  const std::string tiny = Quote(testing::FixtureDir("llada-tiny"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--threshold -1", "--threshold must lie in (0, 1] (got -1)"},
      {"--threshold 0", "--threshold must lie in (0, 1] (got 0)"},
      {"--threshold nan", "--threshold must lie in (0, 1] (got nan)"},
      {"--factor -1", "--factor must lie in (0, inf) (got -1)"},
      {"--factor 0", "--factor must lie in (0, inf) (got 0)"},
      {"--temperature nan", "--temperature must lie in [0, inf) (got nan)"},
      {"--cfg-scale nan", "--cfg-scale must lie in [0, 1000] (got nan)"},
      {"--alpha nan", "--alpha must lie in [0, inf) (got nan)"},
      {"--tau-s nan", "--tau-s must lie in (0, 1] (got nan)"},
      {"--policy polestar --tau-s 2", "--tau-s must lie in (0, 1] (got 2)"},
      {"--seed -1", "--seed must be an integer in [0, 18446744073709551615] (got '-1')"},
      {"--seed 18446744073709551616", "--seed must be an integer"},
      {"-t -1", "--threads: Value -1 not in range 0 to 1024"},
      {"--steps 100000", "--steps must lie in [1, 512] (got 100000)"},
  };
  for (const auto& [flags, message] : cases) {
    const CliResult r = Polestar("generate -m " + tiny + " --prompt-ids 1,2,3 " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_THAT(r.output, HasSubstr(message)) << flags;
  }
  for (const char* items : {"--per-task 0", "--per-task -3", "--limit 0"}) {
    const CliResult r = Polestar(std::string("eval --suite tiny ") + items);
    EXPECT_NE(r.exit_code, 0) << items;
    EXPECT_THAT(r.output, HasSubstr("Value ")) << items;  // CLI11: must be positive
  }
  // The other commands' numbers, NaN and wrapped negatives included.
  for (const auto& [command, message] : std::vector<std::pair<std::string, std::string>>{
           {"serve --timeout nan", "--timeout: Value nan not in range 0 to 1e+09"},
           {"make-random-model --scale inf -o " + Quote(testing::TempDir()), "--scale: Value inf"},
           {"train --out " + Quote(testing::TempDir()) + " --lr nan", "--lr: Value nan"},
           {"tasks --n -3", "--n: Value -3 not in range"},
           {"tasks --task add --seed -1", "--seed must be an integer in [0, 18446744073709551615]"},
           {"serve --port 70000", "--port: Value 70000 not in range 0 to 65535"},
           {"generate -p \"$(printf '\\377\\376')\"", "--prompt: the text is not valid UTF-8"},
           {"tokenize -m " + Quote(testing::SourceDir() + "/models/polestar-tiny") +
                " --text \"$(printf '\\303')\"",
            "--text: the text is not valid UTF-8"}}) {
    const CliResult r = Polestar(command);
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_THAT(r.output, HasSubstr(message)) << command;
  }
  // -n is not an item count (nor anything else): eval has --per-task and --limit.
  EXPECT_THAT(Polestar("eval --suite tiny -n 20").output, HasSubstr("-n"));
  EXPECT_NE(Polestar("eval --suite tiny -n 20").exit_code, 0);
}

// An output that is one of the inputs is refused before anything is written.
TEST(CliErrors, OutputsNeverDestroyInputs) {
  const std::string dir = testing::WriteCheckpoint(testing::LoadCheckpoint("llada-tiny"),
                                                   testing::TempDir() + "/model");
  const std::string weights = dir + "/model.safetensors";
  const auto size = std::filesystem::file_size(weights);
  CliResult r = Polestar("convert -m " + Quote(dir) + " -o " + Quote(weights) + " --type q8_0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("the output is one of the inputs"));
  EXPECT_EQ(std::filesystem::file_size(weights), size);
  EXPECT_NO_THROW(Model::Load(dir));
  // Through a second name of the same file, too.
  std::filesystem::create_symlink(weights, dir + "/alias.gguf");
  r = Polestar("convert -m " + Quote(dir) + " -o " + Quote(dir + "/alias.gguf"));
  EXPECT_THAT(r.output, HasSubstr("the output is one of the inputs"));
  EXPECT_EQ(std::filesystem::file_size(weights), size);
}

TEST(CliErrors, MissingModel) {
  const std::string missing = testing::TempDir() + "/no-model";
  const CliResult r = Polestar("inspect -m " + Quote(missing));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("polestar: error: " + missing + ": no such file or directory"));
}

TEST(CliErrors, BrokenConfig) {
  const std::string dir = testing::TempDir();
  std::ofstream(dir + "/config.json") << R"({"model_type": "llada", "d_model": 64, "n_heads": 5})";
  const CliResult r = Polestar("inspect -m " + Quote(dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(dir + "/config.json"));
  EXPECT_THAT(r.output, HasSubstr("error:"));
}

TEST(CliErrors, ForwardInputs) {
  const std::string model = Quote(testing::FixtureDir("llada-tiny"));
  const std::string dir = testing::TempDir();

  // An input file without input_ids.
  const std::string no_ids = dir + "/no_ids.safetensors";
  WriteSafetensors(no_ids, {F32Tensor("x", {1}, {1.0f})});
  CliResult r = Polestar("forward -m " + model + " --input " + Quote(no_ids) + " --output " +
                         Quote(dir + "/out.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(no_ids + ": no tensor input_ids"));

  // A token outside the vocabulary of 160.
  const std::string bad_token = dir + "/bad_token.safetensors";
  WriteSafetensors(bad_token, {I64Tensor("input_ids", {1, 3}, {1, 999, 2})});
  r = Polestar("forward -m " + model + " --input " + Quote(bad_token) + " --output " +
               Quote(dir + "/out.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("token id 999 at position 1"));

  // Wrong dtype / rank.
  const std::string floats = dir + "/floats.safetensors";
  WriteSafetensors(floats, {F32Tensor("input_ids", {1, 2}, {1.0f, 2.0f})});
  r = Polestar("forward -m " + model + " --input " + Quote(floats) + " --output " +
               Quote(dir + "/out.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("input_ids must be I64 of shape [1, L]"));

  // A corrupt input file.
  const std::string corrupt = dir + "/corrupt.safetensors";
  std::ofstream(corrupt) << "not a safetensors file";
  r = Polestar("forward -m " + model + " --input " + Quote(corrupt) + " --output " +
               Quote(dir + "/out.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(corrupt + ": header length"));

  // An output that cannot be created.
  const std::string good_input = Quote(testing::FixtureDir("llada-tiny") + "/expected.safetensors");
  r = Polestar("forward -m " + model + " --input " + good_input + " --output " +
               Quote(dir + "/missing-dir/out.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("missing-dir/out.safetensors: cannot create"));
}

TEST(CliErrors, UsageMistakes) {
  CliResult r = Polestar("forward -m x");  // --input and --output missing
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--input is required"));
  r = Polestar("frobnicate");
  EXPECT_NE(r.exit_code, 0);
  r = Polestar("");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("subcommand is required"));
}

// --- generate over a file of prompts ------------------------------------------------------

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Every line of a prompt file decodes, batched or not, as the same prompt given alone does.
TEST(CliGeneratePrompts, BatchedLinesMatchOnePromptGenerate) {
  const std::vector<std::string> texts = {
      "Compute 231 + 445.", "Copy the list: Emma King, Alan Jones, Olga Hughes",
      "Sort by last name: David Fisher, Frank Garcia, Rosa Hughes", "Compute 785 - 133.",
      "Reverse the list: Ann Lee, Bo Kim"};
  const std::string flags = " -t 1 --policy fast-dllm-dual --threshold 0.7 --gen-length 32";
  std::vector<nlohmann::json> alone;
  for (const std::string& text : texts) {
    const CliResult r = Polestar("generate --json -p " + Quote(text) + flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    alone.push_back(nlohmann::json::parse(r.output.substr(0, r.output.find('\n'))));
  }
  // Line 3 as chat messages and line 5 as ids are the same prompts; a blank line is skipped.
  std::string jsonl;
  for (size_t i = 0; i < texts.size(); ++i) {
    nlohmann::json line;
    if (i == 2) {
      line["messages"] = {{{"role", "user"}, {"content", texts[i]}}};
    } else if (i == 4) {
      const std::vector<int> tokens = alone[i]["tokens"];
      line["prompt_ids"] = std::vector<int>(tokens.begin(), tokens.end() - 32);
    } else {
      line["prompt"] = texts[i];
    }
    if (i != 1) line["id"] = "item-" + std::to_string(i);
    jsonl += line.dump() + (i == 2 ? "\n\n" : "\n");
  }
  const std::string file = WriteFile(testing::TempDir() + "/prompts.jsonl", jsonl);
  for (const char* batch : {"1", "3"}) {
    std::string out;
    ASSERT_EQ(
        testing::RunCli("generate --prompts " + Quote(file) + " --batch " + batch + flags, &out), 0)
        << out;
    std::vector<nlohmann::json> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), texts.size()) << out;
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(lines[i]["index"], i);
      EXPECT_EQ(lines[i].contains("id"), i != 1);
      if (i != 1) {
        EXPECT_EQ(lines[i]["id"], "item-" + std::to_string(i));
      }
      for (const char* field : {"text", "tokens", "generated", "nfe", "tpf", "rows_computed"})
        EXPECT_EQ(lines[i][field], alone[i][field])
            << "line " << i << " " << field << " batch " << batch;
      EXPECT_EQ(lines[i]["tokens_generated"], alone[i]["tokens_generated"]);
    }
  }
  // The same through stdin.
  std::string out;
  ASSERT_EQ(testing::RunCli("generate --prompts - --batch 2" + flags + " < " + Quote(file), &out),
            0);
  EXPECT_EQ(nlohmann::json::parse(out.substr(0, out.find('\n')))["text"], alone[0]["text"]);
}

TEST(CliGeneratePrompts, BadLinesFailWithTheirLineNumber) {
  const std::string dir = testing::TempDir();
  const std::string good = "{\"prompt\": \"Compute 1 + 2.\"}\n";
  const auto fails = [&](const std::string& jsonl, const std::string& message) {
    const std::string file = WriteFile(dir + "/bad.jsonl", jsonl);
    const CliResult r = Polestar("generate -t 1 --prompts " + Quote(file));
    EXPECT_NE(r.exit_code, 0) << jsonl;
    EXPECT_THAT(r.output, HasSubstr(message)) << jsonl;
    EXPECT_THAT(r.output, Not(HasSubstr("\"nfe\""))) << "nothing decoded before the error";
  };
  fails(good + "{\"prompt\": \"unclosed\n", "bad.jsonl:2: invalid JSON");
  fails(good + "\n" + good + "{\"id\": 3}\n", "bad.jsonl:4: needs exactly one of \"prompt\"");
  fails(good + "{\"prompt\": \"x\", \"messages\": []}\n", "bad.jsonl:2: needs exactly one of");
  fails(good + "{\"prompt\": \"caf\xe9\"}\n", "bad.jsonl:2: the line is not valid UTF-8");
  fails("[1, 2]\n", "bad.jsonl:1: expected a JSON object");
  fails(good + "{\"prompt\": 12}\n", "bad.jsonl:2: \"prompt\" must be a string");
  fails("{\"messages\": [{\"role\": \"user\"}]}\n", "bad.jsonl:1: each message needs");
  fails("{\"prompt_ids\": [1, \"a\"]}\n", "bad.jsonl:1: \"prompt_ids\" must be a list of ids");
  fails(good + "{\"prompt_ids\": [1, 99999]}\n", "bad.jsonl:2: ");
  fails("\n\n", "has no prompts");
  CliResult r = Polestar("generate -t 1 --prompts " + Quote(dir + "/none.jsonl"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("cannot open --prompts"));
  r = Polestar("generate -p hello --batch 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--batch requires --prompts"));
}

// Ids are checked against the vocabulary before narrowing (4294967297 is not id 1), and a
// line nested deeper than any prompt needs is refused before it is parsed, wherever the
// nesting is: each error names its line.
TEST(CliGeneratePrompts, OutOfRangeIdsAndDeepNestingNameTheLine) {
  const std::string dir = testing::TempDir();
  const std::string good = "{\"prompt_ids\": [1, 2]}\n";
  const auto fails = [&](const std::string& line, const std::string& message) {
    const std::string file = WriteFile(dir + "/hostile.jsonl", good + good + line + "\n");
    const CliResult r = Polestar("generate -t 1 --prompts " + Quote(file));
    EXPECT_EQ(r.exit_code, 1) << line.substr(0, 80);
    EXPECT_THAT(r.output, HasSubstr("hostile.jsonl:3: " + message)) << line.substr(0, 80);
    EXPECT_THAT(r.output, Not(HasSubstr("\"nfe\""))) << "nothing decoded before the error";
  };
  for (const char* id : {"4294967297", "-1", "-4294967295", "18446744073709551615", "2147483648"}) {
    fails(Cat("{\"prompt_ids\": [1, ", id, "]}"),
          Cat("prompt id ", id, " lies outside the vocabulary [0, "));
  }
  fails("{\"prompt_ids\": [1e30]}", "\"prompt_ids\" must be a list of ids");
  fails("{\"prompt_ids\": [1.5]}", "\"prompt_ids\" must be a list of ids");
  const int kDeep = 100000;
  const std::string deep = std::string(kDeep, '[') + std::string(kDeep, ']');
  const std::string too_deep = "nests arrays and objects deeper than 64 levels";
  fails(deep, too_deep);
  fails("{\"prompt\": \"x\", \"id\": " + deep + "}", too_deep);
  fails("{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"extra\": " + deep + "}]}",
        too_deep);
  fails("{\"prompt_ids\": " + deep + "}", too_deep);
  fails(std::string(kDeep, '{'), too_deep);  // unclosed, still refused before parsing
  // Brackets inside strings do not count.
  const std::string file =
      WriteFile(dir + "/brackets.jsonl",
                "{\"prompt_ids\": [1, 2], \"id\": \"" + std::string(1000, '[') + "\"}\n");
  const CliResult r = Polestar("generate -t 1 --gen-length 8 --prompts " + Quote(file));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// No exception of any kind reaches std::terminate: a library exception that is not a
// polestar::Error (here std::filesystem's, for a name too long) still ends in one line and
// status 1, and bad usage in status 2.
TEST(CliErrors, EveryExceptionEndsInAMessageAndAStatus) {
  CliResult r = Polestar("inspect -m " + std::string(300, 'a'));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("polestar: error: "));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  r = Polestar("generate --no-such-flag");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = Polestar("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --- generate --visual: two policies side by side ---------------------------------------

cli::CanvasCell Chip(const std::string& text,
                     cli::CanvasCell::Kind kind = cli::CanvasCell::Kind::kToken) {
  return {kind, text};
}

TEST(CliVisual, PanelsLieSideBySideWithCanvasAndStatusRowsAligned) {
  using Kind = cli::CanvasCell::Kind;
  const std::vector<cli::CanvasPanel> panels = {
      {"dual",
       {Chip("ab"), Chip("cde"), Chip("", Kind::kMask), Chip("", Kind::kMask),
        Chip("", Kind::kEnd)},
       {"step 1"}},
      {"polestar", {Chip("x\n"), Chip("yy")}, {"done: nfe 2", "TPF 1.00 until EOS"}}};
  // Column 1 is padded to 12 columns, then the bar; status lines wider than 12 wrap.
  const std::vector<std::string> expected = {
      "dual         \u2502 polestar", "abcde\u2592\u2592\u220e     \u2502 x\u21b5yy",
      "step 1       \u2502 done: nfe 2", "             \u2502 TPF 1.00 unt",
      "             \u2502 il EOS"};
  EXPECT_EQ(cli::LayOutPanels(panels, 12, /*colour=*/false), expected);
  EXPECT_EQ(cli::DisplayWidth("\u2592a\u21b5"), 3);
}

TEST(CliVisual, ChipsWrapWholeUnlessWiderThanTheColumn) {
  using Kind = cli::CanvasCell::Kind;
  const std::vector<cli::CanvasPanel> one = {
      {"t", {Chip("ab"), Chip("cde"), Chip("f"), Chip("ghijk"), Chip("\tl")}, {}}};
  EXPECT_EQ(cli::LayOutPanels(one, 4, false),
            (std::vector<std::string>{"t", "ab", "cdef", "ghij", "k\u2192l"}));
  // Colour escapes take no columns: the bar stays where it was.
  const std::vector<cli::CanvasPanel> two = {
      {"a", {Chip("ab", Kind::kFresh), Chip("", Kind::kEnd)}, {}}, {"b", {Chip("c")}, {}}};
  EXPECT_EQ(cli::LayOutPanels(two, 4, true),
            (std::vector<std::string>{"a    \u2502 b",
                                      "\x1b[1;32mab\x1b[0m\x1b[2m\u220e\x1b[0m  \u2502 c"}));
}

// Piped, --visual --compare prints each policy's steps, then each one's text and numbers,
// the same as each policy decoding alone.
TEST(CliVisual, CompareDecodesBothPoliciesAsEachAlone) {
  const std::string flags = " -p 'Compute 362 + 376.' -t 1 --gen-length 32 --block-length 8";
  auto alone = [&](const std::string& policy) {
    const CliResult r = Polestar("generate --json --policy " + policy + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output.substr(0, r.output.find('\n')));
  };
  const nlohmann::json dual = alone("fast-dllm-dual"), polestar = alone("polestar");
  const CliResult r =
      Polestar("generate --visual --policy fast-dllm-dual --compare polestar" + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("fast-dllm-dual step 1: committed"));
  EXPECT_THAT(r.output, HasSubstr("polestar step 1: committed"));
  EXPECT_THAT(r.output, Not(HasSubstr("\x1b[")));  // no frames into a pipe
  for (const auto& [policy, result] :
       {std::pair{"fast-dllm-dual", dual}, std::pair{"polestar", polestar}}) {
    char line[160];
    std::snprintf(line, sizeof(line), "%s\n[%s: TPF %.2f until EOS, %.2f non-EOS, nfe %d,",
                  result["text"].get<std::string>().c_str(), policy,
                  result["tpf"]["until_eos"].get<double>(), result["tpf"]["non_eos"].get<double>(),
                  result["nfe"].get<int>());
    EXPECT_THAT(r.output, HasSubstr(line)) << policy;
  }
  EXPECT_LT(r.output.find("[fast-dllm-dual: "), r.output.find("[polestar: "));

  EXPECT_THAT(Polestar("generate --compare nope" + flags).output, HasSubstr("unknown policy"));
  EXPECT_NE(Polestar("generate --compare polestar --json" + flags).exit_code, 0);
}

// --- the decoding flags, generated from the option schema ------------------------------

using cli::AddDecodeFlags;
using cli::CanonicalDecodeFlag;
using cli::GivenDecodeFlags;
using cli::SetDecodeOption;

bool SameValue(const OptionSpec& option, const DecodeOptions& a, const DecodeOptions& b) {
  return std::visit([&](auto member) { return a.*member == b.*member; }, option.member);
}

// A value unlike the default, as flag text, and the options it should give.
std::pair<std::string, DecodeOptions> OtherValue(const OptionSpec& option) {
  DecodeOptions want;
  std::string text;
  std::visit(
      [&](auto member) {
        auto& target = want.*member;
        using T = std::remove_reference_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::optional<double>>) {
          target = 0.25;
          text = "0.25";
        } else if constexpr (std::is_same_v<T, bool>) {
          target = !target;
          text = target ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          target = target == "polestar" ? "vanilla" : "polestar";  // any text is taken
          text = target;
        } else if constexpr (std::is_enum_v<T>) {
          target = T((size_t(target) + 1) % option.modes.size());  // the next mode
          text = ModeName(option, target);
        } else if constexpr (std::is_same_v<T, double>) {
          target += 0.125;
          text = nlohmann::json(target).dump();  // shortest text that reads back exactly
        } else {
          target += 7;
          text = std::to_string(target);
        }
      },
      option.member);
  return {text, want};
}

// Every flag and alias of every option sets that option and nothing else.
TEST(CliDecodeFlags, EveryFlagAndAliasSetsItsOptionAlone) {
  for (const OptionSpec& option : OptionSchema()) {
    const auto [text, want] = OtherValue(option);
    std::string flags = option.flags;
    for (size_t at = 0; at < flags.size();) {
      const size_t end = std::min(flags.find(',', at), flags.size());
      const std::string flag = flags.substr(at, end - at);
      at = end + 1;
      SCOPED_TRACE(flag + " " + text);
      CLI::App app;
      DecodeOptions got;
      AddDecodeFlags(&app, got);
      std::vector<std::string> args = {text, flag};  // CLI11 parses a reversed vector
      if (option.is_switch) args = {flag};
      app.parse(args);
      for (const OptionSpec& other : OptionSchema()) {
        EXPECT_TRUE(SameValue(other, got, want)) << other.name;
      }
      if (flag.rfind("--", 0) == 0) {
        EXPECT_EQ(GivenDecodeFlags(&app), std::set<std::string>{CanonicalFlag(option)});
      }
    }
  }
}

// By name, by alias, with '-' or '_': the bench grid's keys and generation_config.json's.
// The activation precision comes from the environment: a value it does not know, or the
// variable it replaced, ends the run with a message naming the variable (the child process
// inherits this process's environment).
TEST(CliEnvironment, BadActivationPrecisionIsAClearError) {
  const std::string generate = "generate -m " + Quote(testing::FixtureDir("llada-tiny")) +
                               " --prompt-ids 1,2,3 --gen-length 4 --block-length 4 --steps 4";
  setenv("POLESTAR_ACTIVATIONS", "int4", 1);
  const CliResult bad = Polestar(generate);
  unsetenv("POLESTAR_ACTIVATIONS");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("POLESTAR_ACTIVATIONS is 'int4'; expected reduced or f32"));
  setenv("POLESTAR_QUANT_ACTIVATIONS", "f32", 1);
  const CliResult old = Polestar(generate);
  unsetenv("POLESTAR_QUANT_ACTIVATIONS");
  EXPECT_NE(old.exit_code, 0);
  EXPECT_THAT(old.output, HasSubstr("POLESTAR_QUANT_ACTIVATIONS is now POLESTAR_ACTIVATIONS"));
  setenv("POLESTAR_ACTIVATIONS", "f32", 1);
  const CliResult exact = Polestar(generate);
  unsetenv("POLESTAR_ACTIVATIONS");
  EXPECT_EQ(exact.exit_code, 0) << exact.output;
  // The variables are the CPU backend's defaults: its options, when given, are not overruled
  // (nor failed) by them.
  setenv("POLESTAR_ACTIVATIONS", "int4", 1);
  setenv("POLESTAR_MAX_ISA", "avx9", 1);
  const CliResult chosen = Polestar(generate + " --backend cpu:isa=scalar,activations=f32");
  unsetenv("POLESTAR_ACTIVATIONS");
  unsetenv("POLESTAR_MAX_ISA");
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
}

// --backend on every command that runs a model: a name or option the registry refuses is a
// usage error (status 2) with the registry's message, before any model is read (the model
// path here does not exist, and its error never comes); so is a bad POLESTAR_BACKEND.
TEST(CliBackend, AnUnknownBackendIsAUsageErrorBeforeLoading) {
  const std::string missing = Quote(testing::TempDir() + "/no-such-model");
  for (const std::string& command :
       {"generate -m " + missing + " --prompt-ids 1,2", "eval -m " + missing,
        "bench -m " + missing + " -o " + Quote(testing::TempDir() + "/bench"),
        "bench --scale --random-model " + missing, "serve --port 0 -m " + missing,
        "tasks-eval -m " + missing,
        "forward -m " + missing + " --input " + missing + " --output " + missing}) {
    CliResult r = Polestar(command + " --backend tpu");
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
    // The list is the registry's, highest rank first: cuda leads it where it is built for a
    // GPU and ends it where it is emulated (below the checking backend).
    EXPECT_THAT(r.output, HasSubstr("--backend: unknown backend 'tpu' (known: auto, ")) << command;
    EXPECT_THAT(r.output, HasSubstr("cpu, checked")) << command;
    EXPECT_THAT(r.output, Not(HasSubstr("no-such-model"))) << command;
    r = Polestar(command + " --backend cpu:isa=avx9");
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("isa=avx9: expected scalar, avx2 or avx512")) << command;
  }
  setenv("POLESTAR_BACKEND", "cpu:threads=2", 1);
  const CliResult r = Polestar("generate -m " + missing + " --prompt-ids 1,2");
  unsetenv("POLESTAR_BACKEND");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("POLESTAR_BACKEND: backend 'cpu' has no option 'threads' (its "
                                  "options: isa, activations)"));
  const CliResult help = Polestar("generate --help");
  EXPECT_THAT(help.output, HasSubstr(":isa=scalar|avx2|avx512"));
}

// The scalar kernels give the bundled model's tokens bit for bit (the CPU backend's
// contract), and --json says which backend ran and what crossed between it and the host, by
// kind of step: every step counted once, the per-step figure the mean.
TEST(CliBackend, ScalarKernelsGiveTheSameTokensAndJsonRecordsBackendAndTransfers) {
  const std::string generate =
      "generate -t 1 --json --prompt-ids 5,6,7,8 --gen-length 16 --block-length 8 --policy "
      "polestar --backend ";
  auto run = [&](const std::string& backend) {
    const CliResult r = Polestar(generate + backend);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output.substr(0, r.output.find('\n')));
  };
  const nlohmann::json scalar = run("cpu:isa=scalar"), best = run("auto");
  EXPECT_EQ(scalar["generated"], best["generated"]);
  EXPECT_EQ(scalar["backend"], "cpu-scalar");
  EXPECT_EQ(best["backend"].get<std::string>().rfind("cpu-", 0), 0u) << best["backend"];
  int steps = 0;
  for (const auto& [kind, t] : scalar["transfers"].items()) {
    steps += t["steps"].get<int>();
    // Each step at least hands its commits' tokens back to the host.
    EXPECT_GT(t["bytes_to_host"].get<int64_t>(), 0) << kind;
    EXPECT_DOUBLE_EQ(t["bytes_to_host_per_step"].get<double>(),
                     t["bytes_to_host"].get<double>() / t["steps"].get<double>());
    EXPECT_DOUBLE_EQ(t["bytes_to_backend_per_step"].get<double>(),
                     t["bytes_to_backend"].get<double>() / t["steps"].get<double>());
  }
  EXPECT_EQ(steps, scalar["nfe"]);
  EXPECT_TRUE(scalar["transfers"].contains("full pass")) << scalar["transfers"];
  EXPECT_EQ(scalar["transfers"], best["transfers"]);  // what crosses is the plan's, not the ISA's
}

// eval records the backend, and each item's transfers, summed in the summary.
TEST(CliBackend, EvalRecordsTheBackendAndTransfersPerItemAndInTotal) {
  const CliResult r = Polestar(
      "eval --suite tiny --limit 3 -t 1 --json --items -q --policy fast-dllm-dual --backend "
      "cpu:isa=avx2");
  if (r.exit_code == 2 && r.output.find("does not run the avx2") != std::string::npos)
    GTEST_SKIP() << "this CPU has no AVX2";
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output);
  EXPECT_EQ(out["backend"], "cpu-avx2");
  std::map<std::string, std::pair<int64_t, int64_t>> sums;  // kind -> (steps, bytes to host)
  for (const nlohmann::json& item : out["items"]) {
    ASSERT_TRUE(item["transfers"].contains("dual-cache step")) << item["transfers"];
    for (const auto& [kind, t] : item["transfers"].items()) {
      EXPECT_EQ(t["steps"], item["step_kinds"][kind]) << kind;
      sums[kind].first += t["steps"].get<int64_t>();
      sums[kind].second += t["bytes_to_host"].get<int64_t>();
    }
  }
  const nlohmann::json& total = out["summary"]["transfers"];
  ASSERT_EQ(total.size(), sums.size()) << total;
  for (const auto& [kind, sum] : sums) {
    EXPECT_EQ(total[kind]["steps"], sum.first) << kind;
    EXPECT_EQ(total[kind]["bytes_to_host"], sum.second) << kind;
  }
}

TEST(CliDecodeFlags, SettingsByNameOrAliasReachTheSameOption) {
  EXPECT_EQ(CanonicalDecodeFlag("topk"), "topk-clusters");
  EXPECT_EQ(CanonicalDecodeFlag("topk_clusters"), "topk-clusters");
  EXPECT_EQ(CanonicalDecodeFlag("diffusion_steps"), "steps");
  EXPECT_EQ(CanonicalDecodeFlag("nvfp4"), "nvfp4-hidden");
  DecodeOptions o;
  SetDecodeOption(o, "topk", "2");
  SetDecodeOption(o, "nvfp4", "true");
  SetDecodeOption(o, "block_length", "4");
  EXPECT_EQ(o.topk_clusters, 2);
  EXPECT_TRUE(o.nvfp4_hidden);
  EXPECT_EQ(o.block_length, 4);
  try {
    SetDecodeOption(o, "nonsense", "1");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown decoding setting 'nonsense' (known: policy, "
                                    "gen-length, block-length, steps,"));
  }
  // A mode is read by name as the flag is parsed (a grid's value, generation_config.json's).
  SetDecodeOption(o, "drift_metric", "cosine");
  EXPECT_EQ(o.drift_metric, DriftMetric::kCosine);
  try {
    SetDecodeOption(o, "drift_metric", "l2");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown --drift-metric 'l2' (kl, cosine)");
  }
}

TEST(CliDecodeFlags, PolicyHelpDescribesEveryRegisteredPolicy) {
  const CliResult r = Polestar("generate --policy help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, PolicyHelp());
  for (const PolicyEntry& entry : RegisteredPolicies()) {
    EXPECT_THAT(r.output, HasSubstr(std::string(entry.name) + ": " + entry.description + "\n"));
  }
  const CliResult help = Polestar("generate --help");
  EXPECT_THAT(help.output, HasSubstr("decoding policy: " + KnownPolicies()));
}

TEST(CliDecodeFlags, ARangeErrorNamesTheCanonicalFlag) {
  const std::string tiny = Quote(testing::FixtureDir("llada-tiny"));
  const CliResult r = Polestar("generate -m " + tiny + " --prompt-ids 1,2,3 --topk 9");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--topk-clusters must lie in [1, 8] (got 9)"));
}

}  // namespace
}  // namespace polestar
