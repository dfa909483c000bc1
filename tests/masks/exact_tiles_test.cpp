// Exact tile classes of mask combinations (masks/combinators.hpp): and / or /
// not of interval masks classify every tile exactly (equal to brute force),
// and a tally shows that tiles the old combination rule left partial are now
// full or empty, so the test fails if the refinement stops happening.
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "seqattn/masks.hpp"

#include "masks/block_mask_checks.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_exact_tiles_test {

using namespace seqattn;

namespace {

using Rng = std::mt19937;

index_t uniform(Rng& rng, index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); }

// The combination rule before exact classes: each side's (old) class,
// combined soundly; an and of two monotone-interval masks by their rows' ends.
template <class M>
TileClass old_classify(const M& m, const MaskContext& ctx, const Tile& t);

template <class M>
struct OldRule {
  static TileClass of(const M& m, const MaskContext& ctx, const Tile& t) { return m.classify(ctx, t); }
};
template <class A, class B>
struct OldRule<AndMask<A, B>> {
  static TileClass of(const AndMask<A, B>& m, const MaskContext& ctx, const Tile& t) {
    if constexpr (IntervalRowMask<A> && IntervalRowMask<B>) {
      return detail::classify_interval_rows(m, ctx, t);
    } else {
      const TileClass x = old_classify(m.a, ctx, t), y = old_classify(m.b, ctx, t);
      if (x == TileClass::empty || y == TileClass::empty) return TileClass::empty;
      return (x == TileClass::full && y == TileClass::full) ? TileClass::full : TileClass::partial;
    }
  }
};
template <class A, class B>
struct OldRule<OrMask<A, B>> {
  static TileClass of(const OrMask<A, B>& m, const MaskContext& ctx, const Tile& t) {
    const TileClass x = old_classify(m.a, ctx, t), y = old_classify(m.b, ctx, t);
    if (x == TileClass::full || y == TileClass::full) return TileClass::full;
    return (x == TileClass::empty && y == TileClass::empty) ? TileClass::empty : TileClass::partial;
  }
};
template <class A>
struct OldRule<NotMask<A>> {
  static TileClass of(const NotMask<A>& m, const MaskContext& ctx, const Tile& t) {
    switch (old_classify(m.a, ctx, t)) {
      case TileClass::empty:
        return (t.rows() > 0 && t.cols() > 0) ? TileClass::full : TileClass::empty;
      case TileClass::full:
        return TileClass::empty;
      default:
        return TileClass::partial;
    }
  }
};
template <class M>
TileClass old_classify(const M& m, const MaskContext& ctx, const Tile& t) {
  return OldRule<M>::of(m, ctx, t);
}

struct Tally {
  index_t tiles = 0;
  index_t old_partial_now_full = 0;
  index_t old_partial_now_empty = 0;
};

Alignment random_alignment(Rng& rng) { return uniform(rng, 0, 1) ? Alignment::bottom_right : Alignment::top_left; }
CausalMask random_causal(Rng& rng) { return {random_alignment(rng)}; }
SlidingWindowMask random_window(Rng& rng) {
  return {uniform(rng, -1, 40), uniform(rng, -1, 40), random_alignment(rng)};
}
ChunkedCausalMask random_chunked(Rng& rng) { return {uniform(rng, 1, 48), random_alignment(rng)}; }
PrefixLMMask random_prefix(Rng& rng) { return {uniform(rng, 0, 60), {}, random_alignment(rng)}; }

