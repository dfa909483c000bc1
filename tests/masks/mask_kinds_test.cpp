// Every mask kind against its element predicate: tile classes against brute
// force, optional hooks against the predicate, every representation element
// by element, the hook-using BlockMask builder against the plain one, and the
// transposed BlockMask against the transposed predicate.
#include <algorithm>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "seqattn/masks.hpp"

#include "masks/block_mask_checks.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_mask_kinds_test {

using namespace seqattn;
using seqattn::testing::check_block_mask;

namespace {

using Rng = std::mt19937;

index_t uniform(Rng& rng, index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); }

// The structural interval masks: every hook the concepts detect, and plain
// aggregates (positional and designated initializers).
template <class M>
constexpr bool interval_hooks() {
  const bool hooks[] = {MaskDescription<M>, HasRowInterval<M>,      IntervalRowMask<M>,    HasKvSpan<M>,
                        !HasRowBits<M>,     is_head_invariant<M>(), std::is_aggregate_v<M>};
  return std::all_of(std::begin(hooks), std::end(hooks), [](bool h) { return h; });
}
static_assert(interval_hooks<CausalMask>() && interval_hooks<SlidingWindowMask>() &&
              interval_hooks<ChunkedCausalMask>() && interval_hooks<PrefixLMMask>());
static_assert(!HasCheck<CausalMask> && !HasCheck<SlidingWindowMask> && HasCheck<ChunkedCausalMask> &&
              HasCheck<PrefixLMMask>);
static_assert(CausalMask{Alignment::bottom_right}.alignment == Alignment::bottom_right &&
              SlidingWindowMask{6, 2}.right == 2 && ChunkedCausalMask{8}.chunk == 8 &&
              PrefixLMMask{.prefix = 4}.prefix == 4);

// The mask seen from the key side: rows are keys.
template <class M>
struct Transposed {
  static constexpr bool head_invariant = is_head_invariant<M>();
  M m;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return m.allowed({ctx.batch, ctx.head, ctx.kv_len, ctx.q_len}, kv, q);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

void require_same(const BlockMask& x, const BlockMask& y) {
  REQUIRE(x.batch() == y.batch());
  REQUIRE(x.heads() == y.heads());
  REQUIRE(x.num_full_tiles() == y.num_full_tiles());
  REQUIRE(x.num_partial_tiles() == y.num_partial_tiles());
  REQUIRE(x.num_distinct_partial_tiles() == y.num_distinct_partial_tiles());
  for (index_t b = 0; b < x.batch(); ++b) {
    for (index_t h = 0; h < x.heads(); ++h) {
      for (index_t qb = 0; qb < x.num_q_blocks(b); ++qb) {
        auto fx = x.full_ranges(b, h, qb), fy = y.full_ranges(b, h, qb);
        REQUIRE(std::vector<BlockRange>(fx.begin(), fx.end()) == std::vector<BlockRange>(fy.begin(), fy.end()));
        auto px = x.partial_blocks(b, h, qb), py = y.partial_blocks(b, h, qb);
        REQUIRE(std::vector<std::int32_t>(px.begin(), px.end()) == std::vector<std::int32_t>(py.begin(), py.end()));
        auto ix = x.partial_tile_ids(b, h, qb), iy = y.partial_tile_ids(b, h, qb);
        REQUIRE(std::vector<std::int32_t>(ix.begin(), ix.end()) == std::vector<std::int32_t>(iy.begin(), iy.end()));
      }
    }
  }
  for (index_t id = 0; id < x.num_distinct_partial_tiles(); ++id) {
    auto bx = x.tile_bits(static_cast<std::int32_t>(id)), by = y.tile_bits(static_cast<std::int32_t>(id));
    REQUIRE(std::equal(bx.begin(), bx.end(), by.begin(), by.end()));
  }
}

// Optional hooks agree with the predicate.
template <class M>
void check_hooks(const M& mask, const MaskContext& ctx, Rng& rng) {
  if constexpr (HasRowInterval<M>) {
    for (index_t q = 0; q < ctx.q_len; ++q) {
      const KvInterval iv = mask.row_interval(ctx, q);
      for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
        const bool in = kv >= iv.begin && kv < iv.end;
        if (in != mask.allowed(ctx, q, kv)) {
          INFO("row_interval q=" << q << " kv=" << kv << " [" << iv.begin << ", " << iv.end << ")");
          REQUIRE(in == mask.allowed(ctx, q, kv));
        }
      }
    }
  }
  if constexpr (IntervalRowMask<M>) {
    for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
      const index_t f = mask.first_row_reaching(ctx, kv);
      for (index_t q = 0; q < ctx.q_len; ++q) {
        REQUIRE((mask.row_interval(ctx, q).end > kv) == (q >= f));
      }
    }
  }
  if constexpr (HasRowBits<M>) {
    for (index_t q = 0; q < ctx.q_len; ++q) {
      const index_t k0 = uniform(rng, 0, ctx.kv_len), k1 = uniform(rng, k0, ctx.kv_len);
      std::vector<std::uint64_t> words(static_cast<std::size_t>((k1 - k0 + 63) / 64 + 1), 0);
      mask.row_bits(ctx, q, k0, k1, words.data());
      for (index_t kv = k0; kv < k1; ++kv) {
        const bool bit = (words[static_cast<std::size_t>((kv - k0) / 64)] >> ((kv - k0) % 64)) & 1u;
        REQUIRE(bit == mask.allowed(ctx, q, kv));
      }
    }
  }
  if constexpr (HasKvSpan<M>) {
    for (int i = 0; i < 12 && ctx.q_len > 0; ++i) {
      const index_t q0 = uniform(rng, 0, ctx.q_len - 1), q1 = uniform(rng, q0 + 1, ctx.q_len);
      const KvSpan s = mask.kv_span(ctx, q0, q1);
      for (index_t q = q0; q < q1; ++q) {
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          const bool a = mask.allowed(ctx, q, kv);
          if (a && (kv < s.any_begin || kv >= s.any_end)) {
            INFO("kv_span any [" << s.any_begin << ", " << s.any_end << ") misses q=" << q << " kv=" << kv);
            REQUIRE(false);
          }
          if (!a && kv >= s.all_begin && kv < s.all_end) {
            INFO("kv_span all [" << s.all_begin << ", " << s.all_end << ") wrongly has q=" << q << " kv=" << kv);
            REQUIRE(false);
          }
        }
      }
    }
  }
}

