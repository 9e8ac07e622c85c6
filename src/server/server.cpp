#include "server/server.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <filesystem>

#include "base/error.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"
#include "io/gguf.h"
#include "io/mapped_file.h"
#include "server/server_impl.h"

namespace polestar {

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

namespace {

using nlohmann::json;

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

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         EqualsIgnoringCase(text.substr(text.size() - suffix.size()), suffix);
}

// Calls `visit` with each non-empty element of a comma-separated option, trimmed.
template <typename Visit>
void ForEachListed(std::string_view list, Visit visit) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) visit(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

// The name in a Host header, lowercase, without its port or an IPv6 literal's brackets:
// "[::1]:8080" -> "::1", "LocalHost:80" -> "localhost".
std::string HostName(std::string_view host) {
  std::string_view name = host;
  if (!name.empty() && name.front() == '[') {
    const size_t close = name.find(']');
    name = close == std::string_view::npos ? std::string_view() : name.substr(1, close - 1);
  } else if (const size_t colon = name.rfind(':'); colon != std::string_view::npos) {
    name = name.substr(0, colon);
  }
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

// An address rather than a name: DNS rebinding needs a name the attacker controls.
bool IsIpLiteral(const std::string& name) {
  unsigned char address[sizeof(in6_addr)];
  return inet_pton(AF_INET, name.c_str(), address) == 1 ||
         inet_pton(AF_INET6, name.c_str(), address) == 1;
}

// The page that sent the request was served by this server (its Origin is this Host's).
bool SameOrigin(std::string_view origin, std::string_view host) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (origin.size() == scheme.size() + host.size() &&
        EqualsIgnoringCase(origin.substr(0, scheme.size()), scheme) &&
        EqualsIgnoringCase(origin.substr(scheme.size()), host)) {
      return true;
    }
  }
  return false;
}

// "application/json", with or without parameters ("; charset=utf-8").
bool IsJsonMediaType(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  return EqualsIgnoringCase(type, "application/json");
}

