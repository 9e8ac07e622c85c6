// libFuzzer target: ParseGguf and ReadGgufVocab on arbitrary bytes must either succeed with
// every tensor inside the input or throw polestar::Error; anything else is a bug.
#include <cstdint>
#include <cstdlib>

#include "base/error.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polestar;
  try {
    const GgufFile file = ParseGguf(data, size, "fuzz.gguf");
    uint8_t checksum = 0;
    for (const GgufTensorInfo& t : file.tensors) {
      if (file.data_offset + t.offset + t.bytes > size) std::abort();
      const uint8_t* begin = data + file.data_offset + t.offset;
      for (uint64_t i = 0; i < t.bytes; ++i) checksum ^= begin[i];  // reads are in bounds
    }
    if (file.metadata.Has("tokenizer.ggml.tokens")) ReadGgufVocab(file.metadata);
    return checksum == 0x5a ? 0 : 0;
  } catch (const Error&) {
    return 0;
  }
}
