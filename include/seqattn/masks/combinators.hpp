// Mask algebra: and / or / not, and per-head masks.
//
// Classes combine soundly first: `and` is empty if either side is empty and
// full only if both are; `or` is full if either is full and empty only if
// both are; `not` swaps full and empty. When both sides of an `and` are
// monotone-interval masks (causal, window, chunked, prefix-LM) the result is
// one too, classified in O(1) (exact unless some row of the tile sees
// nothing), so causal & window(W, W) classifies exactly like window(W, 0).
//
// Where that cheap rule says `partial`, a combination whose leaves all
// describe their rows as intervals (row_interval: the structural masks,
// documents of them, and any and/or/not of those) is classified exactly, row
// by row: each row's allowed keys are a short list of intervals
// (KvIntervalSet, from the `row_intervals` hook), so a tile that the union of
// two partial sides covers (causal | window below the diagonal, ~(a | b) off
// both bands) becomes full or empty. That costs at most one pass over the
// tile's rows (<= the block's q size), stopping at the first row that is
// itself partial, and only for tiles the cheap rule left partial: building a
// BlockMask stays O(tiles visited x block rows) in the worst case and O(1)
// per tile where the rule decides. Full tiles then run without mask work.
//
// Write them as `a & b`, `a | b`, `~a` (seqattn descriptions only), or name
// the types: AndMask<A, B>, OrMask<A, B>, NotMask<A>, PerHeadMask<M>.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// The allowed keys of one row as at most kCapacity sorted, disjoint,
// non-adjacent intervals within [0, kv_len). `exact` is false when a
// combination needed more intervals than fit: the row is then not described
// and callers fall back to the sound answer.
struct KvIntervalSet {
  // A boolean combination of k single intervals has at most k + 1 pieces: 8
  // covers every combination of up to 7 interval masks.
  static constexpr int kCapacity = 8;
  std::array<KvInterval, kCapacity> items{};
  int size = 0;
  bool exact = true;

  static KvIntervalSet of(KvInterval iv) {
    KvIntervalSet s;
    if (iv.begin < iv.end) s.items[0] = iv, s.size = 1;
    return s;
  }
  static KvIntervalSet inexact() {
    KvIntervalSet s;
    s.exact = false;
    return s;
  }
  // Appends keeping the invariants: merges with the last item when they touch.
  void push(KvInterval iv) {
    if (!exact || iv.begin >= iv.end) return;
    if (size > 0 && iv.begin <= items[static_cast<std::size_t>(size - 1)].end) {
      KvInterval& last = items[static_cast<std::size_t>(size - 1)];
      last.end = std::max(last.end, iv.end);
      return;
    }
    if (size == kCapacity) {
      exact = false;
      return;
    }
    items[static_cast<std::size_t>(size++)] = iv;
  }
  const KvInterval& operator[](int i) const { return items[static_cast<std::size_t>(i)]; }
  // Every key of [begin, end) is in the set (end > begin).
  bool covers(index_t begin, index_t end) const {
    for (int i = 0; i < size; ++i) {
      if ((*this)[i].end <= begin) continue;
      return (*this)[i].begin <= begin && (*this)[i].end >= end;  // non-adjacent: one item must hold it all
    }
    return false;
  }
  // Some key of [begin, end) is in the set.
  bool meets(index_t begin, index_t end) const {
    for (int i = 0; i < size; ++i) {
      if ((*this)[i].begin < end && (*this)[i].end > begin) return true;
    }
    return false;
  }
};

template <class M>
concept HasRowIntervals = requires(const M& m, const MaskContext& ctx, index_t q) {
  { m.row_intervals(ctx, q) } -> std::same_as<KvIntervalSet>;
};

// Rows describable as interval sets: one interval, or the row_intervals hook.
template <class M>
concept RowSetMask = HasRowInterval<M> || HasRowIntervals<M>;

