// UTF-8 checks for the text the server sends: streamed deltas end on character boundaries,
// and bytes that are not UTF-8 never reach a JSON encoder.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace polestar {

// Length of the sequence a lead byte starts (1 for ASCII and for bytes that cannot lead).
size_t Utf8SequenceLength(unsigned char lead);
bool IsValidUtf8(std::string_view text);
size_t Utf8CharCount(std::string_view text);  // of valid UTF-8
// How many bytes at the end of `text` are the start of a character whose remaining bytes
// have not arrived yet (0 to 3).
size_t IncompleteUtf8Tail(std::string_view text);
// `text` with every ill-formed sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view text);

}  // namespace polestar
