// SegmentIdGaps (descriptors/types.hpp): segment ids with gaps ([1, 1, 3, 3])
// are rejected by default and, with SegmentIdGaps::renumber, handled as
// TransformerEngine handles them (docs/semantics/sequence-descriptors.md
// §2.4, §2.8, §7.2; vector E10): seqlens by id, packing drops the empty slots.
// The oracle is descriptor_oracle.hpp's literal TE pipeline (dense mask,
// row_ids / col_ids, P by id value, TE's packing), which never renumbers.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "descriptor_oracle.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_segment_id_gaps_test {

using namespace seqattn;
namespace t = seqattn::testing;
using V = std::vector<int>;

namespace {

// A row of `len` tokens whose segments carry increasing ids in [1, m] with
// random gaps: t::random_ids' 1, 2, 3, ... mapped through a random
// increasing choice of ids.
V gapped_ids(std::mt19937& rng, index_t len, int m) {
  V ids = t::random_ids(rng, len, m);
  if (std::all_of(ids.begin(), ids.end(), [](int v) { return v == 0; })) return ids;
  V pool(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) pool[static_cast<std::size_t>(i)] = i + 1;
  std::shuffle(pool.begin(), pool.end(), rng);
  const int used = *std::max_element(ids.begin(), ids.end());
  pool.resize(static_cast<std::size_t>(used));
  std::sort(pool.begin(), pool.end());
  for (int& v : ids) v = v == 0 ? 0 : pool[static_cast<std::size_t>(v - 1)];
  return ids;
}

// Ids renumbered 1, 2, 3, ... in order of appearance (what the packing of a
// gapped self-attention row amounts to).
V renumbered(const V& ids) {
  V out(ids.size(), 0);
  int n = 0, last = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != 0 && ids[i] != last) ++n;
    if (ids[i] != 0) out[i] = n;
    last = ids[i];
  }
  return out;
}

V positions(std::mt19937& rng, const V& ids, bool arange) {
  if (arange) return t::arange_per_segment(ids);
  V pos(ids.size());
  int v = std::uniform_int_distribution<int>(0, 3)(rng);
  for (int& p : pos) p = v += std::uniform_int_distribution<int>(0, 2)(rng);
  return pos;
}

V non_negative(const std::int32_t* p, index_t n) {
  V out;
  for (index_t i = 0; i < n; ++i) {
    if (p[i] >= 0) out.push_back(p[i]);
  }
  return out;
}

bool has_gap(const V& ids) { return ids != renumbered(ids); }

}  // namespace

TEST_CASE("segment id gaps: E10's [1,1,3,3,0,0] throws by default and packs as TE's with renumber",
          "[descriptors][gaps]") {
  const auto ids = t::make({1, 6}, {1, 1, 3, 3, 0, 0});
  const auto pos = t::make({1, 6}, {0, 1, 0, 1, 0, 0});
  const auto desc = SequenceDescriptor::from_segment_ids_and_pos(ids, pos);
  CHECK_THROWS_WITH(desc.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, 3),
                    ContainsSubstring("segment id 3 follows segment 1; expected id 2") &&
                        ContainsSubstring("pass SegmentIdGaps::renumber"));
  const SeqlensAndOffsets d =
      desc.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, 3, SegmentIdGaps::renumber);
  // Per row: segment id s in slot s-1, as TE's seqlens; the slot of the missing id 2 is empty.
  CHECK(t::values(d.seqlens.q) == V{2, 0, 2});
  CHECK(t::values(d.offsets.q) == V{0, -1, 2, -1});
  const PackedSegments p = pack_segments(d);
  // E10: "packing repairs it to (0,2), (2,2)".
  CHECK(p.num_segments == 2);
  CHECK(t::values(p.seqlens.q) == V{2, 2, 0});
  CHECK(t::values(p.offsets.q) == V{0, 2, 6, 6});
  CHECK(t::values(p.cu_seqlens.q) == V{0, 2, 4, 4});
  CHECK(t::values(p.seqlens.kv) == t::values(p.seqlens.q));
  CHECK(t::values(p.offsets.kv) == t::values(p.offsets.q));
}

