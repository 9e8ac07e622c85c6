// A small HTTP/1.1 server for polestar serve. One thread accepts and reads every connection
// without blocking (poll), each request under a total deadline, so slow or idle clients hold
// no handler thread; complete requests go to a fixed pool of handler threads. Keep-alive
// with pipelining (bytes past one request are kept for the next), Content-Length request
// bodies (chunked ones are refused with 411), and responses either whole or chunked through
// a writer whose every write has a deadline. A request's head is screened before its body is
// read; connections, waiting requests and bytes being received are bounded, and what passes
// a bound is answered at once (503) rather than queued.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polestar::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;
  std::string target;                             // as sent: path and query
  std::string path;                               // the target before '?', as sent
  std::multimap<std::string, std::string> query;  // percent-decoded ('+' is a space)
  Headers headers;                                // names as sent
  std::string body;
  bool keep_alive = true;  // HTTP/1.1 without "Connection: close", or 1.0 with keep-alive

  // The first header called `name` (case-insensitive), "" when there is none.
  std::string Header(std::string_view name) const;
};

struct Limits {
  size_t max_target_bytes = 8 << 10;  // 414 past it
  size_t max_head_bytes = 16 << 10;   // request line and headers; 431 past it
  size_t max_body_bytes = 4 << 20;    // 413 past it
};

// The outcome of reading a request from the start of a buffer.
struct ParseResult {
  enum class State { kIncomplete, kComplete, kError };
  State state = State::kIncomplete;
  // kComplete: bytes of this request (the rest belongs to the next one); kIncomplete once the
  // head is complete: the bytes the whole request will take.
  size_t consumed = 0;
  Request request;       // kComplete
  int error_status = 0;  // kError: the status to answer before closing (400, 411, 413, ...)
  std::string error_message;
  bool expects_continue = false;  // kIncomplete with a complete head: "Expect: 100-continue"
  // kIncomplete: the head has arrived; `request` holds it, without the body.
  bool head_complete = false;
};

// Reads one request from `buffer`; kIncomplete until all of it has arrived. Never throws.
ParseResult ParseRequest(std::string_view buffer, const Limits& limits);

// "%41+b" -> "A b". Malformed escapes stay as they are.
std::string PercentDecode(std::string_view text, bool plus_is_space);

std::string_view ReasonPhrase(int status);

// What a handler answers through. Either Send once, or BeginStream, Write chunks and End.
// A write that cannot finish within the server's write deadline, or to a client that left,
// returns false; the connection is then closed after the handler.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Headers every response on this writer carries (the server's CORS headers).
  virtual void AddHeader(std::string name, std::string value) = 0;
  virtual bool Send(int status, std::string_view content_type, std::string_view body,
                    const Headers& headers = {}) = 0;
  virtual bool BeginStream(int status, std::string_view content_type,
                           const Headers& headers = {}) = 0;
  virtual bool Write(std::string_view chunk) = 0;
  virtual bool End() = 0;
  // True once the client has closed its side of the connection or reset it.
  virtual bool PeerHungUp() const = 0;
  virtual bool responded() const = 0;  // Send or BeginStream was called
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;

// An answer the transport sends itself before a handler sees the request; the connection is
// closed after it.
struct Rejection {
  int status = 0;
  std::string body;
  Headers headers;
  std::string content_type = "application/json";
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int handler_threads = 8;
  // Threads for the requests `is_quick` names, which never wait on other work (health,
  // metrics, model lists): a pool busy with long requests does not starve them.
  int quick_threads = 2;
  // Open at once (at most the file-descriptor limit allows, less a reserve). At the bound, or
  // out of descriptors, the oldest connection still being read (idle first) makes room.
  int max_connections = 1024;
  // Complete requests waiting for a handler thread, per pool; past it, 503 at once.
  size_t max_waiting_requests = 64;
  // Bytes of request bodies being received, all connections together; a request whose body
  // would pass it is answered 503 as soon as its head arrives.
  size_t max_receiving_bytes = 64 << 20;
  Limits limits;
  // A request must arrive whole within this long of its first byte (408 otherwise); an idle
  // keep-alive connection is closed after it.
  std::chrono::milliseconds read_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds write_timeout = std::chrono::seconds(30);  // per write
  // The body (application/json) of the errors the transport answers itself before a
  // handler sees the request: 400, 408, 411, 413, 414, 431, 505. Called on the reading thread.
  std::function<std::string(int status, const std::string& message)> error_body;
  // Called on the reading thread once per request, as soon as its head has arrived and before
  // its body is buffered (authentication, Host, Origin, Content-Type): a rejection is answered
  // at once. Must not block.
  std::function<std::optional<Rejection>(const Request& head)> screen;
  // Requests for the quick pool (see quick_threads); the others go to the handler pool.
  std::function<bool(const Request& request)> is_quick;
};

class Server {
 public:
  Server(ServerOptions options, Handler handler);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (SO_REUSEADDR, never SO_REUSEPORT: a port in use is an error) and starts the
  // threads. Returns the bound port. Throws polestar::Error when the address cannot be used.
  int Start();
  // Closes the listening socket and every connection still being read, lets running
  // handlers finish (they should notice the server stopping themselves), joins all threads.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polestar::http
