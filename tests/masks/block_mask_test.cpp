#include <random>

#include "seqattn/masks.hpp"

#include "masks/block_mask_checks.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_block_mask_test {

using namespace seqattn;

using seqattn::testing::check_block_mask;

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

}  // namespace seqattn_test_masks_block_mask_test