// Random tiles: the class is sound, and exact where the kind promises it.
template <class M>
void check_classify(const M& mask, const MaskContext& ctx, bool exact, Rng& rng) {
  for (int i = 0; i < 60; ++i) {
    const index_t q0 = uniform(rng, 0, ctx.q_len), q1 = uniform(rng, q0, ctx.q_len);
    const index_t k0 = uniform(rng, 0, ctx.kv_len), k1 = uniform(rng, k0, ctx.kv_len);
    const Tile t{q0, q1, k0, k1};
    const TileClass got = mask.classify(ctx, t);
    const TileClass brute = detail::classify_by_scan(mask, ctx, t);
    INFO("tile q[" << q0 << ", " << q1 << ") kv[" << k0 << ", " << k1 << ")");
    if (exact || got != TileClass::partial) REQUIRE(got == brute);
  }
}

// Everything about one description on one batch.
template <class M>
void check_everything(const M& mask, const RaggedLengths& lengths, index_t heads, bool exact, Rng& rng) {
  const index_t qmax = detail::max_of(lengths.q), kmax = detail::max_of(lengths.kv);
  for (index_t b = 0; b < lengths.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      check_hooks(mask, ctx, rng);
      check_classify(mask, ctx, exact, rng);
    }
  }
  const BlockShape block{uniform(rng, 1, std::max<index_t>(1, qmax + 2)),
                         uniform(rng, 1, std::max<index_t>(1, std::min<index_t>(kmax + 2, 140)))};
  INFO("block " << block.q << "x" << block.kv << " mask " << typeid(M).name());
  const BlockMask bm = build_block_mask(mask, lengths, heads, block);
  check_block_mask(mask, bm, heads);
  {
    INFO("hinted vs plain build");
    require_same(bm, build_block_mask(detail::PlainMask<M>{mask}, lengths, heads, block));
  }
  const BlockMask no_bits = build_block_mask(mask, lengths, heads, block, {.store_tile_bits = false});
  CHECK(no_bits.num_partial_tiles() == bm.num_partial_tiles());
  CHECK(no_bits.partial_tile_ids(0, 0, 0).empty());
  // Transposed: the BlockMask of the transposed predicate.
  const BlockMask tr = bm.transposed();
  CHECK(tr.num_full_tiles() == bm.num_full_tiles());
  CHECK(tr.num_partial_tiles() == bm.num_partial_tiles());
  CHECK(tr.num_distinct_partial_tiles() == bm.num_distinct_partial_tiles());
  check_block_mask(Transposed<M>{mask}, tr, heads);
  require_same(tr.transposed(), bm);
  // Dense, additive, packed bits; dense and bits read back as descriptions.
  const Tensor<std::uint8_t> dense = to_dense(mask, lengths, heads);
  const Tensor<float> additive = to_additive(mask, lengths, heads, -5.0f);
  const PackedMask packed = pack_bits(mask, lengths, heads);
  const DenseMask<std::uint8_t> from_dense{dense.view()};
  const DenseBitsMask from_bits{packed.view()};
  for (index_t b = 0; b < lengths.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      for (index_t q = 0; q < qmax; ++q) {
        for (index_t kv = 0; kv < kmax; ++kv) {
          const bool inside = q < ctx.q_len && kv < ctx.kv_len;
          const bool want = inside && mask.allowed(ctx, q, kv);
          if (dense(b, h, q, kv) != want || additive(b, h, q, kv) != (want ? 0.0f : -5.0f) ||
              (inside && (from_dense.allowed(ctx, q, kv) != want || from_bits.allowed(ctx, q, kv) != want))) {
            INFO("b=" << b << " h=" << h << " q=" << q << " kv=" << kv);
            REQUIRE(dense(b, h, q, kv) == want);
            REQUIRE(additive(b, h, q, kv) == (want ? 0.0f : -5.0f));
            REQUIRE(from_dense.allowed(ctx, q, kv) == want);
            REQUIRE(from_bits.allowed(ctx, q, kv) == want);
          }
        }
      }
    }
  }
  check_block_mask(mask, build_block_mask(from_bits, lengths, heads, block), heads);
}

