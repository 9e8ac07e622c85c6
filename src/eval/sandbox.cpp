#include "eval/sandbox.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "base/error.h"

namespace polestar::eval {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Any *_proxy variable points here: a port on which nothing listens (discard).
constexpr const char* kDeadProxy = "http://127.0.0.1:9";
// Reads per stream before the collector looks at the clock again, so a program that writes
// without pause cannot keep it from its deadline.
constexpr int kReadsPerRound = 16;
// What the program writes to file descriptor 3 is kept up to this size.
constexpr std::size_t kStatusLimit = 4096;
// After the program exits, leftover output is drained for at most this long.
constexpr auto kDrainGrace = std::chrono::milliseconds(200);
// How often the collector checks whether the child has exited while its pipes stay open.
constexpr int kExitPollMs = 10;

std::string ErrnoText() { return std::strerror(errno); }

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

struct Pipe {
  int read = -1;
  int write = -1;
};

Pipe MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) Fail("sandbox: pipe2 failed: ", ErrnoText());
  return {fds[0], fds[1]};
}

// A resource limit to apply in the child; value is clamped to the current hard limit there.
struct Limit {
  int resource;
  rlim_t value;
};

// Everything the child needs, prepared before fork: between fork and exec only
// async-signal-safe system calls may run (the parent may have other threads).
struct ChildPlan {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  bool inherit_env = false;
  std::string cwd;  // empty: stay
  std::vector<Limit> limits;
  bool isolate_network = false;
  std::vector<char*> argv;
  std::vector<char*> envp;

  void Finish() {
    for (auto& arg : argv_storage) argv.push_back(arg.data());
    argv.push_back(nullptr);
    for (auto& var : env_storage) envp.push_back(var.data());
    envp.push_back(nullptr);
  }
};

// The child's side of the report pipe: one byte (network isolated or not), then, only if exec
// fails, the errno of the failure.
[[noreturn]] void RunChild(const ChildPlan& plan, std::array<int, 4> target_fds, int report_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Move every source above the target numbers first, so no dup2 clobbers a later source.
  for (int& fd : target_fds) {
    if (fd >= 0) fd = fcntl(fd, F_DUPFD_CLOEXEC, 16);
  }
  for (int target = 0; target < 4; ++target) {
    if (target_fds[target] >= 0) dup2(target_fds[target], target);  // clears FD_CLOEXEC
  }
  char isolated = 0;
  if (plan.isolate_network) {
    isolated = unshare(CLONE_NEWNET) == 0 || unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
  }
  (void)!write(report_fd, &isolated, 1);
  if (!plan.cwd.empty() && chdir(plan.cwd.c_str()) != 0) {
    const int error = errno;
    (void)!write(report_fd, &error, sizeof(error));
    _exit(127);
  }
  // Start from a clean signal state: the caller may block or ignore signals (SIGXCPU among
  // them), and both survive exec.
  sigset_t no_signals;
  sigemptyset(&no_signals);
  sigprocmask(SIG_SETMASK, &no_signals, nullptr);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int number : {SIGXCPU, SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGHUP}) {
    sigaction(number, &default_action, nullptr);
  }
  for (const Limit& limit : plan.limits) {
    rlimit current;
    if (getrlimit(limit.resource, &current) != 0) continue;
    const rlim_t value = std::min(limit.value, current.rlim_max);
    rlimit wanted{value, value};
    // The CPU limit's soft value sends SIGXCPU; the hard one a second later guarantees SIGKILL.
    if (limit.resource == RLIMIT_CPU && value < current.rlim_max) wanted.rlim_max = value + 1;
    setrlimit(limit.resource, &wanted);
  }
#ifdef SYS_close_range
  // Descriptors the caller opened without O_CLOEXEC (model files, sockets) stay out of the
  // program. Needs Linux 5.11; older kernels refuse and the descriptors leak harmlessly.
  syscall(SYS_close_range, 4u, ~0u, CLOSE_RANGE_CLOEXEC);
#endif
  if (plan.inherit_env) {
    execv(plan.argv[0], plan.argv.data());
  } else {
    execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  }
  const int error = errno;
  (void)!write(report_fd, &error, sizeof(error));
  _exit(127);
}

struct Stream {
  int fd = -1;
  std::string* text = nullptr;
  bool* truncated = nullptr;
  std::size_t limit = 0;  // bytes kept; the rest is read and dropped
};

