// Graders and suites: answer extraction against hand-picked right and wrong answers, the
// datasets' own solutions graded as correct, and the code sandbox against programs that pass,
// fail, hang, crash and leave early.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "eval/answers.h"
#include "eval/code_tasks.h"
#include "eval/sandbox.h"
#include "eval/suite.h"
#include "test_support.h"

namespace polestar::eval {
namespace {

namespace fs = std::filesystem;

std::string RepoData() { return polestar::testing::SourceDir() + "/data"; }

const EvalItem& FindItem(const Suite& suite, const std::string& id) {
  for (const EvalItem& item : suite.items) {
    if (item.id == id) return item;
  }
  ADD_FAILURE() << "no item " << id;
  return suite.items.front();
}

// ---- GSM8K extraction ---------------------------------------------------------------------

TEST(Gsm8kExtraction, StrictTakesTheNumberAfterTheFirstMarker) {
  EXPECT_EQ(ExtractGsm8kStrict("She makes 9 * 2 = 18.\n#### 18"), "18");
  EXPECT_EQ(ExtractGsm8kStrict("#### 1,234\n#### 99"), "1,234");
  EXPECT_EQ(ExtractGsm8kStrict("loss\n#### -3"), "-3");
  EXPECT_EQ(ExtractGsm8kStrict("#### none here\n#### 7"), "7");
  // lm-eval's strict pattern allows no "$" and needs the space after the marker.
  EXPECT_EQ(ExtractGsm8kStrict("#### $18"), std::nullopt);
  EXPECT_EQ(ExtractGsm8kStrict("####18"), std::nullopt);
  EXPECT_EQ(ExtractGsm8kStrict("The answer is 18."), std::nullopt);
}

TEST(Gsm8kExtraction, FlexibleTakesTheLastNumber) {
  EXPECT_EQ(ExtractGsm8kFlexible("3 + 4 = 7"), "7");
  EXPECT_EQ(ExtractGsm8kFlexible("She pays $18.00."), "$18.00.");
  EXPECT_EQ(ExtractGsm8kFlexible("It costs 18 dollars"), "18");
  EXPECT_EQ(ExtractGsm8kFlexible("In total 1,234 apples"), "1,234");
  EXPECT_EQ(ExtractGsm8kFlexible("He lost -5 points"), "-5");
  EXPECT_EQ(ExtractGsm8kFlexible("2 apples and 3 pears\n#### 5"), "5");
  // A digit-free run such as "..." is not an answer (lm-eval would take it).
  EXPECT_EQ(ExtractGsm8kFlexible("So it is 12. Done..."), "12.");
  EXPECT_EQ(ExtractGsm8kFlexible("no numbers at all"), std::nullopt);
}

TEST(Gsm8kExtraction, NumbersCompareAfterNormalisation) {
  EXPECT_EQ(NormalizeNumber("$1,234.00"), "1234");
  EXPECT_EQ(NormalizeNumber("018.50"), "18.5");
  EXPECT_EQ(NormalizeNumber("-0.0"), "0");
  EXPECT_EQ(NormalizeNumber("5."), "5");
  EXPECT_TRUE(NumbersEqual("1,234", "1234"));
  EXPECT_TRUE(NumbersEqual("$18.00.", "18"));
  EXPECT_TRUE(NumbersEqual("-3", "-3"));
  EXPECT_FALSE(NumbersEqual("-3", "3"));
  EXPECT_FALSE(NumbersEqual("18.5", "18"));
  EXPECT_FALSE(NumbersEqual("1.234", "1234"));
  EXPECT_FALSE(NumbersEqual("17", "18"));
}

// ---- MATH extraction and normalisation ----------------------------------------------------

TEST(MathExtraction, LastBoxedKeepsNestedBraces) {
  EXPECT_EQ(LastBoxedContent("so $\\boxed{\\frac{1}{2}}$."), "\\frac{1}{2}");
  EXPECT_EQ(LastBoxedContent("\\boxed{\\frac{\\sqrt{3}}{2}}"), "\\frac{\\sqrt{3}}{2}");
  EXPECT_EQ(LastBoxedContent("\\boxed{\\text{(A)}}"), "\\text{(A)}");
  EXPECT_EQ(LastBoxedContent("first \\boxed{1}, then \\boxed{2}"), "2");
  EXPECT_EQ(LastBoxedContent("\\boxed{\\{1,2\\}}"), "\\{1,2\\}");
  EXPECT_EQ(LastBoxedContent("\\fbox{3}"), "3");
  EXPECT_EQ(LastBoxedContent("$\\boxed 5$"), "5");
  EXPECT_EQ(LastBoxedContent("\\boxed{1} and a cut-off \\boxed{\\frac{1}{2"), std::nullopt);
  EXPECT_EQ(LastBoxedContent("The answer is 5."), std::nullopt);
}

TEST(MathExtraction, EquivalentFormsAreEqual) {
  const std::vector<std::pair<std::string, std::string>> equal = {
      {"\\frac12", "\\frac{1}{2}"},
      {"0.5", "\\frac{1}{2}"},
      {"1/2", "\\dfrac{1}{2}"},
      {"-\\frac{2}{3}", "\\frac{-2}{3}"},
      {"\\frac 59", "\\frac{5}{9}"},
      {"\\frac9{19}", "\\frac{9}{19}"},
      {"\\text{(A)}", "(A)"},
      {"A", "\\text{(A)}"},
      {"\\text{Evelyn}", "Evelyn"},
      {"10,\\!080", "10080"},
      {"11,\\! 111,\\! 111,\\! 100", "11111111100"},
      {"\\$32,\\!348", "32348"},
      {"90^\\circ", "90"},
      {"90", "90^{\\circ}"},
      {"5.4 \\text{ cents}", "5.4"},
      {"864 \\mbox{ inches}^2", "864"},
      {"18 dollars", "18"},
      {"\\$18.90", "18.9"},
      {"18.00", "18"},
      {"50\\%", "50"},
      {"x=5", "5"},
      {"y = 2x + 3", "2x+3"},
      {"x \\in [-2,7]", "[-2,7]"},
      {"\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"},
      {"\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"},
      {"11\\sqrt2", "11\\sqrt{2}"},
      {".0000672", "0.0000672"},
      {"\\boxed{7}", "7"},
      {"\\tfrac{3}{4}.", "\\frac34"},
  };
  for (const auto& [answer, reference] : equal) {
    EXPECT_TRUE(MathAnswersEqual(answer, reference))
        << answer << " vs " << reference << ": " << NormalizeMathAnswer(answer) << " vs "
        << NormalizeMathAnswer(reference);
  }
}

TEST(MathExtraction, DifferentAnswersAreNotEqual) {
  const std::vector<std::pair<std::string, std::string>> different = {
      {"3", "4"},
      {"\\frac{1}{3}", "\\frac{1}{2}"},
      {"0.33", "\\frac{1}{3}"},
      {"(1,2)", "(2,1)"},
      {"1,2", "12"},
      {"x+1", "x-1"},
      {"2\\sqrt{2}", "\\sqrt{8}"},  // no symbolic algebra
      {"\\text{(B)}", "\\text{(A)}"},
      {"", "5"},
      {"-5", "5"},
  };
  for (const auto& [answer, reference] : different) {
    EXPECT_FALSE(MathAnswersEqual(answer, reference))
        << answer << " vs " << reference << ": " << NormalizeMathAnswer(answer) << " vs "
        << NormalizeMathAnswer(reference);
  }
}

// ---- suites -------------------------------------------------------------------------------

TEST(Suites, Gsm8kIsFiveShotAndItsOwnSolutionsGradeCorrect) {
  const Suite suite = LoadSuite("gsm8k", RepoData());
  ASSERT_EQ(suite.items.size(), 1319u);
  EXPECT_EQ(suite.full_size, 1319u);
  EXPECT_EQ(suite.metric_names, (std::vector<std::string>{"flexible_extract", "strict_match"}));
  const EvalItem& first = suite.items[0];
  EXPECT_EQ(first.id, "gsm8k/0");
  EXPECT_EQ(first.reference, "18");
  EXPECT_EQ(first.prompt.rfind("Question: Natalia sold clips", 0), 0u);
  EXPECT_NE(first.prompt.find("\nAnswer: Natalia sold 48/2 = <<48/2=24>>24 clips"),
            std::string::npos);
  EXPECT_TRUE(
      first.prompt.ends_with("\n\nQuestion: Janet\u2019s ducks lay 16 eggs per day. She eats "
                             "three for breakfast every morning and bakes muffins for her "
                             "friends every day with four. She sells the remainder at the "
                             "farmers' market daily for $2 per fresh duck egg. How much in "
                             "dollars does she make every day at the farmers' market?"
                             "\nAnswer:"));
  std::size_t questions = 0;
  for (std::size_t pos = first.prompt.find("Question:"); pos != std::string::npos;
       pos = first.prompt.find("Question:", pos + 1)) {
    ++questions;
  }
  EXPECT_EQ(questions, 6u);
  ASSERT_EQ(first.messages.size(), 11u);
  EXPECT_EQ(first.messages[1].role, "assistant");
  EXPECT_EQ(first.messages[10].content.rfind("Question: Janet", 0), 0u);

  ScoreBoard own, wrong;
  for (const EvalItem& item : suite.items) {
    const std::string solution = item.extra.at("solution").get<std::string>();
    own.Add(suite.Grade(item, " " + solution + "\n\nQuestion: next #### 0"));
    wrong.Add(suite.Grade(item, solution + "1"));  // "#### 18" -> "#### 181"
  }
  EXPECT_EQ(own.correct("flexible_extract"), 1319u);
  EXPECT_EQ(own.correct("strict_match"), 1319u);
  EXPECT_EQ(wrong.correct("flexible_extract"), 0u);
  EXPECT_EQ(wrong.correct("strict_match"), 0u);
  EXPECT_DOUBLE_EQ(own.ToJson()["metrics"]["strict_match"]["accuracy"].get<double>(), 1.0);

  const GradeResult loose = suite.Grade(first, " She makes $18.00 every day.");
  EXPECT_TRUE(loose.correct);
  EXPECT_EQ(loose.extracted, "$18.00");
  EXPECT_FALSE(loose.metrics[1].correct);  // no "#### "
  const GradeResult negative = suite.Grade(first, " She loses money.\n#### -18");
  EXPECT_FALSE(negative.metrics[0].correct);
  EXPECT_FALSE(negative.metrics[1].correct);
}

TEST(Suites, Math500OwnSolutionsGradeCorrectAndWrongBoxesDoNot) {
  const Suite suite = LoadSuite("math500", RepoData());
  ASSERT_EQ(suite.items.size(), 500u);
  const EvalItem& first = suite.items[0];
  EXPECT_EQ(first.id, "test/precalculus/807.json");
  EXPECT_TRUE(first.prompt.ends_with("within \\boxed{}."));
  ScoreBoard own, wrong;
  for (const EvalItem& item : suite.items) {
    const std::string solution = item.extra.at("solution").get<std::string>();
    own.Add(suite.Grade(item, solution));
    wrong.Add(suite.Grade(item, solution + " Or rather $\\boxed{\\frac{1}{1000003}}$."));
  }
  EXPECT_EQ(own.correct("boxed_match"), 500u);
  EXPECT_EQ(wrong.correct("boxed_match"), 0u);
  const GradeResult none = suite.Grade(first, "The point is (3, pi/2).");
  EXPECT_FALSE(none.correct);
  EXPECT_EQ(none.extracted, "");
}

TEST(Suites, MbppIsThreeShotOverTasks11To510) {
  const Suite suite = LoadSuite("mbpp", RepoData());
  ASSERT_EQ(suite.items.size(), 500u);
  EXPECT_EQ(suite.items.front().id, "mbpp/11");
  EXPECT_EQ(suite.items.back().id, "mbpp/510");
  const EvalItem& item = suite.items.front();
  EXPECT_EQ(
      item.prompt.rfind("You are an expert Python programmer, and here is your task: Write a "
                        "function to find the similar elements from the given two tuple "
                        "lists. Your code should pass these tests:\n\nassert similar_elements(",
                        0),
      0u);
  EXPECT_NE(item.prompt.find("[BEGIN]\ndef similar_elements(test_tup1, test_tup2):\r\n"),
            std::string::npos);
  EXPECT_NE(item.prompt.find("return largest_nums\n[DONE]\n\nYou are an expert"),
            std::string::npos);
  EXPECT_TRUE(item.prompt.ends_with("assert remove_Occ(\"PHP\",\"P\") == \"H\"\n[BEGIN]\n"));
  EXPECT_EQ(item.messages.size(), 7u);
}

TEST(Suites, LimitAndShardSplitTheRunIntoDisjointSlices) {
  LoadOptions options;
  options.limit = 10;
  std::vector<std::string> ids;
  for (int shard = 0; shard < 3; ++shard) {
    options.shard_index = shard;
    options.shard_count = 3;
    const Suite suite = LoadSuite("gsm8k", RepoData(), options);
    EXPECT_EQ(suite.full_size, 1319u);
    EXPECT_EQ(suite.items.size(), shard == 2 ? 4u : 3u);
    for (const EvalItem& item : suite.items) ids.push_back(item.id);
  }
  std::vector<std::string> expected;
  for (int i = 0; i < 10; ++i) expected.push_back("gsm8k/" + std::to_string(i));
  EXPECT_EQ(ids, expected);

  int index = -1, count = -1;
  ParseShard("2/4", &index, &count);
  EXPECT_EQ(index, 2);
  EXPECT_EQ(count, 4);
  for (const char* bad : {"4/4", "-1/4", "1", "a/b", "1/0", "1/4x"}) {
    EXPECT_THROW(ParseShard(bad, &index, &count), Error) << bad;
  }
}

// --limit N samples every task: the tasks take turns giving their next item, kept in order.
TEST(Suites, LimitTakesItemsFromEveryTaskInTurn) {
  const std::vector<std::string> grouped = {"a", "a", "a", "b", "c", "c"};
  EXPECT_EQ(LimitedIndices(grouped, 4), (std::vector<std::size_t>{0, 1, 3, 4}));
  EXPECT_EQ(LimitedIndices(grouped, 2), (std::vector<std::size_t>{0, 3}));
  EXPECT_EQ(LimitedIndices(grouped, 5), (std::vector<std::size_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(LimitedIndices(grouped, 0), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(LimitedIndices(grouped, 9), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5}));
  const std::vector<std::string> mixed = {"x", "y", "x", "x", "y"};
  EXPECT_EQ(LimitedIndices(mixed, 3), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(LimitedIndices(mixed, 4), (std::vector<std::size_t>{0, 1, 2, 4}));

  // Through LimitAndShard: the limited items, then the shard of them.
  std::vector<std::string> items = {"a/0", "a/1", "a/2", "b/0", "c/0", "c/1"};
  LoadOptions options;
  options.limit = 4;
  auto task_of = [](const std::string& id) { return id.substr(0, 1); };
  EXPECT_EQ(LimitAndShard(items, options, task_of),
            (std::vector<std::string>{"a/0", "a/1", "b/0", "c/0"}));
  options.shard_index = 1;
  options.shard_count = 2;
  EXPECT_EQ(LimitAndShard(items, options, task_of), (std::vector<std::string>{"b/0", "c/0"}));
}

TEST(Suites, BadNamesAndFilesAreClearErrors) {
  EXPECT_THAT([] { LoadSuite("tiny", RepoData()); },
              testing::ThrowsErrorContaining({"known: gsm8k, math500"}));
  EXPECT_THAT([] { LoadSuite("gsm8k", "/nonexistent/data"); },
              testing::ThrowsErrorContaining({"/nonexistent/data"}));
  const std::string dir = polestar::testing::TempDir();
  std::ofstream(dir + "/math500_test.jsonl") << "{\"problem\": \"1+1\"}\n";
  EXPECT_THAT([&] { LoadSuite("math500", dir); },
              testing::ThrowsErrorContaining({"math500_test.jsonl:1: missing string"}));
  std::ofstream(dir + "/math500_test.jsonl") << "\n{not json\n";
  EXPECT_THAT([&] { LoadSuite("math500", dir); },
              testing::ThrowsErrorContaining({"math500_test.jsonl:2: invalid JSON"}));
  std::ofstream(dir + "/HumanEval.jsonl.gz") << "";
  EXPECT_THAT([&] { LoadSuite("humaneval", dir); }, testing::ThrowsErrorContaining({"gunzip"}));
}

// The repository holds prefixes of the shared files: loading either gives the same suites.
TEST(Suites, RepositoryDataMatchesTheSharedCopies) {
  const std::string shared = polestar::testing::SharedDir() + "/data";
  if (!fs::exists(shared + "/mbpp.jsonl")) GTEST_SKIP() << "no " << shared;
  for (const char* name : {"gsm8k", "mbpp"}) {
    LoadOptions options;
    options.limit = 50;
    const Suite ours = LoadSuite(name, RepoData(), options);
    const Suite theirs = LoadSuite(name, shared, options);
    ASSERT_EQ(ours.items.size(), theirs.items.size());
    for (std::size_t i = 0; i < ours.items.size(); ++i) {
      EXPECT_EQ(ours.items[i].prompt, theirs.items[i].prompt) << name << " " << i;
    }
  }
}

// ---- sandbox and code suites --------------------------------------------------------------

SandboxOptions FastOptions() {
  SandboxOptions options;
  options.wall_timeout_s = 2.0;
  options.memory_limit_bytes = std::uint64_t{1} << 30;
  return options;
}

class HumanEvalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions options;
    options.sandbox = FastOptions();
    suite_ = new Suite(LoadSuite("humaneval", RepoData(), options));
  }
  static void TearDownTestSuite() { delete suite_; }
  // HumanEval/0: has_close_elements(numbers, threshold).
  const EvalItem& First() const { return suite_->items.front(); }
  static Suite* suite_;
};
Suite* HumanEvalTest::suite_ = nullptr;

TEST_F(HumanEvalTest, CanonicalSolutionsPass) {
  ASSERT_EQ(suite_->items.size(), 164u);
  for (std::size_t i = 0; i < suite_->items.size(); i += 16) {
    const EvalItem& item = suite_->items[i];
    const GradeResult result = suite_->Grade(item, item.reference);
    EXPECT_TRUE(result.correct) << item.id << ": " << result.details.dump(2);
    EXPECT_EQ(result.details["status"], "passed");
  }
}

TEST_F(HumanEvalTest, WrongSolutionFails) {
  const GradeResult result = suite_->Grade(First(), "    return False\n");
  EXPECT_FALSE(result.correct);
  EXPECT_EQ(result.details["status"], "failed");
  EXPECT_NE(result.details["stderr"].get<std::string>().find("AssertionError"), std::string::npos);
}

TEST_F(HumanEvalTest, InfiniteLoopTimesOut) {
  const GradeResult result = suite_->Grade(First(), "    while True:\n        pass\n");
  EXPECT_FALSE(result.correct);
  EXPECT_EQ(result.details["status"], "timed_out");
  EXPECT_GE(result.details["seconds"].get<double>(), 1.9);
  EXPECT_LT(result.details["seconds"].get<double>(), 3.5);
}

TEST_F(HumanEvalTest, BusyLoopStopsAtTheCpuLimit) {
  LoadOptions options;
  options.limit = 1;
  options.sandbox.wall_timeout_s = 30.0;
  options.sandbox.cpu_limit_s = 1.0;
  const Suite suite = LoadSuite("humaneval", RepoData(), options);
  const GradeResult result = suite.Grade(suite.items[0], "    while True:\n        pass\n");
  EXPECT_EQ(result.details["status"], "timed_out");
  EXPECT_EQ(result.details["signal"], SIGXCPU);
  EXPECT_LT(result.details["seconds"].get<double>(), 10.0);
}

TEST_F(HumanEvalTest, LeavingTheInterpreterEarlyFails) {
  for (const char* exit_call : {"sys.exit(0)", "os._exit(0)", "raise SystemExit"}) {
    const GradeResult result =
        suite_->Grade(First(), std::string("    import os, sys\n    ") + exit_call + "\n");
    EXPECT_FALSE(result.correct) << exit_call;
    EXPECT_EQ(result.details["status"], "exited_early") << exit_call;
    EXPECT_EQ(result.details["exit_code"], 0) << exit_call;
  }
  const GradeResult crash =
      suite_->Grade(First(), "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n");
  EXPECT_EQ(crash.details["status"], "signaled");
  EXPECT_EQ(crash.details["signal"], SIGSEGV);
}

TEST_F(HumanEvalTest, MemoryLimitTurnsAHogIntoAFailure) {
  const GradeResult result =
      suite_->Grade(First(), "    block = bytearray(4 * 1024 ** 3)\n    return True\n");
  EXPECT_EQ(result.details["status"], "failed");
  EXPECT_NE(result.details["stderr"].get<std::string>().find("MemoryError"), std::string::npos);
}

TEST_F(HumanEvalTest, CompletionIsCutAtStopSequences) {
  const std::string solution = First().reference;
  // Without the cut at "\nif" this top-level statement would fail the run.
  const GradeResult cut =
      suite_->Grade(First(), solution + "\nif True:\n    raise SystemExit(1)\n");
  EXPECT_TRUE(cut.correct) << cut.details.dump(2);
  EXPECT_EQ(cut.extracted, solution);
  EXPECT_EQ(HumanEvalCode("    return 1\n\n\ndef helper():\n    pass\n", "f"), "    return 1\n\n");
  EXPECT_EQ(HumanEvalCode("    return 1\n# trailing comment\nprint(2)", "f"), "    return 1");
}

TEST_F(HumanEvalTest, FencedWholeFunctionFromAnInstructModelPasses) {
  const std::string completion =
      "Here is the function:\n```python\n"
      "def has_close_elements(numbers, threshold):\n"
      "    return any(abs(a - b) < threshold\n"
      "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
      "```\nIt compares every pair.";
  const GradeResult result = suite_->Grade(First(), completion);
  EXPECT_TRUE(result.correct) << result.details.dump(2);
  EXPECT_EQ(FirstFencedBlock("```\nx = 1\n```"), "x = 1\n");
  EXPECT_EQ(FirstFencedBlock("```python\nx = 1"), "x = 1");
  EXPECT_EQ(FirstFencedBlock("no fence"), std::nullopt);
}

TEST(Mbpp, ReferenceCodePassesAndWrongCodeFails) {
  LoadOptions options;
  options.limit = 6;
  options.sandbox = FastOptions();
  const Suite suite = LoadSuite("mbpp", RepoData(), options);
  for (const EvalItem& item : suite.items) {
    const GradeResult result = suite.Grade(item, item.reference + "\n[DONE]\n\nYou are an");
    EXPECT_TRUE(result.correct) << item.id << ": " << result.details.dump(2);
  }
  const EvalItem& item = FindItem(suite, "mbpp/11");  // remove_Occ(s, ch)
  const GradeResult wrong = suite.Grade(item, "def remove_Occ(s, ch):\n    return s\n[DONE]");
  EXPECT_FALSE(wrong.correct);
  EXPECT_EQ(wrong.details["status"], "failed");
  const GradeResult fenced =
      suite.Grade(item,
                  "[BEGIN]\n```python\ndef remove_Occ(s, ch):\n    s = s.replace(ch, '', 1)\n"
                  "    i = s.rfind(ch)\n    return s if i < 0 else s[:i] + s[i + 1:]\n```\n[DONE]");
  EXPECT_TRUE(fenced.correct) << fenced.details.dump(2);
  const GradeResult hang = suite.Grade(item, "import time\ntime.sleep(60)\n[DONE]");
  EXPECT_EQ(hang.details["status"], "timed_out");
}

TEST(Sandbox, OutputIsCapturedAndTruncated) {
  SandboxOptions options = FastOptions();
  options.output_limit_bytes = 1000;
  const SandboxResult result =
      RunPython("import sys\nprint('x' * 100000)\nsys.stderr.write('oops')\n", options);
  EXPECT_EQ(result.kind, ExitKind::kExited);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.stdout_text, std::string(1000, 'x'));
  EXPECT_TRUE(result.stdout_truncated);
  EXPECT_EQ(result.stderr_text, "oops");
  EXPECT_FALSE(result.stderr_truncated);
}

TEST(Sandbox, RunsInAFreshFolderWithAClosedEnvironment) {
  const std::string program =
      "import os\nprint(os.getcwd())\nprint(os.environ.get('POLESTAR_SHARED'))\n"
      "print(os.path.exists('left-behind'))\nopen('left-behind', 'w').write('x')\n";
  const SandboxResult first = RunPython(program, FastOptions());
  EXPECT_EQ(first.stdout_text, "/tmp/polestar-sandbox\nNone\nFalse\n") << first.stderr_text;
  const SandboxResult second = RunPython(program, FastOptions());
  EXPECT_EQ(second.stdout_text, first.stdout_text) << second.stderr_text;
}

// A unique name for files and processes of one test (a process name keeps 15 characters).
std::string Marker(const char* what) { return what + std::to_string(getpid()); }

bool ProcessNamedExists(const std::string& name) {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator("/proc", ignored)) {
    std::ifstream comm(entry.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) return true;
  }
  return false;
}

