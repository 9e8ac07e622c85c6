#include "server/api.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <variant>

#include "base/error.h"
#include "base/json_nesting.h"
#include "decode/option_schema.h"
#include "server/utf8.h"

namespace polestar {
namespace {

using nlohmann::json;

ApiError BadRequest(const std::string& message, const std::string& param = "") {
  return ApiError(400, "invalid_request_error", message, param);
}

// The decoding option a request field names: its canonical name, an alias or a flag's name
// with underscores ("diffusion_steps"). The generation length is set through max_tokens.
const OptionSpec* FindDecodeField(const std::string& name) {
  if (name.find('-') != std::string::npos) return nullptr;
  const OptionSpec* option = FindOption(name);
  return option != nullptr && option->http_name == nullptr ? option : nullptr;
}

enum class Kind { kInt, kNumber, kBool, kString, kStrings, kAny };

// The fields each endpoint accepts besides the decoding knobs. Fields OpenAI defines but a
// diffusion model cannot honour are accepted only with their neutral value (checked below).
const std::map<std::string, Kind>& CommonFields() {
  static const std::map<std::string, Kind> fields = {
      {"model", Kind::kString},
      {"max_tokens", Kind::kInt},
      {"stop", Kind::kStrings},
      {"stream", Kind::kBool},
      {"stream_options", Kind::kAny},
      {"n", Kind::kInt},
      {"presence_penalty", Kind::kNumber},
      {"frequency_penalty", Kind::kNumber},
      {"logprobs", Kind::kAny},
      {"stream_canvas", Kind::kBool},
      {"stop_early", Kind::kBool},
  };
  return fields;
}
const std::map<std::string, Kind>& CompletionFields() {
  static const std::map<std::string, Kind> fields = {{"prompt", Kind::kAny},
                                                     {"echo", Kind::kBool},
                                                     {"best_of", Kind::kInt},
                                                     {"suffix", Kind::kAny}};
  return fields;
}
const std::map<std::string, Kind>& ChatFields() {
  static const std::map<std::string, Kind> fields = {
      {"messages", Kind::kAny},     {"max_completion_tokens", Kind::kInt},
      {"top_logprobs", Kind::kAny}, {"response_format", Kind::kAny},
      {"tools", Kind::kAny},        {"tool_choice", Kind::kAny}};
  return fields;
}
// Fields OpenAI clients send that change nothing here (bookkeeping, billing, sampling
// adjustments a diffusion decoder has no use for): accepted with any value and ignored, so
// that official clients work unchanged. README lists them.
bool IsIgnoredField(const std::string& name) {
  static const std::set<std::string> ignored = {"store",
                                                "metadata",
                                                "service_tier",
                                                "user",
                                                "logit_bias",
                                                "parallel_tool_calls",
                                                "prompt_cache_key",
                                                "safety_identifier"};
  return ignored.count(name) > 0;
}

bool IsIntegral(const json& v) {
  if (v.is_number_integer()) return true;
  return v.is_number_float() && std::isfinite(v.get<double>()) &&
         std::floor(v.get<double>()) == v.get<double>();
}

int64_t ReadInt(const json& v, const std::string& name, int64_t min, int64_t max) {
  if (!IsIntegral(v)) throw BadRequest("'" + name + "' must be an integer", name);
  const double value = v.is_number_float() ? v.get<double>() : 0;
  if (v.is_number_float() && (value < double(min) || value > double(max))) {
    throw BadRequest("'" + name + "' is out of range", name);
  }
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(max)) throw BadRequest("'" + name + "' is out of range", name);
    n = int64_t(u);
  } else {
    n = v.is_number_float() ? int64_t(value) : v.get<int64_t>();
  }
  if (n < min || n > max) {
    throw BadRequest("'" + name + "' must lie in [" + std::to_string(min) + ", " +
                         std::to_string(max) + "] (got " + std::to_string(n) + ")",
                     name);
  }
  return n;
}

double ReadNumber(const json& v, const std::string& name) {
  if (!v.is_number()) throw BadRequest("'" + name + "' must be a number", name);
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw BadRequest("'" + name + "' must be finite", name);
  return d;
}

bool ReadBool(const json& v, const std::string& name) {
  if (!v.is_boolean()) throw BadRequest("'" + name + "' must be true or false", name);
  return v.get<bool>();
}

std::string ReadString(const json& v, const std::string& name) {
  if (!v.is_string()) throw BadRequest("'" + name + "' must be a string", name);
  return v.get<std::string>();
}

