// The answer's text as it becomes final: tokens of the settled left-to-right prefix go in,
// append-only text comes out, cut at the first stop string. A delta never ends inside a
// UTF-8 character nor inside what may turn out to be the start of a stop string.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/text_codec.h"

namespace polestar {

class OutputText {
 public:
  OutputText(std::unique_ptr<TextStream> stream, std::vector<std::string> stop);
  // Returns the text that became final with `token` (empty after a stop string).
  std::string Push(int token);
  // Returns everything still held back; call once, after the last token.
  std::string Finish();
  bool stopped() const { return stopped_; }  // a stop string was found

 private:
  std::string Accept(const std::string& piece, bool last);

  std::unique_ptr<TextStream> stream_;
  std::vector<std::string> stop_;
  std::string raw_;      // bytes of an unfinished UTF-8 character
  std::string pending_;  // valid text that may begin a stop string
  bool stopped_ = false;
};

}  // namespace polestar
