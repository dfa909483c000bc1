// Flex BlockMask export against an oracle written the way create_block_mask
// is: the dense mask padded with false to whole blocks, element counts per
// tile, and each 0/1 block row turned into indices by a stable descending
// sort; the key-side arrays by transposing the dense block matrix. Random
// shapes, lengths that are not multiples of the block size included.
#include "seqattn/masks/flex_export.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_flex_export_test {

using namespace seqattn;

namespace {

index_t pick(std::mt19937& rng, index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); }

// argsort(row, descending=True, stable=True) of a 0/1 row, and its sum.
std::pair<std::int32_t, std::vector<std::int32_t>> ordered(const std::vector<int>& row) {
  std::vector<std::int32_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    return row[static_cast<std::size_t>(a)] > row[static_cast<std::size_t>(b)];
  });
  return {static_cast<std::int32_t>(std::accumulate(row.begin(), row.end(), 0)), idx};
}

struct FlexOracle {
  std::vector<std::int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx;
};

template <class Allowed>
FlexOracle flex_oracle(const Allowed& allowed, index_t B, index_t H, index_t Q, index_t KV, BlockShape bs,
                       bool separate) {
  const index_t nq = (Q + bs.q - 1) / bs.q, nkv = (KV + bs.kv - 1) / bs.kv;
  FlexOracle o;
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      // Counts per tile over the padded grid (padding counts as false).
      std::vector<std::vector<int>> partial(static_cast<std::size_t>(nq),
                                            std::vector<int>(static_cast<std::size_t>(nkv), 0));
      auto full = partial;
      for (index_t qb = 0; qb < nq; ++qb) {
        for (index_t kb = 0; kb < nkv; ++kb) {
          index_t sum = 0;
          for (index_t i = qb * bs.q; i < (qb + 1) * bs.q; ++i) {
            for (index_t j = kb * bs.kv; j < (kb + 1) * bs.kv; ++j) sum += (i < Q && j < KV && allowed(b, h, i, j));
          }
          const bool is_full = sum == bs.q * bs.kv;
          full[std::size_t(qb)][std::size_t(kb)] = separate && is_full;
          partial[std::size_t(qb)][std::size_t(kb)] = sum > 0 && (!separate || !is_full);
        }
      }
      auto emit = [](const std::vector<std::vector<int>>& m, std::vector<std::int32_t>& num,
                     std::vector<std::int32_t>& idx) {
        for (const auto& row : m) {
          auto [n, i] = ordered(row);
          num.push_back(n);
          idx.insert(idx.end(), i.begin(), i.end());
        }
      };
      auto transpose = [&](const std::vector<std::vector<int>>& m) {
        std::vector<std::vector<int>> t(static_cast<std::size_t>(nkv), std::vector<int>(static_cast<std::size_t>(nq)));
        for (index_t i = 0; i < nq; ++i) {
          for (index_t j = 0; j < nkv; ++j) t[std::size_t(j)][std::size_t(i)] = m[std::size_t(i)][std::size_t(j)];
        }
        return t;
      };
      emit(partial, o.kv_num, o.kv_idx);
      emit(transpose(partial), o.q_num, o.q_idx);
      if (separate) {
        emit(full, o.full_kv_num, o.full_kv_idx);
        emit(transpose(full), o.full_q_num, o.full_q_idx);
      }
    }
  }
  return o;
}

std::vector<std::int32_t> values(const Tensor<std::int32_t>& t) { return {t.values().begin(), t.values().end()}; }