TEST_CASE("segment id gaps: what TE does not repair still throws with renumber", "[descriptors][gaps]") {
  const auto pos = t::make({1, 6}, {0, 1, 0, 1, 2, 0});
  const auto derive = [&](std::initializer_list<int> ids, int m) {
    return derive_seqlens_and_offsets(t::make({1, 6}, ids), pos, AttnMaskType::padding_causal, SeqLayout::thd, {}, m,
                                      SegmentIdGaps::renumber);
  };
  CHECK_NOTHROW(derive({2, 2, 5, 5, 5, 0}, 5));
  // Decreasing ids: TE pairs them with the wrong offsets (E10).
  CHECK_THROWS_WITH(derive({2, 2, 1, 1, 1, 0}, 3), ContainsSubstring("token 2: segment id 1 follows segment id 2") &&
                                                       ContainsSubstring("must increase along the row"));
  // A repeated id: not one contiguous run (E10).
  CHECK_THROWS_WITH(derive({1, 1, 0, 1, 1, 0}, 3), ContainsSubstring("segment id 1 appears again"));
  // Ids above max_segments_per_seq: TE drops their tokens (E7), gaps or not.
  CHECK_THROWS_WITH(derive({1, 1, 4, 4, 4, 0}, 3),
                    ContainsSubstring("token 2: segment id 4 exceeds max_segments_per_seq=3"));
  // BSHD ignores the option (one run per row, any id).
  CHECK(t::values(derive_seqlens_and_offsets(t::make({1, 6}, {3, 3, 3, 0, 0, 0}), pos, AttnMaskType::padding,
                                             SeqLayout::bshd, {}, 1, SegmentIdGaps::renumber)
                      .seqlens.q) == V{3});
}