// Every tile of a random grid: the class equals brute force exactly, and
// never contradicts the old sound rule; plus the BlockMask built from it.
template <class M>
void check_exact(const M& mask, Rng& rng, Tally& tally, index_t batch_lengths_max = 150) {
  const index_t batch = uniform(rng, 1, 3);
  RaggedLengths lengths;
  for (index_t b = 0; b < batch; ++b) {
    const index_t q_len = uniform(rng, 0, batch_lengths_max);
    lengths.q.push_back(q_len);
    lengths.kv.push_back(uniform(rng, 0, 1) ? q_len : uniform(rng, 0, batch_lengths_max));
  }
  const BlockShape block{uniform(rng, 1, 40), uniform(rng, 1, 40)};
  for (index_t b = 0; b < batch; ++b) {
    const MaskContext ctx{b, 0, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
    for (index_t q0 = 0; q0 < ctx.q_len; q0 += block.q) {
      for (index_t k0 = 0; k0 < ctx.kv_len; k0 += block.kv) {
        const Tile t{q0, std::min(q0 + block.q, ctx.q_len), k0, std::min(k0 + block.kv, ctx.kv_len)};
        const TileClass brute = detail::classify_by_scan(mask, ctx, t);
        const TileClass got = mask.classify(ctx, t);
        const TileClass old = old_classify(mask, ctx, t);
        if (got != brute) {
          INFO("b=" << b << " tile q [" << t.q_begin << ", " << t.q_end << ") kv [" << t.kv_begin << ", " << t.kv_end
                    << ") q_len " << ctx.q_len << " kv_len " << ctx.kv_len);
          REQUIRE(static_cast<int>(got) == static_cast<int>(brute));
        }
        REQUIRE((old == TileClass::partial || old == brute));
        ++tally.tiles;
        if (old == TileClass::partial && got == TileClass::full) ++tally.old_partial_now_full;
        if (old == TileClass::partial && got == TileClass::empty) ++tally.old_partial_now_empty;
      }
    }
  }
  const index_t heads = 2;
  const BlockMask bm = build_block_mask(mask, lengths, heads, block);
  seqattn::testing::check_block_mask(mask, bm, heads);
}

}  // namespace

TEST_CASE("interval sets: union, intersection and complement agree with the element view", "[masks][exact]") {
  Rng rng(7);
  for (int it = 0; it < 2000; ++it) {
    const index_t n = uniform(rng, 0, 40);
    auto random_set = [&] {
      KvIntervalSet s;
      index_t at = uniform(rng, 0, 4);
      for (int i = 0; i < 3 && at < n; ++i) {
        const index_t e = std::min(n, at + uniform(rng, 0, 8));
        s.push({at, e});
        at = e + uniform(rng, 0, 6);
      }
      return s;
    };
    const KvIntervalSet x = random_set(), y = random_set();
    auto has = [](const KvIntervalSet& s, index_t k) { return s.meets(k, k + 1); };
    const KvIntervalSet u = detail::unite(x, y), i = detail::intersect(x, y), c = detail::complement(x, n);
    REQUIRE(u.exact);
    for (index_t k = 0; k < n; ++k) {
      REQUIRE(has(u, k) == (has(x, k) || has(y, k)));
      REQUIRE(has(i, k) == (has(x, k) && has(y, k)));
      REQUIRE(has(c, k) == !has(x, k));
    }
    for (const KvIntervalSet* s : {&u, &i, &c}) {
      for (int j = 1; j < s->size; ++j) REQUIRE((*s)[j - 1].end < (*s)[j].begin);  // sorted, non-adjacent
      const index_t b = uniform(rng, 0, n), e = uniform(rng, b, n + 1);
      if (e > b) {
        bool all = true;
        for (index_t k = b; k < e; ++k) all = all && has(*s, k);
        REQUIRE(s->covers(b, e) == all);
      }
    }
  }
  KvIntervalSet full;
  for (int i = 0; i < KvIntervalSet::kCapacity; ++i) full.push({3 * i, 3 * i + 1});
  REQUIRE(full.exact);
  full.push({100, 101});
  REQUIRE_FALSE(full.exact);
  REQUIRE_FALSE(detail::unite(full, KvIntervalSet::of({0, 1})).exact);
}

TEST_CASE("or / not / and of interval masks classify tiles exactly", "[masks][exact]") {
  Rng rng(2024);
  Tally tally;
  for (int it = 0; it < 60; ++it) {
    check_exact(random_causal(rng) | random_window(rng), rng, tally);
    check_exact(random_window(rng) | random_window(rng), rng, tally);
    check_exact(~(random_causal(rng) | random_prefix(rng)), rng, tally);
    check_exact(~random_window(rng) & ~random_chunked(rng), rng, tally);
    check_exact(random_chunked(rng) | (random_window(rng) & ~random_causal(rng)), rng, tally);
    check_exact(~(random_window(rng) | random_window(rng)) | random_prefix(rng), rng, tally);
    check_exact(random_causal(rng) & SlidingWindowMask{0, kUnbounded, random_alignment(rng)}, rng, tally);
    check_exact((random_window(rng) | random_chunked(rng)) & (random_causal(rng) | random_window(rng)), rng, tally);
    check_exact(~~random_window(rng), rng, tally);
  }
  INFO("tiles " << tally.tiles << ", partial -> full " << tally.old_partial_now_full << ", partial -> empty "
                << tally.old_partial_now_empty);
  CHECK(tally.old_partial_now_full > 0);
  CHECK(tally.old_partial_now_empty > 0);
}

