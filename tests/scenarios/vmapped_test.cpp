#include <cmath>
#include <cstdint>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_scenarios_vmapped_test {

using namespace seqattn;
using namespace seqattn::scenarios;
using Catch::Matchers::Contains;

namespace {

// Random segment ids (*E, B, S): each row a few contiguous segments 1, 2, ...
// then right padding (0); some rows empty, some without padding.
Tensor<std::int32_t> random_ids(const Extents& shape, SplitMix64& rng) {
  Tensor<std::int32_t> ids(shape, std::vector<std::int32_t>(static_cast<std::size_t>(shape.size()), 0));
  const index_t s = shape.back(), rows = shape.size() / s;
  for (index_t r = 0; r < rows; ++r) {
    const index_t used = rng.below(4) == 0 ? s : rng.below(s + 1);
    std::int32_t id = 1;
    for (index_t t = 0; t < used; ++t) {
      if (t > 0 && rng.below(5) == 0) ++id;
      ids.data()[r * s + t] = id;
    }
  }
  return ids;
}

// TE's dense reference (docs/semantics/sequence-descriptors.md §4.1) for row r: same id, non-zero, pos_q >= pos_kv.
void check_against_oracle(const AttentionOutput& got, const Tensor<float>& q, const Tensor<float>& k,
                          const Tensor<float>& v, const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& pos,
                          float scale) {
  const index_t s = ids.shape().back(), rows = ids.size() / s, h = q.extent(-2), d = q.extent(-1), hkv = k.extent(-2);
  const index_t pos_rows = pos.size() / s;
  for (index_t r = 0; r < rows; ++r) {
    const auto slice = [&](const Tensor<float>& x, index_t heads) {
      return TensorView<const float>(x.data() + r * s * heads * d, Extents{s, heads, d});
    };
    const std::int32_t* id = ids.data() + r * s;
    const std::int32_t* p = pos.data() + (r % pos_rows) * s;
    const auto want = reference_attention(
        slice(q, h), slice(k, hkv), slice(v, hkv), scale,
        [&](index_t, index_t i, index_t j) { return id[i] != 0 && id[i] == id[j] && p[i] >= p[j]; });
    for (index_t i = 0; i < s; ++i) {
      for (index_t hh = 0; hh < h; ++hh) {
        INFO("row " << r << " token " << i << " head " << hh);
        const float lse = got.lse.data()[(r * s + i) * h + hh];
        if (std::isinf(want.lse(i, hh))) {
          REQUIRE(std::isinf(lse));
        } else {
          REQUIRE_THAT(lse, Catch::Matchers::WithinAbs(want.lse(i, hh), 2e-5));
        }
        for (index_t c = 0; c < d; ++c) {
          REQUIRE_THAT(got.out.data()[((r * s + i) * h + hh) * d + c],
                       Catch::Matchers::WithinAbs(want.out(i, hh, c), 2e-5));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("Vmapped ids (V, B, S) against shared arange positions (B, S): BSHD and THD match TE's reference") {
  SplitMix64 rng(GENERATE(1, 2, 3));
  const index_t vm = 3, b = 2, s = GENERATE(as<index_t>{}, 37, 64), h = 4, hkv = 2, d = 16;
  const Tensor<std::int32_t> ids = random_ids(Extents{vm, b, s}, rng);
  Tensor<std::int32_t> pos(Extents{b, s});
  for (index_t r = 0; r < b; ++r) {
    for (index_t t = 0; t < s; ++t) pos(r, t) = static_cast<std::int32_t>(t);
  }
  const auto q = random_normal(Extents{vm, b, s, h, d}, rng), k = random_normal(Extents{vm, b, s, hkv, d}, rng),
             v = random_normal(Extents{vm, b, s, hkv, d}, rng);
  const float scale = 0.3f;
  const AttentionOutput bshd = vmapped::attend_bshd(q.view(), k.view(), v.view(), ids.view(), pos.view(), scale);
  CHECK(bshd.out.shape() == Extents{vm, b, s, h, d});
  CHECK(bshd.lse.shape() == Extents{vm, b, s, h});
  check_against_oracle(bshd, q, k, v, ids, pos, scale);
  const AttentionOutput thd =
      vmapped::attend_thd(q.view(), k.view(), v.view(), ids.view(), pos.view(), scale, static_cast<int>(s));
  CHECK(thd.out.shape() == Extents{vm, b, s, h, d});
  check_against_oracle(thd, q, k, v, ids, pos, scale);
  CHECK(max_abs_diff(bshd.out, thd.out) < 1e-5f);
}

TEST_CASE("Vmapped descriptors: per-slice seqlens and packed segments") {
  // Two vmapped slices of one row of 6 tokens with different segmentations, shared arange positions.
  const Tensor<std::int32_t> ids(Extents{2, 1, 6}, std::vector<std::int32_t>{1, 1, 2, 2, 2, 0, 1, 2, 2, 3, 0, 0});
  const Tensor<std::int32_t> pos(Extents{1, 6}, std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
  const PackedSegments p = vmapped::packed_descriptors(ids.view(), pos.view(), 3);
  REQUIRE(p.num_segments == 5);
  const SegmentTable t = p.table();
  CHECK(std::vector<std::int32_t>(t.q_offsets.begin(), t.q_offsets.end()) == std::vector<std::int32_t>{0, 2, 6, 7, 9});
  CHECK(std::vector<std::int32_t>(t.q_lens.begin(), t.q_lens.end()) == std::vector<std::int32_t>{2, 3, 1, 2, 1});
}

TEST_CASE("Vmapped input validation") {
  const Tensor<float> q(Extents{2, 1, 6, 2, 4}), k(Extents{2, 1, 6, 2, 4});
  const Tensor<std::int32_t> ids(Extents{2, 1, 5}), pos(Extents{1, 6});
  CHECK_THROWS_WITH(vmapped::attend_bshd(q.view(), k.view(), k.view(), ids.view(), pos.view(), 1.0f),
                    Contains("segment_ids must have shape (*E, B, S) = (2, 1, 6)") && Contains("got (2, 1, 5)"));
  const Tensor<std::int32_t> ids6(Extents{2, 1, 6}), pos5(Extents{1, 5});
  CHECK_THROWS_AS(vmapped::attend_thd(q.view(), k.view(), k.view(), ids6.view(), pos5.view(), 1.0f, 2),
                  seqattn::invalid_argument);
  const Tensor<float> q3(Extents{6, 2, 4});
  CHECK_THROWS_WITH(vmapped::attend_bshd(q3.view(), q3.view(), q3.view(), ids6.view(), pos.view(), 1.0f),
                    Contains("[*E, B, S, H, D]"));
}

}  // namespace seqattn_test_scenarios_vmapped_test
