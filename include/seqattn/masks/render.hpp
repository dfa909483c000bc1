// Pictures of masks: ASCII for terminals and tests, SVG for documentation
// (plain text, no dependencies).
//
// Element pictures draw one cell per (q, kv) up to `max_cells` per side;
// larger masks are drawn in cells of several elements, each cell shown by the
// description's own tile class: '#' all allowed, '+' some, '.' none. Block
// pictures draw one cell per tile of a BlockMask: '#' full, '+' partial,
// '.' empty (skipped by kernels).
//
// SVG pictures are self-explaining: the title (XML-escaped, any text is
// safe), the axes named (q down, kv across) with token indices at the start
// of cells, and a legend of the colours used (allowed / masked, or full /
// partial / empty tiles). They are sized from an estimate of the text's width,
// so a long title on a small grid widens the picture instead of being clipped.
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

namespace detail {

inline char class_char(TileClass c) { return c == TileClass::full ? '#' : c == TileClass::partial ? '+' : '.'; }

// Calls f(row, col, class) for a grid of cells covering the mask.
// Elements per cell side: 1 unless the mask is larger than max_cells.
inline index_t cell_step(const MaskContext& ctx, index_t max_cells) {
  return std::max<index_t>(1, (std::max(ctx.q_len, ctx.kv_len) + max_cells - 1) / max_cells);
}

template <MaskDescription M, class F>
void for_cells(const M& mask, const MaskContext& ctx, index_t max_cells, index_t& rows, index_t& cols, F&& f) {
  const index_t step = cell_step(ctx, max_cells);
  rows = (ctx.q_len + step - 1) / step;
  cols = (ctx.kv_len + step - 1) / step;
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c = 0; c < cols; ++c) {
      const Tile t{r * step, std::min(ctx.q_len, (r + 1) * step), c * step, std::min(ctx.kv_len, (c + 1) * step)};
      f(r, c,
        step == 1 ? (mask.allowed(ctx, t.q_begin, t.kv_begin) ? TileClass::full : TileClass::empty)
                  : mask.classify(ctx, t));
    }
  }
}

inline const char* class_color(TileClass c) {
  return c == TileClass::full ? "#1f4e79" : c == TileClass::partial ? "#8fb3d9" : "#f2f2f2";
}

// Text inside an element or attribute: the five XML special characters as
// entities, so any title gives a well-formed file.
inline std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// Monospace text at font-size 12 advances 0.6 em (7.2 px) per character in
// common fonts; 7.5 leaves room for wider fallbacks. Pictures size themselves
// from this estimate so that titles and labels are never clipped.
inline constexpr index_t kSvgFontSize = 12;
inline index_t svg_text_width(std::size_t chars) { return static_cast<index_t>((chars * 15 + 1) / 2); }

// What the cells of a picture stand for: element pictures show (groups of)
// elements, block pictures tiles; `q_step` / `kv_step` tokens per cell row /
// column label the axes with token indices.
struct SvgPicture {
  std::string title;
  index_t rows = 0, cols = 0, cell = 4;
  index_t q_len = 0, kv_len = 0;
  index_t q_step = 1, kv_step = 1;
  bool blocks = false;
};

