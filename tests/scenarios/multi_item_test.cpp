#include <cmath>
#include <cstdint>
#include <vector>

#include "seqattn/scenarios.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_scenarios_multi_item_test {

using namespace seqattn;
using namespace seqattn::scenarios;
using namespace seqattn::scenarios::multi_item;
using Catch::Matchers::Contains;

namespace {

constexpr token_t kDelim = 99;

Options opts(token_t delimiter = kDelim) {
  Options o;
  o.delimiter = delimiter;
  return o;
}

std::vector<std::vector<int>> mask_matrix(const PackedRequest& r) {
  std::vector<std::vector<int>> m(static_cast<std::size_t>(r.size()),
                                  std::vector<int>(static_cast<std::size_t>(r.size())));
  for (index_t q = 0; q < r.size(); ++q) {
    for (index_t k = 0; k < r.size(); ++k)
      m[static_cast<std::size_t>(q)][static_cast<std::size_t>(k)] = r.allowed(q, k);
  }
  return m;
}

std::vector<std::vector<token_t>> random_items(SplitMix64& rng, index_t n, index_t max_len, index_t vocab, token_t d) {
  std::vector<std::vector<token_t>> items(static_cast<std::size_t>(n));
  for (auto& it : items) {
    const index_t len = rng.below(max_len + 1);
    for (index_t i = 0; i < len; ++i) {
      token_t t = static_cast<token_t>(rng.below(vocab));
      if (t == d) t = (t + 1) % static_cast<token_t>(vocab);
      it.push_back(t);
    }
  }
  return items;
}

}  // namespace

TEST_CASE("TV-A1: canonical layout, positions, segment starts and mask") {
  const std::vector<token_t> query{10, 11};
  const std::vector<std::vector<token_t>> items{{21, 22}, {31}};
  const PackedRequest r = pack(query, items, opts());
  CHECK(r.tokens == std::vector<token_t>{10, 11, 99, 21, 22, 99, 31, 99});
  CHECK(r.delimiters == std::vector<index_t>{2, 5, 7});
  CHECK(r.prefix_end() == 3);
  CHECK(r.row_seg_starts == std::vector<std::int32_t>{0, 0, 0, 3, 3, 3, 6, 6});
  CHECK(r.positions == std::vector<std::int32_t>{0, 1, 2, 3, 4, 2, 3, 2});
  CHECK(r.score_row(0) == 4);
  CHECK(r.score_row(1) == 6);
  CHECK(r.upstream_score_row(0) == 4);
  CHECK(r.upstream_score_row(1) == 6);
  const std::vector<std::vector<int>> expected{
      {1, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 0, 0, 0, 0},
      {1, 1, 1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 0, 0}, {1, 1, 1, 0, 0, 0, 1, 0}, {1, 1, 1, 0, 0, 0, 1, 1}};
  const auto m = mask_matrix(r);
  CHECK(m == expected);
  // The v2 JIT dense builder's rows (item 2 sees item 1) must not be reproduced.
  CHECK(m[6] != std::vector<int>{1, 1, 1, 1, 1, 1, 1, 0});
  CHECK(m[7] != std::vector<int>{1, 1, 1, 1, 1, 0, 0, 1});
  // The library's description and its dense form are the same predicate.
  const MultiItemLayout layout = layout_of(r);
  const Tensor<std::uint8_t> dense = to_dense(multi_item_mask(layout), layout.lengths());
  for (index_t q = 0; q < 8; ++q) {
    for (index_t k = 0; k < 8; ++k) CHECK(dense(0, 0, q, k) == expected[q][k]);
  }
}