RaggedLengths random_lengths(Rng& rng, index_t max_len) {
  RaggedLengths l;
  const index_t batch = uniform(rng, 1, 3);
  for (index_t b = 0; b < batch; ++b) {
    l.q.push_back(uniform(rng, 0, max_len));
    l.kv.push_back(uniform(rng, 0, max_len));
  }
  return l;
}

Alignment random_alignment(Rng& rng) { return uniform(rng, 0, 1) ? Alignment::bottom_right : Alignment::top_left; }

// Segment ids of one row: contiguous runs of increasing ids with padding gaps.
std::vector<std::int32_t> random_ids(Rng& rng, index_t t_len, std::int32_t first_id = 1) {
  std::vector<std::int32_t> ids;
  std::int32_t id = first_id;
  while (static_cast<index_t>(ids.size()) < t_len) {
    const index_t run = uniform(rng, 1, 9);
    const std::int32_t v = uniform(rng, 0, 4) == 0 ? 0 : id++;
    for (index_t i = 0; i < run && static_cast<index_t>(ids.size()) < t_len; ++i) ids.push_back(v);
  }
  return ids;
}

}  // namespace

TEST_CASE("Structural masks: classes, hooks and every representation agree with the predicate") {
  Rng rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, trial < 50 ? 60 : 150);
    const index_t heads = uniform(rng, 1, 2);
    INFO("trial " << trial);
    check_everything(FullMask{}, lengths, heads, true, rng);
    check_everything(CausalMask{random_alignment(rng)}, lengths, heads, true, rng);
    const SlidingWindowMask window{uniform(rng, -1, 12), uniform(rng, -1, 12), random_alignment(rng)};
    INFO("window " << window.left << ", " << window.right);
    check_everything(window, lengths, heads, true, rng);
    const ChunkedCausalMask chunked{uniform(rng, 1, 13), random_alignment(rng)};
    check_everything(chunked, lengths, heads, true, rng);
    std::vector<std::int32_t> prefixes;
    for (index_t b = 0; b < lengths.batch(); ++b) prefixes.push_back(static_cast<std::int32_t>(uniform(rng, 0, 70)));
    check_everything(PrefixLMMask{.prefix_lengths = prefixes, .alignment = random_alignment(rng)}, lengths, heads, true,
                     rng);
    check_everything(PrefixLMMask{.prefix = uniform(rng, 0, 20)}, lengths, heads, true, rng);
  }
}

TEST_CASE("Combinators combine classes soundly, exactly for interval masks") {
  Rng rng(12);
  for (int trial = 0; trial < 40; ++trial) {
    const RaggedLengths lengths = random_lengths(rng, 50);
    const SlidingWindowMask w{uniform(rng, -1, 9), uniform(rng, -1, 9), random_alignment(rng)};
    const CausalMask c{random_alignment(rng)};
    const ChunkedCausalMask ch{uniform(rng, 1, 9)};
    check_everything(c & w, lengths, 1, false, rng);
    check_everything(c & w & ch, lengths, 1, false, rng);
    check_everything(c | w, lengths, 1, false, rng);
    check_everything(~w, lengths, 2, false, rng);
    check_everything(~c | (w & ch), lengths, 1, false, rng);
    const std::vector<SlidingWindowMask> per_head{w, SlidingWindowMask{2, 0}, SlidingWindowMask{-1, 3}};
    check_everything(PerHeadMask<SlidingWindowMask>{per_head}, lengths, 3, true, rng);
  }
  // An intersection whose row 4 is empty while row 7 is not: chunks of 4
  // against a window one key wide, three keys behind the diagonal.
  {
    const auto mask = ChunkedCausalMask{4} & SlidingWindowMask{1, 0, Alignment::bottom_right};
    const MaskContext ctx{0, 0, 12, 9};
    CHECK_FALSE(mask.allowed(ctx, 4, 1));
    CHECK(mask.allowed(ctx, 7, 4));
    CHECK(mask.classify(ctx, {4, 8, 1, 6}) != TileClass::empty);
    check_everything(mask, RaggedLengths::uniform(1, 12, 9), 1, false, rng);
  }
  // Causal & window(W, W) behaves as window(W, 0) (TE note), tile by tile.
  const auto lengths = RaggedLengths::uniform(1, 37, 53);
  for (auto a : {Alignment::top_left, Alignment::bottom_right}) {
    const BlockMask x = build_block_mask(CausalMask{a} & SlidingWindowMask{5, 5, a}, lengths, 1, {4, 6});
    const BlockMask y = build_block_mask(SlidingWindowMask{5, 0, a}, lengths, 1, {4, 6});
    require_same(x, y);
  }
}