// "models/tiny/" -> "tiny", "/srv/m/llada.gguf" -> "llada.gguf".
std::string SourceName(const std::string& source) {
  std::filesystem::path path(source);
  if (!path.has_filename()) path = path.parent_path();
  return path.filename().string();
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
  return SourceName(source);
}

}  // namespace

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
  const std::string allow_origin = CorsAllowOrigin(req);
  if (!allow_origin.empty()) {
    writer.AddHeader("Access-Control-Allow-Origin", allow_origin);
    if (allow_origin != "*") writer.AddHeader("Vary", "Origin");
  }
  const Route* route = nullptr;
  const std::string allowed = AllowedMethods(req, &route);
  if (allowed.empty()) {
    AnswerError(writer, label,
                ApiError(404, "invalid_request_error",
                         "no such endpoint: " + req.method + " " + req.path, "", "unknown_url"));
    return;
  }
  if (req.method == "OPTIONS") {
    // A CORS preflight carries no credentials, so it is answered without the key.
    http::Headers headers = {{"Allow", allowed}};
    if (!allow_origin.empty()) {
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
  try {
    (this->*route->handle)(req, writer);
  } catch (const std::exception& e) {
    // Whatever a route failed on, the client gets an error of the API's shape.
    if (!writer.responded())
      AnswerError(writer, label, ApiError(500, "server_error", Cat("internal error: ", e.what())));
  }
}

std::string Server::Impl::AllowedMethods(const http::Request& req, const Route** route) {
  std::string allowed;  // the methods of the routes on this path
  for (const Route& r : Routes()) {
    const std::string_view path = r.path;
    const bool prefix = path.size() > 1 && path.back() == '/';
    const bool matches =
        prefix ? req.path.size() > path.size() && req.path.rfind(path, 0) == 0 : req.path == path;
    if (!matches) continue;
    if (allowed.find(r.method) == std::string::npos)
      allowed += (allowed.empty() ? "" : ", ") + std::string(r.method);
    if (req.method == r.method) *route = &r;
  }
  return allowed.empty() ? allowed : allowed + ", OPTIONS";
}

bool Server::Impl::Generates(const http::Request& req) {
  const Route* route = nullptr;
  AllowedMethods(req, &route);
  return route != nullptr &&
         (route->handle == &Impl::Completions || route->handle == &Impl::ChatCompletions ||
          route->handle == &Impl::DiffusionStream);
}

std::string Server::Impl::CorsAllowOrigin(const http::Request& req) const {
  const std::string origin = req.Header("Origin");
  if (origin.empty()) return "";
  bool any = false, listed = false;
  ForEachListed(options.cors_origins, [&](std::string_view allowed) {
    any = any || allowed == "*";
    listed = listed || EqualsIgnoringCase(allowed, origin);
  });
  return any ? "*" : listed ? origin : "";
}

std::optional<http::Rejection> Server::Impl::Screen(const http::Request& head) {
  const std::string label = EndpointLabel(head.path);
  auto reject = [&](const ApiError& error) {
    metrics.CountRequest(label, error.status);
    http::Rejection rejection{error.status, DumpJson(error.Body()), {}};
    const std::string allow_origin = CorsAllowOrigin(head);
    if (!allow_origin.empty()) {
      // The page that was let in may read why it was refused.
      rejection.headers.push_back({"Access-Control-Allow-Origin", allow_origin});
      if (allow_origin != "*") rejection.headers.push_back({"Vary", "Origin"});
    }
    return std::optional<http::Rejection>(std::move(rejection));
  };
  const std::string host = head.Header("Host");
  if (!host.empty() && !HostAllowed(host)) {
    return reject(ApiError(403, "invalid_request_error",
                           Cat("the Host '", host,
                               "' is not one this server answers to (start it with "
                               "--allowed-hosts NAME to accept it)"),
                           "", "host_not_allowed"));
  }
  const std::string origin = head.Header("Origin");
  if (!origin.empty() && !SameOrigin(origin, host) && CorsAllowOrigin(head).empty()) {
    return reject(ApiError(
        403, "invalid_request_error",
        Cat("cross-origin requests from ", origin, " are refused (start the server with --cors ",
            origin, " to let that page call the API)"),
        "", "origin_not_allowed"));
  }
  // A page can make the browser send a GET without an Origin (an image, a script, a link it
  // follows for the user): the browser's Sec-Fetch-Site still tells such a request apart.
  // Cross-site ones are refused where they would start work, or unless they are the user
  // opening a page (navigation to a route that starts nothing).
  const std::string fetch_site = head.Header("Sec-Fetch-Site");
  const bool cross_site =
      !fetch_site.empty() && fetch_site != "same-origin" && fetch_site != "none";
  if (cross_site && CorsAllowOrigin(head).empty() &&
      (Generates(head) || head.Header("Sec-Fetch-Mode") != "navigate")) {
    return reject(
        ApiError(403, "invalid_request_error",
                 Cat("requests a page on another site makes (Sec-Fetch-Site: ", fetch_site,
                     ") are refused (start the server with --cors ORIGIN "
                     "to let that page call the API)"),
                 "", "cross_site_request"));
  }
  if (head.method == "POST" && !IsJsonMediaType(head.Header("Content-Type"))) {
    return reject(ApiError(415, "invalid_request_error",
                           "the request body must be sent as Content-Type: application/json", "",
                           "unsupported_media_type"));
  }
  const bool open = head.method == "OPTIONS" || head.path == "/health" ||
                    head.path == "/v1/health" || head.path == "/";
  if (!open && !options.api_key.empty() &&
      !ConstantTimeEquals(BearerToken(head.Header("Authorization")), options.api_key)) {
    return reject(ApiError(401, "authentication_error",
                           "invalid or missing API key (Authorization: Bearer KEY)", "",
                           "invalid_api_key"));
  }
  return std::nullopt;
}

bool Server::Impl::HostAllowed(const std::string& host_header) const {
  const std::string name = HostName(host_header);
  if (name.empty()) return false;
  if (IsIpLiteral(name) || name == "localhost" || EndsWith(name, ".localhost")) return true;
  if (EqualsIgnoringCase(name, options.host)) return true;
  bool allowed = false;
  ForEachListed(options.allowed_hosts, [&](std::string_view entry) {
    // ".example.com" takes example.com's subdomains.
    const bool suffix = entry.size() > 1 && entry.front() == '.' && EndsWith(name, entry);
    allowed = allowed || entry == "*" || EqualsIgnoringCase(entry, name) || suffix;
  });
  return allowed;
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
  // What a request that names no decoding field gets, by request field, and the policies
  // with the fields each reads beyond the shared ones: the page builds its form from these.
  json defaults = {{"max_tokens", options.defaults.gen_length}};
  for (const OptionSpec& option : OptionSchema()) {
    // Options with an http_name are set through another field (gen_length: max_tokens).
    if (!option.http_name) defaults[option.name] = OptionValueJson(option, options.defaults);
  }
  json policies = json::array();
  for (const PolicyEntry& policy : RegisteredPolicies()) {
    json fields = json::array();
    for (const OptionMember& member : policy.options) {
      fields.push_back(OptionOf(member).name);
    }
    policies.push_back(
        {{"name", policy.name}, {"description", policy.description}, {"options", fields}});
  }
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
            // The file or folder name only: a path would tell every client about the
            // server's file system.
            {"source", SourceName(model->source())},
            // What runs it: the backend serve --backend chose ("cpu-avx512", ...).
            {"backend", model->backend().name()},
            {"defaults", defaults},
            {"policies", policies}}}};
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

