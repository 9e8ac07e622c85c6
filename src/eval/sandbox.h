// Runs untrusted Python (model-written code and its tests) inside bubblewrap (bwrap), so that
// the program can neither change nor read the machine beyond what it needs, nor take the caller
// down. What the program gets (README.md, "The code sandbox", says the same for users):
//   - a read-only view of /usr (with /bin, /lib... as on the host), the interpreter's own
//     installation prefix, and /etc/{ld.so.cache,ld.so.conf(.d),passwd,group}; nothing else of
//     the host's files (no /home, /root, /work, /run, /var, the repository or its models);
//   - a private, size-limited /tmp and /dev/shm, and its working folder /tmp/polestar-sandbox
//     (holding program.py), all gone when the run ends;
//   - new network (only its own loopback), PID, IPC and UTS namespaces, a minimal /dev and its
//     own /proc; no capabilities; a fresh session (setsid), no inherited file descriptors
//     beyond stdin (/dev/null), stdout, stderr and the status channel (3), and an environment
//     built from scratch;
//   - user nobody (65534) when the caller is root; otherwise the caller's user inside a user
//     namespace that cannot make more of them;
//   - rlimits on CPU time, address space, file size, core dumps and processes (and threads),
//     and a wall-clock deadline after which bwrap is killed, which kills every process in the
//     PID namespace, including those that called setsid().
// Not isolated: the kernel itself (no seccomp filter), memory across processes (each process has
// the address-space limit, so a program can use up to process_limit times it), CPU time
// across processes (each has the CPU limit; the wall deadline bounds them all), and the
// system's clock and load. As root the process limit counts all of user nobody's processes on
// the machine, including concurrent runs.
//
// There is no weaker fallback: when bwrap is missing or cannot build its namespaces here,
// RunPython throws with the reason and the fix, and no model code runs.
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
  // The size of each of the program's writable filesystems (/tmp, /dev/shm), in memory.
  std::uint64_t scratch_limit_bytes = std::uint64_t{256} << 20;
  // RLIMIT_NPROC: processes and threads the program may have at once (a fork bomb's ceiling).
  int process_limit = 64;
  std::size_t output_limit_bytes = 8192;  // kept per stream; the rest is read and dropped
  // The interpreter; empty means python3 from PATH, resolved once to its real executable (so
  // wrapper scripts such as pyenv shims run only for the lookup, not for every program).
  std::string python;
};

enum class ExitKind {
  kExited,  // exit_code is valid
  // Killed by `signal`: a crash, os.kill(...), or SIGXCPU at the CPU limit. bwrap reports a
  // signal N as exit status 128 + N, so a program that exits with such a status itself
  // (sys.exit(139)) reads as signaled too.
  kSignaled,
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
};

// Runs `source` as a Python program in the sandbox. Throws polestar::Error only when the sandbox
// itself cannot work (no python3, no bwrap, namespaces forbidden, fork failure), saying how to
// fix it; anything the program does, including hanging, crashing or exiting early, is reported
// in the result.
SandboxResult RunPython(const std::string& source, const SandboxOptions& options);

const char* ExitKindName(ExitKind kind);

}  // namespace polestar::eval
