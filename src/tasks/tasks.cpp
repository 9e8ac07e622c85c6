#include "tasks/tasks.h"

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>

#include "base/error.h"

namespace polestar {
namespace {

constexpr std::array<const char*, 20> kFirstNames = {
    "Alan",  "Billy", "Clara", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack",
    "Karen", "Leo",   "Maria", "Noah",  "Olga", "Paul",  "Quinn", "Rosa",  "Sam",  "Tina"};
constexpr std::array<const char*, 20> kLastNames = {
    "Adams", "Baker", "Clark", "Diaz",  "Evans", "Fisher", "Garcia", "Hughes", "Ito",   "Jones",
    "King",  "Lopez", "Moore", "Nolan", "Owens", "Patel",  "Ramos",  "Smith",  "Wells", "Young"};
constexpr std::array<const char*, 6> kItems = {"apples", "pens", "cards", "coins", "books", "eggs"};

struct Name {
  int first = 0, last = 0;
  std::string Text() const { return std::string(kFirstNames[first]) + " " + kLastNames[last]; }
};

std::string JoinNames(const std::vector<Name>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i].Text();
  return text;
}

// 3-5 people with distinct last names (so sorting by last name has one answer), plus one
// more person who is not in the line (for insert / replace).
std::vector<Name> DrawLine(Rng& rng, int extra) {
  const int count = rng.Range(3, 5) + extra;
  std::vector<int> lasts(kLastNames.size());
  std::iota(lasts.begin(), lasts.end(), 0);
  std::vector<Name> names;
  for (int i = 0; i < count; ++i) {
    const int pick = rng.Range(i, int(lasts.size()) - 1);
    std::swap(lasts[size_t(i)], lasts[size_t(pick)]);
    names.push_back({rng.Range(0, int(kFirstNames.size()) - 1), lasts[size_t(i)]});
  }
  return names;
}

// Both operands have exactly three digits and the reference answer is zero-padded to a
// fixed width (4 digits for a sum, 3 for a difference), so every answer digit sits at the
// same distance from the operand digits it depends on in every item: a tiny model learns
// that one alignment far sooner than several that move with the operands' lengths, and
// the carries still make neighbouring answer digits depend on each other. The grader
// compares values, so an unpadded answer is right too.
TaskItem Arithmetic(Rng& rng, bool subtract) {
  int a = rng.Range(100, 999), b = rng.Range(100, 999);
  if (subtract && a < b) std::swap(a, b);
  const char* op = subtract ? " - " : " + ";
  std::string answer = std::to_string(subtract ? a - b : a + b);
  const size_t width = subtract ? 3 : 4;
  answer.insert(0, width - answer.size(), '0');
  return {"", Cat("Compute ", a, op, b, "."), answer};
}

TaskItem ListTask(Rng& rng, std::string_view task) {
  const bool needs_newcomer = task == "insert" || task == "replace";
  std::vector<Name> line = DrawLine(rng, needs_newcomer ? 1 : 0);
  Name newcomer;
  if (needs_newcomer) {
    newcomer = line.back();
    line.pop_back();
  }
  const std::string listed = JoinNames(line);
  std::vector<Name> result = line;
  std::string prompt;
  if (task == "copy") {
    prompt = "Copy the list: " + listed;
  } else if (task == "reverse") {
    std::reverse(result.begin(), result.end());
    prompt = "Reverse the list: " + listed;
  } else if (task == "sort") {
    std::sort(result.begin(), result.end(), [](const Name& x, const Name& y) {
      return std::string_view(kLastNames[x.last]) < std::string_view(kLastNames[y.last]);
    });
    prompt = "Sort by last name: " + listed;
  } else if (task == "insert") {
    const int index = rng.Range(0, int(line.size()));
    result.insert(result.begin() + index, newcomer);
    prompt = Cat("Insert ", newcomer.Text(), " at position ", index, ": ", listed);
  } else if (task == "remove") {
    const int index = rng.Range(0, int(line.size()) - 1);
    result.erase(result.begin() + index);
    prompt = Cat("Remove position ", index, ": ", listed);
  } else {  // replace
    const int index = rng.Range(0, int(line.size()) - 1);
    result[size_t(index)] = newcomer;
    prompt = Cat("Replace position ", index, " with ", newcomer.Text(), ": ", listed);
  }
  return {"", prompt, JoinNames(result)};
}

using Grid = std::array<std::array<int, 4>, 4>;  // symbols 1..4, 0 for a blank

std::string GridText(const Grid& grid) {
  std::string text;
  for (int r = 0; r < 4; ++r) {
    if (r) text += '\n';
    for (int c = 0; c < 4; ++c) text += grid[r][c] ? char('0' + grid[r][c]) : '.';
  }
  return text;
}

// Every 4x4 Latin square is a row/column/symbol permutation of the cyclic group table or
// of the Klein four-group table, so permuting one of the two draws from all 576 squares.
TaskItem LatinSquare(Rng& rng) {
  const bool klein = rng.Range(0, 1) == 1;
  std::array<int, 4> rows{0, 1, 2, 3}, cols{0, 1, 2, 3}, symbols{1, 2, 3, 4};
  for (auto* perm : {&rows, &cols, &symbols}) {
    for (int i = 3; i > 0; --i) std::swap((*perm)[size_t(i)], (*perm)[size_t(rng.Range(0, i))]);
  }
  Grid square;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) {
      const int i = rows[size_t(r)], j = cols[size_t(c)];
      square[r][c] = symbols[size_t(klein ? (i ^ j) : (i + j) % 4)];
    }
  }
  // 5-9 blanks: with many blanks a grid has several valid completions.
  Grid puzzle = square;
  std::array<int, 16> cells;
  std::iota(cells.begin(), cells.end(), 0);
  const int blanks = rng.Range(5, 9);
  for (int i = 0; i < blanks; ++i) {
    std::swap(cells[size_t(i)], cells[size_t(rng.Range(i, 15))]);
    puzzle[cells[size_t(i)] / 4][cells[size_t(i)] % 4] = 0;
  }
  return {"", "Complete the Latin square:\n" + GridText(puzzle), GridText(square)};
}

