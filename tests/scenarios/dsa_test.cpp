#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_scenarios_dsa_test {

using namespace seqattn;
using namespace seqattn::scenarios;
using namespace seqattn::scenarios::dsa;
using Catch::Matchers::Contains;

namespace {

std::set<std::int32_t> row_set(const TopK& t, index_t i) {
  std::set<std::int32_t> s;
  for (index_t r = 0; r < t.counts[static_cast<std::size_t>(i)]; ++r) s.insert(t.indices(i, r));
  return s;
}

std::set<std::int32_t> selected_set(const std::vector<std::uint8_t>& sel) {
  std::set<std::int32_t> s;
  for (std::size_t j = 0; j < sel.size(); ++j) {
    if (sel[j]) s.insert(static_cast<std::int32_t>(j));
  }
  return s;
}

Tensor<float> one_row(const std::vector<float>& v) {
  return Tensor<float>(Extents{1, static_cast<index_t>(v.size())}, v);
}

}  // namespace

TEST_CASE("TV-B1: tie at the threshold, exact-k vs raw") {
  const std::vector<float> row{0.3f, 0.7f, 0.7f, 0.1f, 0.7f};
  const TopK t = select_topk(one_row(row).view(), 2);
  CHECK(t.indices(0, 0) == 1);
  CHECK(t.indices(0, 1) == 2);
  CHECK(selected_set(threshold_select_exact_k(row, 0.7f, 2)) == std::set<std::int32_t>{1, 2});
  CHECK(selected_set(threshold_select_raw(row, 0.7f)) == std::set<std::int32_t>{1, 2, 4});
  const auto m = mask_by_scatter(t.indices.view(), 5);
  CHECK(std::vector<std::uint8_t>(m.values().begin(), m.values().end()) == std::vector<std::uint8_t>{0, 1, 1, 0, 0});
}

TEST_CASE("TV-B2: a strictly greater element after the ties") {
  const std::vector<float> row{0.2f, 0.2f, 0.2f, 0.8f, -1.0f, 0.2f};
  const TopK t = select_topk(one_row(row).view(), 3);
  CHECK(t.indices(0, 0) == 3);
  CHECK(t.indices(0, 1) == 0);
  CHECK(t.indices(0, 2) == 1);
  CHECK(selected_set(threshold_select_exact_k(row, 0.2f, 3)) == std::set<std::int32_t>{0, 1, 3});
  CHECK(selected_set(threshold_select_raw(row, 0.2f)) == std::set<std::int32_t>{0, 1, 2, 3, 5});
}

TEST_CASE("TV-B3: an underestimated threshold keeps the first k by index") {
  const std::vector<float> row{0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.0f};
  CHECK(selected_set(threshold_select_exact_k(row, 0.5f, 3)) == std::set<std::int32_t>{0, 1, 2});
}

TEST_CASE("TV-B4: causal interplay, short rows bypass, nothing forces a sink") {
  Tensor<float> scores(Extents{4, 4}, kNotAllowed);
  for (index_t i = 0; i < 4; ++i) {
    for (index_t j = 0; j <= i; ++j) scores(i, j) = static_cast<float>(j + 1);
  }
  const TopK t = select_topk(scores.view(), 2);
  CHECK(row_set(t, 0) == std::set<std::int32_t>{0});
  CHECK(row_set(t, 1) == std::set<std::int32_t>{0, 1});
  CHECK(row_set(t, 2) == std::set<std::int32_t>{1, 2});
  CHECK(row_set(t, 3) == std::set<std::int32_t>{2, 3});
  CHECK(t.bypassed_rows == 2);
  CHECK(t.indices(0, 1) == -1);  // unused slot
  // The same from index scores: score(j) = j + 1 via a one-head indexer.
  Tensor<float> q(Extents{4, 1, 1}, 1.0f), w(Extents{4, 1}, 1.0f), k(Extents{4, 1});
  for (index_t j = 0; j < 4; ++j) k(j, 0) = static_cast<float>(j + 1);
  const Tensor<float> s = index_scores(q.view(), k.view(), w.view());
  CHECK(s == scores);
}

