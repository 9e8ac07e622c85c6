#include "eval/sandbox.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
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
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"

namespace polestar::eval {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The program's working folder and HOME inside the sandbox (on its private /tmp).
constexpr const char* kWorkDir = "/tmp/polestar-sandbox";
// bwrap copies the program from this descriptor into kWorkDir/program.py.
constexpr int kProgramFd = 4;
// Descriptors 0-3 are the program's; kProgramFd is bwrap's.
constexpr int kChildFds = 5;
// User nobody: whom the program runs as when the caller is root.
constexpr const char* kNobody = "65534";
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
  std::vector<Limit> limits;
  int program_fd = -1;  // becomes kProgramFd in the child; -1: none
  std::vector<char*> argv;
  std::vector<char*> envp;

  void Finish() {
    for (auto& arg : argv_storage) argv.push_back(arg.data());
    argv.push_back(nullptr);
    for (auto& var : env_storage) envp.push_back(var.data());
    envp.push_back(nullptr);
  }
};

// The child's side of the report pipe: the errno of a failed exec; nothing when exec succeeds.
[[noreturn]] void RunChild(const ChildPlan& plan, std::array<int, kChildFds> target_fds,
                           int report_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Move every source above the target numbers first, so no dup2 clobbers a later source.
  for (int& fd : target_fds) {
    if (fd >= 0) fd = fcntl(fd, F_DUPFD_CLOEXEC, 16);
  }
  for (int target = 0; target < kChildFds; ++target) {
    if (target_fds[target] >= 0) {
      dup2(target_fds[target], target);  // clears FD_CLOEXEC
    } else {
      close(target);  // not the caller's descriptor of that number
    }
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
  syscall(SYS_close_range, unsigned{kChildFds}, ~0u, CLOSE_RANGE_CLOEXEC);
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
  if (pid == 0) {
    RunChild(plan, {null_fd, out.write, err.write, status.write, plan.program_fd}, report.write);
  }

  setpgid(pid, pid);  // also done by the child; whichever runs first wins the race harmlessly
  int closing_null = null_fd;
  CloseFd(closing_null);
  CloseFd(out.write);
  CloseFd(err.write);
  CloseFd(status.write);
  CloseFd(report.write);

  // The report pipe reaches EOF at exec (close-on-exec) or when the child gives up.
  std::array<char, sizeof(int)> report_bytes{};
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
  if (report_size == report_bytes.size()) {
    outcome.exec_failed = true;
    std::memcpy(&outcome.exec_errno, report_bytes.data(), sizeof(int));
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

// What an interpreter says about itself: the real executable behind any wrapper, and the
// folders its installation lives in.
struct Interpreter {
  std::string executable;
  std::vector<std::string> folders;  // prefix, exec_prefix and a virtualenv's base_ ones
};

// Runs `interpreter` once (with the caller's environment, which wrapper scripts such as pyenv
// shims need) outside the sandbox, so that the sandbox runs the real executable directly.
Interpreter AskInterpreter(const std::string& interpreter) {
  ChildPlan plan;
  plan.argv_storage = {interpreter, "-I", "-c",
                       "import sys; sys.stdout.write('\\n'.join([sys.executable, sys.prefix, "
                       "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))"};
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
  Interpreter found;
  std::string_view rest = result.stdout_text;
  while (!rest.empty()) {
    const std::size_t newline = std::min(rest.find('\n'), rest.size());
    const std::string line(rest.substr(0, newline));
    rest.remove_prefix(std::min(rest.size(), newline + 1));
    if (found.executable.empty()) {
      found.executable = line;
      found.folders.push_back(fs::path(line).parent_path().string());
    } else if (!line.empty() && line[0] == '/') {
      found.folders.push_back(line);
    }
  }
  return found;
}

std::string ResolveInterpreterPath(const std::string& configured) {
  if (!configured.empty() && configured.find('/') != std::string::npos) {
    if (access(configured.c_str(), X_OK) != 0) {
      Fail("sandbox: python interpreter ", configured, " is not executable: ", ErrnoText());
    }
    return configured;
  }
  const std::string name = configured.empty() ? "python3" : configured;
  const std::optional<std::string> found = FindInPath(name);
  if (!found) {
    Fail("sandbox: ", name, " not found in PATH (", std::getenv("PATH") ? std::getenv("PATH") : "",
         "); HumanEval and MBPP grading run the code with it; scripts/install-deps.sh installs "
         "python3");
  }
  return *found;
}

// A program the sandbox needs, from PATH; `package` is the Debian package that has it.
std::string FindSandboxTool(const std::string& name, const char* package) {
  const std::optional<std::string> found = FindInPath(name);
  if (!found) {
    Fail("sandbox: ", name, " not found in PATH (", std::getenv("PATH") ? std::getenv("PATH") : "",
         "); HumanEval and MBPP run model-written code only inside bubblewrap's sandbox, which "
         "needs it: install ",
         package, " (apt-get install ", package, "; scripts/install-deps.sh does)");
  }
  return *found;
}

bool IsWithin(const std::string& path, const std::string& folder) {
  return path == folder || path.starts_with(folder + "/");
}

// How to start programs in the sandbox with one interpreter; found and checked once.
struct Jail {
  std::string bwrap;
  std::string prlimit;
  std::string setpriv;  // only when the caller is root: the program becomes nobody with it
  std::string python;   // the real executable
  std::vector<std::string> read_only_view;  // bwrap arguments
};

// bwrap arguments for the read-only part of the program's filesystem: the system's programs and
// libraries, the interpreter's installation, and the /etc files that the dynamic loader and
// user names need (no secrets: passwords are in /etc/shadow).
std::vector<std::string> ReadOnlyView(const Interpreter& interpreter) {
  std::vector<std::string> args;
  std::vector<std::string> shown;  // folders the view has
  std::set<std::string> made;
  // bwrap makes the missing parents of a mount point with the source's parents' modes (0700
  // under /root); user nobody must be able to pass through them.
  const auto mount = [&](const std::string& path) {
    std::vector<std::string> parents;
    for (fs::path parent = fs::path(path).parent_path(); parent != parent.root_path();
         parent = parent.parent_path()) {
      parents.push_back(parent.string());
    }
    for (auto it = parents.rbegin(); it != parents.rend(); ++it) {
      if (made.insert(*it).second) args.insert(args.end(), {"--perms", "0755", "--dir", *it});
    }
    args.insert(args.end(), {"--ro-bind", path, path});
    shown.push_back(path);
  };
  std::error_code ignored;
  for (const char* dir : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    if (fs::is_symlink(dir, ignored)) {  // merged /usr: /bin -> usr/bin
      args.insert(args.end(), {"--symlink", fs::read_symlink(dir, ignored).string(), dir});
      shown.push_back(dir);
    } else if (fs::is_directory(dir, ignored)) {
      mount(dir);
    }
  }
  for (const char* file :
       {"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group"}) {
    if (fs::exists(file, ignored)) mount(file);
  }
  std::vector<std::string> folders = interpreter.folders;
  std::sort(folders.begin(), folders.end());  // parents before their children
  for (const std::string& folder : folders) {
    if (std::none_of(shown.begin(), shown.end(),
                     [&](const std::string& has) { return IsWithin(folder, has); })) {
      mount(folder);
    }
  }
  return args;
}

// The command that runs program.py in the sandbox: bwrap, its options, then (as root) setpriv,
// prlimit and the interpreter.
std::vector<std::string> JailCommand(const Jail& jail, const SandboxOptions& options) {
  std::vector<std::string> argv = {jail.bwrap};
  if (jail.setpriv.empty()) {
    // Not root: a user namespace makes the others possible; the program stays the caller's
    // user and may not make user namespaces of its own.
    argv.insert(argv.end(), {"--unshare-all", "--unshare-user", "--disable-userns"});
  } else {
    // Root: no user namespace, which would map the program to root, whom the kernel exempts
    // from RLIMIT_NPROC. setpriv, below, uses the two capabilities to become nobody and drops
    // them (bwrap drops all others and sets no_new_privs).
    argv.insert(argv.end(),
                {"--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"});
  }
  argv.insert(argv.end(), {"--die-with-parent", "--new-session"});
  argv.insert(argv.end(), jail.read_only_view.begin(), jail.read_only_view.end());
  const std::string scratch = std::to_string(options.scratch_limit_bytes);
  const std::string work_dir = kWorkDir;
  argv.insert(argv.end(), {"--dev",
                           "/dev",
                           "--proc",
                           "/proc",
                           "--perms",
                           "1777",
                           "--size",
                           scratch,
                           "--tmpfs",
                           "/tmp",
                           "--perms",
                           "1777",
                           "--size",
                           scratch,
                           "--tmpfs",
                           "/dev/shm",
                           "--perms",
                           "0777",
                           "--dir",
                           work_dir,
                           "--perms",
                           "0644",
                           "--file",
                           std::to_string(kProgramFd),
                           work_dir + "/program.py",
                           "--remount-ro",
                           "/dev",
                           "--remount-ro",
                           "/",
                           "--chdir",
                           work_dir,
                           "--"});
  if (!jail.setpriv.empty()) {
    argv.insert(argv.end(),
                {jail.setpriv, std::string("--reuid=") + kNobody, std::string("--regid=") + kNobody,
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"});
  }
  // -I: ignore PYTHON* variables, the user site and the script's folder on sys.path;
  // -B: write no bytecode.
  argv.insert(argv.end(), {jail.prlimit, "--nproc=" + std::to_string(options.process_limit), "--",
                           jail.python, "-I", "-B", "program.py"});
  return argv;
}

rlim_t ToRlim(double seconds) { return static_cast<rlim_t>(std::max(1.0, std::ceil(seconds))); }

struct OwnedFd {
  int fd = -1;
  ~OwnedFd() { CloseFd(fd); }
};

SandboxResult RunInJail(const Jail& jail, const std::string& source,
                        const SandboxOptions& options) {
  // The program reaches bwrap as a file in memory: nothing of it is written to the host's disk.
  OwnedFd program{memfd_create("polestar-program", MFD_CLOEXEC)};
  if (program.fd < 0) Fail("sandbox: memfd_create failed: ", ErrnoText());
  for (std::size_t done = 0; done < source.size();) {
    const ssize_t n = write(program.fd, source.data() + done, source.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail("sandbox: cannot write the program to memory: ", ErrnoText());
    done += static_cast<std::size_t>(n);
  }
  if (lseek(program.fd, 0, SEEK_SET) != 0) Fail("sandbox: lseek failed: ", ErrnoText());

  ChildPlan plan;
  plan.argv_storage = JailCommand(jail, options);
  plan.env_storage = {
      "PATH=" + fs::path(jail.python).parent_path().string() + ":/usr/local/bin:/usr/bin:/bin",
      std::string("HOME=") + kWorkDir,
      "TMPDIR=/tmp",
      "LANG=C.UTF-8",
      "LC_ALL=C.UTF-8",
      "OMP_NUM_THREADS=1",
      "OPENBLAS_NUM_THREADS=1",
      "MKL_NUM_THREADS=1",
  };
  const double cpu_s = options.cpu_limit_s > 0 ? options.cpu_limit_s : options.wall_timeout_s;
  plan.limits = {{RLIMIT_CPU, ToRlim(cpu_s)},
                 {RLIMIT_AS, static_cast<rlim_t>(options.memory_limit_bytes)},
                 {RLIMIT_FSIZE, static_cast<rlim_t>(options.file_size_limit_bytes)},
                 {RLIMIT_CORE, 0}};
  plan.program_fd = program.fd;

  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.wall_timeout_s));
  ProcessOutcome outcome = RunProcess(plan, timeout, options.output_limit_bytes);
  if (outcome.exec_failed) {
    Fail("sandbox: cannot start ", jail.bwrap, ": ", std::strerror(outcome.exec_errno));
  }
  SandboxResult& result = outcome.result;
  // bwrap exits with 128 + N when the program was killed by signal N.
  if (result.kind == ExitKind::kExited && result.exit_code > 128 && result.exit_code - 128 < NSIG) {
    result.kind = ExitKind::kSignaled;
    result.signal = result.exit_code - 128;
    result.exit_code = -1;
  }
  return result;
}

// Finds the tools and the interpreter, and runs a program in the sandbox once: a machine that
// cannot build the sandbox is an error here, before any model code could run.
Jail MakeJail(const std::string& configured) {
  Jail jail;
  jail.bwrap = FindSandboxTool("bwrap", "bubblewrap");
  jail.prlimit = FindSandboxTool("prlimit", "util-linux");
  if (geteuid() == 0) jail.setpriv = FindSandboxTool("setpriv", "util-linux");
  const Interpreter interpreter = AskInterpreter(ResolveInterpreterPath(configured));
  jail.python = interpreter.executable;
  jail.read_only_view = ReadOnlyView(interpreter);

  constexpr const char* kGreeting = "polestar sandbox works";
  SandboxOptions check;
  check.wall_timeout_s = 60.0;
  const SandboxResult result =
      RunInJail(jail, std::string("import sys\nsys.stdout.write('") + kGreeting + "')\n", check);
  if (result.kind != ExitKind::kExited || result.exit_code != 0 ||
      result.stdout_text != kGreeting) {
    Fail("sandbox: bubblewrap (", jail.bwrap, ") could not run ", jail.python, " in its sandbox (",
         ExitKindName(result.kind), ", exit ", result.exit_code,
         "): ", result.stderr_text.substr(0, 500),
         " HumanEval and MBPP run model-written code only inside it, so nothing ran. bwrap "
         "needs namespaces: run as root, or allow unprivileged user namespaces "
         "(user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1, Ubuntu's "
         "kernel.apparmor_restrict_unprivileged_userns = 0); in a container, a seccomp profile "
         "that permits unshare and mount (docker run --privileged). Check with: bwrap --ro-bind "
         "/ / --unshare-all true");
  }
  return jail;
}

const Jail& PreparedJail(const std::string& configured) {
  static std::mutex mutex;
  static std::map<std::string, Jail> jails;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = jails.find(configured);
  if (it == jails.end()) it = jails.emplace(configured, MakeJail(configured)).first;
  return it->second;
}

}  // namespace

SandboxResult RunPython(const std::string& source, const SandboxOptions& options) {
  if (!(options.wall_timeout_s > 0)) {
    Fail("sandbox: wall timeout must be positive, got ", options.wall_timeout_s);
  }
  if (options.process_limit < 1) {
    Fail("sandbox: process limit must be at least 1, got ", options.process_limit);
  }
  if (options.scratch_limit_bytes == 0) Fail("sandbox: scratch limit must be positive");
  return RunInJail(PreparedJail(options.python), source, options);
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
