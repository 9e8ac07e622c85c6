// The benchmark harness: grid expansion, the defaults each point gets, resumable result
// files, the Pareto front on hand-made points, the CSV/Markdown shapes, random checkpoints that
// load and decode, the forced commit schedule, and eval on the llada-probe stand-in suite
// against its PyTorch reference outputs.
#include "bench/bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "base/error.h"
#include "base/parallel.h"
#include "bench/random_model.h"
#include "bench/report.h"
#include "bench/scale.h"
#include "decode/generate.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "tasks/tasks.h"
#include "test_support.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/unicode.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

// One engine thread: these models are far too small to gain from more, and OpenMP threads
// waiting on a busy shared machine cost more than the work.
const bool kOneThread = [] {
  SetThreadCount(1);
  return true;
}();

// The few decoding keys these tests set; the CLI's setter covers every flag.
void TestSetter(DecodeOptions& o, const std::string& key, const std::string& value) {
  if (key == "threshold") {
    o.threshold = std::stod(value);
  } else if (key == "block-length") {
    o.block_length = std::stoi(value);
  } else if (key == "gen-length") {
    o.gen_length = std::stoi(value);
  } else if (key == "steps") {
    o.steps = std::stoi(value);
  } else {
    Fail("test setter: unknown key ", key);
  }
}

std::string ProbeDir() { return testing::FixtureDir("llada-probe"); }

BenchSuite ProbeSuite(const Model& model, size_t limit) {
  SuiteOptions options;
  options.name = "probe";
  options.model_dir = ProbeDir();
  options.limit = limit;
  return LoadBenchSuite(options, model.config());
}

// ---- grids ---------------------------------------------------------------------------------

TEST(Grid, ProductOfAxesWithTheLastTurningFastest) {
  const std::vector<GridPoint> points =
      ExpandGrids({"vanilla", "polestar"}, {"threshold=0.5,0.7,0.9;block_length=8,16"});
  ASSERT_EQ(points.size(), 12u);
  EXPECT_EQ(points[0].Label(), "vanilla threshold=0.5 block-length=8");
  EXPECT_EQ(points[1].Label(), "vanilla threshold=0.5 block-length=16");
  EXPECT_EQ(points[2].Label(), "vanilla threshold=0.7 block-length=8");
  EXPECT_EQ(points[6].Label(), "polestar threshold=0.5 block-length=8");
  EXPECT_EQ(points[11].Label(), "polestar threshold=0.9 block-length=16");
  EXPECT_EQ(points[11].SettingsText(), "threshold=0.9 block-length=16");
}

TEST(Grid, PolicyAxisReplacesThePolicyListAndDuplicatesRunOnce) {
  const std::vector<GridPoint> points = ExpandGrids(
      {"vanilla"}, {"policy=polestar;clusters=4,8", "policy=fast-dllm-dual,polestar;clusters=8"});
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].Label(), "polestar clusters=4");
  EXPECT_EQ(points[1].Label(), "polestar clusters=8");
  EXPECT_EQ(points[2].Label(), "fast-dllm-dual clusters=8");
}

TEST(Grid, NoGridMeansEachPolicyAtItsDefaults) {
  const std::vector<GridPoint> points = ExpandGrids({"vanilla", "fast-dllm-dual"}, {});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].policy, "fast-dllm-dual");
  EXPECT_TRUE(points[1].settings.empty());
  EXPECT_EQ(points[1].SettingsText(), "defaults");
}

TEST(Grid, BadSpecsAreErrorsNamingTheProblem) {
  auto expand = [](const std::vector<std::string>& grids) {
    return [grids] { ExpandGrids({"vanilla"}, grids); };
  };
  EXPECT_THAT(expand({"threshold"}), testing::ThrowsErrorContaining({"no '='"}));
  EXPECT_THAT(expand({"threshold=0.5,,0.7"}), testing::ThrowsErrorContaining({"empty item"}));
  EXPECT_THAT(expand({"threshold=0.5;threshold=0.7"}),
              testing::ThrowsErrorContaining({"appears twice"}));
  EXPECT_THAT(expand({"topk=2;topk-clusters=3"}),
              testing::ThrowsErrorContaining({"key 'topk-clusters' appears twice"}));
  EXPECT_THAT(expand({"policy=fast"}), testing::ThrowsErrorContaining({"unknown policy 'fast'"}));
  EXPECT_THAT(expand({"threshold="}), testing::ThrowsErrorContaining({"no values"}));
  EXPECT_EQ(NormaliseKey("--block_length"), "block-length");
}

TEST(Grid, PointsGetSuiteAndPolicyDefaultsUnlessGiven) {
  BenchSuite suite;
  suite.gen_length = 32;
  suite.block_length = 8;
  DecodeOptions base;  // gen 128, block 32, steps 128 as the flags' defaults
  const DecodeOptions dual = ResolvePoint(base, {}, {"fast-dllm-dual", {}}, suite, TestSetter);
  EXPECT_EQ(dual.gen_length, 32);
  EXPECT_EQ(dual.block_length, 8);
  EXPECT_EQ(dual.steps, 32);
  EXPECT_EQ(dual.threshold, 0.9);
  const DecodeOptions vanilla = ResolvePoint(base, {}, {"vanilla", {}}, suite, TestSetter);
  EXPECT_FALSE(vanilla.threshold.has_value());  // one token a step
  EXPECT_EQ(ResolvePoint(base, {}, {"elastic-cache", {}}, suite, TestSetter).threshold, 0.9);
  EXPECT_FALSE(ResolvePoint(base, {}, {"polestar", {}}, suite, TestSetter).threshold.has_value());
  const DecodeOptions set = ResolvePoint(
      base, {"block-length"}, {"fast-dllm-prefix", {{"threshold", "0.7"}}}, suite, TestSetter);
  EXPECT_EQ(set.block_length, 32);  // given on the command line: kept
  EXPECT_EQ(set.threshold, 0.7);
  const DecodeOptions gen =
      ResolvePoint(base, {}, {"vanilla", {{"gen-length", "64"}}}, suite, TestSetter);
  EXPECT_EQ(gen.steps, 64);  // follows the point's gen length
}

// ---- Pareto front and tables ------------------------------------------------------------------

TEST(Report, ParetoFrontOnHandMadePoints) {
  // (x, y) both maximised. (1, 90) and (3, 80) and (4, 60) are the front; (2, 70) is dominated
  // by (3, 80); (3, 75) by (3, 80) (equal x, lower y); (4, 60) and (4, 60) tie and both stay.
  const std::vector<std::pair<double, double>> points = {{1, 90}, {2, 70}, {3, 80},  {3, 75},
                                                         {4, 60}, {4, 60}, {0.5, 90}};
  const std::vector<bool> front = ParetoFront(points);
  EXPECT_EQ(front, (std::vector<bool>{true, false, true, false, true, true, false}));
  EXPECT_TRUE(ParetoFront({}).empty());
  EXPECT_EQ(ParetoFront({{1, 1}}), std::vector<bool>{true});
}

ResultRow HandRow(const std::string& policy, const std::string& settings, double accuracy,
                  double tpf, double tps) {
  ResultRow r;
  r.key = "k" + policy;
  r.policy = policy;
  r.settings = settings;
  r.items = 10;
  r.metrics = {{"flexible_extract", accuracy}, {"strict_match", accuracy / 2}};
  r.task_accuracy = {{"add", accuracy}, {"sort", 1.0}};
  r.nfe_mean = 32 / tpf;
  r.tpf_until_eos = tpf;
  r.tpf_non_eos = tpf;
  r.tpf_all = tpf * 2;
  r.tps_until_eos = tps;
  r.tps_non_eos = tps;
  r.rows_per_token = 100;
  r.peak_rss_bytes = int64_t{3} << 20;
  r.cache_bytes = int64_t{1} << 20;
  r.seconds = 4;  // 10 items: 2.5 items/s
  return r;
}

TEST(Report, CsvHasOneHeaderAndOneLinePerRowWithQuoting) {
  std::vector<ResultRow> rows = {HandRow("vanilla", "defaults", 0.8, 1, 5),
                                 HandRow("polestar", "threshold=0.9 name=\"a,b\"", 0.75, 3, 20)};
  rows[0].batch = 8;
  const std::string csv = CsvTable(rows);
  std::vector<std::string> lines;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "policy,settings,items,batch,accuracy,flexible_extract,strict_match,nfe_mean,"
            "tpf_until_eos,tpf_non_eos,tpf_all_positions,tps_until_eos,tps_non_eos,"
            "items_per_second,rows_per_token,peak_rss_mb,cache_mb,seconds,key");
  EXPECT_EQ(lines[1],
            "vanilla,defaults,10,8,0.8000,0.8000,0.4000,32.00,1.000,1.000,2.000,5.00,5.00,2.500,"
            "100.0,3.0,1.0,4.00,kvanilla");
  EXPECT_EQ(lines[2].substr(0, 43), "polestar,\"threshold=0.9 name=\"\"a,b\"\"\",10,1,");
  EXPECT_EQ(CsvField("plain"), "plain");
}