namespace detail {

template <RowSetMask M>
KvIntervalSet row_set(const M& m, const MaskContext& ctx, index_t q) {
  if constexpr (HasRowIntervals<M>) {
    return m.row_intervals(ctx, q);
  } else {
    // Clamped: an and-mask's row_interval may be unnormalized (begin > end).
    const KvInterval iv = m.row_interval(ctx, q);
    return KvIntervalSet::of({std::max<index_t>(iv.begin, 0), std::min(iv.end, ctx.kv_len)});
  }
}

inline KvIntervalSet unite(const KvIntervalSet& x, const KvIntervalSet& y) {
  if (!x.exact || !y.exact) return KvIntervalSet::inexact();
  KvIntervalSet s;
  int i = 0, j = 0;
  while (i < x.size || j < y.size) {
    const bool take_x = j == y.size || (i < x.size && x[i].begin <= y[j].begin);
    s.push(take_x ? x[i++] : y[j++]);
  }
  return s;
}

inline KvIntervalSet intersect(const KvIntervalSet& x, const KvIntervalSet& y) {
  if (!x.exact || !y.exact) return KvIntervalSet::inexact();
  KvIntervalSet s;
  int i = 0, j = 0;
  while (i < x.size && j < y.size) {
    s.push({std::max(x[i].begin, y[j].begin), std::min(x[i].end, y[j].end)});
    if (x[i].end < y[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return s;
}

inline KvIntervalSet complement(const KvIntervalSet& x, index_t kv_len) {
  if (!x.exact) return x;
  KvIntervalSet s;
  index_t at = 0;
  for (int i = 0; i < x.size; ++i) {
    s.push({at, x[i].begin});
    at = x[i].end;
  }
  s.push({at, kv_len});
  return s;
}

// The exact class of a tile from its rows' interval sets, or `fallback` when
// a row is not exactly described. Stops at the first row that is itself
// partial on the tile, so a truly partial tile usually costs one row.
template <RowSetMask M>
TileClass classify_row_sets(const M& m, const MaskContext& ctx, const Tile& t, TileClass fallback) {
  if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
  bool any = false, all = true;
  for (index_t q = t.q_begin; q < t.q_end; ++q) {
    const KvIntervalSet s = row_set(m, ctx, q);
    if (!s.exact) return fallback;
    const bool row_all = s.covers(t.kv_begin, t.kv_end);
    const bool row_any = row_all || s.meets(t.kv_begin, t.kv_end);
    if (row_any != row_all) return TileClass::partial;
    any = any || row_any;
    all = all && row_all;
    if (any && !all) return TileClass::partial;
  }
  return !any ? TileClass::empty : TileClass::full;
}

// A description that classifies by scanning its elements anyway (dense,
// mask_mod without a classifier) may declare
// `static constexpr bool classifies_by_scan = true;`; a combination with such
// a side then scans itself, at the cost that side pays already.
template <class M>
constexpr bool classifies_by_scan() {
  if constexpr (requires { M::classifies_by_scan; }) {
    return M::classifies_by_scan;
  } else {
    return false;
  }
}

// Sharpens a cheap `partial` of a combination: row by row when its rows are
// interval sets, element by element when a side scans anyway.
template <class M>
TileClass refine_partial(const M& m, const MaskContext& ctx, const Tile& t, TileClass cheap) {
  if (cheap != TileClass::partial) return cheap;
  if constexpr (RowSetMask<M>) {
    return classify_row_sets(m, ctx, t, cheap);
  } else if constexpr (classifies_by_scan<M>()) {
    return classify_by_scan(m, ctx, t);
  }
  return cheap;
}

// ORs row q's allowed keys in [kv_begin, kv_end) into bit words (bit c is key
// kv_begin + c), from the row's interval set, or from the predicate when the
// set is not exact.
template <RowSetMask M>
void row_set_bits(const M& m, const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                  std::uint64_t* words) {
  const KvIntervalSet s = row_set(m, ctx, q);
  if (!s.exact) {
    for (index_t kv = kv_begin; kv < kv_end; ++kv) {
      if (m.allowed(ctx, q, kv)) words[(kv - kv_begin) / 64] |= std::uint64_t{1} << ((kv - kv_begin) % 64);
    }
    return;
  }
  for (int i = 0; i < s.size; ++i) {
    index_t c = std::max(s[i].begin, kv_begin) - kv_begin;
    const index_t c_end = std::min(s[i].end, kv_end) - kv_begin;
    while (c < c_end) {
      const index_t lo = c % 64, hi = std::min<index_t>(64, lo + (c_end - c));
      words[c / 64] |= (hi - lo == 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (hi - lo)) - 1) << lo);
      c += hi - lo;
    }
  }
}

}  // namespace detail

template <MaskDescription A, MaskDescription B>
struct AndMask {
  static constexpr bool head_invariant = is_head_invariant<A>() && is_head_invariant<B>();
  static constexpr bool classifies_by_scan = detail::classifies_by_scan<A>() || detail::classifies_by_scan<B>();
  A a;
  B b;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return a.allowed(ctx, q, kv) && b.allowed(ctx, q, kv);
  }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const requires HasRowInterval<A> && HasRowInterval<B> {
    // Not normalized: an empty row keeps its true end, which first_row_reaching describes.
    const KvInterval x = a.row_interval(ctx, q), y = b.row_interval(ctx, q);
    return {std::max(x.begin, y.begin), std::min(x.end, y.end)};
  }
  index_t first_row_reaching(const MaskContext& ctx,
                             index_t kv) const requires IntervalRowMask<A> && IntervalRowMask<B> {
    return std::max<index_t>(a.first_row_reaching(ctx, kv), b.first_row_reaching(ctx, kv));
  }
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const requires RowSetMask<A> && RowSetMask<B> &&
      (!(HasRowInterval<A> && HasRowInterval<B>)) {
    return detail::intersect(detail::row_set(a, ctx, q), detail::row_set(b, ctx, q));
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                std::uint64_t* words) const requires RowSetMask<A> && RowSetMask<B> &&
      (!(HasRowInterval<A> && HasRowInterval<B>)) {
    detail::row_set_bits(*this, ctx, q, kv_begin, kv_end, words);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    return detail::refine_partial(*this, ctx, t, classify_cheap(ctx, t));
  }
  // The sound O(1)-ish rule from the sides' classes (see the top).
  TileClass classify_cheap(const MaskContext& ctx, const Tile& t) const {
    if constexpr (IntervalRowMask<A> && IntervalRowMask<B>) {
      return detail::classify_interval_rows(*this, ctx, t);
    } else {
      if constexpr (HasKvSpan<A> && HasKvSpan<B>) {
        // Keys outside the intersection of both spans: nothing to see even
        // where each side alone is partial (what the builder's skip relies on).
        const KvSpan s = kv_span(ctx, t.q_begin, t.q_end);
        if (t.kv_end <= s.any_begin || t.kv_begin >= s.any_end) return TileClass::empty;
      }
      const TileClass x = a.classify(ctx, t);
      if (x == TileClass::empty) return x;
      const TileClass y = b.classify(ctx, t);
      if (y == TileClass::empty) return y;
      return (x == TileClass::full && y == TileClass::full) ? TileClass::full : TileClass::partial;
    }
  }
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const requires HasKvSpan<A> && HasKvSpan<B> {
    if constexpr (IntervalRowMask<A> && IntervalRowMask<B>) {
      return detail::kv_span_interval_rows(*this, ctx, q_begin, q_end);
    } else {
      const KvSpan x = a.kv_span(ctx, q_begin, q_end), y = b.kv_span(ctx, q_begin, q_end);
      KvSpan s{std::max(x.any_begin, y.any_begin), std::min(x.any_end, y.any_end), std::max(x.all_begin, y.all_begin),
               std::min(x.all_end, y.all_end)};
      if (s.any_begin >= s.any_end) return {};
      if (s.all_begin >= s.all_end) s.all_begin = s.all_end = 0;
      return s;
    }
  }
  void check(const RaggedLengths& lengths, index_t heads) const {
    if constexpr (HasCheck<A>) a.check(lengths, heads);
    if constexpr (HasCheck<B>) b.check(lengths, heads);
  }
};