// Sets `option` from the request's field `name` (the name the client used, for errors).
void SetDecodeField(DecodeOptions& options, const OptionSpec& option, const std::string& name,
                    const json& v) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(options.*member)>;
        if constexpr (std::is_same_v<T, int>) {
          options.*member = int(
              ReadInt(v, name, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          options.*member = uint64_t(ReadInt(v, name, 0, std::numeric_limits<int64_t>::max()));
        } else if constexpr (std::is_same_v<T, double> ||
                             std::is_same_v<T, std::optional<double>>) {
          options.*member = ReadNumber(v, name);
        } else if constexpr (std::is_same_v<T, bool>) {
          options.*member = ReadBool(v, name);
        } else if constexpr (std::is_enum_v<T>) {
          try {
            options.*member = ParseMode<T>(option, ReadString(v, name));
          } catch (const OptionError& e) {
            throw BadRequest(e.Message(Vocabulary::kHttp), name);
          }
        } else {
          options.*member = ReadString(v, name);
        }
      },
      option.member);
}

std::vector<std::string> ReadStop(const json& v, int limit) {
  std::vector<std::string> stop;
  if (v.is_string()) {
    stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) stop.push_back(ReadString(s, "stop"));
  } else {
    throw BadRequest("'stop' must be a string or an array of strings", "stop");
  }
  if (int(stop.size()) > limit) {
    throw BadRequest("'stop' has " + std::to_string(stop.size()) + " strings; at most " +
                         std::to_string(limit) + " are accepted",
                     "stop");
  }
  return stop;
}

std::vector<int> ReadTokenIds(const json& v, const ModelConfig& config) {
  std::vector<int> ids;
  for (const json& id : v) {
    const int64_t t = ReadInt(id, "prompt", 0, config.vocab - 1);
    ids.push_back(int(t));
  }
  return ids;
}

std::vector<std::vector<int>> ReadPrompts(const json& v, const TextCodec& codec,
                                          const ModelConfig& config, int max_prompts) {
  auto encode = [&](const std::string& text) {
    try {
      return codec.EncodeText(text);
    } catch (const Error& e) {
      throw BadRequest(std::string("prompt: ") + e.what(), "prompt");
    }
  };
  std::vector<std::vector<int>> prompts;
  if (v.is_string()) {
    prompts.push_back(encode(v.get<std::string>()));
  } else if (v.is_array() && !v.empty() && v[0].is_number()) {
    prompts.push_back(ReadTokenIds(v, config));
  } else if (v.is_array() && !v.empty()) {
    for (const json& item : v) {
      if (item.is_string()) {
        prompts.push_back(encode(item.get<std::string>()));
      } else if (item.is_array()) {
        prompts.push_back(ReadTokenIds(item, config));
      } else {
        throw BadRequest("'prompt' must be a string, an array of strings, or token ids", "prompt");
      }
    }
  } else {
    throw BadRequest("'prompt' must be a non-empty string, array of strings, or token ids",
                     "prompt");
  }
  if (int(prompts.size()) > max_prompts) {
    throw BadRequest("'prompt' holds " + std::to_string(prompts.size()) + " prompts; at most " +
                         std::to_string(max_prompts) + " per request",
                     "prompt");
  }
  return prompts;
}

// json::value("type", "") would throw a type error when the member is not a string.
bool HasStringMember(const json& object, const char* name, const char* expected) {
  const auto it = object.find(name);
  return it != object.end() && it->is_string() && it->get<std::string>() == expected;
}

std::vector<int> ReadMessages(const json& v, const TextCodec& codec) {
  if (!v.is_array() || v.empty())
    throw BadRequest("'messages' must be a non-empty array", "messages");
  std::vector<ChatTurn> turns;
  for (const json& m : v) {
    if (!m.is_object()) throw BadRequest("each message must be an object", "messages");
    ChatTurn turn;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        turn.role = ReadString(value, "messages.role");
      } else if (key == "content") {
        if (value.is_string()) {
          turn.content = value.get<std::string>();
        } else if (value.is_array()) {
          // Content parts: only text can reach a text model.
          for (const json& part : value) {
            if (!part.is_object() || !HasStringMember(part, "type", "text") ||
                !part.contains("text") || !part["text"].is_string()) {
              throw BadRequest("message content parts must be {\"type\": \"text\", \"text\": ...}",
                               "messages");
            }
            turn.content += part["text"].get<std::string>();
          }
        } else if (!value.is_null()) {
          throw BadRequest("message 'content' must be a string or an array of text parts",
                           "messages");
        }
      } else if (key != "name") {
        throw BadRequest("unknown message field '" + key + "'", "messages");
      }
    }
    // OpenAI's newer name for the system turn.
    if (turn.role == "developer") turn.role = "system";
    if (turn.role != "system" && turn.role != "user" && turn.role != "assistant") {
      throw BadRequest(
          "message role must be system, developer, user or assistant (got '" + turn.role + "')",
          "messages");
    }
    turns.push_back(std::move(turn));
  }
  try {
    return codec.EncodeChat(turns);
  } catch (const Error& e) {
    throw BadRequest(std::string("messages: ") + e.what(), "messages");
  }
}