// Wilson's interval by hand: 8 of 10 is 0.490-0.943; 50 of 100 is 0.404-0.596; it stays
// inside [0, 1] at the ends, where the normal approximation's would not.
TEST(Report, WilsonIntervalOnHandComputedCases) {
  auto [low, high] = WilsonInterval95(0.8, 10);
  EXPECT_NEAR(low, 0.4902, 1e-4);
  EXPECT_NEAR(high, 0.9433, 1e-4);
  std::tie(low, high) = WilsonInterval95(0.5, 100);
  EXPECT_NEAR(low, 0.4038, 1e-4);
  EXPECT_NEAR(high, 0.5962, 1e-4);
  std::tie(low, high) = WilsonInterval95(1.0, 20);
  EXPECT_NEAR(low, 0.8389, 1e-4);  // 20 / (20 + 1.96^2)
  EXPECT_DOUBLE_EQ(high, 1.0);
  std::tie(low, high) = WilsonInterval95(0.0, 20);
  EXPECT_DOUBLE_EQ(low, 0.0);
  EXPECT_NEAR(high, 0.1611, 1e-4);
  EXPECT_EQ(WilsonInterval95(0.3, 0), std::make_pair(0.0, 1.0));
}

TEST(Report, MarkdownHasTheTablesAndMarksTheFront) {
  const std::vector<ResultRow> rows = {HandRow("vanilla", "defaults", 0.8, 1, 5),
                                       HandRow("fast-dllm-dual", "defaults", 0.7, 2, 4),
                                       HandRow("polestar", "defaults", 0.75, 3, 20)};
  const std::string md =
      MarkdownReport(rows, {"gsm8k on m", "polestar bench ...", "cpu", Protocol::kUntilEos});
  std::vector<std::string> table;
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) == 0 || line.rfind("|---", 0) == 0) table.push_back(line);
  }
  // Main table (header, rule, 3 rows), other metrics (2 + 3), per task (2 + 3).
  ASSERT_EQ(table.size(), 15u);
  EXPECT_EQ(std::count(table[0].begin(), table[0].end(), '|'), 17);
  // Vanilla is the most accurate, so on both fronts; dual is dominated by polestar (TPF) and
  // vanilla (TPS).
  EXPECT_EQ(table[2],
            "| vanilla | defaults | 10 | 1 | 80.0% | 49.0-94.3 | 32.0 | 1.00 | 1.00 | 5.0 | 5.0 | "
            "2.50 | 100 | 3.0 | 1.0 | **TPF, TPS** |");
  EXPECT_TRUE(table[3].ends_with("| 1.0 |  |")) << table[3];
  EXPECT_NE(table[4].find("**TPF, TPS**"), std::string::npos);
  EXPECT_NE(table[5].find("strict_match"), std::string::npos);
  EXPECT_NE(table[10].find("| add | sort |"), std::string::npos);
  EXPECT_NE(md.find("Command: `polestar bench ...`"), std::string::npos);
}

