// AnyMask must answer exactly as the description it wraps: every element,
// every tile class, every BlockMask row and tile bit, and the checks.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "masks/block_mask_checks.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_any_mask_test {

using namespace seqattn;

namespace {

RaggedLengths random_lengths(std::mt19937& rng, index_t batch, index_t max_len, bool square) {
  RaggedLengths l;
  std::uniform_int_distribution<index_t> len(0, max_len);
  for (index_t b = 0; b < batch; ++b) {
    l.q.push_back(len(rng));
    l.kv.push_back(square ? l.q.back() : len(rng));
  }
  return l;
}

// Element by element, tile by tile (random block shapes), and the BlockMasks
// of both, row by row with their tile bits.
template <class M>
void compare(const M& concrete, const AnyMask& erased, const RaggedLengths& lengths, index_t heads, std::mt19937& rng,
             bool same_type = false) {
  // Run-time invariance looks through compositions erased part by part.
  REQUIRE(erased.invariant_over_heads() == detail::runtime_head_invariant(concrete));
  for (index_t b = 0; b < lengths.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      for (index_t q = 0; q < ctx.q_len; ++q) {
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          INFO("batch " << b << " head " << h << " q " << q << " kv " << kv);
          REQUIRE(erased.allowed(ctx, q, kv) == concrete.allowed(ctx, q, kv));
        }
        // row_bits writes the row as the builders write it for the description.
        std::vector<std::uint64_t> want(static_cast<std::size_t>((ctx.kv_len + 63) / 64 + 1), 0);
        std::vector<std::uint64_t> got(want.size(), 0);
        detail::fill_row_bits(concrete, ctx, q, 0, ctx.kv_len, want.data());
        erased.row_bits(ctx, q, 0, ctx.kv_len, got.data());
        REQUIRE(got == want);
      }
      for (int t = 0; t < 40; ++t) {
        std::uniform_int_distribution<index_t> qd(0, ctx.q_len), kd(0, ctx.kv_len);
        index_t q0 = qd(rng), q1 = qd(rng), k0 = kd(rng), k1 = kd(rng);
        if (q0 > q1) std::swap(q0, q1);
        if (k0 > k1) std::swap(k0, k1);
        const Tile tile{q0, q1, k0, k1};
        INFO("tile q [" << q0 << ", " << q1 << ") kv [" << k0 << ", " << k1 << ")");
        const TileClass c = erased.classify(ctx, tile);
        const KvSpan s = erased.kv_span(ctx, q0, q1);
        if (same_type) {
          REQUIRE(c == concrete.classify(ctx, tile));
          if constexpr (HasKvSpan<M>) {
            const KvSpan w = concrete.kv_span(ctx, q0, q1);
            REQUIRE(s.any_begin == w.any_begin);
            REQUIRE(s.any_end == w.any_end);
            REQUIRE(s.all_begin == w.all_begin);
            REQUIRE(s.all_end == w.all_end);
          } else {
            // The fallback promises nothing and excludes nothing.
            REQUIRE(s.all_begin >= s.all_end);
            if (q1 > q0) REQUIRE((s.any_begin == 0 && s.any_end == ctx.kv_len));
          }
        } else {
          // Erased part by part, the composition may know less: it must stay sound.
          const TileClass exact = detail::classify_by_scan(concrete, ctx, tile);
          REQUIRE((c == exact || c == TileClass::partial));
          for (index_t q = q0; q < q1; ++q) {
            for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
              if (concrete.allowed(ctx, q, kv)) REQUIRE((kv >= s.any_begin && kv < s.any_end));
              if (kv >= s.all_begin && kv < s.all_end) REQUIRE(concrete.allowed(ctx, q, kv));
            }
          }
        }
      }
    }
  }
  const BlockShape block{std::uniform_int_distribution<index_t>(1, 24)(rng),
                         std::uniform_int_distribution<index_t>(1, 80)(rng)};
  const BlockMask want = build_block_mask(concrete, lengths, heads, block);
  const BlockMask got = build_block_mask(erased, lengths, heads, block);
  seqattn::testing::check_block_mask(erased, got, heads);
  // One stored head where the description is invariant only at run time
  // (a composition of AnyMasks): every head then reads that one.
  REQUIRE((got.heads() == want.heads() || (got.heads() == 1 && erased.invariant_over_heads())));
  if (same_type) {
    if (got.heads() == want.heads()) {
      REQUIRE(got.num_full_tiles() == want.num_full_tiles());
      REQUIRE(got.num_partial_tiles() == want.num_partial_tiles());
    }
    REQUIRE(got.num_distinct_partial_tiles() == want.num_distinct_partial_tiles());
    for (index_t b = 0; b < lengths.batch(); ++b) {
      for (index_t h = 0; h < heads; ++h) {
        for (index_t qb = 0; qb < want.num_q_blocks(b); ++qb) {
          INFO("batch " << b << " head " << h << " q-block " << qb);
          REQUIRE(got.full_blocks(b, h, qb) == want.full_blocks(b, h, qb));
          const auto gp = got.partial_blocks(b, h, qb), wp = want.partial_blocks(b, h, qb);
          REQUIRE(std::vector<std::int32_t>(gp.begin(), gp.end()) == std::vector<std::int32_t>(wp.begin(), wp.end()));
          const auto gi = got.partial_tile_ids(b, h, qb), wi = want.partial_tile_ids(b, h, qb);
          REQUIRE(gi.size() == wi.size());
          for (std::size_t i = 0; i < gi.size(); ++i) {
            const auto gb = got.tile_bits(gi[i]), wb = want.tile_bits(wi[i]);
            REQUIRE(std::equal(gb.begin(), gb.end(), wb.begin(), wb.end()));
          }
        }
      }
    }
  }
  const auto dense_want = to_dense(concrete, lengths, heads);
  const auto dense_got = to_dense(erased, lengths, heads);
  REQUIRE(dense_got.shape() == dense_want.shape());
  REQUIRE(std::equal(dense_got.values().begin(), dense_got.values().end(), dense_want.values().begin()));
}

