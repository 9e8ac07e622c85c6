// The OpenAI-compatible request and response bodies: parsing with strict validation (every
// problem is an ApiError with an HTTP status, never a crash), and the JSON the server sends.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "decode/options.h"
#include "model/config.h"
#include "server/scheduler.h"
#include "server/text_codec.h"

namespace polestar {

// An error answered with an OpenAI-style body: {"error": {code, message, type, param}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "",
           std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  nlohmann::json Body() const;

  int status;
  std::string type;   // invalid_request_error, authentication_error, rate_limit_error, ...
  std::string param;  // the offending field, "" when none
  std::string code;   // OpenAI's machine-readable code ("invalid_api_key", ...), "" for null
};

// Deepest nesting of arrays and objects a request body may have.
constexpr int kMaxJsonDepth = 64;
// A request body as JSON. Throws ApiError 400 when it is not JSON or nests deeper than
// kMaxJsonDepth, so no untrusted value reaches code that recurses over it unbounded.
nlohmann::json ParseJsonBody(std::string_view text);

enum class Endpoint { kCompletions, kChatCompletions };

struct RequestLimits {
  int max_prompt_tokens = 0;
  int max_tokens = 0;    // generation length
  int max_prompts = 16;  // prompts in one /v1/completions request
  int max_stop_strings = 16;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<std::vector<int>> prompts;  // [choices][P]
  DecodeOptions options;                  // gen_length: max_tokens rounded up to a block
  int max_tokens = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool stream_canvas = false;  // extension: a canvas event per denoising step
  bool stop_early = true;      // extension: end once the answer is complete
};

// Validates `body` against `endpoint`'s fields, the model and the limits; the decoding
// fields (option_schema.h: an option's name, an alias, or a flag's name with '_') may stand
// at the top level or inside a "diffusion" object. Throws ApiError; a validation error names
// the fields as a request does.
CompletionRequest ParseCompletionRequest(const nlohmann::json& body, Endpoint endpoint,
                                         const DecodeOptions& defaults, const TextCodec& codec,
                                         const ModelConfig& config, const RequestLimits& limits);

// A request body from URL query parameters (GET /v1/diffusion/stream), each value read as
// the type its field expects. Throws ApiError.
nlohmann::json RequestFromQuery(const std::multimap<std::string, std::string>& params);

// Response bodies. `id`, `created` and `model` are shared by all chunks of one response.
struct ResponseIdentity {
  std::string id;
  int64_t created = 0;
  std::string model;
};
ResponseIdentity NewResponseIdentity(Endpoint endpoint, const std::string& model);

nlohmann::json CompletionResponse(const CompletionRequest& request,
                                  const ResponseIdentity& identity,
                                  const std::vector<JobOutcome>& outcomes);
// A streamed chunk carrying `delta` (chat: the first chunk also names the role); with a
// finish_reason, the closing chunk, which also carries the timings.
nlohmann::json StreamChunk(const CompletionRequest& request, const ResponseIdentity& identity,
                           const std::string& delta, bool first, const JobOutcome* finished);
nlohmann::json UsageChunk(const CompletionRequest& request, const ResponseIdentity& identity,
                          const JobOutcome& outcome);

std::string DumpJson(const nlohmann::json& j);  // invalid UTF-8 replaced, never throws

}  // namespace polestar
