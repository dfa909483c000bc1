// Randomized checks of the O(T) derivation against the brute-force oracle
// (dense allow mask -> row_ids / col_ids -> TE's P; TE's packing), of the
// attention a kernel would compute from our packed descriptor against the
// dense reference mask, and round trips between representations.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "descriptor_oracle.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_property_test {

using namespace seqattn;
namespace t = seqattn::testing;
using V = std::vector<int>;

namespace {

enum class PosMode { arange_per_segment, increasing, random };

struct Batch {
  Tensor<std::int32_t> q_ids, kv_ids, q_pos, kv_pos;
  Extents batch;  // output batch shape (*E, B)
  int m = 1;
  bool self = false;  // kv is a copy of q
};

// ids (*E, B, T) with random segments; positions over a random trailing part
// of that shape (full, (B, T) or (T,)), broadcast over the rest.
Tensor<std::int32_t> random_ids(std::mt19937& rng, const Extents& shape, int m) {
  Tensor<std::int32_t> ids(shape);
  const index_t len = shape.back();
  for (index_t r = 0; len > 0 && r < ids.size() / len; ++r) {
    const V row = t::random_ids(rng, len, m);
    std::copy(row.begin(), row.end(), ids.data() + r * len);
  }
  return ids;
}

Tensor<std::int32_t> random_pos(std::mt19937& rng, const Tensor<std::int32_t>& ids, PosMode mode) {
  const int pos_rank = std::uniform_int_distribution<int>(1, ids.rank())(rng);
  Tensor<std::int32_t> pos(ids.shape().last(pos_rank));
  const index_t len = ids.extent(-1);
  const index_t offset_in_ids = ids.size() - pos.size();  // pos rows follow the last ids rows
  for (index_t r = 0; len > 0 && r < pos.size() / len; ++r) {
    std::int32_t* out = pos.data() + r * len;
    if (mode == PosMode::arange_per_segment) {
      const std::int32_t* src = ids.data() + offset_in_ids + r * len;
      const V p = t::arange_per_segment(V(src, src + len));
      std::copy(p.begin(), p.end(), out);
    } else if (mode == PosMode::increasing) {
      int v = std::uniform_int_distribution<int>(0, 3)(rng);
      for (index_t k = 0; k < len; ++k) out[k] = v += std::uniform_int_distribution<int>(0, 2)(rng);
    } else {
      for (index_t k = 0; k < len; ++k) out[k] = std::uniform_int_distribution<int>(0, 6)(rng);
    }
  }
  return pos;
}

Batch random_batch(std::mt19937& rng, PosMode mode, bool cross, bool extras) {
  Batch b;
  b.m = std::uniform_int_distribution<int>(1, 4)(rng);
  const index_t batch = std::uniform_int_distribution<int>(1, 3)(rng);
  Extents q_extra, kv_extra;
  if (extras) {
    const Extents e = t::random_extras(rng);
    switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
      case 0:
        q_extra = kv_extra = e;
        break;
      case 1:
        q_extra = e;  // one-sided: kv shared by every slice
        break;
      default:
        kv_extra = e;
    }
    if (!cross) kv_extra = q_extra;
  }
  const index_t q_len = std::uniform_int_distribution<int>(0, 20)(rng);
  const index_t kv_len = cross ? std::uniform_int_distribution<int>(0, 20)(rng) : q_len;
  b.q_ids = random_ids(rng, q_extra.concat(Extents{batch, q_len}), b.m);
  b.q_pos = random_pos(rng, b.q_ids, mode);
  if (cross) {
    b.kv_ids = random_ids(rng, kv_extra.concat(Extents{batch, kv_len}), b.m);
    b.kv_pos = random_pos(rng, b.kv_ids, mode);
  } else {
    b.kv_ids = b.q_ids;
    b.kv_pos = b.q_pos;
    b.self = true;
  }
  b.batch = (q_extra.rank() >= kv_extra.rank() ? q_extra : kv_extra).concat(Extents{batch});
  return b;
}

WindowSize random_window(std::mt19937& rng) {
  std::uniform_int_distribution<int> side(-1, 4);
  return {side(rng), side(rng)};
}