inline std::string svg_grid(const SvgPicture& pic, const std::vector<TileClass>& classes) {
  const index_t rows = pic.rows, cols = pic.cols, cell = pic.cell;
  // Tick labels: a token index at the start of every k-th cell, k chosen so
  // that neighbouring labels do not overlap.
  const std::size_t digits = std::to_string(std::max<index_t>(0, std::max(pic.q_len, pic.kv_len) - 1)).size();
  const index_t col_every = std::max<index_t>(1, (svg_text_width(digits) + 6 + cell - 1) / cell);
  const index_t row_every = std::max<index_t>(1, (kSvgFontSize + 2 + cell - 1) / cell);
  const std::string q_name = "q", kv_name = pic.blocks ? "kv (token index; cells are tiles)" : "kv (token index)";
  const index_t left = svg_text_width(std::max<std::size_t>(digits, 1) + 2) + 8;  // "q" name + row labels
  const index_t top = 20 + 16 + 14;                                               // title, kv name, column labels
  const index_t grid_w = cols * cell, grid_h = rows * cell;
  struct Entry {
    TileClass cls;
    std::string label;
  };
  std::vector<Entry> legend;
  if (pic.blocks) {
    legend = {{TileClass::full, "full tile (no mask work)"},
              {TileClass::partial, "partial tile (masked)"},
              {TileClass::empty, "empty tile (skipped)"}};
  } else if (pic.q_step == 1 && pic.kv_step == 1) {
    legend = {{TileClass::full, "allowed"}, {TileClass::empty, "masked"}};
  } else {
    legend = {{TileClass::full, "all allowed"}, {TileClass::partial, "some allowed"}, {TileClass::empty, "masked"}};
  }
  std::string note;
  if (!pic.blocks && (pic.q_step > 1 || pic.kv_step > 1)) {
    note = concat("one cell = ", pic.q_step, " x ", pic.kv_step, " elements");
  }
  index_t legend_w = 0;
  for (const Entry& e : legend) legend_w += 12 + 4 + svg_text_width(e.label.size()) + 12;
  const index_t legend_top = top + grid_h + 10;
  const index_t h = legend_top + 16 + (note.empty() ? 0 : 16) + 4;
  const index_t w =
      std::max({left + grid_w + 4, svg_text_width(pic.title.size()) + 8, left + svg_text_width(kv_name.size()) + 4,
                legend_w + 8, svg_text_width(note.size()) + 8});
  const char* font = " font-family=\"monospace\" font-size=\"12\"";
  std::string s = concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", w, "\" height=\"", h,
                         "\" viewBox=\"0 0 ", w, " ", h, "\">\n", "<title>", xml_escape(pic.title), "</title>\n",
                         "<text x=\"4\" y=\"14\"", font, ">", xml_escape(pic.title), "</text>\n");
  // Axis names: kv across the top, q down the left.
  s += concat("<text x=\"", left, "\" y=\"", top - 18, "\"", font, ">", xml_escape(kv_name), "</text>\n");
  s += concat("<text x=\"4\" y=\"", top - 4, "\"", font, " font-weight=\"bold\">", q_name, "</text>\n");
  s += "<g font-family=\"monospace\" font-size=\"10\" fill=\"#444\">\n";
  for (index_t c = 0; c < cols; c += col_every) {
    s += concat("<text x=\"", left + c * cell, "\" y=\"", top - 4, "\">", c * pic.kv_step, "</text>\n");
  }
  for (index_t r = 0; r < rows; r += row_every) {
    s += concat("<text x=\"", left - 4, "\" y=\"", top + r * cell + std::min<index_t>(cell, 10),
                "\" text-anchor=\"end\">", r * pic.q_step, "</text>\n");
  }
  s += "</g>\n";
  s += concat("<g transform=\"translate(", left, ",", top, ")\">\n", "<rect width=\"", grid_w, "\" height=\"", grid_h,
              "\" fill=\"", class_color(TileClass::empty), "\" stroke=\"#999\"/>\n");
  for (index_t r = 0; r < rows; ++r) {
    index_t c = 0;
    while (c < cols) {
      const TileClass k = classes[static_cast<std::size_t>(r * cols + c)];
      index_t e = c + 1;
      while (e < cols && classes[static_cast<std::size_t>(r * cols + e)] == k) ++e;
      if (k != TileClass::empty) {
        s += concat("<rect x=\"", c * cell, "\" y=\"", r * cell, "\" width=\"", (e - c) * cell, "\" height=\"", cell,
                    "\" fill=\"", class_color(k), "\"/>\n");
      }
      c = e;
    }
  }
  s += "</g>\n";
  // Legend: a swatch and a label per class shown.
  s += concat("<g", font, ">\n");
  index_t x = 4;
  for (const Entry& e : legend) {
    s += concat("<rect x=\"", x, "\" y=\"", legend_top, "\" width=\"12\" height=\"12\" fill=\"", class_color(e.cls),
                "\" stroke=\"#999\"/>\n", "<text x=\"", x + 16, "\" y=\"", legend_top + 11, "\">", xml_escape(e.label),
                "</text>\n");
    x += 12 + 4 + svg_text_width(e.label.size()) + 12;
  }
  if (!note.empty()) s += concat("<text x=\"4\" y=\"", legend_top + 27, "\">", xml_escape(note), "</text>\n");
  return s + "</g>\n</svg>\n";
}

}  // namespace detail

