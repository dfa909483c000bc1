// The worked vectors E1-E11 of docs/semantics/sequence-descriptors.md §5. Where TE's
// result differs from the reference (slow path) semantics, the test asserts
// the reference result and says so in its name.
#include <cstdint>
#include <string>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "descriptor_oracle.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_spec_vectors_test {

using namespace seqattn;
using seqattn::testing::make;
using seqattn::testing::values;
using V = std::vector<int>;

namespace {

SeqlensAndOffsets derive_self(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& pos, AttnMaskType mask,
                              int m, WindowSize window = {}) {
  return SequenceDescriptor::from_segment_ids_and_pos(ids, pos).get_seqlens_and_offsets(mask, SeqLayout::thd, window,
                                                                                        m);
}

SeqlensAndOffsets derive_cross(const Tensor<std::int32_t>& q_ids, const Tensor<std::int32_t>& q_pos,
                               const Tensor<std::int32_t>& kv_ids, const Tensor<std::int32_t>& kv_pos,
                               AttnMaskType mask, int m, WindowSize window = {}) {
  return SequenceDescriptor::from_segment_ids_and_pos({q_ids, kv_ids}, {q_pos, kv_pos})
      .get_seqlens_and_offsets(mask, SeqLayout::thd, window, m);
}

}  // namespace

TEST_CASE("E1: THD basic, any window, packed for the kernel") {
  const auto ids = make({1, 8}, {1, 1, 2, 2, 2, 0, 0, 0});
  const auto pos = make({1, 8}, {0, 1, 0, 1, 2, 0, 0, 0});
  for (WindowSize w : {WindowSize{}, WindowSize{2, 0}}) {
    const auto d = derive_self(ids, pos, AttnMaskType::padding_causal, 3, w);
    for (const auto* t : {&d.seqlens.q, &d.seqlens.kv}) {
      CHECK(t->shape() == Extents{1, 3});
      CHECK(values(*t) == V{2, 3, 0});
    }
    for (const auto* t : {&d.offsets.q, &d.offsets.kv}) {
      CHECK(t->shape() == Extents{1, 4});
      CHECK(values(*t) == V{0, 2, -1, -1});
    }
    const PackedSegments p = pack_segments(d);
    CHECK(values(p.seqlens.q) == V{2, 3, 0});
    CHECK(values(p.offsets.q) == V{0, 2, 8, 8});
    CHECK(values(p.cu_seqlens.q) == V{0, 2, 5, 5});
    CHECK(values(p.cu_seqlens.kv) == V{0, 2, 5, 5});
    CHECK(p.num_segments == 2);
    const SegmentTable table = p.table();
    CHECK(table.size() == 2);
    CHECK(values(table.q_offsets) == V{0, 2});
    CHECK(values(table.kv_lens) == V{2, 3});
    table.validate(p.total_tokens.q, p.total_tokens.kv);
  }
}

TEST_CASE("E2: intra-segment padding") {
  const auto d = derive_self(make({1, 8}, {1, 1, 1, 0, 2, 2, 0, 0}), make({1, 8}, {0, 1, 2, 3, 0, 1, 2, 3}),
                             AttnMaskType::padding_causal, 2);
  CHECK(values(d.seqlens.q) == V{3, 2});
  CHECK(values(d.offsets.q) == V{0, 4, -1});
  CHECK(values(d.seqlens.kv) == V{3, 2});
  CHECK(values(d.offsets.kv) == V{0, 4, -1});
}