// Fields OpenAI defines that change nothing at their neutral value and cannot be honoured
// otherwise.
void CheckNeutral(const json& fields) {
  auto present = [&](const char* name) { return fields.contains(name) && !fields[name].is_null(); };
  if (present("n") && ReadInt(fields["n"], "n", 1, 1) != 1) throw BadRequest("'n' must be 1", "n");
  if (present("best_of")) ReadInt(fields["best_of"], "best_of", 1, 1);
  if (present("echo") && ReadBool(fields["echo"], "echo")) {
    throw BadRequest("'echo' is not supported", "echo");
  }
  for (const char* name : {"logprobs", "top_logprobs"}) {
    if (present(name) && !(fields[name].is_boolean() && !fields[name].get<bool>())) {
      throw BadRequest(
          std::string("'") + name +
              "' is not supported: a diffusion model does not score tokens left to right",
          name);
    }
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (present(name) && ReadNumber(fields[name], name) != 0) {
      throw BadRequest(std::string("'") + name + "' is not supported (only 0)", name);
    }
  }
  if (present("suffix") &&
      !(fields["suffix"].is_string() && fields["suffix"].get<std::string>().empty())) {
    throw BadRequest("'suffix' is not supported", "suffix");
  }
  if (present("tools") && !(fields["tools"].is_array() && fields["tools"].empty())) {
    throw BadRequest("'tools' are not supported", "tools");
  }
  if (present("tool_choice") && fields["tool_choice"] != "none") {
    throw BadRequest("'tool_choice' is not supported", "tool_choice");
  }
  if (present("response_format") && !(fields["response_format"].is_object() &&
                                      HasStringMember(fields["response_format"], "type", "text"))) {
    throw BadRequest("'response_format' must be {\"type\": \"text\"}", "response_format");
  }
}

}  // namespace

json ApiError::Body() const {
  json error = {{"message", what()}, {"type", type}};
  error["code"] = code.empty() ? json(nullptr) : json(code);
  error["param"] = param.empty() ? json(nullptr) : json(param);
  return {{"error", error}};
}

json ParseJsonBody(std::string_view text) {
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    throw ApiError(400, "invalid_request_error",
                   Cat("the body nests arrays and objects deeper than ", kMaxJsonDepth, " levels"));
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw ApiError(400, "invalid_request_error",
                   std::string("the body is not valid JSON: ") + e.what());
  }
}

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

