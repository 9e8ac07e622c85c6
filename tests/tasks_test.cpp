#include "tasks/tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "base/error.h"
#include "test_support.h"

namespace polestar {
namespace {

TEST(TasksTest, ItemsAreDeterministicAndSplitsDisjoint) {
  for (const std::string& task : TaskNames()) {
    const TaskItem a = MakeTaskItem(task, Split::kTest, 3, 42);
    const TaskItem b = MakeTaskItem(task, Split::kTest, 3, 42);
    EXPECT_EQ(a.prompt, b.prompt);
    EXPECT_EQ(a.answer, b.answer);
    EXPECT_EQ(a.task, task);
    EXPECT_TRUE(GradeAnswer(a, a.answer)) << task << ": " << a.prompt;
    std::set<std::string> test;
    for (uint64_t i = 0; i < 100; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTest, i, 7);
      EXPECT_EQ(SplitOf(item.prompt), Split::kTest);
      test.insert(item.prompt);
    }
    EXPECT_GT(test.size(), 90u) << task;  // the generators have room
    for (uint64_t i = 0; i < 2000; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTrain, i, 1 + i % 3);
      ASSERT_EQ(test.count(item.prompt), 0u) << task << ": " << item.prompt;
      EXPECT_TRUE(GradeAnswer(item, item.answer));
    }
  }
  EXPECT_THROW(MakeTaskItem("nope", Split::kTest, 0, 0), Error);
}

TEST(TasksTest, ExactMatchGraders) {
  const TaskItem add{"add", "Compute 4821 + 1937.", "06758"};
  EXPECT_TRUE(GradeAnswer(add, "06758"));
  EXPECT_TRUE(GradeAnswer(add, " 6758\n"));  // arithmetic compares values
  EXPECT_FALSE(GradeAnswer(add, "06748"));
  EXPECT_FALSE(GradeAnswer(add, "67580"));
  EXPECT_FALSE(GradeAnswer(add, "6758 x"));
  EXPECT_FALSE(GradeAnswer(add, ""));
  const TaskItem sub{"sub", "Compute 311 - 215.", "096"};
  EXPECT_TRUE(GradeAnswer(sub, "096"));
  EXPECT_TRUE(GradeAnswer(sub, "96"));
  EXPECT_FALSE(GradeAnswer(sub, "0960"));
  const TaskItem zero{"sub", "Compute 311 - 311.", "000"};
  EXPECT_TRUE(GradeAnswer(zero, "0"));
  EXPECT_FALSE(GradeAnswer(zero, "1"));
  const TaskItem sorted = MakeTaskItem("sort", Split::kTest, 0, 1);
  EXPECT_FALSE(GradeAnswer(sorted, sorted.answer + ", Alan Adams"));
}

TEST(TasksTest, ArithmeticIsAlignedAndPadded) {
  for (const char* task : {"add", "sub"}) {
    for (uint64_t i = 0; i < 200; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTrain, i, 2);
      int a = 0, b = 0;
      char op = 0;
      ASSERT_EQ(std::sscanf(item.prompt.c_str(), "Compute %d %c %d.", &a, &op, &b), 3)
          << item.prompt;
      const size_t digits = 3;
      EXPECT_EQ(std::to_string(a).size(), digits) << item.prompt;
      EXPECT_EQ(std::to_string(b).size(), digits) << item.prompt;
      const int value = op == '+' ? a + b : a - b;
      EXPECT_GE(value, 0);
      EXPECT_EQ(item.answer.size(), op == '+' ? digits + 1 : digits) << item.answer;
      EXPECT_EQ(std::stoi(item.answer), value);
    }
  }
}

TEST(TasksTest, SortIsByLastName) {
  for (uint64_t i = 0; i < 50; ++i) {
    const TaskItem item = MakeTaskItem("sort", Split::kTrain, i, 3);
    std::vector<std::string> lasts;
    size_t at = 0;
    const std::string& a = item.answer;
    while (at < a.size()) {
      const size_t comma = std::min(a.find(", ", at), a.size());
      const std::string name = a.substr(at, comma - at);
      lasts.push_back(name.substr(name.find(' ') + 1));
      at = comma + 2;
    }
    EXPECT_TRUE(std::is_sorted(lasts.begin(), lasts.end())) << item.answer;
  }
}