TEST_CASE("segment id gaps: renumber equals TE's pipeline on random gapped rows, self and cross attention",
          "[descriptors][gaps]") {
  std::mt19937 rng(7707);
  int gapped_rows = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const bool cross = iter % 2 == 1;
    const AttnMaskType mask = t::kAllMaskTypes[iter % 6];
    const int m = std::uniform_int_distribution<int>(1, 6)(rng);
    const index_t rows = std::uniform_int_distribution<index_t>(1, 3)(rng);
    const index_t q_len = std::uniform_int_distribution<index_t>(0, 24)(rng);
    const index_t kv_len = cross ? std::uniform_int_distribution<index_t>(0, 24)(rng) : q_len;
    const bool arange = iter % 4 < 2;
    V q_ids, q_pos, kv_ids, kv_pos;
    for (index_t r = 0; r < rows; ++r) {
      const V row_qi = gapped_ids(rng, q_len, m), row_qp = positions(rng, row_qi, arange);
      const V row_ki = cross ? gapped_ids(rng, kv_len, m) : row_qi;
      const V row_kp = cross ? positions(rng, row_ki, arange) : row_qp;
      gapped_rows += has_gap(row_qi);
      q_ids.insert(q_ids.end(), row_qi.begin(), row_qi.end());
      q_pos.insert(q_pos.end(), row_qp.begin(), row_qp.end());
      kv_ids.insert(kv_ids.end(), row_ki.begin(), row_ki.end());
      kv_pos.insert(kv_pos.end(), row_kp.begin(), row_kp.end());
    }
    const auto qi = t::make({rows, q_len}, q_ids), qp = t::make({rows, q_len}, q_pos);
    const auto ki = t::make({rows, kv_len}, kv_ids), kp = t::make({rows, kv_len}, kv_pos);
    CAPTURE(iter, to_string(mask), m, rows, q_len, kv_len, q_ids, kv_ids);
    const SeqlensAndOffsets d =
        SequenceDescriptor::from_segment_ids_and_pos({qi.view(), ki.view()}, {qp.view(), kp.view()})
            .get_seqlens_and_offsets(mask, SeqLayout::thd, {}, m, SegmentIdGaps::renumber);
    std::vector<t::PResult> q_rows, kv_rows;
    for (index_t r = 0; r < rows; ++r) {
      const auto u = static_cast<std::ptrdiff_t>(r);
      const t::Row q{V(q_ids.begin() + u * q_len, q_ids.begin() + (u + 1) * q_len),
                     V(q_pos.begin() + u * q_len, q_pos.begin() + (u + 1) * q_len)};
      const t::Row kv{V(kv_ids.begin() + u * kv_len, kv_ids.begin() + (u + 1) * kv_len),
                      V(kv_pos.begin() + u * kv_len, kv_pos.begin() + (u + 1) * kv_len)};
      const t::RowOracle o = t::slow_path_row(q, kv, mask, m);
      // Positions here are monotone inside segments: active tokens stay contiguous.
      REQUIRE(t::runs_contiguous(o.row_ids));
      CHECK(V(d.seqlens.q.data() + r * m, d.seqlens.q.data() + (r + 1) * m) == o.q.seqlens);
      CHECK(V(d.seqlens.kv.data() + r * m, d.seqlens.kv.data() + (r + 1) * m) == o.kv.seqlens);
      CHECK(non_negative(d.offsets.q.data() + r * (m + 1), m + 1) == non_negative(o.q.offsets.data(), m + 1));
      CHECK(non_negative(d.offsets.kv.data() + r * (m + 1), m + 1) == non_negative(o.kv.offsets.data(), m + 1));
      q_rows.push_back(o.q);
      kv_rows.push_back(o.kv);
    }
    const PackedSegments p = pack_segments(d);
    const t::OraclePacked oq = t::te_pack(q_rows, m, q_len), okv = t::te_pack(kv_rows, m, kv_len);
    CHECK(t::values(p.seqlens.q) == oq.seqlens);
    CHECK(t::values(p.offsets.q) == oq.offsets);
    CHECK(t::values(p.cu_seqlens.q) == oq.cu_seqlens);
    CHECK(t::values(p.seqlens.kv) == okv.seqlens);
    CHECK(t::values(p.offsets.kv) == okv.offsets);
    CHECK(t::values(p.cu_seqlens.kv) == okv.cu_seqlens);

    bool any_gap = false;
    for (index_t r = 0; r < rows; ++r) {
      const auto u = static_cast<std::ptrdiff_t>(r);
      any_gap = any_gap || has_gap(V(q_ids.begin() + u * q_len, q_ids.begin() + (u + 1) * q_len)) ||
                has_gap(V(kv_ids.begin() + u * kv_len, kv_ids.begin() + (u + 1) * kv_len));
    }
    if (any_gap) {
      // The strict default refuses exactly the gapped batches.
      CHECK_THROWS_WITH(
          derive_seqlens_and_offsets({qi.view(), ki.view()}, {qp.view(), kp.view()}, mask, SeqLayout::thd, {}, m),
          ContainsSubstring("ids must number the segments of a row 1, 2, 3"));
    } else {
      const SeqlensAndOffsets strict =
          derive_seqlens_and_offsets({qi.view(), ki.view()}, {qp.view(), kp.view()}, mask, SeqLayout::thd, {}, m);
      CHECK(strict.seqlens.q == d.seqlens.q);
      CHECK(strict.offsets.kv == d.offsets.kv);
    }
    if (!cross) {
      // One view for q and kv takes the one-scan self-attention path.
      const SeqlensAndOffsets self =
          derive_seqlens_and_offsets(qi.view(), qp.view(), mask, SeqLayout::thd, {}, m, SegmentIdGaps::renumber);
      CHECK(self.seqlens.q == d.seqlens.q);
      CHECK(self.seqlens.kv == d.seqlens.kv);
      CHECK(self.offsets.q == d.offsets.q);
      CHECK(self.offsets.kv == d.offsets.kv);
      // Self-attention: the same packing as the strict path on ids renumbered 1, 2, 3, ...
      V ren;
      for (index_t r = 0; r < rows; ++r) {
        const auto u = static_cast<std::ptrdiff_t>(r);
        const V row = renumbered(V(q_ids.begin() + u * q_len, q_ids.begin() + (u + 1) * q_len));
        ren.insert(ren.end(), row.begin(), row.end());
      }
      const auto ri = t::make({rows, q_len}, ren);
      const PackedSegments want =
          pack_segments(derive_seqlens_and_offsets(ri.view(), qp.view(), mask, SeqLayout::thd, {}, m));
      CHECK(t::values(p.offsets.q) == t::values(want.offsets.q));
      CHECK(t::values(p.cu_seqlens.q) == t::values(want.cu_seqlens.q));
      CHECK(p.num_segments == want.num_segments);
    }
  }
  CHECK(gapped_rows > 100);  // the generator does produce gaps
}

}  // namespace seqattn_test_descriptors_segment_id_gaps_test