TEST_CASE("Sliding window and causal predicates match TE's vectors (E11)") {
  auto picture = [](const auto& mask, index_t q_len, index_t kv_len) {
    std::string s;
    const MaskContext ctx{0, 0, q_len, kv_len};
    for (index_t q = 0; q < q_len; ++q) {
      if (q) s += '/';
      for (index_t kv = 0; kv < kv_len; ++kv) s += mask.allowed(ctx, q, kv) ? '1' : '0';
    }
    return s;
  };
  CHECK(picture(SlidingWindowMask{2, 0}, 5, 5) == "10000/11000/11100/01110/00111");
  CHECK(picture(SlidingWindowMask{1, 1}, 5, 5) == "11000/11100/01110/00111/00011");
  CHECK(picture(CausalMask{Alignment::bottom_right}, 3, 5) == "11100/11110/11111");
  CHECK(picture(SlidingWindowMask{1, 0, Alignment::bottom_right}, 3, 5) == "01100/00110/00011");
  CHECK(picture(CausalMask{Alignment::top_left}, 3, 5) == "10000/11000/11100");
  CHECK(picture(SlidingWindowMask{kUnbounded, 0}, 4, 4) == picture(CausalMask{}, 4, 4));
  CHECK(picture(SlidingWindowMask{kUnbounded, kUnbounded}, 3, 4) == "1111/1111/1111");
  CHECK(picture(ChunkedCausalMask{2}, 5, 5) == "10000/11000/00100/00110/00001");
  CHECK(picture(PrefixLMMask{.prefix = 2}, 4, 4) == "1100/1100/1110/1111");
}

