// The server's state and its routes, shared by server.cpp (lifecycle, the route table,
// dispatch, health, models, metrics) and the routes_*.cpp files. Private to src/server.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/http.h"
#include "server/scheduler.h"
#include "server/server.h"

namespace polestar {

// The label /metrics counts a request under: its route, or "other" (bounded cardinality).
std::string EndpointLabel(const std::string& path);

inline ApiError UnavailableError(const std::string& message) {
  return ApiError(503, "unavailable_error", message);
}

struct Server::Impl {
  using json = nlohmann::json;
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
  // The methods of the routes on `req`'s path with OPTIONS ("" when none), and in `route`
  // the one `req`'s method names (unchanged when none does).
  static std::string AllowedMethods(const http::Request& req, const Route** route);
  // `req` goes to a generating route (the handler pool); everything else is quick.
  static bool Generates(const http::Request& req);
  // The transport's screen of a request head: Host, Origin, Content-Type, then the API key.
  std::optional<http::Rejection> Screen(const http::Request& head);
  bool HostAllowed(const std::string& host_header) const;
  // The Access-Control-Allow-Origin value for `req`'s Origin: "*", the origin, or "" when
  // cors_origins does not list it.
  std::string CorsAllowOrigin(const http::Request& req) const;

  // The routes (the table is Routes() in server.cpp). server.cpp: health, models, metrics.
  void Health(const http::Request& req, http::ResponseWriter& writer);
  void Models(const http::Request& req, http::ResponseWriter& writer);
  void OneModel(const http::Request& req, http::ResponseWriter& writer);
  void MetricsText(const http::Request& req, http::ResponseWriter& writer);
  json ModelEntry() const;
  // routes_completions.cpp: the OpenAI completions, and the generation every generating
  // route shares.
  void Completions(const http::Request& req, http::ResponseWriter& writer);
  void ChatCompletions(const http::Request& req, http::ResponseWriter& writer);
  void PostedCompletion(const http::Request& req, http::ResponseWriter& writer, Endpoint endpoint);
  // Parses `body`, queues its jobs and answers: JSON, or an SSE stream (Stream).
  void Completion(http::ResponseWriter& writer, Endpoint endpoint, const json& body,
                  const std::string& label);
  void Stream(http::ResponseWriter& writer, const CompletionRequest& request,
              const ResponseIdentity& identity, GenerationJob& job, const std::string& label);
  // routes_diffusion.cpp: the canvas stream and the page that shows it.
  void DiffusionStream(const http::Request& req, http::ResponseWriter& writer);
  void Page(const http::Request& req, http::ResponseWriter& writer);
  Clock::time_point Deadline(Clock::time_point from) const {
    if (options.timeout_seconds <= 0 || options.timeout_seconds > 1e9)
      return Clock::time_point::max();
    return from + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(options.timeout_seconds));
  }
};

}  // namespace polestar
