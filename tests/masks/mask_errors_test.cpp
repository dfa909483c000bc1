// Bad input throws seqattn::invalid_argument naming the argument and shapes.
#include <cstdint>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_mask_errors_test {

using namespace seqattn;
using Catch::Matchers::Contains;

namespace {
TensorView<const std::int32_t> view(const std::vector<std::int32_t>& v, Extents shape) {
  return TensorView<const std::int32_t>(v.data(), shape);
}
}  // namespace

TEST_CASE("Top-k indices out of range, repeated or mis-shaped are rejected") {
  const std::vector<std::int32_t> ok{0, 3, -1, 2};
  CHECK_NOTHROW(TopKLayout::from_indices(view(ok, {1, 2, 2}), 4));
  const std::vector<std::int32_t> high{0, 4, 1, 2};
  CHECK_THROWS_AS(TopKLayout::from_indices(view(high, {1, 2, 2}), 4), invalid_argument);
  CHECK_THROWS_WITH(TopKLayout::from_indices(view(high, {1, 2, 2}), 4),
                    Contains("indices of shape (1, 2, 2): row 0 entry 1 is 4, outside [0, 4)"));
  const std::vector<std::int32_t> negative{0, 1, -2, 2};
  CHECK_THROWS_WITH(TopKLayout::from_indices(view(negative, {1, 2, 2}), 4), Contains("is -2, outside [0, 4)"));
  const std::vector<std::int32_t> repeated{1, 1, 0, 2};
  CHECK_THROWS_WITH(TopKLayout::from_indices(view(repeated, {1, 2, 2}), 4), Contains("row 0 repeats index 1"));
  CHECK_THROWS_WITH(TopKLayout::from_indices(view(ok, {4}), 4), Contains("must have shape (*E, B, t, k), got (4,)"));
  CHECK_THROWS_WITH(topk_scatter_mask(view(high, {2, 2}), 4), Contains("row 0 entry 1 is 4, outside [0, 4)"));
  std::vector<float> storage(12);
  const TensorView<float> out(storage.data(), Extents{3, 4});
  CHECK_THROWS_WITH(topk_scatter_mask_into(out, view(ok, {2, 2})),
                    Contains("out (..., t, s) and indices (..., t, k) must be contiguous and agree but the last dim; "
                             "got (3, 4) and (2, 2)"));
  const std::vector<float> scores{1, 2, 3};
  CHECK_THROWS_WITH(top_k(TensorView<const float>(scores.data(), Extents{3}), 4),
                    Contains("k must be in [0, 3] for scores of shape (3,), got 4"));
  // A layout for t=2, s=4 cannot serve other lengths.
  const TopKLayout layout = TopKLayout::from_indices(view(ok, {1, 2, 2}), 4);
  CHECK_THROWS_WITH(build_block_mask(topk_mask(layout), RaggedLengths::uniform(1, 2, 5), 1, {2, 2}),
                    Contains("TopKMask: sequence 0 has lengths (2, 5) but the indices are for t=2, s=4"));
  CHECK_THROWS_WITH(build_block_mask(topk_mask(layout), RaggedLengths::uniform(2, 2, 4), 1, {2, 2}),
                    Contains("indices cover 1 sequences"));
}

TEST_CASE("Block sizes must be positive for every builder") {
  CHECK_THROWS_WITH(build_block_mask(SlidingWindowMask{2, 0}, RaggedLengths::uniform(1, 8, 8), 1, {0, 4}),
                    Contains("block sizes must be positive, got block_q=0, block_kv=4"));
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, RaggedLengths::uniform(1, 8, 8), 1, {4, -1}), Contains("block_kv=-1"));
  SegmentMetadata flat;
  CHECK_THROWS_WITH(block_segment_metadata(flat, 0), Contains("block_q must be positive, got 0"));
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, RaggedLengths::uniform(1, 8, 8), 0, {4, 4}),
                    Contains("heads must be positive, got 0"));
  RaggedLengths mismatched{{4, 4}, {4}};
  CHECK_THROWS_WITH(build_block_mask(FullMask{}, mismatched, 1, {4, 4}), Contains("2 q lengths but 1 kv lengths"));
}

