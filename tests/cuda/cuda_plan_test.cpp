// Host-side planning of the Cuda backend, tested without a GPU:
//   - build_device_mask_layout (backends/device_mask.hpp): the CSR form
//     of a BlockMask, checked row by row against the BlockMask and element by
//     element against the mask description's own predicate;
//   - plan_launch (backends/cuda/launch_plan.hpp): head dims, GQA packing,
//     work items, their order, KV splits and workspace sizes, checked against
//     the rules the header documents, restated here independently;
//   - the backward's planning: the transposed layout the key pass reads,
//     element by element against the predicate, and plan_backward_launch;
//   - variants::BiasTensor, the strided bias the Cuda kernels read in device
//     memory (its device-pointer check needs a GPU: tests/cuda/*.cu): its
//     indexing and broadcasting and its shape check, on the host.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/attention/run.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/cuda/launch_plan.hpp"
#include "seqattn/backends/device_mask.hpp"
#include "seqattn/backends/reference.hpp"
#include "seqattn/masks.hpp"

#include "cuda/random_mask_cases.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_cuda_cuda_plan_test {

using namespace seqattn;
using seqattn::backends::build_device_mask_layout;
using seqattn::backends::DeviceMaskLayout;
using seqattn::backends::KvTileEntry;
using seqattn::cuda::LaunchPlan;
using seqattn::cuda::plan_launch;
using seqattn_test_random_masks::MaskCase;
using seqattn_test_random_masks::pick;
using seqattn_test_random_masks::pick_alignment;
using seqattn_test_random_masks::pick_len;
using seqattn_test_random_masks::random_mask_case;

namespace {

constexpr BlockShape kCudaBlock{128, 64};

index_t sum_q_blocks(const RaggedLengths& l, index_t upto) {
  index_t n = 0;
  for (index_t b = 0; b < upto; ++b) n += (l.q[static_cast<std::size_t>(b)] + 127) / 128;
  return n;
}

// The device layout against the BlockMask (row by row) and, when `elements`,
// against the description's own predicate for every element of the grid.
void check_layout(const AnyMask& mask, const BlockMask& bm, const DeviceMaskLayout& dl, index_t heads, bool invariant,
                  bool elements) {
  const RaggedLengths& l = bm.lengths();
  const index_t batch = l.batch();
  const index_t mask_heads = invariant ? 1 : heads;
  REQUIRE(bm.heads() == mask_heads);
  CHECK(dl.block.q == 128);
  CHECK(dl.block.kv == 64);
  CHECK(dl.words_per_row == 1);
  CHECK(dl.mask_heads == mask_heads);

  // Rows, row_base and the CSR offsets.
  const index_t total_rows = sum_q_blocks(l, batch) * mask_heads;
  CHECK(dl.rows() == total_rows);
  REQUIRE(dl.row_offsets.size() == static_cast<std::size_t>(total_rows + 1));
  CHECK(dl.row_offsets.front() == 0);
  CHECK(dl.row_offsets.back() == static_cast<std::int32_t>(dl.entries.size()));
  CHECK(std::is_sorted(dl.row_offsets.begin(), dl.row_offsets.end()));
  CHECK(static_cast<index_t>(dl.entries.size()) == bm.num_full_tiles() + bm.num_partial_tiles());
  REQUIRE(dl.row_base.size() == static_cast<std::size_t>(batch));
  for (index_t b = 0; b < batch; ++b) {
    CHECK(dl.row_base[static_cast<std::size_t>(b)] == sum_q_blocks(l, b) * mask_heads);
  }

  // Distinct tiles: the same bits in the same order.
  const index_t tiles = bm.num_distinct_partial_tiles();
  CHECK(dl.num_tiles() == tiles);
  REQUIRE(dl.tile_bits.size() == static_cast<std::size_t>(tiles * 128));
  for (index_t t = 0; t < tiles; ++t) {
    const auto want = bm.tile_bits(static_cast<std::int32_t>(t));
    if (!std::equal(want.begin(), want.end(), dl.tile_bits.begin() + t * 128)) {
      INFO("distinct tile " << t);
      CHECK(false);
    }
  }

  // Rows: {full blocks} ∪ {partial blocks}, increasing kv-block, tile -1 exactly for full.
  index_t row_mismatches = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t nqb = bm.num_q_blocks(b);
    for (index_t h = 0; h < mask_heads; ++h) {
      for (index_t qb = 0; qb < nqb; ++qb) {
        std::vector<KvTileEntry> want;
        for (std::int32_t kb : bm.full_blocks(b, h, qb)) want.push_back({kb, -1});
        const auto partial = bm.partial_blocks(b, h, qb);
        const auto ids = bm.partial_tile_ids(b, h, qb);
        REQUIRE(ids.size() == partial.size());
        for (std::size_t i = 0; i < partial.size(); ++i) want.push_back({partial[i], ids[i]});
        std::sort(want.begin(), want.end(), [](const auto& x, const auto& y) { return x.kv_block < y.kv_block; });
        const auto r = static_cast<std::size_t>(dl.row_base[static_cast<std::size_t>(b)] + h * nqb + qb);
        const std::vector<KvTileEntry> got(dl.entries.begin() + dl.row_offsets[r],
                                           dl.entries.begin() + dl.row_offsets[r + 1]);
        bool ok = got == want;
        for (std::size_t i = 0; i < got.size(); ++i) {
          ok = ok && got[i].kv_block >= 0 && got[i].kv_block < bm.num_kv_blocks(b);
          ok = ok && (i == 0 || got[i - 1].kv_block < got[i].kv_block);
          ok = ok && got[i].tile >= -1 && got[i].tile < tiles;
        }
        if (!ok && row_mismatches++ == 0) {
          INFO("first bad row: b=" << b << " h=" << h << " qb=" << qb << " (row " << r << "): " << got.size()
                                   << " entries, want " << want.size());
          CHECK(ok);
        }
      }
    }
  }
  CHECK(row_mismatches == 0);
  if (!elements) return;

