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
  for (const std::string& task : AllTaskNames()) {
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

TEST(TasksTest, FamiliesPartitionTheTasks) {
  const std::vector<std::string>& tiny = TaskNames(TaskFamily::kTiny);
  const std::vector<std::string>& long_answers = TaskNames(TaskFamily::kLong);
  EXPECT_EQ(TaskNames(), tiny);  // the default family is polestar-tiny's
  EXPECT_EQ(tiny.size(), 10u);
  EXPECT_EQ(long_answers.size(), 6u);
  std::vector<std::string> both = tiny;
  both.insert(both.end(), long_answers.begin(), long_answers.end());
  EXPECT_EQ(AllTaskNames(), both);
  EXPECT_EQ(std::set<std::string>(both.begin(), both.end()).size(), both.size());
}

// The three written lines are true, at their fixed widths, and the final number is the
// product.
TEST(TasksTest, MultiplicationWritesItsPartialProducts) {
  for (uint64_t i = 0; i < 300; ++i) {
    const TaskItem item = MakeTaskItem("mul", Split::kTrain, i, 4);
    SCOPED_TRACE(item.prompt + " => " + item.answer);
    int a = 0, b = 0;
    ASSERT_EQ(std::sscanf(item.prompt.c_str(), "Compute %d * %d.", &a, &b), 2);
    EXPECT_TRUE(a >= 10 && a <= 99 && b >= 10 && b <= 99);
    char expected[96];
    std::snprintf(expected, sizeof expected, "%d*%d=%03d,%d*%d=%04d,%04d+%04d=%04d answer %04d", a,
                  b % 10, a * (b % 10), a, b / 10 * 10, a * (b / 10 * 10), a * (b % 10),
                  a * (b / 10 * 10), a * b, a * b);
    EXPECT_EQ(item.answer, expected);
  }
  const TaskItem item{"mul", "Compute 47 * 36.", "47*6=282,47*30=1410,0282+1410=1692 answer 1692"};
  EXPECT_TRUE(GradeAnswer(item, "anything answer 1692"));
  EXPECT_FALSE(GradeAnswer(item, "47*6=282,47*30=1410,0282+1410=1692 answer 1682"));
  EXPECT_FALSE(GradeAnswer(item, "1692"));
}

// Every step is true arithmetic on the running total (or a bag product feeding the next
// step), the total stays in 1..99, and the story has 4-6 events.
TEST(TasksTest, ChainedStepsFollowTheStory) {
  for (uint64_t i = 0; i < 300; ++i) {
    const TaskItem item = MakeTaskItem("chain", Split::kTrain, i, 5);
    SCOPED_TRACE(item.prompt + " => " + item.answer);
    int total = 0;
    ASSERT_EQ(std::sscanf(item.prompt.c_str(), "%*s has %d", &total), 1);
    const size_t events = size_t(std::count(item.prompt.begin(), item.prompt.end(), ',')) + 1;
    EXPECT_GE(events, 4u);
    EXPECT_LE(events, 6u);
    const size_t cut = item.answer.find(" answer ");
    ASSERT_NE(cut, std::string::npos);
    struct Step {
      int x = 0, y = 0, z = 0;
      char op = 0;
    };
    std::vector<Step> written;
    std::stringstream steps(item.answer.substr(0, cut));
    std::string text;
    while (std::getline(steps, text, ',')) {
      Step s;
      ASSERT_EQ(std::sscanf(text.c_str(), "%d%c%d=%d", &s.x, &s.op, &s.y, &s.z), 4) << text;
      EXPECT_EQ(s.z, s.op == '+' ? s.x + s.y : s.op == '-' ? s.x - s.y : s.x * s.y) << text;
      written.push_back(s);
    }
    int product = -1;  // a bag product waiting to be added
    for (size_t k = 0; k < written.size(); ++k) {
      const Step& s = written[k];
      // n bags of m is n*m, and the next step adds it to the total; "doubles them" is
      // total*2.
      const bool bags = s.op == '*' && k + 1 < written.size() && written[k + 1].op == '+' &&
                        written[k + 1].x == total && written[k + 1].y == s.z;
      if (s.op == '*' && !bags) {
        EXPECT_EQ(s.y, 2) << k;
      }
      if (bags) {
        ASSERT_EQ(product, -1);
        product = s.z;
        continue;
      }
      EXPECT_EQ(s.x, total) << k;
      if (product >= 0) {
        EXPECT_EQ(s.op, '+');
        EXPECT_EQ(s.y, product);
        product = -1;
      }
      total = s.z;
      EXPECT_GE(total, 1);
      EXPECT_LE(total, 99);
    }
    EXPECT_EQ(product, -1);
    EXPECT_EQ(std::stoi(item.answer.substr(cut + 8)), total);
  }
}

std::vector<std::string> SplitNames(const std::string& list) {
  std::vector<std::string> names;
  size_t at = 0;
  while (at < list.size()) {
    const size_t comma = std::min(list.find(", ", at), list.size());
    names.push_back(list.substr(at, comma - at));
    at = comma + 2;
  }
  return names;
}

TEST(TasksTest, LongListsHoldSixToTenNamesAndApplyTheirEdit) {
  for (uint64_t i = 0; i < 300; ++i) {
    const TaskItem sorted = MakeTaskItem("longsort", Split::kTrain, i, 6);
    const std::vector<std::string> given = SplitNames(sorted.prompt.substr(19));
    std::vector<std::string> answer = SplitNames(sorted.answer);
    EXPECT_GE(given.size(), 6u);
    EXPECT_LE(given.size(), 10u);
    EXPECT_TRUE(std::is_permutation(given.begin(), given.end(), answer.begin(), answer.end()));
    EXPECT_TRUE(std::is_sorted(answer.begin(), answer.end(), [](const auto& x, const auto& y) {
      return x.substr(x.find(' ')) < y.substr(y.find(' '));
    })) << sorted.answer;

    const TaskItem edit = MakeTaskItem("longedit", Split::kTrain, i, 6);
    SCOPED_TRACE(edit.prompt + " => " + edit.answer);
    const size_t colon = edit.prompt.find(": ");
    std::vector<std::string> line = SplitNames(edit.prompt.substr(colon + 2));
    EXPECT_GE(line.size(), 6u);
    EXPECT_LE(line.size(), 10u);
    char first[16], last[16];
    int x = 0, y = 0;
    if (std::sscanf(edit.prompt.c_str(), "Insert %15s %15s at position %d", first, last, &x) == 3) {
      line.insert(line.begin() + x, std::string(first) + " " + last);
    } else if (std::sscanf(edit.prompt.c_str(), "Remove position %d", &x) == 1) {
      line.erase(line.begin() + x);
    } else if (std::sscanf(edit.prompt.c_str(), "Replace position %d with %15s %15[^:]", &x, first,
                           last) == 3) {
      line[size_t(x)] = std::string(first) + " " + last;
    } else {
      ASSERT_EQ(std::sscanf(edit.prompt.c_str(), "Swap positions %d and %d", &x, &y), 2);
      EXPECT_LT(x, y);
      std::swap(line[size_t(x)], line[size_t(y)]);
    }
    EXPECT_EQ(SplitNames(edit.answer), line);
  }
}

TEST(TasksTest, SudokuAcceptsEverySolutionAndChecksTheBoxes) {
  const TaskItem item{"sudoku", "Solve the sudoku:\n1...\n....\n....\n...1", ""};
  EXPECT_TRUE(GradeAnswer(item, "1234\n3412\n2143\n4321"));
  EXPECT_TRUE(GradeAnswer(item, "1243\n3412\n2134\n4321"));
  // A Latin square keeping the givens whose top-left box holds 1 and 2 twice.
  EXPECT_FALSE(GradeAnswer(item, "1234\n2143\n3412\n4321"));
  EXPECT_FALSE(GradeAnswer(item, "2143\n3412\n1234\n4321"));  // changes a given
  for (uint64_t i = 0; i < 200; ++i) {
    const TaskItem drawn = MakeTaskItem("sudoku", Split::kTrain, i, 8);
    const size_t givens = size_t(std::count_if(drawn.prompt.begin() + 18, drawn.prompt.end(),
                                               [](char c) { return c >= '1' && c <= '4'; }));
    EXPECT_GE(givens, 4u) << drawn.prompt;
    EXPECT_LE(givens, 7u) << drawn.prompt;
  }
}

TEST(TasksTest, RunningTotalsAddEachDigit) {
  for (uint64_t i = 0; i < 200; ++i) {
    const TaskItem item = MakeTaskItem("totals", Split::kTrain, i, 9);
    std::stringstream digits(item.prompt.substr(std::string("Running totals of:").size()));
    std::string expected;
    int digit = 0, total = 0, count = 0;
    while (digits >> digit) {
      EXPECT_TRUE(digit >= 1 && digit <= 9);
      total += digit;
      if (count++ > 0) expected += ',';
      expected += std::to_string(total);
    }
    EXPECT_GE(count, 12);
    EXPECT_LE(count, 20);
    EXPECT_EQ(item.answer, expected);
  }
  const TaskItem item{"totals", "Running totals of: 3 5 2", "3,8,10"};
  EXPECT_TRUE(GradeAnswer(item, "3,8,10\n"));
  EXPECT_FALSE(GradeAnswer(item, "3,8,11"));
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
