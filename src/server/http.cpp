#include "server/http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "base/error.h"

namespace polestar::http {
namespace {

using Clock = std::chrono::steady_clock;

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// RFC 9110 token characters (methods and header names).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

std::string_view TrimSpaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls `visit` with each comma-separated element of a header value, trimmed.
template <typename Visit>
void ForEachListElement(std::string_view value, Visit visit) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    visit(TrimSpaces(value.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
}

ParseResult Failure(int status, std::string message) {
  ParseResult r;
  r.state = ParseResult::State::kError;
  r.error_status = status;
  r.error_message = std::move(message);
  return r;
}

std::multimap<std::string, std::string> ParseQuery(std::string_view query) {
  std::multimap<std::string, std::string> params;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (!pair.empty()) {
      const size_t eq = pair.find('=');
      params.emplace(PercentDecode(pair.substr(0, eq), true),
                     eq == std::string_view::npos ? "" : PercentDecode(pair.substr(eq + 1), true));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return params;
}

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoringCase(key, name)) return value;
  }
  return "";
}

std::string PercentDecode(std::string_view text, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else if (text[i] == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += text[i];
    }
  }
  return out;
}

ParseResult ParseRequest(std::string_view buffer, const Limits& limits) {
  // Clients may send stray line breaks between requests (RFC 9112, 2.2).
  size_t start = 0;
  while (start < buffer.size() && (buffer[start] == '\r' || buffer[start] == '\n')) ++start;
  const std::string_view input = buffer.substr(start);

  const size_t line_end = input.find("\r\n");
  if (line_end == std::string_view::npos ? input.size() > limits.max_target_bytes + 32
                                         : line_end > limits.max_target_bytes + 32) {
    return Failure(414,
                   Cat("the request target is longer than ", limits.max_target_bytes, " bytes"));
  }
  const size_t head_end = input.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    if (input.size() > limits.max_head_bytes) {
      return Failure(431,
                     Cat("the request headers are larger than ", limits.max_head_bytes, " bytes"));
    }
    return {};
  }
  if (head_end + 4 > limits.max_head_bytes) {
    return Failure(431,
                   Cat("the request headers are larger than ", limits.max_head_bytes, " bytes"));
  }

  ParseResult result;
  Request& request = result.request;
  // Request line: METHOD SP target SP HTTP/1.x
  const std::string_view line = input.substr(0, line_end);
  const size_t space1 = line.find(' ');
  const size_t space2 = space1 == std::string_view::npos ? space1 : line.find(' ', space1 + 1);
  if (space2 == std::string_view::npos || line.find(' ', space2 + 1) != std::string_view::npos) {
    return Failure(400, "malformed request line (expected: METHOD /path HTTP/1.1)");
  }
  const std::string_view method = line.substr(0, space1);
  const std::string_view target = line.substr(space1 + 1, space2 - space1 - 1);
  const std::string_view version = line.substr(space2 + 1);
  if (!IsToken(method)) return Failure(400, "malformed request method");
  if (target.size() > limits.max_target_bytes) {
    return Failure(414,
                   Cat("the request target is longer than ", limits.max_target_bytes, " bytes"));
  }
  if (target.empty() || (target.front() != '/' && target != "*") ||
      std::any_of(target.begin(), target.end(),
                  [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; })) {
    return Failure(400, "malformed request target (expected a path starting with /)");
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.size() == 8 && version.substr(0, 5) == "HTTP/")
      return Failure(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    return Failure(400, "malformed HTTP version in the request line");
  }
  request.method = std::string(method);
  request.target = std::string(target);
  const size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != std::string_view::npos) request.query = ParseQuery(target.substr(question + 1));
  bool keep_alive = version == "HTTP/1.1";

  // Header fields.
  bool has_length = false;
  uint64_t length = 0;
  std::string_view rest = input.substr(line_end + 2, head_end - line_end);
  while (!rest.empty()) {
    const size_t end = rest.find("\r\n");
    const std::string_view field = rest.substr(0, end);
    rest.remove_prefix(end + 2);
    if (field.empty()) break;
    if (field.front() == ' ' || field.front() == '\t')
      return Failure(400, "folded header lines are not accepted");
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || !IsToken(field.substr(0, colon)))
      return Failure(400, "malformed header line");
    const std::string_view name = field.substr(0, colon);
    const std::string_view value = TrimSpaces(field.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char c) {
          return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
        })) {
      return Failure(400, Cat("control characters in header ", name));
    }
    if (EqualsIgnoringCase(name, "Content-Length")) {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
        return Failure(400, "Content-Length must be a number of bytes");
      }
      const uint64_t n = std::stoull(std::string(value));
      if (has_length && n != length) return Failure(400, "conflicting Content-Length headers");
      has_length = true;
      length = n;
    } else if (EqualsIgnoringCase(name, "Transfer-Encoding")) {
      // Refused rather than decoded: every client of this API knows its body's size.
      return Failure(411, "chunked request bodies are not supported: send Content-Length");
    } else if (EqualsIgnoringCase(name, "Connection")) {
      ForEachListElement(value, [&](std::string_view option) {
        if (EqualsIgnoringCase(option, "close")) keep_alive = false;
        if (EqualsIgnoringCase(option, "keep-alive")) keep_alive = true;
      });
    } else if (EqualsIgnoringCase(name, "Expect")) {
      result.expects_continue = EqualsIgnoringCase(value, "100-continue");
    }
    request.headers.emplace_back(std::string(name), std::string(value));
  }
  request.keep_alive = keep_alive;
  if (length > limits.max_body_bytes) {
    return Failure(
        413, Cat("the request body is too large (at most ", limits.max_body_bytes, " bytes)"));
  }
  const size_t total = start + head_end + 4 + size_t(length);
  if (buffer.size() < total) {
    result.consumed = total;  // what the request will take once complete
    result.head_complete = true;
    return result;
  }
  request.body = std::string(buffer.substr(start + head_end + 4, size_t(length)));
  result.state = ParseResult::State::kComplete;
  result.consumed = total;
  result.expects_continue = false;
  return result;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