template <class M>
void compare(const M& concrete, const RaggedLengths& lengths, index_t heads, std::mt19937& rng) {
  const AnyMask erased(concrete);
  REQUIRE(erased.has_kv_span() == HasKvSpan<M>);
  REQUIRE(erased.has_interval_rows() == IntervalRowMask<M>);
  REQUIRE(erased.target<M>() != nullptr);
  compare(concrete, erased, lengths, heads, rng, true);
}

}  // namespace

TEST_CASE("AnyMask answers like the structural masks it wraps") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, 3, 60, false);
    for (auto a : {Alignment::top_left, Alignment::bottom_right}) {
      compare(FullMask{}, lengths, 2, rng);
      compare(CausalMask{a}, lengths, 2, rng);
      compare(SlidingWindowMask{7, 3, a}, lengths, 2, rng);
      compare(SlidingWindowMask{kUnbounded, 5, a}, lengths, 1, rng);
      compare(ChunkedCausalMask{9, a}, lengths, 1, rng);
      compare(PrefixLMMask{11, {}, a}, lengths, 1, rng);
    }
  }
}

TEST_CASE("AnyMask answers like compositions, and composes itself") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 10; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, 2, 70, trial % 2 == 0);
    const auto window = CausalMask{} & SlidingWindowMask{13, 13};
    const auto either = ChunkedCausalMask{8} | ~SlidingWindowMask{5, 5};
    compare(window, lengths, 2, rng);
    compare(either, lengths, 2, rng);
    // Erasing the parts before composing: the same answers, through AndMask<AnyMask, AnyMask>.
    const AnyMask causal = CausalMask{}, slide = SlidingWindowMask{13, 13};
    compare(causal & slide, lengths, 2, rng);
    CHECK(!is_head_invariant<AndMask<AnyMask, AnyMask>>());
    CHECK(AnyMask(causal & slide).invariant_over_heads());
    CHECK(!AnyMask(causal & AnyMask(DenseMask<std::uint8_t>{})).invariant_over_heads());
    const AnyMask nested = AnyMask(causal & slide);
    compare(window, nested, lengths, 2, rng);
    const AnyMask chunk = ChunkedCausalMask{8};
    compare(either, AnyMask(chunk | ~AnyMask(SlidingWindowMask{5, 5})), lengths, 2, rng);
  }
}