AnyMask random_flex_mask(std::mt19937& rng, index_t q_len, index_t kv_len, index_t batch, index_t heads) {
  const auto align = pick(rng, 0, 1) ? Alignment::top_left : Alignment::bottom_right;
  switch (pick(rng, 0, 7)) {
    case 0:
      return FullMask{};
    case 1:
      return CausalMask{align};
    case 2:
      return SlidingWindowMask{pick(rng, -1, 12), pick(rng, -1, 4), align};
    case 3:
      return PrefixLMMask{pick(rng, 0, kv_len), {}, align};
    case 4: {
      if (q_len != kv_len) return ChunkedCausalMask{pick(rng, 1, 9), align};
      // Per-sequence documents (batch rows differ), causal inside.
      auto ids = std::make_shared<std::vector<std::int32_t>>();
      for (index_t b = 0; b < batch; ++b) {
        std::int32_t id = 1;
        index_t t = 0;
        while (t < q_len) {
          const index_t len = pick(rng, 1, 9);
          for (index_t i = 0; i < len && t < q_len; ++i, ++t) ids->push_back(id);
          ++id;
        }
      }
      auto layout = std::make_shared<DocumentLayout>(
          DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids->data(), Extents{batch, q_len})));
      auto owner = std::make_shared<std::pair<decltype(ids), decltype(layout)>>(ids, layout);
      return AnyMask(document_mask(*layout, CausalMask{}), owner);
    }
    case 5:
      return AnyMask(CausalMask{align} | ~CausalMask{align});  // partial in the BlockMask, full by content
    case 6: {
      auto masks = std::make_shared<std::vector<AnyMask>>();
      for (index_t h = 0; h < heads; ++h) {
        masks->push_back(pick(rng, 0, 1) ? AnyMask(CausalMask{}) : AnyMask(SlidingWindowMask{pick(rng, 0, 6), 0}));
      }
      return AnyMask(PerHeadMask<AnyMask>{*masks}, masks);
    }
    default: {
      const index_t k = pick(rng, 1, std::min<index_t>(kv_len, 5));
      auto idx = std::make_shared<std::vector<std::int32_t>>();
      for (index_t r = 0; r < batch * q_len; ++r) {
        std::vector<std::int32_t> keys(static_cast<std::size_t>(kv_len));
        std::iota(keys.begin(), keys.end(), 0);
        std::shuffle(keys.begin(), keys.end(), rng);
        idx->insert(idx->end(), keys.begin(), keys.begin() + k);
      }
      auto layout = std::make_shared<TopKLayout>(
          TopKLayout::from_indices(TensorView<const std::int32_t>(idx->data(), Extents{batch, q_len, k}), kv_len));
      return AnyMask(TopKMask{layout->view()}, layout);
    }
  }
}

}  // namespace

