// mask_mod (masks/custom.hpp): a predicate lambda is a mask description. Each
// representation of a mask_mod (dense, packed bits, BlockMask, attention)
// must equal that of the equivalent built-in description element by element
// on random ragged shapes, compositions must work, and a lying tile
// classifier must be caught where custom.hpp promises.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/masks.hpp"

#include "masks/block_mask_checks.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_custom_mask_test {

using namespace seqattn;

namespace {

RaggedLengths random_lengths(std::mt19937& rng, index_t max_len, bool square) {
  RaggedLengths l;
  const index_t batch = std::uniform_int_distribution<index_t>(1, 3)(rng);
  std::uniform_int_distribution<index_t> len(0, max_len);
  for (index_t b = 0; b < batch; ++b) {
    l.q.push_back(len(rng));
    l.kv.push_back(square ? l.q.back() : len(rng));
  }
  return l;
}

// The element (b, h, q, kv) as the BlockMask's tile data says it, without its
// predicate: full ranges, partial blocks and their stored bits.
bool tile_element(const BlockMask& bm, index_t b, index_t h, index_t q, index_t kv) {
  const index_t qb = q / bm.block_shape().q, kb = kv / bm.block_shape().kv;
  for (const BlockRange r : bm.full_ranges(b, h, qb)) {
    if (kb >= r.begin && kb < r.end) return true;
  }
  const auto partial = bm.partial_blocks(b, h, qb);
  for (std::size_t i = 0; i < partial.size(); ++i) {
    if (partial[i] != kb) continue;
    const auto bits = bm.tile_bits(bm.partial_tile_ids(b, h, qb)[i]);
    const index_t row = q - qb * bm.block_shape().q, col = kv - kb * bm.block_shape().kv;
    return (bits[static_cast<std::size_t>(row * bm.words_per_row() + col / 64)] >> (col % 64)) & 1u;
  }
  return false;
}

Tensor<float> random_tokens(index_t tokens, index_t heads, index_t dim, std::mt19937& rng) {
  Tensor<float> t(Extents{tokens, heads, dim});
  std::normal_distribution<float> n;
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = n(rng);
  return t;
}

// THD attention over the sequences of `lengths` (one segment each): the
// mask_mod on Highway and on the reference against the built-in on the
// reference.
template <class Custom, class Builtin>
void check_attention(const Custom& custom, const Builtin& builtin, const RaggedLengths& lengths, index_t heads,
                     std::mt19937& rng) {
  std::vector<std::int32_t> q_off, q_len, kv_off, kv_len;
  index_t tq = 0, tkv = 0;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    q_off.push_back(static_cast<std::int32_t>(tq));
    kv_off.push_back(static_cast<std::int32_t>(tkv));
    q_len.push_back(static_cast<std::int32_t>(lengths.q[static_cast<std::size_t>(b)]));
    kv_len.push_back(static_cast<std::int32_t>(lengths.kv[static_cast<std::size_t>(b)]));
    tq += q_len.back();
    tkv += kv_len.back();
  }
  const SegmentTable table{q_off, q_len, kv_off, kv_len};
  const index_t kv_heads = heads % 2 == 0 ? heads / 2 : heads, dim = 24;
  const Tensor<float> q = random_tokens(tq, heads, dim, rng);
  const Tensor<float> k = random_tokens(tkv, kv_heads, dim, rng);
  const Tensor<float> v = random_tokens(tkv, kv_heads, dim, rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view(), &table};
  const AttentionShape shape = shape_of(in);
  Tensor<float> want(Extents{tq, heads, dim}, 7.0f), got = want, ref_custom = want;
  Tensor<float> want_lse(Extents{heads, tq}, 7.0f), got_lse = want_lse, ref_custom_lse = want_lse;
  attention_forward(plan_attention<backends::Reference>(shape, builtin), in, want.view(), want_lse.view());
  attention_forward(plan_attention<backends::Reference>(shape, custom), in, ref_custom.view(), ref_custom_lse.view());
  execution::ThreadPool pool(2);
  attention_forward(plan_attention<backends::Highway>(shape, custom, {}, pool.workers()), in, got.view(),
                    got_lse.view(), pool);
  for (index_t i = 0; i < want.size(); ++i) {
    REQUIRE(ref_custom.data()[i] == want.data()[i]);  // same mask, same exact softmax
    const float tol = 1e-5f * std::max(1.0f, std::fabs(want.data()[i]));
    if (!(std::fabs(got.data()[i] - want.data()[i]) <= tol)) {
      INFO("output element " << i << ": Highway " << got.data()[i] << ", reference " << want.data()[i]);
      REQUIRE(std::fabs(got.data()[i] - want.data()[i]) <= tol);
    }
  }
  for (index_t i = 0; i < want_lse.size(); ++i) {
    REQUIRE(ref_custom_lse.data()[i] == want_lse.data()[i]);
    const float w = want_lse.data()[i], g = got_lse.data()[i];
    if (std::isinf(w)) {
      REQUIRE(g == w);
    } else {
      INFO("lse element " << i);
      REQUIRE(std::fabs(g - w) <= 1e-5f * std::max(1.0f, std::fabs(w)));
    }
  }
}

