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

// `lo`-`hi` people with distinct last names (so sorting by last name has one answer), plus
// `extra` more people who are not in the line (for insert / replace).
std::vector<Name> DrawLine(Rng& rng, int lo, int hi, int extra) {
  const int count = rng.Range(lo, hi) + extra;
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
  std::vector<Name> line = DrawLine(rng, 3, 5, needs_newcomer ? 1 : 0);
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

// --- The long-answer family (polestar-long): answers of 20-70 tokens whose tokens depend on
// each other, decoded in a 128-token canvas of 32-token blocks.

// A 2-digit by 2-digit product with its partial products written out at fixed widths (the
// units product 3 digits, the tens product 4, the sum 4, each zero-padded), so that every
// digit sits at the same distance from the digits it is computed from in every item, and each
// line's digits depend on the line before.
TaskItem Multiplication(Rng& rng) {
  const int a = rng.Range(10, 99), b = rng.Range(10, 99);
  const int units = a * (b % 10), tens = a * (b / 10 * 10);
  auto padded = [](int value, size_t width) {
    std::string text = std::to_string(value);
    return std::string(width - text.size(), '0') + text;
  };
  return {"", Cat("Compute ", a, " * ", b, "."),
          Cat(a, "*", b % 10, "=", padded(units, 3), ",", a, "*", b / 10 * 10, "=", padded(tens, 4),
              ",", padded(units, 4), "+", padded(tens, 4), "=", padded(units + tens, 4), " answer ",
              padded(units + tens, 4))};
}

// A story of 4-6 events from a single-digit start, each written out as one step on the
// running total (a purchase of bags as its product first, then the sum), which stays in
// 1..99: every step starts from the result of the one before.
TaskItem ChainedWordProblem(Rng& rng) {
  const std::string who = kFirstNames[size_t(rng.Range(0, int(kFirstNames.size()) - 1))];
  const std::string item = kItems[size_t(rng.Range(0, int(kItems.size()) - 1))];
  int total = rng.Range(2, 9);
  std::string story = Cat(who, " has ", total, " ", item), steps;
  const int events = rng.Range(4, 6);
  for (int e = 0; e < events; ++e) {
    const std::string sep = e + 1 == events ? " and " : ", ";
    const std::string step_sep = steps.empty() ? "" : ",";
    int kind = rng.Range(0, 4);
    if (kind == 2 && total < 2) kind = 0;  // nothing to give away
    if (kind == 3 && total > 49) kind = 2;
    if (kind == 4 && total > 90) kind = 2;
    switch (kind) {
      case 0:
      case 1: {  // buys / finds n
        const int n = rng.Range(2, 9);
        if (total + n > 99) {
          --e;
          continue;
        }
        story += Cat(sep, kind == 0 ? "buys " : "finds ", n);
        steps += Cat(step_sep, total, "+", n, "=", total + n);
        total += n;
        break;
      }
      case 2: {  // gives away n
        const int n = rng.Range(1, std::min(9, total - 1));
        story += Cat(sep, "gives away ", n);
        steps += Cat(step_sep, total, "-", n, "=", total - n);
        total -= n;
        break;
      }
      case 3:  // doubles
        story += Cat(sep, "doubles them");
        steps += Cat(step_sep, total, "*2=", total * 2);
        total *= 2;
        break;
      default: {  // buys n bags of m
        int n = rng.Range(2, 9), m = rng.Range(2, 9);
        while (total + n * m > 99) n > 2 ? --n : --m;
        story += Cat(sep, "buys ", n, " bags of ", m);
        steps += Cat(step_sep, n, "*", m, "=", n * m, ",", total, "+", n * m, "=", total + n * m);
        total += n * m;
        break;
      }
    }
  }
  return {"", Cat(story, ". How many ", item, " now?"), Cat(steps, " answer ", total)};
}

// Sorting a line of 6-10 people by last name: each answer name is the k-th smallest of the
// prompt's, so the names committed together must agree on the order.
TaskItem LongSort(Rng& rng) {
  std::vector<Name> line = DrawLine(rng, 6, 10, 0);
  const std::string listed = JoinNames(line);
  std::sort(line.begin(), line.end(), [](const Name& x, const Name& y) {
    return std::string_view(kLastNames[x.last]) < std::string_view(kLastNames[y.last]);
  });
  return {"", "Sort by last name: " + listed, JoinNames(line)};
}

// One edit (insert, remove, replace or swap) of a line of 6-10 people: the names after the
// edited position shift, so each answer position depends on where the edit lands.
TaskItem LongEdit(Rng& rng) {
  std::vector<Name> line = DrawLine(rng, 6, 10, 1);
  const Name newcomer = line.back();
  line.pop_back();
  const std::string listed = JoinNames(line);
  std::vector<Name> result = line;
  const int last = int(line.size()) - 1;
  std::string prompt;
  switch (rng.Range(0, 3)) {
    case 0: {
      const int index = rng.Range(0, last + 1);
      result.insert(result.begin() + index, newcomer);
      prompt = Cat("Insert ", newcomer.Text(), " at position ", index, ": ", listed);
      break;
    }
    case 1: {
      const int index = rng.Range(0, last);
      result.erase(result.begin() + index);
      prompt = Cat("Remove position ", index, ": ", listed);
      break;
    }
    case 2: {
      const int index = rng.Range(0, last);
      result[size_t(index)] = newcomer;
      prompt = Cat("Replace position ", index, " with ", newcomer.Text(), ": ", listed);
      break;
    }
    default: {
      const int i = rng.Range(0, last - 1), j = rng.Range(i + 1, last);
      std::swap(result[size_t(i)], result[size_t(j)]);
      prompt = Cat("Swap positions ", i, " and ", j, ": ", listed);
      break;
    }
  }
  return {"", prompt, JoinNames(result)};
}

// Whether symbol v may go at (r, c) of a 4x4 sudoku: not yet in its row, column or 2x2 box.
bool SudokuAllows(const Grid& grid, int r, int c, int v) {
  for (int i = 0; i < 4; ++i) {
    if (grid[r][i] == v || grid[i][c] == v) return false;
    if (grid[r / 2 * 2 + i / 2][c / 2 * 2 + i % 2] == v) return false;
  }
  return true;
}

// Fills the blanks from `cell` on, trying symbols in a random order; false when stuck.
bool FillSudoku(Grid& grid, int cell, Rng& rng) {
  if (cell == 16) return true;
  const int r = cell / 4, c = cell % 4;
  if (grid[r][c] != 0) return FillSudoku(grid, cell + 1, rng);
  std::array<int, 4> order{1, 2, 3, 4};
  for (int i = 3; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng.Range(0, i))]);
  for (int v : order) {
    if (!SudokuAllows(grid, r, c, v)) continue;
    grid[r][c] = v;
    if (FillSudoku(grid, cell + 1, rng)) return true;
    grid[r][c] = 0;
  }
  return false;
}