TEST_CASE("TV-B5: index score") {
  const Tensor<float> q(Extents{1, 2, 2}, std::vector<float>{1, 0, 0, 1});
  const Tensor<float> k(Extents{2, 2}, std::vector<float>{1, 1, -1, 2});
  const Tensor<float> w(Extents{1, 2}, std::vector<float>{0.5f, 2.0f});
  const Tensor<float> s = index_scores(q.view(), k.view(), w.view(), FullMask{});
  CHECK(s(0, 0) == 2.5f);
  CHECK(s(0, 1) == 4.0f);
  CHECK(select_topk(s.view(), 1).indices(0, 0) == 1);
  CHECK_THAT(1.0 / std::sqrt(64.0) / std::sqrt(128.0), Catch::Matchers::WithinAbs(0.011048543, 1e-9));
}

TEST_CASE("Index scores match a double-precision brute force") {
  SplitMix64 rng(5);
  const index_t t = 13, s = 29, h = 3, d = 10;  // q_len < kv_len: bottom-right causal
  const auto q = random_normal(Extents{t, h, d}, rng), k = random_normal(Extents{s, d}, rng),
             w = random_normal(Extents{t, h}, rng);
  const Tensor<float> got = index_scores(q.view(), k.view(), w.view());
  for (index_t i = 0; i < t; ++i) {
    for (index_t j = 0; j < s; ++j) {
      if (j > i + (s - t)) {
        REQUIRE(got(i, j) == kNotAllowed);
        continue;
      }
      double want = 0.0;
      for (index_t hh = 0; hh < h; ++hh) {
        double dot = 0.0;
        for (index_t c = 0; c < d; ++c) dot += static_cast<double>(q(i, hh, c)) * k(j, c);
        want += std::max(dot, 0.0) * w(i, hh);
      }
      REQUIRE_THAT(got(i, j), Catch::Matchers::WithinAbs(want, 1e-4));
    }
  }
}

TEST_CASE("Top-k with many ties equals sorting by (score desc, index asc), and scatter == broadcast == exact-k") {
  SplitMix64 rng(GENERATE(1, 2, 3, 4));
  const index_t t = 1 + rng.below(20), s = 1 + rng.below(60), k = 1 + rng.below(16);
  Tensor<float> scores(Extents{t, s});
  for (float& x : scores.values()) x = rng.below(5) == 0 ? kNotAllowed : static_cast<float>(rng.below(4));  // ties
  const TopK got = select_topk(scores.view(), k);
  const TopK by_index = select_topk(scores.view(), k, TopKOrder::by_index);
  for (index_t i = 0; i < t; ++i) {
    REQUIRE(row_set(by_index, i) == row_set(got, i));
    for (index_t r = 1; r < by_index.counts[static_cast<std::size_t>(i)]; ++r) {
      REQUIRE(by_index.indices(i, r - 1) < by_index.indices(i, r));
    }
    std::vector<std::int32_t> all;
    for (index_t j = 0; j < s; ++j) {
      if (scores(i, j) != kNotAllowed) all.push_back(static_cast<std::int32_t>(j));
    }
    std::stable_sort(all.begin(), all.end(), [&](auto a, auto b) { return scores(i, a) > scores(i, b); });
    const index_t n = std::min<index_t>(k, static_cast<index_t>(all.size()));
    REQUIRE(got.counts[static_cast<std::size_t>(i)] == n);
    std::set<std::int32_t> want(all.begin(), all.begin() + n);
    REQUIRE(row_set(got, i) == want);
    if (static_cast<index_t>(all.size()) > k) {  // ranked rows come out in jax.lax.top_k order
      for (index_t r = 0; r < k; ++r) REQUIRE(got.indices(i, r) == all[static_cast<std::size_t>(r)]);
      const float thr = scores(i, all[static_cast<std::size_t>(k - 1)]);
      std::vector<float> row(static_cast<std::size_t>(s));
      for (index_t j = 0; j < s; ++j) row[static_cast<std::size_t>(j)] = scores(i, j);
      REQUIRE(selected_set(threshold_select_exact_k(row, thr, k)) == want);
    }
  }
  const auto a = mask_by_scatter(got.indices.view(), s);
  const auto b = mask_by_broadcast_compare(got.indices.view(), s);
  CHECK(a == b);
  // A strided (transposed) view of the indices gives the same mask.
  const Tensor<std::int32_t> tr = [&] {
    Tensor<std::int32_t> x(Extents{k, t});
    for (index_t i = 0; i < t; ++i) {
      for (index_t r = 0; r < k; ++r) x(r, i) = got.indices(i, r);
    }
    return x;
  }();
  const TensorView<const std::int32_t> strided(tr.data(), Extents{t, k}, Extents{1, t});
  CHECK(mask_by_broadcast_compare(strided, s) == a);
}

