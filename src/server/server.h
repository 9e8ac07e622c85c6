// polestar serve: an OpenAI-compatible HTTP server for diffusion LMs (transport: http.h).
//
//   GET  /health, /v1/health      200 {"status":"ok"} once the model is loaded, 503 before
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/completions          OpenAI bodies; "stream": true gives Server-Sent Events
//   POST /v1/chat/completions     (text deltas of the settled left-to-right prefix)
//   GET  /v1/diffusion/stream     SSE of every denoising step's canvas, query parameters
//   GET  /metrics                 Prometheus text
//   GET  /                        a page that shows the canvas filling in live
//
// Requests wait in a bounded queue (429 when full) for one of --parallel running places and
// room in the KV budget; the running ones are decoded by continuous batching (scheduler.h).
// A request whose caches exceed the whole budget is a 400 at once. A request times out after
// --timeout seconds and is cancelled when its client disconnects. A wrong method on a known path is
// a 405; OPTIONS is answered on every path, with CORS headers for the origins cors_origins
// lets in. Before a request's body is read, its head must pass: a Host this server answers to
// (DNS rebinding), an Origin that is its own or allowed (cross-site pages), a POST body that
// says it is application/json (so a "simple" cross-origin request cannot start work), and the
// API key. Health, metrics and model lists have handler threads of their own.
#pragma once

#include <memory>
#include <string>

#include "decode/options.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/text_codec.h"

namespace polestar {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port
  int max_batch = 8;             // sequences in one batched forward
  int parallel = 0;              // generations running at once (0: max_batch)
  int max_batch_rows = 4096;     // input rows of one forward (0: no bound)
  double kv_budget_mb = 0;       // caches of the running generations (0: half the RAM)
  int queue = 8;                 // generations waiting beyond the free running places
  double timeout_seconds = 600;  // a request's whole life, queue included; 0: none
  std::string api_key;           // when set, "Authorization: Bearer KEY" is required
  // Browser pages from other origins that may call the API: a comma-separated list of
  // origins ("http://localhost:3000"), or "*" for any. "": none; a cross-origin request (its
  // Origin is not this server's own) is refused with 403.
  std::string cors_origins;
  // Host header names accepted besides IP literals, localhost (and *.localhost) and --host
  // itself, which guards a loopback server against DNS rebinding: a comma-separated list
  // (".example.com" also takes its subdomains), or "*" for any.
  std::string allowed_hosts;
  double read_timeout_seconds = 30;  // a request's head and body must arrive within it
  int threads = 0;                   // OpenMP threads per forward (0: all cores)
  int max_prompt_tokens = 0;         // 0: the model's context
  int max_tokens = 0;                // 0: the model's context
  int max_prompts = 16;              // prompts in one /v1/completions request
  size_t max_body_bytes = 4 << 20;
  // Connections open at once (at most the file-descriptor limit less a reserve); at the bound
  // the oldest idle or slow one makes room. Bodies being received, all together, are bounded
  // by 16 times max_body_bytes.
  int max_connections = 1024;
  std::string model_id;    // the name /v1/models shows; "": the model folder or GGUF name
  DecodeOptions defaults;  // decoding of requests that do not say otherwise
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and answers requests on background threads from now on; /health says 503 until
  // SetModel. Returns the bound port. Throws Error when the address cannot be bound.
  int Start();
  // Installs the model (loaded while /health already answered) and starts the workers.
  void SetModel(std::unique_ptr<Model> model, std::unique_ptr<TextCodec> codec);
  // Stops listening, cancels running generations, and joins every thread. Idempotent.
  void Stop();
  // Blocks until Stop is called (from another thread).
  void Wait();

  const Metrics& metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polestar
