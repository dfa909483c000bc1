// Multi-item scoring (sglang-jax PR #912, docs/semantics/multi-item-topk-kascade.md
// §A.3): one packed sequence `query ‖ d ‖ item_1 ‖ d ‖ … ‖ item_n ‖ d` scores
// n items against one shared prefix. With prefix_end = |query| + 1 (the query
// and the first delimiter) and seg_start(q) the first token of q's item (each
// item owns the delimiter that follows it):
//
//   allowed(q, kv) = q < prefix_end ? kv <= q
//                                   : kv < prefix_end || seg_start(q) <= kv <= q
//
// Items never see each other, nor the delimiter before them (item 2 onwards).
// Sequences that are not multi-item are plain causal (prefix_end = 0,
// seg_start = 0). We reproduce sglang-jax exactly, including TV-A2: the score
// row of an empty item (the delimiter before it) belongs to the previous
// item, so it sees that item's tokens. Coordinates are request-local and
// require kv_len == q_len (no cached prefix, §A.7 caveat).
//
// The O(n) "segment metadata" (per-sequence prefix_end, per-token row segment
// start) is exactly sglang-jax's segment mode; MultiItemLayout owns it plus
// the item runs that make tile classes O(items meeting the tile).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// Rows [row_begin, row_end) share seg_start; rows before prefix_end form
// one group with seg_start = -1 (plain causal).
struct ItemGroup {
  std::int32_t row_begin = 0;
  std::int32_t row_end = 0;
  std::int32_t seg_start = 0;
};

// Non-owning view of a MultiItemLayout.
struct MultiItemLayoutView {
  std::span<const index_t> token_offsets;       // batch + 1: where each sequence's rows start
  std::span<const std::int32_t> prefix_end;     // batch
  std::span<const std::int32_t> row_seg_start;  // total tokens, request-local values
  std::span<const std::int32_t> group_offsets;  // batch + 1
  std::span<const ItemGroup> groups;

  index_t batch() const { return static_cast<index_t>(prefix_end.size()); }
  index_t length(index_t b) const {
    return token_offsets[static_cast<std::size_t>(b) + 1] - token_offsets[static_cast<std::size_t>(b)];
  }
};

class MultiItemLayout {
 public:
  // A packed multi-item request: query ‖ d ‖ item_1 ‖ d ‖ … ‖ d. Requires a
  // non-empty query, at least two delimiters and a delimiter at the end.
  MultiItemLayout& add_packed(std::span<const std::int32_t> tokens, std::int32_t delimiter) {
    const auto b = prefix_end_.size();
    std::vector<index_t> delims;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == delimiter) delims.push_back(static_cast<index_t>(i));
    }
    detail::require(delims.size() >= 2, "MultiItemLayout: sequence ", b, " of length ", tokens.size(), " has ",
                    delims.size(), " delimiters (", delimiter, "); a multi-item sequence needs at least 2");
    detail::require(delims.front() > 0, "MultiItemLayout: sequence ", b, " has an empty query (delimiter at token 0)");
    detail::require(delims.back() == static_cast<index_t>(tokens.size()) - 1, "MultiItemLayout: sequence ", b,
                    " of length ", tokens.size(), " must end with the delimiter, last one is at ", delims.back());
    begin_sequence(static_cast<index_t>(tokens.size()), static_cast<std::int32_t>(delims.front() + 1));
    const index_t base = token_offsets_[b];
    groups_.push_back({0, static_cast<std::int32_t>(delims.front() + 1), -1});
    for (std::size_t i = 0; i + 1 < delims.size(); ++i) {
      const auto start = static_cast<std::int32_t>(delims[i] + 1);
      for (index_t r = delims[i] + 1; r <= delims[i + 1]; ++r) {
        row_seg_start_[static_cast<std::size_t>(base + r)] = start;
      }
      groups_.push_back({start, static_cast<std::int32_t>(delims[i + 1] + 1), start});
    }
    group_offsets_.push_back(static_cast<std::int32_t>(groups_.size()));
    return *this;
  }

  // The same layout from lengths: a query of query_len tokens and items of
  // the given lengths (empty items allowed), delimiters implied.
  MultiItemLayout& add_items(index_t query_len, std::span<const index_t> item_lengths) {
    detail::require(query_len > 0, "MultiItemLayout: query_len must be positive, got ", query_len);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(query_len), 0);
    tokens.push_back(1);
    for (std::size_t i = 0; i < item_lengths.size(); ++i) {
      detail::require(item_lengths[i] >= 0, "MultiItemLayout: item_lengths[", i, "] = ", item_lengths[i],
                      " is negative");
      tokens.insert(tokens.end(), static_cast<std::size_t>(item_lengths[i]), 0);
      tokens.push_back(1);
    }
    return add_packed(tokens, 1);
  }

  // A sequence that is not multi-item: plain causal.
  MultiItemLayout& add_causal(index_t length) {
    detail::require(length >= 0, "MultiItemLayout: length must be non-negative, got ", length);
    begin_sequence(length, 0);
    if (length > 0) groups_.push_back({0, static_cast<std::int32_t>(length), 0});
    group_offsets_.push_back(static_cast<std::int32_t>(groups_.size()));
    return *this;
  }

  MultiItemLayoutView view() const { return {token_offsets_, prefix_end_, row_seg_start_, group_offsets_, groups_}; }
  RaggedLengths lengths() const {
    RaggedLengths l;
    for (std::size_t b = 0; b < prefix_end_.size(); ++b) {
      l.q.push_back(token_offsets_[b + 1] - token_offsets_[b]);
      l.kv.push_back(l.q.back());
    }
    return l;
  }
  std::span<const std::int32_t> prefix_end() const { return prefix_end_; }
  std::span<const std::int32_t> row_seg_start() const { return row_seg_start_; }
  std::span<const index_t> token_offsets() const { return token_offsets_; }

 private:
  void begin_sequence(index_t length, std::int32_t prefix_end) {
    // Rows hold request-local int32 values.
    detail::require(length <= std::numeric_limits<std::int32_t>::max(), "MultiItemLayout: sequence ",
                    prefix_end_.size(), " of length ", length, " exceeds the limit of 2^31 - 1 tokens (int32 rows)");
    detail::require(static_cast<index_t>(row_seg_start_.size()) <= limits::kMaxTensorElements - length,
                    "MultiItemLayout: more than ", limits::kMaxTensorElements,
                    " tokens in all (limits::kMaxTensorElements)");
    prefix_end_.push_back(prefix_end);
    row_seg_start_.resize(row_seg_start_.size() + static_cast<std::size_t>(length), 0);
    token_offsets_.push_back(token_offsets_.back() + length);
  }

  std::vector<index_t> token_offsets_{0};
  std::vector<std::int32_t> prefix_end_;
  std::vector<std::int32_t> row_seg_start_;
  std::vector<std::int32_t> group_offsets_{0};
  std::vector<ItemGroup> groups_;
};

