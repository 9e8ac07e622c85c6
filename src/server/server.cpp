#include "server/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <thread>

#include "base/error.h"
#include "server/api.h"
#include "server/scheduler.h"

namespace polestar {

extern const char kPageHtml[];  // page.html, embedded at build time

namespace {

using nlohmann::json;

constexpr auto kWaitSlice = std::chrono::milliseconds(100);  // how often a waiting handler looks up
constexpr auto kPingInterval = std::chrono::seconds(1);      // SSE comment while nothing happens

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(DumpJson(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& error) {
  SendJson(res, error.status, error.Body());
}

// The label /metrics counts a request under: its route, or "other" (bounded cardinality).
std::string EndpointLabel(const std::string& path) {
  for (const char* known : {"/health", "/v1/health", "/v1/models", "/v1/completions",
                            "/v1/chat/completions", "/v1/diffusion/stream", "/metrics", "/"}) {
    if (path == known) return known;
  }
  if (path == "/models") return "/v1/models";
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

// cpp-httplib 0.11 gives a handler no view of its connection, so a handler that waits for a
// generation finds its socket by the address pair and polls it for the peer hanging up.
// The socket stays open while the handler runs: httplib closes it only afterwards.
int FindConnectionSocket(const httplib::Request& req) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;
    auto port_and_address = [](const sockaddr_storage& a, int* port) -> std::string {
      char text[INET6_ADDRSTRLEN] = {};
      if (a.ss_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
        *port = ntohs(v4->sin_port);
        inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      } else if (a.ss_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
        *port = ntohs(v6->sin6_port);
        inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
      } else {
        *port = -1;
      }
      return text;
    };
    int local_port = -1, peer_port = -1;
    port_and_address(local, &local_port);
    const std::string peer_address = port_and_address(peer, &peer_port);
    if (local_port == req.local_port && peer_port == req.remote_port &&
        peer_address == req.remote_addr)
      return fd;
  }
  return -1;
}

bool PeerHungUp(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
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
      return ApiError(503, "unavailable_error",
                      outcome.error.empty() ? "the generation was cancelled" : outcome.error);
    default:
      return ApiError(500, "server_error", "generation failed: " + outcome.error);
  }
}

std::string SseData(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

}  // namespace

struct Server::Impl {
  ServerOptions options;
  httplib::Server http;
  Metrics metrics;
  std::thread listener;
  int port = 0;
  RequestLimits limits;
  // Set once by SetModel, before `ready` turns true; read only after seeing it true.
  std::unique_ptr<Model> model;
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<Scheduler> scheduler;
  std::atomic<bool> ready{false}, stopping{false}, listen_returned{false};
  std::mutex stop_mutex;
  std::condition_variable stop_changed;
  bool stopped = false;

  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  void InstallRoutes();
  void Completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint,
                  const json& body, const std::string& label);
  void Stream(httplib::Response& res, std::shared_ptr<CompletionRequest> request,
              const ResponseIdentity& identity, std::shared_ptr<GenerationJob> job,
              const std::string& label);
  Clock::time_point Deadline(Clock::time_point from) const {
    if (options.timeout_seconds <= 0 || options.timeout_seconds > 1e9)
      return Clock::time_point::max();
    return from + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(options.timeout_seconds));
  }
};

