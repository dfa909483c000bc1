// Shared by the mask tests: a BlockMask checked tile by tile against brute
// force (classify_by_scan) and its stored tile bits against the predicate.
#pragma once

#include <vector>

#include "seqattn/masks/block_mask.hpp"

#include "support/catch.hpp"

namespace seqattn::testing {

// Listed classes must equal brute force, except that `partial` is always
// sound; full ranges non-empty; partial blocks increasing and disjoint from
// the full ranges; tile bits equal to the predicate inside the tile and zero
// outside it (short edge tiles).
template <class M>
void check_block_mask(const M& mask, const BlockMask& bm, index_t heads) {
  for (index_t b = 0; b < bm.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)};
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        std::vector<TileClass> listed(static_cast<std::size_t>(bm.num_kv_blocks(b)), TileClass::empty);
        for (auto r : bm.full_ranges(b, h, qb)) {
          REQUIRE(r.begin < r.end);
          for (auto kb = r.begin; kb < r.end; ++kb) listed[static_cast<std::size_t>(kb)] = TileClass::full;
        }
        CHECK(bm.num_full_blocks(b, h, qb) == static_cast<index_t>(bm.full_blocks(b, h, qb).size()));
        auto partial = bm.partial_blocks(b, h, qb);
        auto ids = bm.partial_tile_ids(b, h, qb);
        REQUIRE(ids.size() == partial.size());
        for (std::size_t i = 0; i < partial.size(); ++i) {
          if (i > 0) REQUIRE(partial[i - 1] < partial[i]);
          REQUIRE(listed[static_cast<std::size_t>(partial[i])] == TileClass::empty);
          listed[static_cast<std::size_t>(partial[i])] = TileClass::partial;
          const Tile t = bm.tile(b, qb, partial[i]);
          auto bits = bm.tile_bits(ids[i]);
          for (index_t r = 0; r < bm.block_shape().q; ++r) {
            for (index_t c = 0; c < bm.block_shape().kv; ++c) {
              const bool bit = (bits[static_cast<std::size_t>(r * bm.words_per_row() + c / 64)] >> (c % 64)) & 1u;
              const bool inside = r < t.rows() && c < t.cols();
              const bool want = inside && mask.allowed(ctx, t.q_begin + r, t.kv_begin + c);
              if (bit != want) {
                INFO("b=" << b << " h=" << h << " qb=" << qb << " kb=" << partial[i] << " r=" << r << " c=" << c);
                REQUIRE(bit == want);
              }
            }
          }
        }
        for (index_t kb = 0; kb < bm.num_kv_blocks(b); ++kb) {
          const TileClass brute = detail::classify_by_scan(mask, ctx, bm.tile(b, qb, kb));
          const TileClass got = listed[static_cast<std::size_t>(kb)];
          if (got != TileClass::partial && got != brute) {
            INFO("b=" << b << " h=" << h << " qb=" << qb << " kb=" << kb);
            REQUIRE(got == brute);
          }
        }
      }
    }
  }
}

}  // namespace seqattn::testing