  // Every element of every (sequence, query head) grid, from the device arrays
  // alone: full -> inside the sequence, partial -> its bit (zero outside the
  // sequence), absent -> no. Compared with the description's predicate.
  index_t mismatches = 0;
  std::string first;
  for (index_t b = 0; b < batch; ++b) {
    const index_t q_len = l.q[static_cast<std::size_t>(b)], kv_len = l.kv[static_cast<std::size_t>(b)];
    const index_t nqb = (q_len + 127) / 128, nkb = (kv_len + 63) / 64;
    for (index_t h = 0; h < heads; ++h) {
      if (invariant && h != 0 && h != heads - 1) continue;  // all heads read the same row
      const MaskContext ctx{b, h, q_len, kv_len};
      for (index_t qb = 0; qb < nqb; ++qb) {
        const auto r = static_cast<std::size_t>(dl.row_base[static_cast<std::size_t>(b)] +
                                                (dl.mask_heads == 1 ? 0 : h) * nqb + qb);
        std::vector<std::int32_t> kind(static_cast<std::size_t>(nkb), -2);  // -2 absent, -1 full, else tile
        for (auto i = dl.row_offsets[r]; i < dl.row_offsets[r + 1]; ++i) {
          const KvTileEntry e = dl.entries[static_cast<std::size_t>(i)];
          if (e.kv_block >= 0 && e.kv_block < nkb) kind[static_cast<std::size_t>(e.kv_block)] = e.tile;
        }
        for (index_t kb = 0; kb < nkb; ++kb) {
          const std::int32_t k = kind[static_cast<std::size_t>(kb)];
          if (k >= dl.num_tiles()) continue;  // reported above
          for (index_t rr = 0; rr < 128; ++rr) {
            const index_t q = qb * 128 + rr;
            for (index_t cc = 0; cc < 64; ++cc) {
              const index_t kv = kb * 64 + cc;
              const bool inside = q < q_len && kv < kv_len;
              bool dev = false;
              if (k == -1) {
                dev = inside;
              } else if (k >= 0) {
                dev =
                    (dl.tile_bits[static_cast<std::size_t>((k * 128 + rr) * dl.words_per_row + cc / 64)] >> (cc % 64)) &
                    1u;
              }
              const bool want = inside && mask.allowed(ctx, q, kv);
              if (dev != want && mismatches++ == 0) {
                first = detail::concat("b=", b, " h=", h, " q=", q, " kv=", kv, " (q_len ", q_len, ", kv_len ", kv_len,
                                       ", tile kind ", k, "): device ", dev, ", mask ", want);
              }
            }
          }
        }
      }
    }
  }
  INFO("first element mismatch: " << first);
  CHECK(mismatches == 0);
}

std::string describe(const MaskCase& c) {
  std::string s = c.name + ", heads " + std::to_string(c.heads) + ", (q, kv):";
  for (index_t b = 0; b < c.lengths.batch(); ++b) {
    s += " (" + std::to_string(c.lengths.q[static_cast<std::size_t>(b)]) + ", " +
         std::to_string(c.lengths.kv[static_cast<std::size_t>(b)]) + ")";
  }
  return s;
}

}  // namespace

TEST_CASE("Device mask layout: a hand-checked causal layout", "[cuda][plan]") {
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 300, 300), 4, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm);
  REQUIRE(dl.rows() == 3);
  CHECK(dl.mask_heads == 1);
  CHECK(dl.row_base == std::vector<std::int64_t>{0});
  CHECK(dl.row_offsets == std::vector<std::int32_t>{0, 2, 6, 11});
  // Rows 0..127 see kv-blocks 0 and 1 in part; rows 128..255 see 0, 1 fully
  // and 2, 3 in part (the same two patterns); rows 256..299 see 0..3 fully
  // and the short diagonal tile 4 (a third pattern).
  const std::vector<KvTileEntry> want{{0, 0},  {1, 1},  {0, -1}, {1, -1}, {2, 0}, {3, 1},
                                      {0, -1}, {1, -1}, {2, -1}, {3, -1}, {4, 2}};
  CHECK(dl.entries == want);
  REQUIRE(dl.num_tiles() == 3);
  REQUIRE(dl.tile_bits.size() == 3 * 128);
  for (index_t r = 0; r < 128; ++r) {
    const auto row = static_cast<std::size_t>(r);
    const std::uint64_t diag = r >= 63 ? ~std::uint64_t{0} : (std::uint64_t{2} << r) - 1;  // cols 0..min(r, 63)
    CHECK(dl.tile_bits[row] == diag);
    const std::uint64_t second = r < 64 ? 0 : r == 127 ? ~std::uint64_t{0} : (std::uint64_t{2} << (r - 64)) - 1;
    CHECK(dl.tile_bits[128 + row] == second);
    const std::uint64_t edge = r < 44 ? (std::uint64_t{2} << r) - 1 : 0;  // 44 x 44, zero outside
    CHECK(dl.tile_bits[256 + row] == edge);
  }
  CHECK(dl.bytes() == 4 * 4 + 11 * 8 + 3 * 128 * 8 + 8);
}

TEST_CASE("Device mask layout equals the BlockMask and the mask, element by element", "[cuda][plan]") {
  std::mt19937 rng(20240607);
  for (int trial = 0; trial < 250; ++trial) {
    const MaskCase c = random_mask_case(rng, 400);
    INFO("trial " << trial << ": " << describe(c));
    const BlockMask bm = build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock);
    const DeviceMaskLayout dl = build_device_mask_layout(bm);
    check_layout(c.mask, bm, dl, c.heads, c.mask.invariant_over_heads(), true);
  }
}

TEST_CASE("Device mask layout on larger ragged batches (rows only)", "[cuda][plan]") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    MaskCase c = random_mask_case(rng, 1500);
    INFO("trial " << trial << ": " << describe(c));
    const BlockMask bm = build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock);
    check_layout(c.mask, bm, build_device_mask_layout(bm), c.heads, c.mask.invariant_over_heads(), false);
  }
}

