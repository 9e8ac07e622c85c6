// Runs untrusted Python (model-written code and its tests) in a child process that cannot take
// the caller down: `python3 -I program.py` in a fresh temporary folder, its own process group,
// rlimits on CPU time, address space, file size and core dumps, a wall-clock deadline after
// which the whole process group is killed, stdout/stderr captured and truncated, and no network.
//
// Network: the child first tries unshare(CLONE_NEWNET) (works as root or with CAP_SYS_ADMIN),
// then unshare(CLONE_NEWUSER | CLONE_NEWNET) (unprivileged user namespaces). Inside a new
// network namespace only a downed loopback exists, so no connection can succeed. When neither
// is permitted the run still happens, with network_isolated = false in the result; the child
// environment is then the only guard: it is built from scratch (nothing inherited) with every
// *_proxy variable pointing at a closed port, which stops proxy-aware libraries but not raw
// sockets. Not contained either way: fork bombs (RLIMIT_NPROC is per user, so it is not set)
// and children that leave the process group with setsid() (killed only if they exit).
//
// Thread-safe: the grading loop may run several programs at once.
#pragma once

#include <cstdint>
#include <string>

namespace polestar::eval {

struct SandboxOptions {
  // The process group is SIGKILLed after this many seconds. Generous, because a loaded
  // machine stretches wall time (MBPP task 123's reference needs 3.4 s of CPU and took over
  // 20 s of wall time on 2 cores shared with 12 other busy processes); busy loops are stopped
  // sooner by the CPU limit, so only programs that sleep or block wait this long.
  double wall_timeout_s = 30.0;
  double cpu_limit_s = 10.0;  // RLIMIT_CPU (SIGXCPU); 0 means ceil(wall_timeout_s)
  std::uint64_t memory_limit_bytes = std::uint64_t{2} << 30;      // RLIMIT_AS
  std::uint64_t file_size_limit_bytes = std::uint64_t{64} << 20;  // RLIMIT_FSIZE
  std::size_t output_limit_bytes = 8192;  // kept per stream; the rest is read and dropped
  bool isolate_network = true;
  // The interpreter; empty means python3 from PATH, resolved once to its real executable (so
  // wrapper scripts such as pyenv shims run only for the lookup, not for every program).
  std::string python;
};

enum class ExitKind {
  kExited,    // exit_code is valid
  kSignaled,  // killed by `signal`: a crash, os.kill(...), or SIGXCPU at the CPU limit
  kTimedOut,  // still running at the deadline; the process group was killed
};

struct SandboxResult {
  ExitKind kind = ExitKind::kExited;
  int exit_code = -1;
  int signal = 0;
  double wall_seconds = 0.0;
  std::string stdout_text;  // the first output_limit_bytes of each stream
  std::string stderr_text;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  // What the program wrote to file descriptor 3 (at most 4 KiB). Graders use it
  // as a side channel that ordinary program output cannot reach by accident.
  std::string status_text;
  bool network_isolated = false;
};

// Runs `source` as a Python program. Throws polestar::Error only when the sandbox itself cannot
// work (no python3, no temporary folder, fork failure); anything the program does, including
// hanging, crashing or exiting early, is reported in the result.
SandboxResult RunPython(const std::string& source, const SandboxOptions& options);

// The interpreter RunPython uses for `configured` (SandboxOptions::python): an absolute path.
// Throws polestar::Error naming what was searched when none is found.
std::string ResolvePython(const std::string& configured);

const char* ExitKindName(ExitKind kind);

}  // namespace polestar::eval
