#include "canvas_view.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace polestar::cli {
namespace {

// A line being laid out: its text (escapes included) and the columns it takes.
struct Line {
  std::string text;
  int width = 0;
};

// What a chip shows: masks and end tokens as glyphs, control characters as arrows.
std::string ChipText(const CanvasCell& cell) {
  if (cell.kind == CanvasCell::Kind::kMask) return std::string(kMaskGlyph);
  if (cell.kind == CanvasCell::Kind::kEnd) return std::string(kEndGlyph);
  std::string text;
  for (const char c : cell.text) {
    if (c == '\n') {
      text += "\u21b5";
    } else if (c == '\t') {
      text += "\u2192";
    } else if ((unsigned char)c >= 0x20 && c != 0x7f) {
      text += c;
    }
  }
  return text;
}

// `text` cut into pieces of at most `width` columns (at least one piece, maybe empty).
std::vector<std::string> HardWrap(std::string_view text, int width) {
  std::vector<std::string> pieces(1);
  int used = 0;
  for (const std::string_view point : unicode::CodePoints(text)) {
    if (used == width) {
      pieces.emplace_back();
      used = 0;
    }
    pieces.back() += point;
    ++used;
  }
  return pieces;
}

std::string Styled(const std::string& text, CanvasCell::Kind kind, bool colour) {
  if (!colour) return text;
  if (kind == CanvasCell::Kind::kFresh) return "\x1b[1;32m" + text + "\x1b[0m";
  if (kind == CanvasCell::Kind::kEnd) return "\x1b[2m" + text + "\x1b[0m";
  return text;
}

// The canvas wrapped to `width` columns, chip by chip.
std::vector<Line> WrapCells(std::span<const CanvasCell> cells, int width, bool colour) {
  std::vector<Line> lines;
  for (const CanvasCell& cell : cells) {
    for (const std::string& piece : HardWrap(ChipText(cell), width)) {
      const int w = DisplayWidth(piece);
      if (lines.empty() || lines.back().width + w > width) lines.emplace_back();
      lines.back().text += Styled(piece, cell.kind, colour);
      lines.back().width += w;
    }
  }
  return lines;
}

std::vector<Line> WrapTexts(std::span<const std::string> texts, int width) {
  std::vector<Line> lines;
  for (const std::string& text : texts) {
    for (std::string& piece : HardWrap(text, width)) {
      const int w = DisplayWidth(piece);
      lines.push_back({std::move(piece), w});
    }
  }
  return lines;
}

}  // namespace

int DisplayWidth(std::string_view text) { return int(unicode::CodePoints(text).size()); }

std::vector<std::string> LayOutPanels(std::span<const CanvasPanel> panels, int width, bool colour) {
  width = std::max(width, 1);
  // Per panel its three sections; each section takes as many rows as its tallest instance.
  std::vector<std::vector<std::vector<Line>>> sections;  // [panel][title, canvas, status][row]
  size_t heights[3] = {0, 0, 0};
  for (const CanvasPanel& panel : panels) {
    sections.push_back({WrapTexts(std::span(&panel.title, 1), width),
                        WrapCells(panel.cells, width, colour), WrapTexts(panel.status, width)});
    for (size_t s = 0; s < 3; ++s) heights[s] = std::max(heights[s], sections.back()[s].size());
  }
  std::vector<std::string> rows;
  for (size_t s = 0; s < 3; ++s) {
    for (size_t r = 0; r < heights[s]; ++r) {
      std::string row;
      for (size_t p = 0; p < sections.size(); ++p) {
        const std::vector<Line>& section = sections[p][s];
        const Line line = r < section.size() ? section[r] : Line{};
        row += line.text;
        if (p + 1 < sections.size())
          row += std::string(size_t(width - line.width), ' ') + " \u2502 ";
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace polestar::cli
