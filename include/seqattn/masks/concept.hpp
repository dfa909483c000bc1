// What every mask description is: the contract between masks and kernels.
//
// A mask description is a small value type (no heap, no virtual calls) that
// answers two questions for one sequence of one batch entry and head:
//
//   allowed(ctx, q, kv)  -> may query q attend to key kv?      (element predicate)
//   classify(ctx, tile)  -> is the tile empty, partial or full? (structure)
//
// `ctx` (a MaskContext) says which batch entry and head is asked about and the
// q/kv lengths of that sequence, so one description serves ragged batches
// (bottom-right alignment needs the lengths) without storing them. q and kv
// are indices local to the sequence: 0 <= q < ctx.q_len, 0 <= kv < ctx.kv_len.
//
// classify must be sound: `full` only if every element of the tile is
// allowed, `empty` only if none is. `partial` is always a safe answer; the
// cost of a needless `partial` is mask work in the kernel, never a wrong
// result. Structural descriptions answer in O(1) (causal, window, chunked,
// prefix) or from segment runs (document, multi-item); only data-driven ones
// (dense, top-k) scan.
//
// Optional hooks a description may add (detected by the concepts below) let
// builders and kernels go faster; each must agree exactly with `allowed` and
// `classify`, and the tests check that they do:
//
//   row_interval(ctx, q) -> KvInterval   the allowed keys of row q are exactly
//                                        one interval (causal, window, ...)
//   first_row_reaching(ctx, kv) -> index the first row whose interval ends
//                                        past kv (with monotone intervals this
//                                        makes tile classes O(1))
//   kv_span(ctx, q_begin, q_end) -> KvSpan  keys no row of a q-block sees and
//                                        keys every row sees, so empty tiles
//                                        are never visited and full ones are
//                                        listed as a range without a look
//   row_bits(ctx, q, kv_begin, kv_end, words)  ORs row q's allowed keys in
//                                        [kv_begin, kv_end) into bit words
//   check(lengths, heads)               throws invalid_argument when the
//                                        description cannot serve that batch
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn {

enum class TileClass : std::uint8_t { empty = 0, partial = 1, full = 2 };

// Per-sequence q and kv lengths of a (possibly ragged) batch.
struct RaggedLengths {
  std::vector<index_t> q;
  std::vector<index_t> kv;

  static RaggedLengths uniform(index_t batch, index_t q_len, index_t kv_len) {
    if (batch < 0 || q_len < 0 || kv_len < 0 || batch > limits::kMaxTensorElements) {
      detail::throw_invalid("RaggedLengths::uniform: batch ", batch, ", q_len ", q_len, ", kv_len ", kv_len,
                            " must be non-negative and batch at most ", limits::kMaxTensorElements);
    }
    return {std::vector<index_t>(static_cast<std::size_t>(batch), q_len),
            std::vector<index_t>(static_cast<std::size_t>(batch), kv_len)};
  }
  index_t batch() const { return static_cast<index_t>(q.size()); }
};

// Half-open interval of keys [begin, end); empty when begin >= end.
struct KvInterval {
  index_t begin = 0;
  index_t end = 0;
  bool empty() const { return begin >= end; }
  friend bool operator==(const KvInterval&, const KvInterval&) = default;
};

// What the rows of one q-block see: no row sees a key outside
// [any_begin, any_end) and every row sees every key of [all_begin, all_end)
// (which may be empty). Both are within [0, kv_len).
struct KvSpan {
  index_t any_begin = 0;
  index_t any_end = 0;
  index_t all_begin = 0;
  index_t all_end = 0;
};

// The additive value of a masked entry: MaxText's DEFAULT_MASK_VALUE
// (-0.7 x float max), finite so masked logits never produce inf - inf.
inline constexpr float kDefaultMaskValue = -0.7f * std::numeric_limits<float>::max();

// "Minus infinity" for row and key arithmetic that must not overflow.
inline constexpr index_t kNoBound = std::numeric_limits<index_t>::min() / 4;

// Which sequence a mask question is about.
struct MaskContext {
  index_t batch = 0;  // flat index over the batch (and any extra leading) dims
  index_t head = 0;
  index_t q_len = 0;   // length of this sequence on the query side
  index_t kv_len = 0;  // ... and on the key/value side
};

// A rectangle of one sequence's (q, kv) grid: the query rows
// [q_begin, q_end) and the key columns [kv_begin, kv_end), both half-open.
// Coordinates are local to the sequence the MaskContext names (0 is its first
// token on that side, as in `allowed`), not offsets into a packed batch.
// Builders pass tiles inside 0 <= q_begin <= q_end <= ctx.q_len and
// 0 <= kv_begin <= kv_end <= ctx.kv_len; the last tile of a row or column of
// blocks is short when the length is not a multiple of the block size, and
// a tile with no rows or no columns is `empty`. A tile's element (r, c),
// counted from its corner, is the grid element (q_begin + r, kv_begin + c).
struct Tile {
  index_t q_begin = 0;   // first query row
  index_t q_end = 0;     // one past the last query row
  index_t kv_begin = 0;  // first key column
  index_t kv_end = 0;    // one past the last key column

  index_t rows() const { return q_end - q_begin; }
  index_t cols() const { return kv_end - kv_begin; }
};

template <class M>
concept MaskDescription = std::copyable<M> &&
    requires(const M& m, const MaskContext& ctx, index_t q, index_t kv, const Tile& tile) {
  { m.allowed(ctx, q, kv) } -> std::convertible_to<bool>;
  { m.classify(ctx, tile) } -> std::same_as<TileClass>;
};

// A description whose answer never depends on the head may declare
// `static constexpr bool head_invariant = true;` so block metadata is built
// once for all heads instead of once per head.
template <class M>
constexpr bool is_head_invariant() {
  if constexpr (requires { M::head_invariant; }) {
    return M::head_invariant;
  } else {
    return false;
  }
}

template <class M>
concept HasRowInterval = requires(const M& m, const MaskContext& ctx, index_t q) {
  { m.row_interval(ctx, q) } -> std::same_as<KvInterval>;
};

// Rows are single intervals whose begin and end never decrease with q.
template <class M>
concept IntervalRowMask = HasRowInterval<M> && requires(const M& m, const MaskContext& ctx, index_t kv) {
  { m.first_row_reaching(ctx, kv) } -> std::convertible_to<index_t>;
};

template <class M>
concept HasKvSpan = requires(const M& m, const MaskContext& ctx, index_t q) {
  { m.kv_span(ctx, q, q) } -> std::same_as<KvSpan>;
};

template <class M>
concept HasRowBits = requires(const M& m, const MaskContext& ctx, index_t q, std::uint64_t* words) {
  m.row_bits(ctx, q, q, q, words);
};

template <class M>
concept HasCheck = requires(const M& m, const RaggedLengths& lengths, index_t heads) {
  m.check(lengths, heads);
};

namespace detail {

inline index_t clamp_index(index_t v, index_t lo, index_t hi) { return std::min(std::max(v, lo), hi); }

// Interval [begin, end) clamped to [0, kv_len), normalized so begin <= end.
inline KvInterval clamped_interval(index_t begin, index_t end, index_t kv_len) {
  const index_t b = clamp_index(begin, 0, kv_len);
  return {b, std::max(b, clamp_index(end, 0, kv_len))};
}

// Exact O(1) tile class of a mask whose rows are monotone intervals.
template <IntervalRowMask M>
TileClass classify_interval_rows(const M& m, const MaskContext& ctx, const Tile& t) {
  if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
  const KvInterval first = m.row_interval(ctx, t.q_begin);
  const KvInterval last = m.row_interval(ctx, t.q_end - 1);
  if (last.begin <= t.kv_begin && first.end >= t.kv_end) return TileClass::full;
  // Every key any row sees lies in [first.begin, last.end) (the kv_span hull).
  if (first.begin >= last.end || t.kv_end <= first.begin || t.kv_begin >= last.end) return TileClass::empty;
  // The earliest row reaching the tile has the smallest begin among the rows
  // that reach it: if it sees nothing of the tile, no row does.
  const index_t qa = std::max(t.q_begin, static_cast<index_t>(m.first_row_reaching(ctx, t.kv_begin)));
  if (qa >= t.q_end) return TileClass::empty;
  const KvInterval iv = m.row_interval(ctx, qa);
  if (iv.begin >= t.kv_end) return TileClass::empty;  // begins only grow: no later row reaches back
  // A non-empty row qa sees part of the tile. An empty one cannot happen for
  // the primitives; for an intersection of two interval masks a later row
  // may still see the tile, so the answer is then the always-sound partial.
  if (iv.empty() && qa == t.q_end - 1) return TileClass::empty;
  return TileClass::partial;
}

// The KvSpan of a monotone-interval mask, consistent with classify_interval_rows.
template <IntervalRowMask M>
KvSpan kv_span_interval_rows(const M& m, const MaskContext& ctx, index_t q_begin, index_t q_end) {
  if (q_end <= q_begin) return {};
  const KvInterval first = m.row_interval(ctx, q_begin);
  const KvInterval last = m.row_interval(ctx, q_end - 1);
  return {first.begin, std::max(first.begin, last.end), last.begin, std::max(last.begin, first.end)};
}

// Calls mask.check(lengths, heads) when the description has one.
template <class M>
void check_mask(const M& mask, const RaggedLengths& lengths, index_t heads) {
  detail::require(lengths.q.size() == lengths.kv.size(), "mask: ", lengths.q.size(), " q lengths but ",
                  lengths.kv.size(), " kv lengths");
  detail::require(heads > 0, "mask: heads must be positive, got ", heads);
  detail::require(heads <= limits::kMaxHeads, "mask: heads must be at most ", limits::kMaxHeads,
                  " (limits::kMaxHeads), got ", heads);
  for (std::size_t b = 0; b < lengths.q.size(); ++b) {
    if (lengths.q[b] < 0 || lengths.kv[b] < 0) {
      detail::throw_invalid("mask: sequence ", b, " has a negative length (q ", lengths.q[b], ", kv ", lengths.kv[b],
                            ")");
    }
  }
  if constexpr (HasCheck<M>) mask.check(lengths, heads);
}

// The lengths check of a mask built for fixed sequences (document, top-k,
// multi-item): the batch must have `batch` sequences, and sequence b the
// (q, kv) lengths expected(b) returns. The messages start with `who`; the
// first goes on with batch_says() (what the mask holds, e.g. "the layout has
// 2 sequences"), the second with lengths_says(b) (what it holds for b).
template <class BatchSays, class Expected, class LengthsSays>
void require_fixed_lengths(const RaggedLengths& lengths, const char* who, index_t batch, BatchSays&& batch_says,
                           Expected&& expected, LengthsSays&& lengths_says) {
  if (lengths.batch() != batch) throw_invalid(who, ": ", batch_says(), " but the batch has ", lengths.batch());
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const index_t q = lengths.q[static_cast<std::size_t>(b)], kv = lengths.kv[static_cast<std::size_t>(b)];
    const auto [want_q, want_kv] = expected(b);
    if (q != want_q || kv != want_kv) {
      throw_invalid(who, ": sequence ", b, " has lengths (", q, ", ", kv, ") but ", lengths_says(b));
    }
  }
}

// Brute-force classification from the element predicate: the test oracle for
// every structural `classify`, and the fallback for data-driven masks.
template <MaskDescription M>
TileClass classify_by_scan(const M& mask, const MaskContext& ctx, const Tile& tile) {
  bool any = false;
  bool all = true;
  for (index_t q = tile.q_begin; q < tile.q_end; ++q) {
    for (index_t kv = tile.kv_begin; kv < tile.kv_end; ++kv) {
      const bool a = mask.allowed(ctx, q, kv);
      any = any || a;
      all = all && a;
    }
  }
  if (!any) return TileClass::empty;
  return all ? TileClass::full : TileClass::partial;
}

}  // namespace detail
}  // namespace seqattn