TEST_CASE("AnyMask answers like document, multi-item, top-k, dense and per-head masks") {
  std::mt19937 rng(13);
  SECTION("document masks, inner mask erased or not") {
    // Row 0: a gap of padding, a segment starting at position 4 (a cached prefix); row 1: three segments.
    const std::vector<std::int32_t> ids{1, 1, 1, 2, 2, 2, 2, 0, 0, 3, 1, 1, 2, 2, 2, 3, 3, 3, 3, 0};
    const std::vector<std::int32_t> pos{0, 1, 2, 0, 1, 2, 3, 0, 0, 4, 0, 1, 0, 1, 2, 0, 1, 2, 3, 0};
    const auto layout = std::make_shared<const DocumentLayout>(
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{2, 10}),
                                         TensorView<const std::int32_t>(pos.data(), Extents{2, 10})));
    const RaggedLengths lengths = layout->lengths();
    compare(document_mask(*layout), lengths, 2, rng);
    compare(document_mask(*layout, CausalMask{}), lengths, 2, rng);
    compare(document_mask(*layout, CausalMask{Alignment::bottom_right}), lengths, 1, rng);
    // DocumentMask<AnyMask>, owning its layout: the concrete mask's answers.
    const AnyMask owned(document_mask(*layout, AnyMask(CausalMask{})), layout);
    compare(document_mask(*layout, CausalMask{}), owned, lengths, 2, rng);
    compare(document_mask(*layout, CausalMask{}) & SlidingWindowMask{2, 0}, lengths, 2, rng);
  }
  SECTION("multi-item") {
    MultiItemLayout l;
    const std::vector<std::int32_t> a{10, 11, 99, 21, 22, 99, 31, 99, 41, 42, 43, 99};
    const std::vector<std::int32_t> b{10, 99, 21, 99, 99, 31, 32, 99};
    l.add_packed(a, 99).add_packed(b, 99).add_causal(5);
    RaggedLengths lengths{{12, 8, 5}, {12, 8, 5}};
    compare(multi_item_mask(l), lengths, 1, rng);
  }
  SECTION("top-k") {
    const index_t t = 9, s = 23, k = 4;
    std::vector<std::int32_t> idx;
    for (index_t b = 0; b < 2; ++b) {
      for (index_t q = 0; q < t; ++q) {
        std::vector<std::int32_t> keys(static_cast<std::size_t>(s));
        for (index_t i = 0; i < s; ++i) keys[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
        std::shuffle(keys.begin(), keys.end(), rng);
        for (index_t i = 0; i < k; ++i)
          idx.push_back(i == k - 1 && q % 3 == 0 ? -1 : keys[static_cast<std::size_t>(i)]);
      }
    }
    const TopKLayout layout = TopKLayout::from_indices(TensorView<const std::int32_t>(idx.data(), Extents{2, t, k}), s);
    compare(topk_mask(layout), RaggedLengths::uniform(2, t, s), 1, rng);
    compare(topk_mask(layout) & CausalMask{Alignment::bottom_right}, RaggedLengths::uniform(2, t, s), 1, rng);
  }
  SECTION("dense and per-head") {
    const index_t heads = 3, qm = 17, km = 21;
    Tensor<std::uint8_t> values(Extents{2, heads, qm, km});
    std::bernoulli_distribution coin(0.4);
    for (auto& v : values.values()) v = coin(rng) ? 1 : 0;
    const RaggedLengths lengths{{17, 9}, {21, 14}};
    compare(DenseMask<std::uint8_t>{values.view()}, lengths, heads, rng);
    const std::vector<SlidingWindowMask> per_head{{2, 0}, {kUnbounded, 0}, {4, 4}};
    compare(PerHeadMask<SlidingWindowMask>{per_head}, lengths, heads, rng);
    // PerHeadMask<AnyMask>: heads of different kinds in one mask.
    const std::vector<AnyMask> kinds{SlidingWindowMask{2, 0}, CausalMask{}, DenseMask<std::uint8_t>{values.view()}};
    const PerHeadMask<AnyMask> mixed{kinds};
    for (index_t b = 0; b < lengths.batch(); ++b) {
      for (index_t h = 0; h < heads; ++h) {
        const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
        for (index_t q = 0; q < ctx.q_len; ++q) {
          for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
            const bool want = h == 0   ? SlidingWindowMask{2, 0}.allowed(ctx, q, kv)
                              : h == 1 ? CausalMask{}.allowed(ctx, q, kv)
                                       : values(b, h, q, kv) != 0;
            REQUIRE(mixed.allowed(ctx, q, kv) == want);
          }
        }
      }
    }
    seqattn::testing::check_block_mask(mixed, build_block_mask(AnyMask(mixed), lengths, heads, {4, 8}), heads);
  }
}

