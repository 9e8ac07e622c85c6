// Program assembly and pass@1 grading for the code suites (HumanEval, MBPP).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/sandbox.h"
#include "eval/suite.h"

namespace polestar::eval {

// lm-eval's humaneval stop sequences: a top-level statement after the function ends it.
extern const std::vector<std::string> kHumanEvalStops;
// lm-eval's mbpp stop sequence.
extern const std::vector<std::string> kMbppStops;

// The contents of the first ``` fenced block (language tag line skipped); a block left open
// by a cut-off generation runs to the end. nullopt without a fence.
std::optional<std::string> FirstFencedBlock(std::string_view text);

// The code a HumanEval completion contributes and the program that tests it:
//  - a completion with a ``` block (instruct models) uses the block; when the block defines
//    `entry_point` it is a whole solution and follows the prompt after a newline (the prompt
//    still supplies imports), otherwise it continues the prompt;
//  - any other completion continues the prompt, cut at the first of kHumanEvalStops.
// Program = prompt + code + "\n\n" + test + "\n\ncheck(entry_point)\n".
std::string HumanEvalCode(std::string_view completion, std::string_view entry_point);
std::string HumanEvalProgram(std::string_view prompt, std::string_view completion,
                             std::string_view test, std::string_view entry_point);

// The code an MBPP completion contributes: cut at "[DONE]", the first ``` block if any,
// without a leading "[BEGIN]". Program = code + "\n" + setup + "\n\n" + the asserts, one a line.
std::string MbppCode(std::string_view completion);
std::string MbppProgram(std::string_view completion, const std::vector<std::string>& test_list,
                        std::string_view test_setup_code);

// Runs `program` in the sandbox. It passes only when it exits with status 0 after running to
// its last line: a random token written to file descriptor 3 by a line appended to the
// program marks that, so code that leaves early with sys.exit(0) or os._exit(0) fails
// ("exited_early"). Status "timed_out" covers both the wall deadline and the CPU limit
// (SIGXCPU). One metric, "pass@1"; `extracted` is set to `code`.
GradeResult RunCodeTests(const std::string& program, const std::string& code,
                         const SandboxOptions& options);

}  // namespace polestar::eval