// One line per row (or cell row), '#' allowed, '.' not.
template <MaskDescription M>
std::string to_ascii(const M& mask, const MaskContext& ctx, index_t max_cells = 96) {
  std::string s;
  index_t rows = 0, cols = 0;
  detail::for_cells(mask, ctx, max_cells, rows, cols, [&](index_t, index_t c, TileClass k) {
    s += detail::class_char(k);
    if (c + 1 == cols) s += '\n';
  });
  return s;
}

// One line per q-block of (batch b, head h).
inline std::string to_ascii(const BlockMask& bm, index_t b, index_t h = 0) {
  detail::require(b >= 0 && b < bm.batch() && h >= 0 && (bm.heads() == 1 || h < bm.heads()), "to_ascii: (batch ", b,
                  ", head ", h, ") is outside the BlockMask's ", bm.batch(), " sequences x ", bm.heads(), " heads");
  std::string s;
  const auto nkv = static_cast<std::size_t>(bm.num_kv_blocks(b));
  for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
    std::string row(nkv, '.');
    for (const BlockRange& r : bm.full_ranges(b, h, qb)) {
      for (auto kb = r.begin; kb < r.end; ++kb) row[static_cast<std::size_t>(kb)] = '#';
    }
    for (std::int32_t kb : bm.partial_blocks(b, h, qb)) row[static_cast<std::size_t>(kb)] = '+';
    s += row + '\n';
  }
  return s;
}

template <MaskDescription M>
std::string to_svg(const M& mask, const MaskContext& ctx, const std::string& title = "", index_t max_cells = 128,
                   index_t cell = 4) {
  detail::require(max_cells > 0 && cell > 0, "to_svg: max_cells and cell must be positive, got ", max_cells, " and ",
                  cell);
  std::vector<TileClass> classes;
  index_t rows = 0, cols = 0;
  detail::for_cells(mask, ctx, max_cells, rows, cols, [&](index_t, index_t, TileClass k) { classes.push_back(k); });
  const index_t step = detail::cell_step(ctx, max_cells);
  return detail::svg_grid({title, rows, cols, cell, ctx.q_len, ctx.kv_len, step, step, false}, classes);
}

inline std::string to_svg(const BlockMask& bm, index_t b, index_t h = 0, const std::string& title = "",
                          index_t cell = 8) {
  detail::require(cell > 0, "to_svg: cell must be positive, got ", cell);
  const index_t rows = bm.num_q_blocks(b), cols = bm.num_kv_blocks(b);
  std::vector<TileClass> classes(static_cast<std::size_t>(rows * cols), TileClass::empty);
  for (index_t qb = 0; qb < rows; ++qb) {
    for (const BlockRange& r : bm.full_ranges(b, h, qb)) {
      for (auto kb = r.begin; kb < r.end; ++kb) classes[static_cast<std::size_t>(qb * cols + kb)] = TileClass::full;
    }
    for (std::int32_t kb : bm.partial_blocks(b, h, qb)) {
      classes[static_cast<std::size_t>(qb * cols + kb)] = TileClass::partial;
    }
  }
  return detail::svg_grid(
      {title, rows, cols, cell, bm.q_len(b), bm.kv_len(b), bm.block_shape().q, bm.block_shape().kv, true}, classes);
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  detail::require(static_cast<bool>(out), "write_text_file: cannot open ", path);
  out << text;
  detail::require(static_cast<bool>(out), "write_text_file: cannot write ", path);
}

}  // namespace seqattn
