// A MaskDescription that answers from a BlockMask alone, for entry points
// that receive a prebuilt BlockMask instead of a description (the compiled
// dispatch library). With stored tile bits it is exact.
#pragma once

#include <algorithm>
#include <cstdint>

#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::detail {

struct BlockMaskPredicate {
  const BlockMask* block_mask = nullptr;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const BlockMask& bm = *block_mask;
    const index_t qb = q / bm.block_shape().q, kb = kv / bm.block_shape().kv;
    for (const BlockRange r : bm.full_ranges(ctx.batch, ctx.head, qb)) {
      if (kb >= r.begin && kb < r.end) return true;
    }
    const auto partial = bm.partial_blocks(ctx.batch, ctx.head, qb);
    const auto it = std::find(partial.begin(), partial.end(), static_cast<std::int32_t>(kb));
    if (it == partial.end()) return false;
    const auto ids = bm.partial_tile_ids(ctx.batch, ctx.head, qb);
    if (ids.empty()) return true;  // no bits stored: the tile is all we know
    const auto bits = bm.tile_bits(ids[static_cast<std::size_t>(it - partial.begin())]);
    const index_t row = q - qb * bm.block_shape().q, col = kv - kb * bm.block_shape().kv;
    return (bits[static_cast<std::size_t>(row * bm.words_per_row() + col / 64)] >> (col % 64)) & 1u;
  }
  TileClass classify(const MaskContext& ctx, const Tile& tile) const { return classify_by_scan(*this, ctx, tile); }
};

}  // namespace seqattn::detail