TEST_CASE("Document masks from segment ids, positions and extra leading dims") {
  Rng rng(13);
  for (int trial = 0; trial < 60; ++trial) {
    INFO("trial " << trial);
    const index_t extra = uniform(rng, 1, 2), batch = uniform(rng, 1, 2);
    const index_t tq = uniform(rng, 0, 40);
    const bool cross = trial % 3 == 2;
    const index_t tkv = cross ? uniform(rng, 0, 40) : tq;
    std::vector<std::int32_t> q_ids, kv_ids;
    for (index_t r = 0; r < extra * batch; ++r) {
      auto row = random_ids(rng, tq);
      q_ids.insert(q_ids.end(), row.begin(), row.end());
      auto krow = cross ? random_ids(rng, tkv, static_cast<std::int32_t>(uniform(rng, 1, 2))) : row;
      kv_ids.insert(kv_ids.end(), krow.begin(), krow.end());
    }
    const TensorView<const std::int32_t> qv(q_ids.data(), Extents{extra, batch, tq});
    const TensorView<const std::int32_t> kvv(kv_ids.data(), Extents{extra, batch, tkv});
    // Positions (B, T), broadcast over the extra dim: consecutive within each
    // run of the first extra slice only when all slices share the runs, so
    // give positions only for self-attention with one extra slice.
    std::vector<std::int32_t> q_pos, kv_pos;
    const bool with_pos = !cross && extra == 1;
    if (with_pos) {
      for (index_t b = 0; b < batch; ++b) {
        std::int32_t p = 0;
        for (index_t t = 0; t < tq; ++t) {
          const std::int32_t id = q_ids[static_cast<std::size_t>(b * tq + t)];
          const bool start = t == 0 || q_ids[static_cast<std::size_t>(b * tq + t - 1)] != id;
          p = start ? static_cast<std::int32_t>(uniform(rng, 0, 3)) : p + 1;
          q_pos.push_back(p);
        }
      }
      kv_pos = q_pos;
    }
    const DocumentLayout layout =
        with_pos ? DocumentLayout::from_segment_ids(qv, kvv,
                                                    TensorView<const std::int32_t>(q_pos.data(), Extents{batch, tq}),
                                                    TensorView<const std::int32_t>(kv_pos.data(), Extents{batch, tkv}))
                 : DocumentLayout::from_segment_ids(qv, kvv, {}, {});
    const RaggedLengths lengths = layout.lengths();
    REQUIRE(lengths.batch() == extra * batch);
    check_everything(document_mask(layout), lengths, 1, true, rng);
    check_everything(document_mask(layout, CausalMask{random_alignment(rng)}), lengths, 1, true, rng);
    check_everything(
        document_mask(layout, SlidingWindowMask{uniform(rng, -1, 5), uniform(rng, -1, 5), random_alignment(rng)}),
        lengths, 1, true, rng);
    check_everything(document_mask(layout, ChunkedCausalMask{uniform(rng, 1, 5)}), lengths, 1, true, rng);
    // Reference predicate, straight from the ids.
    const auto mask = document_mask(layout, CausalMask{});
    for (index_t b = 0; b < extra * batch; ++b) {
      const MaskContext ctx{b, 0, tq, tkv};
      for (index_t q = 0; q < tq; ++q) {
        for (index_t kv = 0; kv < tkv; ++kv) {
          const std::int32_t iq = q_ids[static_cast<std::size_t>(b * tq + q)];
          const std::int32_t ik = kv_ids[static_cast<std::size_t>(b * tkv + kv)];
          bool want = iq != 0 && iq == ik;
          if (want) {
            index_t sq = q, sk = kv;
            while (sq > 0 && q_ids[static_cast<std::size_t>(b * tq + sq - 1)] == iq) --sq;
            while (sk > 0 && kv_ids[static_cast<std::size_t>(b * tkv + sk - 1)] == ik) --sk;
            const index_t pq = with_pos ? q_pos[static_cast<std::size_t>((b % batch) * tq + q)] : q - sq;
            const index_t pk = with_pos ? kv_pos[static_cast<std::size_t>((b % batch) * tkv + kv)] : kv - sk;
            want = pk <= pq;
          }
          REQUIRE(mask.allowed(ctx, q, kv) == want);
        }
      }
    }
    if (!cross && !with_pos) {
      // Causal documents as flat and block-contiguous segment metadata.
      const SegmentMetadata flat = segment_metadata(layout);
      const BlockSegmentMetadata blocked = block_segment_metadata(flat, uniform(rng, 1, 9));
      const SegmentMetadataMask from_flat{flat.view()};
      const BlockSegmentMetadataMask from_blocks{blocked.view()};
      for (index_t b = 0; b < lengths.batch(); ++b) {
        const MaskContext ctx{b, 0, tq, tkv};
        for (index_t q = 0; q < tq; ++q) {
          for (index_t kv = 0; kv < tkv; ++kv) {
            REQUIRE(from_flat.allowed(ctx, q, kv) == mask.allowed(ctx, q, kv));
            REQUIRE(from_blocks.allowed(ctx, q, kv) == mask.allowed(ctx, q, kv));
          }
        }
      }
    }
  }
}

