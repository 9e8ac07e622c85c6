#include "server/server.h"

#include <condition_variable>
#include <filesystem>

#include "base/error.h"
#include "io/gguf.h"
#include "io/mapped_file.h"
#include "server/api.h"
#include "server/http.h"
#include "server/scheduler.h"

namespace polestar {

extern const char kPageHtml[];  // page.html, embedded at build time

namespace {

using nlohmann::json;

constexpr auto kWaitSlice = std::chrono::milliseconds(100);  // how often a waiting handler looks up
constexpr auto kPingInterval = std::chrono::seconds(1);      // SSE comment while nothing happens

ApiError UnavailableError(const std::string& message) {
  return ApiError(503, "unavailable_error", message);
}

// The label /metrics counts a request under: its route, or "other" (bounded cardinality).
std::string EndpointLabel(const std::string& path) {
  for (const char* known : {"/health", "/v1/health", "/v1/models", "/v1/completions",
                            "/v1/chat/completions", "/v1/diffusion/stream", "/metrics", "/"}) {
    if (path == known) return known;
  }
  if (path == "/models" || path.rfind("/models/", 0) == 0 || path.rfind("/v1/models/", 0) == 0)
    return "/v1/models";
  if (path == "/completions") return "/v1/completions";
  if (path == "/chat/completions") return "/v1/chat/completions";
  return "other";
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

// The token of "Authorization: Bearer TOKEN"; the scheme is case-insensitive (RFC 9110).
std::string BearerToken(const std::string& authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return "";
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return "";
  }
  const size_t begin = authorization.find_first_not_of(' ', kScheme.size());
  return begin == std::string::npos ? "" : authorization.substr(begin);
}

// The id clients name the model by: a GGUF file's general.name (else its file name without
// .gguf), or the model folder's name. Never a path: clients echo it back in "model".
std::string ServedModelName(const std::string& source) {
  namespace fs = std::filesystem;
  fs::path path(source);
  if (path.extension() == ".gguf") {
    try {
      const MappedFile file(source);
      const GgufFile gguf = ParseGguf(file.data(), file.size(), source);
      if (gguf.metadata.Has("general.name")) {
        const std::string& name = gguf.metadata.GetString("general.name");
        if (!name.empty()) return name;
      }
    } catch (const Error&) {
      // The model loaded from this file, so this cannot fail; the file name still serves.
    }
    return path.stem().string();
  }
  if (!path.has_filename()) path = path.parent_path();  // "models/tiny/"
  return path.filename().string();
}

ApiError TimeoutError(double timeout_seconds) {
  return ApiError(
      504, "timeout_error",
      Cat("the request did not finish within the server's timeout of ", timeout_seconds, " s"));
}

ApiError OutcomeError(const JobOutcome& outcome, double timeout_seconds) {
  switch (outcome.status) {
    case JobOutcome::Status::kTimedOut:
      return TimeoutError(timeout_seconds);
    case JobOutcome::Status::kCancelled:
      return UnavailableError(outcome.error.empty() ? "the generation was cancelled"
                                                    : outcome.error);
    default:
      return ApiError(500, "server_error", "generation failed: " + outcome.error);
  }
}

std::string SseData(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

}  // namespace

struct Server::Impl {
  using RouteHandler = void (Impl::*)(const http::Request&, http::ResponseWriter&);
  struct Route {
    const char* method;
    const char* path;  // ending in '/': a prefix, the rest names a resource
    RouteHandler handle;
  };

  ServerOptions options;
  std::unique_ptr<http::Server> http;
  Metrics metrics;
  RequestLimits limits;
  // Set once by SetModel, before `ready` turns true; read only after seeing it true.
  std::unique_ptr<Model> model;
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<Scheduler> scheduler;
  std::atomic<bool> ready{false}, stopping{false};
  std::mutex stop_mutex;
  std::condition_variable stop_changed;
  bool stopped = false;

  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  static const std::vector<Route>& Routes();
  // Counts the answer under `label` and sends it: counted first, so that a client that has
  // its answer finds it in /metrics.
  void AnswerJson(http::ResponseWriter& writer, const std::string& label, int status,
                  const json& body, const http::Headers& headers = {}) {
    metrics.CountRequest(label, status);
    writer.Send(status, "application/json", DumpJson(body), headers);
  }
  void AnswerError(http::ResponseWriter& writer, const std::string& label, const ApiError& error) {
    // Well-behaved clients back off for this long before retrying a full server.
    const http::Headers headers =
        error.status == 429 ? http::Headers{{"Retry-After", "1"}} : http::Headers{};
    AnswerJson(writer, label, error.status, error.Body(), headers);
  }
  void Dispatch(const http::Request& req, http::ResponseWriter& writer);
  // False (after answering 401) when an API key is required and not given.
  bool Authorized(const http::Request& req, http::ResponseWriter& writer, const std::string& label);

