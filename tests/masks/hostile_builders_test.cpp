// Issue 21 ("Reliability of the new surfaces"), the mask findings: a
// moved-from AnyMask, hand-built BlockMasks that disagreed with their own
// lengths, and metadata grids within the element limits that no machine can
// allocate. Each test failed (crashed, overflowed a buffer, or threw a plain
// std::bad_alloc, or aborted under ASan) before its fix.
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/backends/splash.hpp"
#include "seqattn/masks.hpp"
#include "seqattn/masks/flex_export.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_hostile_builders_test {

using namespace seqattn;

namespace {

// One hand-built row per q-block of a (q 8, kv 8) mask with (4, 4) tiles.
BlockMask::Builder builder_8x8() { return BlockMask::Builder(RaggedLengths::uniform(1, 8, 8), 1, {4, 4}); }

// Tile bits of a (4, 4) tile: block_q rows of one word.
std::vector<std::uint64_t> tile(std::uint64_t row_bits) { return std::vector<std::uint64_t>(4, row_bits); }

}  // namespace

TEST_CASE("issue 21 #27: a moved-from AnyMask throws invalid_argument on use, and copying it is fine") {
  AnyMask mask = CausalMask{};
  const AnyMask taken = std::move(mask);
  CHECK(taken.allowed({0, 0, 4, 4}, 1, 0));
  const MaskContext ctx{0, 0, 4, 4};
  CHECK_THROWS_AS(mask.allowed(ctx, 0, 0), seqattn::invalid_argument);  // NOLINT(bugprone-use-after-move)
  CHECK_THROWS_WITH(mask.classify(ctx, Tile{0, 4, 0, 4}), ContainsSubstring("moved-from AnyMask"));
  CHECK_THROWS_AS(mask.kv_span(ctx, 0, 4), seqattn::invalid_argument);
  std::uint64_t word = 0;
  CHECK_THROWS_AS(mask.row_bits(ctx, 0, 0, 4, &word), seqattn::invalid_argument);
  CHECK_THROWS_AS(mask.check(RaggedLengths::uniform(1, 4, 4), 1), seqattn::invalid_argument);
  CHECK_THROWS_AS(mask.invariant_over_heads(), seqattn::invalid_argument);
  CHECK_THROWS_AS(mask.has_kv_span(), seqattn::invalid_argument);
  CHECK_THROWS_AS(mask.target_type(), seqattn::invalid_argument);
  CHECK_THROWS_AS(mask.target<CausalMask>(), seqattn::invalid_argument);
  CHECK_THROWS_AS(build_block_mask(mask, RaggedLengths::uniform(1, 4, 4), 2, {2, 2}), seqattn::invalid_argument);
  CHECK_THROWS_AS(to_dense(mask & taken, RaggedLengths::uniform(1, 4, 4)), seqattn::invalid_argument);

  // Copies and assignments of a moved-from AnyMask are defined.
  AnyMask copy = mask;
  CHECK_THROWS_AS(copy.allowed(ctx, 0, 0), seqattn::invalid_argument);
  copy = taken;
  CHECK(copy.allowed(ctx, 3, 2));
  mask = FullMask{};
  CHECK(mask.allowed(ctx, 0, 3));
  AnyMask moved_twice = std::move(copy);
  moved_twice = std::move(copy);  // NOLINT(bugprone-use-after-move): a moved-from source is fine too
  CHECK_THROWS_AS(moved_twice.allowed(ctx, 0, 0), seqattn::invalid_argument);
}

TEST_CASE("issue 21 #28: BlockMask::Builder::finish() rejects blocks outside the sequence's tile grid") {
  {
    auto b = builder_8x8();
    b.add_full(0);
    b.end_row();
    b.add_full(9);  // the grid has kv-blocks 0 and 1
    b.end_row();
    CHECK_THROWS_WITH(b.finish(),
                      ContainsSubstring("[9, 10)") && ContainsSubstring("[0, 2)") && ContainsSubstring("q-block 1"));
  }
  {
    auto b = builder_8x8();
    b.add_partial(2, tile(1));
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("partial kv-block 2") && ContainsSubstring("q-block 0"));
  }
  {
    // Negative ids and ids at the int32 edge are refused as they are added.
    auto b = builder_8x8();
    CHECK_THROWS_WITH(b.add_partial(-1, tile(1)), ContainsSubstring("kv-block -1"));
    CHECK_THROWS_AS(b.add_full(std::numeric_limits<std::int32_t>::max()), seqattn::invalid_argument);
    CHECK_THROWS_AS(b.add_full_range(-3, 1), seqattn::invalid_argument);
  }
  {
    auto b = builder_8x8();
    b.add_full_range(0, 3);
    b.end_row();
    b.end_row();
    CHECK_THROWS_AS(b.finish(), seqattn::invalid_argument);
  }
}