TEST_CASE("documents of causal masks combined with windows classify exactly", "[masks][exact]") {
  Rng rng(99);
  Tally tally;
  for (int it = 0; it < 40; ++it) {
    // Random documents over one sequence of 0..120 tokens, with padding (-1).
    const index_t n = uniform(rng, 0, 120);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), pos(static_cast<std::size_t>(n));
    std::int32_t id = 1, p = 0;
    for (index_t i = 0; i < n; ++i) {
      if (uniform(rng, 0, 9) == 0) ++id, p = 0;
      // A padding token (id 0) ends its document: runs must stay contiguous.
      const bool pad = uniform(rng, 0, 15) == 0;
      ids[static_cast<std::size_t>(i)] = pad ? 0 : id;
      pos[static_cast<std::size_t>(i)] = p++;
      if (pad) ++id, p = 0;
    }
    const auto layout = DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, n}),
                                                         TensorView<const std::int32_t>(pos.data(), Extents{1, n}));
    const auto docs = document_mask(layout, CausalMask{});
    const SlidingWindowMask window{uniform(rng, 0, 30), 0, Alignment::top_left};
    auto run = [&](const auto& mask) {
      const BlockShape block{uniform(rng, 1, 24), uniform(rng, 1, 24)};
      const MaskContext ctx{0, 0, n, n};
      for (index_t q0 = 0; q0 < n; q0 += block.q) {
        for (index_t k0 = 0; k0 < n; k0 += block.kv) {
          const Tile t{q0, std::min(q0 + block.q, n), k0, std::min(k0 + block.kv, n)};
          const TileClass brute = detail::classify_by_scan(mask, ctx, t), got = mask.classify(ctx, t);
          REQUIRE(static_cast<int>(got) == static_cast<int>(brute));
          const TileClass old = old_classify(mask, ctx, t);
          ++tally.tiles;
          if (old == TileClass::partial && got == TileClass::full) ++tally.old_partial_now_full;
          if (old == TileClass::partial && got == TileClass::empty) ++tally.old_partial_now_empty;
        }
      }
      const BlockMask bm = build_block_mask(mask, layout.lengths(), 1, block);
      seqattn::testing::check_block_mask(mask, bm, 1);
    };
    run(docs | window);
    run(~docs & ~window);
    run(~(docs | CausalMask{}) | window);
  }
  CHECK(tally.old_partial_now_full + tally.old_partial_now_empty > 0);
}

TEST_CASE("combinations with a side that is not an interval mask stay sound", "[masks][exact]") {
  // A dense side has no row intervals: its combination keeps the cheap rule.
  Rng rng(5);
  const index_t n = 50;
  std::vector<std::uint8_t> dense(static_cast<std::size_t>(n * n));
  for (auto& x : dense) x = static_cast<std::uint8_t>(uniform(rng, 0, 3) == 0);
  const DenseMask<std::uint8_t> dm{TensorView<const std::uint8_t>(dense.data(), Extents{1, 1, n, n})};
  const auto mask = dm | CausalMask{};
  static_assert(!RowSetMask<std::remove_cvref_t<decltype(mask)>>);
  const MaskContext ctx{0, 0, n, n};
  for (index_t q0 = 0; q0 < n; q0 += 7) {
    for (index_t k0 = 0; k0 < n; k0 += 9) {
      const Tile t{q0, std::min(q0 + 7, n), k0, std::min(k0 + 9, n)};
      const TileClass brute = detail::classify_by_scan(mask, ctx, t), got = mask.classify(ctx, t);
      REQUIRE((got == TileClass::partial || got == brute));
    }
  }
}

namespace {
// A data-driven mask that scans its tiles and says so.
struct ScanningStripes {
  static constexpr bool head_invariant = true;
  static constexpr bool classifies_by_scan = true;
  index_t period = 7;
  bool allowed(const MaskContext&, index_t, index_t kv) const { return kv % period == 0; }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};
}  // namespace

TEST_CASE("combinations with a side that scans anyway are scanned exactly", "[masks][exact]") {
  Rng rng(17);
  Tally tally;
  for (int it = 0; it < 30; ++it) {
    const ScanningStripes stripes{uniform(rng, 1, 9)};
    check_exact(stripes | random_causal(rng), rng, tally, 90);
    check_exact(~stripes & ~random_window(rng), rng, tally, 90);
    check_exact(~(stripes | random_window(rng)), rng, tally, 90);
  }
  CHECK(tally.old_partial_now_full + tally.old_partial_now_empty > 0);
}

}  // namespace seqattn_test_masks_exact_tiles_test