TEST_CASE("Device mask layout needs stored tile bits for partial tiles", "[cuda][plan]") {
  BlockMaskOptions no_bits;
  no_bits.store_tile_bits = false;
  const BlockMask causal =
      build_block_mask(CausalMask{}, RaggedLengths{{300, 0, 77}, {300, 5, 200}}, 2, kCudaBlock, no_bits);
  REQUIRE(causal.num_partial_tiles() > 0);
  REQUIRE(!causal.has_tile_bits());
  CHECK_THROWS_AS(build_device_mask_layout(causal), seqattn::invalid_argument);
  CHECK_THROWS_AS(build_device_mask_layout(causal), std::invalid_argument);
  CHECK_THROWS_WITH(build_device_mask_layout(causal), ContainsSubstring("store_tile_bits"));

  // Without partial tiles there is nothing to store: the layout is built, and
  // equals the one built with bits.
  const RaggedLengths lengths{{300, 0, 129}, {65, 7, 0}};
  const BlockMask full = build_block_mask(FullMask{}, lengths, 3, kCudaBlock, no_bits);
  REQUIRE(full.num_partial_tiles() == 0);
  const DeviceMaskLayout a = build_device_mask_layout(full);
  const DeviceMaskLayout b = build_device_mask_layout(build_block_mask(FullMask{}, lengths, 3, kCudaBlock));
  CHECK(a.row_offsets == b.row_offsets);
  CHECK(a.entries == b.entries);
  CHECK(a.row_base == b.row_base);
  CHECK(a.tile_bits.empty());
  CHECK(a.entries.size() == 3 * 2);  // (q 300, kv 65): 3 q-blocks x 2 kv-blocks; (0, 7) and (129, 0): none

  // Random masks: throws exactly when there are partial tiles.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    const MaskCase c = random_mask_case(rng, 300);
    INFO("trial " << trial << ": " << describe(c));
    const BlockMask bm = build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock, no_bits);
    if (bm.num_partial_tiles() > 0) {
      CHECK_THROWS_WITH(build_device_mask_layout(bm), ContainsSubstring("store_tile_bits"));
    } else {
      const DeviceMaskLayout dl = build_device_mask_layout(bm);
      const DeviceMaskLayout with = build_device_mask_layout(build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock));
      CHECK(dl.entries == with.entries);
      CHECK(dl.row_offsets == with.row_offsets);
    }
  }
}

namespace {

index_t expected_head_dim(index_t dk, index_t dv) {
  const index_t d = std::max(dk, dv);
  if (d <= 64) return 64;
  if (d <= 128) return 128;
  return 256;
}

index_t row_tiles(const BlockMask& bm, index_t b, index_t q) {
  return bm.num_full_blocks(b, 0, q / 128) + bm.num_partial_blocks(b, 0, q / 128);
}

// plan_launch's documented rules, restated.
void check_plan(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options, index_t num_sms,
                const LaunchPlan& plan) {
  INFO("shape: " << shape << "; mask heads " << bm.heads() << ", options.kv_splits " << options.kv_splits
                 << ", num_sms " << num_sms);
  CHECK(plan.head_dim == expected_head_dim(shape.dk, shape.dv));
  const index_t group = shape.heads / shape.kv_heads;
  const index_t max_q = shape.lengths.q.empty() ? 0 : *std::max_element(shape.lengths.q.begin(), shape.lengths.q.end());
  const bool packed = bm.heads() == 1 && group > 1 && 128 % group == 0 && max_q * group <= 128;
  CHECK(plan.heads_per_cta == (packed ? group : 1));
  // The 16-row decode kernel exactly when every CTA has at most 16 rows.
  const bool decode = plan.head_dim <= 128 && 16 % plan.heads_per_cta == 0 && max_q * plan.heads_per_cta <= 16;
  CHECK(plan.decode == decode);
  CHECK(plan.rows_per_cta == (decode ? 16 : 128));
  CHECK(plan.queries_per_cta * plan.heads_per_cta == plan.rows_per_cta);
  CHECK(plan.head_groups * plan.heads_per_cta == shape.heads);
  const index_t qpc = plan.queries_per_cta;
  REQUIRE(qpc > 0);

  // q_token_base: exclusive prefix sum of the q lengths.
  REQUIRE(plan.q_token_base.size() == static_cast<std::size_t>(shape.batch()));
  index_t tokens = 0;
  for (index_t b = 0; b < shape.batch(); ++b) {
    CHECK(plan.q_token_base[static_cast<std::size_t>(b)] == tokens);
    tokens += shape.q_len(b);
  }
  CHECK(plan.q_tokens == tokens);

  // Items: every query exactly once, in aligned chunks of queries_per_cta
  // within one 128-query block, longest mask row first.
  std::vector<std::vector<char>> covered(static_cast<std::size_t>(shape.batch()));
  index_t want_items = 0;
  for (index_t b = 0; b < shape.batch(); ++b) {
    covered[static_cast<std::size_t>(b)].assign(static_cast<std::size_t>(shape.q_len(b)), 0);
    want_items += (shape.q_len(b) + qpc - 1) / qpc;
  }
  CHECK(static_cast<index_t>(plan.items.size()) == want_items);
  index_t bad_items = 0, twice = 0, order_breaks = 0, max_tiles = 0;
  index_t prev_tiles = -1;
  for (const auto& item : plan.items) {
    if (item.batch < 0 || item.batch >= shape.batch() || item.q_begin < 0 || item.q_begin >= shape.q_len(item.batch) ||
        item.q_begin % qpc != 0) {
      ++bad_items;
      continue;
    }
    const index_t end = std::min<index_t>(item.q_begin + qpc, shape.q_len(item.batch));
    if (item.q_begin / 128 != (end - 1) / 128) ++bad_items;
    for (index_t q = item.q_begin; q < end; ++q) {
      char& c = covered[static_cast<std::size_t>(item.batch)][static_cast<std::size_t>(q)];
      twice += c;
      c = 1;
    }
    const index_t t = row_tiles(bm, item.batch, item.q_begin);
    if (prev_tiles >= 0 && t > prev_tiles) ++order_breaks;
    prev_tiles = t;
    max_tiles = std::max(max_tiles, t);
  }
  CHECK(bad_items == 0);
  CHECK(twice == 0);
  index_t missing = 0;
  for (const auto& v : covered) missing += std::count(v.begin(), v.end(), 0);
  CHECK(missing == 0);
  CHECK(order_breaks == 0);

  // KV splits.
  const index_t ctas = static_cast<index_t>(plan.items.size()) * plan.head_groups;
  if (options.kv_splits > 0) {
    CHECK(plan.kv_splits == std::min<index_t>(options.kv_splits, cuda::kMaxKvSplits));
  } else {
    CHECK(plan.kv_splits >= 1);
    CHECK(plan.kv_splits <= cuda::kMaxKvSplits);
    if (ctas == 0 || ctas >= num_sms || max_tiles < 2 * cuda::kMinTilesPerSplit) {
      CHECK(plan.kv_splits == 1);
    } else {
      // Up to four CTAs per SM, never fewer than kMinTilesPerSplit tiles a split.
      const index_t four_per_sm = (4 * num_sms + ctas - 1) / ctas;
      CHECK(plan.kv_splits > 1);
      CHECK(plan.kv_splits * cuda::kMinTilesPerSplit <= max_tiles);
      CHECK(plan.kv_splits == std::min({four_per_sm, max_tiles / cuda::kMinTilesPerSplit, cuda::kMaxKvSplits}));
    }
  }
  CHECK(plan.ctas() == ctas * plan.kv_splits);
  const index_t dv = shape.dv;
  CHECK(plan.workspace_out_elems(shape.heads, dv) ==
        (plan.kv_splits > 1 ? plan.kv_splits * tokens * shape.heads * dv : 0));
  CHECK(plan.workspace_lse_elems(shape.heads) == (plan.kv_splits > 1 ? plan.kv_splits * tokens * shape.heads : 0));
}

AttentionShape make_shape(RaggedLengths lengths, index_t heads, index_t kv_heads, index_t dk, index_t dv) {
  AttentionShape s;
  s.layout = Layout::thd;
  s.lengths = std::move(lengths);
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.dk = dk;
  s.dv = dv;
  return s;
}

}  // namespace

