// The terminal view of `generate --visual`: each policy's canvas as a column of token chips
// (masks, tokens, this step's commits, end-of-text), the columns laid side by side.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace polestar::cli {

struct CanvasCell {
  enum class Kind { kMask, kToken, kFresh, kEnd };  // kFresh: committed this step
  Kind kind = Kind::kMask;
  std::string text;  // the decoded token (kToken, kFresh); masks and end tokens draw a glyph
};

// One policy's column: a title line, the canvas wrapped to the column's width, then status lines.
struct CanvasPanel {
  std::string title;
  std::vector<CanvasCell> cells;
  std::vector<std::string> status;
};

// Columns a line of plain UTF-8 text takes in a terminal: one per code point.
int DisplayWidth(std::string_view text);

// The panels side by side, each `width` columns wide and separated by " | " (a box-drawing
// bar): one string per terminal line, no newlines. A token chip never splits across lines
// unless it is wider than the column; newlines and tabs in tokens show as arrows. Canvases and
// status lines start on the same rows in every column. With `colour`, this step's commits are
// bold green and end tokens dim (ANSI escapes, not counted in the widths).
std::vector<std::string> LayOutPanels(std::span<const CanvasPanel> panels, int width, bool colour);

// The glyphs of a mask and of an end token.
inline constexpr std::string_view kMaskGlyph = "\u2592";
inline constexpr std::string_view kEndGlyph = "\u220e";

}  // namespace polestar::cli
