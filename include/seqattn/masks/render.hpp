// Pictures of masks: ASCII for terminals and tests, SVG for documentation
// (plain text, no dependencies).
//
// Element pictures draw one cell per (q, kv) up to `max_cells` per side;
// larger masks are drawn in cells of several elements, each cell shown by the
// description's own tile class: '#' all allowed, '+' some, '.' none. Block
// pictures draw one cell per tile of a BlockMask: '#' full, '+' partial,
// '.' empty (skipped by kernels).
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

namespace detail {

inline char class_char(TileClass c) { return c == TileClass::full ? '#' : c == TileClass::partial ? '+' : '.'; }

// Calls f(row, col, class) for a grid of cells covering the mask.
template <MaskDescription M, class F>
void for_cells(const M& mask, const MaskContext& ctx, index_t max_cells, index_t& rows, index_t& cols, F&& f) {
  const index_t step = std::max<index_t>(1, (std::max(ctx.q_len, ctx.kv_len) + max_cells - 1) / max_cells);
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

inline std::string svg_grid(index_t rows, index_t cols, index_t cell, const std::string& title,
                            const std::vector<TileClass>& classes) {
  const index_t w = cols * cell + 2, h = rows * cell + 22;
  std::string s =
      concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", w, "\" height=\"", h, "\" viewBox=\"0 0 ", w, " ", h,
             "\">\n", "<text x=\"1\" y=\"14\" font-family=\"monospace\" ", "font-size=\"12\">", title, "</text>\n",
             "<g transform=\"translate(1,20)\">\n", "<rect width=\"", cols * cell, "\" height=\"", rows * cell,
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
  std::vector<TileClass> classes;
  index_t rows = 0, cols = 0;
  detail::for_cells(mask, ctx, max_cells, rows, cols, [&](index_t, index_t, TileClass k) { classes.push_back(k); });
  return detail::svg_grid(rows, cols, cell, title, classes);
}

inline std::string to_svg(const BlockMask& bm, index_t b, index_t h = 0, const std::string& title = "",
                          index_t cell = 8) {
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
  return detail::svg_grid(rows, cols, cell, title, classes);
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  detail::require(static_cast<bool>(out), "write_text_file: cannot open ", path);
  out << text;
  detail::require(static_cast<bool>(out), "write_text_file: cannot write ", path);
}

}  // namespace seqattn