TEST_CASE("issue 21 #28: BlockMask::Builder::finish() rejects a row count that is not the mask's") {
  {
    auto b = builder_8x8();
    b.add_full(0);
    b.end_row();  // 2 q-blocks but one row
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("has 2 rows") && ContainsSubstring("ended 1"));
  }
  {
    auto b = builder_8x8();
    for (int r = 0; r < 3; ++r) b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("ended 3"));
  }
  {
    auto b = builder_8x8();
    b.end_row();
    b.add_full(1);  // a block after the last end_row belongs to no row
    b.end_row();
    b.add_full(0);
    CHECK_THROWS_AS(b.finish(), seqattn::invalid_argument);
  }
}

TEST_CASE("issue 21 #28: BlockMask::Builder::finish() rejects duplicate and unordered blocks") {
  {
    auto b = builder_8x8();
    b.add_partial(1, tile(1));
    b.add_partial(0, tile(1));  // partial blocks are increasing
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("increasing"));
  }
  {
    auto b = builder_8x8();
    b.add_partial(1, tile(1));
    b.add_partial(1, tile(3));
    b.end_row();
    b.end_row();
    CHECK_THROWS_AS(b.finish(), seqattn::invalid_argument);
  }
  {
    auto b = builder_8x8();
    b.add_full(1);
    b.add_full(0);  // full ranges are increasing and disjoint
    b.end_row();
    b.end_row();
    CHECK_THROWS_AS(b.finish(), seqattn::invalid_argument);
  }
  {
    auto b = builder_8x8();
    b.add_full(1);
    b.add_partial(1, tile(1));  // one tile both full and partial
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("both full and partial"));
  }
}

TEST_CASE("issue 21 #28: BlockMask::Builder checks tile bits against the block shape and the lengths") {
  {
    auto b = builder_8x8();
    CHECK_THROWS_WITH(b.add_partial(0, std::vector<std::uint64_t>(2, 1)), ContainsSubstring("4 words"));
  }
  {
    auto b = builder_8x8();
    b.add_partial(0, tile(1));
    b.add_partial(1, {});  // bits for some partial tiles and not for others
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("tile bits"));
  }
  {
    // (6, 6) with (4, 4) tiles: the edge tiles hold 2 rows / columns, and
    // bits past them would claim keys and queries that do not exist.
    BlockMask::Builder b(RaggedLengths::uniform(1, 6, 6), 1, {4, 4});
    b.add_full(0);
    b.add_partial(1, tile(0b1111));  // columns 2 and 3 lie past kv_len
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("outside the tile"));
  }
  {
    BlockMask::Builder b(RaggedLengths::uniform(1, 6, 6), 1, {4, 4});
    b.end_row();
    b.add_partial(0, tile(0b1));  // rows 2 and 3 lie past q_len
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("outside the tile"));
  }
}

TEST_CASE("issue 21 #28: BlockMask::Builder rejects tile bits past block_kv in a whole tile") {
  // Found by fuzz/fuzz_export: a whole (4, 4) interior tile whose words also
  // set bits 4..63 was accepted; allowed() read it as full, the flex export
  // counted 64 bits a row and listed it as partial, Splash likewise.
  {
    auto b = builder_8x8();
    b.add_partial(0, tile(~std::uint64_t{0}));
    b.end_row();
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("outside the tile"));
  }
  {
    // One stray bit just past the last column, in one row of a tile that is
    // otherwise a valid partial tile.
    auto b = builder_8x8();
    b.end_row();
    b.add_full(0);
    b.add_partial(1, std::vector<std::uint64_t>{0b1, 0b11, 0b111 | (std::uint64_t{1} << 4), 0b1111});
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("outside the tile"));
  }
  {
    // Two words a row (block_kv 70): the stray bit sits in the second word.
    BlockMask::Builder b(RaggedLengths::uniform(1, 2, 70), 1, {2, 70});
    const std::uint64_t low = ~std::uint64_t{0}, high = 0b111111;  // columns 0..69
    b.add_partial(0, std::vector<std::uint64_t>{low, high | (std::uint64_t{1} << 6), low, 0});
    b.end_row();
    CHECK_THROWS_WITH(b.finish(), ContainsSubstring("outside the tile"));
  }
  {
    // The same tiles without the stray bits are accepted, and an all-set
    // whole tile exports as full for flex and Splash.
    BlockMask::Builder b(RaggedLengths::uniform(1, 2, 70), 1, {2, 70});
    b.add_partial(0, std::vector<std::uint64_t>{~std::uint64_t{0}, 0b111111, ~std::uint64_t{0}, 0b111111});
    b.end_row();
    const BlockMask bm = b.finish();
    const FlexBlockMaskArrays f = to_flex_block_mask(bm, 1, 1);
    CHECK(f.kv_num_blocks(0, 0, 0) == 0);
    CHECK(f.full_kv_num_blocks(0, 0, 0) == 1);
    const backends::SplashMaskInfo info = backends::Splash::mask_info(bm, 1);
    CHECK(info.block_mask.values(0, 0, 0) == 2);
  }
}

