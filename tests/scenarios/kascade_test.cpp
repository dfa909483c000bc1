#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_scenarios_kascade_test {

using namespace seqattn;
using namespace seqattn::scenarios;
using namespace seqattn::scenarios::kascade;
using Catch::Matchers::Contains;

namespace {

// Exact causal softmax probabilities [H, Lq, Lk] in double, rounded to float.
Tensor<float> brute_probs(const Tensor<float>& q, const Tensor<float>& k, float scale) {
  const index_t lq = q.extent(0), hq = q.extent(1), d = q.extent(2), lk = k.extent(0), per = hq / k.extent(1);
  Tensor<float> p(Extents{hq, lq, lk});
  for (index_t h = 0; h < hq; ++h) {
    for (index_t i = 0; i < lq; ++i) {
      const index_t n = lk - lq + i + 1;
      std::vector<double> s(static_cast<std::size_t>(n));
      double m = -INFINITY, sum = 0.0;
      for (index_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (index_t c = 0; c < d; ++c) dot += static_cast<double>(q(i, h, c)) * k(j, h / per, c);
        s[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, dot * scale);
      }
      for (double& x : s) sum += (x = std::exp(x - m));
      for (index_t j = 0; j < n; ++j) p(h, i, j) = static_cast<float>(s[static_cast<std::size_t>(j)] / sum);
    }
  }
  return p;
}

}  // namespace

TEST_CASE("TV-C3: budget") {
  CHECK(budget(8192) == 787);
  CHECK(budget(1000) == 96);
  CHECK(budget(100) == 68);
  CHECK(budget(20) == 0);  // min(max(128, 2), 20) - 32 < 0: clamped, never a negative top-k
  CHECK(budget(0) == 0);
  CHECK(budget(8192, Config{.tile = 1}) == 819);
}

TEST_CASE("TV-C3: pooling over keys before the tile, selection and reuse key sets") {
  // T = 2, Lq = Lk = 6, one head per group, k = 2; rows 4 and 5 are TV-C3's (docs/semantics/multi-item-topk-kascade.md
  // §C.5), earlier rows arbitrary.
  Tensor<float> p(Extents{1, 6, 6});
  const std::vector<std::vector<float>> rows{{1, 0, 0, 0, 0, 0},
                                             {0.5f, 0.5f, 0, 0, 0, 0},
                                             {0.2f, 0.3f, 0.5f, 0, 0, 0},
                                             {0.1f, 0.2f, 0.3f, 0.4f, 0, 0},
                                             {0.1f, 0.4f, 0.1f, 0.1f, 0.3f, 0},
                                             {0.05f, 0.3f, 0.05f, 0.3f, 0.1f, 0.2f}};
  for (index_t i = 0; i < 6; ++i) {
    for (index_t j = 0; j < 6; ++j) p(0, i, j) = rows[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
  }
  const Tensor<float> pooled = pooled_mass_from_probs(p.view(), 1, 2);
  REQUIRE(pooled.shape() == Extents{1, 3, 6});
  const std::vector<float> want{0.15f, 0.70f, 0.15f, 0.40f, 0, 0};
  for (index_t j = 0; j < 6; ++j)
    CHECK_THAT(pooled(0, 2, j), Catch::Matchers::WithinAbs(want[static_cast<std::size_t>(j)], 1e-6));
  for (index_t j = 0; j < 6; ++j) CHECK(pooled(0, 0, j) == 0.0f);  // tile 0 has no earlier keys
  const Selection s = select_from_pooled(pooled.view(), 6, 2, 2);
  CHECK(std::vector<std::int32_t>(s.keys(0, 2).begin(), s.keys(0, 2).end()) == std::vector<std::int32_t>{1, 3});
  CHECK(s.keys(0, 0).empty());
  CHECK(s.count(1) == 2);
  const std::vector<index_t> identity{0};
  std::set<index_t> q4, q5;
  for (index_t j = 0; j < 6; ++j) {
    if (reuse_allowed(s, identity, 1, 0, 4, j)) q4.insert(j);
    if (reuse_allowed(s, identity, 1, 0, 5, j)) q5.insert(j);
  }
  CHECK(q4 == std::set<index_t>{1, 3, 4});
  CHECK(q5 == std::set<index_t>{1, 3, 4, 5});
}

TEST_CASE("Streaming pooled mass and selection match brute force") {
  SplitMix64 rng(GENERATE(1, 2, 3));
  const index_t lk = 50 + rng.below(40), lq = GENERATE(as<index_t>{}, 0, 17) == 0 ? lk : lk - 17;
  const index_t hq = 6, hkv = 2, d = 16, tile = 8;
  const auto q = random_normal(Extents{lq, hq, d}, rng), k = random_normal(Extents{lk, hkv, d}, rng);
  const float scale = 0.3f;
  const Tensor<float> streamed = pooled_mass(q.view(), k.view(), scale, tile);
  const Tensor<float> brute = pooled_mass_from_probs(brute_probs(q, k, scale).view(), hkv, tile);
  CHECK(max_abs_diff(streamed, brute) < 1e-5f);
  const index_t kk = 1 + rng.below(20);
  const Selection s = select_from_pooled(brute.view(), lq, tile, kk);
  for (index_t g = 0; g < hkv; ++g) {
    for (index_t t = 0; t < s.tiling.num_tiles(); ++t) {
      const index_t first = s.tiling.first_position(t);
      std::vector<std::int32_t> order(static_cast<std::size_t>(first));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return brute(g, t, a) > brute(g, t, b); });
      order.resize(static_cast<std::size_t>(std::min(kk, first)));
      std::sort(order.begin(), order.end());
      const auto got = s.keys(g, t);
      REQUIRE(std::vector<std::int32_t>(got.begin(), got.end()) == order);
    }
  }
}

