// Errors. User-facing problems (a corrupt file, a bad flag, an unknown architecture) throw
// polestar::Error with a message that names the file or value and what is wrong; the CLI and
// the server catch it at their boundary. Broken internal invariants use PS_CHECK, which
// aborts with file:line: those are bugs, not input errors. Kernels never throw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace polestar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates anything streamable: Cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string Cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
[[noreturn]] void Fail(const Args&... args) {
  throw Error(Cat(args...));
}

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition);

}  // namespace polestar

#define PS_CHECK(condition)                                                    \
  do {                                                                         \
    if (!(condition)) ::polestar::CheckFailed(__FILE__, __LINE__, #condition); \
  } while (0)
