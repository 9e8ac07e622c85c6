#include "server/output_text.h"

#include <algorithm>

#include "server/utf8.h"

namespace polestar {

OutputText::OutputText(std::unique_ptr<TextStream> stream, std::vector<std::string> stop)
    : stream_(std::move(stream)), stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::string OutputText::Push(int token) {
  if (stopped_) return "";
  return Accept(stream_->Push(token), false);
}

std::string OutputText::Finish() {
  if (stopped_) return "";
  return Accept(stream_->Finish(), true);
}

std::string OutputText::Accept(const std::string& piece, bool last) {
  raw_ += piece;
  const size_t settled = last ? raw_.size() : raw_.size() - IncompleteUtf8Tail(raw_);
  pending_ += SanitizeUtf8(std::string_view(raw_).substr(0, settled));
  raw_.erase(0, settled);

  size_t first_stop = std::string::npos;
  for (const std::string& s : stop_) first_stop = std::min(first_stop, pending_.find(s));
  if (first_stop != std::string::npos) {
    std::string out = pending_.substr(0, first_stop);
    pending_.clear();
    raw_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that a stop string starts with.
  size_t hold = 0;
  if (!last) {
    for (const std::string& s : stop_) {
      for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
        if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

}  // namespace polestar