namespace {

// Sends all of `data` on a non-blocking socket, waiting at most `timeout` for the peer to
// make room. False when the peer is gone or too slow.
bool SendAll(int fd, std::string_view data, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, int(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

std::string ResponseHead(int status, std::string_view content_type, const Headers& common,
                         const Headers& headers, bool keep_alive) {
  std::string head = Cat("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
  if (!content_type.empty()) head += Cat("Content-Type: ", content_type, "\r\n");
  for (const Headers* list : {&common, &headers}) {
    for (const auto& [name, value] : *list) head += name + ": " + value + "\r\n";
  }
  head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return head;
}

// One client connection; owned by the reading thread while a request arrives, by a handler
// thread while it is answered.
struct Connection {
  int fd = -1;
  std::string input;           // bytes received and not yet consumed by a request
  Clock::time_point deadline;  // the request being read must be complete by then
  size_t awaited_bytes = 0;    // the head is parsed: the request takes this many bytes
  size_t reserved_bytes = 0;   // of the server's max_receiving_bytes, for this request
  bool screened = false;       // the head of the request being read passed the screen
  bool continue_sent = false;  // "100 Continue" went out for this request
  bool draining = false;       // answered with an error; discarding input until closed
  bool readable = false;       // this turn's poll found input (or a hang-up) to read

  ~Connection() {
    if (fd >= 0) close(fd);
  }
  // Between requests: nothing of the next one has arrived.
  bool Idle() const { return input.empty() && !draining; }
};

class ConnectionWriter : public ResponseWriter {
 public:
  ConnectionWriter(int fd, bool keep_alive, std::chrono::milliseconds timeout)
      : fd_(fd), keep_alive_(keep_alive), timeout_(timeout) {}

  void AddHeader(std::string name, std::string value) override {
    common_.emplace_back(std::move(name), std::move(value));
  }
  bool Send(int status, std::string_view content_type, std::string_view body,
            const Headers& headers) override {
    if (responded_) return false;
    responded_ = true;
    std::string message = ResponseHead(status, content_type, common_, headers, keep_alive_);
    message += Cat("Content-Length: ", body.size(), "\r\n\r\n");
    message += body;
    complete_ = ok_ = SendAll(fd_, message, timeout_);
    return ok_;
  }
  bool BeginStream(int status, std::string_view content_type, const Headers& headers) override {
    if (responded_) return false;
    responded_ = true;
    const std::string head = ResponseHead(status, content_type, common_, headers, keep_alive_) +
                             "Transfer-Encoding: chunked\r\n\r\n";
    ok_ = SendAll(fd_, head, timeout_);
    return ok_;
  }
  bool Write(std::string_view chunk) override {
    if (!ok_ || complete_ || !responded_) return false;
    if (chunk.empty()) return true;  // an empty chunk would end the body
    char size[20];
    std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
    ok_ = SendAll(fd_, std::string(size) + std::string(chunk) + "\r\n", timeout_);
    return ok_;
  }
  bool End() override {
    if (!ok_ || complete_ || !responded_) return false;
    complete_ = true;
    ok_ = SendAll(fd_, "0\r\n\r\n", timeout_);
    return ok_;
  }
  bool PeerHungUp() const override {
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }
  bool responded() const override { return responded_; }

  // The connection can carry the next request: the response went out whole.
  bool Reusable() const { return keep_alive_ && ok_ && complete_; }

 private:
  int fd_;
  bool keep_alive_;
  std::chrono::milliseconds timeout_;
  Headers common_;
  bool responded_ = false, complete_ = false, ok_ = false;
};

}  // namespace

struct Server::Impl {
  // A pool of handler threads and the complete requests waiting for them.
  struct Pool {
    std::condition_variable work_ready;
    std::deque<std::pair<std::unique_ptr<Connection>, Request>> work;  // guarded by `mutex`
    std::vector<std::thread> threads;
  };

  ServerOptions options;
  Handler handler;
  int listen_fd = -1;
  int wake_fd = -1;   // eventfd: wakes the reading thread (connection returned, stopping)
  int spare_fd = -1;  // held open so that, out of descriptors, a client can still be told so
  std::atomic<bool> stopping{false};
  std::atomic<int> open_connections{0};
  size_t receiving_bytes = 0;  // reading thread only: the sum of reserved_bytes
  std::thread reader;

  std::mutex mutex;  // guards both pools' queues and `returned`
  Pool handlers, quick;
  std::vector<std::unique_ptr<Connection>> returned;  // answered keep-alive connections

  Impl(ServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)) {}

  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof(one));
  }
  void ReadLoop();
  void HandleLoop(Pool& pool);
  // Parses what `c` has received; returns false when `c` left the reading thread's hands
  // (dispatched to a handler).
  bool Advance(std::unique_ptr<Connection>& c);
  std::string ErrorBody(int status, const std::string& message) const {
    return options.error_body ? options.error_body(status, message) : message;
  }
  // Answers without waiting (an error answer fits in the socket's buffer), then discards the
  // rest of the request for a moment before closing.
  Rejection ErrorAnswer(int status, const std::string& message) const {
    return {status,
            ErrorBody(status, message),
            {},
            options.error_body ? "application/json" : "text/plain"};
  }
  void Reject(Connection& c, const Rejection& rejection);
  void Reject(Connection& c, int status, const std::string& message) {
    Reject(c, ErrorAnswer(status, message));
  }
  // Gives back what `c` reserved of max_receiving_bytes.
  void Release(Connection& c) {
    receiving_bytes -= c.reserved_bytes;
    c.reserved_bytes = 0;
  }
  void StartReading(Connection& c) {
    Release(c);
    c.deadline = Clock::now() + options.read_timeout;
    c.awaited_bytes = 0;
    c.screened = false;
    c.continue_sent = false;
  }
  // Closes a connection still being read to make room for a new one (`newest`, spared unless
  // it is the only one); a client cut off mid-request is told why. False when none is read.
  bool EvictOne(std::list<std::unique_ptr<Connection>>& reading,
                const Connection* newest = nullptr);
  // Out of file descriptors with nothing to evict: accepts one waiting client on the spare
  // descriptor, tells it 503 and closes it, so that clients hear why rather than hang.
  void ShedOne();
};