// A mask_mod without a classifier (not a combination, not a classifier).
template <class M>
constexpr bool scanned_mask_mod() {
  if constexpr (requires { M::has_classifier; }) {
    return !M::has_classifier;
  } else {
    return false;
  }
}

// Every representation of `custom` equals that of `builtin` on `lengths`.
template <class Custom, class Builtin>
void check_equivalent(const Custom& custom, const Builtin& builtin, const RaggedLengths& lengths, index_t heads,
                      std::mt19937& rng, bool attention = true) {
  INFO("batch " << lengths.batch() << ", heads " << heads);
  // Dense, element by element.
  const Tensor<std::uint8_t> dc = to_dense(custom, lengths, heads), db = to_dense(builtin, lengths, heads);
  REQUIRE(dc.shape() == db.shape());
  for (index_t i = 0; i < dc.size(); ++i) {
    if (dc.data()[i] != db.data()[i]) {
      INFO("to_dense flat element " << i << " of shape " << dc.shape());
      REQUIRE(dc.data()[i] == db.data()[i]);
    }
  }
  // Packed bits, read back per element (the built-in may store one head).
  const PackedMask pc = pack_bits(custom, lengths, heads), pb = pack_bits(builtin, lengths, heads);
  const DenseBitsMask rc{pc.view()}, rb{pb.view()};
  // BlockMasks of a random block shape: classes sound, bits right, and the
  // same element everywhere from tile data alone.
  std::uniform_int_distribution<index_t> blk(1, 40);
  const BlockShape block{blk(rng), blk(rng)};
  INFO("block (" << block.q << ", " << block.kv << ")");
  const BlockMask bc = build_block_mask(custom, lengths, heads, block);
  const BlockMask bb = build_block_mask(builtin, lengths, heads, block);
  testing::check_block_mask(custom, bc, heads);
  for (index_t b = 0; b < lengths.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      for (index_t q = 0; q < ctx.q_len; ++q) {
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          const bool want = builtin.allowed(ctx, q, kv);
          if (custom.allowed(ctx, q, kv) != want || rc.allowed(ctx, q, kv) != rb.allowed(ctx, q, kv) ||
              tile_element(bc, b, h, q, kv) != want || tile_element(bb, b, h, q, kv) != want ||
              bc.allowed(ctx, q, kv) != want) {
            INFO("element (b " << b << ", h " << h << ", q " << q << ", kv " << kv << ")");
            REQUIRE(custom.allowed(ctx, q, kv) == want);
            REQUIRE(rc.allowed(ctx, q, kv) == rb.allowed(ctx, q, kv));
            REQUIRE(tile_element(bc, b, h, q, kv) == want);
            REQUIRE(tile_element(bb, b, h, q, kv) == want);
            REQUIRE(bc.allowed(ctx, q, kv) == want);
          }
        }
      }
      // A scanned mask_mod classifies exactly; a classifier or a
      // combination may answer partial for a full or empty tile (sound).
      constexpr bool scanned = scanned_mask_mod<Custom>();
      for (index_t qb = 0; qb < bc.num_q_blocks(b); ++qb) {
        for (index_t kb = 0; kb < bc.num_kv_blocks(b); ++kb) {
          const Tile t = bc.tile(b, qb, kb);
          const TileClass exact = detail::classify_by_scan(builtin, ctx, t);
          const TileClass got = custom.classify(ctx, t);
          INFO("tile (q-block " << qb << ", kv-block " << kb << ")");
          if (scanned || got != TileClass::partial) REQUIRE(got == exact);
        }
      }
    }
  }
  if (attention) check_attention(custom, builtin, lengths, heads, rng);
}

}  // namespace

