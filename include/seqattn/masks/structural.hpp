// Structural masks: defined by index arithmetic alone, classified in O(1).
//
// `shift_invariant = true` says that allowed(ctx, q, kv) depends on kv - q
// and kv_len - q_len alone (full, causal, sliding window; not chunked causal
// or prefix-LM, which know where a sequence starts): such a mask applied to a
// whole packed sequence and AND-ed with segment equality is the document
// mask of those segments (SegmentIds::same_as_document_mask).
//
// Every mask here allows, in each query row, one interval of keys whose ends
// never move left as the row advances. That single property gives exact O(1)
// tile classes (detail::classify_interval_rows), q-block spans that let the
// BlockMask builder skip empty tiles without looking at them, and tile bits
// written a word at a time.
#pragma once

#include <cstdint>
#include <span>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// Where the diagonal of a causal or windowed mask sits when q_len != kv_len
// (TransformerEngine / FlashAttention semantics): top-left puts query i on
// key i; bottom-right puts the last query on the last key, i.e. query i on
// key i + (kv_len - q_len).
enum class Alignment : std::uint8_t { top_left, bottom_right };

// A window side or limit given as a negative number is unbounded.
inline constexpr index_t kUnbounded = -1;

namespace detail {
inline index_t diagonal_shift(Alignment a, const MaskContext& ctx) {
  return a == Alignment::bottom_right ? ctx.kv_len - ctx.q_len : 0;
}
}  // namespace detail

// classify and kv_span of a mask whose rows are monotone intervals
// (IntervalRowMask), from its row_interval and first_row_reaching: each mask
// below states only its rows and then SEQATTN_INTERVAL_ROW_HOOKS;. A macro
// rather than a base class because a base is the first element of an
// aggregate: CausalMask{Alignment::bottom_right}, SlidingWindowMask{6, 0} and
// PrefixLMMask{.prefix = 4} would stop compiling. Undefined at the end of
// this header.
#define SEQATTN_INTERVAL_ROW_HOOKS                                               \
  TileClass classify(const MaskContext& ctx, const Tile& t) const {              \
    return detail::classify_interval_rows(*this, ctx, t);                        \
  }                                                                              \
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const { \
    return detail::kv_span_interval_rows(*this, ctx, q_begin, q_end);            \
  }                                                                              \
  static_assert(true)

// Every query attends to every key.
struct FullMask {
  static constexpr bool head_invariant = true;
  static constexpr bool shift_invariant = true;
  bool allowed(const MaskContext&, index_t, index_t) const { return true; }
  KvInterval row_interval(const MaskContext& ctx, index_t) const { return {0, ctx.kv_len}; }
  index_t first_row_reaching(const MaskContext&, index_t) const { return kNoBound; }
  TileClass classify(const MaskContext&, const Tile& t) const {
    return (t.rows() > 0 && t.cols() > 0) ? TileClass::full : TileClass::empty;
  }
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const {
    return q_end > q_begin ? KvSpan{0, ctx.kv_len, 0, ctx.kv_len} : KvSpan{};
  }
};

// Query q attends to keys kv <= q + shift (shift from the alignment).
struct CausalMask {
  static constexpr bool head_invariant = true;
  static constexpr bool shift_invariant = true;
  Alignment alignment = Alignment::top_left;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return kv <= q + detail::diagonal_shift(alignment, ctx);
  }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const {
    return detail::clamped_interval(0, q + detail::diagonal_shift(alignment, ctx) + 1, ctx.kv_len);
  }
  index_t first_row_reaching(const MaskContext& ctx, index_t kv) const {
    return kv - detail::diagonal_shift(alignment, ctx);
  }
  SEQATTN_INTERVAL_ROW_HOOKS;
};

