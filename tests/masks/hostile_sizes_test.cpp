// Issue 14 ("Memory safety under hostile sizes"): mask findings as
// regression tests. Each repro wrote or read out of bounds, or answered
// silently wrong, before the fix.
#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_hostile_sizes_test {

using namespace seqattn;

namespace {
constexpr index_t kI64Max = std::numeric_limits<index_t>::max();
constexpr std::int32_t kI32Max = std::numeric_limits<std::int32_t>::max();
}  // namespace

TEST_CASE("issue 14 #4: to_dense and pack_bits reject sizes that overflow or are negative") {
  CHECK_THROWS_AS(to_dense(CausalMask{}, RaggedLengths::uniform(1, 1 << 16, 1 << 16), index_t{1} << 32),
                  seqattn::invalid_argument);
  CHECK_THROWS_AS(pack_bits(FullMask{}, RaggedLengths::uniform(1, index_t{1} << 40, 1 << 24)),
                  seqattn::invalid_argument);
  CHECK_THROWS_WITH(to_dense(FullMask{}, RaggedLengths{{-1}, {4}}), ContainsSubstring("negative length"));
  CHECK_THROWS_WITH(pack_bits(FullMask{}, RaggedLengths{{4}, {-3}}), ContainsSubstring("negative length"));
  CHECK_THROWS_WITH(RaggedLengths::uniform(-1, 4, 4), ContainsSubstring("non-negative"));
}

TEST_CASE("issue 14 #7: BlockMask accessors and to_ascii range-check the sequence, head and q-block") {
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 8, 8), 1, {4, 4});
  CHECK_THROWS_WITH(to_ascii(bm, 3), ContainsSubstring("outside"));
  CHECK_THROWS_AS(bm.full_ranges(1, 0, 0), seqattn::invalid_argument);
  CHECK_THROWS_AS(bm.partial_blocks(0, 0, 2), seqattn::invalid_argument);
  CHECK_THROWS_AS(bm.q_len(-1), seqattn::invalid_argument);
  CHECK_THROWS_AS(bm.tile_bits(7), seqattn::invalid_argument);
  CHECK(to_ascii(bm, 0) == "+.\n#+\n");
}

TEST_CASE("issue 14 #9: SlidingWindowMask with an INT64_MAX side does not overflow") {
  const SlidingWindowMask w{-1, kI64Max};
  const RaggedLengths lens = RaggedLengths::uniform(1, 5, 7);
  const MaskContext ctx{0, 0, 5, 7};
  CHECK(w.allowed(ctx, 0, 6));
  const Tensor<std::uint8_t> dense = to_dense(w, lens);
  for (index_t i = 0; i < dense.size(); ++i) CHECK(dense.data()[i] == 1);
  const BlockMask bm = build_block_mask(w, lens, 1, {2, 2});
  CHECK(bm.num_full_tiles() + bm.num_partial_tiles() == bm.num_tiles());
  const SlidingWindowMask w2{kI64Max, 0, Alignment::bottom_right};
  const Tensor<std::uint8_t> causal = to_dense(w2, lens);
  CHECK(causal == to_dense(CausalMask{Alignment::bottom_right}, lens));
}

TEST_CASE("issue 14 #10: DocumentLayout positions near INT32_MAX keep the bottom-right document mask right") {
  const std::vector<std::int32_t> ids{1, 1}, pos{kI32Max - 1, kI32Max};
  const TensorView<const std::int32_t> idv(ids.data(), Extents{1, 2}), posv(pos.data(), Extents{1, 2});
  const DocumentLayout layout = DocumentLayout::from_segment_ids(idv, posv);
  const auto mask = document_mask(layout, CausalMask{Alignment::bottom_right});
  const Tensor<std::uint8_t> dense = to_dense(mask, layout.lengths());
  CHECK(dense(0, 0, 0, 0) == 1);
  CHECK(dense(0, 0, 0, 1) == 0);
  CHECK(dense(0, 0, 1, 0) == 1);
  CHECK(dense(0, 0, 1, 1) == 1);
  const BlockMask bm = build_block_mask(mask, layout.lengths(), 1, {1, 1});
  CHECK(bm.num_full_tiles() == 3);
}

TEST_CASE("issue 14 #12: TopKLayout rejects a kv_len its int32 indices cannot address") {
  const std::vector<std::int32_t> idx{5};
  const TensorView<const std::int32_t> v(idx.data(), Extents{1, 1, 1});
  CHECK_THROWS_WITH(TopKLayout::from_indices(v, (index_t{1} << 32) + 65536), ContainsSubstring("int32"));
  CHECK_NOTHROW(TopKLayout::from_indices(v, index_t{1} << 31));
  CHECK_THROWS_WITH(topk_scatter_mask(v, -1), ContainsSubstring("kv_len must be non-negative"));
}

TEST_CASE("issue 14 #13: block counts do not overflow for huge blocks or lengths") {
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, RaggedLengths::uniform(1, 10, 10), 1, {kI64Max, kI64Max}),
                    ContainsSubstring("kMaxBlockSize"));
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, RaggedLengths::uniform(1, kI64Max, kI64Max), 1, {128, 128}),
                    ContainsSubstring("kMaxBlocksPerAxis"));
  // Tile-bit scratch is bounded: (1<<20)^2 blocks are refused before any allocation.
  CHECK_THROWS_AS(build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 10, 10), 1, {1 << 20, 1 << 20}),
                  seqattn::invalid_argument);
  CHECK_THROWS_WITH(build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 10, 10), 1, {1 << 16, 1 << 16}),
                    ContainsSubstring("kMaxTileBits"));
  const BlockMask one = build_block_mask(FullMask{}, RaggedLengths::uniform(1, 10, 10), 1, {1 << 16, 1 << 16},
                                         {.store_tile_bits = false});
  CHECK(one.num_full_tiles() == 1);
}

TEST_CASE("issue 14 #16: segment_metadata of a DocumentLayout compares segment ids, not only boundaries") {
  const std::vector<std::int32_t> q_ids{1, 1}, kv_ids{2, 2};
  const TensorView<const std::int32_t> qv(q_ids.data(), Extents{1, 2}), kv(kv_ids.data(), Extents{1, 2});
  const DocumentLayout layout = DocumentLayout::from_segment_ids(qv, kv, {}, {});
  CHECK_THROWS_WITH(segment_metadata(layout), ContainsSubstring("differs between queries and keys"));
}

TEST_CASE("issue 14: unvalidated mask sizes are refused before allocation") {
  MultiItemLayout items;
  CHECK_THROWS_WITH(items.add_causal(index_t{1} << 40), ContainsSubstring("2^31 - 1"));
  items.add_causal(3);
  const SegmentMetadata meta = segment_metadata(items);
  CHECK_THROWS_WITH(block_segment_metadata(meta, index_t{1} << 40), ContainsSubstring("kMaxBlockSize"));
  CHECK(block_segment_metadata(meta, 2).row_seg_start.size() == 4);
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, RaggedLengths::uniform(1, 4, 4), index_t{1} << 40),
                    ContainsSubstring("kMaxHeads"));
}

}  // namespace seqattn_test_masks_hostile_sizes_test