// No process is called `name` within a second: the kernel tears a PID namespace down after its
// init exits, not at once.
bool ProcessNamedEnds(const std::string& name) {
  for (int tries = 0; tries < 50; ++tries) {
    if (!ProcessNamedExists(name)) return true;
    usleep(20000);
  }
  return false;
}

TEST(Sandbox, WritesOutsideItsOwnFoldersDoNotReachTheHost) {
  const std::string name = Marker("polestar-escape-");
  const char* home = std::getenv("HOME");
  // The user's home, the repository, the build tree (under /work here) and the host's /tmp.
  const std::vector<std::string> targets = {
      std::string(home != nullptr ? home : "/root") + "/" + name,
      polestar::testing::SourceDir() + "/" + name, (fs::current_path() / name).string(),
      "/tmp/" + name};
  std::string program = "for path in [";
  for (const std::string& target : targets) program += "'" + target + "', ";
  program +=
      "]:\n"
      "    try:\n"
      "        open(path, 'w').write('escaped')\n"
      "        print('wrote', path)\n"
      "    except OSError as error:\n"
      "        print('refused', path, error.errno)\n";
  const SandboxResult result = RunPython(program, FastOptions());
  for (const std::string& target : targets) {
    EXPECT_FALSE(fs::exists(target)) << target << "\n" << result.stdout_text;
    std::error_code ignored;
    fs::remove(target, ignored);
  }
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  // The host's /tmp is the sandbox's private one: the write succeeded there and vanished.
  EXPECT_NE(result.stdout_text.find("wrote " + targets.back()), std::string::npos)
      << result.stdout_text;
}

