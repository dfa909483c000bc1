// SVG pictures (masks/render.hpp): well-formed XML whatever the title, a
// legend and axis labels, and wide enough for their title.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_render_test {

using namespace seqattn;

namespace {

// A tiny XML well-formedness check, enough for what render.hpp writes: one
// root element; tags balanced and properly nested; attributes name="value"
// or name='value' with no '<' in values; '&' only as one of the five named
// entities or a numeric reference; no raw '<' or '&' in text. Returns an
// empty string when well-formed, else what is wrong and where.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> open;
  int roots = 0;
  std::size_t i = 0;
  const auto is_name = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == ':' || c == '.';
  };
  const auto entity_ok = [&](std::size_t at) {
    static const char* const kNamed[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (const char* e : kNamed) {
      if (s.compare(at, std::char_traits<char>::length(e), e) == 0) return true;
    }
    std::size_t j = at + 1;
    if (j < s.size() && s[j] == '#') {
      ++j;
      const std::size_t digits = j;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      return j > digits && j < s.size() && s[j] == ';';
    }
    return false;
  };
  const auto skip_space = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  while (i < s.size()) {
    if (s[i] == '&') {
      if (!entity_ok(i)) return "bad entity at " + std::to_string(i);
      ++i;
      continue;
    }
    if (s[i] == '>') return "raw '>' is legal but render.hpp must not leave one in text at " + std::to_string(i);
    if (s[i] != '<') {
      const bool space = s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r';
      if (open.empty() && !space) return "text outside the root at " + std::to_string(i);
      ++i;
      continue;
    }
    ++i;
    if (i < s.size() && s[i] == '/') {
      ++i;
      const std::size_t b = i;
      while (i < s.size() && is_name(s[i])) ++i;
      const std::string name = s.substr(b, i - b);
      skip_space();
      if (i >= s.size() || s[i] != '>') return "unterminated end tag " + name;
      ++i;
      if (open.empty() || open.back() != name) return "end tag " + name + " does not close the open element";
      open.pop_back();
      continue;
    }
    const std::size_t b = i;
    while (i < s.size() && is_name(s[i])) ++i;
    const std::string name = s.substr(b, i - b);
    if (name.empty()) return "'<' not starting a tag at " + std::to_string(b - 1);
    std::vector<std::string> attrs;
    for (;;) {
      skip_space();
      if (i >= s.size()) return "unterminated tag " + name;
      if (s[i] == '>' || s[i] == '/') break;
      const std::size_t ab = i;
      while (i < s.size() && is_name(s[i])) ++i;
      const std::string attr = s.substr(ab, i - ab);
      if (attr.empty()) return "bad attribute in tag " + name + " at " + std::to_string(i);
      for (const std::string& a : attrs) {
        if (a == attr) return "repeated attribute " + attr + " in tag " + name;
      }
      attrs.push_back(attr);
      if (i >= s.size() || s[i] != '=') return "attribute " + attr + " without a value";
      ++i;
      if (i >= s.size() || (s[i] != '"' && s[i] != '\'')) return "unquoted value of " + attr;
      const char quote = s[i++];
      while (i < s.size() && s[i] != quote) {
        if (s[i] == '<') return "'<' in the value of " + attr;
        if (s[i] == '&' && !entity_ok(i)) return "bad entity in the value of " + attr;
        ++i;
      }
      if (i >= s.size()) return "unterminated value of " + attr;
      ++i;
    }
    const bool empty = s[i] == '/';
    if (empty) {
      ++i;
      if (i >= s.size() || s[i] != '>') return "bad end of empty tag " + name;
    }
    ++i;
    if (open.empty() && ++roots > 1) return "more than one root element";
    if (!empty) open.push_back(name);
  }
  if (!open.empty()) return "element " + open.back() + " is not closed";
  if (roots != 1) return "no root element";
  return {};
}