TEST_CASE("mask_mod: structural masks from lambdas equal the built-ins", "[masks][custom]") {
  std::mt19937 rng(4401);
  // Random ragged shapes, square and not, 1 to 4 heads.
  const auto each_shape = [&rng](auto&& check) {
    for (int trial = 0; trial < 6; ++trial) {
      const RaggedLengths lengths = random_lengths(rng, 90, trial % 2 == 0);
      check(lengths, std::uniform_int_distribution<index_t>(1, 4)(rng));
    }
  };
  SECTION("causal, top-left") {
    each_shape([&](const RaggedLengths& lengths, index_t heads) {
      check_equivalent(mask_mod([](index_t, index_t, index_t q, index_t kv) { return kv <= q; }), CausalMask{}, lengths,
                       heads, rng);
    });
  }
  SECTION("causal, bottom-right (lengths captured)") {
    each_shape([&](const RaggedLengths& lengths, index_t heads) {
      const std::span<const index_t> ql = lengths.q, kl = lengths.kv;
      check_equivalent(mask_mod([ql, kl](index_t b, index_t, index_t q, index_t kv) {
                         const auto u = static_cast<std::size_t>(b);
                         return kv <= q + kl[u] - ql[u];
                       }),
                       CausalMask{Alignment::bottom_right}, lengths, heads, rng);
    });
  }
  SECTION("sliding window") {
    each_shape([&](const RaggedLengths& lengths, index_t heads) {
      std::uniform_int_distribution<index_t> side(-1, 30);
      const index_t left = side(rng), right = side(rng);
      INFO("window (" << left << ", " << right << ")");
      check_equivalent(mask_mod([left, right](index_t, index_t, index_t q, index_t kv) {
                         return (left < 0 || kv - q >= -left) && (right < 0 || kv - q <= right);
                       }),
                       SlidingWindowMask{left, right}, lengths, heads, rng);
    });
  }
  SECTION("per-head windows (the head argument)") {
    each_shape([&](const RaggedLengths& lengths, index_t heads) {
      std::vector<SlidingWindowMask> per_head;
      for (index_t h = 0; h < heads; ++h) per_head.push_back({std::uniform_int_distribution<index_t>(0, 20)(rng), 0});
      const std::span<const SlidingWindowMask> w = per_head;
      check_equivalent(mask_mod([w](index_t, index_t h, index_t q, index_t kv) {
                         return kv <= q && q - kv <= w[static_cast<std::size_t>(h)].left;
                       }),
                       PerHeadMask<SlidingWindowMask>{per_head}, lengths, heads, rng);
    });
  }
}

TEST_CASE("mask_mod: documents from segment ids equal document_mask", "[masks][custom]") {
  std::mt19937 rng(4402);
  for (int trial = 0; trial < 6; ++trial) {
    const index_t batch = std::uniform_int_distribution<index_t>(1, 3)(rng);
    const index_t tokens = std::uniform_int_distribution<index_t>(1, 100)(rng);
    std::vector<std::int32_t> ids;
    for (index_t b = 0; b < batch; ++b) {
      std::int32_t id = 0;
      index_t left = 0;
      for (index_t t = 0; t < tokens; ++t) {
        if (left == 0) {
          left = std::uniform_int_distribution<index_t>(1, 25)(rng);
          id = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 0 : static_cast<std::int32_t>(t + 1);
        }
        --left;
        ids.push_back(id);
      }
    }
    const DocumentLayout layout =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{batch, tokens}));
    const std::span<const std::int32_t> seg = ids;
    const auto same_doc = [seg, tokens](index_t b, index_t, index_t q, index_t kv) {
      const std::int32_t a = seg[static_cast<std::size_t>(b * tokens + q)];
      return a != 0 && a == seg[static_cast<std::size_t>(b * tokens + kv)];
    };
    const index_t heads = std::uniform_int_distribution<index_t>(1, 3)(rng);
    INFO("trial " << trial << ": " << batch << " rows of " << tokens << " tokens");
    check_equivalent(mask_mod(same_doc), document_mask(layout), layout.lengths(), heads, rng);
    check_equivalent(
        mask_mod([same_doc](index_t b, index_t h, index_t q, index_t kv) { return kv <= q && same_doc(b, h, q, kv); }),
        document_mask(layout, CausalMask{}), layout.lengths(), heads, rng);
    // A mask_mod AND a built-in.
    check_equivalent(mask_mod(same_doc) & CausalMask{}, document_mask(layout, CausalMask{}), layout.lengths(), heads,
                     rng);
  }
}

