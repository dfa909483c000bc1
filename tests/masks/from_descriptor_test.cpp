// Document masks from a SequenceDescriptor agree with the ids they came from.
#include <cstdint>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_from_descriptor_test {

using namespace seqattn;

TEST_CASE("A SequenceDescriptor's segment ids and positions drive the document mask (E4, E9)") {
  SECTION("E4: bottom-right causal cross-attention") {
    const std::vector<std::int32_t> q_ids{1, 1, 1, 0, 2, 2, 2, 2}, q_pos{0, 1, 2, 3, 0, 1, 2, 3};
    const std::vector<std::int32_t> kv_ids{1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    const std::vector<std::int32_t> kv_pos{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    const SequenceDescriptor d = SequenceDescriptor::from_segment_ids_and_pos(
        QkvPair<TensorView<const std::int32_t>>{TensorView<const std::int32_t>(q_ids.data(), Extents{1, 8}),
                                                TensorView<const std::int32_t>(kv_ids.data(), Extents{1, 16})},
        QkvPair<TensorView<const std::int32_t>>{TensorView<const std::int32_t>(q_pos.data(), Extents{1, 8}),
                                                TensorView<const std::int32_t>(kv_pos.data(), Extents{1, 16})});
    const DocumentLayout layout = document_layout(d);
    const auto mask = document_mask(layout, CausalMask{Alignment::bottom_right});
    const std::vector<std::pair<index_t, index_t>> rows{{0, 1},  {0, 2},  {0, 3},  {1, 0},
                                                        {6, 12}, {6, 13}, {6, 14}, {6, 15}};
    for (index_t q = 0; q < 8; ++q) {
      for (index_t kv = 0; kv < 16; ++kv) {
        const auto [lo, hi] = rows[static_cast<std::size_t>(q)];
        CHECK(mask.allowed({0, 0, 8, 16}, q, kv) == (kv >= lo && kv <= hi));
      }
    }
    const BlockMask bm = build_block_mask(mask, layout.lengths(), 1, {4, 4});
    CHECK(to_ascii(bm, 0) == "+...\n.+#+\n");
  }
  SECTION("E9: extra leading dim, positions broadcast") {
    const std::vector<std::int32_t> ids{1, 1, 1, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1, 1, 0};
    const std::vector<std::int32_t> pos{0, 1, 2, 0, 1, 2, 3, 0};
    // Positions (1, 8) broadcast over the extra dim of ids (2, 1, 8); the
    // second slice's single segment has positions 0 1 2 0 ..., which do not
    // count up, so it is rejected with the token named.
    const SequenceDescriptor bad =
        SequenceDescriptor::from_segment_ids_and_pos(TensorView<const std::int32_t>(ids.data(), Extents{2, 1, 8}),
                                                     TensorView<const std::int32_t>(pos.data(), Extents{1, 8}));
    CHECK_THROWS_WITH(document_layout(bad), Catch::Matchers::Contains("must count up by one, got 0 at token 3"));
    // With the first slice alone it works, and rows are (E, B) flattened.
    const SequenceDescriptor good =
        SequenceDescriptor::from_segment_ids_and_pos(TensorView<const std::int32_t>(ids.data(), Extents{1, 1, 8}),
                                                     TensorView<const std::int32_t>(pos.data(), Extents{1, 8}));
    const DocumentLayout layout = document_layout(good);
    CHECK(layout.batch() == 1);
    CHECK(to_ascii(document_mask(layout, CausalMask{}), {0, 0, 8, 8}) ==
          "#.......\n##......\n###.....\n...#....\n...##...\n...###..\n...####.\n........\n");
  }
  SECTION("Descriptors without segment ids are refused") {
    const std::vector<std::int32_t> lens{3, 2};
    const SequenceDescriptor d =
        SequenceDescriptor::from_seqlens(TensorView<const std::int32_t>(lens.data(), Extents{2}));
    CHECK_THROWS_WITH(document_layout(d), Catch::Matchers::Contains("must be built with from_segment_ids_and_pos"));
  }
}

}  // namespace seqattn_test_masks_from_descriptor_test