TEST_CASE("E3: B=2, fused_attn docstring data, packed across the batch") {
  const auto d = derive_self(make({2, 4}, {1, 1, 2, 3, 1, 1, 2, 0}), make({2, 4}, {0, 1, 0, 0, 0, 1, 0, 1}),
                             AttnMaskType::padding_causal, 3);
  CHECK(values(d.seqlens.q) == V{2, 1, 1, 2, 1, 0});
  CHECK(values(d.offsets.q) == V{0, 2, 3, -1, 0, 2, -1, -1});
  const PackedSegments p = pack_segments(d);
  CHECK(p.seqlens.q.shape() == Extents{2, 3});
  CHECK(values(p.seqlens.q) == V{2, 1, 1, 2, 1, 0});
  CHECK(p.offsets.q.shape() == Extents{2, 4});
  CHECK(values(p.offsets.q) == V{0, 2, 3, 4, 6, 8, 8, 8});
  CHECK(values(p.cu_seqlens.q) == V{0, 2, 3, 4, 6, 7, 7});
  const SegmentTable t = p.table();
  CHECK(values(t.q_offsets) == V{0, 2, 3, 4, 6});
  CHECK(values(t.q_lens) == V{2, 1, 1, 2, 1});
}

TEST_CASE("E3: the docstring's end-offset convention is rejected instead of misaligning row 1 (TE quirk D2)") {
  const auto lens = make({2, 4}, {2, 1, 1, -1, 2, 1, -1, -1});
  const auto offs = make({2, 5}, {0, 2, 3, 4, -1, 0, 2, 3, -1, -1});
  const auto d = SequenceDescriptor::from_seqlens_and_offsets(lens, offs)
                     .get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd);
  CHECK_THROWS_WITH(pack_segments(d, {4, 4}), Catch::Matchers::Contains("row 0: 4 non-negative offsets for 3 positive "
                                                                        "seqlens") &&
                                                  Catch::Matchers::Contains("segment starts only"));
  // The start-offset convention of the same data packs as in E3.
  const auto good =
      SequenceDescriptor::from_seqlens_and_offsets(lens, make({2, 5}, {0, 2, 3, -1, -1, 0, 2, -1, -1, -1}))
          .get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd);
  const PackedSegments p = pack_segments(good, {4, 4});
  CHECK(values(p.seqlens.q) == V{2, 1, 1, 2, 1, 0, 0, 0});
  CHECK(values(p.offsets.q) == V{0, 2, 3, 4, 6, 8, 8, 8, 8, 8});
  CHECK(values(p.cu_seqlens.q) == V{0, 2, 3, 4, 6, 7, 7, 7, 7});
}