TEST_CASE("plan_launch: padded head dims", "[cuda][plan]") {
  CHECK(cuda::padded_head_dim(64, 64) == 64);
  CHECK(cuda::padded_head_dim(1, 1) == 64);
  CHECK(cuda::padded_head_dim(72, 72) == 128);
  CHECK(cuda::padded_head_dim(80, 80) == 128);
  CHECK(cuda::padded_head_dim(128, 128) == 128);
  CHECK(cuda::padded_head_dim(130, 130) == 256);
  CHECK(cuda::padded_head_dim(256, 256) == 256);
  CHECK(cuda::padded_head_dim(64, 65) == 128);    // dv decides
  CHECK(cuda::padded_head_dim(192, 128) == 256);  // dk decides (DeepSeek-style 192/128)
  CHECK(cuda::padded_head_dim(32, 129) == 256);
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 10, 10), 1, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm);
  for (index_t d : {1, 64, 65, 96, 128, 129, 200, 256}) {
    CHECK(plan_launch(make_shape(bm.lengths(), 1, 1, d, 64), dl, {}, 132).head_dim == expected_head_dim(d, 64));
  }
}

TEST_CASE("use_wgmma: the Hopper kernel takes prefill of head dims up to 128 on sm_90a builds", "[cuda][plan]") {
  const auto plan_for = [](index_t q_len, index_t kv_len, index_t dk, index_t dv) {
    const AttentionShape shape = make_shape(RaggedLengths::uniform(2, q_len, kv_len), 8, 2, dk, dv);
    const BlockMask bm = build_block_mask(CausalMask{Alignment::bottom_right}, shape.lengths, 8, kCudaBlock);
    return plan_launch(shape, build_device_mask_layout(bm), {}, 132);
  };
  for (const index_t d : {8, 64, 72, 128}) {
    const LaunchPlan prefill = plan_for(300, 300, d, d);
    REQUIRE(!prefill.decode);
    CHECK(cuda::use_wgmma(prefill, 9, true));
    CHECK(!cuda::use_wgmma(prefill, 9, false));  // not built for sm_90a
    CHECK(!cuda::use_wgmma(prefill, 8, true));   // A100
    CHECK(!cuda::use_wgmma(prefill, 10, true));  // Blackwell: sm_90a code does not run there
  }
  CHECK(!cuda::use_wgmma(plan_for(300, 300, 192, 128), 9, true));  // head dim 256
  const LaunchPlan decode = plan_for(1, 4096, 128, 128);
  REQUIRE(decode.decode);
  CHECK(!cuda::use_wgmma(decode, 9, true));
  CHECK(!plan_for(300, 300, 128, 128).wgmma);  // plan_launch leaves the choice to the backend
}