TEST_CASE("DSA sparse attention equals the oracle over the brute-force top-k set") {
  SplitMix64 rng(GENERATE(7, 8));
  const index_t t = 37, s = GENERATE(37, 50), hq = 4, hkv = 2, d = 72, h = 2, di = 8, k = 9;
  const auto q = random_normal(Extents{t, hq, d}, rng), kk = random_normal(Extents{s, hkv, d}, rng),
             v = random_normal(Extents{s, hkv, d}, rng);
  const auto iq = random_normal(Extents{t, h, di}, rng), ik = random_normal(Extents{s, di}, rng),
             iw = random_normal(Extents{t, h}, rng, 0.25f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Path path = GENERATE(Path::full, Path::gathered);
  const Result r = sparse_attention(q.view(), kk.view(), v.view(), scale, iq.view(), ik.view(), iw.view(), k,
                                    execution::Serial{}, path);
  REQUIRE_FALSE(r.bypassed);
  CHECK(r.path.choice == path);
  const Tensor<float> scores = index_scores(iq.view(), ik.view(), iw.view());
  const auto mask = mask_by_scatter(r.topk.indices.view(), s);
  for (index_t i = 0; i < t; ++i) {
    index_t n = 0;
    for (index_t j = 0; j < s; ++j) n += mask(i, j);
    REQUIRE(n == std::min<index_t>(k, i + (s - t) + 1));
  }
  const auto want = reference_attention(q.view(), kk.view(), v.view(), scale,
                                        [&](index_t, index_t i, index_t j) { return mask(i, j) != 0; });
  CHECK(max_abs_diff(r.attention.out, want.out) < 2e-5f);
  CHECK(max_abs_diff(r.attention.lse, want.lse) < 2e-5f);
  // s <= k: no selection, plain causal attention.
  const Result dense = sparse_attention(q.view(), kk.view(), v.view(), scale, iq.view(), ik.view(), iw.view(), s);
  CHECK(dense.bypassed);
  const auto causal = reference_attention(q.view(), kk.view(), v.view(), scale,
                                          [&](index_t, index_t i, index_t j) { return j <= i + (s - t); });
  CHECK(max_abs_diff(dense.attention.out, causal.out) < 2e-5f);
}

TEST_CASE("DSA input validation") {
  const Tensor<std::int32_t> idx(Extents{2, 2}, std::vector<std::int32_t>{0, 1, 3, 8});
  CHECK_THROWS_AS(mask_by_scatter(idx.view(), 8), seqattn::invalid_argument);
  CHECK_THROWS_WITH(mask_by_scatter(idx.view(), 8),
                    Contains("(2, 2)") && Contains("[1, 1] = 8") && Contains("outside [0, 8)"));
  CHECK_THROWS_WITH(mask_by_broadcast_compare(idx.view(), 8), Contains("[1, 1] = 8"));
  CHECK_THROWS_WITH(validate_indices(idx.view(), 4), Contains("[1, 1] = 8") && Contains("outside [0, 4)"));
  const Tensor<std::int32_t> neg(Extents{1, 2}, std::vector<std::int32_t>{-2, 0});
  CHECK_THROWS_WITH(mask_by_scatter(neg.view(), 8), Contains("[0, 0] = -2"));
  const Tensor<float> q(Extents{3, 2, 4}), k(Extents{5, 4}), w(Extents{3, 3});
  CHECK_THROWS_WITH(index_scores(q.view(), k.view(), w.view()),
                    Contains("w must have shape (3, 2)") && Contains("got (3, 3)"));
  const Tensor<float> k3(Extents{5, 3});
  CHECK_THROWS_WITH(index_scores(q.view(), k3.view(), Tensor<float>(Extents{3, 2}).view()), Contains("head_dim 4"));
  CHECK_THROWS_WITH(select_topk(Tensor<float>(Extents{2, 2}).view(), 0), Contains("k must be positive"));
}

TEST_CASE("Gathered per-block execution equals the library's TopKMask over the full K/V") {
  SplitMix64 rng(GENERATE(31, 32));
  const index_t t = 150, s = 150, hq = 2, hkv = 1, d = 24, k = 20;
  Tensor<float> scores(Extents{t, s}, kNotAllowed);
  for (index_t i = 0; i < t; ++i) {
    for (index_t j = 0; j <= i; ++j)
      scores(i, j) = rng.unit() + (i - j < 8 ? 1.0f : 0.0f) + (j % 37 == 0 ? 2.0f : 0.0f);
  }
  const TopK sel = select_topk(scores.view(), k);
  const auto q = random_normal(Extents{t, hq, d}, rng), kk = random_normal(Extents{s, hkv, d}, rng),
             v = random_normal(Extents{s, hkv, d}, rng);
  const index_t block = GENERATE(as<index_t>{}, 64, 7);
  const GatheredSelection g = gather_selection(sel, kk.view(), v.view(), block);
  // Each block's segment is the union of its rows' keys: never larger than the block's causal prefix.
  for (std::size_t b = 0; b < g.kv_lens.size(); ++b) REQUIRE(g.kv_lens[b] <= g.q_offsets[b] + g.q_lens[b]);
  const auto got = attend_thd(q.view(), g.k.view(), g.v.view(), g.table(), 0.4f, GatheredSelectionMask{&g});
  const TopKLayout layout = topk_layout(sel);
  const auto full = attend(q.view(), kk.view(), v.view(), 0.4f, topk_mask(layout));
  const auto mask = mask_by_scatter(sel.indices.view(), s);
  const auto want = reference_attention(q.view(), kk.view(), v.view(), 0.4f,
                                        [&](index_t, index_t i, index_t j) { return mask(i, j) != 0; });
  CHECK(max_abs_diff(got.out, want.out) < 2e-5f);
  CHECK(max_abs_diff(got.lse, want.lse) < 2e-5f);
  CHECK(max_abs_diff(full.out, want.out) < 2e-5f);
  // The description's classify and row bits agree with its predicate.
  const GatheredSelectionMask gm{&g};
  for (index_t b = 0; b < static_cast<index_t>(g.q_lens.size()); ++b) {
    const MaskContext ctx{b, 0, g.q_lens[static_cast<std::size_t>(b)], g.kv_lens[static_cast<std::size_t>(b)]};
    for (int trial = 0; trial < 10 && ctx.kv_len > 0; ++trial) {
      const index_t q0 = rng.below(ctx.q_len), k0 = rng.below(ctx.kv_len);
      const Tile tile{q0, q0 + 1 + rng.below(ctx.q_len - q0), k0, k0 + 1 + rng.below(ctx.kv_len - k0)};
      REQUIRE(gm.classify(ctx, tile) == seqattn::detail::classify_by_scan(gm, ctx, tile));
      std::vector<std::uint64_t> words(static_cast<std::size_t>((tile.cols() + 63) / 64), 0);
      gm.row_bits(ctx, q0, tile.kv_begin, tile.kv_end, words.data());
      for (index_t kv = tile.kv_begin; kv < tile.kv_end; ++kv) {
        const index_t c = kv - tile.kv_begin;
        REQUIRE(((words[static_cast<std::size_t>(c / 64)] >> (c % 64)) & 1u) == (gm.allowed(ctx, q0, kv) ? 1u : 0u));
      }
    }
  }
}

TEST_CASE("The path estimate counts touched tiles and union tiles") {
  // Two blocks of 64 rows over 256 keys, k = 2. Block 0: every row picks keys {0, 200} (2 tiles, union 2 keys);
  // block 1: row i picks {i, i + 64 * (i % 2)}: scattered over tiles 1..3.
  Tensor<float> scores(Extents{128, 256}, kNotAllowed);
  for (index_t i = 0; i < 64; ++i) {
    scores(i, 0) = 2.0f;
    scores(i, 200) = 1.0f;
    scores(i, 5) = 0.5f;
  }
  for (index_t i = 64; i < 128; ++i) {
    scores(i, i) = 2.0f;
    scores(i, std::min<index_t>(255, i + 64 * (i % 2))) = 1.0f;
    scores(i, 3) = 0.1f;
  }
  const TopK sel = select_topk(scores.view(), 2);
  const PathEstimate e = estimate_path(sel);
  CHECK(e.full_tiles == 2 + 3);
  CHECK(e.gathered_tiles == 1 + 2);  // block 1's union: 64 + 32 distinct keys
  CHECK(e.choice == Path::gathered);
}

TEST_CASE("Fused indexer_topk equals index_scores + select_topk") {
  SplitMix64 rng(GENERATE(41, 42));
  const index_t t = 1 + rng.below(70), s = t + rng.below(40), h = 1 + rng.below(5), d = 1 + rng.below(40);
  const index_t k = 1 + rng.below(24);
  const auto q = random_normal(Extents{t, h, d}, rng), kk = random_normal(Extents{s, d}, rng),
             w = random_normal(Extents{t, h}, rng);
  const Tensor<float> scores = index_scores(q.view(), kk.view(), w.view());
  for (TopKOrder order : {TopKOrder::by_score, TopKOrder::by_index}) {
    const TopK a = select_topk(scores.view(), k, order);
    const TopK b = indexer_topk(q.view(), kk.view(), w.view(), k, order);
    CHECK(a.indices == b.indices);
    CHECK(a.counts == b.counts);
    CHECK(a.bypassed_rows == b.bypassed_rows);
  }
  // A sliding-window base mask flows through both the same way.
  const SlidingWindowMask window{5, 0};
  const TopK a = select_topk(index_scores(q.view(), kk.view(), w.view(), window).view(), k);
  const TopK b = indexer_topk(q.view(), kk.view(), w.view(), k, TopKOrder::by_score, window);
  CHECK(a.indices == b.indices);
}

// select_topk ranks what MaxText's top_k sees, score + A with A = 0.0 on an
// allowed key: jax.lax.top_k's total order (NaN above +inf, -NaN below -inf,
// the jax vectors of the semantics doc) on score + 0.0, so the signed zeros tie.
// On random rows of signed zeros, infinities and NaNs it agrees with top_k on
// the rows plus 0.0.
TEST_CASE("select_topk ranks like top_k on score + 0.0") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const TopK zeros = select_topk(one_row({-0.0f, 0.0f, -1.0f}).view(), 2);
  CHECK(zeros.indices(0, 0) == 0);
  CHECK(zeros.indices(0, 1) == 1);
  const TopK with_nan = select_topk(one_row({1.0f, nan, inf, 2.0f, 0.5f}).view(), 3);
  CHECK(with_nan.indices(0, 0) == 1);
  CHECK(with_nan.indices(0, 1) == 2);
  CHECK(with_nan.indices(0, 2) == 3);
  const TopK negative_nan = select_topk(one_row({-nan, -1.0f, 0.5f}).view(), 2);
  CHECK(negative_nan.indices(0, 0) == 2);
  CHECK(negative_nan.indices(0, 1) == 1);

  std::mt19937 rng(77);
  const std::vector<float> pool{-0.0f, 0.0f, nan, -nan, inf, 1.0f, -1.0f, 0.5f};
  for (int trial = 0; trial < 200; ++trial) {
    const index_t s = 3 + static_cast<index_t>(rng() % 12), k = 1 + static_cast<index_t>(rng() % (s - 1));
    std::vector<float> row(static_cast<std::size_t>(s)), plus_zero(static_cast<std::size_t>(s));
    for (auto& x : row) x = pool[rng() % pool.size()];
    std::transform(row.begin(), row.end(), plus_zero.begin(), [](float x) { return x + 0.0f; });
    const TopK got = select_topk(one_row(row).view(), k);
    const Tensor<std::int32_t> want = top_k(one_row(plus_zero).view(), k);
    for (index_t r = 0; r < k; ++r) CHECK(got.indices(0, r) == want(0, r));
  }
}

