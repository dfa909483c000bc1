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
#pragma once

#include <concepts>
#include <cstdint>

#include "seqattn/core/tensor.hpp"

namespace seqattn {

enum class TileClass : std::uint8_t { empty = 0, partial = 1, full = 2 };

// Which sequence a mask question is about.
struct MaskContext {
  index_t batch = 0;  // flat index over the batch (and any extra leading) dims
  index_t head = 0;
  index_t q_len = 0;   // length of this sequence on the query side
  index_t kv_len = 0;  // ... and on the key/value side
};

// A rectangle of the (q, kv) grid, half-open on both axes.
struct Tile {
  index_t q_begin = 0;
  index_t q_end = 0;
  index_t kv_begin = 0;
  index_t kv_end = 0;

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

namespace detail {

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