TEST_CASE("TV-A2: empty item, scored at the first delimiter rather than the neighbour's row") {
  const std::vector<token_t> query{10};
  const std::vector<std::vector<token_t>> items{{21}, {}, {31, 32}};
  const PackedRequest r = pack(query, items, opts());
  CHECK(r.tokens == std::vector<token_t>{10, 99, 21, 99, 99, 31, 32, 99});
  CHECK(r.delimiters == std::vector<index_t>{1, 3, 4, 7});
  CHECK(r.prefix_end() == 2);
  CHECK(r.row_seg_starts == std::vector<std::int32_t>{0, 0, 2, 2, 4, 5, 5, 5});
  CHECK(r.positions == std::vector<std::int32_t>{0, 1, 2, 1, 1, 2, 3, 1});
  const std::vector<std::vector<int>> expected{
      {1, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 0, 0, 0, 0},
      {1, 1, 0, 0, 1, 0, 0, 0}, {1, 1, 0, 0, 0, 1, 0, 0}, {1, 1, 0, 0, 0, 1, 1, 0}, {1, 1, 0, 0, 0, 1, 1, 1}};
  CHECK(mask_matrix(r) == expected);
  CHECK(r.upstream_score_row(0) == 2);
  CHECK(r.upstream_score_row(1) == 3);  // upstream: a row that sees item 1's token 2
  CHECK(r.upstream_score_row(2) == 6);
  CHECK(r.score_row(0) == 2);
  CHECK(r.score_row(1) == 1);  // ours: the state of `query ‖ d`
  CHECK(r.score_row(2) == 6);
}

TEST_CASE("TV-A3: batch of a multi-item and a normal request") {
  const std::vector<token_t> req0{5, 99, 7, 99};
  MultiItemLayout layout;
  layout.add_packed(req0, kDelim).add_causal(3);
  const SegmentMetadata seg = segment_metadata(layout);
  CHECK(seg.token_offsets == std::vector<index_t>{0, 4, 7});
  CHECK(seg.prefix_end == std::vector<std::int32_t>{2, 0});
  CHECK(seg.row_seg_start == std::vector<std::int32_t>{0, 0, 2, 2, 0, 0, 0});
  const Tensor<std::uint8_t> dense = to_dense(multi_item_mask(layout), layout.lengths());
  const std::vector<std::vector<int>> block0{{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}};
  for (index_t q = 0; q < 4; ++q) {
    for (index_t k = 0; k < 4; ++k) {
      CHECK(dense(0, 0, q, k) == block0[static_cast<std::size_t>(q)][static_cast<std::size_t>(k)]);
      CHECK(dense(1, 0, q, k) == (q < 3 && k <= q ? 1 : 0));  // req1: causal, padded rows/cols 0
    }
  }
}

TEST_CASE("TV-A4: GQA heads share the token-level mask") {
  // Every q head of a KV group sees the same rows: the descriptions are head-invariant
  // and attention with Hq=4, Hkv=2 matches the oracle that applies the token mask per head.
  STATIC_REQUIRE(is_head_invariant<MultiItemMask>());
  const PackedRequest r = pack(std::vector<token_t>{10, 11}, std::vector<std::vector<token_t>>{{21, 22}, {31}}, opts());
  SplitMix64 rng(4);
  const auto q = random_normal(Extents{8, 4, 8}, rng), k = random_normal(Extents{8, 2, 8}, rng),
             v = random_normal(Extents{8, 2, 8}, rng);
  const MultiItemLayout layout = layout_of(r);
  const auto got = attend(q.view(), k.view(), v.view(), 0.35f, multi_item_mask(layout));
  const auto want = reference_attention(q.view(), k.view(), v.view(), 0.35f,
                                        [&](index_t, index_t i, index_t j) { return r.allowed(i, j); });
  CHECK(max_abs_diff(got.out, want.out) < 1e-5f);
  CHECK(max_abs_diff(got.lse, want.lse) < 1e-5f);
}

TEST_CASE("TV-A5: label score readout") {
  const std::vector<float> both{-0.5f, -1.5f};
  auto s = label_scores(both, true);
  CHECK_THAT(s[0], Catch::Matchers::WithinAbs(0.731059, 1e-6));
  CHECK_THAT(s[1], Catch::Matchers::WithinAbs(0.268941, 1e-6));
  s = label_scores(both, false);
  CHECK_THAT(s[0], Catch::Matchers::WithinAbs(0.606531, 1e-6));
  CHECK_THAT(s[1], Catch::Matchers::WithinAbs(0.223130, 1e-6));
  const std::vector<float> missing{-0.5f, -INFINITY};
  s = label_scores(missing, true);
  CHECK_THAT(s[0], Catch::Matchers::WithinAbs(1.0, 1e-7));
  CHECK(s[1] == 0.0f);
  s = label_scores(missing, false);
  CHECK_THAT(s[0], Catch::Matchers::WithinAbs(0.606531, 1e-6));
  CHECK(s[1] == 0.0f);
}