namespace {

// MaxText's DeepSeek-V3.2 indexer on one row, written out step by step:
// score + A (A = 0.0 where the base mask allows the key, DEFAULT_MASK_VALUE =
// -0.7 * FLT_MAX elsewhere), then jax.lax.top_k (values descending in XLA's
// total order, which puts +0.0 above -0.0, equal values lower index first),
// then + A again, which drops the masked keys a short row had to take. When the
// whole key axis has <= k keys there is no selection and the mask is A. Returns
// the allowed selected keys in top_k's order.
std::vector<std::int32_t> maxtext_selection(const std::vector<float>& score, const std::vector<bool>& allowed,
                                            index_t k) {
  const float mask_value = -0.7f * std::numeric_limits<float>::max();
  const auto s = static_cast<index_t>(score.size());
  std::vector<std::int32_t> keys;
  if (s <= k) {
    for (index_t j = 0; j < s; ++j) {
      if (allowed[static_cast<std::size_t>(j)]) keys.push_back(static_cast<std::int32_t>(j));
    }
    return keys;
  }
  std::vector<float> masked(score.size());
  for (std::size_t j = 0; j < score.size(); ++j) masked[j] = score[j] + (allowed[j] ? 0.0f : mask_value);
  std::vector<std::int32_t> order(score.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = static_cast<std::int32_t>(j);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const float x = masked[static_cast<std::size_t>(a)], y = masked[static_cast<std::size_t>(b)];
    return x > y || (x == y && !std::signbit(x) && std::signbit(y));
  });
  for (index_t r = 0; r < k; ++r) {
    const std::int32_t j = order[static_cast<std::size_t>(r)];
    if (allowed[static_cast<std::size_t>(j)]) keys.push_back(j);
  }
  return keys;
}

}  // namespace