void Server::Impl::MetricsText(const http::Request&, http::ResponseWriter& writer) {
  metrics.CountRequest("/metrics", 200);
  writer.Send(200, "text/plain; version=0.0.4",
              metrics.Render(ready ? scheduler->QueueDepth() : 0));
}

namespace {

ServerOptions Resolved(ServerOptions options) {
  if (options.parallel <= 0) options.parallel = options.max_batch;
  return options;
}

// The KV budget in bytes: --kv-budget MB, or half the machine's memory.
int64_t KvBudgetBytes(double megabytes) {
  if (megabytes > 0) return std::max<int64_t>(1, int64_t(megabytes * double(1 << 20)));
  return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 2;
}

// The server's decoding defaults pass the checks a request's options pass, so that a bad
// default (a value out of range, options that cannot be combined) fails at start rather than
// in every request. Checked on the shortest request, a one-token prompt and answer: the
// default length is only what a request that names none asks for.
void CheckDefaults(const DecodeOptions& defaults, const ModelConfig& config) {
  DecodeOptions request = defaults;
  try {
    request.FitCanvasTo(1, false, defaults, config);
    request.Validate(config, 1);
  } catch (const Error& e) {
    Fail("the server's decoding defaults are invalid for this model: ", e.what());
  }
}

}  // namespace

Server::Server(ServerOptions options)
    : impl_(std::make_unique<Impl>(Resolved(std::move(options)))) {}

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
  transport.max_connections = s.options.max_connections;
  transport.max_receiving_bytes = 16 * s.options.max_body_bytes;
  transport.read_timeout = std::chrono::milliseconds(
      int64_t(std::clamp(s.options.read_timeout_seconds, 0.001, 1e6) * 1000));
  transport.error_body = [&s](int status, const std::string& message) {
    s.metrics.CountRequest("other", status);
    const char* type = status >= 500 ? (status == 503 ? "unavailable_error" : "server_error")
                                     : "invalid_request_error";
    return DumpJson(ApiError(status, type, message).Body());
  };
  transport.screen = [&s](const http::Request& head) { return s.Screen(head); };
  transport.is_quick = [](const http::Request& request) { return !Impl::Generates(request); };
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
  CheckDefaults(s.options.defaults, model->config());
  if (s.options.model_id.empty()) s.options.model_id = ServedModelName(model->source());
  s.model = std::move(model);
  s.codec = std::move(codec);
  SchedulerLimits limits;
  limits.running = s.options.parallel;
  limits.max_batch = s.options.max_batch;
  limits.max_batch_rows = s.options.max_batch_rows;
  limits.kv_budget_bytes = KvBudgetBytes(s.options.kv_budget_mb);
  limits.queue = s.options.queue;
  limits.threads = s.options.threads;
  s.scheduler = std::make_unique<Scheduler>(*s.model, *s.codec, s.metrics, limits);
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