TEST(Report, PlotWritesSvgAndPng) {
  const std::string dir = testing::TempDir();
  // Two labelled points at the same place: the second label moves a line down.
  const std::vector<ResultRow> rows = {HandRow("vanilla", "defaults", 0.8, 1, 5),
                                       HandRow("polestar", "threshold=0.9", 0.75, 3, 20),
                                       HandRow("polestar", "threshold=0.8", 0.75, 3, 20)};
  const std::vector<std::string> files =
      WritePlot(rows, {"t", "c", "m", Protocol::kNonEos}, dir + "/pareto");
  std::ifstream dat(dir + "/pareto.dat");
  std::vector<std::string> polestar_lines;
  for (std::string line; std::getline(dat, line);) {
    if (line.find("threshold=0.") != std::string::npos && line[0] != '#')
      polestar_lines.push_back(line);
  }
  ASSERT_GE(polestar_lines.size(), 2u);
  EXPECT_EQ(polestar_lines[0], "3.0000 20.0000 75.000 \"threshold=0.9\" 75.000 75.000");
  // y range [73, 82.5] (accuracy 75-80 padded by 2, +0.5): a line is 0.045 of it, 0.4275.
  EXPECT_EQ(polestar_lines[1], "3.0000 20.0000 75.000 \"threshold=0.8\" 74.572 74.572");
  ASSERT_EQ(files.size(), 4u);
  for (const std::string& f : files) EXPECT_GT(fs::file_size(f), 100u) << f;
  std::ifstream png(dir + "/pareto.png", std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  std::ifstream svg(dir + "/pareto.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("Pareto front"), std::string::npos);
  EXPECT_NE(text.find("polestar"), std::string::npos);
}

// ---- records and summaries --------------------------------------------------------------------

TEST(Runner, TotalsAreRatiosOfSums) {
  ItemRecord a;
  a.id = "a";
  a.task = "add";
  a.nfe = 10;
  a.positions = 32;
  a.tokens_until_eos = 5;
  a.non_eos_tokens = 6;
  a.seconds = 1;
  a.rows_computed = 320;
  a.metrics = {{"m", true}};
  ItemRecord b = a;
  b.id = "b";
  b.task = "sort";
  b.nfe = 30;
  b.tokens_until_eos = 15;
  b.non_eos_tokens = 15;
  b.seconds = 3;
  b.metrics = {{"m", false}};
  const RunSummary s = Summarize({a, b}, {"m"});
  EXPECT_DOUBLE_EQ(s.Accuracy(), 0.5);
  EXPECT_DOUBLE_EQ(s.overall.TpfUntilEos(), 20.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.overall.TpfNonEos(), 21.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.overall.TpfAll(), 64.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.overall.TpsUntilEos(), 20.0 / 4.0);
  EXPECT_DOUBLE_EQ(s.overall.MeanNfe(), 20.0);
  EXPECT_DOUBLE_EQ(s.overall.RowsPerToken(), 640.0 / 64.0);
  ASSERT_EQ(s.per_task.size(), 2u);
  EXPECT_EQ(s.per_task[1].first, "sort");
  EXPECT_DOUBLE_EQ(s.per_task[1].second.Accuracy("m"), 0.0);
  const ItemRecord back = ItemRecord::FromJson(b.ToJson());
  EXPECT_EQ(back.ToJson(), b.ToJson());
}

// Bytes between host and backend: each record's by kind of step, summed over the items, per
// step the mean over the steps of that kind; records from before the count have none.
TEST(Runner, TransfersAddUpByKindOfStep) {
  ItemRecord a;
  a.id = "a";
  a.task = "add";
  a.step_kinds = {{"full pass", 2}, {"dual-cache step", 6}};
  a.step_transfers = {{"full pass", {10, 4000}}, {"dual-cache step", {30, 600}}};
  ItemRecord b = a;
  b.id = "b";
  b.step_kinds = {{"full pass", 1}, {"dual-cache step", 3}};
  b.step_transfers = {{"full pass", {5, 2000}}, {"dual-cache step", {15, 300}}};
  const nlohmann::json item = a.ToJson();
  EXPECT_EQ(item["transfers"]["dual-cache step"],
            nlohmann::json({{"steps", 6},
                            {"bytes_to_backend", 30},
                            {"bytes_to_host", 600},
                            {"bytes_to_backend_per_step", 5.0},
                            {"bytes_to_host_per_step", 100.0}}));
  const ItemRecord back = ItemRecord::FromJson(item);
  EXPECT_EQ(back.step_transfers.at("full pass").to_host, 4000);
  EXPECT_EQ(back.ToJson(), item);
  nlohmann::json old = item;
  old.erase("transfers");
  EXPECT_TRUE(ItemRecord::FromJson(old).step_transfers.empty());
  const nlohmann::json summary = Summarize({a, b}, {"m"}).ToJson();
  const nlohmann::json& full = summary["transfers"]["full pass"];
  EXPECT_EQ(full["steps"], 3);
  EXPECT_EQ(full["bytes_to_host"], 6000);
  EXPECT_DOUBLE_EQ(full["bytes_to_host_per_step"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(full["bytes_to_backend_per_step"].get<double>(), 5.0);
  EXPECT_EQ(summary["per_task"]["add"]["transfers"]["dual-cache step"]["bytes_to_host"], 900);
}

// ---- the stand-in suite ----------------------------------------------------------------------

TEST(Suite, ProbeCodecEncodesLikeTheReference) {
  const CharVocabCodec codec(ProbeDir() + "/vocab.json");
  const nlohmann::json reference = ReadJsonFile(ProbeDir() + "/reference.json");
  for (int i = 0; i < 5; ++i) {
    const nlohmann::json& p = reference["prompts"][size_t(i)];
    EXPECT_EQ(codec.EncodeText(p["prompt"].get<std::string>()),
              p["prompt_ids"].get<std::vector<int>>());
  }
  EXPECT_EQ(codec.Decode(codec.EncodeText("R123>")), "R123>");  // the padding is no character
  EXPECT_THROW(codec.EncodeText("A12#"), Error);
}

TEST(Eval, ProbeSuiteMatchesThePyTorchReference) {
  // Fast-dLLM dual cache, threshold 0.9 (the reference's "dual@0.9" run): per prompt, the same
  // forward-pass count and the same verdict as the reference implementation.
  auto model = Model::Load(ProbeDir());
  const BenchSuite suite = ProbeSuite(*model, 6);
  ASSERT_EQ(suite.items.size(), 6u);
  EXPECT_EQ(suite.full_size, 120u);
  const DecodeOptions options =
      ResolvePoint(DecodeOptions{}, {}, {"fast-dllm-dual", {}}, suite, TestSetter);
  const nlohmann::json reference = ReadJsonFile(ProbeDir() + "/reference.json");
  const nlohmann::json& expected = reference["policies"]["dual@0.9"]["per_prompt"];
  // Batched, each item still decodes as the reference does; the records come in suite order
  // and the items' seconds (shares of the batched forwards) add up to the run's.
  for (const int batch : {1, 4}) {
    std::vector<ItemRecord> records;
    const RunSummary summary = RunSuite(
        *model, suite, options, [&](size_t, const ItemRecord& r) { records.push_back(r); },
        Clock::kWall, batch);
    ASSERT_EQ(records.size(), 6u);
    int correct = 0;
    double seconds = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i].id, suite.items[i].id) << batch;
      EXPECT_EQ(records[i].nfe, expected[i]["nfe"].get<int>()) << i << " at batch " << batch;
      EXPECT_EQ(records[i].metrics[0].second, expected[i]["correct"].get<bool>()) << i;
      EXPECT_GT(records[i].seconds, 0) << i;
      correct += expected[i]["correct"].get<bool>();
      seconds += records[i].seconds;
    }
    EXPECT_DOUBLE_EQ(summary.Accuracy(), correct / 6.0);
    EXPECT_EQ(summary.overall.positions, 6 * 32);
    EXPECT_NEAR(summary.overall.seconds, seconds, 1e-9);
    EXPECT_NEAR(summary.overall.ItemsPerSecond(), 6 / seconds, 1e-6);
  }
}

// A random LLaDA-shaped model over a byte-level tokenizer: 256 byte tokens without merges,
// then LLaDA's special tokens and chat template. Enough to drive a text suite end to end.
std::string WriteByteLevelModel(const std::string& dir) {
  ModelShape shape = ShapeByName("llada-tiny");
  shape.vocab = 262;
  shape.bos_id = 256;
  shape.eos_id = 257;
  shape.eot_id = 260;
  shape.mask_id = 261;
  shape.max_positions = 4096;  // five-shot GSM8K is 2000 byte tokens
  RandomModelOptions options;
  options.shape = shape;
  WriteRandomModel(dir, options);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    const char32_t c = unicode::ByteToChar(uint8_t(b));
    std::string utf8;
    if (c < 0x80) {
      utf8 = std::string(1, char(c));
    } else {
      utf8 = {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    }
    vocab[utf8] = b;
  }
  nlohmann::json added = nlohmann::json::array();
  int id = 256;
  for (const char* token : {"<|startoftext|>", "<|endoftext|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eot_id|>", "<|mdm_mask|>"}) {
    added.push_back({{"id", id++}, {"content", token}, {"special", true}, {"normalized", false}});
  }
  const nlohmann::json tokenizer = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  const nlohmann::json config = {{"bos_token", "<|startoftext|>"},
                                 {"eos_token", "<|endoftext|>"},
                                 {"chat_template", std::string(BuiltinChatTemplate("llada"))}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

TEST(Suite, TextSuitesGoThroughTheTokenizerAndTheSuiteGrader) {
  const std::string dir = WriteByteLevelModel(testing::TempDir() + "/m");
  auto model = Model::Load(dir);
  SuiteOptions options;
  options.name = "gsm8k";
  options.model_dir = dir;
  options.limit = 2;
  const BenchSuite suite = LoadBenchSuite(options, model->config());
  ASSERT_EQ(suite.items.size(), 2u);
  EXPECT_EQ(suite.full_size, 1319u);
  EXPECT_EQ(suite.metric_names, (std::vector<std::string>{"flexible_extract", "strict_match"}));
  // <|startoftext|><|start_header_id|>user<|end_header_id|>\n\nQuestion: ... and the
  // assistant header last.
  const std::vector<int>& prompt = suite.items[0].prompt;
  ASSERT_GT(prompt.size(), 100u);
  EXPECT_EQ(prompt[0], 256);
  EXPECT_EQ(prompt[1], 258);
  EXPECT_EQ(std::string(prompt.begin() + 2, prompt.begin() + 6), "user");
  EXPECT_EQ(std::string(prompt.end() - 12, prompt.end() - 3), "assistant");
  EXPECT_EQ(prompt[prompt.size() - 3], 259);
  EXPECT_EQ(std::string(prompt.end() - 2, prompt.end()), "\n\n");
  // The grader sees the text before the first end token, cut at the suite's stop sequences.
  const std::string answer = "The total is 7.\n#### 18\nQuestion: next";
  std::vector<int> generated(answer.begin(), answer.end());
  generated.push_back(260);
  generated.push_back('9');
  const ItemGrade grade = suite.grade(0, generated);
  EXPECT_EQ(grade.completion, "The total is 7.\n#### 18\n");
  ASSERT_EQ(grade.grade.metrics.size(), 2u);
  EXPECT_EQ(grade.grade.metrics[0].extracted, "18");
  EXPECT_EQ(grade.grade.metrics[1].extracted, "18");
  EXPECT_EQ(grade.grade.correct, suite.items[0].reference == "18");
  // And a real decode through a policy.
  DecodeOptions decode;
  decode.policy = "fast-dllm-dual";
  decode.gen_length = 16;
  decode.block_length = 8;
  decode.steps = 16;
  ItemRecord record;
  const std::size_t second_item[] = {1};
  DecodeItems(*model, suite, second_item, decode, 1, Clock::kWall,
              [&](const ItemRecord& r) { record = r; });
  EXPECT_EQ(record.id, suite.items[1].id);
  EXPECT_EQ(record.positions, 16);
  EXPECT_EQ(record.metrics.size(), 2u);
  EXPECT_GT(record.nfe, 0);
}

TEST(Suite, TinySuiteIsTheTaskTestSplitInTheChatTemplate) {
  const std::string dir = WriteByteLevelModel(testing::TempDir() + "/m");
  auto model = Model::Load(dir);
  SuiteOptions options;
  options.name = "tiny";
  options.model_dir = dir;
  options.per_task = 2;
  options.seed = 7;
  const BenchSuite suite = LoadBenchSuite(options, model->config());
  ASSERT_EQ(suite.items.size(), 2 * TaskNames().size());
  EXPECT_EQ(suite.gen_length, 32);
  EXPECT_EQ(suite.block_length, 8);
  const TaskItem first = MakeTaskItem("add", Split::kTest, 0, 7);
  EXPECT_EQ(suite.items[0].id, "add/0");
  EXPECT_EQ(suite.items[0].reference, first.answer);
  // <|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>...
  std::vector<int> expected = {256, 258, 'u', 's', 'e', 'r', 259, '\n', '\n'};
  expected.insert(expected.end(), first.prompt.begin(), first.prompt.end());
  expected.push_back(260);
  EXPECT_EQ(std::vector<int>(suite.items[0].prompt.begin(),
                             suite.items[0].prompt.begin() + int64_t(expected.size())),
            expected);
  EXPECT_EQ(suite.items[2].task, TaskNames()[1]);
  // The answer before the first EOS is graded by the task's grader.
  std::vector<int> generated(first.answer.begin(), first.answer.end());
  generated.insert(generated.end(), {257, '1', 257});
  EXPECT_TRUE(suite.grade(0, generated).grade.correct);
  generated[0] = generated[0] == '9' ? '8' : '9';
  EXPECT_FALSE(suite.grade(0, generated).grade.correct);
  // --limit and --shard apply after --per-task; --limit takes each task's first item in turn
  // (the first items of tasks 0-4), the second shard the last three of those.
  options.limit = 5;
  options.shard_index = 1;
  options.shard_count = 2;
  const BenchSuite part = LoadBenchSuite(options, model->config());
  ASSERT_EQ(part.items.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(part.items[i].id, TaskNames()[2 + i] + "/0");
  EXPECT_EQ(part.grade(0, std::vector<int>{}).grade.correct, false);
}

TEST(Suite, LongSuiteIsTheLongTasksInBlocksOf32) {
  const std::string dir = WriteByteLevelModel(testing::TempDir() + "/m");
  auto model = Model::Load(dir);
  SuiteOptions options;
  options.name = "long";
  options.model_dir = dir;
  options.seed = 3;
  const BenchSuite suite = LoadBenchSuite(options, model->config());
  ASSERT_EQ(suite.items.size(), 84 * TaskNames(TaskFamily::kLong).size());  // 504 by default
  EXPECT_EQ(suite.name, "long");
  EXPECT_EQ(suite.gen_length, 128);
  EXPECT_EQ(suite.block_length, 32);
  EXPECT_EQ(suite.selection["per_task"], 84);
  EXPECT_EQ(suite.items[0].id, "mul/0");
  EXPECT_EQ(suite.items[84].id, "chain/0");
  const TaskItem first = MakeTaskItem("mul", Split::kTest, 0, 3);
  EXPECT_EQ(suite.items[0].reference, first.answer);
  std::vector<int> generated(first.answer.begin(), first.answer.end());
  generated.push_back(257);
  EXPECT_TRUE(suite.grade(0, generated).grade.correct);
  generated[generated.size() - 2] = generated[generated.size() - 2] == '9' ? '8' : '9';
  EXPECT_FALSE(suite.grade(0, generated).grade.correct);
}

TEST(Suite, TinySuiteTakesTheTasksAskedForInTheirOrder) {
  const std::string dir = WriteByteLevelModel(testing::TempDir() + "/m");
  auto model = Model::Load(dir);
  SuiteOptions options;
  options.name = "tiny";
  options.model_dir = dir;
  options.per_task = 3;
  options.seed = 7;
  options.tasks = {"copy", "add"};
  const BenchSuite suite = LoadBenchSuite(options, model->config());
  ASSERT_EQ(suite.items.size(), 6u);
  EXPECT_EQ(suite.items[0].id, "copy/0");
  EXPECT_EQ(suite.items[2].id, "copy/2");
  EXPECT_EQ(suite.items[3].id, "add/0");
  EXPECT_EQ(suite.items[3].reference, MakeTaskItem("add", Split::kTest, 0, 7).answer);
  EXPECT_EQ(suite.selection["tasks"], nlohmann::json({"copy", "add"}));
  options.tasks = {"nope"};
  EXPECT_THROW(LoadBenchSuite(options, model->config()), Error);
}

// ---- resumability ----------------------------------------------------------------------------

TEST(Bench, RerunSkipsFinishedRunsAndReusesDecodedItems) {
  auto model = Model::Load(ProbeDir());
  const BenchSuite suite = ProbeSuite(*model, 3);
  BenchRequest request;
  request.model_dir = ProbeDir();
  request.points = ExpandGrids({"fast-dllm-dual"}, {"threshold=0.9,0.7"});
  request.setter = TestSetter;
  request.out_dir = testing::TempDir();
  request.machine = DescribeMachine("test", SourceDir(), 1);
  request.plot = false;
  request.progress = false;
  const BenchOutcome first = RunBench(*model, suite, request);
  ASSERT_EQ(first.rows.size(), 2u);
  EXPECT_EQ(first.runs_skipped, 0);
  EXPECT_EQ(first.items_decoded, 6);
  const BenchOutcome again = RunBench(*model, suite, request);
  EXPECT_EQ(again.runs_skipped, 2);
  EXPECT_EQ(again.items_decoded, 0);
  EXPECT_EQ(again.rows[1].accuracy(), first.rows[1].accuracy());
  EXPECT_EQ(again.rows[1].nfe_mean, first.rows[1].nfe_mean);

  // An interrupted run: its items were written but not its row, and the last line is torn.
  const fs::path dir(request.out_dir);
  fs::remove(dir / "results.jsonl");
  std::ofstream(dir / "items.jsonl", std::ios::app) << "{\"key\": \"abc\", \"id\": ";
  const ResultStore store(request.out_dir);
  EXPECT_EQ(store.skipped_lines(), 1);
  const BenchOutcome resumed = RunBench(*model, suite, request);
  EXPECT_EQ(resumed.runs_skipped, 0);
  EXPECT_EQ(resumed.items_decoded, 0);
  ASSERT_EQ(resumed.rows.size(), 2u);
  EXPECT_EQ(resumed.rows[0].nfe_mean, first.rows[0].nfe_mean);

  // A new point runs alone; the tables cover the whole grid.
  request.points = ExpandGrids({"fast-dllm-dual"}, {"threshold=0.9,0.7,0.5"});
  const BenchOutcome grown = RunBench(*model, suite, request);
  EXPECT_EQ(grown.runs_skipped, 2);
  EXPECT_EQ(grown.items_decoded, 3);
  std::ifstream csv(dir / "results.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 4);
  const nlohmann::json run = ReadJsonFile((dir / "run.json").string());
  EXPECT_EQ(run["machine"]["command"], "test");
  EXPECT_FALSE(run["machine"]["cpu_model"].get<std::string>().empty());
}

TEST(Bench, CliRunsAGridAndWritesEveryOutput) {
  const std::string dir = testing::TempDir();
  std::string out;
  const std::string args =
      "bench -m " + ProbeDir() + " --suite probe --limit 2 -t 1 -q -o " + dir +
      " --policies fast-dllm-dual,polestar --grid 'threshold=0.9;block_length=8'";
  ASSERT_EQ(testing::RunCli(args, &out, true), 0) << out;
  for (const char* f : {"results.jsonl", "items.jsonl", "results.csv", "results.md", "run.json",
                        "pareto.svg", "pareto.png", "pareto.gp"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  }
  const std::string md = [&] {
    std::ifstream in(fs::path(dir) / "results.md");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  EXPECT_NE(md.find("| polestar | threshold=0.9 block-length=8 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("--grid 'threshold=0.9;block_length=8'"), std::string::npos) << md;
  ASSERT_EQ(testing::RunCli(args, &out, true), 0) << out;
  EXPECT_NE(out.find("2 run(s), 2 already done, 0 item(s) decoded"), std::string::npos) << out;
  // The CLI's setter knows every decoding flag and rejects others.
  EXPECT_NE(testing::RunCli(args + " --grid 'nonsense=1'", &out, true), 0);
  EXPECT_NE(out.find("unknown decoding setting 'nonsense'"), std::string::npos) << out;
  ASSERT_EQ(testing::RunCli("bench -m " + ProbeDir() +
                                " --suite probe --dry-run --grid "
                                "'policy=polestar;diffusion-steps=16;early_commit=false,true'",
                            &out),
            0);
  EXPECT_NE(out.find("polestar steps=16 early-commit=false"), std::string::npos) << out;
  EXPECT_NE(out.find("2 points x 120 items"), std::string::npos) << out;
}

// A grid over the probe suite into `dir`: 8 of its items (or one shard of them), one
// engine thread, no plot.
BenchOutcome RunProbeGrid(const Model& model, const std::string& dir, const std::string& grid,
                          int shard_index = 0, int shard_count = 1, int batch = 1) {
  SuiteOptions options;
  options.name = "probe";
  options.model_dir = ProbeDir();
  options.limit = 8;
  options.shard_index = shard_index;
  options.shard_count = shard_count;
  const BenchSuite suite = LoadBenchSuite(options, model.config());
  BenchRequest request;
  request.model_dir = ProbeDir();
  request.points = ExpandGrids({"fast-dllm-dual", "polestar"}, {grid});
  request.setter = TestSetter;
  request.out_dir = dir;
  request.machine = DescribeMachine("test", SourceDir(), 1);
  request.batch = batch;
  request.plot = false;
  request.progress = false;
  return RunBench(model, suite, request);
}

// Everything a row holds but time, memory and where it ran.
void ExpectSameResults(const ResultRow& a, const ResultRow& b) {
  EXPECT_EQ(a.policy, b.policy);
  EXPECT_EQ(a.settings, b.settings);
  EXPECT_EQ(a.items, b.items);
  EXPECT_EQ(a.metrics, b.metrics);
  EXPECT_EQ(a.task_accuracy, b.task_accuracy);
  EXPECT_EQ(a.nfe_mean, b.nfe_mean);
  EXPECT_EQ(a.tpf_until_eos, b.tpf_until_eos);
  EXPECT_EQ(a.tpf_non_eos, b.tpf_non_eos);
  EXPECT_EQ(a.tpf_all, b.tpf_all);
  EXPECT_EQ(a.rows_per_token, b.rows_per_token);
}

std::vector<nlohmann::json> JsonLines(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Bench, BatchedRunsGiveTheResultsOfOneAtATimeAndRecordTheBatch) {
  auto model = Model::Load(ProbeDir());
  const std::string one = testing::TempDir() + "/one", four = testing::TempDir() + "/four";
  const BenchOutcome single = RunProbeGrid(*model, one, "threshold=0.9,0.7");
  const BenchOutcome batched = RunProbeGrid(*model, four, "threshold=0.9,0.7", 0, 1, 4);
  ASSERT_EQ(single.rows.size(), 4u);
  ASSERT_EQ(batched.rows.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ExpectSameResults(single.rows[i], batched.rows[i]);
    EXPECT_EQ(single.rows[i].batch, 1);
    EXPECT_EQ(batched.rows[i].batch, 4);
    EXPECT_NE(single.rows[i].key, batched.rows[i].key);  // their timings differ
    EXPECT_GT(batched.rows[i].items_per_second(), 0);
  }
  // Items reach the store in suite order, with the completions of batch 1.
  const std::vector<nlohmann::json> a = JsonLines(fs::path(one) / "items.jsonl");
  const std::vector<nlohmann::json> b = JsonLines(fs::path(four) / "items.jsonl");
  ASSERT_EQ(a.size(), 32u);
  ASSERT_EQ(b.size(), 32u);
  const BenchSuite suite = ProbeSuite(*model, 8);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["id"], suite.items[i % 8].id) << i;
    EXPECT_EQ(b[i]["completion"], a[i]["completion"]) << i;
    EXPECT_EQ(b[i]["nfe"], a[i]["nfe"]) << i;
  }
  std::ifstream csv(fs::path(four) / "results.csv");
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  EXPECT_EQ(header.rfind("policy,settings,items,batch,accuracy", 0), 0u) << header;
  EXPECT_EQ(first.rfind("fast-dllm-dual,threshold=0.9,8,4,", 0), 0u) << first;
}

TEST(Bench, MergedShardsAreTheUnshardedRun) {
  auto model = Model::Load(ProbeDir());
  const std::string root = testing::TempDir();
  const BenchOutcome whole = RunProbeGrid(*model, root + "/whole", "threshold=0.9,0.7");
  RunProbeGrid(*model, root + "/s0", "threshold=0.9,0.7", 0, 2);
  RunProbeGrid(*model, root + "/s1", "threshold=0.9,0.7", 1, 2);
  MergeRequest merge;
  merge.shard_dirs = {root + "/s0", root + "/s1"};
  merge.out_dir = root + "/merged";
  merge.machine = DescribeMachine("merge", SourceDir(), 1);
  merge.plot = false;
  const BenchOutcome merged = MergeShards(merge);
  ASSERT_EQ(merged.rows.size(), whole.rows.size());
  for (size_t i = 0; i < whole.rows.size(); ++i) {
    ExpectSameResults(merged.rows[i], whole.rows[i]);
    EXPECT_EQ(merged.rows[i].key, whole.rows[i].key);
  }
  // The same items in the same order, and the tables of the unsharded run but for timings.
  const std::vector<nlohmann::json> a = JsonLines(fs::path(root) / "whole/items.jsonl");
  const std::vector<nlohmann::json> b = JsonLines(fs::path(root) / "merged/items.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* field : {"key", "id", "nfe", "completion", "metrics"})
      EXPECT_EQ(b[i][field], a[i][field]) << i << " " << field;
  }
  const auto untimed_csv = [](const fs::path& path) {
    std::vector<std::string> lines;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      // policy .. tpf_all_positions (the first 9 fields), then the key.
      size_t end = 0;
      for (int field = 0; field < 9; ++field) end = line.find(',', end) + 1;
      lines.push_back(line.substr(0, end) + line.substr(line.rfind(',') + 1));
    }
    return lines;
  };
  EXPECT_EQ(untimed_csv(fs::path(root) / "merged/results.csv"),
            untimed_csv(fs::path(root) / "whole/results.csv"));
  const nlohmann::json row = JsonLines(fs::path(root) / "merged/results.jsonl")[0];
  EXPECT_EQ(row["selection"]["shard"], "0/1");
  ASSERT_EQ(row["shards"].size(), 2u);
  EXPECT_EQ(row["shards"][1]["shard"], "1/2");
  // The unsharded command finds the merged folder done; merging again adds nothing.
  EXPECT_EQ(RunProbeGrid(*model, root + "/merged", "threshold=0.9,0.7").runs_skipped, 4);
  EXPECT_EQ(MergeShards(merge).runs_skipped, 4);
  EXPECT_EQ(JsonLines(fs::path(root) / "merged/results.jsonl").size(), 4u);
}

TEST(Bench, MergeRefusesMissingOverlappingAndMismatchedShards) {
  auto model = Model::Load(ProbeDir());
  const std::string root = testing::TempDir();
  RunProbeGrid(*model, root + "/s0", "threshold=0.9", 0, 2);
  RunProbeGrid(*model, root + "/s1", "threshold=0.9", 1, 2);
  RunProbeGrid(*model, root + "/s1-other", "threshold=0.7", 1, 2);
  RunProbeGrid(*model, root + "/third", "threshold=0.9", 1, 3);
  const auto merge = [&](const std::vector<std::string>& shards) {
    MergeRequest request;
    for (const std::string& s : shards) request.shard_dirs.push_back(root + "/" + s);
    request.out_dir = root + "/out";
    request.plot = false;
    return [request] { MergeShards(request); };
  };
  EXPECT_THAT(merge({"s0"}), testing::ThrowsErrorContaining({"shard(s) 1/2 missing", "s0"}));
  EXPECT_THAT(merge({"s0", "s1-other"}),
              testing::ThrowsErrorContaining({"missing", "different models, suites or settings"}));
  EXPECT_THAT(merge({"s0", "s1", "s1"}),
              testing::ThrowsErrorContaining({"shard 1/2 is in both", "overlapping"}));
  EXPECT_THAT(merge({"s0", "s1", "third"}),
              testing::ThrowsErrorContaining({"split it differently", "1/3 in "}));
  fs::create_directories(root + "/empty");
  EXPECT_THAT(merge({"s0", "empty"}),
              testing::ThrowsErrorContaining({"empty", "no results.jsonl"}));
  EXPECT_THAT(merge({}), testing::ThrowsErrorContaining({"name the shard folders"}));
  // Nothing was written by the refusals.
  EXPECT_FALSE(fs::exists(root + "/out"));
  // Merging into a shard folder would mix the two.
  MergeRequest into_shard;
  into_shard.shard_dirs = {root + "/s0", root + "/s1"};
  into_shard.out_dir = root + "/s1";
  EXPECT_THAT([&] { MergeShards(into_shard); },
              testing::ThrowsErrorContaining({"is one of the shard folders"}));
}

TEST(Bench, CliMergesShardsAndBatchesItems) {
  const std::string root = testing::TempDir();
  const std::string base = "bench -m " + ProbeDir() +
                           " --suite probe --limit 5 -t 1 -q --no-plot --policies fast-dllm-dual";
  std::string out;
  ASSERT_EQ(testing::RunCli(base + " -o " + root + "/whole", &out, true), 0) << out;
  ASSERT_EQ(testing::RunCli(base + " --batch 3 -o " + root + "/batched", &out, true), 0) << out;
  ASSERT_EQ(testing::RunCli(base + " --shard 0/2 --batch 2 -o " + root + "/s0", &out, true), 0)
      << out;
  ASSERT_EQ(testing::RunCli(base + " --shard 1/2 --batch 2 -o " + root + "/s1", &out, true), 0)
      << out;
  ASSERT_EQ(testing::RunCli(
                "bench --merge " + root + "/s0 " + root + "/s1 --no-plot -o " + root + "/merged",
                &out, true),
            0)
      << out;
  EXPECT_NE(out.find("1 run(s) merged from 2 folder(s), 0 already in"), std::string::npos) << out;
  const auto row = [&](const std::string& dir) {
    return ResultRow::FromJson(JsonLines(fs::path(root) / dir / "results.jsonl").at(0));
  };
  ExpectSameResults(row("batched"), row("whole"));
  ExpectSameResults(row("merged"), row("whole"));
  EXPECT_EQ(row("batched").batch, 3);
  EXPECT_EQ(row("merged").batch, 2);
  const std::string md = [&] {
    std::ifstream in(fs::path(root) / "merged/results.md");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  EXPECT_NE(md.find("| fast-dllm-dual | defaults | 5 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("merged from 2 shards"), std::string::npos) << md;
  EXPECT_NE(testing::RunCli("bench --merge " + root + "/s0 --no-plot", &out, true), 0);
  EXPECT_NE(out.find("--merge needs the output folder"), std::string::npos) << out;
  EXPECT_NE(
      testing::RunCli("bench --merge " + root + "/s0 -o " + root + "/m2 --no-plot", &out, true), 0);
  EXPECT_NE(out.find("shard(s) 1/2 missing"), std::string::npos) << out;
  // eval batches too, with the items of one at a time.
  std::string one, three;
  const std::string eval =
      "eval -m " + ProbeDir() + " --suite probe --policy polestar --limit 7 -t 1 -q --json --items";
  ASSERT_EQ(testing::RunCli(eval, &one), 0) << one;
  ASSERT_EQ(testing::RunCli(eval + " --batch 4", &three), 0) << three;
  const nlohmann::json a = nlohmann::json::parse(one), b = nlohmann::json::parse(three);
  EXPECT_EQ(a["batch"], 1);
  EXPECT_EQ(b["batch"], 4);
  EXPECT_EQ(a["summary"]["accuracy"], b["summary"]["accuracy"]);
  EXPECT_EQ(a["summary"]["nfe_mean"], b["summary"]["nfe_mean"]);
  ASSERT_EQ(b["items"].size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(b["items"][i]["id"], a["items"][i]["id"]);
    EXPECT_EQ(b["items"][i]["nfe"], a["items"][i]["nfe"]);
    EXPECT_EQ(b["items"][i]["completion"], a["items"][i]["completion"]);
  }
}

TEST(Eval, CliPrintsPerTaskAndOverallJson) {
  std::string out;
  ASSERT_EQ(testing::RunCli("eval -m " + ProbeDir() +
                                " --suite probe --policy polestar --limit 4 -t 1 -q --json",
                            &out),
            0)
      << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["summary"]["items"], 4);
  EXPECT_EQ(j["options"]["policy"], "polestar");
  EXPECT_DOUBLE_EQ(j["options"]["threshold"].get<double>(), 0.9);  // tau_s
  EXPECT_TRUE(j["summary"]["per_task"].contains("rev"));
  EXPECT_GT(j["summary"]["tpf"]["all_positions"].get<double>(), 1.0);
  ASSERT_NE(testing::RunCli("eval -m " + ProbeDir() + " --suite nope", &out, true), 0);
  EXPECT_NE(out.find("unknown suite 'nope'"), std::string::npos) << out;
}

// ---- random checkpoints and the scale benchmark ----------------------------------------------

TEST(RandomModel, WritesACheckpointThatLoadsAndDecodes) {
  const std::string dir = testing::TempDir() + "/m";
  RandomModelOptions options;
  options.shape = ShapeByName("llada-tiny");
  options.scale = 1.5;  // 3 layers
  const RandomModelSummary summary = WriteRandomModel(dir, options);
  EXPECT_EQ(summary.shape.layers, 3);
  auto model = Model::Load(dir);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.width, 64);
  EXPECT_EQ(c.vocab, 128);
  EXPECT_EQ(c.mask_id, 126);
  EXPECT_EQ(model->ParameterCount(), summary.parameters);
  // 2 V C + C + per layer 4 C^2 + 3 C F + 2 C.
  EXPECT_EQ(summary.parameters, 2 * 128 * 64 + 64 + 3 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64));
  EXPECT_EQ(model->tensors().Get("model.transformer.blocks.0.q_proj.weight").dtype, DType::kBF16);
  DecodeOptions decode;
  decode.gen_length = 16;
  decode.block_length = 8;
  decode.steps = 16;
  const GenerationResult r = Generate(*model, std::vector<int>{1, 2, 3, 4}, decode);
  EXPECT_EQ(r.nfe, 16);
  for (int t : r.generated) EXPECT_NE(t, c.mask_id);
  // Same seed, same bytes.
  const std::string again = testing::TempDir() + "/again";
  WriteRandomModel(again, options);
  std::ifstream a(dir + "/model.safetensors", std::ios::binary),
      b(again + "/model.safetensors", std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));
}

TEST(RandomModel, ShardsLargeCheckpointsAndRefusesRealOnes) {
  const std::string dir = testing::TempDir();
  RandomModelOptions options;
  options.shape = ShapeByName("dream-tiny");
  options.dtype = DType::kF32;
  options.max_shard_bytes = 40000;
  const RandomModelSummary summary = WriteRandomModel(dir + "/m", options);
  EXPECT_GT(summary.files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir + "/m/model.safetensors.index.json"));
  auto model = Model::Load(dir + "/m");
  EXPECT_STREQ(ArchName(model->config().arch), "dream");
  EXPECT_EQ(model->config().kv_heads, 2);
  EXPECT_EQ(model->tensors().Get("model.layers.1.self_attn.k_proj.bias").dtype, DType::kF32);
  fs::create_directories(dir + "/real");
  fs::copy_file(ProbeDir() + "/config.json", dir + "/real/config.json");
  // It refuses to overwrite a real checkpoint.
  EXPECT_THAT([&] { WriteRandomModel(dir + "/real", options); },
              testing::ThrowsErrorContaining({"did not write"}));
  EXPECT_THROW(ShapeByName("llada-80b"), Error);
}

// llada-moe-tiny: 3 layers, width 64, 4 heads of which 2 for k/v, 8 experts of 32 with 2
// per token, a shared expert of 24, the first layer dense (ffn 96), vocabulary 160.
TEST(RandomModel, WritesAMixtureOfExpertsWhoseRouterSpreadsTheTokens) {
  const std::string dir = testing::TempDir() + "/moe";
  RandomModelOptions options;
  options.shape = ShapeByName("llada-moe-tiny");
  options.dtype = DType::kF32;
  const RandomModelSummary summary = WriteRandomModel(dir, options);
  auto model = Model::Load(dir);
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.moe.experts, 8);
  EXPECT_EQ(c.moe.moe_layers, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(model->ParameterCount(), summary.parameters);
  const int64_t C = 64, kv = 2 * 16, attention = 2 * C * C + 2 * C * kv + 2 * 16 + 2 * C;
  const int64_t dense = 3 * C * 96, routed = 8 * C + 8 * 3 * C * 32 + 3 * C * 24;
  EXPECT_EQ(summary.parameters, 2 * 160 * C + C + 3 * attention + dense + 2 * routed);
  EXPECT_EQ(summary.active_parameters, summary.parameters - 2 * (8 - 2) * 3 * C * 32);
  // Random weights route like a trained model does at the start: every expert gets tokens
  // and no token's top choice takes most of the weight (normalised embeddings through the
  // router of layer 1).
  const TensorRef& embedding = model->tensors().Get("model.embed_tokens.weight");
  const TensorRef& router = model->tensors().Get("model.layers.1.mlp.gate.weight");
  const float* e = reinterpret_cast<const float*>(embedding.data);  // [V, C]
  const float* w = reinterpret_cast<const float*>(router.data);     // [E, C]
  const int tokens = 64;
  std::vector<float> logits(size_t(tokens * 8));  // [tokens, E]
  for (int t = 0; t < tokens; ++t) {
    double sq = 0;
    for (int j = 0; j < C; ++j) sq += double(e[t * C + j]) * e[t * C + j];
    const double inv_rms = 1.0 / std::sqrt(sq / double(C) + 1e-5);
    for (int x = 0; x < 8; ++x) {
      double dot = 0;
      for (int j = 0; j < C; ++j) dot += double(e[t * C + j]) * inv_rms * w[x * C + j];
      logits[size_t(t * 8 + x)] = float(dot);
    }
  }
  std::vector<int> chosen(size_t(tokens * 2));
  std::vector<float> weights(chosen.size());
  RouteTopK(logits.data(), tokens, RouterSpec{.experts = 8, .top_k = 2}, chosen.data(),
            weights.data());
  std::vector<int> load(8, 0);
  for (int x : chosen) ++load[size_t(x)];
  for (int x = 0; x < 8; ++x) EXPECT_GT(load[size_t(x)], 0) << "expert " << x;
  for (int t = 0; t < tokens; ++t) EXPECT_LT(weights[size_t(t * 2)], 0.5f) << "token " << t;
}

// The MoE scale run on a GGUF conversion: the file is written next to the checkpoint and is
// what runs; the report carries the expert sizes and the memory.
TEST(Scale, RunsAGgufConversionOfAMixtureOfExperts) {
  const std::string dir = testing::TempDir();
  ScaleOptions options;
  options.like = "llada-moe-tiny";
  options.model_dir = dir + "/moe";
  options.gguf_type = "q8_0";
  options.out_dir = dir + "/out";
  options.reps = 1;
  options.prompt_length = 8;
  options.base.gen_length = 32;
  options.base.block_length = 8;
  options.tokens_per_step = 2;
  options.policies = {"fast-dllm-dual", "polestar"};
  options.progress = false;
  options.backend = &BackendNamed("cpu:isa=scalar");
  const nlohmann::json out = RunScaleBenchmark(options, MachineInfo{});
  EXPECT_EQ(out["model"]["file"], dir + "/moe-q8_0.gguf");
  EXPECT_TRUE(fs::exists(dir + "/moe-q8_0.gguf"));
  EXPECT_EQ(out["model"]["file_bytes"], int64_t(fs::file_size(dir + "/moe-q8_0.gguf")));
  EXPECT_EQ(out["model"]["experts"], 8);
  EXPECT_EQ(out["model"]["experts_per_token"], 2);
  EXPECT_GT(out["model"]["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(out["model"]["backend"], "cpu-scalar");  // options.backend's
  // A step's experts read (mean over its runs) price its weight bytes (bench/gpu_table.py):
  // at least k in a mixture layer, at most every expert in every layer; none in the drift ops'
  // timings (no rows through the layers).
  const double k = out["model"]["experts_per_token"].get<double>();
  const double most = out["model"]["layers"].get<double>() * out["model"]["experts"].get<double>();
  for (const auto& step : out["steps"]) {
    EXPECT_TRUE(step.contains("bytes_to_backend")) << step.dump();
    EXPECT_GT(step["bytes_to_host"].get<int64_t>(), 0) << step.dump();
    ASSERT_TRUE(step.contains("experts_read")) << step.dump();
    if (step["rows_computed"].get<int64_t>() > 0) {
      EXPECT_GE(step["experts_read"].get<double>(), k) << step.dump();
    } else {
      EXPECT_EQ(step["experts_read"].get<double>(), 0) << step.dump();
    }
    EXPECT_LE(step["experts_read"].get<double>(), most) << step.dump();
  }
  for (const auto& run : out["forced"]) {
    EXPECT_FALSE(run.contains("error")) << run.dump();
    // Every kind of step the run took, counted as often as it was taken.
    ASSERT_EQ(run["transfers"].size(), run["step_kinds"].size()) << run.dump();
    for (const auto& [kind, t] : run["transfers"].items())
      EXPECT_EQ(t["steps"], run["step_kinds"][kind]["count"]) << kind;
  }
  options.gguf_type = "q3_k";
  EXPECT_THAT([&] { RunScaleBenchmark(options, MachineInfo{}); },
              testing::ThrowsErrorContaining({"unknown GGUF type 'q3_k'"}));
}

// --paper measures its prompt as the GSM8K suite's mean under a tokenizer, unless a
// --prompt-length stands for it (a GPU machine has no tokenizer files): then it runs with
// that prompt and still projects at the paper's TPF values.
TEST(Scale, ThePaperProtocolTakesAGivenPromptLengthForTheSuites) {
  const std::string dir = testing::TempDir();
  const std::string command = "bench --scale --paper --like llada-tiny --random-model " + dir +
                              "/m --gen-length 32 --block-length 8 --reps 1 --scale-max-steps 1 "
                              "-t 1 -q -o " +
                              dir + "/out";
  std::string out;
  ASSERT_EQ(testing::RunCli(command + " --prompt-length 8", &out, true), 0) << out;
  const nlohmann::json scale = ReadJsonFile(dir + "/out/scale.json");
  EXPECT_EQ(scale["canvas"]["prompt"], 8);
  EXPECT_FALSE(scale["canvas"].contains("prompt_from"));
  std::vector<std::string> projected;
  for (const auto& row : scale["paper_projection"]) projected.push_back(row["policy"]);
  EXPECT_EQ(projected,
            (std::vector<std::string>{"vanilla", "fast-dllm-dual", "elastic-cache", "polestar"}));
  EXPECT_NE(testing::RunCli(command, &out, true), 0);
  EXPECT_THAT(out, ::testing::HasSubstr("--prompt-suite needs --prompt-tokenizer"));
}

TEST(Scale, ForcedScheduleStepsPerBlock) {
  EXPECT_EQ(ForcedStepsPerBlock(32, 4), 8);
  EXPECT_EQ(ForcedStepsPerBlock(8, 2), 4);
  EXPECT_EQ(ForcedStepsPerBlock(5, 2),
            2);  // 5 -> 3 -> all 3 (the factor rule's last-but-one quirk)
  EXPECT_EQ(ForcedStepsPerBlock(8, 1), 7);  // ... and with one token a step, 2 -> 0
  EXPECT_EQ(ForcedStepsPerBlock(8, 8), 1);
}

// A tiny random LLaDA written to the test's folder, and the scale bench's options for it:
// a prompt of 8, four blocks of 8, one rep.
std::unique_ptr<Model> TinyScaleModel() {
  const std::string dir = testing::TempDir() + "/m";
  RandomModelOptions random;
  random.shape = ShapeByName("llada-tiny");
  WriteRandomModel(dir, random);
  return Model::Load(dir);
}
ScaleOptions TinyScaleOptions() {
  ScaleOptions options;
  options.reps = 1;
  options.prompt_length = 8;
  options.base.gen_length = 32;
  options.base.block_length = 8;
  options.blocks = 4;
  return options;
}

// Where steps replay recordings (the CUDA backend's graphs), the dual-cache step is timed
// both ways: replayed, and with every op launched.
TEST(Scale, ARecordingBackendTimesTheDualStepBothWays) {
  if (const std::string why = testing::BackendUnavailable("cuda"); !why.empty()) {
    GTEST_SKIP() << "backend 'cuda' cannot run here: " << why;
  }
  auto model = TinyScaleModel();
  model->UseBackend(BackendNamed("cuda"));
  const ScaleOptions options = TinyScaleOptions();
  std::vector<std::string> kinds;
  int64_t dual_rows = -1, op_by_op_rows = -2;
  for (const StepTiming& s : TimeSteps(*model, options)) {
    kinds.push_back(s.kind);
    if (s.kind == "dual-cache step") dual_rows = s.rows_computed;
    if (s.kind == "dual-cache step, op by op") op_by_op_rows = s.rows_computed;
  }
  const auto dual = std::ranges::find(kinds, "dual-cache step");
  ASSERT_NE(dual, kinds.end());
  ASSERT_NE(dual + 1, kinds.end());
  EXPECT_EQ(dual[1], "dual-cache step, op by op");
  EXPECT_EQ(op_by_op_rows, dual_rows);
}

TEST(Scale, StepTimingsAndForcedRunsOnATinyRandomModel) {
  auto model = TinyScaleModel();
  ScaleOptions options = TinyScaleOptions();
  options.tokens_per_step = 2;
  options.max_steps = 0;
  options.policies = {"vanilla", "fast-dllm-prefix", "fast-dllm-dual", "elastic-cache", "polestar"};
  const std::vector<StepTiming> steps = TimeSteps(*model, options);
  auto rows = [&](const std::string& kind) {
    for (const StepTiming& s : steps) {
      if (s.kind == kind) return s.rows_computed;
    }
    return int64_t{-1};
  };
  // The last layer computes the logit rows alone: the block's 8.
  EXPECT_EQ(rows("full pass"), 40 + 8);
  EXPECT_EQ(rows("windowed pass"), 24 + 8);      // block 3: [start - 16, end), the canvas ends
  EXPECT_EQ(rows("prefix-cache step"), 20 + 8);  // blocks 1 and 2: 24 and 16 rows
  EXPECT_EQ(rows("dual-cache step"), 8 + 8);
  EXPECT_EQ(rows("dual-cache step, op by op"), -1);  // the CPU records no steps to replay
  // Block 2's window holds 24 rows in 8 clusters of 3: k clusters at layer 0; at the last
  // layer cluster 1, rows 3-5 of the prefix, which get no logits (only suffix rows would).
  EXPECT_EQ(rows("refresh step, k=4"), (8 + 12) + 8);
  EXPECT_EQ(rows("refresh step, k=1"), (8 + 3) + 8);
  const std::vector<ForcedRun> runs = RunForcedSchedule(*model, options);
  // The policies, then Polestar with each of its system parts switched on.
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(runs[5].policy, "polestar +nvfp4");
  EXPECT_EQ(runs[6].policy, "polestar +nvfp4 +offload");
  EXPECT_EQ(runs[7].policy, "polestar +overlap");
  for (const ForcedRun& r : runs) {
    EXPECT_TRUE(r.error.empty()) << r.policy << ": " << r.error;
    EXPECT_EQ(r.nfe, 4 * 4) << r.policy;
    EXPECT_EQ(r.tokens, 32) << r.policy;
    EXPECT_GT(r.seconds, 0);
  }
  // Polestar's block 3 starts with a windowed pass; its decode steps all refresh.
  EXPECT_EQ(runs[4].step_kinds["windowed pass"]["count"], 1);
  EXPECT_EQ(runs[4].step_kinds["full pass"]["count"], 3);
  EXPECT_EQ(runs[4].step_kinds["refresh step, k=4"]["count"], 12);
  for (size_t i = 5; i < runs.size(); ++i)
    EXPECT_EQ(runs[i].step_kinds["refresh step, k=4"]["count"], 12) << runs[i].policy;
  // The CPU counts no backend memory of its own (the resident set is the process's).
  EXPECT_EQ(runs[6].memory.peak, -1);
  // Fast-dLLM dual: a full pass at each block start, then the block alone.
  EXPECT_EQ(runs[2].step_kinds["full pass"]["count"], 4);
  EXPECT_EQ(runs[2].step_kinds["dual-cache step"]["count"], 12);
  // Bytes between host and backend, per kind of step: each kind counted once a step.
  for (const ForcedRun& r : runs) {
    int steps = 0;
    for (const auto& [kind, t] : r.transfers.items()) {
      steps += t["steps"].get<int>();
      EXPECT_GT(t["bytes_to_host"].get<int64_t>(), 0) << r.policy << " " << kind;
    }
    EXPECT_EQ(steps, r.nfe) << r.policy;
  }
  EXPECT_EQ(runs[2].transfers["dual-cache step"]["steps"], 12);
  for (const StepTiming& s : steps) EXPECT_GT(s.transfers.to_host, 0) << s.kind;
  EXPECT_GT(ProjectSeconds("polestar", 4, options, steps, nullptr), 0);
  EXPECT_LT(ProjectSeconds("unknown", 4, options, steps, nullptr), 0);
}

StepTiming Timed(const std::string& kind, double seconds, int64_t rows = 0) {
  return {kind, rows, {seconds}, {}};
}

TEST(Scale, ExtrapolatesEachStepLayerByLayer) {
  // 2 s fixed + 3 s a layer (full pass); 1 s + 0.5 s a layer (dual-cache step). The full
  // pass's last layer computes its 8 logit rows alone, the others all 100.
  const std::vector<StepTiming> at_one = {Timed("full pass", 5, 8),
                                          Timed("dual-cache step", 1.5, 8)};
  const std::vector<StepTiming> at_three = {Timed("dual-cache step", 2.5, 24),
                                            Timed("full pass", 11, 208)};
  const std::vector<StepTiming> at_32 = ExtrapolateLayers(at_one, 1, at_three, 3, 32);
  ASSERT_EQ(at_32.size(), 2u);
  EXPECT_EQ(at_32[0].kind, "full pass");
  EXPECT_DOUBLE_EQ(at_32[0].Median(), 2 + 3 * 32);
  EXPECT_EQ(at_32[0].rows_computed, 31 * 100 + 8);
  EXPECT_EQ(at_32[1].rows_computed, 32 * 8);
  EXPECT_DOUBLE_EQ(at_32[1].Median(), 1 + 0.5 * 32);
}

// Bytes alike: what a layer's hooks and drift ops move grows with the layers, the plan and the
// logits do not; and a mixture's experts read grow with its mixture layers.
TEST(Scale, ExtrapolatesEachStepsBytesLayerByLayer) {
  StepTiming at_two = Timed("refresh step, k=4", 1, 8), at_four = at_two;
  at_two.transfers = {100 + 2 * 30, 5000 + 2 * 700};  // 100 and 5000 fixed, 30 and 700 a layer
  at_four.transfers = {100 + 4 * 30, 5000 + 4 * 700};
  at_two.experts_read = (2 - 1) * 6.5;  // a mixture's after a dense layer: 6.5 a layer
  at_four.experts_read = (4 - 1) * 6.5;
  const std::vector<StepTiming> at_32 = ExtrapolateLayers({at_two}, 2, {at_four}, 4, 32);
  ASSERT_EQ(at_32.size(), 1u);
  EXPECT_EQ(at_32[0].transfers.to_backend, 100 + 32 * 30);
  EXPECT_EQ(at_32[0].transfers.to_host, 5000 + 32 * 700);
  EXPECT_DOUBLE_EQ(at_32[0].experts_read, (32 - 1) * 6.5);
}

TEST(Scale, PricesAStepMixKindByKind) {
  const std::vector<StepTiming> steps = {Timed("full pass", 10),
                                         Timed("windowed pass", 4),
                                         Timed("dual-cache step", 1),
                                         Timed("refresh step, k=4", 2),
                                         Timed("k-means (all layers)", 0.5),
                                         Timed("proxy attention (all layers)", 0.25)};
  EXPECT_DOUBLE_EQ(StepPrice("elastic-cache step", steps), 1);
  EXPECT_DOUBLE_EQ(StepPrice("refresh from layer 1 of 4", steps), 0.25 * 1 + 0.75 * 10);
  EXPECT_LT(StepPrice("prefix-cache step", steps), 0);  // not timed
  // A results.jsonl row of 2 items of gen 64 in blocks of 32: 4 blocks.
  const nlohmann::json row = {{"options", {{"gen_length", 64}, {"block_length", 32}}},
                              {"summary",
                               {{"items", 2},
                                {"step_kinds",
                                 {{"full pass", 3},
                                  {"windowed pass", 1},
                                  {"refresh step, k=4", 8},
                                  {"dual-cache step", 4}}}}}};
  const std::map<std::string, double> mix = StepsPerBlock(row);
  EXPECT_DOUBLE_EQ(mix.at("full pass"), 0.75);
  EXPECT_DOUBLE_EQ(mix.at("refresh step, k=4"), 2);
  ScaleOptions options;
  options.base.gen_length = 256;
  options.base.block_length = 32;
  // 8 blocks x (0.75 x 10 + 0.25 x 4 + 2 x (2 + 0.25) + 1 x 1 + 0.5 k-means).
  EXPECT_DOUBLE_EQ(ProjectStepMixSeconds("polestar", mix, options, steps),
                   8 * (7.5 + 1 + 4.5 + 1 + 0.5));
  // Another policy pays no Polestar overheads.
  EXPECT_DOUBLE_EQ(
      ProjectStepMixSeconds("other", {{"full pass", 1}, {"dual-cache step", 3}}, options, steps),
      8 * (10 + 3));
  EXPECT_LT(ProjectStepMixSeconds("other", {{"prefix-cache step", 1}}, options, steps), 0);
  EXPECT_TRUE(StepsPerBlock({{"options", row["options"]}, {"summary", {{"items", 2}}}}).empty());
}

// --fit-layers on a mixture: the routed experts' bytes are the shape's (llada-moe-tiny: 3 layers,
// the first dense, so 2 mixture layers of 8 experts), not the larger fit's (1 mixture layer of
// its 2), and the extrapolated steps keep the experts they read.
TEST(Scale, AMixturesLayerFitCountsTheShapesExperts) {
  ScaleOptions options;
  options.like = "llada-moe-tiny";
  options.fit_layers = {1, 2};
  options.out_dir = testing::TempDir() + "/out";
  options.reps = 1;
  options.prompt_length = 8;
  options.base.gen_length = 32;
  options.base.block_length = 8;
  options.progress = false;
  options.backend = &BackendNamed("cpu:isa=scalar");
  const nlohmann::json out = RunScaleBenchmark(options, MachineInfo{});
  ASSERT_EQ(out["model"]["layers"], 3);
  ASSERT_EQ(out["model"]["experts"], 8);
  EXPECT_EQ(out["model"]["routed_expert_bytes"],
            2 * 8 * out["model"]["expert_bytes"].get<int64_t>());
  for (const auto& step : out["steps"]) {
    if (step["rows_computed"].get<int64_t>() > 0) {
      EXPECT_GT(step["experts_read"].get<double>(), 0) << step.dump();
    }
  }
}

// Bad --fit-layers and --prompt-suite requests are refused before any checkpoint is written.
TEST(Scale, RefusesBadLayerFitsAndPromptSuitesBeforeAnyWork) {
  ScaleOptions options;
  options.like = "llada-tiny";  // 2 layers
  options.progress = false;
  options.model_dir = testing::TempDir() + "/never-written";
  for (const std::vector<int>& fit : {std::vector<int>{1}, {2, 1}, {0, 2}, {1, 3}}) {
    options.fit_layers = fit;
    EXPECT_THAT([&] { RunScaleBenchmark(options, MachineInfo{}); },
                testing::ThrowsErrorContaining({"--fit-layers takes two layer counts"}));
  }
  options.fit_layers = {1, 2};
  EXPECT_THAT([&] { RunScaleBenchmark(options, MachineInfo{}); },
              testing::ThrowsErrorContaining({"drop --random-model"}));
  options.fit_layers.clear();
  options.prompt_suite = "gsm8k";
  EXPECT_THAT([&] { RunScaleBenchmark(options, MachineInfo{}); },
              testing::ThrowsErrorContaining({"--prompt-tokenizer"}));
  options.prompt_tokenizer = WriteByteLevelModel(testing::TempDir() + "/tok");
  options.prompt_suite = "nope";
  EXPECT_THAT([&] { RunScaleBenchmark(options, MachineInfo{}); },
              testing::ThrowsErrorContaining({"nope"}));
  EXPECT_FALSE(std::filesystem::exists(options.model_dir));
}

TEST(Scale, PaperRowsAreTable1AndPromptLengthsComeFromTheSuite) {
  const std::span<const PaperRow> rows = PaperGsm8kRows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_STREQ(rows[3].policy, "polestar");
  EXPECT_DOUBLE_EQ(rows[3].tpf, 3.67);
  EXPECT_NEAR(rows[3].tps / rows[1].tps, 1.83, 0.005);  // the ratios the issue quotes
  EXPECT_NEAR(rows[2].tps / rows[1].tps, 1.15, 0.005);
  // A byte-level tokenizer without merges: one token per byte of each 5-shot prompt.
  const std::string dir = WriteByteLevelModel(testing::TempDir() + "/m");
  const PromptLengths lengths = SuitePromptLengths("gsm8k", dir, "");
  const eval::Suite suite = eval::LoadSuite("gsm8k", eval::DefaultDataDir());
  ASSERT_EQ(lengths.items, int(suite.items.size()));
  double sum = 0;
  size_t low = SIZE_MAX, high = 0;
  for (const eval::EvalItem& item : suite.items) {
    sum += double(item.prompt.size());
    low = std::min(low, item.prompt.size());
    high = std::max(high, item.prompt.size());
  }
  EXPECT_DOUBLE_EQ(lengths.mean, sum / double(suite.items.size()));
  EXPECT_EQ(size_t(lengths.min), low);
  EXPECT_EQ(size_t(lengths.max), high);
  EXPECT_THAT([&] { SuitePromptLengths("gsm8k", testing::TempDir() + "/none", ""); },
              testing::ThrowsErrorContaining({"none"}));
}

}  // namespace
}  // namespace polestar::bench