TEST_CASE("Structural parameters are validated") {
  CHECK_THROWS_WITH(build_block_mask(ChunkedCausalMask{0}, RaggedLengths::uniform(1, 8, 8), 1, {4, 4}),
                    Contains("ChunkedCausalMask: chunk must be positive, got 0"));
  const std::vector<std::int32_t> prefixes{3};
  CHECK_THROWS_WITH(to_dense(PrefixLMMask{.prefix_lengths = prefixes}, RaggedLengths::uniform(2, 4, 4)),
                    Contains("PrefixLMMask: prefix_lengths has shape (1,) but the batch has 2 sequences"));
  const std::vector<std::int32_t> negative{-1};
  CHECK_THROWS_WITH(to_dense(PrefixLMMask{.prefix_lengths = negative}, RaggedLengths::uniform(1, 4, 4)),
                    Contains("prefix_lengths[0] = -1 is negative"));
  const std::vector<SlidingWindowMask> heads{SlidingWindowMask{1, 0}};
  CHECK_THROWS_WITH(build_block_mask(PerHeadMask<SlidingWindowMask>{heads}, RaggedLengths::uniform(1, 4, 4), 2),
                    Contains("PerHeadMask: 1 masks but attention has 2 heads"));
}

TEST_CASE("Segment ids must be contiguous runs with consistent shapes") {
  const std::vector<std::int32_t> split{1, 1, 2, 1, 0, 0};
  CHECK_THROWS_AS(DocumentLayout::from_segment_ids(view(split, {1, 6})), invalid_argument);
  CHECK_THROWS_WITH(
      DocumentLayout::from_segment_ids(view(split, {1, 6})),
      Contains("q_segment_ids row 0 of shape (1, 6): segment 1 is not one contiguous run (tokens 0 and 3)"));
  const std::vector<std::int32_t> negative{1, -1};
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(negative, {1, 2})),
                    Contains("q_segment_ids[0, 1] = -1 is negative"));
  const std::vector<std::int32_t> ids{1, 1, 2, 2};
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(ids, {4})), Contains("must have shape (*E, B, T), got (4,)"));
  const std::vector<std::int32_t> kv{1, 1, 2, 2, 2, 2};
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(ids, {2, 2}), view(kv, {3, 2}), {}, {}),
                    Contains("q_segment_ids (2, 2) and kv_segment_ids (3, 2) must agree in every dim but the last"));
  // Positions: trailing shape, rank, consecutive within a run (docs/semantics/sequence-descriptors.md §3, §7.3).
  const std::vector<std::int32_t> pos{0, 1, 0, 1};
  CHECK_NOTHROW(DocumentLayout::from_segment_ids(view(ids, {1, 1, 4}), view(pos, {1, 4})));
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(ids, {1, 4}), view(pos, {1, 1, 4})),
                    Contains("q_segment_pos must have shape (*E', B, T) with no more dims than q_segment_ids (1, 4)"));
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(ids, {1, 4}), view(pos, {2, 2})),
                    Contains("q_segment_pos trailing shape must match q_segment_ids; got ids (1, 4), pos (2, 2)"));
  const std::vector<std::int32_t> gap{0, 2, 0, 1};
  CHECK_THROWS_WITH(DocumentLayout::from_segment_ids(view(ids, {1, 4}), view(gap, {1, 4})),
                    Contains("positions within segment 1 must count up by one, got 2 at token 1 after 0"));
  // The mask must be used with the layout's shapes.
  const DocumentLayout layout = DocumentLayout::from_segment_ids(view(ids, {2, 2}));
  CHECK_THROWS_WITH(build_block_mask(document_mask(layout), RaggedLengths::uniform(2, 3, 2), 1),
                    Contains("DocumentMask: sequence 0 has lengths (3, 2) but the segment ids have T_q=2, T_kv=2"));
  CHECK_THROWS_WITH(to_dense(document_mask(layout), RaggedLengths::uniform(1, 2, 2)),
                    Contains("the layout has 2 rows"));
}