  void Health(const http::Request& req, http::ResponseWriter& writer);
  void Models(const http::Request& req, http::ResponseWriter& writer);
  void OneModel(const http::Request& req, http::ResponseWriter& writer);
  void Completions(const http::Request& req, http::ResponseWriter& writer);
  void ChatCompletions(const http::Request& req, http::ResponseWriter& writer);
  void DiffusionStream(const http::Request& req, http::ResponseWriter& writer);
  void MetricsText(const http::Request& req, http::ResponseWriter& writer);
  void Page(const http::Request& req, http::ResponseWriter& writer);

  json ModelEntry() const;
  void PostedCompletion(const http::Request& req, http::ResponseWriter& writer, Endpoint endpoint);
  void Completion(http::ResponseWriter& writer, Endpoint endpoint, const json& body,
                  const std::string& label);
  void Stream(http::ResponseWriter& writer, const CompletionRequest& request,
              const ResponseIdentity& identity, GenerationJob& job, const std::string& label);
  Clock::time_point Deadline(Clock::time_point from) const {
    if (options.timeout_seconds <= 0 || options.timeout_seconds > 1e9)
      return Clock::time_point::max();
    return from + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(options.timeout_seconds));
  }
};

const std::vector<Server::Impl::Route>& Server::Impl::Routes() {
  static const std::vector<Route> routes = {
      {"GET", "/health", &Impl::Health},
      {"GET", "/v1/health", &Impl::Health},
      {"GET", "/v1/models", &Impl::Models},
      {"GET", "/models", &Impl::Models},
      {"GET", "/v1/models/", &Impl::OneModel},
      {"GET", "/models/", &Impl::OneModel},
      {"POST", "/v1/completions", &Impl::Completions},
      {"POST", "/completions", &Impl::Completions},
      {"POST", "/v1/chat/completions", &Impl::ChatCompletions},
      {"POST", "/chat/completions", &Impl::ChatCompletions},
      {"GET", "/v1/diffusion/stream", &Impl::DiffusionStream},
      {"GET", "/metrics", &Impl::MetricsText},
      {"GET", "/", &Impl::Page},
  };
  return routes;
}

void Server::Impl::Dispatch(const http::Request& req, http::ResponseWriter& writer) {
  const std::string label = EndpointLabel(req.path);
  if (!options.cors_origin.empty()) {
    writer.AddHeader("Access-Control-Allow-Origin", options.cors_origin);
    if (options.cors_origin != "*") writer.AddHeader("Vary", "Origin");
  }
  const Route* route = nullptr;
  std::string allowed;  // the methods of the routes on this path
  for (const Route& r : Routes()) {
    const std::string_view path = r.path;
    const bool prefix = path.size() > 1 && path.back() == '/';
    const bool matches =
        prefix ? req.path.size() > path.size() && req.path.rfind(path, 0) == 0 : req.path == path;
    if (!matches) continue;
    if (allowed.find(r.method) == std::string::npos)
      allowed += (allowed.empty() ? "" : ", ") + std::string(r.method);
    if (req.method == r.method) route = &r;
  }
  if (allowed.empty()) {
    AnswerError(writer, label,
                ApiError(404, "invalid_request_error",
                         "no such endpoint: " + req.method + " " + req.path, "", "unknown_url"));
    return;
  }
  allowed += ", OPTIONS";
  if (req.method == "OPTIONS") {
    // A CORS preflight carries no credentials, so it is answered before the key check.
    http::Headers headers = {{"Allow", allowed}};
    if (!options.cors_origin.empty()) {
      headers.insert(headers.end(),
                     {{"Access-Control-Allow-Methods", allowed},
                      {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                      {"Access-Control-Max-Age", "600"}});
    }
    metrics.CountRequest(label, 204);
    writer.Send(204, "", "", headers);
    return;
  }
  if (route == nullptr) {
    AnswerJson(
        writer, label, 405,
        ApiError(405, "invalid_request_error",
                 Cat(req.method, " is not allowed on ", req.path, " (allowed: ", allowed, ")"))
            .Body(),
        {{"Allow", allowed}});
    return;
  }
  if (!Authorized(req, writer, label)) return;
  (this->*route->handle)(req, writer);
}

bool Server::Impl::Authorized(const http::Request& req, http::ResponseWriter& writer,
                              const std::string& label) {
  const bool open = req.path == "/health" || req.path == "/v1/health" || req.path == "/";
  if (options.api_key.empty() || open ||
      ConstantTimeEquals(BearerToken(req.Header("Authorization")), options.api_key)) {
    return true;
  }
  AnswerError(
      writer, label,
      ApiError(401, "authentication_error",
               "invalid or missing API key (Authorization: Bearer KEY)", "", "invalid_api_key"));
  return false;
}

void Server::Impl::Health(const http::Request& req, http::ResponseWriter& writer) {
  if (ready) {
    AnswerJson(writer, EndpointLabel(req.path), 200, {{"status", "ok"}});
  } else {
    AnswerError(writer, EndpointLabel(req.path), UnavailableError("Loading model"));
  }
}

json Server::Impl::ModelEntry() const {
  const ModelConfig& c = model->config();
  return {{"id", options.model_id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "polestar"},
          {"meta",
           {{"arch", ArchName(c.arch)},
            {"vocab", c.vocab},
            {"n_params", model->ParameterCount()},
            {"n_ctx", c.max_positions},
            {"mask_id", c.mask_id},
            {"source", model->source()},
            // What a request that names no decoding field gets (the page starts from these).
            {"defaults",
             {{"policy", options.defaults.policy},
              {"max_tokens", options.defaults.gen_length},
              {"block_length", options.defaults.block_length},
              {"steps", options.defaults.steps},
              {"threshold", options.defaults.threshold ? nlohmann::json(*options.defaults.threshold)
                                                       : nlohmann::json()},
              {"temperature", options.defaults.temperature}}}}}};
}

void Server::Impl::Models(const http::Request&, http::ResponseWriter& writer) {
  if (!ready) {
    AnswerError(writer, "/v1/models", UnavailableError("Loading model"));
    return;
  }
  AnswerJson(writer, "/v1/models", 200,
             {{"object", "list"}, {"data", json::array({ModelEntry()})}});
}

void Server::Impl::OneModel(const http::Request& req, http::ResponseWriter& writer) {
  // Ids may hold any character, so clients percent-encode them in the path.
  const std::string id = http::PercentDecode(req.path.substr(req.path.find("/models/") + 8), false);
  if (!ready) {
    AnswerError(writer, "/v1/models", UnavailableError("Loading model"));
  } else if (id != options.model_id) {
    AnswerError(writer, "/v1/models",
                ApiError(404, "invalid_request_error",
                         "the model '" + id + "' does not exist (this server has '" +
                             options.model_id + "')",
                         "model", "model_not_found"));
  } else {
    AnswerJson(writer, "/v1/models", 200, ModelEntry());
  }
}

void Server::Impl::Completions(const http::Request& req, http::ResponseWriter& writer) {
  PostedCompletion(req, writer, Endpoint::kCompletions);
}

void Server::Impl::ChatCompletions(const http::Request& req, http::ResponseWriter& writer) {
  PostedCompletion(req, writer, Endpoint::kChatCompletions);
}

void Server::Impl::PostedCompletion(const http::Request& req, http::ResponseWriter& writer,
                                    Endpoint endpoint) {
  const std::string label = EndpointLabel(req.path);
  json body;
  try {
    body = ParseJsonBody(req.body);
  } catch (const ApiError& e) {
    AnswerError(writer, label, e);
    return;
  }
  Completion(writer, endpoint, body, label);
}

void Server::Impl::DiffusionStream(const http::Request& req, http::ResponseWriter& writer) {
  json body;
  try {
    body = RequestFromQuery(req.query);
  } catch (const ApiError& e) {
    AnswerError(writer, "/v1/diffusion/stream", e);
    return;
  }
  body["stream"] = true;
  body["stream_canvas"] = true;
  Completion(writer, Endpoint::kCompletions, body, "/v1/diffusion/stream");
}

void Server::Impl::MetricsText(const http::Request&, http::ResponseWriter& writer) {
  metrics.CountRequest("/metrics", 200);
  writer.Send(200, "text/plain; version=0.0.4",
              metrics.Render(ready ? scheduler->QueueDepth() : 0));
}

void Server::Impl::Page(const http::Request&, http::ResponseWriter& writer) {
  metrics.CountRequest("/", 200);
  writer.Send(200, "text/html; charset=utf-8", kPageHtml);
}

void Server::Impl::Completion(http::ResponseWriter& writer, Endpoint endpoint, const json& body,
                              const std::string& label) {
  CompletionRequest request;
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  try {
    if (!ready) throw UnavailableError("Loading model");
    if (stopping) throw UnavailableError("the server is shutting down");
    request =
        ParseCompletionRequest(body, endpoint, options.defaults, *codec, model->config(), limits);
    const Clock::time_point now = Clock::now();
    for (const std::vector<int>& prompt : request.prompts) {
      auto job = std::make_shared<GenerationJob>();
      job->prompt = prompt;
      job->options = request.options;
      job->max_tokens = request.max_tokens;
      job->stop = request.stop;
      job->stop_early = request.stop_early;
      job->stream_text = request.stream;
      job->stream_canvas = request.stream_canvas;
      job->admitted = now;
      job->deadline = Deadline(now);
      jobs.push_back(std::move(job));
    }
    if (!scheduler->Submit(jobs)) {
      throw ApiError(429, "rate_limit_error",
                     Cat("the server is busy (", options.parallel, " running, ",
                         scheduler->QueueDepth(), " waiting); retry later"),
                     "", "rate_limit_exceeded");
    }
  } catch (const ApiError& e) {
    AnswerError(writer, label, e);
    return;
  }
  for (const auto& prompt : request.prompts) metrics.AddPromptTokens(int64_t(prompt.size()));
  const ResponseIdentity identity = NewResponseIdentity(endpoint, options.model_id);
  if (request.stream) return Stream(writer, request, identity, *jobs.front(), label);

  // Wait, looking every slice whether the client is still there and the server still up.
  std::vector<JobOutcome> outcomes;
  for (const auto& job : jobs) {
    while (!job->WaitFinished(std::min(Clock::now() + kWaitSlice, job->deadline))) {
      const bool gone = writer.PeerHungUp();
      if (!gone && !stopping && Clock::now() < job->deadline) continue;
      for (const auto& j : jobs) j->cancel = true;
      if (gone) {  // nobody reads this answer; it is what /metrics counts
        AnswerError(writer, label, ApiError(499, "cancelled", "the client closed the connection"));
        return;
      }
      const ApiError error = stopping ? UnavailableError("the server is shutting down")
                                      : TimeoutError(options.timeout_seconds);
      AnswerError(writer, label, error);
      return;
    }
    std::lock_guard lock(job->mutex);
    outcomes.push_back(job->outcome);
  }
  for (const JobOutcome& outcome : outcomes) {
    if (outcome.status != JobOutcome::Status::kDone) {
      const ApiError error = OutcomeError(outcome, options.timeout_seconds);
      AnswerError(writer, label, error);
      return;
    }
  }
  AnswerJson(writer, label, 200, CompletionResponse(request, identity, outcomes));
}

void Server::Impl::Stream(http::ResponseWriter& writer, const CompletionRequest& request,
                          const ResponseIdentity& identity, GenerationJob& job,
                          const std::string& label) {
  // Until the stream ends as intended, a failed write means the client went away.
  int status = 499;
  auto write = [&](const std::string& text) { return writer.Write(text); };
  auto end_with_error = [&](const ApiError& error) {
    job.cancel = true;
    if (write(SseData(error.Body())) && write("data: [DONE]\n\n") && writer.End())
      status = error.status;
  };
  bool started = false;  // the first text chunk went out
  bool open = writer.BeginStream(200, "text/event-stream",
                                 {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  if (open && request.endpoint == Endpoint::kChatCompletions) {
    open = write(SseData(StreamChunk(request, identity, "", true, nullptr)));
    started = true;
  }
  while (open) {
    std::deque<GenerationJob::Event> events;
    bool finished;
    JobOutcome outcome;
    {
      std::unique_lock lock(job.mutex);
      job.changed.wait_until(lock, std::min(Clock::now() + kPingInterval, job.deadline),
                             [&] { return !job.events.empty() || job.finished || stopping; });
      events.swap(job.events);
      finished = job.finished;
      if (finished) outcome = job.outcome;
    }
    for (const GenerationJob::Event& e : events) {
      const bool text = e.kind == GenerationJob::Event::Kind::kText;
      open = text ? write(SseData(StreamChunk(request, identity, e.data, !started, nullptr)))
                  : write("event: canvas\ndata: " + e.data + "\n\n");
      started = started || text;
      if (!open) break;
    }
    if (!open) break;
    if (finished) {
      if (outcome.status != JobOutcome::Status::kDone) {
        end_with_error(OutcomeError(outcome, options.timeout_seconds));
      } else if (write(SseData(StreamChunk(request, identity, "", !started, &outcome))) &&
                 (!request.include_usage ||
                  write(SseData(UsageChunk(request, identity, outcome)))) &&
                 write("data: [DONE]\n\n") && writer.End()) {
        status = 200;
      }
      break;
    }
    if (stopping) {
      end_with_error(UnavailableError("the server is shutting down"));
      break;
    }
    if (Clock::now() >= job.deadline) {
      end_with_error(TimeoutError(options.timeout_seconds));
      break;
    }
    // Nothing new: a comment line keeps proxies patient; a hang-up is seen at once.
    open = !writer.PeerHungUp() && (!events.empty() || write(": ping\n\n"));
  }
  if (status == 499) job.cancel = true;
  metrics.CountRequest(label, status);
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { Stop(); }

int Server::Start() {
  Impl& s = *impl_;
  http::ServerOptions transport;
  transport.host = s.options.host;
  transport.port = s.options.port;
  // A thread per admitted request (running or queued) plus spares for /health, /metrics and
  // 429s; connections still being read hold none.
  transport.handler_threads = std::clamp(s.options.parallel + s.options.queue + 8, 8, 1024);
  transport.limits.max_body_bytes = s.options.max_body_bytes;
  transport.read_timeout = std::chrono::milliseconds(
      int64_t(std::clamp(s.options.read_timeout_seconds, 0.001, 1e6) * 1000));
  transport.error_body = [&s](int status, const std::string& message) {
    s.metrics.CountRequest("other", status);
    return DumpJson(ApiError(status, "invalid_request_error", message).Body());
  };
  s.http = std::make_unique<http::Server>(
      transport,
      [&s](const http::Request& req, http::ResponseWriter& writer) { s.Dispatch(req, writer); });
  return s.http->Start();
}

void Server::SetModel(std::unique_ptr<Model> model, std::unique_ptr<TextCodec> codec) {
  Impl& s = *impl_;
  PS_CHECK(!s.ready);
  if (s.stopping) return;  // stopped while the model was loading
  const int context = model->config().max_positions;
  s.limits.max_prompt_tokens =
      s.options.max_prompt_tokens > 0 ? s.options.max_prompt_tokens : context;
  s.limits.max_tokens = s.options.max_tokens > 0 ? s.options.max_tokens : context;
  s.limits.max_prompts = s.options.max_prompts;
  if (s.options.model_id.empty()) s.options.model_id = ServedModelName(model->source());
  s.model = std::move(model);
  s.codec = std::move(codec);
  s.scheduler = std::make_unique<Scheduler>(*s.model, *s.codec, s.metrics, s.options.parallel,
                                            s.options.queue, s.options.threads);
  s.metrics.SetModelLoaded(true);
  s.ready = true;
}

void Server::Stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  // Waiting handlers see `stopping` and answer 503; the transport joins them.
  if (s.http) s.http->Stop();
  s.scheduler.reset();
  {
    std::lock_guard lock(s.stop_mutex);
    s.stopped = true;
  }
  s.stop_changed.notify_all();
}

void Server::Wait() {
  std::unique_lock lock(impl_->stop_mutex);
  impl_->stop_changed.wait(lock, [&] { return impl_->stopped; });
}

const Metrics& Server::metrics() const { return impl_->metrics; }

}  // namespace polestar