TEST_CASE("plan_launch: decode packs GQA heads and splits the KV", "[cuda][plan]") {
  // One sequence, one query, 32k keys: 32 heads over 4 kv heads.
  const AttentionShape shape = make_shape(RaggedLengths::uniform(1, 1, 32768), 32, 4, 128, 128);
  const BlockMask bm = build_block_mask(CausalMask{Alignment::bottom_right}, shape.lengths, 32, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm);
  REQUIRE(dl.rows() == 1);
  CHECK(dl.row_offsets[1] == 512);  // every kv tile
  const LaunchPlan plan = plan_launch(shape, dl, {}, 132);
  CHECK(plan.head_dim == 128);
  CHECK(plan.heads_per_cta == 8);
  CHECK(plan.decode);
  CHECK(plan.queries_per_cta == 2);
  CHECK(plan.head_groups == 4);
  REQUIRE(plan.items.size() == 1);
  CHECK(plan.items[0] == cuda::WorkItem{0, 0});
  CHECK(plan.kv_splits > 1);
  CHECK(plan.kv_splits == 32);  // 512 tiles / 16 a split (four CTAs per SM would allow 132)
  CHECK(plan.ctas() == 4 * 32);
  CHECK(plan.q_tokens == 1);
  CHECK(plan.workspace_out_elems(32, 128) == 32 * 32 * 128);
  CHECK(plan.workspace_lse_elems(32) == 32 * 32);
  check_plan(shape, bm, {}, 132, plan);
  // Splits only while the grid leaves SMs idle: 4 CTAs fill 4 SMs.
  CHECK(plan_launch(shape, dl, {}, 4).kv_splits == 1);
  CHECK(plan_launch(shape, dl, {}, 3).kv_splits == 1);
  CHECK(plan_launch(shape, dl, {}, 5).kv_splits == 5);  // ceil(20 / 4)
  for (index_t sms : {1, 3, 4, 5, 64, 1000}) check_plan(shape, bm, {}, sms, plan_launch(shape, dl, {}, sms));

  // A head-varying mask cannot share tiles between heads: no packing.
  const std::vector<SlidingWindowMask> windows(32, SlidingWindowMask{kUnbounded, 0, Alignment::bottom_right});
  const BlockMask per_head = build_block_mask(PerHeadMask<SlidingWindowMask>{windows}, shape.lengths, 32, kCudaBlock);
  REQUIRE(per_head.heads() == 32);
  const LaunchPlan unpacked = plan_launch(shape, build_device_mask_layout(per_head), {}, 132);
  CHECK(unpacked.heads_per_cta == 1);
  CHECK(unpacked.head_groups == 32);
  CHECK(unpacked.kv_splits == 17);  // ceil(528 / 32)
  check_plan(shape, per_head, {}, 132, unpacked);

  // Too few tiles to split (fewer than 32 a row): one split.
  const AttentionShape short_kv = make_shape(RaggedLengths::uniform(1, 1, 31 * 64), 32, 4, 64, 64);
  const BlockMask bm7 = build_block_mask(CausalMask{Alignment::bottom_right}, short_kv.lengths, 32, kCudaBlock);
  const LaunchPlan p7 = plan_launch(short_kv, build_device_mask_layout(bm7), {}, 132);
  CHECK(p7.kv_splits == 1);
  CHECK(p7.workspace_out_elems(32, 64) == 0);
  const AttentionShape eight = make_shape(RaggedLengths::uniform(1, 1, 32 * 64), 32, 4, 64, 64);
  const BlockMask bm8 = build_block_mask(CausalMask{Alignment::bottom_right}, eight.lengths, 32, kCudaBlock);
  CHECK(plan_launch(eight, build_device_mask_layout(bm8), {}, 132).kv_splits == 2);
}

TEST_CASE("plan_launch: prefill runs one split, longest rows first", "[cuda][plan]") {
  const AttentionShape shape = make_shape(RaggedLengths::uniform(1, 4096, 4096), 32, 8, 128, 128);
  const BlockMask bm = build_block_mask(CausalMask{}, shape.lengths, 32, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm);
  const LaunchPlan plan = plan_launch(shape, dl, {}, 132);
  CHECK(plan.heads_per_cta == 1);
  CHECK(!plan.decode);
  CHECK(plan.queries_per_cta == 128);
  CHECK(plan.head_groups == 32);
  CHECK(plan.kv_splits == 1);
  CHECK(plan.workspace_out_elems(32, 128) == 0);
  CHECK(plan.workspace_lse_elems(32) == 0);
  REQUIRE(plan.items.size() == 32);
  CHECK(plan.items.front() == cuda::WorkItem{0, 31 * 128});  // the last q-block sees the most keys
  CHECK(plan.items.back() == cuda::WorkItem{0, 0});
  check_plan(shape, bm, {}, 132, plan);

  // Requested splits are honoured, capped at kMaxKvSplits.
  PlanOptions three;
  three.kv_splits = 3;
  const LaunchPlan p3 = plan_launch(shape, dl, three, 132);
  CHECK(p3.kv_splits == 3);
  CHECK(p3.workspace_out_elems(32, 96) == 3 * 4096 * 32 * 96);
  CHECK(p3.workspace_lse_elems(32) == 3 * 4096 * 32);
  check_plan(shape, bm, three, 132, p3);
  PlanOptions many;
  many.kv_splits = 1000;
  CHECK(plan_launch(shape, dl, many, 132).kv_splits == cuda::kMaxKvSplits);
  PlanOptions one;
  one.kv_splits = 1;
  CHECK(plan_launch(shape, dl, one, 1000000).kv_splits == 1);
}

TEST_CASE("plan_launch: packing rules and empty sequences", "[cuda][plan]") {
  const index_t sms = 132;
  struct Case {
    index_t heads, kv_heads, max_q;
    index_t want_hpc;
  };
  // Packed exactly when group > 1, 128 % group == 0 and max_q_len * group <= 128.
  for (const Case c :
       {Case{8, 1, 16, 8}, Case{8, 1, 17, 1}, Case{6, 2, 1, 1}, Case{4, 4, 1, 1}, Case{64, 2, 4, 32}, Case{64, 2, 5, 1},
        Case{128, 1, 1, 128}, Case{128, 1, 2, 1}, Case{10, 2, 1, 1}, Case{2, 1, 64, 2}, Case{2, 1, 65, 1}}) {
    INFO("heads " << c.heads << " over " << c.kv_heads << ", max q " << c.max_q);
    const AttentionShape shape =
        make_shape(RaggedLengths{{c.max_q, 0, c.max_q / 2}, {300, 20, 1000}}, c.heads, c.kv_heads, 64, 64);
    const BlockMask bm = build_block_mask(CausalMask{Alignment::bottom_right}, shape.lengths, c.heads, kCudaBlock);
    const LaunchPlan plan = plan_launch(shape, build_device_mask_layout(bm), {}, sms);
    CHECK(plan.heads_per_cta == c.want_hpc);
    check_plan(shape, bm, {}, sms, plan);
  }
  // No queries at all: no work, no split, no workspace.
  const AttentionShape none = make_shape(RaggedLengths{{0, 0}, {5000, 0}}, 8, 2, 64, 64);
  const BlockMask bm = build_block_mask(CausalMask{}, none.lengths, 8, kCudaBlock);
  const LaunchPlan plan = plan_launch(none, build_device_mask_layout(bm), {}, sms);
  CHECK(plan.items.empty());
  CHECK(plan.kv_splits == 1);
  CHECK(plan.ctas() == 0);
  CHECK(plan.q_token_base == std::vector<std::int64_t>{0, 0});
  CHECK(plan.q_tokens == 0);
  CHECK(plan.workspace_out_elems(8, 64) == 0);
  // num_sms must be positive.
  CHECK_THROWS_WITH(plan_launch(none, build_device_mask_layout(bm), {}, 0), ContainsSubstring("num_sms"));
}