index_t svg_width(const std::string& svg) {
  const std::size_t at = svg.find("width=\"");
  REQUIRE(at != std::string::npos);
  return std::stoll(svg.substr(at + 7));
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The text of every <text> element, in order.
std::vector<std::string> texts(const std::string& svg) {
  std::vector<std::string> out;
  for (std::size_t at = svg.find("<text"); at != std::string::npos; at = svg.find("<text", at + 1)) {
    const std::size_t b = svg.find('>', at) + 1;
    out.push_back(svg.substr(b, svg.find("</text>", b) - b));
  }
  return out;
}

bool has_text(const std::string& svg, const std::string& t) {
  for (const std::string& x : texts(svg)) {
    if (x == t) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("render: the well-formedness check itself", "[masks][render]") {
  CHECK(xml_problem("<svg a=\"1\"><g><text>x &amp; y</text></g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><text>a & b</text></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><text>a <b</text></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg a=\"x\"y\"></svg>").empty());
  CHECK_FALSE(xml_problem("<svg></svg><svg></svg>").empty());
}

TEST_CASE("render: titles are XML-escaped", "[masks][render]") {
  const std::string title = "a & b <c> \"d\" 'e' &amp;";
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 16, 16), 1, {4, 4});
  for (const std::string& svg : {to_svg(bm, 0, 0, title), to_svg(CausalMask{}, MaskContext{0, 0, 10, 12}, title),
                                 to_svg(CausalMask{}, MaskContext{0, 0, 1000, 900}, title, 64, 2)}) {
    INFO(svg);
    CHECK(xml_problem(svg) == "");
    CHECK(has_text(svg, "a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos; &amp;amp;"));
    CHECK_FALSE(contains(svg, "<c>"));
  }
}

TEST_CASE("render: element pictures have axis labels and an allowed / masked legend", "[masks][render]") {
  const std::string svg = to_svg(SlidingWindowMask{3, 0}, MaskContext{0, 0, 30, 40}, "window", 128, 8);
  INFO(svg);
  CHECK(xml_problem(svg) == "");
  CHECK(has_text(svg, "q"));
  CHECK(has_text(svg, "kv (token index)"));
  CHECK(has_text(svg, "0"));
  CHECK(has_text(svg, "allowed"));
  CHECK(has_text(svg, "masked"));
  // Token indices along both axes: the largest row label is below 30, the
  // largest column label below 40, and there is more than one of each.
  int numbers = 0;
  for (const std::string& t : texts(svg))
    numbers += !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
  CHECK(numbers >= 4);
  // Legend swatches use the same colours as the cells they explain.
  CHECK(contains(svg, "fill=\"#1f4e79\" stroke"));
  CHECK(contains(svg, "fill=\"#f2f2f2\" stroke"));

  // Drawn in cells of several elements, the legend says so.
  const std::string coarse = to_svg(CausalMask{}, MaskContext{0, 0, 500, 500}, "causal", 50, 4);
  CHECK(xml_problem(coarse) == "");
  CHECK(has_text(coarse, "some allowed"));
  CHECK(has_text(coarse, "one cell = 10 x 10 elements"));
  // Labels are token indices (multiples of the 10 elements per cell), up to
  // near the end of the 500 tokens.
  index_t largest = 0;
  for (const std::string& t : texts(coarse)) {
    if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) continue;
    CHECK(std::stoll(t) % 10 == 0);
    largest = std::max<index_t>(largest, std::stoll(t));
  }
  CHECK(largest >= 400);
  CHECK(largest < 500);
}

TEST_CASE("render: block pictures have axis labels and a full / partial / empty legend", "[masks][render]") {
  const BlockMask bm = build_block_mask(SlidingWindowMask{20, 0}, RaggedLengths::uniform(1, 64, 64), 1, {8, 8});
  REQUIRE(bm.num_full_tiles() > 0);
  REQUIRE(bm.num_partial_tiles() > 0);
  const std::string svg = to_svg(bm, 0, 0, "window (8x8 tiles)", 16);
  INFO(svg);
  CHECK(xml_problem(svg) == "");
  CHECK(has_text(svg, "q"));
  CHECK(has_text(svg, "kv (token index; cells are tiles)"));
  CHECK(has_text(svg, "full tile (no mask work)"));
  CHECK(has_text(svg, "partial tile (masked)"));
  CHECK(has_text(svg, "empty tile (skipped)"));
  CHECK(has_text(svg, "56"));  // labels are token indices of tile starts, not tile numbers
  // Three distinct colours, each used by a swatch.
  for (TileClass c : {TileClass::full, TileClass::partial, TileClass::empty}) {
    CHECK(contains(svg, std::string("fill=\"") + detail::class_color(c) + "\" stroke"));
  }
  CHECK(std::string(detail::class_color(TileClass::full)) != detail::class_color(TileClass::partial));
  CHECK(std::string(detail::class_color(TileClass::partial)) != detail::class_color(TileClass::empty));
  CHECK(std::string(detail::class_color(TileClass::full)) != detail::class_color(TileClass::empty));
}

TEST_CASE("render: pictures are at least as wide as their title", "[masks][render]") {
  // Monospace at font-size 12 advances 0.6 em = 7.2 px per character.
  const auto title_width = [](const std::string& t) {
    return static_cast<index_t>(7.2 * static_cast<double>(t.size()));
  };
  const std::string long_title =
      "documents_window_3_0 (4x4 tiles): a deliberately long title for a 3x3 grid of tiles, longer than any legend";
  const BlockMask small = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 12, 12), 1, {4, 4});
  const std::string block_svg = to_svg(small, 0, 0, long_title, 16);
  CHECK(svg_width(block_svg) >= title_width(long_title));
  const std::string elem_svg = to_svg(CausalMask{}, MaskContext{0, 0, 3, 3}, long_title, 128, 4);
  CHECK(svg_width(elem_svg) >= title_width(long_title));
  // The legend fits as well, and a short title keeps the picture compact.
  CHECK(svg_width(block_svg) >= title_width("full tile (no mask work)partial tile (masked)empty tile (skipped)"));
  const std::string short_svg = to_svg(small, 0, 0, "c", 16);
  CHECK(svg_width(short_svg) < svg_width(block_svg));
}

}  // namespace seqattn_test_masks_render_test
