// libFuzzer target: a tokenizer.json from arbitrary bytes must either give a Tokenizer or throw
// polestar::Error. A Tokenizer it gives must encode a fixed text to ids inside its vocabulary,
// decode them (at once and streaming, to the same text) and reject ids outside it with Error.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace {

// Letters, digits, spaces, an added-token look-alike, non-ASCII and one ill-formed byte.
constexpr std::string_view kText =
    "Hello, world! 123  tabs\tand\nlines <|im_end|> caf\xc3\xa9 \xff.";
// As if the model's config.json said so: ids must lie below it.
constexpr int kModelVocabSize = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polestar;
  const std::string where = "fuzz/tokenizer.json";
  try {
    const nlohmann::json json =
        ParseJsonText(std::string_view(reinterpret_cast<const char*>(data), size), where);
    const Tokenizer tokenizer(ParseTokenizerJson(json, where, kModelVocabSize));
    if (tokenizer.vocab_size() > kModelVocabSize) std::abort();
    const std::vector<int> ids = tokenizer.Encode(kText);
    for (int id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
    }
    const std::string text = tokenizer.Decode(ids);
    StreamingDecoder streaming(tokenizer);
    std::string streamed;
    for (int id : ids) streamed += streaming.Push(id);
    streamed += streaming.Finish();
    if (streamed != text) std::abort();
    for (int id : {-1, tokenizer.vocab_size()}) {
      try {
        tokenizer.Decode(std::vector<int>{id});
        std::abort();
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