// A 4x4 sudoku (rows, columns and 2x2 boxes each hold 1-4) with 4-7 givens: most such grids
// have several solutions, and cells committed together must come from the same one.
TaskItem Sudoku(Rng& rng) {
  Grid solution{};
  PS_CHECK(FillSudoku(solution, 0, rng));
  Grid puzzle = solution;
  std::array<int, 16> cells;
  std::iota(cells.begin(), cells.end(), 0);
  const int blanks = 16 - rng.Range(4, 7);
  for (int i = 0; i < blanks; ++i) {
    std::swap(cells[size_t(i)], cells[size_t(rng.Range(i, 15))]);
    puzzle[cells[size_t(i)] / 4][cells[size_t(i)] % 4] = 0;
  }
  return {"", "Solve the sudoku:\n" + GridText(puzzle), GridText(solution)};
}

// Running totals of 12-20 single digits: every total is the previous one plus the next digit.
TaskItem RunningTotals(Rng& rng) {
  const int count = rng.Range(12, 20);
  std::string prompt = "Running totals of:", answer;
  int total = 0;
  for (int i = 0; i < count; ++i) {
    const int digit = rng.Range(1, 9);
    total += digit;
    prompt += Cat(" ", digit);
    answer += Cat(i ? "," : "", total);
  }
  return {"", prompt, answer};
}