namespace detail {

// Class of rows [r0, r1) x keys [k0, k1) where row r sees
// [0, a_end) ∪ [s, r] with a_end <= s (prefix rows: a_end = 0, s = 0).
inline TileClass classify_prefix_segment(index_t a_end, index_t s, index_t r0, index_t r1, index_t k0, index_t k1) {
  const bool full = k1 <= a_end || (std::max(k0, a_end) >= s && k1 - 1 <= r0);
  if (full) return TileClass::full;
  const bool any = k0 < a_end || std::max(k0, s) <= std::min(k1 - 1, r1 - 1);
  return any ? TileClass::partial : TileClass::empty;
}

}  // namespace detail

struct MultiItemMask {
  static constexpr bool head_invariant = true;
  MultiItemLayoutView layout;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    if (kv > q) return false;
    const index_t pe = layout.prefix_end[static_cast<std::size_t>(ctx.batch)];
    if (q < pe) return true;
    const index_t t = layout.token_offsets[static_cast<std::size_t>(ctx.batch)] + q;
    return kv < pe || kv >= layout.row_seg_start[static_cast<std::size_t>(t)];
  }

  // The keys every group of the q-block sees, intersected; the hull is [0, q_end).
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    bool any = false;
    bool all = true;
    for_groups(ctx.batch, t.q_begin, t.q_end, [&](index_t a_end, index_t s, index_t r0, index_t r1) {
      const TileClass c = detail::classify_prefix_segment(a_end, s, r0, r1, t.kv_begin, t.kv_end);
      any = any || c != TileClass::empty;
      all = all && c == TileClass::full;
    });
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }

  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const {
    if (q_end <= q_begin) return {};
    index_t all_begin = 0, all_end = ctx.kv_len;
    for_groups(ctx.batch, q_begin, q_end, [&](index_t a_end, index_t s, index_t r0, index_t) {
      // Rows see [0, a_end) ∪ [s, r0]; keep the larger interval inside it.
      index_t b = 0, e = r0 + 1;
      if (a_end < s && a_end >= r0 + 1 - s) e = a_end;
      if (a_end < s && a_end < r0 + 1 - s) b = s;
      all_begin = std::max(all_begin, b);
      all_end = std::min(all_end, e);
    });
    return {0, std::min(q_end, ctx.kv_len), all_begin, std::max(all_begin, all_end)};
  }

  void check(const RaggedLengths& lengths, index_t) const {
    detail::require_fixed_lengths(
        lengths, "MultiItemMask", layout.batch(),
        [&] { return detail::concat("the layout has ", layout.batch(), " sequences"); },
        [&](index_t b) { return std::make_pair(layout.length(b), layout.length(b)); },
        [&](index_t b) {
          return detail::concat("the layout says ", layout.length(b),
                                " (request-local coordinates need kv_len == q_len, no cached prefix)");
        });
  }

 private:
  // Calls f(a_end, s, r0, r1) for each group of rows meeting [q_begin, q_end).
  template <class F>
  void for_groups(index_t b, index_t q_begin, index_t q_end, F&& f) const {
    const auto g0 = static_cast<std::size_t>(layout.group_offsets[static_cast<std::size_t>(b)]);
    const auto g1 = static_cast<std::size_t>(layout.group_offsets[static_cast<std::size_t>(b) + 1]);
    const ItemGroup* first = std::partition_point(layout.groups.data() + g0, layout.groups.data() + g1,
                                                  [q_begin](const ItemGroup& g) { return g.row_end <= q_begin; });
    const index_t pe = layout.prefix_end[static_cast<std::size_t>(b)];
    for (const ItemGroup* g = first; g != layout.groups.data() + g1 && g->row_begin < q_end; ++g) {
      const index_t r0 = std::max<index_t>(g->row_begin, q_begin);
      const index_t r1 = std::min<index_t>(g->row_end, q_end);
      if (g->seg_start < 0) {
        f(0, 0, r0, r1);  // the shared prefix itself: causal
      } else {
        f(pe, g->seg_start, r0, r1);
      }
    }
  }
};

inline MultiItemMask multi_item_mask(const MultiItemLayout& layout) { return {layout.view()}; }
// The mask views the layout: a temporary layout would dangle.
MultiItemMask multi_item_mask(MultiItemLayout&&) = delete;

}  // namespace seqattn