V non_negative(const std::int32_t* p, index_t n) {
  V out;
  for (index_t i = 0; i < n; ++i) {
    if (p[i] >= 0) out.push_back(p[i]);
  }
  return out;
}

// Compares derive_seqlens_and_offsets with the oracle on one batch.
void check_against_oracle(const Batch& b, AttnMaskType mask, WindowSize window) {
  CAPTURE(to_string(mask), b.m, b.q_ids.shape(), b.q_pos.shape(), b.kv_ids.shape(), b.kv_pos.shape(), window.left,
          window.right);
  const index_t rows = b.batch.size();
  std::vector<t::RowOracle> oracle;
  bool representable = true;
  for (index_t r = 0; r < rows; ++r) {
    const t::Row q = t::broadcast_row(b.q_ids, b.q_pos, b.batch, r);
    const t::Row kv = t::broadcast_row(b.kv_ids, b.kv_pos, b.batch, r);
    oracle.push_back(t::slow_path_row(q, kv, mask, b.m));
    representable =
        representable && t::runs_contiguous(oracle.back().row_ids) && t::runs_contiguous(oracle.back().col_ids);
  }
  const auto derive = [&] {
    return SequenceDescriptor::from_segment_ids_and_pos({b.q_ids, b.kv_ids}, {b.q_pos, b.kv_pos})
        .get_seqlens_and_offsets(mask, SeqLayout::thd, window, b.m);
  };
  if (!representable) {
    // Positions that are not monotone inside a segment can leave holes in its
    // active tokens; TE then emits misaligned offsets, we refuse.
    CHECK_THROWS_WITH(derive(), Catch::Matchers::Contains("not contiguous"));
    return;
  }
  const SeqlensAndOffsets d = derive();
  if (b.self) {
    // The same views for q and kv take the one-scan self-attention path.
    const SeqlensAndOffsets s = derive_seqlens_and_offsets(b.q_ids, b.q_pos, mask, SeqLayout::thd, window, b.m);
    CHECK(s.seqlens.q == d.seqlens.q);
    CHECK(s.seqlens.kv == d.seqlens.kv);
    CHECK(s.offsets.q == d.offsets.q);
    CHECK(s.offsets.kv == d.offsets.kv);
  }
  const index_t m = b.m;
  REQUIRE(d.seqlens.q.shape() == b.batch.concat(Extents{m}));
  REQUIRE(d.offsets.kv.shape() == b.batch.concat(Extents{m + 1}));
  std::vector<t::PResult> q_rows, kv_rows;
  for (index_t r = 0; r < rows; ++r) {
    const t::RowOracle& o = oracle[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CHECK(V(d.seqlens.q.data() + r * m, d.seqlens.q.data() + (r + 1) * m) == o.q.seqlens);
    CHECK(V(d.seqlens.kv.data() + r * m, d.seqlens.kv.data() + (r + 1) * m) == o.kv.seqlens);
    // TE lists offsets in order of appearance, we by segment id; the starts agree.
    CHECK(non_negative(d.offsets.q.data() + r * (m + 1), m + 1) == non_negative(o.q.offsets.data(), m + 1));
    CHECK(non_negative(d.offsets.kv.data() + r * (m + 1), m + 1) == non_negative(o.kv.offsets.data(), m + 1));
    for (index_t k = 0; k < m; ++k) {
      CHECK((d.offsets.q.data()[r * (m + 1) + k] >= 0) == (d.seqlens.q.data()[r * m + k] > 0));
      CHECK((d.offsets.kv.data()[r * (m + 1) + k] >= 0) == (d.seqlens.kv.data()[r * m + k] > 0));
    }
    q_rows.push_back(o.q);
    kv_rows.push_back(o.kv);
  }

  // Packing agrees with TE's independent packing, and the table covers
  // exactly the active tokens.
  const PackedSegments p = pack_segments(d);
  const t::OraclePacked oq = t::te_pack(q_rows, b.m, b.q_ids.extent(-1));
  const t::OraclePacked okv = t::te_pack(kv_rows, b.m, b.kv_ids.extent(-1));
  CHECK(t::values(p.seqlens.q) == oq.seqlens);
  CHECK(t::values(p.offsets.q) == oq.offsets);
  CHECK(t::values(p.cu_seqlens.q) == oq.cu_seqlens);
  CHECK(t::values(p.seqlens.kv) == okv.seqlens);
  CHECK(t::values(p.offsets.kv) == okv.offsets);
  CHECK(t::values(p.cu_seqlens.kv) == okv.cu_seqlens);
  const SegmentTable table = p.table();
  table.validate(p.total_tokens.q, p.total_tokens.kv);
  V covered_q(static_cast<std::size_t>(p.total_tokens.q), 0), active_q(covered_q.size(), 0);
  for (index_t s = 0; s < table.size(); ++s) {
    const auto si = static_cast<std::size_t>(s);
    for (int k = 0; k < table.q_lens[si]; ++k) ++covered_q[static_cast<std::size_t>(table.q_offsets[si] + k)];
  }
  const index_t q_len = b.q_ids.extent(-1);
  for (index_t r = 0; r < rows; ++r) {
    for (index_t k = 0; k < q_len; ++k) {
      active_q[static_cast<std::size_t>(r * q_len + k)] =
          oracle[static_cast<std::size_t>(r)].row_ids[static_cast<std::size_t>(k)] != 0;
    }
  }
  CHECK(covered_q == active_q);
}

}  // namespace