CompletionRequest ParseCompletionRequest(const json& body, Endpoint endpoint,
                                         const DecodeOptions& defaults, const TextCodec& codec,
                                         const ModelConfig& config, const RequestLimits& limits) {
  if (!body.is_object()) throw BadRequest("the request body must be a JSON object");
  json fields = body;
  if (fields.contains("diffusion")) {
    if (!fields["diffusion"].is_object())
      throw BadRequest("'diffusion' must be an object", "diffusion");
    const json extension = fields["diffusion"];
    fields.erase("diffusion");
    for (const auto& [key, value] : extension.items()) {
      if (!FindDecodeField(key))
        throw BadRequest("unknown decoding field 'diffusion." + key + "'", key);
      if (fields.contains(key)) throw BadRequest("'" + key + "' is given twice", key);
      fields[key] = value;
    }
  }
  const auto& specific = endpoint == Endpoint::kCompletions ? CompletionFields() : ChatFields();
  for (const auto& [key, value] : fields.items()) {
    if (!FindDecodeField(key) && !CommonFields().count(key) && !specific.count(key) &&
        !IsIgnoredField(key)) {
      throw BadRequest("unknown field '" + key + "'", key);
    }
  }
  CheckNeutral(fields);
  auto get = [&](const char* name) -> const json* {
    return fields.contains(name) && !fields[name].is_null() ? &fields[name] : nullptr;
  };

  CompletionRequest r;
  r.endpoint = endpoint;
  if (const json* v = get("model")) ReadString(*v, "model");
  if (const json* v = get("stream")) r.stream = ReadBool(*v, "stream");
  if (const json* v = get("stream_options")) {
    if (!v->is_object()) throw BadRequest("'stream_options' must be an object", "stream_options");
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage")
        throw BadRequest("unknown field 'stream_options." + key + "'", "stream_options");
      r.include_usage = ReadBool(value, "stream_options.include_usage");
    }
    if (!r.stream) throw BadRequest("'stream_options' needs \"stream\": true", "stream_options");
  }
  if (const json* v = get("stream_canvas")) r.stream_canvas = ReadBool(*v, "stream_canvas");
  if (r.stream_canvas && !r.stream)
    throw BadRequest("'stream_canvas' needs \"stream\": true", "stream_canvas");
  if (const json* v = get("stop_early")) r.stop_early = ReadBool(*v, "stop_early");
  if (const json* v = get("stop")) r.stop = ReadStop(*v, limits.max_stop_strings);

  r.options = defaults;
  std::set<const OptionSpec*> set_options;  // by any of its names, each at most once
  for (const auto& [key, value] : fields.items()) {
    if (const OptionSpec* option = FindDecodeField(key); option != nullptr && !value.is_null()) {
      if (!set_options.insert(option).second) throw BadRequest("'" + key + "' is given twice", key);
      SetDecodeField(r.options, *option, key, value);
    }
  }

  // Generation length: max_tokens, the canvas rounded up to whole blocks.
  r.max_tokens = defaults.gen_length;
  const char* length_field = endpoint == Endpoint::kChatCompletions && get("max_completion_tokens")
                                 ? "max_completion_tokens"
                                 : "max_tokens";
  if (const json* v = get(length_field)) {
    r.max_tokens = int(ReadInt(*v, length_field, 1, std::numeric_limits<int>::max()));
  }
  if (r.max_tokens > limits.max_tokens) {
    throw BadRequest(std::string("'") + length_field + "' is " + std::to_string(r.max_tokens) +
                         "; this server generates at most " + std::to_string(limits.max_tokens) +
                         " tokens",
                     length_field);
  }
  try {
    r.options.FitCanvasTo(r.max_tokens, set_options.count(&OptionOf(&DecodeOptions::steps)) > 0,
                          defaults, config);
  } catch (const OptionError& e) {
    throw BadRequest(e.Message(Vocabulary::kHttp), e.option().name);
  } catch (const Error& e) {
    throw BadRequest(e.what(), length_field);
  }

  if (endpoint == Endpoint::kCompletions) {
    const json* prompt = get("prompt");
    if (!prompt) throw BadRequest("'prompt' is required", "prompt");
    r.prompts = ReadPrompts(*prompt, codec, config, limits.max_prompts);
  } else {
    const json* messages = get("messages");
    if (!messages) throw BadRequest("'messages' is required", "messages");
    r.prompts.push_back(ReadMessages(*messages, codec));
  }
  if (r.stream && r.prompts.size() != 1)
    throw BadRequest("streaming takes a single prompt", "prompt");
  for (const std::vector<int>& prompt : r.prompts) {
    if (int(prompt.size()) > limits.max_prompt_tokens) {
      throw BadRequest("the prompt has " + std::to_string(prompt.size()) +
                           " tokens; this server accepts at most " +
                           std::to_string(limits.max_prompt_tokens),
                       endpoint == Endpoint::kCompletions ? "prompt" : "messages");
    }
    try {
      r.options.Validate(config, int(prompt.size()));
    } catch (const OptionError& e) {
      throw BadRequest(e.Message(Vocabulary::kHttp));
    } catch (const Error& e) {
      throw BadRequest(e.what());
    }
  }
  return r;
}

json RequestFromQuery(const std::multimap<std::string, std::string>& params) {
  json body = json::object();
  for (const auto& param : params) {
    // Named, not structured bindings: the lambdas below capture them (clang 14 cannot).
    const std::string& key = param.first;
    const std::string& text = param.second;
    // Percent-decoding yields any bytes; JSON strings and the tokenizers take only UTF-8.
    if (!IsValidUtf8(key) || !IsValidUtf8(text)) {
      throw BadRequest("query parameters must be UTF-8 text", IsValidUtf8(key) ? key : "");
    }
    auto number = [&](bool integral) -> json {
      size_t used = 0;
      try {
        if (integral) {
          const long long v = std::stoll(text, &used);
          if (used == text.size()) return v;
        } else {
          const double v = std::stod(text, &used);
          if (used == text.size()) return v;
        }
      } catch (const std::exception&) {
      }
      throw BadRequest(
          "query parameter '" + key + "' must be a" + (integral ? "n integer" : " number"), key);
    };
    auto boolean = [&]() -> json {
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw BadRequest("query parameter '" + key + "' must be true or false", key);
    };
    if (key == "prompt" || key == "model") {
      body[key] = text;
    } else if (key == "stop") {
      body["stop"].push_back(text);
    } else if (key == "max_tokens") {
      body[key] = number(true);
    } else if (key == "stop_early") {
      body[key] = boolean();
    } else if (const OptionSpec* option = FindDecodeField(key)) {
      std::visit(
          [&](auto member) {
            using T = std::remove_reference_t<decltype(std::declval<DecodeOptions&>().*member)>;
            if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
              body[key] = number(true);
            } else if constexpr (std::is_same_v<T, double> ||
                                 std::is_same_v<T, std::optional<double>>) {
              body[key] = number(false);
            } else if constexpr (std::is_same_v<T, bool>) {
              body[key] = boolean();
            } else {
              body[key] = text;
            }
          },
          option->member);
    } else {
      throw BadRequest("unknown query parameter '" + key + "'", key);
    }
  }
  return body;
}

