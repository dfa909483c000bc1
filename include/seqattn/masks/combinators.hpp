// Mask algebra: and / or / not, and per-head masks.
//
// Classes combine soundly: `and` is empty if either side is empty and full
// only if both are; `or` is full if either is full and empty only if both
// are; `not` swaps full and empty. A combined answer may say partial where
// the exact answer is full or empty (e.g. causal AND anti-causal), never the
// reverse. When both sides of an `and` are monotone-interval masks (causal,
// window, chunked, prefix-LM) the result is one too, classified in O(1) and
// exactly unless some row of the tile sees nothing (then `partial`), so
// causal & window(W, W) classifies exactly like window(W, 0).
//
// Write them as `a & b`, `a | b`, `~a` (seqattn descriptions only), or name
// the types: AndMask<A, B>, OrMask<A, B>, NotMask<A>, PerHeadMask<M>.
#pragma once

#include <algorithm>
#include <span>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

template <MaskDescription A, MaskDescription B>
struct AndMask {
  static constexpr bool head_invariant = is_head_invariant<A>() && is_head_invariant<B>();
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
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
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
  A a;
  B b;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return a.allowed(ctx, q, kv) || b.allowed(ctx, q, kv);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
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
  A a;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const { return !a.allowed(ctx, q, kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
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