void Server::Impl::InstallRoutes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool open = req.path == "/health" || req.path == "/v1/health" ||
                      (req.path == "/" && req.method == "GET");
    if (options.api_key.empty() || open) return httplib::Server::HandlerResponse::Unhandled;
    if (ConstantTimeEquals(req.get_header_value("Authorization"), "Bearer " + options.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendError(res, ApiError(401, "authentication_error",
                            "invalid or missing API key (Authorization: Bearer KEY)"));
    metrics.CountRequest(EndpointLabel(req.path), 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Bodies for the errors httplib answers itself (404, 413, ...).
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (res.body.empty() && !res.content_provider_) {
      const std::string message =
          res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
          : res.status == 413
              ? Cat("the request body is too large (at most ", options.max_body_bytes,
                    " bytes as application/json, 8192 as a form)")
              : Cat("HTTP status ", res.status);
      SendError(
          res, ApiError(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error",
                        message));
      metrics.CountRequest(EndpointLabel(req.path), res.status);
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
        std::string message = "internal error";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          message += std::string(": ") + e.what();
        } catch (...) {
        }
        SendError(res, ApiError(500, "server_error", message));
        metrics.CountRequest(EndpointLabel(req.path), 500);
      });

  auto health = [this](const httplib::Request& req, httplib::Response& res) {
    if (ready) {
      SendJson(res, 200, {{"status", "ok"}});
    } else {
      SendError(res, ApiError(503, "unavailable_error", "Loading model"));
    }
    metrics.CountRequest(EndpointLabel(req.path), res.status);
  };
  http.Get("/health", health);
  http.Get("/v1/health", health);

  auto models = [this](const httplib::Request& req, httplib::Response& res) {
    if (!ready) {
      SendError(res, ApiError(503, "unavailable_error", "Loading model"));
    } else {
      const ModelConfig& c = model->config();
      json entry = {{"id", options.model_id},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "polestar"},
                    {"meta",
                     {{"arch", ArchName(c.arch)},
                      {"vocab", c.vocab},
                      {"n_params", model->ParameterCount()},
                      {"n_ctx", c.max_positions},
                      {"mask_id", c.mask_id},
                      {"source", model->source()}}}};
      SendJson(res, 200, {{"object", "list"}, {"data", json::array({entry})}});
    }
    metrics.CountRequest("/v1/models", res.status);
  };
  http.Get("/v1/models", models);
  http.Get("/models", models);

  for (const auto& [path, endpoint] :
       {std::pair{"/v1/completions", Endpoint::kCompletions},
        std::pair{"/completions", Endpoint::kCompletions},
        std::pair{"/v1/chat/completions", Endpoint::kChatCompletions},
        std::pair{"/chat/completions", Endpoint::kChatCompletions}}) {
    http.Post(path,
              [this, endpoint = endpoint](const httplib::Request& req, httplib::Response& res) {
                const std::string label = EndpointLabel(req.path);
                json body;
                try {
                  body = json::parse(req.body);
                } catch (const json::exception& e) {
                  SendError(res, ApiError(400, "invalid_request_error",
                                          std::string("the body is not valid JSON: ") + e.what()));
                  metrics.CountRequest(label, 400);
                  return;
                }
                Completion(req, res, endpoint, body, label);
              });
  }
  http.Get("/v1/diffusion/stream", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    try {
      body = RequestFromQuery(req.params);
    } catch (const ApiError& e) {
      SendError(res, e);
      metrics.CountRequest("/v1/diffusion/stream", e.status);
      return;
    }
    body["stream"] = true;
    body["stream_canvas"] = true;
    Completion(req, res, Endpoint::kCompletions, body, "/v1/diffusion/stream");
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    metrics.CountRequest("/metrics", 200);
    res.set_content(metrics.Render(ready ? scheduler->QueueDepth() : 0),
                    "text/plain; version=0.0.4");
  });
  http.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    metrics.CountRequest("/", 200);
    res.set_content(kPageHtml, "text/html; charset=utf-8");
  });
}

void Server::Impl::Completion(const httplib::Request& req, httplib::Response& res,
                              Endpoint endpoint, const json& body, const std::string& label) {
  auto request = std::make_shared<CompletionRequest>();
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  try {
    if (!ready) throw ApiError(503, "unavailable_error", "Loading model");
    *request =
        ParseCompletionRequest(body, endpoint, options.defaults, *codec, model->config(), limits);
    const Clock::time_point now = Clock::now();
    for (const std::vector<int>& prompt : request->prompts) {
      auto job = std::make_shared<GenerationJob>();
      job->prompt = prompt;
      job->options = request->options;
      job->max_tokens = request->max_tokens;
      job->stop = request->stop;
      job->stop_early = request->stop_early;
      job->stream_text = request->stream;
      job->stream_canvas = request->stream_canvas;
      job->admitted = now;
      job->deadline = Deadline(now);
      jobs.push_back(std::move(job));
    }
    if (!scheduler->Submit(jobs)) {
      throw ApiError(429, "rate_limit_error",
                     Cat("the server is busy (", options.parallel, " running, ",
                         scheduler->QueueDepth(), " waiting); retry later"));
    }
  } catch (const ApiError& e) {
    SendError(res, e);
    metrics.CountRequest(label, e.status);
    return;
  }
  for (const auto& prompt : request->prompts) metrics.AddPromptTokens(int64_t(prompt.size()));
  const ResponseIdentity identity = NewResponseIdentity(endpoint, options.model_id);
  if (request->stream) return Stream(res, request, identity, jobs.front(), label);

  // Wait, looking every slice whether the client is still there.
  const int fd = FindConnectionSocket(req);
  std::vector<JobOutcome> outcomes;
  for (const auto& job : jobs) {
    while (!job->WaitFinished(std::min(Clock::now() + kWaitSlice, job->deadline))) {
      const bool gone = PeerHungUp(fd) || stopping;
      if (gone || Clock::now() >= job->deadline) {
        for (const auto& j : jobs) j->cancel = true;
        if (gone) {  // nobody reads this answer; it only keeps httplib from adding one
          SendError(res, ApiError(499, "cancelled", "the client closed the connection"));
          metrics.CountRequest(label, 499);
          return;
        }
        const ApiError timeout = TimeoutError(options.timeout_seconds);
        SendError(res, timeout);
        metrics.CountRequest(label, timeout.status);
        return;
      }
    }
    std::lock_guard lock(job->mutex);
    outcomes.push_back(job->outcome);
  }
  for (const JobOutcome& outcome : outcomes) {
    if (outcome.status != JobOutcome::Status::kDone) {
      const ApiError error = OutcomeError(outcome, options.timeout_seconds);
      SendError(res, error);
      metrics.CountRequest(label, error.status);
      return;
    }
  }
  SendJson(res, 200, CompletionResponse(*request, identity, outcomes));
  metrics.CountRequest(label, 200);
}

