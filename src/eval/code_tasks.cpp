#include "eval/code_tasks.h"

#include <csignal>
#include <random>

namespace polestar::eval {

const std::vector<std::string> kHumanEvalStops = {"\nclass", "\ndef", "\n#", "\nif", "\nprint"};
const std::vector<std::string> kMbppStops = {"[DONE]"};

namespace {

std::string RandomToken() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  constexpr char kHex[] = "0123456789abcdef";
  std::string token = "polestar-pass-";
  for (int i = 0; i < 24; ++i) token += kHex[generator() % 16];
  return token;
}

const char* CodeStatus(const SandboxResult& run, bool reached_end) {
  switch (run.kind) {
    case ExitKind::kTimedOut:
      return "timed_out";
    case ExitKind::kSignaled:
      return run.signal == SIGXCPU ? "timed_out" : "signaled";
    case ExitKind::kExited:
      break;
  }
  if (run.exit_code != 0) return "failed";
  return reached_end ? "passed" : "exited_early";
}

// Length of the well-formed UTF-8 sequence at text[i] (Unicode table 3-7: no overlong forms,
// no surrogates, nothing above U+10FFFF); 0 when there is none.
std::size_t Utf8SequenceLength(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned lead = byte(0);
  std::size_t length;
  unsigned low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

// `text` with every byte outside a well-formed UTF-8 sequence replaced by U+FFFD, so details
// can be written as JSON even when output was cut mid-character or is binary.
std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = Utf8SequenceLength(text, i);
    if (length > 0) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> FirstFencedBlock(std::string_view text) {
  const std::size_t fence = text.find("```");
  if (fence == std::string_view::npos) return std::nullopt;
  const std::size_t line_end = text.find('\n', fence);
  if (line_end == std::string_view::npos) return std::string();
  const std::size_t start = line_end + 1;
  const std::size_t close = text.find("```", start);
  return std::string(text.substr(start, close == std::string_view::npos ? close : close - start));
}

std::string HumanEvalCode(std::string_view completion, std::string_view entry_point) {
  if (std::optional<std::string> block = FirstFencedBlock(completion)) {
    const std::string definition = "def " + std::string(entry_point) + "(";
    return block->find(definition) != std::string::npos ? "\n" + *block : *block;
  }
  return std::string(TruncateAtStop(completion, kHumanEvalStops));
}

std::string HumanEvalProgram(std::string_view prompt, std::string_view completion,
                             std::string_view test, std::string_view entry_point) {
  return std::string(prompt) + HumanEvalCode(completion, entry_point) + "\n\n" + std::string(test) +
         "\n\ncheck(" + std::string(entry_point) + ")\n";
}

std::string MbppCode(std::string_view completion) {
  std::string code(TruncateAtStop(completion, kMbppStops));
  if (std::optional<std::string> block = FirstFencedBlock(code)) code = *block;
  const std::size_t first = code.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && code.compare(first, 7, "[BEGIN]") == 0) {
    code.erase(0, first + 7);
  }
  return code;
}

std::string MbppProgram(std::string_view completion, const std::vector<std::string>& test_list,
                        std::string_view test_setup_code) {
  // The setup code (only task 367 has one) builds objects of classes the solution defines.
  std::string program = MbppCode(completion) + "\n" + std::string(test_setup_code) + "\n\n";
  for (const std::string& test : test_list) program += test + "\n";
  return program;
}

GradeResult RunCodeTests(const std::string& program, const std::string& code,
                         const SandboxOptions& options) {
  const std::string token = RandomToken();
  const std::string source = program + "\n__import__('os').write(3, b'" + token + "')\n";
  const SandboxResult run = RunPython(source, options);
  const bool reached_end = run.status_text == token;
  const std::string status = CodeStatus(run, reached_end);

  GradeResult result;
  result.correct = status == "passed";
  result.extracted = ValidUtf8(code);
  result.metrics = {{"pass@1", result.correct, result.extracted}};
  result.details = {{"status", status},
                    {"exit_code", run.exit_code},
                    {"signal", run.signal},
                    {"seconds", run.wall_seconds},
                    {"stdout", ValidUtf8(run.stdout_text)},
                    {"stderr", ValidUtf8(run.stderr_text)},
                    {"output_truncated", run.stdout_truncated || run.stderr_truncated},
                    {"program", ValidUtf8(program)}};
  return result;
}

}  // namespace polestar::eval