TEST(Sandbox, HostFilesAreOutOfSight) {
  const std::string secret = Marker("secret-");
  const fs::path secret_file = fs::current_path() / (secret + ".txt");
  std::ofstream(secret_file) << secret;
  const SandboxResult result = RunPython(
      "import os\n"
      "for path in ['" +
          secret_file.string() + "', '" + polestar::testing::SourceDir() +
          "/README.md', '/etc/shadow', '/root/.bash_history']:\n"
          "    try:\n"
          "        print(path, open(path).read(200))\n"
          "    except OSError as error:\n"
          "        print(path, 'unreadable', error.errno)\n"
          "print(sorted(os.listdir('/')))\n",
      FastOptions());
  fs::remove(secret_file);
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stdout_text.find(secret + "\n"), std::string::npos) << result.stdout_text;
  EXPECT_EQ(result.stdout_text.find("Polestar"), std::string::npos) << result.stdout_text;
  EXPECT_NE(result.stdout_text.find(secret_file.string() + " unreadable 2\n"), std::string::npos)
      << result.stdout_text;
  // Nothing of the host's top level beyond the system's folders.
  for (const char* hidden : {"'home'", "'work'", "'run'", "'var'", "'opt'", "'mnt'"}) {
    EXPECT_EQ(result.stdout_text.find(hidden), std::string::npos) << result.stdout_text;
  }
}

