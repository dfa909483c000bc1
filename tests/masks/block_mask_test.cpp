#include <random>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

using namespace seqattn;

namespace {

// Checks a BlockMask against brute force: every tile's listing (full range,
// partial, or absent = empty) agrees with classify_by_scan, and stored tile
// bits agree with the element predicate.
template <class M>
void check_block_mask(const M& mask, const BlockMask& bm, index_t heads) {
  for (index_t b = 0; b < bm.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)};
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        std::vector<TileClass> listed(static_cast<std::size_t>(bm.num_kv_blocks(b)), TileClass::empty);
        for (auto r : bm.full_ranges(b, h, qb)) {
          for (auto kb = r.begin; kb < r.end; ++kb) listed[static_cast<std::size_t>(kb)] = TileClass::full;
        }
        auto partial = bm.partial_blocks(b, h, qb);
        auto ids = bm.partial_tile_ids(b, h, qb);
        for (std::size_t i = 0; i < partial.size(); ++i) {
          listed[static_cast<std::size_t>(partial[i])] = TileClass::partial;
          const Tile t = bm.tile(b, qb, partial[i]);
          auto bits = bm.tile_bits(ids[i]);
          for (index_t q = t.q_begin; q < t.q_end; ++q) {
            for (index_t kv = t.kv_begin; kv < t.kv_end; ++kv) {
              const index_t c = kv - t.kv_begin;
              const bool bit =
                  (bits[static_cast<std::size_t>((q - t.q_begin) * bm.words_per_row() + c / 64)] >> (c % 64)) & 1u;
              REQUIRE(bit == mask.allowed(ctx, q, kv));
            }
          }
        }
        for (index_t kb = 0; kb < bm.num_kv_blocks(b); ++kb) {
          const TileClass brute = detail::classify_by_scan(mask, ctx, bm.tile(b, qb, kb));
          INFO("b=" << b << " h=" << h << " qb=" << qb << " kb=" << kb);
          // The structural answer may say partial where brute force says full or
          // empty (sound, not exact), never the reverse.
          if (listed[static_cast<std::size_t>(kb)] != TileClass::partial) {
            REQUIRE(listed[static_cast<std::size_t>(kb)] == brute);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("BlockMask of causal masks agrees with brute force on ragged batches") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const index_t batch = std::uniform_int_distribution<index_t>(1, 3)(rng);
    RaggedLengths lengths;
    for (index_t b = 0; b < batch; ++b) {
      lengths.q.push_back(std::uniform_int_distribution<index_t>(0, 70)(rng));
      lengths.kv.push_back(std::uniform_int_distribution<index_t>(0, 70)(rng));
    }
    const BlockShape block{std::uniform_int_distribution<index_t>(1, 20)(rng),
                           std::uniform_int_distribution<index_t>(1, 70)(rng)};
    for (auto alignment : {Alignment::top_left, Alignment::bottom_right}) {
      const CausalMask mask{alignment};
      const BlockMask bm = build_block_mask(mask, lengths, 2, block);
      CHECK(bm.heads() == 1);
      check_block_mask(mask, bm, 2);
    }
    check_block_mask(FullMask{}, build_block_mask(FullMask{}, lengths, 1, block), 1);
  }
}

TEST_CASE("BlockMask deduplicates identical partial tiles") {
  // Causal with square blocks: every diagonal tile has the same pattern,
  // except a short last tile.
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(2, 1024, 1024), 4, {64, 64});
  CHECK(bm.num_partial_tiles() == 2 * 16);
  CHECK(bm.num_distinct_partial_tiles() == 1);
  CHECK(bm.num_full_tiles() == 2 * (16 * 15 / 2));
  CHECK(bm.full_ranges(1, 3, 5).size() == 1);
  CHECK(bm.full_ranges(1, 3, 5)[0] == BlockRange{0, 5});
}

TEST_CASE("BlockMask rejects bad block sizes") {
  CHECK_THROWS_WITH(build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 8, 8), 1, {0, 4}),
                    Catch::Matchers::Contains("block sizes must be positive, got block_q=0, block_kv=4"));
  CHECK_THROWS_WITH(build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 8, 8), 1, {4, -2}),
                    Catch::Matchers::Contains("block_kv=-2"));
}