// The quantities one starts from and buys or finds are single digits (the amount given away
// is below the running total): each written-out step is then a small arithmetic fact a tiny
// model can hold, and the difficulty lies in chaining two or three of them.
TaskItem WordProblem(Rng& rng) {
  const std::string who = kFirstNames[size_t(rng.Range(0, int(kFirstNames.size()) - 1))];
  const std::string item = kItems[size_t(rng.Range(0, int(kItems.size()) - 1))];
  switch (rng.Range(0, 3)) {
    case 0: {
      const int a = rng.Range(2, 9), b = rng.Range(2, 9), s = a + b, c = rng.Range(1, s - 1);
      return {"",
              Cat(who, " has ", a, " ", item, ", buys ", b, " more and gives away ", c,
                  ". How many ", item, " now?"),
              Cat(a, "+", b, "=", s, ",", s, "-", c, "=", s - c, " answer ", s - c)};
    }
    case 1: {
      const int a = rng.Range(2, 9), b = rng.Range(2, 9), p = a * b, c = rng.Range(1, p - 1);
      return {"",
              Cat(who, " buys ", a, " bags of ", b, " ", item, " and gives away ", c, ". How many ",
                  item, " are left?"),
              Cat(a, "*", b, "=", p, ",", p, "-", c, "=", p - c, " answer ", p - c)};
    }
    case 2: {
      const int a = rng.Range(2, 9), b = rng.Range(2, 9), s = a + b, c = rng.Range(1, s - 1),
                t = s - c, d = rng.Range(2, 9);
      return {"",
              Cat(who, " has ", a, " ", item, ", buys ", b, " more, gives away ", c,
                  ", then finds ", d, ". How many ", item, " now?"),
              Cat(a, "+", b, "=", s, ",", s, "-", c, "=", t, ",", t, "+", d, "=", t + d, " answer ",
                  t + d)};
    }
    default: {
      const int a = rng.Range(2, 9), b = rng.Range(2, 9), s = a + b, c = rng.Range(1, s - 1),
                t = s - c;
      return {"",
              Cat(who, " has ", a, " ", item, " and buys ", b, " more. Sam has ", c,
                  " fewer than that. How many ", item, " do they have together?"),
              Cat(a, "+", b, "=", s, ",", s, "-", c, "=", t, ",", s, "+", t, "=", s + t, " answer ",
                  s + t)};
    }
  }
}

TaskItem Draw(std::string_view task, Rng& rng) {
  if (task == "add") return Arithmetic(rng, false);
  if (task == "sub") return Arithmetic(rng, true);
  if (task == "latin") return LatinSquare(rng);
  if (task == "word") return WordProblem(rng);
  return ListTask(rng, task);
}

std::string_view Trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// The 4x4 grid in `text` (four lines of four symbols), or false when it is not one.
bool ParseGrid(std::string_view text, Grid& grid) {
  text = Trim(text);
  if (text.size() != 19) return false;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) {
      const char ch = text[size_t(r * 5 + c)];
      if (ch == '.') {
        grid[r][c] = 0;
      } else if (ch >= '1' && ch <= '4') {
        grid[r][c] = ch - '0';
      } else {
        return false;
      }
    }
    if (r < 3 && text[size_t(r * 5 + 4)] != '\n') return false;
  }
  return true;
}

