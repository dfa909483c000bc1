// Structural masks: defined by index arithmetic alone, classified in O(1).
#pragma once

#include "seqattn/masks/concept.hpp"

namespace seqattn {

// Where the diagonal of a causal or windowed mask sits when q_len != kv_len
// (TransformerEngine / FlashAttention semantics): top-left puts query i on
// key i; bottom-right puts the last query on the last key, i.e. query i on
// key i + (kv_len - q_len).
enum class Alignment : std::uint8_t { top_left, bottom_right };

namespace detail {
inline index_t diagonal_shift(Alignment a, const MaskContext& ctx) {
  return a == Alignment::bottom_right ? ctx.kv_len - ctx.q_len : 0;
}
}  // namespace detail

// Every query attends to every key.
struct FullMask {
  static constexpr bool head_invariant = true;
  bool allowed(const MaskContext&, index_t, index_t) const { return true; }
  TileClass classify(const MaskContext&, const Tile& t) const {
    return (t.rows() > 0 && t.cols() > 0) ? TileClass::full : TileClass::empty;
  }
};

// Query q attends to keys kv <= q + shift (shift from the alignment).
struct CausalMask {
  static constexpr bool head_invariant = true;
  Alignment alignment = Alignment::top_left;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return kv <= q + detail::diagonal_shift(alignment, ctx);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    const index_t s = detail::diagonal_shift(alignment, ctx);
    if (t.kv_begin > t.q_end - 1 + s) return TileClass::empty;  // even the last row sees no key of the tile
    if (t.kv_end - 1 <= t.q_begin + s) return TileClass::full;  // even the first row sees all keys
    return TileClass::partial;
  }
};

}  // namespace seqattn