TEST_CASE("Reuse attention over gathered K/V equals the oracle on the paper's key sets") {
  SplitMix64 rng(GENERATE(4, 5, 6));
  const index_t hq = 4, hkv = 2, d = GENERATE(as<index_t>{}, 16, 80), lk = 70 + rng.below(30);
  const index_t lq = rng.below(2) == 0 ? lk : lk - 1 - rng.below(20);
  const Config config{.tile = 8, .top_percent = 10.0, .min_keys = 20};
  const auto q0 = random_normal(Extents{lq, hq, d}, rng), k0 = random_normal(Extents{lk, hkv, d}, rng);
  const auto q1 = random_normal(Extents{lq, hq, d}, rng), k1 = random_normal(Extents{lk, hkv, d}, rng),
             v1 = random_normal(Extents{lk, hkv, d}, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Selection anchor = select_anchor(q0.view(), k0.view(), scale, config);
  CHECK(anchor.k == budget(lk, config));
  const std::vector<index_t> head_map{1, 0};  // each reuse group borrows the other group's keys
  const Gathered g = gather(anchor, head_map, k1.view(), v1.view());
  // No key appears twice in a segment: selected keys lie strictly before the tile.
  for (index_t t = 0; t < anchor.tiling.num_tiles(); ++t) {
    for (index_t gg = 0; gg < hkv; ++gg) {
      for (std::int32_t j : anchor.keys(gg, t)) REQUIRE(j < anchor.tiling.first_position(t));
    }
  }
  const AttentionOutput got = sparse_attention(q1.view(), g, scale);
  const AttentionOutput want = reference_attention(
      q1.view(), k1.view(), v1.view(), scale,
      [&](index_t h, index_t i, index_t j) { return reuse_allowed(anchor, head_map, hq / hkv, h, i, j); });
  CHECK(max_abs_diff(got.out, want.out) < 2e-5f);
  CHECK(max_abs_diff(got.lse, want.lse) < 2e-5f);
}

TEST_CASE("A budget covering every earlier key reproduces dense causal attention") {
  SplitMix64 rng(9);
  const index_t lq = 40, lk = 40, hq = 2, hkv = 1, d = 8;  // last tile starts at 32 = budget
  const auto q = random_normal(Extents{lq, hq, d}, rng), k = random_normal(Extents{lk, hkv, d}, rng),
             v = random_normal(Extents{lk, hkv, d}, rng);
  const Config config{.tile = 8, .top_percent = 10.0, .min_keys = 1000};  // budget = Lk - T >= every prefix
  const Selection s = select_anchor(q.view(), k.view(), 0.5f, config);
  const std::vector<index_t> id{0};
  const AttentionOutput sparse = sparse_attention(q.view(), gather(s, id, k.view(), v.view()), 0.5f);
  const AttentionOutput dense = attend(q.view(), k.view(), v.view(), 0.5f, CausalMask{Alignment::bottom_right});
  CHECK(max_abs_diff(sparse.out, dense.out) < 1e-5f);
}

TEST_CASE("Head-map calibration recovers a permutation of groups") {
  SplitMix64 rng(10);
  const index_t lq = 96, lk = 96, hq = 6, hkv = 3, d = 16;
  const Config config{.tile = 16, .top_percent = 10.0, .min_keys = 24};
  const auto q = random_normal(Extents{lq, hq, d}, rng, 2.0f), k = random_normal(Extents{lk, hkv, d}, rng);
  // The reuse layer's group g is the anchor's group perm[g].
  const std::vector<index_t> perm{2, 0, 1};
  Tensor<float> q2(q.shape()), k2(k.shape());
  for (index_t i = 0; i < lq; ++i) {
    for (index_t h = 0; h < hq; ++h) {
      const index_t src = perm[static_cast<std::size_t>(h / 2)] * 2 + h % 2;
      for (index_t c = 0; c < d; ++c) q2(i, h, c) = q(i, src, c);
    }
    for (index_t g = 0; g < hkv; ++g) {
      for (index_t c = 0; c < d; ++c) k2(i, g, c) = k(i, perm[static_cast<std::size_t>(g)], c);
    }
  }
  const Selection anchor = select_anchor(q.view(), k.view(), 0.25f, config);
  const Tensor<float> reuse = pooled_mass(q2.view(), k2.view(), 0.25f, config.tile);
  CHECK(calibrate_head_map(anchor, reuse.view()) == perm);
}

TEST_CASE("TV-C6: anchor-layer DP") {
  const float ninf = -1e30f;  // the '-' entries are never read
  const Tensor<float> sim(Extents{4, 4}, std::vector<float>{1, 0.9f, 0.2f, 0.1f, ninf, 1, 0.3f, 0.2f, ninf, ninf, 1,
                                                            0.95f, ninf, ninf, ninf, 1});
  double value = 0.0;
  CHECK(select_anchor_layers(sim.view(), 2, &value) == std::vector<index_t>{0, 2});
  CHECK_THAT(value, Catch::Matchers::WithinAbs(4.85, 1e-6));
  CHECK(select_anchor_layers(sim.view(), 1, &value) == std::vector<index_t>{0});
  CHECK_THAT(value, Catch::Matchers::WithinAbs(3.2, 1e-6));
}

TEST_CASE("Kascade input validation") {
  const Tensor<float> pooled(Extents{1, 3, 6});
  const Selection s = select_from_pooled(pooled.view(), 6, 2, 2);
  const Tensor<float> k(Extents{6, 2, 4}), v(Extents{6, 2, 4});
  const std::vector<index_t> short_map{0};
  CHECK_THROWS_WITH(gather(s, short_map, k.view(), v.view()),
                    Contains("head_map has 1 entries") && Contains("2 KV heads"));
  const std::vector<index_t> bad_map{0, 1};
  CHECK_THROWS_WITH(gather(s, bad_map, k.view(), v.view()), Contains("head_map[1] = 1") && Contains("[0, 1)"));
  const Tensor<float> k7(Extents{7, 2, 4});
  CHECK_THROWS_WITH(gather(s, bad_map, k7.view(), k7.view()), Contains("kv_len 6"));
  CHECK_THROWS_WITH(select_from_pooled(pooled.view(), 4, 2, 2), Contains("must have 2 tiles"));
  Selection bad = s;
  bad.indices[static_cast<std::size_t>(2 * 2 + 1)] = 3;  // tile 2 (first query at 4) selecting keys {0, 3} is fine...
  CHECK_NOTHROW(gather(bad, std::vector<index_t>{0, 0}, k.view(), v.view()));
  bad.indices[static_cast<std::size_t>(1 * 2 + 1)] = 2;  // ...tile 1 (first query at 2) selecting key 2 is not
  CHECK_THROWS_WITH(gather(bad, std::vector<index_t>{0, 0}, k.view(), v.view()),
                    Contains("tile 1 holds key 2") && Contains("[0, 2)"));
  CHECK_THROWS_WITH(select_from_pooled(pooled.view(), 7, 2, 2), Contains("q_len (7) must not exceed kv_len (6)"));
  const Tensor<float> q(Extents{6, 3, 4});
  CHECK_THROWS_WITH(pooled_mass(q.view(), k.view(), 1.0f, 2), Contains("H a multiple of Hkv"));
}

}  // namespace seqattn_test_scenarios_kascade_test