TEST_CASE("plan_launch on random shapes and masks", "[cuda][plan]") {
  std::mt19937 rng(31337);
  static constexpr index_t kGroups[] = {1, 2, 3, 4, 5, 6, 8, 16, 32};
  static constexpr index_t kSms[] = {1, 8, 108, 132};
  static constexpr index_t kDims[] = {32, 64, 72, 80, 96, 128, 130, 192, 256};
  int packed = 0, split = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const index_t kv_heads = pick(rng, 1, 4);
    const index_t group = kGroups[pick(rng, 0, static_cast<index_t>(std::size(kGroups)) - 1)];
    const index_t heads = kv_heads * group;
    const index_t batch = pick(rng, 1, 5);
    const bool decode = pick(rng, 0, 1) == 0;
    RaggedLengths lengths;
    for (index_t b = 0; b < batch; ++b) {
      lengths.q.push_back(decode ? pick(rng, 0, std::max<index_t>(1, 128 / group)) : pick_len(rng, 3000));
      lengths.kv.push_back(pick(rng, 0, 3) == 0 ? pick_len(rng, 300) : pick(rng, 0, 20000));
    }
    const AttentionShape shape =
        make_shape(lengths, heads, kv_heads, kDims[pick(rng, 0, static_cast<index_t>(std::size(kDims)) - 1)],
                   kDims[pick(rng, 0, static_cast<index_t>(std::size(kDims)) - 1)]);
    BlockMask bm;
    switch (pick(rng, 0, 3)) {
      case 0:
        bm = build_block_mask(CausalMask{Alignment::bottom_right}, lengths, heads, kCudaBlock);
        break;
      case 1:
        bm = build_block_mask(SlidingWindowMask{pick(rng, 0, 4000), 0, Alignment::bottom_right}, lengths, heads,
                              kCudaBlock);
        break;
      case 2:
        bm = build_block_mask(FullMask{}, lengths, heads, kCudaBlock);
        break;
      default: {
        std::vector<SlidingWindowMask> windows;
        for (index_t h = 0; h < heads; ++h) {
          windows.push_back({pick(rng, -1, 3000), pick(rng, -1, 10), pick_alignment(rng)});
        }
        bm = build_block_mask(PerHeadMask<SlidingWindowMask>{windows}, lengths, heads, kCudaBlock);
        break;
      }
    }
    PlanOptions options;
    if (pick(rng, 0, 3) == 0) options.kv_splits = pick(rng, 1, 200);
    const index_t sms = kSms[pick(rng, 0, static_cast<index_t>(std::size(kSms)) - 1)];
    const LaunchPlan plan = plan_launch(shape, build_device_mask_layout(bm), options, sms);
    INFO("trial " << trial);
    check_plan(shape, bm, options, sms, plan);
    packed += plan.heads_per_cta > 1;
    split += options.kv_splits == 0 && plan.kv_splits > 1;
  }
  // The random shapes reach both packing and automatic splits.
  CHECK(packed >= 10);
  CHECK(split >= 10);
}

TEST_CASE("plan_launch rejects other block shapes", "[cuda][plan]") {
  const AttentionShape shape = make_shape(RaggedLengths::uniform(2, 300, 300), 4, 2, 64, 64);
  for (const BlockShape block : {BlockShape{64, 64}, BlockShape{128, 128}, BlockShape{64, 128}, BlockShape{256, 64}}) {
    const BlockMask bm = build_block_mask(CausalMask{}, shape.lengths, 4, block);
    const DeviceMaskLayout dl = build_device_mask_layout(bm);  // any shape flattens
    CHECK(dl.block.q == block.q);
    CHECK(dl.block.kv == block.kv);
    const std::string got = detail::concat("(", block.q, ", ", block.kv, ")");
    CHECK_THROWS_AS(plan_launch(shape, dl, {}, 132), seqattn::invalid_argument);
    CHECK_THROWS_WITH(plan_launch(shape, dl, {}, 132), ContainsSubstring(got) && ContainsSubstring("(128, 64)"));
  }
  const BlockMask ok = build_block_mask(CausalMask{}, shape.lengths, 4, kCudaBlock);
  CHECK_NOTHROW(plan_launch(shape, build_device_mask_layout(ok), {}, 132));
}

TEST_CASE("plan_launch: a device mask built for other sequences is refused", "[cuda][plan]") {
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 100, 100), 1, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm);
  const AttentionShape two = make_shape(RaggedLengths::uniform(2, 300, 300), 1, 1, 64, 64);
  CHECK_THROWS_WITH(plan_launch(two, dl, {}, 132), ContainsSubstring("other lengths"));
  const AttentionShape longer = make_shape(RaggedLengths::uniform(1, 100, 101), 1, 1, 64, 64);
  CHECK_THROWS_WITH(plan_launch(longer, dl, {}, 132), ContainsSubstring("other lengths"));
  CHECK_NOTHROW(plan_launch(make_shape(RaggedLengths::uniform(1, 100, 100), 1, 1, 64, 64), dl, {}, 132));
}

// ---- Backward planning ------------------------------------------------------

