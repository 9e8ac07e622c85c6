#include "io/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <random>

#include "base/error.h"

namespace polestar {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kTemporaryMarker = ".polestar-tmp.";

// The temporary files that SIGINT and SIGTERM remove. A slot is free, being filled or full;
// the handler reads only full slots, and only with async-signal-safe calls. No command writes
// more than a few files at once; a writer beyond the slots goes unregistered, and its file,
// if a signal strands it, is removed by the next write's sweep of stale temporaries.
enum SlotState : int { kFree, kFilling, kFull };
struct SignalSlot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads slot states");
SignalSlot signal_slots[32];

extern "C" void RemoveTemporariesAndDie(int signal) {
  for (SignalSlot& slot : signal_slots) {
    if (slot.state.load() == kFull) ::unlink(slot.path);
  }
  // Die of the signal as if no handler had been there: the exit status tells the parent.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal, &default_action, nullptr);
  raise(signal);  // blocked until this handler returns, then the default action runs
}

// Installs the handler for SIGINT and SIGTERM where they have their default action; a
// program that handles or ignores them keeps its choice (and unwinds through ~AtomicFile).
// Checked at every file, not once: a process may restore the defaults (a forked child does).
void InstallSignalHandlers() {
  for (const int signal : {SIGINT, SIGTERM}) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
    struct sigaction action {};
    action.sa_handler = RemoveTemporariesAndDie;
    sigemptyset(&action.sa_mask);
    sigaction(signal, &action, nullptr);
  }
}

// The slot now holding `path`, or -1 when there is none free (or the path does not fit).
int RegisterTemporary(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < int(std::size(signal_slots)); ++i) {
    int expected = kFree;
    if (signal_slots[i].state.compare_exchange_strong(expected, kFilling)) {
      std::memcpy(signal_slots[i].path, path.c_str(), path.size() + 1);
      signal_slots[i].state.store(kFull);
      return i;
    }
  }
  return -1;
}

std::string_view KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// What a write to `path` replaces: `path` itself, or the final target of its links, when
// that is a regular file or does not exist; anything else is refused.
std::string Destination(const std::string& path) {
  fs::path current(path);
  for (int links = 0;; ++links) {
    struct stat info {};
    if (::lstat(current.c_str(), &info) != 0) {
      if (errno == ENOENT) return current.string();  // created; open() reports a missing folder
      Fail(path, ": cannot create: ", std::strerror(errno));
    }
    if (S_ISREG(info.st_mode)) return current.string();
    const std::string what =
        current == fs::path(path) ? std::string() : Cat(" (through links, ", current.string(), ")");
    if (!S_ISLNK(info.st_mode)) {
      Fail(path, what, ": is ", KindOf(info.st_mode),
           ", not a regular file; refusing to write over it");
    }
    if (links == 40) Fail(path, ": too many levels of symbolic links");
    std::error_code error;
    const fs::path target = fs::read_symlink(current, error);
    if (error) Fail(path, ": cannot read the link: ", error.message());
    current = target.is_absolute() ? target : current.parent_path() / target;
  }
}

// Removes the temporaries of `destination` whose writing process no longer runs.
void RemoveStaleTemporaries(const fs::path& destination) {
  const std::string prefix = Cat(".", destination.filename().string(), kTemporaryMarker);
  const fs::path folder = destination.has_parent_path() ? destination.parent_path() : ".";
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const char* digits = name.data() + prefix.size();
    const char* name_end = name.data() + name.size();
    pid_t pid = 0;
    const auto [after, parse_error] = std::from_chars(digits, name_end, pid);
    if (parse_error != std::errc() || after == name_end || *after != '.' || pid <= 0) continue;
    // Only "no such process" is proof: EPERM means it runs as another user.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;  // another writer may have removed it first
    fs::remove(it->path(), ignored);
  }
}

std::string RandomSuffix() {
  static constexpr std::string_view kAlphabet =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device device;
  std::string suffix(6, ' ');
  for (char& c : suffix) c = kAlphabet[device() % kAlphabet.size()];
  return suffix;
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), destination_(Destination(path_)) {
  InstallSignalHandlers();
  RemoveStaleTemporaries(destination_);
  // Beside the destination: the same file system, so rename is atomic.
  const fs::path destination(destination_);
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    temporary_ =
        (destination.parent_path() / Cat(".", destination.filename().string(), kTemporaryMarker,
                                         ::getpid(), ".", RandomSuffix()))
            .string();
    // 0666 as fopen would: the umask decides the final file's permissions.
    fd = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) {
      Fail(path_, ": cannot create: ", std::strerror(errno));
    }
  }
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int error = errno;
    ::close(fd);
    std::remove(temporary_.c_str());
    Fail(path_, ": cannot create: ", std::strerror(error));
  }
  // Registered once it exists and is ours: the handler must never remove another's file.
  signal_slot_ = RegisterTemporary(temporary_);
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(temporary_.c_str());
  if (signal_slot_ >= 0) signal_slots[signal_slot_].state.store(kFree);
}

void AtomicFile::Write(const void* data, size_t bytes) {
  PS_CHECK(file_ != nullptr);
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    Fail(path_, ": write failed: ", std::strerror(errno));
  }
}

void AtomicFile::Commit() {
  PS_CHECK(file_ != nullptr);
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const int flush_error = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed)
    Fail(path_, ": write failed: ", std::strerror(flushed ? errno : flush_error));
  // The destination may have been replaced while we wrote (by a FIFO, a directory, another
  // link): check again, so that what is renamed over is still what was checked.
  if (Destination(path_) != destination_) Fail(path_, ": was replaced while it was written");
  if (std::rename(temporary_.c_str(), destination_.c_str()) != 0) {
    Fail(path_, ": cannot replace: ", std::strerror(errno));
  }
  committed_ = true;
}

void WriteFileAtomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.Write(contents);
  file.Commit();
}

void FailIfOutputIsAnInput(const std::string& output, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(output, ec)) return;  // a new file cannot be an input
  for (const std::string& input : inputs) {
    if (fs::equivalent(output, input, ec)) {
      Fail(output, ": the output is one of the inputs (", input,
           "); writing it would destroy the data being read");
    }
  }
}

}  // namespace polestar
