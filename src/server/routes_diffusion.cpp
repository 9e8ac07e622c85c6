// GET /v1/diffusion/stream, the SSE of every denoising step's canvas, and GET /, the page
// that shows it filling in.
#include "server/server_impl.h"

namespace polestar {

extern const char kPageHtml[];  // page.html, embedded at build time

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

void Server::Impl::Page(const http::Request&, http::ResponseWriter& writer) {
  metrics.CountRequest("/", 200);
  writer.Send(200, "text/html; charset=utf-8", kPageHtml);
}

}  // namespace polestar
