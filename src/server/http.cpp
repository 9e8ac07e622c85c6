#include "server/http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
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
    ParseResult waiting;
    waiting.expects_continue = result.expects_continue;
    waiting.consumed = total;  // what the request will take once complete
    return waiting;
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

}  // namespace polestar::http