TEST_CASE("Flex export matches create_block_mask's rules on random shapes") {
  std::mt19937 rng(424242);
  for (int trial = 0; trial < 250; ++trial) {
    const BlockShape bs{pick(rng, 1, 9), pick(rng, 1, 9)};
    const index_t q_len = pick(rng, 1, 60);
    const index_t kv_len = pick(rng, 0, 2) ? q_len : pick(rng, 1, 60);
    const index_t B = pick(rng, 1, 3), H = pick(rng, 1, 3);
    const AnyMask mask = random_flex_mask(rng, q_len, kv_len, B, H);
    // Build for one sequence when the mask does not depend on the batch row,
    // so broadcasting is exercised too.
    const bool per_row = mask.target<DocumentMask<CausalMask>>() != nullptr || mask.target<TopKMask>() != nullptr;
    const index_t stored_b = per_row || pick(rng, 0, 1) ? B : 1;
    BlockMaskOptions bo;
    bo.store_tile_bits = pick(rng, 0, 4) != 0;
    const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(stored_b, q_len, kv_len), H, bs, bo);
    FlexExportOptions fo;
    fo.separate_full_blocks = pick(rng, 0, 3) != 0;
    fo.compute_q_blocks = pick(rng, 0, 3) != 0;
    INFO("trial " << trial << " q " << q_len << " kv " << kv_len << " block (" << bs.q << ", " << bs.kv << ") B " << B
                  << " H " << H << " stored_b " << stored_b << " separate " << fo.separate_full_blocks);
    const FlexBlockMaskArrays got = to_flex_block_mask(bm, B, H, fo);
    auto allowed = [&](index_t b, index_t h, index_t q, index_t kv) {
      return mask.allowed({stored_b == 1 ? 0 : b, h, q_len, kv_len}, q, kv);
    };
    const FlexOracle want = flex_oracle(allowed, B, H, q_len, kv_len, bs, fo.separate_full_blocks);
    const index_t nq = (q_len + bs.q - 1) / bs.q, nkv = (kv_len + bs.kv - 1) / bs.kv;
    CHECK(got.kv_num_blocks.shape() == Extents{B, H, nq});
    CHECK(got.kv_indices.shape() == Extents{B, H, nq, nkv});
    CHECK(values(got.kv_num_blocks) == want.kv_num);
    CHECK(values(got.kv_indices) == want.kv_idx);
    CHECK(values(got.full_kv_num_blocks) == want.full_kv_num);
    CHECK(values(got.full_kv_indices) == want.full_kv_idx);
    if (fo.compute_q_blocks) {
      CHECK(got.q_indices.shape() == Extents{B, H, nkv, nq});
      CHECK(values(got.q_num_blocks) == want.q_num);
      CHECK(values(got.q_indices) == want.q_idx);
      CHECK(values(got.full_q_num_blocks) == want.full_q_num);
      CHECK(values(got.full_q_indices) == want.full_q_idx);
    } else {
      CHECK(got.q_num_blocks.empty());
      CHECK(got.full_q_indices.empty());
    }

    // The tile table answers every element exactly.
    const FlexTileTable table = flex_tile_table(bm);
    REQUIRE(table.tile_ids.shape() == Extents{bm.batch(), bm.heads(), nq, nkv});
    for (index_t b = 0; b < bm.batch(); ++b) {
      for (index_t h = 0; h < H; ++h) {
        const index_t sh = bm.heads() == 1 ? 0 : h;
        for (index_t q = 0; q < q_len; ++q) {
          for (index_t kv = 0; kv < kv_len; ++kv) {
            const std::int32_t id = table.tile_ids(b, sh, q / bs.q, kv / bs.kv);
            const bool from_table = id == kFlexFullTile || (id >= 0 && table.tile_bits(id, q % bs.q, kv % bs.kv) != 0);
            if (from_table != allowed(b, h, q, kv)) {
              INFO("element b " << b << " h " << h << " q " << q << " kv " << kv << " tile id " << id);
              REQUIRE(from_table == allowed(b, h, q, kv));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("Flex export marks short edge tiles partial, as the padded mask does") {
  // 10 x 10, blocks of 4: the last row and column of tiles are 2 wide.
  const BlockMask bm = build_block_mask(FullMask{}, RaggedLengths::uniform(1, 10, 10), 1, {4, 4});
  const FlexBlockMaskArrays f = to_flex_block_mask(bm, 1, 1);
  CHECK(values(f.full_kv_num_blocks) == std::vector<std::int32_t>{2, 2, 0});
  CHECK(values(f.kv_num_blocks) == std::vector<std::int32_t>{1, 1, 3});
  // Row 0: the partial block 2 first, then 0 and 1; full: 0, 1, then 2.
  CHECK(values(f.kv_indices) == std::vector<std::int32_t>{2, 0, 1, 2, 0, 1, 0, 1, 2});
  CHECK(values(f.full_kv_indices) == std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2});
}

TEST_CASE("Flex export names the shapes it cannot serve") {
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(2, 8, 8), 1, {4, 4});
  CHECK_THROWS_WITH(to_flex_block_mask(bm, 3, 1), ContainsSubstring("has 2 sequences, which neither equals B=3"));
  CHECK_THROWS_WITH(to_flex_block_mask(bm, 2, 0), ContainsSubstring("H (0) must be positive"));
  const std::vector<AnyMask> per_head{CausalMask{}, FullMask{}};
  const BlockMask two = build_block_mask(PerHeadMask<AnyMask>{per_head}, RaggedLengths::uniform(1, 8, 8), 2, {4, 4});
  CHECK_THROWS_WITH(to_flex_block_mask(two, 1, 4), ContainsSubstring("stores 2 heads, which neither equals H=4"));
  RaggedLengths ragged{{8, 6}, {8, 8}};
  const BlockMask r = build_block_mask(CausalMask{}, ragged, 1, {4, 4});
  CHECK_THROWS_WITH(to_flex_block_mask(r, 2, 1), ContainsSubstring("sequence 1 has lengths (6, 8)"));
}

}  // namespace seqattn_test_masks_flex_export_test