TEST_CASE("THD descriptors equal the dense-mask oracle on random self-attention batches with extra dims") {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    const PosMode mode = static_cast<PosMode>(iter % 3);
    const Batch b = random_batch(rng, mode, /*cross=*/false, /*extras=*/iter % 2 == 1);
    check_against_oracle(b, t::kAllMaskTypes[iter % 6], random_window(rng));
  }
}

TEST_CASE("THD descriptors equal the dense-mask oracle on random cross-attention batches, one-sided extras included") {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 600; ++iter) {
    const PosMode mode = static_cast<PosMode>(iter % 3);
    const Batch b = random_batch(rng, mode, /*cross=*/true, /*extras=*/iter % 3 != 0);
    check_against_oracle(b, t::kAllMaskTypes[(iter / 3) % 6], random_window(rng));
  }
}

TEST_CASE("Attention implied by the packed descriptor equals the dense reference mask, windows included") {
  // Positions 0..L-1 in every segment (what TE's generators and real packers
  // produce): then a kernel working on local indices inside each packed
  // segment (docs/semantics/sequence-descriptors.md §4.2) must reproduce SEG &
  // TYPE & SWA of §4.1 token for token.
  std::mt19937 rng(7);
  for (int iter = 0; iter < 400; ++iter) {
    const AttnMaskType mask = t::kAllMaskTypes[iter % 6];
    WindowSize window = random_window(rng);
    if (is_causal(mask) && window.right > 0 && iter % 2) window.right = -1;  // both mean "no extra right bound"
    const int m = std::uniform_int_distribution<int>(1, 4)(rng);
    const index_t batch = std::uniform_int_distribution<int>(1, 3)(rng);
    const index_t q_len = std::uniform_int_distribution<int>(0, 16)(rng);
    const index_t kv_len = std::uniform_int_distribution<int>(0, 16)(rng);
    Tensor<std::int32_t> q_ids(Extents{batch, q_len}), q_pos(q_ids.shape()), kv_ids(Extents{batch, kv_len}),
        kv_pos(kv_ids.shape());
    for (index_t r = 0; r < batch; ++r) {
      const V qi = t::random_ids(rng, q_len, m), ki = t::random_ids(rng, kv_len, m);
      const V qp = t::arange_per_segment(qi), kp = t::arange_per_segment(ki);
      std::copy(qi.begin(), qi.end(), q_ids.data() + r * q_len);
      std::copy(qp.begin(), qp.end(), q_pos.data() + r * q_len);
      std::copy(ki.begin(), ki.end(), kv_ids.data() + r * kv_len);
      std::copy(kp.begin(), kp.end(), kv_pos.data() + r * kv_len);
    }
    CAPTURE(iter, to_string(mask), window.left, window.right, m, batch, q_len, kv_len);
    const auto d = derive_seqlens_and_offsets({q_ids, kv_ids}, {q_pos, kv_pos}, mask, SeqLayout::thd, window, m);
    const PackedSegments p = pack_segments(d);
    const auto kernel = t::kernel_mask(p.table(), batch * q_len, batch * kv_len, mask, window);
    index_t mismatches = 0;
    for (index_t r = 0; r < batch; ++r) {
      const t::Row q = t::broadcast_row(q_ids, q_pos, Extents{batch}, r);
      const t::Row kv = t::broadcast_row(kv_ids, kv_pos, Extents{batch}, r);
      const auto dense = t::dense_mask(q, kv, mask, &window);
      for (index_t i = 0; i < q_len; ++i) {
        for (index_t j = 0; j < kv_len; ++j) {
          mismatches += dense[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] !=
                        kernel[static_cast<std::size_t>(r * q_len + i)][static_cast<std::size_t>(r * kv_len + j)];
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("BSHD seqlens count non-padding tokens of right-padded rows, with extra dims") {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 200; ++iter) {
    const AttnMaskType mask = t::kAllMaskTypes[iter % 6];
    const Extents extras = t::random_extras(rng);
    const index_t batch = std::uniform_int_distribution<int>(1, 3)(rng);
    const index_t len = std::uniform_int_distribution<int>(0, 12)(rng);
    const Extents shape = extras.concat(Extents{batch, len});
    Tensor<std::int32_t> ids(shape), pos(Extents{len});
    V expected;
    for (index_t r = 0; r < shape.size() / std::max<index_t>(len, 1) && len > 0; ++r) {
      const index_t n = std::uniform_int_distribution<index_t>(0, len)(rng);
      const int id = std::uniform_int_distribution<int>(1, 3)(rng);
      for (index_t k = 0; k < n; ++k) ids.data()[r * len + k] = id;
      expected.push_back(is_padding(mask) ? static_cast<int>(n) : static_cast<int>(len));
    }
    if (len == 0) expected.assign(static_cast<std::size_t>(extras.size() * batch), 0);
    CAPTURE(iter, shape, to_string(mask));
    const auto d = derive_seqlens_and_offsets(ids, pos, mask, SeqLayout::bshd);
    CHECK(d.seqlens.q.shape() == extras.concat(Extents{batch}));
    CHECK(t::values(d.seqlens.q) == expected);
    CHECK(t::values(d.seqlens.kv) == expected);
    // Round trip through from_seqlens: same packing.
    const PackedSegments a = pack_segments(d);
    const PackedSegments b = pack_segments(
        SequenceDescriptor::from_seqlens(d.seqlens.q).get_seqlens_and_offsets(mask, SeqLayout::bshd), {len, len});
    CHECK(a.cu_seqlens.q == b.cu_seqlens.q);
    CHECK(a.offsets.kv == b.offsets.kv);
    CHECK(a.num_segments == extras.size() * batch);
    a.table().validate(a.total_tokens.q, a.total_tokens.kv);
  }
}

TEST_CASE("Round trips: ids -> seqlens/offsets -> ids, and seqlens/offsets descriptors pack identically") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 200; ++iter) {
    const AttnMaskType mask = t::kAllMaskTypes[iter % 6];
    const int m = std::uniform_int_distribution<int>(1, 5)(rng);
    const Extents shape = t::random_extras(rng).concat(
        Extents{std::uniform_int_distribution<int>(1, 3)(rng), std::uniform_int_distribution<int>(0, 24)(rng)});
    Tensor<std::int32_t> ids = random_ids(rng, shape, m), pos(shape);
    const index_t len = shape.back();
    for (index_t r = 0; len > 0 && r < ids.size() / len; ++r) {
      const V p = t::arange_per_segment(V(ids.data() + r * len, ids.data() + (r + 1) * len));
      std::copy(p.begin(), p.end(), pos.data() + r * len);
    }
    CAPTURE(iter, shape, m, to_string(mask));
    const auto d =
        SequenceDescriptor::from_segment_ids_and_pos(ids, pos).get_seqlens_and_offsets(mask, SeqLayout::thd, {}, m);
    // Self-attention trims nothing, so the descriptor reproduces ids and positions.
    const SegmentIdsAndPos back = segment_ids_from_seqlens_and_offsets(d.seqlens.q, d.offsets.q, len);
    CHECK(back.segment_ids == ids);
    CHECK(back.segment_pos == pos);
    const auto stored =
        SequenceDescriptor::from_seqlens_and_offsets({d.seqlens.q, d.seqlens.kv}, {d.offsets.q, d.offsets.kv})
            .get_seqlens_and_offsets(mask, SeqLayout::thd, {}, m);
    CHECK(stored.seqlens.q == d.seqlens.q);
    CHECK(stored.offsets.kv == d.offsets.kv);
    const PackedSegments a = pack_segments(d), b = pack_segments(stored, {len, len});
    CHECK(a.seqlens.q == b.seqlens.q);
    CHECK(a.offsets.q == b.offsets.q);
    CHECK(a.cu_seqlens.kv == b.cu_seqlens.kv);
    CHECK(a.num_segments == b.num_segments);
  }
}

TEST_CASE("Randomly corrupted ids are rejected exactly when they break the id rules") {
  std::mt19937 rng(21);
  int rejected = 0, accepted = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int m = std::uniform_int_distribution<int>(1, 4)(rng);
    const index_t len = std::uniform_int_distribution<int>(1, 12)(rng);
    V row = t::random_ids(rng, len, m);
    row[static_cast<std::size_t>(std::uniform_int_distribution<index_t>(0, len - 1)(rng))] =
        std::uniform_int_distribution<int>(-1, m + 1)(rng);
    // The rules, stated independently: ids >= 0, each non-zero id one run,
    // runs numbered 1, 2, ... in order, ids <= m.
    bool valid = t::runs_contiguous(row);
    int next = 1;
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (row[k] < 0 || row[k] > m) valid = false;
      if (row[k] > 0 && (k == 0 || row[k] != row[k - 1])) valid = valid && row[k] == next++;
    }
    const auto ids = t::make(Extents{1, len}, row);
    const auto pos = t::make(Extents{1, len}, t::arange_per_segment(row));
    CAPTURE(row, m);
    if (valid) {
      ++accepted;
      CHECK_NOTHROW(derive_seqlens_and_offsets(ids, pos, AttnMaskType::padding_causal, SeqLayout::thd, {}, m));
    } else {
      ++rejected;
      CHECK_THROWS_WITH(derive_seqlens_and_offsets(ids, pos, AttnMaskType::padding_causal, SeqLayout::thd, {}, m),
                        Catch::Matchers::Contains("q_segment_ids of shape (1, " + std::to_string(len) + "), row 0"));
    }
  }
  CHECK(rejected > 50);
  CHECK(accepted > 50);
}

