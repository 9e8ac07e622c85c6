// libFuzzer target: ReadSafetensorsFile on arbitrary bytes (through an in-memory file) must
// either succeed with every tensor inside the file or throw polestar::Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polestar;
  const int fd = memfd_create("safetensors-fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (size > 0 && write(fd, data, size) != ssize_t(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    TensorStore store;
    ReadSafetensorsFile(path, store);
    for (const auto& [name, t] : store.tensors()) {
      if (t.bytes > size || t.data == nullptr && t.bytes > 0) std::abort();
      uint8_t checksum = 0;
      for (size_t i = 0; i < t.bytes; ++i) checksum ^= t.data[i];
      if (checksum == 0x5a && name.empty()) close(fd);
    }
  } catch (const Error&) {
  }
  close(fd);
  return 0;
}