bool GradeLatin(const TaskItem& item, std::string_view output) {
  Grid given, filled;
  const std::string_view header = "Complete the Latin square:\n";
  PS_CHECK(item.prompt.starts_with(header));
  if (!ParseGrid(std::string_view(item.prompt).substr(header.size()), given)) return false;
  if (!ParseGrid(output, filled)) return false;
  for (int i = 0; i < 4; ++i) {
    int row_seen = 0, col_seen = 0;
    for (int j = 0; j < 4; ++j) {
      if (filled[i][j] == 0 || filled[j][i] == 0) return false;
      if (given[i][j] != 0 && given[i][j] != filled[i][j]) return false;
      row_seen |= 1 << filled[i][j];
      col_seen |= 1 << filled[j][i];
    }
    if (row_seen != 0b11110 || col_seen != 0b11110) return false;
  }
  return true;
}

// The text after the last "answer " (the final number of a worked word problem).
std::string_view FinalAnswer(std::string_view text) {
  const size_t at = text.rfind("answer ");
  if (at == std::string_view::npos) return {};
  return Trim(text.substr(at + 7));
}

}  // namespace

const std::vector<std::string>& TaskNames() {
  static const std::vector<std::string> names = {"add",    "sub",    "copy",    "reverse", "sort",
                                                 "insert", "remove", "replace", "latin",   "word"};
  return names;
}

void CheckTaskName(std::string_view task) {
  const auto& names = TaskNames();
  if (std::find(names.begin(), names.end(), task) != names.end()) return;
  std::string known;
  for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
  Fail("unknown task '", task, "' (known: ", known, ")");
}

std::string DescribeTask(std::string_view task) {
  CheckTaskName(task);
  if (task == "add")
    return "sum of two 3-digit numbers, answer zero-padded to 4 digits; value match";
  if (task == "sub")
    return "difference of two 3-digit numbers (a >= b), zero-padded to 3 digits; value match";
  if (task == "latin") return "complete a 4x4 Latin square with 5-9 blanks; any valid completion";
  if (task == "word")
    return "2-3 step word problem from single-digit quantities, steps written out; final number";
  return Cat("list of 3-5 names: ", task, "; exact match");
}

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int Rng::Range(int lo, int hi) {
  PS_CHECK(lo <= hi);
  return lo + int(Next() % uint64_t(hi - lo + 1));
}

double Rng::Uniform() { return double(Next() >> 11) * (1.0 / 9007199254740992.0); }

uint64_t MixSeed(std::initializer_list<uint64_t> values) {
  uint64_t state = 0x243F6A8885A308D3ull;
  for (uint64_t v : values) {
    Rng rng(state ^ v);
    state = rng.Next();
  }
  return state;
}

uint64_t PromptHash(std::string_view prompt) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (unsigned char c : prompt) hash = (hash ^ c) * 0x100000001B3ull;
  return hash;
}

Split SplitOf(std::string_view prompt) {
  return PromptHash(prompt) % kTestModulus == 0 ? Split::kTest : Split::kTrain;
}

TaskItem MakeTaskItem(std::string_view task, Split split, uint64_t index, uint64_t seed) {
  CheckTaskName(task);
  const uint64_t task_id = PromptHash(task);
  for (uint64_t attempt = 0;; ++attempt) {
    Rng rng(MixSeed({seed, task_id, uint64_t(split), index, attempt}));
    TaskItem item = Draw(task, rng);
    if (SplitOf(item.prompt) != split) continue;
    item.task = std::string(task);
    return item;
  }
}

bool GradeAnswer(const TaskItem& item, std::string_view output) {
  output = Trim(output);
  if (item.task == "latin") return GradeLatin(item, output);
  if (item.task == "word") {
    const std::string_view got = FinalAnswer(output);
    return !got.empty() && got == FinalAnswer(item.answer);
  }
  if (item.task == "add" || item.task == "sub") {
    // Equal values: digits only, leading zeros allowed.
    auto value = [](std::string_view text) -> std::string_view {
      if (text.empty() || text.size() > 9) return {};
      for (char c : text) {
        if (c < '0' || c > '9') return {};
      }
      while (text.size() > 1 && text.front() == '0') text.remove_prefix(1);
      return text;
    };
    const std::string_view got = value(output);
    return !got.empty() && got == value(Trim(item.answer));
  }
  return output == Trim(item.answer);
}

std::string ChatPrompt(std::string_view user_message) {
  return Cat("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n", Trim(user_message),
             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

}  // namespace polestar
