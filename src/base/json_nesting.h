// How deeply JSON text nests, counted before parsing it. nlohmann's parser is iterative, but
// copying, comparing and dumping a value recurse once per level: untrusted text nested
// 100,000 deep would overflow the stack, so its depth is bounded first.
#pragma once

#include <string_view>

namespace polestar {

// The deepest nesting of arrays and objects in `text`, skipping brackets inside strings;
// the scan stops once it passes `limit` (then limit + 1). Malformed text is the parser's to
// report.
int JsonNestingDepth(std::string_view text, int limit);

}  // namespace polestar