// Reads what is available on each open stream (at most kReadsPerRound reads each); closes
// streams at EOF. Returns the number of streams still open.
int ReadAvailable(std::vector<Stream>& streams) {
  std::array<char, 65536> buffer;
  int open = 0;
  for (Stream& stream : streams) {
    for (int reads = 0; stream.fd >= 0 && reads < kReadsPerRound; ++reads) {
      const ssize_t n = read(stream.fd, buffer.data(), buffer.size());
      if (n > 0) {
        const std::size_t room = stream.limit - std::min(stream.limit, stream.text->size());
        stream.text->append(buffer.data(), std::min(room, static_cast<std::size_t>(n)));
        if (static_cast<std::size_t>(n) > room) *stream.truncated = true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      CloseFd(stream.fd);  // EOF or a read error
    }
    if (stream.fd >= 0) ++open;
  }
  return open;
}

// Waits up to `timeout` for any stream to become readable, then reads.
int PollAndRead(std::vector<Stream>& streams, Clock::duration timeout) {
  std::vector<pollfd> fds;
  for (const Stream& stream : streams) {
    if (stream.fd >= 0) fds.push_back({stream.fd, POLLIN, 0});
  }
  const int ms = static_cast<int>(
      std::max<std::int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(timeout).count()));
  if (fds.empty()) {
    if (ms > 0) poll(nullptr, 0, ms);
    return 0;
  }
  poll(fds.data(), fds.size(), ms);
  return ReadAvailable(streams);
}

bool HasExited(pid_t pid) {
  siginfo_t info{};
  // WNOWAIT leaves the zombie in place, so its process group id cannot be reused while the
  // caller still sends signals to the group.
  return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

struct ProcessOutcome {
  SandboxResult result;
  bool exec_failed = false;
  int exec_errno = 0;
};

// Forks, runs `plan` and collects its output until it exits or `timeout` passes.
ProcessOutcome RunProcess(ChildPlan& plan, Clock::duration timeout, std::size_t output_limit) {
  plan.Finish();
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) Fail("sandbox: cannot open /dev/null: ", ErrnoText());
  Pipe out = MakePipe(), err = MakePipe(), status = MakePipe(), report = MakePipe();

  ProcessOutcome outcome;
  SandboxResult& result = outcome.result;
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    const std::string reason = ErrnoText();
    for (int fd : {null_fd, out.read, out.write, err.read, err.write, status.read, status.write,
                   report.read, report.write}) {
      close(fd);
    }
    Fail("sandbox: fork failed: ", reason);
  }
  if (pid == 0) RunChild(plan, {null_fd, out.write, err.write, status.write}, report.write);

  setpgid(pid, pid);  // also done by the child; whichever runs first wins the race harmlessly
  int closing_null = null_fd;
  CloseFd(closing_null);
  CloseFd(out.write);
  CloseFd(err.write);
  CloseFd(status.write);
  CloseFd(report.write);

  // The report pipe reaches EOF at exec (close-on-exec) or when the child gives up.
  std::array<char, 1 + sizeof(int)> report_bytes{};
  std::size_t report_size = 0;
  while (report_size < report_bytes.size()) {
    const ssize_t n =
        read(report.read, report_bytes.data() + report_size, report_bytes.size() - report_size);
    if (n > 0) {
      report_size += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  CloseFd(report.read);
  result.network_isolated = report_size >= 1 && report_bytes[0] != 0;
  if (report_size == report_bytes.size()) {
    outcome.exec_failed = true;
    std::memcpy(&outcome.exec_errno, report_bytes.data() + 1, sizeof(int));
  }

  bool status_truncated = false;
  std::vector<Stream> streams = {
      {out.read, &result.stdout_text, &result.stdout_truncated, output_limit},
      {err.read, &result.stderr_text, &result.stderr_truncated, output_limit},
      {status.read, &result.status_text, &status_truncated, kStatusLimit}};
  for (const Stream& stream : streams) fcntl(stream.fd, F_SETFL, O_NONBLOCK);

  const auto deadline = start + timeout;
  bool timed_out = false;
  while (!HasExited(pid)) {
    const auto now = Clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const auto wait =
        std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(kExitPollMs));
    PollAndRead(streams, wait);
  }
  // Kill whatever is left of the group (the program itself on timeout, stray children
  // otherwise), then take the rest of the output they left in the pipes.
  kill(-pid, SIGKILL);
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto drain_end = Clock::now() + kDrainGrace;
  while (Clock::now() < drain_end && ReadAvailable(streams) > 0) {
    PollAndRead(streams, drain_end - Clock::now());
  }
  for (Stream& stream : streams) CloseFd(stream.fd);

  if (timed_out) {
    result.kind = ExitKind::kTimedOut;
  } else if (WIFSIGNALED(wait_status)) {
    result.kind = ExitKind::kSignaled;
    result.signal = WTERMSIG(wait_status);
  } else {
    result.kind = ExitKind::kExited;
    result.exit_code = WEXITSTATUS(wait_status);
  }
  return outcome;
}

std::optional<std::string> FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