namespace {

// The key pass's view of the mask, rebuilt element by element from the
// transposed device layout alone (rows: key blocks of 64; entries: q-blocks of
// 128; tile bits: per key, two words over the block's queries) and compared
// with the description's predicate.
void check_key_layout(const AnyMask& mask, const BlockMask& bm, const DeviceMaskLayout& keys, index_t heads) {
  const RaggedLengths& l = bm.lengths();
  CHECK(keys.block.q == 64);
  CHECK(keys.block.kv == 128);
  CHECK(keys.words_per_row == 2);
  CHECK(keys.lengths.q == l.kv);
  CHECK(keys.lengths.kv == l.q);
  CHECK(keys.mask_heads == bm.heads());
  const bool invariant = bm.heads() == 1;
  index_t mismatches = 0, unordered = 0;
  std::string first;
  index_t rows_before = 0;
  for (index_t b = 0; b < l.batch(); ++b) {
    const index_t q_len = l.q[static_cast<std::size_t>(b)], kv_len = l.kv[static_cast<std::size_t>(b)];
    const index_t nqb = (q_len + 127) / 128, nkb = (kv_len + 63) / 64;
    CHECK(keys.row_base[static_cast<std::size_t>(b)] == rows_before);
    rows_before += nkb * bm.heads();
    for (index_t h = 0; h < heads; ++h) {
      if (invariant && h != 0 && h != heads - 1) continue;
      const MaskContext ctx{b, h, q_len, kv_len};
      for (index_t kb = 0; kb < nkb; ++kb) {
        const auto r =
            static_cast<std::size_t>(keys.row_base[static_cast<std::size_t>(b)] + (invariant ? 0 : h) * nkb + kb);
        std::vector<std::int32_t> kind(static_cast<std::size_t>(nqb), -2);  // -2 absent, -1 full, else tile
        for (auto i = keys.row_offsets[r]; i < keys.row_offsets[r + 1]; ++i) {
          const KvTileEntry e = keys.entries[static_cast<std::size_t>(i)];
          unordered += i > keys.row_offsets[r] && keys.entries[static_cast<std::size_t>(i) - 1].kv_block >= e.kv_block;
          if (e.kv_block >= 0 && e.kv_block < nqb) kind[static_cast<std::size_t>(e.kv_block)] = e.tile;
        }
        for (index_t qb = 0; qb < nqb; ++qb) {
          const std::int32_t k = kind[static_cast<std::size_t>(qb)];
          for (index_t key_local = 0; key_local < 64; ++key_local) {
            const index_t kv = kb * 64 + key_local;
            for (index_t q_local = 0; q_local < 128; ++q_local) {
              const index_t q = qb * 128 + q_local;
              const bool inside = q < q_len && kv < kv_len;
              bool dev = false;
              if (k == -1) {
                dev = inside;
              } else if (k >= 0 && k < keys.num_tiles()) {
                const auto word = keys.tile_bits[static_cast<std::size_t>((k * 64 + key_local) * 2 + q_local / 64)];
                dev = (word >> (q_local % 64)) & 1u;
              }
              const bool want = inside && mask.allowed(ctx, q, kv);
              if (dev != want && mismatches++ == 0) {
                first = detail::concat("b=", b, " h=", h, " q=", q, " kv=", kv, " (tile kind ", k, "): device ", dev,
                                       ", mask ", want);
              }
            }
          }
        }
      }
    }
  }
  INFO("first element mismatch: " << first);
  CHECK(mismatches == 0);
  CHECK(unordered == 0);
}

index_t layout_row_length(const DeviceMaskLayout& dl, index_t row) {
  return dl.row_offsets[static_cast<std::size_t>(row) + 1] - dl.row_offsets[static_cast<std::size_t>(row)];
}

// plan_backward_launch's documented rules, restated: every query block and
// every key block exactly once, longest (head-0) row first.
void check_backward_plan(const AttentionShape& shape, const DeviceMaskLayout& dl, const DeviceMaskLayout& keys,
                         const cuda::BackwardLaunchPlan& plan) {
  INFO("shape: " << shape);
  CHECK(plan.head_dim == expected_head_dim(shape.dk, shape.dv));
  index_t tokens = 0, want_queries = 0, want_keys = 0;
  REQUIRE(plan.q_token_base.size() == static_cast<std::size_t>(shape.batch()));
  for (index_t b = 0; b < shape.batch(); ++b) {
    CHECK(plan.q_token_base[static_cast<std::size_t>(b)] == tokens);
    tokens += shape.q_len(b);
    want_queries += (shape.q_len(b) + 127) / 128;
    want_keys += (shape.kv_len(b) + 63) / 64;
  }
  CHECK(plan.q_tokens == tokens);
  CHECK(plan.workspace_rows(shape.heads) == tokens * shape.heads);
  CHECK(static_cast<index_t>(plan.query_items.size()) == want_queries);
  CHECK(static_cast<index_t>(plan.key_items.size()) == want_keys);
  std::set<std::pair<index_t, index_t>> queries, key_blocks;
  index_t bad = 0, order_breaks = 0, prev = -1;
  for (const auto& item : plan.query_items) {
    bad += item.batch < 0 || item.batch >= shape.batch() || item.q_begin % 128 != 0 || item.q_begin < 0 ||
           item.q_begin >= shape.q_len(item.batch);
    if (bad) break;
    queries.insert({item.batch, item.q_begin});
    const index_t t = layout_row_length(dl, dl.row_base[static_cast<std::size_t>(item.batch)] + item.q_begin / 128);
    order_breaks += prev >= 0 && t > prev;
    prev = t;
  }
  prev = -1;
  for (const auto& item : plan.key_items) {
    bad += item.batch < 0 || item.batch >= shape.batch() || item.kv_block < 0 ||
           item.kv_block * 64 >= shape.kv_len(item.batch);
    if (bad) break;
    key_blocks.insert({item.batch, item.kv_block});
    const index_t t = layout_row_length(keys, keys.row_base[static_cast<std::size_t>(item.batch)] + item.kv_block);
    order_breaks += prev >= 0 && t > prev;
    prev = t;
  }
  CHECK(bad == 0);
  CHECK(static_cast<index_t>(queries.size()) == want_queries);
  CHECK(static_cast<index_t>(key_blocks.size()) == want_keys);
  CHECK(order_breaks == 0);
}

}  // namespace

TEST_CASE("Key-side device mask: the transposed layout equals the mask, element by element", "[cuda][plan]") {
  std::mt19937 rng(777);
  for (int trial = 0; trial < 80; ++trial) {
    const MaskCase c = random_mask_case(rng, 300);
    INFO("trial " << trial << ": " << describe(c));
    const BlockMask bm = build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock);
    check_key_layout(c.mask, bm, build_device_mask_layout(bm.transposed()), c.heads);
  }
}