TEST_CASE("Document masks reproduce TE's bottom-right cross-attention vector (E4)") {
  const std::vector<std::int32_t> q_ids{1, 1, 1, 0, 2, 2, 2, 2}, q_pos{0, 1, 2, 3, 0, 1, 2, 3};
  const std::vector<std::int32_t> kv_ids{1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  const std::vector<std::int32_t> kv_pos{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const DocumentLayout layout =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(q_ids.data(), Extents{1, 8}),
                                       TensorView<const std::int32_t>(kv_ids.data(), Extents{1, 16}),
                                       TensorView<const std::int32_t>(q_pos.data(), Extents{1, 8}),
                                       TensorView<const std::int32_t>(kv_pos.data(), Extents{1, 16}));
  const auto mask = document_mask(layout, CausalMask{Alignment::bottom_right});
  const MaskContext ctx{0, 0, 8, 16};
  const std::vector<std::pair<index_t, index_t>> rows{{0, 1},  {0, 2},  {0, 3},  {1, 0},
                                                      {6, 12}, {6, 13}, {6, 14}, {6, 15}};
  for (index_t q = 0; q < 8; ++q) {
    for (index_t kv = 0; kv < 16; ++kv) {
      const auto [lo, hi] = rows[static_cast<std::size_t>(q)];
      CHECK(mask.allowed(ctx, q, kv) == (kv >= lo && kv <= hi));
    }
  }
}

TEST_CASE("Multi-item masks match the spec vectors (TV-A1, TV-A2, TV-A3)") {
  auto matrix = [](const MultiItemMask& m, index_t b, index_t len) {
    std::vector<std::string> rows;
    for (index_t q = 0; q < len; ++q) {
      std::string s;
      for (index_t kv = 0; kv < len; ++kv) s += m.allowed({b, 0, len, len}, q, kv) ? '1' : '0';
      rows.push_back(s);
    }
    return rows;
  };
  SECTION("TV-A1") {
    MultiItemLayout l;
    const std::vector<std::int32_t> tokens{10, 11, 99, 21, 22, 99, 31, 99};
    l.add_packed(tokens, 99);
    CHECK(l.prefix_end()[0] == 3);
    CHECK(std::vector<std::int32_t>(l.row_seg_start().begin(), l.row_seg_start().end()) ==
          std::vector<std::int32_t>{0, 0, 0, 3, 3, 3, 6, 6});
    const auto rows = matrix(multi_item_mask(l), 0, 8);
    CHECK(rows == std::vector<std::string>{"10000000", "11000000", "11100000", "11110000", "11111000", "11111100",
                                           "11100010", "11100011"});
    // The v2 JIT dense builder's leak (docs/semantics/multi-item-topk-kascade.md §A.13.1) must not be reproduced.
    CHECK(rows[6] != "11111110");
    CHECK(rows[7] != "11111001");
    // Same layout from lengths.
    MultiItemLayout from_lengths;
    const std::vector<index_t> items{2, 1};
    from_lengths.add_items(2, items);
    CHECK(matrix(multi_item_mask(from_lengths), 0, 8) == rows);
  }
  SECTION("TV-A2: an empty item (sglang-jax semantics)") {
    MultiItemLayout l;
    const std::vector<std::int32_t> tokens{10, 99, 21, 99, 99, 31, 32, 99};
    l.add_packed(tokens, 99);
    CHECK(l.prefix_end()[0] == 2);
    CHECK(std::vector<std::int32_t>(l.row_seg_start().begin(), l.row_seg_start().end()) ==
          std::vector<std::int32_t>{0, 0, 2, 2, 4, 5, 5, 5});
    CHECK(matrix(multi_item_mask(l), 0, 8) == std::vector<std::string>{"10000000", "11000000", "11100000", "11110000",
                                                                       "11001000", "11000100", "11000110", "11000111"});
  }
  SECTION("TV-A3: a batch of a multi-item and a causal request, flat and block metadata") {
    MultiItemLayout l;
    const std::vector<std::int32_t> tokens{5, 99, 7, 99};
    l.add_packed(tokens, 99).add_causal(3);
    const SegmentMetadata flat = segment_metadata(l);
    CHECK(flat.prefix_end == std::vector<std::int32_t>{2, 0});
    CHECK(flat.row_seg_start == std::vector<std::int32_t>{0, 0, 2, 2, 0, 0, 0});
    CHECK(flat.token_offsets == std::vector<index_t>{0, 4, 7});
    CHECK(matrix(multi_item_mask(l), 0, 4) == std::vector<std::string>{"1000", "1100", "1110", "1111"});
    CHECK(matrix(multi_item_mask(l), 1, 3) == std::vector<std::string>{"100", "110", "111"});
    const BlockSegmentMetadata blocked = block_segment_metadata(flat, 4);
    CHECK(blocked.q_block_offsets == std::vector<index_t>{0, 1, 2});
    const auto block1 = blocked.block(1, 0);
    CHECK(std::vector<std::int32_t>(block1.begin(), block1.end()) == std::vector<std::int32_t>{0, 0, 0, 0});
    const Tensor<std::uint8_t> dense = to_dense(multi_item_mask(l), l.lengths());
    CHECK(dense.shape() == Extents{2, 1, 4, 4});
  }
}

TEST_CASE("Multi-item masks on random layouts") {
  Rng rng(14);
  for (int trial = 0; trial < 60; ++trial) {
    MultiItemLayout l;
    const index_t n = uniform(rng, 1, 3);
    for (index_t s = 0; s < n; ++s) {
      if (uniform(rng, 0, 3) == 0) {
        l.add_causal(uniform(rng, 0, 30));
      } else {
        std::vector<index_t> items(static_cast<std::size_t>(uniform(rng, 1, 6)));
        for (auto& i : items) i = uniform(rng, 0, 7);
        l.add_items(uniform(rng, 1, 8), items);
      }
    }
    const MultiItemMask mask = multi_item_mask(l);
    const RaggedLengths lengths = l.lengths();
    check_everything(mask, lengths, 1, true, rng);
    const SegmentMetadata flat = segment_metadata(l);
    const BlockSegmentMetadata blocked = block_segment_metadata(flat, uniform(rng, 1, 9));
    for (index_t b = 0; b < lengths.batch(); ++b) {
      const index_t len = lengths.q[static_cast<std::size_t>(b)];
      const MaskContext ctx{b, 0, len, len};
      for (index_t q = 0; q < len; ++q) {
        for (index_t kv = 0; kv < len; ++kv) {
          REQUIRE(SegmentMetadataMask{flat.view()}.allowed(ctx, q, kv) == mask.allowed(ctx, q, kv));
          REQUIRE(BlockSegmentMetadataMask{blocked.view()}.allowed(ctx, q, kv) == mask.allowed(ctx, q, kv));
        }
      }
    }
  }
}

TEST_CASE("top_k keeps jax.lax.top_k order: value descending, ties lowest index first") {
  SECTION("TV-B1 / TV-B2") {
    const std::vector<float> b1{0.3f, 0.7f, 0.7f, 0.1f, 0.7f};
    const auto i1 = top_k(TensorView<const float>(b1.data(), Extents{5}), 2);
    CHECK(std::vector<std::int32_t>(i1.values().begin(), i1.values().end()) == std::vector<std::int32_t>{1, 2});
    const std::vector<float> b2{0.2f, 0.2f, 0.2f, 0.8f, -1.0f, 0.2f};
    const auto i2 = top_k(TensorView<const float>(b2.data(), Extents{6}), 3);
    CHECK(std::vector<std::int32_t>(i2.values().begin(), i2.values().end()) == std::vector<std::int32_t>{3, 0, 1});
  }
  SECTION("TV-B4: top-k of causally masked scores, then AND causal") {
    const float m = kDefaultMaskValue;
    std::vector<float> scores;
    for (int q = 0; q < 4; ++q) {
      for (int j = 0; j < 4; ++j) scores.push_back(j <= q ? static_cast<float>(j + 1) : m);
    }
    const auto idx = top_k(TensorView<const float>(scores.data(), Extents{1, 4, 4}), 2);
    CHECK(std::vector<std::int32_t>(idx.values().begin(), idx.values().end()) ==
          std::vector<std::int32_t>{0, 1, 1, 0, 2, 1, 3, 2});
    const TopKLayout layout = TopKLayout::from_indices(idx.view(), 4);
    const auto mask = topk_mask(layout) & CausalMask{};
    const std::vector<std::vector<index_t>> allowed{{0}, {0, 1}, {1, 2}, {2, 3}};
    for (index_t q = 0; q < 4; ++q) {
      for (index_t kv = 0; kv < 4; ++kv) {
        const auto& a = allowed[static_cast<std::size_t>(q)];
        CHECK(mask.allowed({0, 0, 4, 4}, q, kv) == (std::find(a.begin(), a.end(), kv) != a.end()));
      }
    }
  }
  SECTION("random ties against a stable sort") {
    Rng rng(15);
    for (int trial = 0; trial < 20; ++trial) {
      const index_t s = uniform(rng, 1, 40), k = uniform(rng, 0, s);
      std::vector<float> row(static_cast<std::size_t>(s));
      for (auto& v : row) v = static_cast<float>(uniform(rng, 0, 4));  // many ties
      const auto idx = top_k(TensorView<const float>(row.data(), Extents{s}), k);
      std::vector<std::int32_t> order(static_cast<std::size_t>(s));
      for (index_t i = 0; i < s; ++i) order[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return row[a] > row[b]; });
      order.resize(static_cast<std::size_t>(k));
      CHECK(std::vector<std::int32_t>(idx.values().begin(), idx.values().end()) == order);
    }
  }
}

