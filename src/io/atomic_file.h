// Output files that are either complete or absent. Data goes to a temporary file beside the
// destination and is renamed over it only when every byte is written and flushed, so a failure
// (disk full, an exception, a crash, a signal) never leaves a partial or damaged file, and the
// old file stays intact until the new one is whole.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace polestar {

class AtomicFile {
 public:
  // Creates the temporary file; throws Error naming `path` when it cannot.
  explicit AtomicFile(std::string path);
  // Without Commit(), removes the temporary file and leaves `path` as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws Error naming `path` on a short write.
  void Write(const void* data, size_t bytes);
  void Write(std::string_view text) { Write(text.data(), text.size()); }
  // Flushes, syncs and renames the temporary file to `path`; throws Error on failure.
  void Commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, temporary_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Writes `contents` to `path` through an AtomicFile.
void WriteFileAtomically(const std::string& path, std::string_view contents);

// Throws Error when `output` names the same file as one of `inputs` (also through links):
// writing it would destroy the data being read.
void FailIfOutputIsAnInput(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace polestar