TEST_CASE("plan_backward_launch on random shapes and masks", "[cuda][plan]") {
  std::mt19937 rng(4242);
  static constexpr index_t kDims[] = {8, 64, 72, 80, 128};
  for (int trial = 0; trial < 60; ++trial) {
    const MaskCase c = random_mask_case(rng, 1200);
    const index_t kv_heads = pick(rng, 1, 3);
    const AttentionShape shape =
        make_shape(c.lengths, kv_heads * pick(rng, 1, 4), kv_heads, kDims[pick(rng, 0, 4)], kDims[pick(rng, 0, 4)]);
    INFO("trial " << trial << ": " << describe(c));
    const BlockMask bm = build_block_mask(c.mask, c.lengths, c.heads, kCudaBlock);
    const DeviceMaskLayout dl = build_device_mask_layout(bm);
    const DeviceMaskLayout keys = build_device_mask_layout(bm.transposed());
    check_backward_plan(shape, dl, keys, cuda::plan_backward_launch(shape, dl, keys));
  }
}

TEST_CASE("plan_backward_launch refuses head dims over 128 and a key layout that is not the transpose",
          "[cuda][plan]") {
  const RaggedLengths lengths = RaggedLengths::uniform(2, 300, 200);
  const BlockMask bm = build_block_mask(CausalMask{}, lengths, 4, kCudaBlock);
  const DeviceMaskLayout dl = build_device_mask_layout(bm), keys = build_device_mask_layout(bm.transposed());
  CHECK_NOTHROW(cuda::plan_backward_launch(make_shape(lengths, 4, 2, 128, 128), dl, keys));
  CHECK_THROWS_WITH(cuda::plan_backward_launch(make_shape(lengths, 4, 2, 136, 128), dl, keys),
                    ContainsSubstring("head dims up to 128") && ContainsSubstring("dk 136"));
  CHECK_THROWS_WITH(cuda::plan_backward_launch(make_shape(lengths, 4, 2, 64, 256), dl, keys),
                    ContainsSubstring("dv 256"));
  CHECK_THROWS_WITH(cuda::plan_backward_launch(make_shape(lengths, 4, 2, 64, 64), dl, dl),
                    ContainsSubstring("not the transpose"));
}

// ---- variants::BiasTensor

TEST_CASE("BiasTensor: indexing, broadcasting and the shape check", "[cuda][plan][bias]") {
  // [1, 3, 4, 6] with row stride 6, read through a view of the first 5 keys.
  std::vector<float> values(3 * 4 * 6);
  std::iota(values.begin(), values.end(), 0.0f);
  const TensorView<const float> view(values.data(), Extents{1, 3, 4, 5}, Strides(Extents{72, 24, 6, 1}));
  const variants::BiasTensor bias(view);
  CHECK(bias(0, 2, 3, 4) == values[2 * 24 + 3 * 6 + 4]);
  CHECK(bias(1, 1, 2, 0) == values[1 * 24 + 2 * 6]);  // batch extent 1: broadcast
  const variants::BiasTensor heads_broadcast(
      TensorView<const float>(values.data(), Extents{2, 1, 4, 6}, Strides(Extents{24, 1000, 6, 1})));
  CHECK(heads_broadcast(1, 7, 1, 2) == values[24 + 6 + 2]);

  CHECK_THROWS_WITH(variants::BiasTensor(TensorView<const float>(values.data(), Extents{3, 4, 6})),
                    ContainsSubstring("variants::BiasTensor: the bias must have rank 4 [batch, heads, q, kv], got "
                                      "shape (3, 4, 6)"));
  RaggedLengths lengths;
  lengths.q = {4, 2};
  lengths.kv = {5, 5};
  AttentionShape shape;
  shape.layout = Layout::bshd;
  shape.lengths = lengths;
  shape.heads = 3;
  shape.kv_heads = 1;
  shape.dk = shape.dv = 8;
  CHECK_NOTHROW(bias.check(shape));
  CHECK_NOTHROW(variants::Bias{bias}.check(shape));
  shape.lengths.kv = {5, 6};
  CHECK_THROWS_WITH(variants::Bias{bias}.check(shape),
                    ContainsSubstring("variants::BiasTensor: the bias of shape (1, 3, 4, 5) does not cover the call: "
                                      "it needs (2 or 1, 3 or 1, >= 4, >= 6)"));
  shape.lengths.kv = {5, 5};
  shape.heads = 6;
  CHECK_THROWS_WITH(bias.check(shape), ContainsSubstring("does not cover the call"));
}

TEST_CASE("BiasTensor: the reference backend reads it like a bias function", "[cuda][plan][bias]") {
  const index_t batch = 2, len = 9, heads = 2, dim = 8;
  std::vector<float> q(static_cast<std::size_t>(batch * len * heads * dim)), k(q.size()), v(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<float>((i * 7) % 11) / 11.0f - 0.5f;
    k[i] = static_cast<float>((i * 5) % 13) / 13.0f - 0.5f;
    v[i] = static_cast<float>((i * 3) % 7) / 7.0f;
  }
  std::vector<float> bias_values(static_cast<std::size_t>(batch * heads * len * len));
  for (std::size_t i = 0; i < bias_values.size(); ++i) {
    bias_values[i] = i % 13 == 5 ? -std::numeric_limits<float>::infinity() : static_cast<float>(i % 17) / 8.0f;
  }
  const Extents qkv{batch, len, heads, dim};
  const AttentionInputs<float> in{TensorView<const float>(q.data(), qkv), TensorView<const float>(k.data(), qkv),
                                  TensorView<const float>(v.data(), qkv)};
  const TensorView<const float> bias_view(bias_values.data(), Extents{batch, heads, len, len});
  const auto plan = plan_attention<backends::Reference>(shape_of(in), CausalMask{});
  std::vector<float> out_tensor(q.size()), out_function(q.size());
  attention_forward(plan, in, TensorView<float>(out_tensor.data(), qkv), {},
                    variants::Bias{variants::BiasTensor(bias_view)}, execution::Serial{});
  attention_forward(plan, in, TensorView<float>(out_function.data(), qkv), {},
                    variants::Bias{[&](index_t b, index_t h, index_t i, index_t j) { return bias_view(b, h, i, j); }},
                    execution::Serial{});
  CHECK(out_tensor == out_function);
}

}  // namespace seqattn_test_cuda_cuda_plan_test