TEST_CASE("Multi-item sequences are validated") {
  MultiItemLayout l;
  const std::vector<std::int32_t> one_delim{5, 6, 99, 7};
  CHECK_THROWS_WITH(l.add_packed(one_delim, 99),
                    Contains("has 1 delimiters (99); a multi-item sequence needs at least 2"));
  const std::vector<std::int32_t> no_query{99, 7, 99};
  CHECK_THROWS_WITH(l.add_packed(no_query, 99), Contains("has an empty query"));
  const std::vector<std::int32_t> open_end{5, 99, 7, 99, 8};
  CHECK_THROWS_WITH(l.add_packed(open_end, 99), Contains("must end with the delimiter, last one is at 3"));
  const std::vector<index_t> items{1, -2};
  CHECK_THROWS_WITH(l.add_items(2, items), Contains("item_lengths[1] = -2 is negative"));
  l.add_items(2, std::vector<index_t>{1, 1});
  CHECK_THROWS_WITH(build_block_mask(multi_item_mask(l), RaggedLengths::uniform(1, 7, 9), 1),
                    Contains("has lengths (7, 9) but the layout says 7"));
}

TEST_CASE("Dense and packed masks must cover the batch") {
  Tensor<std::uint8_t> values(Extents{2, 3, 4, 4}, 1);
  const DenseMask<std::uint8_t> mask{values.view()};
  CHECK_NOTHROW(to_dense(mask, RaggedLengths::uniform(2, 4, 4), 3));
  CHECK_THROWS_WITH(to_dense(mask, RaggedLengths::uniform(3, 4, 4), 3),
                    Contains("values of shape (2, 3, 4, 4) hold 2 sequences but the batch has 3"));
  CHECK_THROWS_WITH(to_dense(mask, RaggedLengths::uniform(2, 4, 4), 2), Contains("hold 3 heads but attention has 2"));
  CHECK_THROWS_WITH(to_dense(mask, RaggedLengths::uniform(2, 5, 4), 3),
                    Contains("sequence 0 has lengths (5, 4) but values have shape (2, 3, 4, 4)"));
  const PackedMask packed = pack_bits(CausalMask{}, RaggedLengths::uniform(2, 4, 4));
  CHECK_THROWS_WITH(to_dense(DenseBitsMask{packed.view()}, RaggedLengths::uniform(1, 4, 4)),
                    Contains("indptr has 3 entries but 1 sequences x 1 heads need 2"));
  CHECK_THROWS_WITH(to_dense(DenseBitsMask{packed.view()}, RaggedLengths::uniform(2, 4, 5)),
                    Contains("segment 0 holds 2 bytes but sequence 0 of lengths (4, 5) needs 3"));
}

TEST_CASE("Packed bits use FlashInfer's little-endian order with byte-aligned segments") {
  // Causal 3x3: elements 0, 3, 4, 6, 7, 8 set -> bytes 0b11011001, 0b1.
  RaggedLengths lengths{{3, 2}, {3, 3}};
  const PackedMask p = pack_bits(CausalMask{}, lengths);
  REQUIRE(p.indptr == std::vector<index_t>{0, 2, 3});
  CHECK(p.bits[0] == 0b11011001);
  CHECK(p.bits[1] == 0b1);
  // 2x3 causal: elements 0, 3, 4 -> 0b00011001.
  CHECK(p.bits[2] == 0b00011001);
}

TEST_CASE("Additive masks default to MaxText's mask value") {
  CHECK(kDefaultMaskValue == -0.7f * std::numeric_limits<float>::max());
  const Tensor<float> a = to_additive(CausalMask{}, RaggedLengths::uniform(1, 2, 2));
  CHECK(a(0, 0, 0, 1) == kDefaultMaskValue);
  CHECK(a(0, 0, 1, 1) == 0.0f);
}

}  // namespace seqattn_test_masks_mask_errors_test