// Sliding window (TE / FlashAttention): query q attends to keys in
// [q + shift - left, q + shift + right]; a negative side is unbounded, so
// {kUnbounded, 0} is causal and {kUnbounded, kUnbounded} is full. Unlike
// TE's dense test reference (make_swa_mask), the right side is honoured with
// bottom-right alignment too, as the kernels (cuDNN, FlashAttention) do.
struct SlidingWindowMask {
  static constexpr bool head_invariant = true;
  static constexpr bool shift_invariant = true;
  index_t left = kUnbounded;
  index_t right = 0;
  Alignment alignment = Alignment::top_left;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const index_t d = kv - q - detail::diagonal_shift(alignment, ctx);
    return (left < 0 || d >= -left) && (right < 0 || d <= right);
  }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const {
    const index_t p = q + detail::diagonal_shift(alignment, ctx);
    // Saturating: a window side of INT64_MAX must not wrap around.
    return detail::clamped_interval(
        left < 0 ? 0 : detail::saturating_sub(p, left),
        right < 0 ? ctx.kv_len : detail::saturating_add(detail::saturating_add(p, right), 1), ctx.kv_len);
  }
  index_t first_row_reaching(const MaskContext& ctx, index_t kv) const {
    return right < 0 ? kNoBound
                     : std::max(kNoBound, detail::saturating_sub(kv - detail::diagonal_shift(alignment, ctx), right));
  }
  SEQATTN_INTERVAL_ROW_HOOKS;
};

// Chunked causal (Splash ChunkedCausalMask, FA3 attention_chunk, Llama 4):
// keys are cut into chunks of `chunk`; query q (at key position
// p = q + shift) attends to keys of its own chunk up to p.
struct ChunkedCausalMask {
  static constexpr bool head_invariant = true;
  index_t chunk = 1;
  Alignment alignment = Alignment::top_left;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const index_t p = q + detail::diagonal_shift(alignment, ctx);
    return p >= 0 && kv <= p && kv >= p / chunk * chunk;
  }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const {
    const index_t p = q + detail::diagonal_shift(alignment, ctx);
    if (p < 0) return {0, 0};
    return detail::clamped_interval(p / chunk * chunk, p + 1, ctx.kv_len);
  }
  index_t first_row_reaching(const MaskContext& ctx, index_t kv) const {
    return kv - detail::diagonal_shift(alignment, ctx);
  }
  SEQATTN_INTERVAL_ROW_HOOKS;
  void check(const RaggedLengths&, index_t) const {
    detail::require(chunk > 0, "ChunkedCausalMask: chunk must be positive, got ", chunk);
  }
};

// Prefix-LM: keys before the prefix length are visible to every query
// (bidirectional prefix); after it, attention is causal. The prefix length is
// `prefix` for every sequence, or prefix_lengths[ctx.batch] when that span is
// given (one entry per flat batch index; non-owning).
struct PrefixLMMask {
  static constexpr bool head_invariant = true;
  index_t prefix = 0;
  std::span<const std::int32_t> prefix_lengths = {};
  Alignment alignment = Alignment::top_left;

  index_t prefix_of(const MaskContext& ctx) const {
    return prefix_lengths.empty() ? prefix : prefix_lengths[static_cast<std::size_t>(ctx.batch)];
  }
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return kv < prefix_of(ctx) || kv <= q + detail::diagonal_shift(alignment, ctx);
  }
  KvInterval row_interval(const MaskContext& ctx, index_t q) const {
    return detail::clamped_interval(0, std::max(prefix_of(ctx), q + detail::diagonal_shift(alignment, ctx) + 1),
                                    ctx.kv_len);
  }
  index_t first_row_reaching(const MaskContext& ctx, index_t kv) const {
    return kv < prefix_of(ctx) ? kNoBound : kv - detail::diagonal_shift(alignment, ctx);
  }
  SEQATTN_INTERVAL_ROW_HOOKS;
  void check(const RaggedLengths& lengths, index_t) const {
    if (prefix_lengths.empty()) {
      detail::require(prefix >= 0, "PrefixLMMask: prefix must be non-negative, got ", prefix);
      return;
    }
    detail::require(static_cast<index_t>(prefix_lengths.size()) == lengths.batch(),
                    "PrefixLMMask: prefix_lengths has shape (", prefix_lengths.size(), ",) but the batch has ",
                    lengths.batch(), " sequences");
    for (std::size_t b = 0; b < prefix_lengths.size(); ++b) {
      detail::require(prefix_lengths[b] >= 0, "PrefixLMMask: prefix_lengths[", b, "] = ", prefix_lengths[b],
                      " is negative");
    }
  }
};

#undef SEQATTN_INTERVAL_ROW_HOOKS

}  // namespace seqattn
