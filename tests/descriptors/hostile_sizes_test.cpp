// Issue 14 ("Memory safety under hostile sizes"): descriptor findings as
// regression tests, and the pack_segments success path that built an error
// message per row.
#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_hostile_sizes_test {

using namespace seqattn;

namespace {
// One row of 4 tokens: segments [0, 2) and [2, 4).
SeqlensAndOffsets two_segments() {
  const std::vector<std::int32_t> ids{1, 1, 2, 2}, pos{0, 1, 0, 1};
  return derive_seqlens_and_offsets(Int32View(ids.data(), Extents{1, 4}), Int32View(pos.data(), Extents{1, 4}),
                                    AttnMaskType::padding_causal, SeqLayout::thd, {}, 2);
}
}  // namespace

TEST_CASE("issue 14 #14: pack_segments checks rows * S in 64 bits") {
  const SeqlensAndOffsets rows = two_segments();
  CHECK_THROWS_WITH(pack_segments(rows, {index_t{1} << 62, index_t{1} << 62}), ContainsSubstring("overflow int32"));
  const PackedSegments p = pack_segments(rows);
  CHECK(p.num_segments == 2);
  CHECK(p.total_tokens.q == 4);
}

TEST_CASE("issue 14 #15: descriptors of a huge broadcast view are refused, not silently empty") {
  const std::int32_t zero = 0;
  const Int32View ids(&zero, Extents{index_t{1} << 32, index_t{1} << 32, 1, 1}, Strides{0, 0, 0, 0});
  CHECK_THROWS_AS(derive_seqlens_and_offsets(ids, ids, AttnMaskType::padding, SeqLayout::bshd),
                  seqattn::invalid_argument);
  const Int32View wide(&zero, Extents{index_t{1} << 40, 4}, Strides{0, 0});
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(wide, wide),
                    ContainsSubstring("q_segment_ids") && ContainsSubstring("kMaxTensorElements"));
}

TEST_CASE("issue 14: unvalidated descriptor sizes are refused before allocation") {
  const std::int32_t zero = 0;
  const Int32View negative(&zero, Extents{1, -1}, Strides{0, 0});
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(negative, negative),
                    ContainsSubstring("negative extent"));
  const std::vector<std::int32_t> ids{1, 1}, pos{0, 1};
  const Int32View idv(ids.data(), Extents{1, 2}), posv(pos.data(), Extents{1, 2});
  CHECK_THROWS_WITH(derive_seqlens_and_offsets(idv, posv, AttnMaskType::padding_causal, SeqLayout::thd, {}, 1 << 30),
                    ContainsSubstring("kMaxSegmentsPerSeq"));
  const SeqlensAndOffsets rows = two_segments();
  CHECK_THROWS_WITH(segment_ids_from_seqlens_and_offsets(rows.seqlens.q, rows.offsets.q, index_t{1} << 40),
                    ContainsSubstring("2^31 - 1"));
}

TEST_CASE("issue 14: pack_segments packs 1M one-segment rows") {
  // 1M rows of one segment each; before the fix the per-row error-message
  // string made this take seconds (speed is measured in bench/, not here).
  const index_t rows = 1 << 20;
  std::vector<std::int32_t> lens(static_cast<std::size_t>(rows) * 2, 0), offs(static_cast<std::size_t>(rows) * 3, -1);
  for (index_t r = 0; r < rows; ++r) {
    lens[static_cast<std::size_t>(r * 2)] = 1;
    offs[static_cast<std::size_t>(r * 3)] = 0;
  }
  SeqlensAndOffsets d;
  d.layout = SeqLayout::thd;
  d.seqlens = {Tensor<std::int32_t>(Extents{rows, 2}, lens), Tensor<std::int32_t>(Extents{rows, 2}, lens)};
  d.offsets = {Tensor<std::int32_t>(Extents{rows, 3}, offs), Tensor<std::int32_t>(Extents{rows, 3}, offs)};
  const PackedSegments p = pack_segments(d, {1, 1});
  CHECK(p.num_segments == rows);
}

}  // namespace seqattn_test_descriptors_hostile_sizes_test