namespace {

// Sends `answer` without waiting: an error answer fits in the socket's buffer.
void SendNow(int fd, const Rejection& answer) {
  const std::string response =
      ResponseHead(answer.status, answer.content_type, {}, answer.headers, false) +
      Cat("Content-Length: ", answer.body.size(), "\r\n\r\n") + answer.body;
  [[maybe_unused]] ssize_t n =
      send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

void Server::Impl::Reject(Connection& c, const Rejection& rejection) {
  SendNow(c.fd, rejection);
  // Closing with unread input would reset the connection and could destroy the answer
  // before the client reads it; discard the rest of the request for a moment instead.
  shutdown(c.fd, SHUT_WR);
  Release(c);
  c.draining = true;
  c.input.clear();
  c.deadline = Clock::now() + std::chrono::seconds(2);
}

bool Server::Impl::EvictOne(std::list<std::unique_ptr<Connection>>& reading,
                            const Connection* newest) {
  // Cheapest loss first: an answered error still draining, an idle keep-alive connection, a
  // slow request; the connection just accepted only when it is the last one left. Among
  // equals the oldest, at the front of the list.
  auto rank = [newest](const std::unique_ptr<Connection>& c) {
    return c.get() == newest ? 3 : c->draining ? 0 : c->Idle() ? 1 : 2;
  };
  auto victim = reading.begin();
  for (auto it = reading.begin(); it != reading.end(); ++it) {
    if (rank(*it) < rank(*victim)) victim = it;
  }
  if (victim == reading.end()) return false;
  Connection& c = **victim;
  if (!c.Idle() && !c.draining) {
    SendNow(c.fd,
            ErrorAnswer(503, "the server is at its connection limit; this slow request made room"));
  }
  Release(c);
  reading.erase(victim);
  --open_connections;
  return true;
}

void Server::Impl::ShedOne() {
  if (spare_fd < 0) return;
  close(spare_fd);
  const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    SendNow(fd, ErrorAnswer(503, "the server is out of file descriptors; retry later"));
    close(fd);
  }
  spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

bool Server::Impl::Advance(std::unique_ptr<Connection>& c) {
  if (c->draining) {
    c->input.clear();
    return true;
  }
  if (c->input.empty() || (c->awaited_bytes > 0 && c->input.size() < c->awaited_bytes)) return true;
  ParseResult parsed = ParseRequest(c->input, options.limits);
  if (parsed.state == ParseResult::State::kError) {
    Reject(*c, parsed.error_status, parsed.error_message);
    return true;
  }
  const bool head = parsed.head_complete || parsed.state == ParseResult::State::kComplete;
  if (head && !c->screened) {
    c->screened = true;
    if (options.screen) {
      if (std::optional<Rejection> rejection = options.screen(parsed.request)) {
        Reject(*c, *rejection);
        return true;
      }
    }
  }
  if (parsed.state == ParseResult::State::kIncomplete) {
    if (!parsed.head_complete) return true;
    if (c->reserved_bytes == 0) {
      // The body is coming: reserve its bytes, or say at once that there is no room.
      if (receiving_bytes + parsed.consumed > options.max_receiving_bytes) {
        Reject(*c, 503,
               Cat("the server is receiving ", receiving_bytes,
                   " bytes of request bodies already; retry later"));
        return true;
      }
      c->reserved_bytes = parsed.consumed;
      receiving_bytes += parsed.consumed;
    }
    c->awaited_bytes = parsed.consumed;
    if (parsed.expects_continue && !c->continue_sent) {
      c->continue_sent = true;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] ssize_t n = send(c->fd, kContinue.data(), kContinue.size(), MSG_NOSIGNAL);
    }
    return true;
  }
  Pool& pool = options.is_quick && options.is_quick(parsed.request) ? quick : handlers;
  {
    std::lock_guard lock(mutex);
    if (pool.work.size() < options.max_waiting_requests) {
      c->input.erase(0, parsed.consumed);
      Release(*c);
      pool.work.emplace_back(std::move(c), std::move(parsed.request));
    }
  }
  if (c) {  // not queued: the pool's queue is full
    Reject(*c, 503,
           Cat("the server is busy: ", options.max_waiting_requests,
               " requests are waiting for a handler; retry later"));
    return true;
  }
  pool.work_ready.notify_one();
  return false;
}

void Server::Impl::ReadLoop() {
  std::list<std::unique_ptr<Connection>> reading;  // in arrival order
  std::vector<pollfd> fds;
  std::vector<std::list<std::unique_ptr<Connection>>::iterator> polled;
  char chunk[64 << 10];
  // Out of descriptors with nobody to evict: the listening socket rests until then rather than
  // waking this loop at once, again and again.
  Clock::time_point accept_paused_until = Clock::time_point::min();
  auto drop = [&](std::list<std::unique_ptr<Connection>>::iterator it) {
    Release(**it);
    --open_connections;
    return reading.erase(it);
  };
  while (!stopping) {
    std::vector<std::unique_ptr<Connection>> back;
    {
      std::lock_guard lock(mutex);
      back.swap(returned);
    }
    for (auto& c : back) {
      StartReading(*c);
      // A pipelined request may already be waiting in the leftover bytes.
      if (Advance(c)) reading.push_back(std::move(c));
    }

    fds.assign({{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}});
    polled.clear();
    Clock::time_point next_deadline = Clock::now() + std::chrono::seconds(1);
    for (auto it = reading.begin(); it != reading.end(); ++it) {
      fds.push_back({(*it)->fd, POLLIN | POLLRDHUP, 0});
      polled.push_back(it);
      next_deadline = std::min(next_deadline, (*it)->deadline);
    }
    // At the connection bound with nobody to evict (every connection is being answered), new
    // clients wait in the listen backlog until a connection closes and wakes this loop.
    if ((open_connections >= options.max_connections && reading.empty()) ||
        Clock::now() < accept_paused_until) {
      fds[1].events = 0;
      if (Clock::now() < accept_paused_until)
        next_deadline = std::min(next_deadline, accept_paused_until);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
    if (poll(fds.data(), fds.size(), int(std::max<int64_t>(wait.count(), 0) + 1)) < 0 &&
        errno != EINTR) {
      continue;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = read(wake_fd, &count, sizeof(count));
    }
    // Marked on the connections themselves: evictions below may remove any of them.
    for (size_t i = 2; i < fds.size(); ++i) (*polled[i - 2])->readable = fds[i].revents != 0;
    // Up to one connection past the bound is accepted before the read below; which one makes
    // room is chosen after it, so no connection is taken for idle while its bytes wait unread.
    const Connection* newest = nullptr;
    if (fds[1].revents & POLLIN) {
      while (open_connections <= options.max_connections) {
        const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            if (EvictOne(reading)) continue;
            ShedOne();
            accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
          }
          break;
        }
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        auto c = std::make_unique<Connection>();
        c->fd = fd;
        c->readable = true;  // a client's request usually arrives with its connection
        ++open_connections;
        StartReading(*c);
        newest = c.get();
        reading.push_back(std::move(c));
      }
    }
    // Past the bound every connection is read, polled or not, before one is chosen: bytes that
    // arrived since the poll count.
    const bool choosing = open_connections > options.max_connections;
    for (auto it = reading.begin(); it != reading.end();) {
      if (!(*it)->readable && !choosing) {
        ++it;
        continue;
      }
      std::unique_ptr<Connection>& c = *it;
      c->readable = false;
      const bool is_newest = c.get() == newest;
      bool closed = false;
      try {
        for (;;) {
          const ssize_t n = recv(c->fd, chunk, sizeof(chunk), 0);
          if (n > 0) {
            if (!c->draining) c->input.append(chunk, size_t(n));
            if (size_t(n) < sizeof(chunk)) break;
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
          break;
        }
        // A client that closed its side can still have sent a whole request; answer it only
        // if so (the answer may still reach a half-closed client).
        if (!Advance(c)) {
          if (is_newest) newest = nullptr;
          it = reading.erase(it);
          continue;
        }
      } catch (const std::exception&) {
        closed = true;  // out of memory for this client's bytes: it loses its connection
      }
      if (closed && is_newest) newest = nullptr;
      it = closed ? drop(it) : std::next(it);
    }
    // Still past the bound: a connection being read makes room (the newest only when every
    // other is being answered).
    if (open_connections > options.max_connections) EvictOne(reading, newest);
    const Clock::time_point now = Clock::now();
    for (auto it = reading.begin(); it != reading.end();) {
      Connection& c = **it;
      if (now < c.deadline) {
        ++it;
        continue;
      }
      if (!c.draining && !c.input.empty()) {
        Reject(c, 408,
               Cat("the request did not arrive within ",
                   std::chrono::duration<double>(options.read_timeout).count(), " s"));
        ++it;
        continue;
      }
      it = drop(it);  // idle keep-alive connection, or done draining
    }
  }
  for (auto& c : reading) Release(*c);
  open_connections -= int(reading.size());
}

void Server::Impl::HandleLoop(Pool& pool) {
  for (;;) {
    std::unique_ptr<Connection> c;
    Request request;
    {
      std::unique_lock lock(mutex);
      pool.work_ready.wait(lock, [&] { return !pool.work.empty() || stopping; });
      if (pool.work.empty()) return;  // stopping, and nothing left to answer
      c = std::move(pool.work.front().first);
      request = std::move(pool.work.front().second);
      pool.work.pop_front();
    }
    ConnectionWriter writer(c->fd, request.keep_alive && !stopping, options.write_timeout);
    // A handler that throws, or forgets to answer, still gives the client an error body of
    // the server's kind.
    try {
      handler(request, writer);
    } catch (const std::exception& e) {
      if (!writer.responded())
        writer.Send(500, "application/json", ErrorBody(500, Cat("internal error: ", e.what())), {});
    } catch (...) {
      if (!writer.responded())
        writer.Send(500, "application/json", ErrorBody(500, "internal error"), {});
    }
    if (!writer.responded())
      writer.Send(500, "application/json", ErrorBody(500, "internal error: no response"), {});
    if (writer.Reusable() && !stopping) {
      {
        std::lock_guard lock(mutex);
        returned.push_back(std::move(c));
      }
      Wake();
    } else {
      c.reset();
      --open_connections;
      Wake();  // a connection slot is free: the reading thread may accept again
    }
  }
}

Server::Server(ServerOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

Server::~Server() { Stop(); }

int Server::Start() {
  Impl& s = *impl_;
  const ServerOptions& o = s.options;
  if (o.port < 0 || o.port > 65535) Fail("port ", o.port, " is not in 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string port_text = std::to_string(o.port);
  if (const int rc = getaddrinfo(o.host.c_str(), port_text.c_str(), &hints, &addresses); rc != 0)
    Fail("cannot listen on ", o.host, ":", o.port, ": ", gai_strerror(rc));
  std::string problem = "no address";
  for (addrinfo* a = addresses; a != nullptr && s.listen_fd < 0; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restarted server bind past connections in TIME_WAIT; SO_REUSEPORT
    // is left off so that a second server on a busy port fails instead of sharing it.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      s.listen_fd = fd;
    } else {
      problem = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(addresses);
  if (s.listen_fd < 0) Fail("cannot listen on ", o.host, ":", o.port, ": ", problem);
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) Fail("cannot create an eventfd: ", std::strerror(errno));
  s.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Connections beyond the descriptors the process may open would fail in accept; leave a
  // reserve for the model's files, the threads' pipes and the spare.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const int usable = int(std::min<rlim_t>(files.rlim_cur, 1 << 30)) - 64;
    s.options.max_connections = std::max(8, std::min(s.options.max_connections, usable));
  }
  s.reader = std::thread([&s] { s.ReadLoop(); });
  for (int i = 0; i < std::max(1, o.handler_threads); ++i)
    s.handlers.threads.emplace_back([&s] { s.HandleLoop(s.handlers); });
  for (int i = 0; i < std::max(1, o.quick_threads); ++i)
    s.quick.threads.emplace_back([&s] { s.HandleLoop(s.quick); });
  return port;
}

void Server::Stop() {
  Impl& s = *impl_;
  {
    // Set under the handlers' mutex: a handler that has just found no work and is about to
    // wait would otherwise miss both the flag and the notification, and never return.
    std::lock_guard lock(s.mutex);
    if (s.stopping.exchange(true)) return;
  }
  if (s.wake_fd >= 0) s.Wake();
  s.handlers.work_ready.notify_all();
  s.quick.work_ready.notify_all();
  if (s.reader.joinable()) s.reader.join();
  for (Impl::Pool* pool : {&s.handlers, &s.quick}) {
    for (std::thread& t : pool->threads) t.join();
    pool->threads.clear();
  }
  s.returned.clear();
  for (int* fd : {&s.listen_fd, &s.wake_fd, &s.spare_fd}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

}  // namespace polestar::http
