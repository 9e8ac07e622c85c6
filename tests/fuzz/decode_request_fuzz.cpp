// libFuzzer target: requests that are valid JSON with valid field names, whose decoding fields
// take extreme values. Random bytes rarely spell `"block_length": 2147483647`; this target
// builds such bodies from the input (fields of the option schema by any of their names, at
// the top level or under "diffusion", with values drawn from the edges of each type), sends
// them through ParseCompletionRequest (and the same fields as a query string through
// RequestFromQuery), and checks that every accepted request describes a canvas the engine can
// decode: lengths inside the context, whole blocks, whole steps per block. UBSan turns any
// overflow on the way into a crash.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "decode/option_schema.h"
#include "request_fuzz_model.h"
#include "server/api.h"

namespace {

using namespace polestar;
using nlohmann::json;

// Every name a request may use for a decoding field, and the length fields.
std::vector<std::string> FieldNames() {
  std::vector<std::string> names = {"max_tokens", "max_completion_tokens", "n", "stop_early"};
  for (const OptionSpec& option : OptionSchema()) {
    if (option.http_name == nullptr) names.emplace_back(option.name);
    for (const char* alias : option.aliases) names.emplace_back(alias);
  }
  return names;
}

json Value(FuzzedDataProvider& in) {
  static const std::vector<json> edges = {std::numeric_limits<int>::min(),
                                          -1,
                                          0,
                                          1,
                                          2,
                                          7,
                                          8,
                                          31,
                                          32,
                                          127,
                                          128,
                                          129,
                                          511,
                                          512,
                                          513,
                                          std::numeric_limits<int>::max() - 1,
                                          std::numeric_limits<int>::max(),
                                          int64_t(std::numeric_limits<int>::max()) + 1,
                                          std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<uint64_t>::max(),
                                          1e300,
                                          -1e300,
                                          0.5,
                                          0.9,
                                          4.9e-324,
                                          1e-9,
                                          2.5};
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      return edges[in.ConsumeIntegralInRange<size_t>(0, edges.size() - 1)];
    case 1:
      return in.ConsumeIntegral<int32_t>();
    case 2:
      return in.ConsumeIntegral<int64_t>();
    case 3: {
      const double d = in.ConsumeFloatingPoint<double>();
      return std::isfinite(d) ? json(d) : json(0.0);
    }
    case 4:
      return in.ConsumeBool();
    default: {
      static const std::vector<std::string> words = {
          "vanilla", "fast-dllm-prefix", "fast-dllm-dual", "random", "low_confidence",      "kl",
          "cosine",  "entropy",          "origin",         "",       "confidence_threshold"};
      return words[in.ConsumeIntegralInRange<size_t>(0, words.size() - 1)];
    }
  }
}

// The query-string spelling of a JSON scalar.
std::string QueryText(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

void CheckAccepted(const CompletionRequest& r, const ModelConfig& config,
                   const RequestLimits& limits) {
  const DecodeOptions& o = r.options;
  if (r.prompts.empty() || r.max_tokens < 1 || r.max_tokens > limits.max_tokens) std::abort();
  if (o.gen_length < r.max_tokens || o.gen_length > config.max_positions) std::abort();
  for (const std::vector<int>& prompt : r.prompts) {
    if (int64_t(prompt.size()) + o.gen_length > config.max_positions) std::abort();
  }
  const int block = o.EffectiveBlockLength();
  if (block < 1 || o.gen_length % block != 0) std::abort();
  if (o.steps < 1 || o.steps > config.max_positions || o.steps % o.BlockCount() != 0) std::abort();
  if (o.StepsPerBlock() < 1) std::abort();
  // 0 stands for Elastic-Cache's default, which its registration fills (not linked here).
  if (o.window < 0 || o.window > config.max_positions) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> names = FieldNames();
  static const fuzz::ByteCodec codec;
  static const ModelConfig config = fuzz::FuzzModel();
  RequestLimits limits = fuzz::FuzzLimits();
  limits.max_tokens = config.max_positions;  // lengths up to the context reach the rounding
  const DecodeOptions defaults = fuzz::FuzzDefaults();

  FuzzedDataProvider in(data, size);
  json body = {{"prompt", "A1+2="}};
  std::multimap<std::string, std::string> query = {{"prompt", "A1+2="}};
  const int fields = in.ConsumeIntegralInRange(0, 8);
  for (int i = 0; i < fields && in.remaining_bytes() > 0; ++i) {
    const std::string& name = names[in.ConsumeIntegralInRange<size_t>(0, names.size() - 1)];
    const json value = Value(in);
    if (in.ConsumeBool()) {
      body[name] = value;
    } else {
      body["diffusion"][name] = value;
    }
    query.emplace(name, QueryText(value));
  }
  const Endpoint endpoint = in.ConsumeBool() ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  if (endpoint == Endpoint::kChatCompletions) {
    body.erase("prompt");
    body["messages"] = json::array({{{"role", "user"}, {"content", "A1+2="}}});
  }
  try {
    CheckAccepted(ParseCompletionRequest(body, endpoint, defaults, codec, config, limits), config,
                  limits);
  } catch (const ApiError& e) {
    if (e.status != 400) std::abort();
  }
  try {
    CheckAccepted(ParseCompletionRequest(RequestFromQuery(query), Endpoint::kCompletions, defaults,
                                         codec, config, limits),
                  config, limits);
  } catch (const ApiError& e) {
    if (e.status != 400) std::abort();
  }
  return 0;
}
