// Every error path: bad input throws seqattn::invalid_argument naming the
// argument, the shapes, the row and the offending token.
#include <cstdint>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "descriptor_oracle.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_errors_test {

using namespace seqattn;
using Catch::Matchers::Contains;
using seqattn::testing::make;
using I32 = Tensor<std::int32_t>;

TEST_CASE("Mask-type strings parse like TE's canonicalize_attn_mask_type") {
  CHECK(parse_attn_mask_type("no_mask") == AttnMaskType::no_mask);
  CHECK(parse_attn_mask_type("padding") == AttnMaskType::padding);
  CHECK(parse_attn_mask_type("causal") == AttnMaskType::causal);
  for (const char* s : {"causal_bottom_right", "bottom_right_causal"}) {
    CHECK(parse_attn_mask_type(s) == AttnMaskType::causal_bottom_right);
  }
  for (const char* s : {"padding_causal", "causal_padding"})
    CHECK(parse_attn_mask_type(s) == AttnMaskType::padding_causal);
  for (const char* s : {"padding_causal_bottom_right", "causal_padding_bottom_right", "bottom_right_causal_padding",
                        "bottom_right_padding_causal"}) {
    CHECK(parse_attn_mask_type(s) == AttnMaskType::padding_causal_bottom_right);
  }
  for (int code = 0; code < 6; ++code) {
    const auto m = static_cast<AttnMaskType>(code);
    CHECK(parse_attn_mask_type(to_string(m)) == m);
    CHECK(is_padding(m) == (code == 1 || code == 3 || code == 5));
    CHECK(is_causal(m) == (code >= 2));
    CHECK(is_bottom_right(m) == (code >= 4));
  }
  CHECK_THROWS_WITH(parse_attn_mask_type("sliding"), Contains("Unsupported attn_mask_type=\"sliding\""));
  CHECK_THROWS_AS(parse_attn_mask_type("Causal"), seqattn::invalid_argument);
}

