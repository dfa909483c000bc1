// Issue 21 (Python fuzz finding): representations took time and scratch per
// row of a sequence even when the result is empty (pack_bits of 2^63 - 1
// queries and no keys never returned), and lengths past the limits ended in
// std::length_error / std::bad_alloc instead of an error naming the length.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_representation_lengths_test {

using namespace seqattn;

namespace {
constexpr index_t kI64Max = std::numeric_limits<index_t>::max();
constexpr index_t kLimit = limits::kMaxTensorElements;
}  // namespace

TEST_CASE("issue 21: pack_bits of sequences without keys or queries returns at once") {
  // Type-erased, as the Python bindings call it: nothing lets the compiler drop the row loop.
  const PackedMask no_keys = pack_bits(AnyMask(FullMask{}), RaggedLengths::uniform(2, kLimit, 0));
  CHECK(no_keys.bits.empty());
  CHECK(no_keys.indptr == std::vector<index_t>{0, 0, 0});
  // Per head: one (empty) segment per sequence and head.
  const SlidingWindowMask windows[] = {SlidingWindowMask{1, 0}, SlidingWindowMask{0, 1}};
  const PerHeadMask<SlidingWindowMask> per_head{windows};
  const PackedMask no_queries = pack_bits(per_head, RaggedLengths{{0, 2}, {kLimit, 3}}, 2);
  CHECK(no_queries.indptr == std::vector<index_t>{0, 0, 0, 1, 2});
  CHECK(no_queries.bits == pack_bits(per_head, RaggedLengths{{2}, {3}}, 2).bits);
}

TEST_CASE("issue 21: to_dense of a sequence without queries allocates no row scratch") {
  const Tensor<std::uint8_t> dense = to_dense(FullMask{}, RaggedLengths::uniform(1, 0, kLimit));
  CHECK(dense.shape() == Extents{1, 1, 0, kLimit});
  CHECK(dense.size() == 0);
}

TEST_CASE("issue 21: representations reject lengths past limits::kMaxTensorElements, naming them") {
  for (const index_t huge : {kLimit + 1, index_t{1} << 62, kI64Max}) {
    CAPTURE(huge);
    CHECK_THROWS_WITH(
        pack_bits(FullMask{}, RaggedLengths::uniform(1, huge, 0)),
        ContainsSubstring("pack_bits") && ContainsSubstring("q_len of sequence 0 is " + std::to_string(huge)));
    CHECK_THROWS_WITH(pack_bits(CausalMask{}, RaggedLengths{{3, 0}, {3, huge}}),
                      ContainsSubstring("kv_len of sequence 1 is " + std::to_string(huge)));
    CHECK_THROWS_WITH(
        to_dense(FullMask{}, RaggedLengths::uniform(1, 0, huge)),
        ContainsSubstring("to_dense") && ContainsSubstring("kv_len of sequence 0 is " + std::to_string(huge)));
    CHECK_THROWS_AS(to_additive(FullMask{}, RaggedLengths::uniform(1, huge, 0)), seqattn::invalid_argument);
  }
}

}  // namespace seqattn_test_masks_representation_lengths_test