TEST_CASE("TV-A6: mode selection, chunking and packed length") {
  CHECK(select_mask_mode(MaskMode::automatic, 4096, 32768, 32768) == MaskMode::segment);
  CHECK(select_mask_mode(MaskMode::automatic, 4096, 0, 32768) == MaskMode::dense);
  CHECK(select_mask_mode(MaskMode::dense, 4096, 32768, 32768) == MaskMode::dense);
  CHECK(select_mask_mode(MaskMode::dense, 1, 32768, 32768) == MaskMode::dense);
  CHECK(select_mask_mode(MaskMode::segment, 40000, 0, 65536) == MaskMode::segment);
  CHECK(select_mask_mode(MaskMode::automatic, 65536, 32768, 65536) == MaskMode::dense);
  CHECK_THROWS_WITH(select_mask_mode(MaskMode::automatic, 65536, 32768, 32768),
                    Contains("65536") && Contains("max_seq_len 32768"));
  const auto chunks = chunk_items(70, 32);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0] == std::pair<index_t, index_t>{0, 32});
  CHECK(chunks[1] == std::pair<index_t, index_t>{32, 64});
  CHECK(chunks[2] == std::pair<index_t, index_t>{64, 70});
  CHECK(chunk_items(70, 0).size() == 1);
  const std::vector<index_t> lens{5, 6, 5};
  CHECK(packed_length(4, lens) == 24);
  // Each chunk is packed with the full query and yields n + 1 delimiters.
  std::vector<std::vector<token_t>> items(70, std::vector<token_t>{3});
  for (auto [b, e] : chunks) {
    const auto r = pack(std::vector<token_t>{1, 2, 3, 4},
                        std::span(items).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), opts());
    CHECK(static_cast<index_t>(r.delimiters.size()) == e - b + 1);
    CHECK(r.query_len == 4);
  }
}

TEST_CASE("Multi-item input validation names the argument") {
  const std::vector<std::vector<token_t>> items{{1, 2}, {3}};
  CHECK_THROWS_AS(pack(std::vector<token_t>{}, items, opts()), seqattn::invalid_argument);
  CHECK_THROWS_WITH(pack(std::vector<token_t>{}, items, opts()), Contains("query is empty"));
  CHECK_THROWS_WITH(pack(std::vector<token_t>{1}, std::vector<std::vector<token_t>>{}, opts()),
                    Contains("items is empty"));
  CHECK_THROWS_WITH(pack(std::vector<token_t>{1, 99}, items, opts()), Contains("query[1]") && Contains("delimiter"));
  const std::vector<std::vector<token_t>> bad{{1, 2}, {3, 99, 4}};
  CHECK_THROWS_WITH(pack(std::vector<token_t>{1}, bad, opts()), Contains("items[1][1]"));
  Options small = opts();
  small.max_items = 1;
  CHECK_THROWS_WITH(pack(std::vector<token_t>{1}, items, small), Contains("2 items exceed max_items 1"));
  small = opts();
  small.max_seq_len = 5;
  CHECK_THROWS_WITH(pack(std::vector<token_t>{1}, items, small), Contains("packed length 7"));
  CHECK_THROWS_WITH(reset_positions(std::vector<token_t>{1, 2}, 99), Contains("no delimiter"));
  CHECK_THROWS_WITH(segment_starts(std::vector<token_t>{1, 99, 2}, 99), Contains("at least 2"));
  CHECK_THROWS_WITH(segment_starts(std::vector<token_t>{1, 99, 2, 99, 3}, 99), Contains("do not end with"));
  const TinyModel model;
  const std::vector<token_t> labels{1, 200};
  CHECK_THROWS_WITH(score_items(model, std::vector<token_t>{1}, items, labels, opts(63)), Contains("labels[1] = 200"));
  const std::vector<token_t> ok_labels{1, 2};
  CHECK_THROWS_WITH(score_items(model, std::vector<token_t>{1}, items, ok_labels, opts(99)),
                    Contains("delimiter 99 outside"));
  const std::vector<std::vector<token_t>> oov{{1, 70}};
  CHECK_THROWS_WITH(score_items(model, std::vector<token_t>{1}, oov, ok_labels, opts(63)), Contains("tokens[3] = 70"));
}