// Erased leaves with interval rows keep their rows through row_intervals:
// compositions of them, and documents around them, classify every tile
// exactly (as a scan would) and write tile bits an interval at a time.
template <class M>
void require_exact_classes(const M& concrete, const AnyMask& erased, const RaggedLengths& lengths, std::mt19937& rng) {
  const BlockShape block{std::uniform_int_distribution<index_t>(1, 24)(rng),
                         std::uniform_int_distribution<index_t>(1, 80)(rng)};
  const BlockMask got = build_block_mask(erased, lengths, 1, block);
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const MaskContext ctx{b, 0, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
    for (index_t q = 0; q < ctx.q_len; ++q) REQUIRE(erased.row_intervals(ctx, q).exact);
    for (index_t qb = 0; qb < got.num_q_blocks(b); ++qb) {
      index_t full = 0, partial = 0;
      for (index_t kb = 0; kb < got.num_kv_blocks(b); ++kb) {
        const TileClass c = detail::classify_by_scan(concrete, ctx, got.tile(b, qb, kb));
        INFO("batch " << b << " q-block " << qb << " kv-block " << kb);
        REQUIRE(erased.classify(ctx, got.tile(b, qb, kb)) == c);
        full += c == TileClass::full;
        partial += c == TileClass::partial;
      }
      index_t listed_full = 0;
      for (const BlockRange r : got.full_ranges(b, 0, qb)) listed_full += r.end - r.begin;
      REQUIRE(listed_full == full);
      REQUIRE(static_cast<index_t>(got.partial_blocks(b, 0, qb).size()) == partial);
    }
  }
  seqattn::testing::check_block_mask(erased, got, 1);
}

TEST_CASE("Compositions and documents of AnyMasks classify exactly") {
  std::mt19937 rng(14);
  const std::vector<std::int32_t> ids{1, 1, 1, 2, 2, 2, 2, 0, 0, 3, 1, 1, 2, 2, 2, 3, 3, 3, 3, 0};
  const std::vector<std::int32_t> pos{0, 1, 2, 0, 1, 2, 3, 0, 0, 4, 0, 1, 0, 1, 2, 0, 1, 2, 3, 0};
  const auto layout = std::make_shared<const DocumentLayout>(
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{2, 10}),
                                       TensorView<const std::int32_t>(pos.data(), Extents{2, 10})));
  const AnyMask causal = CausalMask{}, slide = SlidingWindowMask{3, 1}, chunk = ChunkedCausalMask{4};
  for (int trial = 0; trial < 10; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, 2, 70, trial % 2 == 0);
    require_exact_classes(CausalMask{} & SlidingWindowMask{3, 1}, causal & slide, lengths, rng);
    require_exact_classes(ChunkedCausalMask{4} | ~SlidingWindowMask{3, 1}, AnyMask(chunk | ~slide), lengths, rng);
    require_exact_classes(document_mask(*layout, CausalMask{} & SlidingWindowMask{3, 1}),
                          AnyMask(document_mask(*layout, AnyMask(causal & slide)), layout), layout->lengths(), rng);
  }
  // A leaf without interval rows leaves its rows inexact: callers fall back to the predicate.
  Tensor<std::uint8_t> dense(Extents{1, 1, 10, 10});
  for (auto& v : dense.values()) v = 1;
  const AnyMask erased_dense = DenseMask<std::uint8_t>{dense.view()};
  CHECK(!erased_dense.row_intervals(MaskContext{0, 0, 10, 10}, 3).exact);
  CHECK(!AnyMask(causal & erased_dense).row_intervals(MaskContext{0, 0, 10, 10}, 3).exact);
}

