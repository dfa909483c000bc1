// Checked size arithmetic and the documented size limits.
//
// Every shape product, offset sum, tile count and scratch size that comes
// from caller-supplied extents goes through these helpers (or is bounded by a
// limit checked up front), so hostile sizes throw seqattn::invalid_argument
// naming the argument and the limit instead of wrapping around. They are for
// validation and sizing, done once per call before any allocation or
// indexing; hot loops stay free of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "seqattn/core/error.hpp"

namespace seqattn {

using index_t = std::ptrdiff_t;

// Documented limits. Each is far above any real workload and low enough that
// the sizes derived from it (scratch, tile bits, task counts) fit in 64 bits.
namespace limits {
// Elements of one tensor (or one buffer) seqattn allocates: 2^40.
inline constexpr index_t kMaxTensorElements = index_t{1} << 40;
// Query heads and key/value heads of an attention problem.
inline constexpr index_t kMaxHeads = index_t{1} << 16;
// Head dims (dk, dv) of an attention problem.
inline constexpr index_t kMaxHeadDim = index_t{1} << 16;
// Tiles per sequence along one axis of a BlockMask (block ids are int32).
inline constexpr index_t kMaxBlocksPerAxis = std::numeric_limits<std::int32_t>::max();
// block_q and block_kv of a BlockMask.
inline constexpr index_t kMaxBlockSize = index_t{1} << 16;
// Bits of one stored partial tile (block_q * block_kv): 2^26 bits = 8 MiB.
inline constexpr index_t kMaxTileBits = index_t{1} << 26;
// PlanOptions::kv_splits / AttentionOptions::kv_splits.
inline constexpr index_t kMaxKvSplits = index_t{1} << 16;
// execution::ThreadPool threads.
inline constexpr int kMaxThreads = 1 << 12;
// max_segments_per_seq of the descriptors (THD slots per row).
inline constexpr index_t kMaxSegmentsPerSeq = index_t{1} << 20;
}  // namespace limits

namespace detail {

// a * b, a + b; false when the result does not fit in index_t.
inline bool mul_fits(index_t a, index_t b, index_t& out) { return !__builtin_mul_overflow(a, b, &out); }
inline bool add_fits(index_t a, index_t b, index_t& out) { return !__builtin_add_overflow(a, b, &out); }

// a * b of non-negative sizes; throws naming `what` when it overflows.
inline index_t checked_mul(index_t a, index_t b, const char* what) {
  index_t out = 0;
  if (!mul_fits(a, b, out)) throw_invalid(what, ": ", a, " * ", b, " overflows 64-bit size arithmetic");
  return out;
}
inline index_t checked_add(index_t a, index_t b, const char* what) {
  index_t out = 0;
  if (!add_fits(a, b, out)) throw_invalid(what, ": ", a, " + ", b, " overflows 64-bit size arithmetic");
  return out;
}

// Product of the factors, each checked >= 0, the product checked against
// `limit`. Throws naming `what` and the limit.
template <class... Ints>
index_t checked_size(const char* what, index_t limit, Ints... factors) {
  index_t n = 1;
  bool fits = true;
  bool negative = false;
  for (const index_t f : {static_cast<index_t>(factors)...}) {
    negative = negative || f < 0;
    fits = fits && mul_fits(n, f, n);
  }
  if (negative) throw_invalid(what, ": extents must be non-negative");
  if (!fits || n > limit) {
    throw_invalid(what, ": size exceeds the limit of ", limit, " elements (a product of ", sizeof...(factors),
                  " extents)");
  }
  return n;
}

// a + b and a - b saturated to the range of index_t: for interval bounds
// built from caller parameters such as an "unbounded" INT64_MAX window.
inline index_t saturating_add(index_t a, index_t b) {
  index_t out = 0;
  if (!add_fits(a, b, out)) return b > 0 ? std::numeric_limits<index_t>::max() : std::numeric_limits<index_t>::min();
  return out;
}
inline index_t saturating_sub(index_t a, index_t b) {
  index_t out = 0;
  if (__builtin_sub_overflow(a, b, &out)) {
    return b < 0 ? std::numeric_limits<index_t>::max() : std::numeric_limits<index_t>::min();
  }
  return out;
}

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b.
constexpr index_t ceil_div_nonneg(index_t a, index_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace detail
}  // namespace seqattn
