// libFuzzer target: tokenizer_config.json from arbitrary bytes, applied to a fixed byte-level
// tokenizer, must either give a Tokenizer or throw polestar::Error. Its special ids must lie
// in the vocabulary, and a chat template it names must render a chat that encodes and
// decodes back to the rendered text.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/error.h"
#include "byte_level_tokenizer.h"
#include "io/json_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polestar;
  const std::string where = "fuzz/tokenizer_config.json";
  try {
    TokenizerSpec spec = fuzz::ByteLevelSpec();
    ApplyTokenizerConfig(
        ParseJsonText(std::string_view(reinterpret_cast<const char*>(data), size), where), where,
        spec);
    const Tokenizer tokenizer(std::move(spec));
    const SpecialIds& special = tokenizer.special_ids();
    for (int id : {special.bos, special.eos, special.pad, special.eot, special.mask, special.unk}) {
      if (id < -1 || id >= tokenizer.vocab_size()) std::abort();
    }
    const std::string prompt = ChatTemplateFor(tokenizer).Render(
        tokenizer, {{"system", "Be brief."}, {"user", " hi \xc3\xa9 "}});
    fuzz::CheckRoundTrip(tokenizer, prompt);
  } catch (const Error&) {
  }
  return 0;
}
