// What a benchmark result needs to be reproducible: the exact command, the code version,
// the machine; and the process's peak memory.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace polestar::bench {

struct MachineInfo {
  std::string command;     // the command line, shell-quoted
  std::string git_commit;  // "abc1234" (+ "-dirty"), "unknown" outside a checkout
  std::string cpu_model;   // /proc/cpuinfo "model name"
  int cpus = 0;            // online CPUs
  int threads = 0;         // threads the engine uses
  std::string kernel;      // uname -sr
  int64_t memory_bytes = 0;
  std::string started;  // UTC, ISO 8601

  nlohmann::json ToJson() const;
  // One line for tables: "Intel Xeon ..., 2 CPUs, 2 threads, commit abc1234".
  std::string Summary() const;
};

// A word quoted for sh when it needs it.
std::string ShellQuote(const std::string& word);
// `argv` joined with shell quoting where needed.
std::string QuoteCommand(int argc, const char* const* argv);

// This process's command line (/proc/self/cmdline), shell-quoted.
std::string ProcessCommandLine();

// Fills everything; `source_dir` is the checkout whose commit is recorded.
MachineInfo DescribeMachine(const std::string& command, const std::string& source_dir, int threads);

// The source tree this binary was built from.
std::string SourceDir();

// Which clock timings use: wall time, or this process's CPU time (steadier on a shared
// machine, and equal to wall time on an idle one when the engine runs one thread).
enum class Clock { kWall, kCpu };
Clock ClockFromName(const std::string& name);  // wall | cpu
const char* ClockName(Clock clock);
// Seconds on `clock` since an arbitrary origin.
double ClockSeconds(Clock clock);

// VmHWM of this process (peak resident set), in bytes; 0 where /proc is unavailable.
int64_t PeakRssBytes();
// Resets VmHWM to the current resident set (Linux: /proc/self/clear_refs), so the next
// PeakRssBytes() is the peak of what follows; returns false where that is not allowed, in
// which case the peak covers the process's whole life.
bool ResetPeakRss();

}  // namespace polestar::bench