void Server::Impl::Stream(httplib::Response& res, std::shared_ptr<CompletionRequest> request,
                          const ResponseIdentity& identity, std::shared_ptr<GenerationJob> job,
                          const std::string& label) {
  struct StreamState {
    bool started = false;    // the first chunk went out
    bool completed = false;  // the stream ended as intended (normally or with an error event)
    int status = 200;
    ResponseIdentity identity;
  };
  auto state = std::make_shared<StreamState>();
  state->identity = identity;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto provider = [this, request, job, state](size_t, httplib::DataSink& sink) {
    auto write = [&](const std::string& text) { return sink.write(text.data(), text.size()); };
    auto end_with_error = [&](const ApiError& error) {
      state->status = error.status;
      state->completed = true;
      const bool ok = write(SseData(error.Body())) && write("data: [DONE]\n\n");
      sink.done();
      return ok;
    };
    if (!state->started && request->endpoint == Endpoint::kChatCompletions) {
      state->started = true;
      return write(SseData(StreamChunk(*request, state->identity, "", true, nullptr)));
    }
    std::deque<GenerationJob::Event> events;
    bool finished;
    JobOutcome outcome;
    {
      std::unique_lock lock(job->mutex);
      job->changed.wait_until(lock, std::min(Clock::now() + kPingInterval, job->deadline),
                              [&] { return !job->events.empty() || job->finished || stopping; });
      events.swap(job->events);
      finished = job->finished;
      if (finished) outcome = job->outcome;
    }
    for (const GenerationJob::Event& e : events) {
      const bool ok = e.kind == GenerationJob::Event::Kind::kText
                          ? write(SseData(StreamChunk(*request, state->identity, e.data,
                                                      !state->started, nullptr)))
                          : write("event: canvas\ndata: " + e.data + "\n\n");
      if (e.kind == GenerationJob::Event::Kind::kText) state->started = true;
      if (!ok) return false;
    }
    if (finished) {
      if (outcome.status != JobOutcome::Status::kDone)
        return end_with_error(OutcomeError(outcome, options.timeout_seconds));
      state->completed = true;
      if (!write(SseData(StreamChunk(*request, state->identity, "", !state->started, &outcome))))
        return false;
      if (request->include_usage && !write(SseData(UsageChunk(*request, state->identity, outcome))))
        return false;
      if (!write("data: [DONE]\n\n")) return false;
      sink.done();
      return true;
    }
    if (stopping) {
      job->cancel = true;
      return end_with_error(ApiError(503, "unavailable_error", "the server is shutting down"));
    }
    if (Clock::now() >= job->deadline) {
      job->cancel = true;
      return end_with_error(TimeoutError(options.timeout_seconds));
    }
    // Nothing new: a comment line keeps proxies patient and shows whether the client left.
    return events.empty() ? write(": ping\n\n") : true;
  };
  auto release = [this, job, state, label](bool success) {
    if (!success || !state->completed) {
      job->cancel = true;  // the client went away mid-stream
      state->status = 499;
    }
    metrics.CountRequest(label, state->status);
  };
  res.set_chunked_content_provider("text/event-stream", provider, release);
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { Stop(); }

int Server::Start() {
  Impl& s = *impl_;
  // A client hanging up must not kill the process: writes to its socket fail instead.
  std::signal(SIGPIPE, SIG_IGN);
  // A thread per admitted request (running or queued) plus spares for /health, /metrics and
  // 429s; past the cap, connections wait for a thread before they are even read.
  const size_t http_threads = size_t(std::clamp(s.options.parallel + s.options.queue + 8, 8, 1024));
  s.http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_keep_alive_max_count(1000);
  s.http.set_tcp_nodelay(true);
  s.InstallRoutes();
  const bool any_port = s.options.port == 0;
  s.port = any_port ? s.http.bind_to_any_port(s.options.host) : s.options.port;
  if (s.port <= 0 || (!any_port && !s.http.bind_to_port(s.options.host, s.options.port))) {
    Fail("cannot listen on ", s.options.host, ":", s.options.port,
         " (address in use, or not local?)");
  }
  s.listener = std::thread([&s] {
    s.http.listen_after_bind();
    s.listen_returned = true;
  });
  // Stop() only reaches a server that is already running.
  while (!s.http.is_running() && !s.listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s.port;
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
  if (s.options.model_id.empty()) s.options.model_id = model->source();
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
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();  // joins the HTTP threads too
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