// Runs `interpreter` once (with the caller's environment, which wrapper scripts need) to learn
// the real executable behind it.
std::string AskRealExecutable(const std::string& interpreter) {
  ChildPlan plan;
  plan.argv_storage = {interpreter, "-I", "-c", "import sys; sys.stdout.write(sys.executable)"};
  plan.inherit_env = true;
  const ProcessOutcome outcome = RunProcess(plan, std::chrono::seconds(60), 4096);
  if (outcome.exec_failed) {
    Fail("sandbox: cannot run ", interpreter, ": ", std::strerror(outcome.exec_errno));
  }
  const SandboxResult& result = outcome.result;
  if (result.kind != ExitKind::kExited || result.exit_code != 0 || result.stdout_text.empty() ||
      result.stdout_text[0] != '/') {
    Fail("sandbox: ", interpreter, " did not report its executable (exit ", result.exit_code,
         ", stderr: ", result.stderr_text.substr(0, 300), ")");
  }
  return result.stdout_text;
}

class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "polestar-sandbox-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      Fail("sandbox: cannot create a temporary folder from ", pattern, ": ", ErrnoText());
    }
    path_ = pattern;
  }
  ~TempFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

rlim_t ToRlim(double seconds) { return static_cast<rlim_t>(std::max(1.0, std::ceil(seconds))); }

}  // namespace

std::string ResolvePython(const std::string& configured) {
  static std::mutex mutex;
  static std::map<std::string, std::string> resolved;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = resolved.find(configured); it != resolved.end()) return it->second;

  std::string interpreter = configured;
  if (interpreter.empty() || interpreter.find('/') == std::string::npos) {
    const std::string name = interpreter.empty() ? "python3" : interpreter;
    const std::optional<std::string> found = FindInPath(name);
    if (!found) {
      Fail("sandbox: ", name, " not found in PATH (",
           std::getenv("PATH") ? std::getenv("PATH") : "",
           "); HumanEval and MBPP grading run the code with it; scripts/install-deps.sh installs "
           "python3");
    }
    interpreter = *found;
  } else if (access(interpreter.c_str(), X_OK) != 0) {
    Fail("sandbox: python interpreter ", interpreter, " is not executable: ", ErrnoText());
  }
  const std::string real = AskRealExecutable(interpreter);
  resolved.emplace(configured, real);
  return real;
}

SandboxResult RunPython(const std::string& source, const SandboxOptions& options) {
  if (!(options.wall_timeout_s > 0)) {
    Fail("sandbox: wall timeout must be positive, got ", options.wall_timeout_s);
  }
  const std::string python = ResolvePython(options.python);
  TempFolder folder;
  const std::string program = folder.path() + "/program.py";
  {
    std::ofstream file(program, std::ios::binary);
    file << source;
    if (!file.good()) Fail("sandbox: cannot write ", program);
  }

  ChildPlan plan;
  // -I: ignore PYTHON* variables, the user site and the script's folder on sys.path;
  // -B: write no bytecode next to the interpreter's modules.
  plan.argv_storage = {python, "-I", "-B", program};
  const std::string python_dir = fs::path(python).parent_path().string();
  plan.env_storage = {
      "PATH=" + python_dir + ":/usr/local/bin:/usr/bin:/bin",
      "HOME=" + folder.path(),
      "TMPDIR=" + folder.path(),
      "LANG=C.UTF-8",
      "LC_ALL=C.UTF-8",
      "OMP_NUM_THREADS=1",
      "OPENBLAS_NUM_THREADS=1",
      "MKL_NUM_THREADS=1",
  };
  for (const char* proxy : {"http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "HTTP_PROXY",
                            "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY"}) {
    plan.env_storage.push_back(std::string(proxy) + "=" + kDeadProxy);
  }
  plan.cwd = folder.path();
  const double cpu_s = options.cpu_limit_s > 0 ? options.cpu_limit_s : options.wall_timeout_s;
  plan.limits = {{RLIMIT_CPU, ToRlim(cpu_s)},
                 {RLIMIT_AS, static_cast<rlim_t>(options.memory_limit_bytes)},
                 {RLIMIT_FSIZE, static_cast<rlim_t>(options.file_size_limit_bytes)},
                 {RLIMIT_CORE, 0}};
  plan.isolate_network = options.isolate_network;

  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.wall_timeout_s));
  const ProcessOutcome outcome = RunProcess(plan, timeout, options.output_limit_bytes);
  if (outcome.exec_failed) {
    Fail("sandbox: cannot start ", python, ": ", std::strerror(outcome.exec_errno));
  }
  return outcome.result;
}

const char* ExitKindName(ExitKind kind) {
  switch (kind) {
    case ExitKind::kExited:
      return "exited";
    case ExitKind::kSignaled:
      return "signaled";
    case ExitKind::kTimedOut:
      return "timed_out";
  }
  return "unknown";
}

}  // namespace polestar::eval