TEST_CASE("issue 21 #28: a valid hand-built BlockMask equals the built one and exports the same") {
  // Causal over (6, 6) in (4, 4) tiles: diagonal tiles partial, (1, 0) full.
  const RaggedLengths lengths = RaggedLengths::uniform(1, 6, 6);
  BlockMask::Builder b(lengths, 1, {4, 4});
  b.add_partial(0, std::vector<std::uint64_t>{0b1, 0b11, 0b111, 0b1111});
  b.end_row();
  b.add_full(0);
  b.add_partial(1, std::vector<std::uint64_t>{0b1, 0b11, 0, 0});
  b.end_row();
  const BlockMask hand = b.finish();
  const BlockMask built = build_block_mask(CausalMask{}, lengths, 1, {4, 4});
  for (index_t q = 0; q < 6; ++q) {
    for (index_t kv = 0; kv < 6; ++kv) CHECK(hand.allowed({0, 0, 6, 6}, q, kv) == built.allowed({0, 0, 6, 6}, q, kv));
  }
  const FlexBlockMaskArrays a = to_flex_block_mask(hand, 2, 3), e = to_flex_block_mask(built, 2, 3);
  CHECK(a.kv_indices == e.kv_indices);
  CHECK(a.full_kv_num_blocks == e.full_kv_num_blocks);
  CHECK(a.q_indices == e.q_indices);
  CHECK(flex_tile_table(hand).tile_bits == flex_tile_table(built).tile_bits);
  // A fully-set interior tile is accepted (flex reads it as full).
  BlockMask::Builder all(RaggedLengths::uniform(1, 8, 8), 1, {4, 4});
  all.add_partial(0, tile(0b1111));
  all.end_row();
  all.add_full(1);
  all.end_row();
  CHECK(all.finish().num_partial_tiles() == 1);
}

TEST_CASE("issue 21 #37: a Splash class grid over the element limit is refused before allocation") {
  // 2^21 x 2^21 one-element tiles: every count fits its own limit, the grid
  // of 2^42 cells does not.
  const BlockMask bm = build_block_mask(FullMask{}, RaggedLengths::uniform(1, 1 << 21, 1 << 21), 1, {1, 1});
  CHECK_THROWS_WITH(backends::Splash::mask_info(bm, 1),
                    ContainsSubstring("class grid") && ContainsSubstring("exceeds the limit"));
}

TEST_CASE("issue 21 #37: a Splash class grid within the limits that cannot be allocated is out_of_memory") {
  // 2^20 x 2^20 tiles: 2^40 cells, at the element limit, 5 bytes each.
  const BlockMask bm = build_block_mask(FullMask{}, RaggedLengths::uniform(1, 1 << 20, 1 << 20), 1, {1, 1});
  try {
    (void)backends::Splash::mask_info(bm, 1);
    FAIL("a 5 TiB class grid was allocated");
  } catch (const seqattn::out_of_memory& e) {
    CHECK(e.bytes() == (std::size_t{5} << 40));
    CHECK_THAT(std::string(e.what()), ContainsSubstring("class grid") && ContainsSubstring("5497558138880 bytes"));
  }
}

TEST_CASE("issue 21 #37: flex arrays within the limits that cannot be allocated are out_of_memory") {
  // One q-block and 2^20 kv-blocks broadcast to B x H = 2^20 slices: 2^40
  // int32 per index array.
  const BlockMask bm = build_block_mask(FullMask{}, RaggedLengths::uniform(1, 1, 1 << 20), 1, {1, 1});
  const index_t batch = 16, heads = 1 << 16;
  try {
    (void)to_flex_block_mask(bm, batch, heads);
    FAIL("terabytes of flex arrays were allocated");
  } catch (const seqattn::out_of_memory& e) {
    CHECK(e.bytes() >= (std::size_t{4} << 40));
    CHECK_THAT(std::string(e.what()), ContainsSubstring("to_flex_block_mask") && ContainsSubstring(" bytes"));
  }
  try {
    (void)to_flex_block_mask(bm, batch, heads, {.separate_full_blocks = false, .compute_q_blocks = false});
    FAIL("terabytes of flex arrays were allocated");
  } catch (const seqattn::out_of_memory& e) {
    CHECK(e.bytes() >= (std::size_t{4} << 40));
  }
}

}  // namespace seqattn_test_masks_hostile_builders_test