namespace {
// The same values behind a non-contiguous view: every other element of a
// buffer twice as large.
struct Strided {
  std::vector<std::int32_t> buffer;
  Int32View view;
  explicit Strided(const Tensor<std::int32_t>& t) : buffer(static_cast<std::size_t>(t.size() * 2), -7) {
    for (index_t i = 0; i < t.size(); ++i) buffer[static_cast<std::size_t>(2 * i)] = t.data()[i];
    Strides strides = row_major_strides(t.shape());
    for (int d = 0; d < t.rank(); ++d) strides[d] *= 2;
    view = Int32View(buffer.data(), t.shape(), strides);
  }
};
}  // namespace

TEST_CASE("Strided (non-contiguous) inputs give the same descriptors as contiguous ones") {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 200; ++iter) {
    const bool cross = iter % 2 == 1;
    const Batch b = random_batch(rng, PosMode::increasing, cross, /*extras=*/iter % 4 < 2);
    const AttnMaskType mask = t::kAllMaskTypes[iter % 6];
    CAPTURE(iter, to_string(mask), b.q_ids.shape(), b.q_pos.shape(), b.kv_ids.shape(), b.kv_pos.shape());
    const Strided q_ids(b.q_ids), q_pos(b.q_pos), kv_ids(b.kv_ids), kv_pos(b.kv_pos);
    const auto expected =
        derive_seqlens_and_offsets({b.q_ids, b.kv_ids}, {b.q_pos, b.kv_pos}, mask, SeqLayout::thd, {}, b.m);
    // All strided, q strided only, kv strided only.
    const auto all =
        derive_seqlens_and_offsets({q_ids.view, kv_ids.view}, {q_pos.view, kv_pos.view}, mask, SeqLayout::thd, {}, b.m);
    const auto q_only =
        derive_seqlens_and_offsets({q_ids.view, b.kv_ids}, {q_pos.view, b.kv_pos}, mask, SeqLayout::thd, {}, b.m);
    const auto kv_only =
        derive_seqlens_and_offsets({b.q_ids, kv_ids.view}, {b.q_pos, kv_pos.view}, mask, SeqLayout::thd, {}, b.m);
    for (const SeqlensAndOffsets* d : {&all, &q_only, &kv_only}) {
      CHECK(d->seqlens.q == expected.seqlens.q);
      CHECK(d->seqlens.kv == expected.seqlens.kv);
      CHECK(d->offsets.q == expected.offsets.q);
      CHECK(d->offsets.kv == expected.offsets.kv);
    }
    if (!cross) {
      const auto self = derive_seqlens_and_offsets(q_ids.view, q_pos.view, mask, SeqLayout::thd, {}, b.m);
      CHECK(self.seqlens.kv == expected.seqlens.kv);
      CHECK(self.offsets.q == expected.offsets.q);
    }
  }
  // BSHD, strided: right-padded rows with long runs (crosses the block scans).
  for (int iter = 0; iter < 50; ++iter) {
    const index_t batch = std::uniform_int_distribution<int>(1, 4)(rng);
    const index_t len = std::uniform_int_distribution<int>(0, 100)(rng);
    Tensor<std::int32_t> ids(Extents{batch, len});
    for (index_t r = 0; r < batch; ++r) {
      const index_t n = std::uniform_int_distribution<index_t>(0, len)(rng);
      for (index_t k = 0; k < n; ++k) ids(r, k) = 1;
    }
    const Tensor<std::int32_t> pos(Extents{len});
    const Strided sid(ids), spos(pos);
    const auto a = derive_seqlens_and_offsets(ids, pos, AttnMaskType::padding, SeqLayout::bshd);
    const auto b = derive_seqlens_and_offsets(sid.view, spos.view, AttnMaskType::padding, SeqLayout::bshd);
    CHECK(a.seqlens.q == b.seqlens.q);
    for (index_t r = 0; r < batch; ++r) {
      index_t n = 0;
      while (n < len && ids(r, n) == 1) ++n;
      CHECK(a.seqlens.q(r) == n);
    }
  }
}