TEST_CASE("mask_mod: composition with &, | and ~", "[masks][custom]") {
  std::mt19937 rng(4403);
  const auto causal = mask_mod([](index_t, index_t, index_t q, index_t kv) { return kv <= q; });
  const auto band = mask_mod([](index_t, index_t, index_t q, index_t kv) { return q - kv <= 4 && kv - q <= 4; });
  const auto stripes = mask_mod([](index_t, index_t, index_t, index_t kv) { return kv % 7 == 0; });
  for (int trial = 0; trial < 4; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, 70, trial % 2 == 0);
    const index_t heads = std::uniform_int_distribution<index_t>(1, 3)(rng);
    INFO("trial " << trial);
    check_equivalent(causal & ~band, CausalMask{} & ~SlidingWindowMask{4, 4}, lengths, heads, rng);
    check_equivalent(band | causal, SlidingWindowMask{4, 4} | CausalMask{}, lengths, heads, rng);
    check_equivalent(~(causal | band), ~(CausalMask{} | SlidingWindowMask{4, 4}), lengths, heads, rng);
    // Mixed with built-ins; the built-in side spells the stripes as a dense
    // mask over the longest sequence.
    index_t qm = 0, km = 0;
    for (index_t b = 0; b < lengths.batch(); ++b) {
      qm = std::max(qm, lengths.q[static_cast<std::size_t>(b)]);
      km = std::max(km, lengths.kv[static_cast<std::size_t>(b)]);
    }
    Tensor<std::uint8_t> dense(Extents{qm, km}, 0);
    for (index_t q = 0; q < qm; ++q) {
      for (index_t kv = 0; kv < km; ++kv) dense(q, kv) = kv % 7 == 0;
    }
    const auto builtin_stripes = DenseMask<std::uint8_t>{dense.view()};
    check_equivalent((stripes | band) & CausalMask{}, (builtin_stripes | SlidingWindowMask{4, 4}) & CausalMask{},
                     lengths, heads, rng);
  }
}