TEST(Sandbox, TheHostsLoopbackIsUnreachable) {
  // A server on the host's loopback, as a local service the program might talk to.
  const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(server, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(server, 4), 0);
  ASSERT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string port = std::to_string(ntohs(address.sin_port));
  const SandboxResult result = RunPython(
      "import socket\n"
      "for host, port in [('127.0.0.1', " +
          port +
          "), ('1.1.1.1', 53)]:\n"
          "    try:\n"
          "        socket.create_connection((host, port), timeout=1).sendall(b'secret')\n"
          "        print('connected', host)\n"
          "    except OSError:\n"
          "        print('refused', host)\n",
      FastOptions());
  pollfd pending{server, POLLIN, 0};
  const int ready = poll(&pending, 1, 0);
  close(server);
  EXPECT_EQ(ready, 0) << "the program reached the host's listening socket";
  EXPECT_EQ(result.stdout_text, "refused 127.0.0.1\nrefused 1.1.1.1\n") << result.stderr_text;
}

TEST(Sandbox, ForkBombStopsAtTheProcessLimit) {
  SandboxOptions options = FastOptions();
  options.process_limit = 16;
  const std::string name = Marker("ps-bomb-");
  // Bounded at 1000 so that a missing limit fails the test rather than the machine.
  const SandboxResult result = RunPython(
      "import os, time\n"
      "children = 0\n"
      "try:\n"
      "    while children < 1000:\n"
      "        if os.fork() == 0:\n"
      "            open('/proc/self/comm', 'w').write('" +
          name +
          "')\n"
          "            time.sleep(60)\n"
          "            os._exit(0)\n"
          "        children += 1\n"
          "except OSError:\n"
          "    pass\n"
          "print(children)\n",
      options);
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const int children = std::stoi(result.stdout_text);
  EXPECT_GE(children, 1);
  EXPECT_LT(children, options.process_limit);
  EXPECT_LT(result.wall_seconds, 1.9);  // ended by the program, not the deadline
  EXPECT_TRUE(ProcessNamedEnds(name));  // the sleeping children went with it
}

