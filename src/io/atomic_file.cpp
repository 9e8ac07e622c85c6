#include "io/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace polestar {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // Beside the destination (the same file system, so rename is atomic), unique per process
  // and per writer.
  static std::atomic<int> counter{0};
  temporary_ = Cat(path_, ".tmp-", ::getpid(), "-", counter++);
  file_ = std::fopen(temporary_.c_str(), "wbx");
  if (file_ == nullptr) Fail(path_, ": cannot create: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(temporary_.c_str());
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
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
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