TEST_CASE("E4: bottom-right causal cross-attention (slow path)") {
  const auto q_ids = make({1, 8}, {1, 1, 1, 0, 2, 2, 2, 2});
  const auto q_pos = make({1, 8}, {0, 1, 2, 3, 0, 1, 2, 3});
  const auto kv_ids = make({1, 16}, {1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2});
  const auto kv_pos = make({1, 16}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  for (AttnMaskType mask : {AttnMaskType::causal_bottom_right, AttnMaskType::padding_causal_bottom_right}) {
    const auto d = derive_cross(q_ids, q_pos, kv_ids, kv_pos, mask, 2);
    CHECK(values(d.seqlens.q) == V{3, 4});
    CHECK(values(d.seqlens.kv) == V{4, 10});
    CHECK(values(d.offsets.q) == V{0, 4, -1});
    CHECK(values(d.offsets.kv) == V{0, 6, -1});
  }
  // The spec's dense allow mask, rows = q (checks the oracle's predicate).
  const auto a = seqattn::testing::dense_mask({values(q_ids), values(q_pos)}, {values(kv_ids), values(kv_pos)},
                                              AttnMaskType::padding_causal_bottom_right, nullptr);
  const auto allowed = [&](std::size_t i) {
    V cols;
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      if (a[i][j]) cols.push_back(static_cast<int>(j));
    }
    return cols;
  };
  CHECK(allowed(0) == V{0, 1});
  CHECK(allowed(2) == V{0, 1, 2, 3});
  CHECK(allowed(3).empty());
  CHECK(allowed(4) == V{6, 7, 8, 9, 10, 11, 12});
  CHECK(allowed(7) == V{6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
}

TEST_CASE("E4: top-left causal cross-attention trims keys (slow-path reference, TE fast path keeps kv_seqlen 3,9)") {
  const auto d =
      derive_cross(make({1, 8}, {1, 1, 1, 0, 2, 2, 2, 2}), make({1, 8}, {0, 1, 2, 3, 0, 1, 2, 3}),
                   make({1, 16}, {1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}),
                   make({1, 16}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), AttnMaskType::padding_causal, 2);
  CHECK(values(d.seqlens.q) == V{3, 4});
  CHECK(values(d.seqlens.kv) == V{3, 4});
  CHECK(values(d.offsets.q) == V{0, 4, -1});
  CHECK(values(d.offsets.kv) == V{0, 6, -1});
}

TEST_CASE("E5: striped-CP-like causal (slow path, TE's fast path agrees here)") {
  const auto d = derive_cross(make({1, 4}, {1, 1, 2, 2}), make({1, 4}, {0, 2, 0, 2}), make({1, 4}, {1, 1, 2, 2}),
                              make({1, 4}, {1, 3, 1, 3}), AttnMaskType::causal, 2);
  CHECK(values(d.seqlens.q) == V{1, 1});
  CHECK(values(d.seqlens.kv) == V{1, 1});
  CHECK(values(d.offsets.q) == V{1, 3, -1});
  CHECK(values(d.offsets.kv) == V{0, 2, -1});
}

TEST_CASE(
    "E6: padding-only with a segment missing from kv (slow-path reference, TE's fused_attn fast path trims kv, "
    "quirk D3)") {
  for (WindowSize w : {WindowSize{}, WindowSize{-1, -1}, WindowSize{3, 3}}) {
    const auto d = derive_cross(make({1, 4}, {1, 1, 2, 2}), make({1, 4}, {0, 1, 0, 1}), make({1, 4}, {1, 1, 1, 0}),
                                make({1, 4}, {0, 1, 2, 0}), AttnMaskType::padding, 2, w);
    CHECK(values(d.seqlens.q) == V{2, 0});
    CHECK(values(d.seqlens.kv) == V{3, 0});
    CHECK(values(d.offsets.q) == V{0, -1, -1});
    CHECK(values(d.offsets.kv) == V{0, -1, -1});
    const PackedSegments p = pack_segments(d);
    CHECK(p.num_segments == 1);
    CHECK(values(p.cu_seqlens.kv) == V{0, 3, 3});
  }
}

TEST_CASE("E7: more segments than max_segments_per_seq is an error (TE silently drops ids 3 and 4)") {
  const auto ids = make({1, 6}, {1, 2, 3, 4, 0, 0});
  const auto pos = make({1, 6}, {0, 0, 0, 0, 0, 0});
  CHECK_THROWS_WITH(derive_self(ids, pos, AttnMaskType::padding_causal, 2),
                    Catch::Matchers::Contains("q_segment_ids of shape (1, 6), row 0, token 2: segment id 3 exceeds "
                                              "max_segments_per_seq=2"));
  // With enough slots every segment is kept.
  const auto d = derive_self(ids, pos, AttnMaskType::padding_causal, 4);
  CHECK(values(d.seqlens.q) == V{1, 1, 1, 1});
  CHECK(values(d.offsets.q) == V{0, 1, 2, 3, -1});
  CHECK(values(pack_segments(d).cu_seqlens.q) == V{0, 1, 2, 3, 4});
}

TEST_CASE(
    "E8: B=2 cross-attention (slow-path reference, TE's fast path reads row 0's positions for row 1, quirk "
    "D1)") {
  const auto d = derive_cross(make({2, 4}, {1, 1, 0, 0, 1, 1, 1, 0}), make({2, 4}, {0, 1, 0, 0, 0, 1, 2, 0}),
                              make({2, 4}, {1, 1, 1, 1, 0, 1, 1, 1}), make({2, 4}, {0, 1, 2, 3, 0, 0, 1, 2}),
                              AttnMaskType::padding_causal, 2);
  CHECK(values(d.seqlens.q) == V{2, 0, 3, 0});
  CHECK(values(d.seqlens.kv) == V{2, 0, 3, 0});
  CHECK(values(d.offsets.q) == V{0, -1, -1, 0, -1, -1});
  CHECK(values(d.offsets.kv) == V{0, -1, -1, 1, -1, -1});
  // Each row's result is independent of the other rows.
  const auto row1 = derive_cross(make({1, 4}, {1, 1, 1, 0}), make({1, 4}, {0, 1, 2, 0}), make({1, 4}, {0, 1, 1, 1}),
                                 make({1, 4}, {0, 0, 1, 2}), AttnMaskType::padding_causal, 2);
  CHECK(values(row1.seqlens.q) == V{3, 0});
  CHECK(values(row1.offsets.kv) == V{1, -1, -1});
}

TEST_CASE("E9: THD with an extra vmapped dim, positions broadcast") {
  const auto ids = make({2, 1, 8}, {1, 1, 1, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1, 1, 0});
  const auto pos = make({1, 8}, {0, 1, 2, 0, 1, 2, 3, 0});
  const auto d = derive_self(ids, pos, AttnMaskType::padding_causal, 2);
  CHECK(d.seqlens.q.shape() == Extents{2, 1, 2});
  CHECK(values(d.seqlens.q) == V{3, 4, 7, 0});
  CHECK(d.offsets.kv.shape() == Extents{2, 1, 3});
  CHECK(values(d.offsets.kv) == V{0, 3, -1, 0, -1, -1});

  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(Tensor<std::int32_t>(Extents{1, 8}),
                                                                 Tensor<std::int32_t>(Extents{2, 1, 8})),
                    Catch::Matchers::Contains("segment_ids must not have fewer dims than segment_pos") &&
                        Catch::Matchers::Contains("q_segment_ids.ndim=2, q_segment_pos.ndim=3"));
  CHECK_THROWS_WITH(SequenceDescriptor::from_segment_ids_and_pos(Tensor<std::int32_t>(Extents{2, 1, 8}),
                                                                 Tensor<std::int32_t>(Extents{1, 7})),
                    Catch::Matchers::Contains("segment_pos trailing shape must match segment_ids") &&
                        Catch::Matchers::Contains("q_segment_ids.shape=(2, 1, 8), q_segment_pos.shape=(1, 7)"));
}

TEST_CASE("E10: BSHD seqlens, including vmapped ids") {
  const auto ids = make({2, 4}, {1, 1, 1, 0, 1, 1, 0, 0});
  const auto d = SequenceDescriptor::from_segment_ids_and_pos(ids, make({4}, {0, 1, 2, 3}))
                     .get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::bshd);
  CHECK(d.seqlens.q.shape() == Extents{2});
  CHECK(values(d.seqlens.q) == V{3, 2});
  CHECK(values(d.seqlens.kv) == V{3, 2});
  CHECK(d.offsets.q.empty());

  const auto vmapped = make({2, 2, 4}, {1, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  const auto dv = SequenceDescriptor::from_segment_ids_and_pos(vmapped, make({2, 4}, {0, 1, 2, 3, 0, 1, 2, 3}))
                      .get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::bshd);
  CHECK(dv.seqlens.q.shape() == Extents{2, 2});
  CHECK(values(dv.seqlens.q) == V{3, 2, 1, 4});
}

TEST_CASE("E10: BSHD padding seqlens count tokens, where TE sums id values (2 instead of TE's 4)") {
  const auto d = SequenceDescriptor::from_segment_ids_and_pos(make({1, 4}, {2, 2, 0, 0}), make({1, 4}, {0, 1, 0, 0}))
                     .get_seqlens_and_offsets(AttnMaskType::padding, SeqLayout::bshd);
  CHECK(values(d.seqlens.q) == V{2});
}

TEST_CASE("E10: BSHD non-padding masks give the full length per row (TE: a 0-d scalar S)") {
  const auto ids = make({2, 4}, {1, 1, 1, 0, 1, 1, 0, 0});
  const auto pos = make({2, 4}, {0, 1, 2, 0, 0, 1, 0, 0});
  for (AttnMaskType mask : {AttnMaskType::no_mask, AttnMaskType::causal, AttnMaskType::causal_bottom_right}) {
    const auto d =
        SequenceDescriptor::from_segment_ids_and_pos(ids, pos).get_seqlens_and_offsets(mask, SeqLayout::bshd);
    CHECK(d.seqlens.q.shape() == Extents{2});
    CHECK(values(d.seqlens.q) == V{4, 4});
  }
}

TEST_CASE("E10: THD precondition violations are errors, not misaligned descriptors (TE quirk D5)") {
  const auto pos = make({1, 6}, {0, 1, 0, 1, 2, 0});
  const auto derive = [&](std::initializer_list<int> ids) {
    return derive_self(make({1, 6}, ids), pos, AttnMaskType::padding_causal, 3);
  };
  CHECK_THROWS_WITH(derive({1, 1, 3, 3, 0, 0}),
                    Catch::Matchers::Contains("token 2: segment id 3 follows segment 1; expected id 2"));
  CHECK_THROWS_WITH(derive({2, 2, 1, 1, 1, 0}),
                    Catch::Matchers::Contains("token 0: segment id 2 follows the row start; expected id 1"));
  CHECK_THROWS_WITH(derive({1, 1, 0, 1, 1, 0}), Catch::Matchers::Contains("token 3: segment id 1 appears again after "
                                                                          "its run ended at token 1"));
}

TEST_CASE("E11: mask predicates of the dense reference and of the kernel reading our descriptor") {
  struct Case {
    AttnMaskType mask;
    WindowSize window;
    int q_len, kv_len;
    std::vector<const char*> rows;
  };
  const std::vector<Case> cases = {
      {AttnMaskType::padding_causal, {2, 0}, 5, 5, {"10000", "11000", "11100", "01110", "00111"}},
      {AttnMaskType::padding, {1, 1}, 5, 5, {"11000", "11100", "01110", "00111", "00011"}},
      {AttnMaskType::padding_causal_bottom_right, {}, 3, 5, {"11100", "11110", "11111"}},
      {AttnMaskType::padding_causal_bottom_right, {1, 0}, 3, 5, {"01100", "00110", "00011"}},
      {AttnMaskType::padding_causal, {}, 3, 5, {"10000", "11000", "11100"}},
  };
  for (const Case& c : cases) {
    CAPTURE(to_string(c.mask), c.window.left, c.window.right);
    seqattn::testing::Row q{V(static_cast<std::size_t>(c.q_len), 1), {}},
        kv{V(static_cast<std::size_t>(c.kv_len), 1), {}};
    for (int i = 0; i < c.q_len; ++i) q.pos.push_back(i);
    for (int j = 0; j < c.kv_len; ++j) kv.pos.push_back(j);
    const auto dense = seqattn::testing::dense_mask(q, kv, c.mask, &c.window);
    // The kernel's view (docs/semantics/sequence-descriptors.md §4.2): local indices inside the packed segment.
    const auto d =
        derive_cross(seqattn::testing::make({1, c.q_len}, q.ids), seqattn::testing::make({1, c.q_len}, q.pos),
                     seqattn::testing::make({1, c.kv_len}, kv.ids), seqattn::testing::make({1, c.kv_len}, kv.pos),
                     c.mask, 1, c.window);
    const PackedSegments p = pack_segments(d);
    const auto kernel = seqattn::testing::kernel_mask(p.table(), c.q_len, c.kv_len, c.mask, c.window);
    for (int i = 0; i < c.q_len; ++i) {
      std::string dense_row, kernel_row;
      for (int j = 0; j < c.kv_len; ++j) {
        dense_row += dense[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] ? '1' : '0';
        kernel_row += kernel[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] ? '1' : '0';
      }
      CHECK(dense_row == c.rows[static_cast<std::size_t>(i)]);
      CHECK(kernel_row == c.rows[static_cast<std::size_t>(i)]);
    }
  }
}

}  // namespace seqattn_test_descriptors_spec_vectors_test