TEST(Sandbox, EscapedChildrenDieAtTheDeadline) {
  SandboxOptions options = FastOptions();
  options.wall_timeout_s = 1.0;
  const std::string name = Marker("ps-escape-");
  // The child leaves the process group and the session; the parent sleeps past the deadline.
  const SandboxResult result = RunPython(
      "import os, time\n"
      "if os.fork() == 0:\n"
      "    os.setsid()\n"
      "    open('/proc/self/comm', 'w').write('" +
          name +
          "')\n"
          "    time.sleep(600)\n"
          "time.sleep(600)\n",
      options);
  EXPECT_EQ(result.kind, ExitKind::kTimedOut);
  EXPECT_LT(result.wall_seconds, 2.5);
  EXPECT_TRUE(ProcessNamedEnds(name));
}

TEST(Sandbox, ExitStatusesAndSignalsReadAsThemselves) {
  const SandboxResult exited = RunPython("import sys\nsys.exit(3)\n", FastOptions());
  EXPECT_EQ(exited.kind, ExitKind::kExited);
  EXPECT_EQ(exited.exit_code, 3);
  const SandboxResult killed =
      RunPython("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)\n", FastOptions());
  EXPECT_EQ(killed.kind, ExitKind::kSignaled);
  EXPECT_EQ(killed.signal, SIGABRT);
}