// Issue 29: a caller's precomputed scores may hold -0.0. MaxText adds the mask
// (0.0 on allowed keys) before its top_k, which turns -0.0 into +0.0, so the
// two zeros tie and the lower key index wins.
TEST_CASE("select_topk ties signed zeros as MaxText's score + mask, then top_k") {
  SECTION("minimal case: t = 1, s = 2, k = 1") {
    CHECK(select_topk(one_row({-0.0f, 0.0f}).view(), 1).indices(0, 0) == 0);
    CHECK(select_topk(one_row({0.0f, -0.0f}).view(), 1).indices(0, 0) == 0);
    CHECK(select_topk(one_row({-0.0f, 0.0f}).view(), 1, TopKOrder::by_index).indices(0, 0) == 0);
  }
  SECTION("random rows of signed zeros, +-1 and masked keys") {
    SplitMix64 rng(GENERATE(29, 30, 31, 32));
    const std::vector<float> pool{-0.0f, 0.0f, -0.0f, 0.0f, 1.0f, -1.0f};
    index_t ranked_rows_with_both_zeros = 0;
    for (int trial = 0; trial < 40; ++trial) {
      const index_t t = 1 + rng.below(24), s = 1 + rng.below(40), k = 1 + rng.below(s + 2);
      Tensor<float> scores(Extents{t, s});
      std::vector<std::vector<float>> raw(static_cast<std::size_t>(t));
      std::vector<std::vector<bool>> allowed(static_cast<std::size_t>(t));
      for (index_t i = 0; i < t; ++i) {
        for (index_t j = 0; j < s; ++j) {
          const float x = pool[static_cast<std::size_t>(rng.below(static_cast<index_t>(pool.size())))];
          const bool ok = rng.below(6) != 0;
          raw[static_cast<std::size_t>(i)].push_back(x);
          allowed[static_cast<std::size_t>(i)].push_back(ok);
          scores(i, j) = ok ? x : kNotAllowed;
        }
      }
      const TopK by_score = select_topk(scores.view(), k);
      const TopK by_index = select_topk(scores.view(), k, TopKOrder::by_index);
      for (index_t i = 0; i < t; ++i) {
        const auto& ok = allowed[static_cast<std::size_t>(i)];
        const std::vector<std::int32_t> want = maxtext_selection(raw[static_cast<std::size_t>(i)], ok, k);
        const bool ranked = std::count(ok.begin(), ok.end(), true) > k;
        bool pos = false, neg = false;
        for (index_t j = 0; j < s; ++j) {
          pos |= scores(i, j) == 0.0f && !std::signbit(scores(i, j));
          neg |= scores(i, j) == 0.0f && std::signbit(scores(i, j));
        }
        ranked_rows_with_both_zeros += ranked && pos && neg;
        INFO("trial " << trial << ", row " << i << ", s " << s << ", k " << k);
        REQUIRE(row_set(by_score, i) == std::set<std::int32_t>(want.begin(), want.end()));
        REQUIRE(row_set(by_index, i) == row_set(by_score, i));
        if (ranked) {
          for (index_t r = 0; r < k; ++r) REQUIRE(by_score.indices(i, r) == want[static_cast<std::size_t>(r)]);
        }
      }
    }
    CHECK(ranked_rows_with_both_zeros > 100);  // the rows issue 29 is about are exercised
  }
}

}  // namespace seqattn_test_scenarios_dsa_test
