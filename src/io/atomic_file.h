// Output files that are either complete or absent. Data goes to a temporary file beside the
// destination and is renamed over it only when every byte is written and flushed, so a failure
// (disk full, an exception, a crash, a signal) never leaves a partial or damaged file, and the
// old file stays intact until the new one is whole.
//
// What may be replaced: a regular file, or nothing (the file is created). A symbolic link is
// written through: its final target (a regular file or nothing) is replaced atomically in the
// target's own directory and the link itself is kept. Anything else (a directory, a FIFO, a
// device, a socket) is refused with an Error and left untouched: renaming over it would
// destroy it, and writing into it is not an atomic replacement.
//
// The temporary file is named `.NAME.polestar-tmp.PID.XXXXXX` beside the destination NAME.
// SIGINT or SIGTERM during a write removes it (when those signals have their default action;
// a program with its own handlers, like `serve`, unwinds through ~AtomicFile instead), and one
// left by a process that no longer runs (killed hard, or a power cut) is removed by the next
// write to the same destination.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace polestar {

class AtomicFile {
 public:
  // Creates the temporary file; throws Error naming `path` when it cannot, or when `path`
  // is not something it may replace.
  explicit AtomicFile(std::string path);
  // Without Commit(), removes the temporary file and leaves `path` as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws Error naming `path` on a short write.
  void Write(const void* data, size_t bytes);
  void Write(std::string_view text) { Write(text.data(), text.size()); }
  // Flushes, syncs and renames the temporary file to the destination; throws Error on failure.
  void Commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;         // as given, for messages
  std::string destination_;  // what is replaced: path_, or the final target of its links
  std::string temporary_;
  std::FILE* file_ = nullptr;
  int signal_slot_ = -1;  // the slot the signal handler reads temporary_ from; -1: none
  bool committed_ = false;
};

// Writes `contents` to `path` through an AtomicFile.
void WriteFileAtomically(const std::string& path, std::string_view contents);

// Throws Error when `output` names the same file as one of `inputs` (also through links):
// writing it would destroy the data being read.
void FailIfOutputIsAnInput(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace polestar