TaskItem Draw(std::string_view task, Rng& rng) {
  if (task == "add") return Arithmetic(rng, false);
  if (task == "sub") return Arithmetic(rng, true);
  if (task == "latin") return LatinSquare(rng);
  if (task == "word") return WordProblem(rng);
  if (task == "mul") return Multiplication(rng);
  if (task == "chain") return ChainedWordProblem(rng);
  if (task == "longsort") return LongSort(rng);
  if (task == "longedit") return LongEdit(rng);
  if (task == "sudoku") return Sudoku(rng);
  if (task == "totals") return RunningTotals(rng);
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

// Whether `output` is a 4x4 grid of 1-4 that keeps the givens of the grid after `header` in
// the prompt and holds each symbol once per row and column (and, for a sudoku, per 2x2 box).
bool GradeGrid(const TaskItem& item, std::string_view output, std::string_view header, bool boxes) {
  Grid given, filled;
  PS_CHECK(item.prompt.starts_with(header));
  if (!ParseGrid(std::string_view(item.prompt).substr(header.size()), given)) return false;
  if (!ParseGrid(output, filled)) return false;
  for (int i = 0; i < 4; ++i) {
    int row_seen = 0, col_seen = 0, box_seen = 0;
    for (int j = 0; j < 4; ++j) {
      if (filled[i][j] == 0 || filled[j][i] == 0) return false;
      if (given[i][j] != 0 && given[i][j] != filled[i][j]) return false;
      row_seen |= 1 << filled[i][j];
      col_seen |= 1 << filled[j][i];
      box_seen |= 1 << filled[i / 2 * 2 + j / 2][i % 2 * 2 + j % 2];
    }
    if (row_seen != 0b11110 || col_seen != 0b11110) return false;
    if (boxes && box_seen != 0b11110) return false;
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

const std::vector<std::string>& TaskNames(TaskFamily family) {
  static const std::vector<std::string> tiny = {"add",    "sub",    "copy",    "reverse", "sort",
                                                "insert", "remove", "replace", "latin",   "word"};
  static const std::vector<std::string> long_answers = {"mul",      "chain",  "longsort",
                                                        "longedit", "sudoku", "totals"};
  return family == TaskFamily::kTiny ? tiny : long_answers;
}

const std::vector<std::string>& AllTaskNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = TaskNames(TaskFamily::kTiny);
    for (const std::string& name : TaskNames(TaskFamily::kLong)) all.push_back(name);
    return all;
  }();
  return names;
}

void CheckTaskName(std::string_view task) {
  const auto& names = AllTaskNames();
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
  if (task == "mul")
    return "2-digit by 2-digit product, partial products written out; final number";
  if (task == "chain")
    return "4-6 event story from a single-digit start, each step written out; final number";
  if (task == "longsort") return "sort a list of 6-10 names by last name; exact match";
  if (task == "longedit")
    return "insert, remove, replace or swap in a list of 6-10 names; exact match";
  if (task == "sudoku") return "solve a 4x4 sudoku with 4-7 givens; any valid solution";
  if (task == "totals") return "running totals of 12-20 digits; exact match";
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
  if (item.task == "latin") {
    return GradeGrid(item, output, "Complete the Latin square:\n", /*boxes=*/false);
  }
  if (item.task == "sudoku") return GradeGrid(item, output, "Solve the sudoku:\n", true);
  if (item.task == "word" || item.task == "mul" || item.task == "chain") {
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