TEST_CASE("The library's MultiItemMask agrees with the scenario predicate, tiles included") {
  SplitMix64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const index_t qlen = 1 + rng.below(6);
    std::vector<token_t> query(static_cast<std::size_t>(qlen), 1);
    const auto items = random_items(rng, 1 + rng.below(12), 7, 50, kDelim);
    const PackedRequest r = pack(query, items, opts());
    const MultiItemLayout layout = layout_of(r);
    const MultiItemMask m = multi_item_mask(layout);
    const MaskContext ctx{0, 0, r.size(), r.size()};
    for (index_t q = 0; q < r.size(); ++q) {
      for (index_t k = 0; k < r.size(); ++k) {
        INFO("trial " << trial << " q " << q << " k " << k);
        REQUIRE(m.allowed(ctx, q, k) == r.allowed(q, k));
      }
    }
    for (int t = 0; t < 30; ++t) {
      const index_t q0 = rng.below(r.size()), k0 = rng.below(r.size());
      const Tile tile{q0, q0 + 1 + rng.below(r.size() - q0), k0, k0 + 1 + rng.below(r.size() - k0)};
      const TileClass got = m.classify(ctx, tile), brute = seqattn::detail::classify_by_scan(m, ctx, tile);
      INFO("trial " << trial << ": " << r.size() << " tokens, prefix_end " << r.prefix_end() << ", tile q ["
                    << tile.q_begin << ", " << tile.q_end << ") kv [" << tile.kv_begin << ", " << tile.kv_end
                    << "): classify " << int(got) << ", brute force " << int(brute));
      REQUIRE((got == brute || got == TileClass::partial));  // sound; partial is always allowed
    }
  }
}

TEST_CASE("Engine attention under both representations equals the oracle on packed requests") {
  SplitMix64 rng(GENERATE(21, 22));
  const auto items = random_items(rng, 40, 9, 50, kDelim);
  const PackedRequest r = pack(std::vector<token_t>{1, 2, 3, 4, 5}, items, opts());
  const index_t n = r.size(), d = GENERATE(as<index_t>{}, 16, 72);
  const Projections p{random_normal(Extents{n, 4, d}, rng), random_normal(Extents{n, 2, d}, rng),
                      random_normal(Extents{n, 2, d}, rng)};
  const auto want = reference_attention(p.q.view(), p.k.view(), p.v.view(), 0.2f,
                                        [&](index_t, index_t i, index_t j) { return r.allowed(i, j); });
  for (MaskMode mode : {MaskMode::segment, MaskMode::dense}) {
    INFO("mode " << to_string(mode) << ", " << n << " tokens, head_dim " << d);
    const auto got = attend_packed(p, 0.2f, r, mode);
    CHECK(max_abs_diff(got.out, want.out) < 2e-5f);
    CHECK(max_abs_diff(got.lse, want.lse) < 2e-5f);
  }
}

TEST_CASE("Packed scoring: dense == segment, and every item equals its serial request") {
  const TinyModel model;
  SplitMix64 rng(GENERATE(1, 2, 3));
  const token_t d = 63;
  const std::vector<token_t> labels{5, 17, 42};
  std::vector<token_t> query;
  for (index_t i = 0, n = 1 + rng.below(6); i < n; ++i) query.push_back(static_cast<token_t>(rng.below(63)));
  auto items = random_items(rng, 9, 6, 63, d);
  items[2].clear();  // empty items, including two in a row and the first one
  items[3].clear();
  if (rng.below(2) == 0) items[0].clear();
  Options o = opts(d);
  o.chunk_size = GENERATE(0, 4);
  o.mode = MaskMode::dense;
  const ScoreResult dense = score_items(model, query, items, labels, o);
  o.mode = MaskMode::segment;
  const ScoreResult segment = score_items(model, query, items, labels, o);
  REQUIRE(dense.scores.size() == items.size());
  REQUIRE(segment.scores.size() == items.size());
  for (std::size_t j = 0; j < items.size(); ++j) {
    const auto serial = score_serial(model, query, items[j], labels, o);
    for (std::size_t l = 0; l < labels.size(); ++l) {
      INFO("item " << j << " (length " << items[j].size() << ") label " << l);
      CHECK_THAT(dense.scores[j][l], Catch::Matchers::WithinAbs(segment.scores[j][l], 1e-4));
      CHECK_THAT(segment.scores[j][l], Catch::Matchers::WithinAbs(serial[l], 1e-4));
    }
  }
}