TEST_CASE("Long segments: block scans agree with the oracle across block boundaries") {
  // Segments far longer than the 32-token scan blocks, ending at every offset
  // within a block, with padding gaps and an error placed deep inside a block.
  std::mt19937 rng(29);
  for (int iter = 0; iter < 60; ++iter) {
    const index_t len = std::uniform_int_distribution<int>(60, 300)(rng);
    V ids(static_cast<std::size_t>(len), 0);
    index_t t = std::uniform_int_distribution<int>(0, 40)(rng);
    int id = 0;
    while (t < len) {
      const index_t l = std::min<index_t>(std::uniform_int_distribution<int>(1, 90)(rng), len - t);
      ++id;
      for (index_t k = 0; k < l; ++k) ids[static_cast<std::size_t>(t + k)] = id;
      t += l + std::uniform_int_distribution<int>(0, 40)(rng) * (iter % 2);
    }
    const V pos = t::arange_per_segment(ids);
    const auto q = t::make(Extents{1, len}, ids);
    const auto p = t::make(Extents{1, len}, pos);
    const int m = std::max(id, 1);
    CAPTURE(iter, len, id);
    Batch b;
    b.q_ids = b.kv_ids = q;
    b.q_pos = b.kv_pos = p;
    b.batch = Extents{1};
    b.m = m;
    b.self = true;
    check_against_oracle(b, t::kAllMaskTypes[iter % 6], {});
    if (id >= 2 && std::count(ids.begin(), ids.end(), id) >= 3) {
      // Re-use id 1 somewhere inside the last segment: must be refused.
      V bad = ids;
      const auto last_begin = static_cast<std::size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      bad[last_begin + (static_cast<std::size_t>(std::count(ids.begin(), ids.end(), id)) - 1) / 2] = 1;
      CHECK_THROWS_WITH(
          derive_seqlens_and_offsets(t::make(Extents{1, len}, bad), p, AttnMaskType::padding, SeqLayout::thd, {}, m),
          Catch::Matchers::Contains("segment id 1 appears again"));
    }
  }
}

}  // namespace seqattn_test_descriptors_property_test