TEST(Sandbox, RunsWithoutPrivileges) {
  const SandboxResult result = RunPython(
      "for line in open('/proc/self/status'):\n"
      "    if line.split(':')[0] in ('Uid', 'CapEff', 'CapPrm', 'NoNewPrivs'):\n"
      "        print(line.split()[1])\n",
      FastOptions());
  // Uid (real), CapPrm, CapEff, NoNewPrivs in /proc's order.
  const std::string uid = geteuid() == 0 ? "65534" : std::to_string(geteuid());
  EXPECT_EQ(result.stdout_text, uid + "\n0000000000000000\n0000000000000000\n1\n")
      << result.stderr_text;
}

TEST(Sandbox, EndlessOutputStillMeetsTheDeadline) {
  SandboxOptions options = FastOptions();
  options.wall_timeout_s = 1.0;
  const SandboxResult result =
      RunPython("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", options);
  EXPECT_EQ(result.kind, ExitKind::kTimedOut);
  EXPECT_TRUE(result.stdout_truncated);
  EXPECT_EQ(result.stdout_text.size(), options.output_limit_bytes);
  EXPECT_LT(result.wall_seconds, 2.5);
}

TEST(Sandbox, CallersOpenDescriptorsDoNotLeakIn) {
  const int null_fd = open("/dev/null", O_RDONLY);
  const int leaked = fcntl(null_fd, F_DUPFD, 20);  // deliberately without close-on-exec
  close(null_fd);
  ASSERT_GE(leaked, 20);
  const SandboxResult result = RunPython(
      "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n", FastOptions());
  close(leaked);
  // 0-2 standard streams, 3 the status channel, one more for the listing itself.
  EXPECT_EQ(result.stdout_text, "[0, 1, 2, 3, 4]\n") << result.stderr_text;
}