TEST_CASE("Automatic mode switches on the padded token count") {
  const TinyModel model;
  const std::vector<token_t> query{1, 2, 3};
  const std::vector<std::vector<token_t>> items{{4, 5}, {6}, {}, {7}};
  const std::vector<token_t> labels{10, 11};
  Options o = opts(63);
  o.chunk_size = 2;  // chunks of 3 + 1 + 2 + 1 + 1 + 1 = 9 and 3 + 1 + 0 + 1 + 1 + 1 = 7 tokens
  o.segment_threshold = 8;
  auto r = score_items(model, query, items, labels, o);
  CHECK(r.chunk_modes == std::vector<MaskMode>{MaskMode::dense, MaskMode::segment});
  o.padded_tokens = 16;
  o.segment_threshold = 16;
  r = score_items(model, query, items, labels, o);
  CHECK(r.chunk_modes == std::vector<MaskMode>{MaskMode::segment, MaskMode::segment});
  o.max_seq_len = 12;
  CHECK_THROWS_WITH(score_items(model, query, items, labels, o), Contains("padded token count 16"));
}

TEST_CASE("No item sees another: editing one item moves no other score, and empty items ignore their neighbour") {
  const TinyModel model;
  const token_t d = 63;
  const std::vector<token_t> labels{3, 30, 33};
  const std::vector<token_t> query{8, 9, 10, 11};
  std::vector<std::vector<token_t>> items{{1, 2, 3}, {4}, {}, {5, 6, 7, 8, 9}, {}, {10, 11}};
  Options o = opts(d);
  o.chunk_size = 0;
  o.mode = GENERATE(MaskMode::dense, MaskMode::segment);
  const ScoreResult base = score_items(model, query, items, labels, o);
  for (std::size_t edit : {1u, 3u}) {
    auto changed = items;
    changed[edit] = edit == 1 ? std::vector<token_t>{40, 41, 42, 43} : std::vector<token_t>{12};  // new lengths
    const ScoreResult after = score_items(model, query, changed, labels, o);
    for (std::size_t j = 0; j < items.size(); ++j) {
      if (j == edit) continue;
      for (std::size_t l = 0; l < labels.size(); ++l) {
        INFO("edited item " << edit << ", item " << j << " label " << l);
        CHECK_THAT(after.scores[j][l], Catch::Matchers::WithinAbs(base.scores[j][l], 1e-5));
      }
    }
  }
  // The empty items (2 and 4) score exactly like `query ‖ d`, whatever precedes them.
  const auto alone = score_serial(model, query, std::vector<token_t>{}, labels, o);
  for (std::size_t l = 0; l < labels.size(); ++l) {
    CHECK_THAT(base.scores[2][l], Catch::Matchers::WithinAbs(alone[l], 1e-5));
    CHECK_THAT(base.scores[4][l], Catch::Matchers::WithinAbs(alone[l], 1e-5));
  }
  // Upstream's readout row for item 2 (the delimiter closing item 1) does depend on item 1.
  const PackedRequest r = pack(query, items, o);
  auto changed = items;
  changed[1] = {44};
  const PackedRequest r2 = pack(query, changed, o);
  const auto logp_at = [&](const PackedRequest& p, index_t row) {
    const Projections pr = model.project(p.tokens, p.positions);
    const AttentionOutput a = attend_packed(pr, model.softmax_scale(), p, MaskMode::segment);
    return model.logprobs(p.tokens, a.out, std::span(&row, 1));
  };
  CHECK(max_abs_diff(logp_at(r, r.upstream_score_row(2)), logp_at(r2, r2.upstream_score_row(2))) > 1e-3f);
  CHECK(max_abs_diff(logp_at(r, r.score_row(2)), logp_at(r2, r2.score_row(2))) == 0.0f);
}

}  // namespace seqattn_test_scenarios_multi_item_test
