#include "base/error.h"

#include <cstdio>
#include <cstdlib>

namespace polestar {

void CheckFailed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "%s:%d: internal check failed: %s\n", file, line, condition);
  std::abort();
}

}  // namespace polestar