TEST_CASE("Top-k masks: scatter equals broadcast-compare, classes and representations agree") {
  Rng rng(16);
  for (int trial = 0; trial < 20; ++trial) {
    const index_t extra = uniform(rng, 1, 2), batch = uniform(rng, 1, 2), t = uniform(rng, 1, 30);
    const index_t s = uniform(rng, 1, 60), k = uniform(rng, 1, std::min<index_t>(s, 12));
    std::vector<std::int32_t> idx;
    for (index_t r = 0; r < extra * batch * t; ++r) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(s));
      for (index_t i = 0; i < s; ++i) all[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      std::shuffle(all.begin(), all.end(), rng);
      // Contiguous runs now and then so full tiles occur; -1 padding too.
      if (uniform(rng, 0, 2) == 0) std::sort(all.begin(), all.begin() + k);
      for (index_t j = 0; j < k; ++j) idx.push_back(uniform(rng, 0, 5) == 0 ? -1 : all[static_cast<std::size_t>(j)]);
    }
    const TensorView<const std::int32_t> view(idx.data(), Extents{extra, batch, t, k});
    const Tensor<float> scatter = topk_scatter_mask(view, s);
    CHECK(scatter == detail::topk_broadcast_mask(view, s));
    // Into a dirty buffer, and moved over from an earlier selection.
    Tensor<float> buffer(scatter.shape(), 7.0f);
    topk_scatter_mask_into(buffer.view(), view);
    CHECK(buffer == scatter);
    std::vector<std::int32_t> previous(idx.size());
    for (auto& v : previous) v = static_cast<std::int32_t>(uniform(rng, -1, s - 1));
    const TensorView<const std::int32_t> prev_view(previous.data(), view.shape());
    Tensor<float> moving(scatter.shape());
    for (index_t i = 0; i < moving.size(); ++i) moving.data()[i] = kDefaultMaskValue;
    detail::scatter_rows(moving.view(), prev_view, 0.0f, "test");
    topk_rescatter_mask(moving.view(), prev_view, view);
    CHECK(moving == detail::topk_broadcast_mask(view, s));
    const TopKLayout layout = TopKLayout::from_indices(view, s);
    const TopKMask mask = topk_mask(layout);
    INFO("trial " << trial);
    check_everything(mask, layout.lengths(), 1, true, rng);
    INFO("and causal");
    check_everything(mask & CausalMask{}, layout.lengths(), 1, false, rng);
    for (index_t b = 0; b < extra * batch; ++b) {
      for (index_t q = 0; q < t; ++q) {
        for (index_t kv = 0; kv < s; ++kv) {
          REQUIRE(mask.allowed({b, 0, t, s}, q, kv) == (scatter.data()[(b * t + q) * s + kv] == 0.0f));
        }
      }
    }
  }
}

