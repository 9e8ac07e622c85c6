#include "bench/machine.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "base/error.h"

namespace polestar::bench {
namespace {

// First line of a command's stdout ("" on failure).
std::string FirstLineOf(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::array<char, 256> buffer{};
  std::string line;
  if (std::fgets(buffer.data(), int(buffer.size()), pipe) != nullptr) line = buffer.data();
  pclose(pipe);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace

nlohmann::json MachineInfo::ToJson() const {
  return {{"command", command},           {"git_commit", git_commit},
          {"cpu_model", cpu_model},       {"cpus", cpus},
          {"threads", threads},           {"kernel", kernel},
          {"memory_bytes", memory_bytes}, {"started", started}};
}

std::string MachineInfo::Summary() const {
  return Cat(cpu_model, ", ", cpus, " CPUs, ", threads, " threads, ", memory_bytes >> 30, " GiB, ",
             kernel, ", commit ", git_commit);
}

std::string ShellQuote(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "-_./=:,+@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string QuoteCommand(int argc, const char* const* argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += ShellQuote(argv[i]);
  }
  return command;
}

std::string ProcessCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string command, word;
  while (std::getline(in, word, '\0')) {
    if (!command.empty()) command += ' ';
    command += ShellQuote(word);
  }
  return command;
}

std::string SourceDir() { return POLESTAR_SOURCE_DIR; }

MachineInfo DescribeMachine(const std::string& command, const std::string& source_dir,
                            int threads) {
  MachineInfo m;
  m.command = command;
  const std::string git = "git -C " + ShellQuote(source_dir);
  m.git_commit = FirstLineOf(git + " rev-parse --short=12 HEAD 2>/dev/null");
  if (m.git_commit.empty()) {
    m.git_commit = "unknown";
  } else if (!FirstLineOf(git + " status --porcelain --untracked-files=no 2>/dev/null").empty()) {
    m.git_commit += "-dirty";
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  if (m.cpu_model.empty()) m.cpu_model = "unknown CPU";
  m.cpus = int(sysconf(_SC_NPROCESSORS_ONLN));
  m.threads = threads;
  m.memory_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  utsname name{};
  if (uname(&name) == 0) m.kernel = std::string(name.sysname) + " " + name.release;
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.started = stamp;
  return m;
}

Clock ClockFromName(const std::string& name) {
  if (name == "wall") return Clock::kWall;
  if (name == "cpu") return Clock::kCpu;
  Fail("unknown clock '", name, "' (wall, cpu)");
}

const char* ClockName(Clock clock) { return clock == Clock::kWall ? "wall" : "cpu"; }

double ClockSeconds(Clock clock) {
  timespec t{};
  clock_gettime(clock == Clock::kWall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return int64_t(std::stoll(line.substr(6))) * 1024;  // kB
  }
  return 0;
}

bool ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear) return false;
  clear << "5";
  clear.flush();
  return bool(clear);
}

}  // namespace polestar::bench