TEST(Sandbox, StrayChildrenDoNotHoldTheRunOpen) {
  const SandboxResult result = RunPython(
      "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('done')\n", FastOptions());
  EXPECT_EQ(result.kind, ExitKind::kExited);
  EXPECT_EQ(result.stdout_text, "done\n");
  EXPECT_LT(result.wall_seconds, 1.5);
}

TEST(Sandbox, MissingInterpreterIsAClearError) {
  SandboxOptions options = FastOptions();
  options.python = "/nonexistent/python3";
  EXPECT_THAT([&] { RunPython("pass", options); },
              testing::ThrowsErrorContaining({"/nonexistent/python3"}));
  options.python = "no-such-python-xyz";
  EXPECT_THAT([&] { RunPython("pass", options); },
              testing::ThrowsErrorContaining({"not found in PATH"}));
}

// Sets PATH for one scope.
class ScopedPath {
 public:
  explicit ScopedPath(const std::string& path) : saved_(std::getenv("PATH")) {
    setenv("PATH", path.c_str(), 1);
  }
  ~ScopedPath() { setenv("PATH", saved_.c_str(), 1); }

 private:
  std::string saved_;
};

TEST(Sandbox, RefusesToRunWithoutBubblewrap) {
  const std::string folder = polestar::testing::TempDir();
  SandboxOptions options = FastOptions();
  options.python = "python3";  // a configuration no earlier test prepared
  {
    ScopedPath empty(folder);
    EXPECT_THAT([&] { RunPython("pass", options); },
                testing::ThrowsErrorContaining({"bwrap not found", "apt-get install bubblewrap"}));
  }
  // A bwrap that fails as it does where namespaces are forbidden.
  const std::string fake = folder + "/bwrap";
  std::ofstream(fake) << "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\n"
                         "exit 1\n";
  fs::permissions(fake, fs::perms::owner_all);
  ScopedPath first(folder + ":" + std::getenv("PATH"));
  EXPECT_THAT([&] { RunPython("pass", options); },
              testing::ThrowsErrorContaining(
                  {"No permissions to creating new namespace", "nothing ran", "namespaces"}));
}

}  // namespace
}  // namespace polestar::eval
