// libFuzzer target: the server's request path on arbitrary bytes. The input is read as an
// HTTP request (ParseRequest) and, whole or as the parsed body, as a JSON body
// (ParseJsonBody, then ParseCompletionRequest for both endpoints and RequestFromQuery for
// the query). Each step must succeed or report the problem as a status (ApiError, a parse
// error); a crash, a stack overflow or a broken invariant is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/error.h"
#include "request_fuzz_model.h"
#include "server/api.h"
#include "server/http.h"

namespace {

using namespace polestar;

void CheckRequestBody(std::string_view body, const std::multimap<std::string, std::string>& query) {
  static const fuzz::ByteCodec codec;
  static const ModelConfig config = fuzz::FuzzModel();
  const RequestLimits limits = fuzz::FuzzLimits();
  const DecodeOptions defaults = fuzz::FuzzDefaults();
  try {
    const nlohmann::json parsed = ParseJsonBody(body);
    for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
      try {
        const CompletionRequest r =
            ParseCompletionRequest(parsed, endpoint, defaults, codec, config, limits);
        if (r.prompts.empty() || r.max_tokens > limits.max_tokens) std::abort();
      } catch (const ApiError& e) {
        if (e.status != 400) std::abort();
      }
    }
    DumpJson(parsed);
  } catch (const ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    const nlohmann::json from_query = RequestFromQuery(query);
    ParseCompletionRequest(from_query, Endpoint::kCompletions, defaults, codec, config, limits);
  } catch (const ApiError& e) {
    if (e.status != 400) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  http::Limits limits;
  limits.max_body_bytes = 4096;
  limits.max_head_bytes = 2048;
  limits.max_target_bytes = 512;
  const http::ParseResult parsed = http::ParseRequest(input, limits);
  switch (parsed.state) {
    case http::ParseResult::State::kComplete: {
      if (parsed.consumed == 0 || parsed.consumed > size) std::abort();
      if (parsed.request.target.rfind(parsed.request.path, 0) != 0) std::abort();
      // One byte less is a request still arriving: a request ends exactly where it says.
      if (http::ParseRequest(input.substr(0, parsed.consumed - 1), limits).state !=
          http::ParseResult::State::kIncomplete)
        std::abort();
      CheckRequestBody(parsed.request.body, parsed.request.query);
      break;
    }
    case http::ParseResult::State::kError:
      if (parsed.error_status < 400 || parsed.error_status > 505) std::abort();
      CheckRequestBody(input, {});
      break;
    case http::ParseResult::State::kIncomplete:
      CheckRequestBody(input, {});
      break;
  }
  return 0;
}