TEST_CASE("AnyMask forwards checks and builds head-invariant masks once") {
  const AnyMask chunk = ChunkedCausalMask{0};
  CHECK_THROWS_WITH(build_block_mask(chunk, RaggedLengths::uniform(1, 8, 8), 1, {4, 4}),
                    Catch::Matchers::Contains("ChunkedCausalMask: chunk must be positive, got 0"));
  const std::vector<SlidingWindowMask> two{{1, 0}, {2, 0}};
  const AnyMask per_head = PerHeadMask<SlidingWindowMask>{two};
  CHECK_THROWS_WITH(to_dense(per_head, RaggedLengths::uniform(1, 8, 8), 3),
                    Catch::Matchers::Contains("PerHeadMask: 2 masks but attention has 3 heads"));
  // The head count is checked even when only one head is stored.
  CHECK_THROWS_WITH(build_block_mask(per_head, RaggedLengths::uniform(1, 8, 8), 3, {4, 4}),
                    Catch::Matchers::Contains("PerHeadMask: 2 masks but attention has 3 heads"));
  CHECK(build_block_mask(AnyMask(CausalMask{}), RaggedLengths::uniform(2, 64, 64), 8, {16, 16}).heads() == 1);
  CHECK(build_block_mask(per_head, RaggedLengths::uniform(2, 64, 64), 2, {16, 16}).heads() == 2);
  // A default AnyMask allows everything.
  const AnyMask none;
  CHECK(none.allowed({0, 0, 4, 4}, 3, 0));
  CHECK(none.target<FullMask>() != nullptr);
  CHECK(none.target<CausalMask>() == nullptr);
}

TEST_CASE("shift invariance: the masks that depend on kv - q alone, through and / or / not and AnyMask") {
  const AnyMask causal = CausalMask{}, slide = SlidingWindowMask{13, 2, Alignment::bottom_right};
  CHECK(causal.invariant_over_shifts());
  CHECK(AnyMask(FullMask{}).invariant_over_shifts());
  CHECK(AnyMask(causal & ~slide).invariant_over_shifts());
  CHECK(AnyMask(AnyMask(causal | slide)).invariant_over_shifts());
  CHECK(detail::runtime_shift_invariant(CausalMask{Alignment::bottom_right} & ~SlidingWindowMask{4, 0}));
  // Masks that know where a sequence starts, and anything composed with one.
  CHECK(!AnyMask(PrefixLMMask{.prefix = 3}).invariant_over_shifts());
  CHECK(!AnyMask(ChunkedCausalMask{8}).invariant_over_shifts());
  CHECK(!AnyMask(causal & AnyMask(ChunkedCausalMask{8})).invariant_over_shifts());
  CHECK(!detail::runtime_shift_invariant(~PrefixLMMask{.prefix = 3}));
  CHECK(!AnyMask(DenseMask<std::uint8_t>{}).invariant_over_shifts());
  const std::vector<std::int32_t> ids = {1, 1, 2, 2};
  const DocumentLayout layout =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, 4}));
  CHECK(!detail::runtime_shift_invariant(document_mask(layout, CausalMask{})));
  CHECK(detail::runtime_head_invariant(document_mask(layout, CausalMask{})));  // documents are looked into for heads
}

}  // namespace seqattn_test_masks_any_mask_test