TEST_CASE("Shape errors name both sides' shapes") {
  const I32 ids(Extents{2, 8}), pos(Extents{2, 8});
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(I32(Extents{8}), I32(Extents{8})),
                    Contains("segment_ids must have at least two dims") && Contains("q_segment_ids.shape=(8,)"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(ids, I32(Extents{})),
                    Contains("positions are mandatory"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos({ids, I32(Extents{3, 8})}, {pos, I32(Extents{8})}),
                    Contains("same batch size B (2 vs 3)"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos({I32(Extents{2, 3, 1, 8}), I32(Extents{3, 2, 1, 8})},
                                                                 {I32(Extents{1, 8}), I32(Extents{1, 8})}),
                    Contains("extra (vmapped) batch dims of q_segment_ids and kv_segment_ids disagree") &&
                        Contains("q_segment_ids.shape=(2, 3, 1, 8) has extras (2, 3)") &&
                        Contains("kv_segment_ids.shape=(3, 2, 1, 8) has extras (3, 2)"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos({I32(Extents{2, 1, 8}), I32(Extents{3, 1, 8})},
                                                                 {I32(Extents{1, 8}), I32(Extents{1, 8})}),
                    Contains("has extras (2,)") && Contains("has extras (3,)"));
  CHECK_THROWS_WITH(derive_seqlens_and_offsets(ids, pos, AttnMaskType::padding, SeqLayout::thd, {}, 0),
                    Contains("max_segments_per_seq must be >= 1, got 0"));
}

TEST_CASE("One-sided extras: the side without extras is shared by every slice") {
  // q vmapped over 2 slices; kv has no extras and serves both.
  const I32 q_ids = make({2, 1, 4}, {1, 1, 2, 2, 1, 1, 1, 1});
  const I32 q_pos = make({1, 4}, {0, 1, 0, 1});
  const I32 kv_ids = make({1, 4}, {1, 1, 2, 2});
  const I32 kv_pos = make({1, 4}, {0, 1, 0, 1});
  const auto d =
      derive_seqlens_and_offsets({q_ids, kv_ids}, {q_pos, kv_pos}, AttnMaskType::padding, SeqLayout::thd, {}, 2);
  CHECK(d.seqlens.q.shape() == Extents{2, 1, 2});
  CHECK(d.seqlens.kv.shape() == Extents{2, 1, 2});
  CHECK(seqattn::testing::values(d.seqlens.q) == std::vector<int>{2, 2, 4, 0});
  CHECK(seqattn::testing::values(d.seqlens.kv) == std::vector<int>{2, 2, 2, 0});
}

TEST_CASE("Id errors name the argument, shape, row (with its multi-index) and token") {
  const auto derive = [](const I32& ids, int m, AttnMaskType mask = AttnMaskType::padding_causal) {
    const I32 pos(Extents{ids.extent(-1)});
    return derive_seqlens_and_offsets(ids, pos, mask, SeqLayout::thd, {}, m);
  };
  CHECK_THROWS_WITH(derive(make({1, 4}, {1, -1, 0, 0}), 2),
                    Contains("q_segment_ids of shape (1, 4), row 0, token 1: negative segment id -1"));
  CHECK_THROWS_WITH(
      derive(make({2, 3, 4}, {1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 2, 3, 0, 0, 0, 0, 0}), 2),
      Contains("q_segment_ids of shape (2, 3, 4), row 4 (index (1, 1)), token 2: segment id 3 exceeds "
               "max_segments_per_seq=2"));
  CHECK_THROWS_WITH(derive(make({1, 5}, {1, 2, 2, 1, 0}), 3), Contains("segment id 1 appears again"));
  CHECK_THROWS_WITH(derive(make({1, 5}, {0, 0, 2, 2, 0}), 3),
                    Contains("token 2: segment id 2 follows the row start; expected id 1"));
  // kv ids are checked too, and named.
  const I32 q = make({1, 4}, {1, 1, 0, 0}), kv = make({1, 4}, {1, 3, 0, 0}), pos(Extents{4});
  CHECK_THROWS_WITH(derive_seqlens_and_offsets({q, kv}, {pos, pos}, AttnMaskType::padding, SeqLayout::thd, {}, 3),
                    Contains("kv_segment_ids of shape (1, 4), row 0, token 1: segment id 3 follows segment 1"));
}

TEST_CASE("Active tokens with holes (non-monotone positions) are refused, naming the positions") {
  // kv positions 0, 5, 1: under causal, q (max pos 1) attends kv tokens 0 and 2 but not 1.
  const I32 q_ids = make({1, 2}, {1, 1}), q_pos = make({1, 2}, {0, 1});
  const I32 kv_ids = make({1, 3}, {1, 1, 1}), kv_pos = make({1, 3}, {0, 5, 1});
  CHECK_THROWS_WITH(
      derive_seqlens_and_offsets({q_ids, kv_ids}, {q_pos, kv_pos}, AttnMaskType::causal, SeqLayout::thd, {}, 1),
      Contains("kv_segment_pos of shape (1, 3), row 0: under mask causal the tokens of segment 1") &&
          Contains("not contiguous (2 active tokens between tokens 0 and 2)"));
  // Without causality every token attends: fine.
  CHECK_NOTHROW(
      derive_seqlens_and_offsets({q_ids, kv_ids}, {q_pos, kv_pos}, AttnMaskType::padding, SeqLayout::thd, {}, 1));
}

TEST_CASE("BSHD rows must be one right-padded sequence") {
  const I32 pos(Extents{4});
  const auto derive = [&](std::initializer_list<int> v) {
    return derive_seqlens_and_offsets(make({1, 4}, v), pos, AttnMaskType::padding, SeqLayout::bshd);
  };
  CHECK_THROWS_WITH(derive({1, 1, 2, 0}),
                    Contains("token 2: segment id 2 differs from the row's id 1") && Contains("holds one sequence"));
  CHECK_THROWS_WITH(derive({0, 1, 1, 0}),
                    Contains("token 1: segment id 1 after padding at token 0") && Contains("right-padded"));
  CHECK_THROWS_WITH(derive({1, 0, 1, 0}), Contains("token 2: segment id 1 after padding at token 1"));
  CHECK_THROWS_WITH(derive({-2, 0, 0, 0}), Contains("token 0: negative segment id -2"));
  CHECK_THROWS_WITH(derive({1, 1, -1, 0}), Contains("token 2: negative segment id -1"));
  CHECK(derive({0, 0, 0, 0}).seqlens.q.data()[0] == 0);
}

TEST_CASE("Descriptors built from seqlens check shapes, values and layout") {
  CHECK_THROWS_WITH(SequenceDescriptor::from_seqlens(make({3}, {2, -1, 4})),
                    Contains("q_seqlens of shape (3,): negative length -1 at flat index 1"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_seqlens({make({2}, {1, 2}), make({3}, {1, 2, 3})}),
                    Contains("must share a shape (*E, B); got (2,) and (3,)"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_seqlens_and_offsets(make({1, 2}, {1, 2}), make({1, 2}, {0, 1})),
                    Contains("q_seq_offsets (*E, B, N+1); got (1, 2) and (1, 2)"));
  const auto bshd = SequenceDescriptor::from_seqlens(make({2}, {3, 1}));
  CHECK(bshd.source() == SequenceDescriptor::Source::seqlens);
  CHECK_THROWS_WITH(bshd.get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::thd),
                    Contains("from_seqlens describes BSHD rows, not thd"));
  const auto thd = SequenceDescriptor::from_seqlens_and_offsets(make({1, 2}, {2, 1}), make({1, 3}, {0, 2, -1}));
  CHECK_THROWS_WITH(thd.get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::bshd),
                    Contains("from_seqlens_and_offsets describes THD, not bshd"));
  CHECK_THROWS_WITH(pack_segments(thd.get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::thd)),
                    Contains("pass seq_len"));
  CHECK_THROWS_WITH(pack_segments(bshd.get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::bshd), {2, 4}),
                    Contains("q_seqlens row 0: length 3 outside [0, 2]"));
}

TEST_CASE("Packing refuses descriptors whose segments cannot be paired") {
  const auto pack = [](const I32& lens, const I32& offs, index_t s) {
    return pack_segments(SequenceDescriptor::from_seqlens_and_offsets(lens, offs)
                             .get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::thd),
                         {s, s});
  };
  CHECK_THROWS_WITH(pack(make({1, 2}, {3, 3}), make({1, 3}, {0, 2, -1}), 8),
                    Contains("q_seqlens / q_offsets row 0: segment of length 3 at offset 2 overlaps the previous "
                             "segment (ending at 3)"));
  CHECK_THROWS_WITH(pack(make({1, 2}, {3, 3}), make({1, 3}, {0, 6, -1}), 8), Contains("leaves the row of 8 tokens"));
  CHECK_THROWS_WITH(pack(make({1, 2}, {3, 0}), make({1, 3}, {0, 3, -1}), 8),
                    Contains("2 non-negative offsets for 1 positive seqlens"));
  CHECK_THROWS_WITH(pack(make({2, 1, 2}, {1, 1, 1, 1}), make({2, 1, 3}, {0, 1, -1, 0, -1, -1}), 4),
                    Contains("row 1 (index (1, 0))"));
  // Segments of a row must pair up between q and kv.
  const auto d = SequenceDescriptor::from_seqlens_and_offsets({make({1, 2}, {2, 2}), make({1, 2}, {4, 0})},
                                                              {make({1, 3}, {0, 2, -1}), make({1, 3}, {0, -1, -1})})
                     .get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::thd);
  CHECK_THROWS_WITH(pack_segments(d, {4, 4}), Contains("row 0 has 2 non-empty q segments but 1 non-empty kv segments"));
  // Global offsets must fit int32.
  const auto big = SequenceDescriptor::from_seqlens(make({2}, {1, 1}))
                       .get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::bshd);
  CHECK_THROWS_WITH(pack_segments(big, {index_t{1} << 31, 1}), Contains("overflow int32 global offsets"));
  CHECK_THROWS_WITH(segment_ids_from_seqlens_and_offsets(make({1, 2}, {1, 1}), make({2, 3}, {0, 1, -1, 0, 1, -1}), 4),
                    Contains("must share (*E, B)"));
}

}  // namespace seqattn_test_descriptors_errors_test