TEST_CASE("Dense and per-head masks") {
  Rng rng(17);
  for (int trial = 0; trial < 15; ++trial) {
    const index_t batch = uniform(rng, 1, 2), heads = uniform(rng, 1, 3);
    const index_t qm = uniform(rng, 1, 30), km = uniform(rng, 1, 30);
    Tensor<std::uint8_t> values(Extents{batch, heads, qm, km});
    const int density = static_cast<int>(uniform(rng, 0, 2));
    for (auto& v : values.values()) {
      v = density == 0 ? static_cast<std::uint8_t>(uniform(rng, 0, 1))
                       : static_cast<std::uint8_t>(uniform(rng, 0, 9) > 0);
    }
    RaggedLengths lengths;
    for (index_t b = 0; b < batch; ++b) {
      lengths.q.push_back(uniform(rng, 0, qm));
      lengths.kv.push_back(uniform(rng, 0, km));
    }
    const DenseMask<std::uint8_t> mask{values.view()};
    check_everything(mask, lengths, heads, true, rng);
    // Rank 2: one (Q, KV) picture broadcast over batch and heads.
    const DenseMask<std::uint8_t> shared{values.view().select(0, 0).select(0, 0)};
    check_everything(shared, lengths, heads, true, rng);
    check_everything(mask & CausalMask{}, lengths, heads, false, rng);
    // Rank 5 (*E, B, H, Q, KV): the extra dim flattens into the batch.
    const DenseMask<std::uint8_t> extra{values.view().reshape(Extents{batch, 1, heads, qm, km})};
    check_everything(extra, lengths, heads, true, rng);
    // Rank 3 (B, Q, KV): every head reads head 0 of the array.
    const DenseMask<std::uint8_t> per_batch{values.view().select(1, 0)};
    check_everything(per_batch, lengths, heads, true, rng);
    for (index_t b = 0; b < batch; ++b) {
      for (index_t q = 0; q < lengths.q[static_cast<std::size_t>(b)]; ++q) {
        for (index_t kv = 0; kv < lengths.kv[static_cast<std::size_t>(b)]; ++kv) {
          const MaskContext ctx{b, heads - 1, lengths.q[static_cast<std::size_t>(b)],
                                lengths.kv[static_cast<std::size_t>(b)]};
          REQUIRE(per_batch.allowed(ctx, q, kv) == (values(b, index_t{0}, q, kv) != 0));
          REQUIRE(extra.allowed(ctx, q, kv) == (values(b, heads - 1, q, kv) != 0));
        }
      }
    }
    // A bool array viewed in place, with a broadcast (stride-0) head dim.
    const auto storage = std::make_unique<bool[]>(static_cast<std::size_t>(batch * qm * km));
    for (index_t i = 0; i < batch * qm * km; ++i) storage[static_cast<std::size_t>(i)] = uniform(rng, 0, 1) == 1;
    const TensorView<const bool> bools(storage.get(), Extents{batch, heads, qm, km}, Strides{qm * km, 0, km, 1});
    check_everything(DenseMask<bool>{bools}, lengths, heads, true, rng);
  }
}

TEST_CASE("Renders masks as ASCII and SVG") {
  const MaskContext ctx{0, 0, 4, 6};
  CHECK(to_ascii(CausalMask{Alignment::bottom_right}, ctx) == "###...\n####..\n#####.\n######\n");
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 8, 8), 1, {2, 2});
  CHECK(to_ascii(bm, 0) == "+...\n#+..\n##+.\n###+\n");
  const std::string svg = to_svg(bm, 0, 0, "causal");
  CHECK(svg.find("<svg") == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  // Large masks are drawn in cells classified by the description.
  const std::string big = to_ascii(CausalMask{}, {0, 0, 1000, 1000}, 10);
  CHECK(big.substr(0, 11) == "+.........\n");
  CHECK(to_svg(SlidingWindowMask{3, 3}, {0, 0, 20, 20}, "window").find("<rect") != std::string::npos);
}

}  // namespace seqattn_test_masks_mask_kinds_test
