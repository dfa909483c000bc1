// A DocumentMask hands its inner mask local coordinates: pos_begin plus the
// offset in the segment. With positions past the token count (a chunk of a
// long sequence) an inner mask that reads stored data must be checked for
// those coordinates, not for the batch's lengths, or it is read past its end
// (found by the Python fuzz target: a DocumentMask inside a DocumentMask).
#include <cstdint>
#include <numeric>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_document_inner_bounds_test {

using namespace seqattn;

TEST_CASE("DocumentMask checks its inner mask for the local coordinates positions give it",
          "[masks][document][errors]") {
  constexpr index_t kTokens = 6;
  const std::vector<std::int32_t> ids(kTokens, 1);
  std::vector<std::int32_t> positions(kTokens);
  std::iota(positions.begin(), positions.end(), 1000);  // local coordinates 1000..1005
  const TensorView<const std::int32_t> id_view(ids.data(), Extents{1, kTokens});
  const TensorView<const std::int32_t> pos_view(positions.data(), Extents{1, kTokens});
  const DocumentLayout outer = DocumentLayout::from_segment_ids(id_view, pos_view);
  const DocumentLayout inner = DocumentLayout::from_segment_ids(id_view);  // data for 6 x 6 coordinates
  const RaggedLengths lengths = RaggedLengths::uniform(1, kTokens, kTokens);

  SECTION("an inner mask with stored data for 6 tokens is refused, not read at 1000") {
    const auto mask = document_mask(outer, document_mask(inner));
    CHECK_THROWS_AS(to_dense(mask, lengths), invalid_argument);
    CHECK_THROWS_WITH(to_dense(mask, lengths), ContainsSubstring("1006"));
    CHECK_THROWS_AS(to_dense(document_mask(outer, AnyMask(document_mask(inner))), lengths), invalid_argument);
  }
  SECTION("a structural inner mask accepts any coordinates") {
    const Tensor<std::uint8_t> dense = to_dense(document_mask(outer, CausalMask{}), lengths);
    for (index_t q = 0; q < kTokens; ++q) {
      for (index_t kv = 0; kv < kTokens; ++kv) CHECK(dense.data()[q * kTokens + kv] == (kv <= q ? 1 : 0));
    }
  }
  SECTION("positions within the token count keep the batch's lengths") {
    const DocumentLayout plain = DocumentLayout::from_segment_ids(id_view);
    CHECK_NOTHROW(to_dense(document_mask(plain, document_mask(inner)), lengths));
  }
}

}  // namespace seqattn_test_masks_document_inner_bounds_test