ResponseIdentity NewResponseIdentity(Endpoint endpoint, const std::string& model) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t bits;
  {
    std::lock_guard lock(mutex);
    bits = rng();
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(bits));
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return {std::string(endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + hex, now,
          model};
}

namespace {

json Timings(const CompletionRequest& request, const std::vector<JobOutcome>& outcomes) {
  int nfe = 0, tokens = 0, committed = 0, prompt_tokens = 0;
  double seconds = 0, queue_seconds = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    nfe += outcomes[i].nfe;
    tokens += outcomes[i].completion_tokens;
    committed += outcomes[i].committed;
    seconds += outcomes[i].seconds;
    queue_seconds += outcomes[i].queue_seconds;
    prompt_tokens += int(request.prompts[i].size());
  }
  const DecodeOptions& o = request.options;
  return {{"nfe", nfe},
          {"tpf", nfe ? double(tokens) / nfe : 0.0},
          {"tps", seconds > 0 ? tokens / seconds : 0.0},
          {"seconds", seconds},
          {"queue_seconds", queue_seconds},
          {"committed", committed},
          {"policy", o.policy},
          {"gen_length", o.gen_length},
          {"block_length", o.EffectiveBlockLength()},
          {"steps", o.steps},
          {"prompt_n", prompt_tokens},
          {"predicted_n", tokens},
          {"predicted_ms", seconds * 1000},
          {"predicted_per_second", seconds > 0 ? tokens / seconds : 0.0}};
}

json Usage(const CompletionRequest& request, const std::vector<JobOutcome>& outcomes) {
  int prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    prompt_tokens += int(request.prompts[i].size());
    completion_tokens += outcomes[i].completion_tokens;
  }
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json Envelope(const CompletionRequest& request, const ResponseIdentity& identity, bool chunk) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  return {
      {"id", identity.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", identity.created},
      {"model", identity.model}};
}

}  // namespace

json CompletionResponse(const CompletionRequest& request, const ResponseIdentity& identity,
                        const std::vector<JobOutcome>& outcomes) {
  json response = Envelope(request, identity, false);
  json choices = json::array();
  for (size_t i = 0; i < outcomes.size(); ++i) {
    json choice = {{"index", i}};
    if (request.endpoint == Endpoint::kChatCompletions) {
      choice["message"] = {{"role", "assistant"}, {"content", outcomes[i].text}};
    } else {
      choice["text"] = outcomes[i].text;
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = outcomes[i].finish_reason;
    choices.push_back(std::move(choice));
  }
  response["choices"] = std::move(choices);
  response["usage"] = Usage(request, outcomes);
  response["timings"] = Timings(request, outcomes);
  return response;
}

json StreamChunk(const CompletionRequest& request, const ResponseIdentity& identity,
                 const std::string& delta, bool first, const JobOutcome* finished) {
  json chunk = Envelope(request, identity, true);
  json choice = {{"index", 0}};
  if (request.endpoint == Endpoint::kChatCompletions) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || (first && !finished)) d["content"] = delta;
    choice["delta"] = std::move(d);
  } else {
    choice["text"] = delta;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finished ? json(finished->finish_reason) : json(nullptr);
  chunk["choices"] = json::array({std::move(choice)});
  if (finished) chunk["timings"] = Timings(request, {*finished});
  return chunk;
}

json UsageChunk(const CompletionRequest& request, const ResponseIdentity& identity,
                const JobOutcome& outcome) {
  json chunk = Envelope(request, identity, true);
  chunk["choices"] = json::array();
  chunk["usage"] = Usage(request, {outcome});
  return chunk;
}

}  // namespace polestar