template <MaskDescription A, MaskDescription B>
struct OrMask {
  static constexpr bool head_invariant = is_head_invariant<A>() && is_head_invariant<B>();
  static constexpr bool classifies_by_scan = detail::classifies_by_scan<A>() || detail::classifies_by_scan<B>();
  A a;
  B b;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return a.allowed(ctx, q, kv) || b.allowed(ctx, q, kv);
  }
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const requires RowSetMask<A> && RowSetMask<B> {
    return detail::unite(detail::row_set(a, ctx, q), detail::row_set(b, ctx, q));
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                std::uint64_t* words) const requires RowSetMask<A> && RowSetMask<B> {
    detail::row_set_bits(*this, ctx, q, kv_begin, kv_end, words);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    return detail::refine_partial(*this, ctx, t, classify_cheap(ctx, t));
  }
  TileClass classify_cheap(const MaskContext& ctx, const Tile& t) const {
    const TileClass x = a.classify(ctx, t);
    if (x == TileClass::full) return x;
    const TileClass y = b.classify(ctx, t);
    if (y == TileClass::full) return y;
    return (x == TileClass::empty && y == TileClass::empty) ? TileClass::empty : TileClass::partial;
  }
  // The hull of both sides' keys; the larger of the two all-ranges.
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const requires HasKvSpan<A> && HasKvSpan<B> {
    const KvSpan x = a.kv_span(ctx, q_begin, q_end), y = b.kv_span(ctx, q_begin, q_end);
    const bool xe = x.any_begin >= x.any_end, ye = y.any_begin >= y.any_end;
    if (xe && ye) return {};
    KvSpan s = xe ? y : ye ? x : KvSpan{std::min(x.any_begin, y.any_begin), std::max(x.any_end, y.any_end), 0, 0};
    if (!xe && !ye) {
      const bool take_x = (x.all_end - x.all_begin) >= (y.all_end - y.all_begin);
      s.all_begin = take_x ? x.all_begin : y.all_begin;
      s.all_end = take_x ? x.all_end : y.all_end;
    }
    return s;
  }
  void check(const RaggedLengths& lengths, index_t heads) const {
    if constexpr (HasCheck<A>) a.check(lengths, heads);
    if constexpr (HasCheck<B>) b.check(lengths, heads);
  }
};