TEST_CASE("mask_mod: a classifier is used, and a lying one is caught", "[masks][custom]") {
  std::mt19937 rng(4404);
  const auto causal = [](index_t, index_t, index_t q, index_t kv) { return kv <= q; };
  const auto exact = [](const MaskContext& ctx, const Tile& t) { return CausalMask{}.classify(ctx, t); };
  const RaggedLengths lengths = random_lengths(rng, 80, false);

  SECTION("an exact classifier gives the built-in's BlockMask and attention") {
    int calls = 0;
    const auto counting = [&calls, exact](const MaskContext& ctx, const Tile& t) {
      ++calls;
      return exact(ctx, t);
    };
    const auto m = mask_mod(causal, counting);
    const BlockMask bm = build_block_mask(m, lengths, 2, {16, 16});
    CHECK(calls > 0);  // the classifier, not a scan, classified the tiles
    const BlockMask want = build_block_mask(CausalMask{}, lengths, 2, {16, 16});
    for (index_t b = 0; b < lengths.batch(); ++b) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        for (index_t h = 0; h < 2; ++h) {
          CHECK(bm.full_blocks(b, h, qb) == want.full_blocks(b, 0, qb));
          const auto p = bm.partial_blocks(b, h, qb), pw = want.partial_blocks(b, 0, qb);
          CHECK(std::vector<std::int32_t>(p.begin(), p.end()) == std::vector<std::int32_t>(pw.begin(), pw.end()));
        }
      }
    }
    check_equivalent(mask_mod(causal, exact).verified(), CausalMask{}, lengths, 2, rng);
    CHECK_NOTHROW(check_tile_classes(mask_mod(causal, exact), lengths, 3, {5, 9}));
  }

  SECTION("a classifier that always answers partial is sound") {
    const auto cautious = mask_mod(causal, [](const MaskContext&, const Tile&) { return TileClass::partial; });
    CHECK_NOTHROW(check_tile_classes(cautious, lengths, 1, {8, 8}));
    check_equivalent(cautious.verified(), CausalMask{}, lengths, 1, rng);
  }

  // Claims every tile full: true below the diagonal only.
  const auto liar = mask_mod(causal, [](const MaskContext&, const Tile&) { return TileClass::full; });
  RaggedLengths square = RaggedLengths::uniform(2, 40, 40);
  SECTION("check_tile_classes catches it in any build") {
    CHECK_THROWS_AS(check_tile_classes(liar, square, 1, {8, 8}), seqattn::invalid_argument);
    CHECK_THROWS_WITH(check_tile_classes(liar, square, 1, {8, 8}),
                      ContainsSubstring("is classified full but element (q 0, kv 1) is masked"));
  }
  SECTION("verified() catches it when the BlockMask or the plan is built") {
    CHECK_THROWS_WITH(build_block_mask(liar.verified(), square, 1, {8, 8}),
                      ContainsSubstring("mask_mod classifier: tile (q [0, 8), kv [0, 8)) of sequence 0"));
    AttentionShape shape;
    shape.lengths = square;
    shape.heads = shape.kv_heads = 1;
    shape.dk = shape.dv = 8;
    CHECK_THROWS_AS(plan_attention<backends::Highway>(shape, liar.verified()), seqattn::invalid_argument);
  }
  SECTION("an empty claim over allowed elements is caught too") {
    const auto hides = mask_mod(causal, [](const MaskContext&, const Tile&) { return TileClass::empty; });
    CHECK_THROWS_WITH(check_tile_classes(hides, square, 1, {8, 8}),
                      ContainsSubstring("classified empty but element (q 0, kv 0) is allowed"));
  }
  SECTION("unverified, it is caught exactly in builds without NDEBUG") {
#ifdef NDEBUG
    CHECK_FALSE(liar.verify);
    CHECK_NOTHROW(build_block_mask(liar, square, 1, {8, 8}));  // trusted: the price of skipping the scan
#else
    CHECK(liar.verify);
    CHECK_THROWS_AS(build_block_mask(liar, square, 1, {8, 8}), seqattn::invalid_argument);
#endif
  }
}

TEST_CASE("mask_mod: scanned classes equal brute force on random tiles", "[masks][custom]") {
  std::mt19937 rng(4405);
  const auto pattern = mask_mod([](index_t b, index_t h, index_t q, index_t kv) {
    return ((q * 31 + kv * 17 + b * 5 + h) % 11) < 4 || (q / 8 == kv / 8);
  });
  for (int i = 0; i < 300; ++i) {
    std::uniform_int_distribution<index_t> c(0, 60);
    const MaskContext ctx{c(rng) % 3, c(rng) % 2, 60, 60};
    index_t q0 = c(rng), q1 = c(rng), k0 = c(rng), k1 = c(rng);
    if (q0 > q1) std::swap(q0, q1);
    if (k0 > k1) std::swap(k0, k1);
    const Tile t{q0, q1, k0, k1};
    REQUIRE(pattern.classify(ctx, t) == detail::classify_by_scan(pattern, ctx, t));
  }
}

TEST_CASE("mask_mod: descriptions are copyable values", "[masks][custom]") {
  const auto below = [](index_t limit) { return [limit](index_t, index_t, index_t q, index_t) { return q < limit; }; };
  auto a = mask_mod(below(1));
  const auto b = mask_mod(below(3));
  static_assert(MaskDescription<decltype(a)>);
  const MaskContext ctx{0, 0, 4, 4};
  CHECK_FALSE(a.allowed(ctx, 2, 0));
  a = b;  // a lambda with captures has no copy assignment; the description does
  CHECK(a.allowed(ctx, 2, 0));
}

}  // namespace seqattn_test_masks_custom_mask_test