TEST(TasksTest, LatinSquareAcceptsEveryValidCompletion) {
  const TaskItem item{"latin", "Complete the Latin square:\n1...\n....\n....\n...1", ""};
  // Two different completions, both valid.
  EXPECT_TRUE(GradeAnswer(item, "1234\n2143\n3412\n4321"));
  EXPECT_TRUE(GradeAnswer(item, "1234\n3412\n2143\n4321"));
  EXPECT_FALSE(GradeAnswer(item, "2134\n1243\n3412\n4321"));  // changes a given
  EXPECT_FALSE(GradeAnswer(item, "1234\n2143\n3412\n4312"));  // repeated symbol in a column
  EXPECT_FALSE(GradeAnswer(item, "1234\n2143\n3412"));        // incomplete
  EXPECT_FALSE(GradeAnswer(item, "1234\n2143\n3412\n432."));  // blank left
}

TEST(TasksTest, WordProblemsGradeTheFinalNumber) {
  const TaskItem item = MakeTaskItem("word", Split::kTest, 1, 5);
  EXPECT_TRUE(GradeAnswer(item, item.answer));
  const std::string final = item.answer.substr(item.answer.rfind(' ') + 1);
  EXPECT_TRUE(GradeAnswer(item, "1+1=2 answer " + final));
  EXPECT_FALSE(GradeAnswer(item, "answer " + final + "0"));
  EXPECT_FALSE(GradeAnswer(item, final));  // the worked answer format is required
}

// Every written step is true arithmetic, each step starts from the previous results, the
// final number is the last result, and the two starting quantities are single digits.
TEST(TasksTest, WordProblemStepsAreCorrectAndStartFromSingleDigits) {
  for (uint64_t i = 0; i < 200; ++i) {
    const TaskItem item = MakeTaskItem("word", Split::kTrain, i, 3);
    SCOPED_TRACE(item.prompt + " => " + item.answer);
    const size_t cut = item.answer.find(" answer ");
    ASSERT_NE(cut, std::string::npos);
    std::vector<int> results;
    std::stringstream steps(item.answer.substr(0, cut));
    std::string step;
    while (std::getline(steps, step, ',')) {
      int x = 0, y = 0, z = 0;
      char op = 0;
      ASSERT_EQ(std::sscanf(step.c_str(), "%d%c%d=%d", &x, &op, &y, &z), 4) << step;
      EXPECT_EQ(z, op == '+' ? x + y : op == '-' ? x - y : x * y) << step;
      EXPECT_TRUE(op == '+' || op == '-' || op == '*') << step;
      EXPECT_GE(z, 0) << step;
      if (results.empty()) {
        EXPECT_LE(x, 9);
        EXPECT_LE(y, 9);
      } else {
        EXPECT_NE(std::find(results.begin(), results.end(), x), results.end()) << step;
      }
      results.push_back(z);
    }
    ASSERT_GE(results.size(), 2u);
    ASSERT_LE(results.size(), 3u);
    EXPECT_EQ(std::stoi(item.answer.substr(cut + 8)), results.back());
  }
}

TEST(TasksTest, ChatTemplateIsLladas) {
  EXPECT_EQ(ChatPrompt(" Hi \n"),
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(TasksTest, CliPrintsItems) {
  std::string out;
  ASSERT_EQ(testing::RunCli("tasks --task add --split test --n 2 --seed 4 --json", &out), 0);
  const TaskItem item = MakeTaskItem("add", Split::kTest, 1, 4);
  EXPECT_NE(out.find(item.answer), std::string::npos);
  EXPECT_NE(out.find("\"split\":\"test\""), std::string::npos);
  ASSERT_NE(testing::RunCli("tasks --task nope", &out, true), 0);
  EXPECT_NE(out.find("unknown task"), std::string::npos);
}

}  // namespace
}  // namespace polestar