template <MaskDescription A>
struct NotMask {
  static constexpr bool head_invariant = is_head_invariant<A>();
  static constexpr bool classifies_by_scan = detail::classifies_by_scan<A>();
  A a;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const { return !a.allowed(ctx, q, kv); }
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const requires RowSetMask<A> {
    return detail::complement(detail::row_set(a, ctx, q), ctx.kv_len);
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                std::uint64_t* words) const requires RowSetMask<A> {
    detail::row_set_bits(*this, ctx, q, kv_begin, kv_end, words);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    return detail::refine_partial(*this, ctx, t, classify_cheap(ctx, t));
  }
  TileClass classify_cheap(const MaskContext& ctx, const Tile& t) const {
    switch (a.classify(ctx, t)) {
      case TileClass::empty:
        return (t.rows() > 0 && t.cols() > 0) ? TileClass::full : TileClass::empty;
      case TileClass::full:
        return TileClass::empty;
      default:
        return TileClass::partial;
    }
  }
  void check(const RaggedLengths& lengths, index_t heads) const {
    if constexpr (HasCheck<A>) a.check(lengths, heads);
  }
};

// One mask per head (Splash MultiHeadMask): head h uses masks[h]. The span
// is non-owning; masks of different kinds combine through a common type
// (e.g. OrMask of the kinds with a never-true side).
template <MaskDescription M>
struct PerHeadMask {
  std::span<const M> masks;

  const M& of(const MaskContext& ctx) const { return masks[static_cast<std::size_t>(ctx.head)]; }
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const { return of(ctx).allowed(ctx, q, kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return of(ctx).classify(ctx, t); }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const requires HasRowInterval<M> {
    return of(ctx).row_interval(ctx, q);
  }
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const requires HasRowIntervals<M> {
    return of(ctx).row_intervals(ctx, q);
  }
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const requires HasKvSpan<M> {
    return of(ctx).kv_span(ctx, q_begin, q_end);
  }
  void check(const RaggedLengths& lengths, index_t heads) const {
    detail::require(static_cast<index_t>(masks.size()) == heads, "PerHeadMask: ", masks.size(),
                    " masks but attention has ", heads, " heads");
    if constexpr (HasCheck<M>) {
      for (const M& m : masks) m.check(lengths, heads);
    }
  }
};

// Found by ADL for seqattn's descriptions; constrained to mask descriptions.
template <MaskDescription A, MaskDescription B>
AndMask<A, B> operator&(const A& a, const B& b) {
  return {a, b};
}
template <MaskDescription A, MaskDescription B>
OrMask<A, B> operator|(const A& a, const B& b) {
  return {a, b};
}
template <MaskDescription A>
NotMask<A> operator~(const A& a) {
  return {a};
}

}  // namespace seqattn
