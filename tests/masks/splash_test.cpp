// Splash MaskInfo against an oracle written the way JAX's _process_mask is:
// a dense per-head mask, every tile sliced and classified, partial tiles
// numbered through a map of their contents, the prefetch indices found by
// walking sorted coordinate lists with a cursor, shrinking through padded
// index lists. It shares no code with backends/splash.hpp (which works from
// the BlockMask's rows), so both have to be right for these to agree.
#include "seqattn/backends/splash.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_splash_test {

using namespace seqattn;
using seqattn::backends::SmemDtype;
using seqattn::backends::Splash;
using seqattn::backends::SplashMaskInfo;
using seqattn::backends::SplashOptions;

namespace {

using Coord = std::array<index_t, 3>;

struct Oracle {
  std::vector<index_t> shape;  // of the three index arrays
  std::vector<std::int32_t> data_next, mask_next, block_mask;
  bool has_mask_next = false;
  std::vector<std::vector<std::uint8_t>> partial_blocks;  // forward orientation
  index_t unique_masks = 0;
};

// Dense 3-d array helper: [d0, d1, d2] row-major.
struct Arr3 {
  index_t d0 = 0, d1 = 0, d2 = 0;
  std::vector<std::int32_t> v;
  Arr3() = default;
  Arr3(index_t a, index_t b, index_t c, std::int32_t fill = 0) : d0(a), d1(b), d2(c), v(std::size_t(a * b * c), fill) {}
  std::int32_t& operator()(index_t i, index_t j, index_t k) { return v[std::size_t((i * d1 + j) * d2 + k)]; }
};

Oracle oracle(const std::function<bool(index_t, index_t, index_t)>& allowed, index_t heads, index_t q_len,
              index_t kv_len, BlockShape block, const SplashOptions& o) {
  const index_t bq = block.q, bkv = block.kv;
  const index_t nq = q_len / bq, nkv = kv_len / bkv;
  std::vector<std::vector<std::uint8_t>> dense(static_cast<std::size_t>(heads));
  for (index_t h = 0; h < heads; ++h) {
    for (index_t q = 0; q < q_len; ++q) {
      for (index_t kv = 0; kv < kv_len; ++kv) dense[std::size_t(h)].push_back(allowed(h, q, kv) ? 1 : 0);
    }
  }
  // Unique masks in order of first head.
  std::vector<std::vector<std::uint8_t>> uniq;
  std::vector<index_t> head_mask;
  for (index_t h = 0; h < heads; ++h) {
    index_t id = -1;
    for (std::size_t u = 0; u < uniq.size(); ++u) {
      if (uniq[u] == dense[std::size_t(h)]) id = index_t(u);
    }
    if (id < 0) {
      id = index_t(uniq.size());
      uniq.push_back(dense[std::size_t(h)]);
    }
    head_mask.push_back(id);
  }
  const index_t hps = heads / o.head_shards;
  std::vector<std::set<index_t>> shard_ids(static_cast<std::size_t>(o.head_shards));
  for (index_t h = 0; h < heads; ++h) shard_ids[std::size_t(h / hps)].insert(head_mask[std::size_t(h)]);
  std::size_t most = 0;
  for (auto& s : shard_ids) most = std::max(most, s.size());
  const bool per_shard = most == 1;

  auto chunk = [&](index_t m, index_t qb, index_t kb) {
    std::vector<std::uint8_t> c;
    for (index_t i = 0; i < bq; ++i) {
      for (index_t j = 0; j < bkv; ++j)
        c.push_back(uniq[std::size_t(m)][std::size_t((qb * bq + i) * kv_len + kb * bkv + j)]);
    }
    return c;
  };
  auto cls_of = [](const std::vector<std::uint8_t>& c) {
    index_t ones = 0;
    for (auto x : c) ones += x;
    return ones == 0 ? 0 : ones == index_t(c.size()) ? 2 : 1;
  };
  Oracle out;
  out.unique_masks = index_t(uniq.size());
  const index_t rows = per_shard ? o.head_shards : heads;
  Arr3 block_mask(rows, nq, nkv);
  index_t num_partial = 0;
  std::map<Coord, std::int32_t> coord_pid;  // (head, qb, kb)
  for (index_t m = 0; m < index_t(uniq.size()); ++m) {
    for (index_t qb = 0; qb < nq; ++qb) {
      for (index_t kb = 0; kb < nkv; ++kb) {
        const auto c = chunk(m, qb, kb);
        const int k = cls_of(c);
        for (index_t r = 0; r < rows; ++r) {
          const index_t h = per_shard ? r * hps : r;
          if (head_mask[std::size_t(h)] == m) block_mask(r, qb, kb) = k;
        }
        if (k == 1) {
          // Numbered by first appearance of the content (a linear search: small grids).
          std::int32_t id = -1;
          for (std::size_t p = 0; p < out.partial_blocks.size() && id < 0; ++p) {
            if (std::equal(c.begin(), c.end(), out.partial_blocks[p].begin())) id = std::int32_t(p);
          }
          if (id < 0) {
            id = std::int32_t(num_partial++);
            out.partial_blocks.push_back(c);
          }
          for (index_t h = 0; h < heads; ++h) {
            if (head_mask[std::size_t(h)] == m) coord_pid[{h, qb, kb}] = id;
          }
        }
      }
    }
  }
  out.has_mask_next = num_partial > 0;
  const index_t qbps = nq / o.q_seq_shards;
  Arr3 data_next(rows, nq, nkv), mask_next(rows, nq, nkv);
  for (index_t s = 0; s < o.head_shards; ++s) {
    const index_t r0 = per_shard ? s : s * hps, nr = per_shard ? 1 : hps;
    for (index_t t = 0; t < o.q_seq_shards; ++t) {
      const index_t q0 = t * qbps;
      // Iteration coordinates: fwd (h, q, kv), dkv (kv, h, q), local indices.
      auto to_cell = [&](const Coord& c) {
        return o.is_dkv ? Coord{r0 + c[1], q0 + c[2], c[0]} : Coord{r0 + c[0], q0 + c[1], c[2]};
      };
      std::vector<Coord> order, data_coords, mask_coords;
      const Coord ext = o.is_dkv ? Coord{nkv, nr, qbps} : Coord{nr, qbps, nkv};
      for (index_t i = 0; i < ext[0]; ++i) {
        for (index_t j = 0; j < ext[1]; ++j) {
          for (index_t k = 0; k < ext[2]; ++k) {
            const Coord idx{i, j, k};
            order.push_back(idx);
            const Coord cell = to_cell(idx);
            const int v = block_mask(cell[0], cell[1], cell[2]);
            if (v != 0) data_coords.push_back(idx);
            if (v == 1) mask_coords.push_back(idx);
          }
        }
      }
      if (data_coords.empty()) continue;
      std::size_t dj = 0, mj = 0;
      for (const Coord& idx : order) {
        const Coord cell = to_cell(idx);
        if (idx > data_coords[dj == data_coords.size() ? 0 : dj] && dj < data_coords.size()) ++dj;
        const Coord& cj = data_coords[dj == data_coords.size() ? 0 : dj];
        data_next(cell[0], cell[1], cell[2]) = std::int32_t(cj[2]);
        if (out.has_mask_next && !mask_coords.empty()) {
          if (idx > mask_coords[mj == mask_coords.size() ? 0 : mj] && mj < mask_coords.size()) ++mj;
          const Coord& cm = mask_coords[mj == mask_coords.size() ? 0 : mj];
          const Coord mc = to_cell(cm);
          const index_t head = per_shard ? s * hps : mc[0];
          mask_next(cell[0], cell[1], cell[2]) = coord_pid.at({head, mc[1], mc[2]});
        }
      }
    }
  }
  Arr3 bm_out = block_mask, dn_out = data_next, mn_out = mask_next;
  if (o.shrink_grid && uniq.size() == 1) {
    std::vector<Arr3> sb, sd, sm;
    for (index_t t = 0; t < o.q_seq_shards; ++t) {
      const index_t q0 = t * qbps;
      // Lists of kept indices padded with -1: at the end (fwd) or the front (dkv).
      std::vector<std::vector<index_t>> lists;
      const index_t lines = o.is_dkv ? nkv : qbps, len = o.is_dkv ? qbps : nkv;
      std::size_t width = 0;
      for (index_t l = 0; l < lines; ++l) {
        std::vector<index_t> keep;
        for (index_t i = 0; i < len; ++i) {
          if ((o.is_dkv ? block_mask(0, q0 + i, l) : block_mask(0, q0 + l, i)) != 0) keep.push_back(i);
        }
        width = std::max(width, keep.size());
        lists.push_back(keep);
      }
      if (width == 0) throw std::runtime_error("a q shard without non-empty tiles");
      for (auto& l : lists) {
        const std::vector<index_t> pad(width - l.size(), -1);
        l.insert(o.is_dkv ? l.begin() : l.end(), pad.begin(), pad.end());
      }
      const auto w = index_t(width);
      Arr3 b2 = o.is_dkv ? Arr3(rows, w, nkv) : Arr3(rows, qbps, w);
      Arr3 d2 = b2, m2 = b2;
      for (index_t r = 0; r < rows; ++r) {
        for (index_t l = 0; l < lines; ++l) {
          for (index_t i = 0; i < w; ++i) {
            const index_t sel = lists[std::size_t(l)][std::size_t(i)];
            if (sel < 0) continue;
            const index_t q = o.is_dkv ? q0 + sel : q0 + l, kv = o.is_dkv ? l : sel;
            std::int32_t& bb = o.is_dkv ? b2(r, i, l) : b2(r, l, i);
            std::int32_t& dd = o.is_dkv ? d2(r, i, l) : d2(r, l, i);
            std::int32_t& mm = o.is_dkv ? m2(r, i, l) : m2(r, l, i);
            bb = block_mask(r, q, kv);
            dd = data_next(r, q, kv);
            mm = mask_next(r, q, kv);
          }
        }
      }
      sb.push_back(b2);
      sd.push_back(d2);
      sm.push_back(m2);
    }
    if (o.q_seq_shards == 1) {
      bm_out = sb[0];
      dn_out = sd[0];
      mn_out = sm[0];
    } else {
      index_t widest = 0;
      for (auto& a : sb) widest = std::max(widest, o.is_dkv ? a.d1 : a.d2);
      // np.pad: block_mask with zeros, the others with mode='edge'; then concatenate on axis 1.
      auto pad = [&](const Arr3& a, bool edge) {
        Arr3 p = o.is_dkv ? Arr3(a.d0, widest, a.d2) : Arr3(a.d0, a.d1, widest);
        for (index_t i = 0; i < p.d0; ++i) {
          for (index_t j = 0; j < p.d1; ++j) {
            for (index_t k = 0; k < p.d2; ++k) {
              const bool inside = o.is_dkv ? j < a.d1 : k < a.d2;
              const index_t jj = o.is_dkv ? std::min(j, a.d1 - 1) : j, kk = o.is_dkv ? k : std::min(k, a.d2 - 1);
              p(i, j, k) = inside || edge ? const_cast<Arr3&>(a)(i, jj, kk) : 0;
            }
          }
        }
        return p;
      };
      auto cat = [&](const std::vector<Arr3>& parts, bool edge) {
        std::vector<Arr3> padded;
        index_t total = 0;
        for (auto& a : parts) {
          padded.push_back(pad(a, edge));
          total += padded.back().d1;
        }
        Arr3 c(rows, total, padded[0].d2);
        index_t off = 0;
        for (auto& p : padded) {
          for (index_t i = 0; i < p.d0; ++i) {
            for (index_t j = 0; j < p.d1; ++j) {
              for (index_t k = 0; k < p.d2; ++k) c(i, off + j, k) = p(i, j, k);
            }
          }
          off += p.d1;
        }
        return c;
      };
      bm_out = cat(sb, false);
      dn_out = cat(sd, true);
      mn_out = cat(sm, true);
    }
  }
  out.shape = {bm_out.d0, bm_out.d1, bm_out.d2};
  out.block_mask = bm_out.v;
  out.data_next = dn_out.v;
  out.mask_next = mn_out.v;
  return out;
}

SmemDtype expected_dtype(const std::vector<std::int32_t>& v, bool downcast) {
  if (!downcast || v.empty()) return SmemDtype::int32;
  const auto top = *std::max_element(v.begin(), v.end());
  return top < 128 ? SmemDtype::int8 : top < 32768 ? SmemDtype::int16 : SmemDtype::int32;
}

void compare(const SplashMaskInfo& got, const Oracle& want, const SplashOptions& o, BlockShape block, bool in_kernel) {
  const std::vector<index_t> shape(got.block_mask.values.shape().dims().begin(),
                                   got.block_mask.values.shape().dims().end());
  REQUIRE(shape == want.shape);
  REQUIRE(got.data_next.values.shape() == got.block_mask.values.shape());
  CHECK(got.num_unique_masks == want.unique_masks);
  const std::vector<std::int32_t> bm(got.block_mask.values.values().begin(), got.block_mask.values.values().end());
  const std::vector<std::int32_t> dn(got.data_next.values.values().begin(), got.data_next.values.values().end());
  CHECK(bm == want.block_mask);
  CHECK(dn == want.data_next);
  CHECK(got.block_mask.dtype == expected_dtype(want.block_mask, o.downcast_smem_data));
  CHECK(got.data_next.dtype == expected_dtype(want.data_next, o.downcast_smem_data));
  if (in_kernel) {
    CHECK_FALSE(got.mask_next.has_value());
    CHECK_FALSE(got.partial_mask_blocks.has_value());
    REQUIRE(got.q_sequence.has_value());
    for (index_t i = 0; i < got.q_sequence->size(); ++i) CHECK(got.q_sequence->data()[i] == i);
    return;
  }
  CHECK_FALSE(got.q_sequence.has_value());
  REQUIRE(got.mask_next.has_value() == want.has_mask_next);
  REQUIRE(got.partial_mask_blocks.has_value() == want.has_mask_next);
  if (!want.has_mask_next) return;
  const std::vector<std::int32_t> mn(got.mask_next->values.values().begin(), got.mask_next->values.values().end());
  CHECK(mn == want.mask_next);
  CHECK(got.mask_next->dtype == expected_dtype(want.mask_next, o.downcast_smem_data));
  const auto& pmb = *got.partial_mask_blocks;
  REQUIRE(pmb.extent(0) == index_t(want.partial_blocks.size()));
  REQUIRE(pmb.extent(1) == (o.is_dkv ? block.kv : block.q));
  REQUIRE(pmb.extent(2) == (o.is_dkv ? block.q : block.kv));
  for (index_t p = 0; p < pmb.extent(0); ++p) {
    for (index_t i = 0; i < block.q; ++i) {
      for (index_t j = 0; j < block.kv; ++j) {
        const auto g = o.is_dkv ? pmb(p, j, i) : pmb(p, i, j);
        if (g != want.partial_blocks[std::size_t(p)][std::size_t(i * block.kv + j)]) {
          INFO("partial block " << p << " element (" << i << ", " << j << ")");
          REQUIRE(g == want.partial_blocks[std::size_t(p)][std::size_t(i * block.kv + j)]);
        }
      }
    }
  }
}

index_t pick(std::mt19937& rng, index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); }

// Random options valid for the shape: shards that divide, both passes.
SplashOptions random_options(std::mt19937& rng, index_t heads, index_t nq) {
  SplashOptions o;
  o.is_dkv = pick(rng, 0, 1) == 1;
  std::vector<index_t> hs, qs;
  for (index_t d = 1; d <= heads; ++d) {
    if (heads % d == 0) hs.push_back(d);
  }
  for (index_t d = 1; d <= nq; ++d) {
    if (nq % d == 0) qs.push_back(d);
  }
  o.head_shards = hs[std::size_t(pick(rng, 0, index_t(hs.size()) - 1))];
  o.q_seq_shards = qs[std::size_t(pick(rng, 0, index_t(qs.size()) - 1))];
  o.downcast_smem_data = pick(rng, 0, 3) != 0;
  o.shrink_grid = pick(rng, 0, 3) != 0;
  return o;
}

// A mask kind chosen at random, erased, with whatever data it views kept alive.
AnyMask random_mask(std::mt19937& rng, index_t q_len, index_t kv_len, index_t heads) {
  const auto align = pick(rng, 0, 1) ? Alignment::top_left : Alignment::bottom_right;
  switch (pick(rng, 0, 9)) {
    case 0:
      return FullMask{};
    case 1:
      return CausalMask{align};
    case 2:
      return SlidingWindowMask{pick(rng, -1, kv_len / 2), pick(rng, -1, 8), align};
    case 3:
      return ChunkedCausalMask{pick(rng, 1, q_len), align};
    case 4:
      return PrefixLMMask{pick(rng, 0, kv_len), {}, align};
    case 5: {
      if (q_len != kv_len) return CausalMask{align};
      // Documents with a window inside each: a kind Splash has no class for.
      auto ids = std::make_shared<std::vector<std::int32_t>>();
      std::int32_t id = 1;
      while (index_t(ids->size()) < q_len) {
        const index_t len = pick(rng, 1, q_len / 2 + 1);
        const std::int32_t v = pick(rng, 0, 5) == 0 ? 0 : id++;
        for (index_t i = 0; i < len && index_t(ids->size()) < q_len; ++i) ids->push_back(v);
        if (v == 0) ++id;
      }
      auto layout = std::make_shared<DocumentLayout>(
          DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids->data(), Extents{1, q_len})));
      auto owner = std::make_shared<std::pair<decltype(ids), decltype(layout)>>(ids, layout);
      return AnyMask(document_mask(*layout, SlidingWindowMask{pick(rng, 0, 9), 0}), owner);
    }
    case 6: {
      if (q_len != kv_len || q_len < 4) return FullMask{};
      auto l = std::make_shared<MultiItemLayout>();
      std::vector<index_t> items;
      index_t used = pick(rng, 1, q_len / 3) + 1;  // query and its delimiter
      while (used < q_len) {
        const index_t len = std::min(pick(rng, 0, 9), q_len - used - 1);
        items.push_back(len);
        used += len + 1;
      }
      l->add_items(q_len - std::accumulate(items.begin(), items.end(), index_t{0}) - index_t(items.size()) - 1, items);
      return AnyMask(multi_item_mask(*l), l);
    }
    case 7: {
      const index_t k = pick(rng, 1, std::min<index_t>(kv_len, 6));
      auto idx = std::make_shared<std::vector<std::int32_t>>();
      for (index_t q = 0; q < q_len; ++q) {
        std::vector<std::int32_t> keys(static_cast<std::size_t>(kv_len));
        std::iota(keys.begin(), keys.end(), 0);
        std::shuffle(keys.begin(), keys.end(), rng);
        for (index_t j = 0; j < k; ++j) idx->push_back(j == 0 && pick(rng, 0, 4) == 0 ? -1 : keys[std::size_t(j)]);
      }
      auto layout = std::make_shared<TopKLayout>(
          TopKLayout::from_indices(TensorView<const std::int32_t>(idx->data(), Extents{1, q_len, k}), kv_len));
      return AnyMask(TopKMask{layout->view()}, layout);
    }
    case 8:
      // A union whose tiles the BlockMask may call partial though they are
      // full: Splash classifies from content, so must we.
      return AnyMask(CausalMask{align} | ~CausalMask{align});
    default: {
      // One mask per head, some heads sharing: exercises unique-mask grouping.
      auto masks = std::make_shared<std::vector<AnyMask>>();
      const std::array<AnyMask, 3> pool{CausalMask{}, SlidingWindowMask{pick(rng, 0, 16), 0, Alignment::top_left},
                                        FullMask{}};
      const index_t kinds = pick(rng, 1, 3);
      for (index_t h = 0; h < heads; ++h) masks->push_back(pool[std::size_t(pick(rng, 0, kinds - 1))]);
      return AnyMask(PerHeadMask<AnyMask>{*masks}, masks);
    }
  }
}

}  // namespace

TEST_CASE("Splash MaskInfo matches the _process_mask oracle for every mask kind") {
  std::mt19937 rng(20261122);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const BlockShape block{pick(rng, 1, 12), pick(rng, 1, 12)};
    const index_t q_len = block.q * pick(rng, 1, 8);
    index_t kv = block.kv * pick(rng, 1, 8);
    if (q_len % block.kv == 0 && pick(rng, 0, 2) != 0) kv = q_len;  // the kinds that need a square mask
    const index_t heads = pick(rng, 1, 6);
    const AnyMask mask = random_mask(rng, q_len, kv, heads);
    const SplashOptions o = random_options(rng, heads, q_len / block.q);
    const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(1, q_len, kv), heads, block);
    INFO("trial " << trial << " q_len " << q_len << " kv_len " << kv << " block (" << block.q << ", " << block.kv
                  << ") heads " << heads << " dkv " << o.is_dkv << " head_shards " << o.head_shards << " q_seq_shards "
                  << o.q_seq_shards << " shrink " << o.shrink_grid);
    auto allowed = [&](index_t h, index_t q, index_t k) { return mask.allowed({0, h, q_len, kv}, q, k); };
    bool shard_without_tiles = false;
    Oracle want;
    try {
      want = oracle(allowed, heads, q_len, kv, block, o);
    } catch (const std::runtime_error&) {
      shard_without_tiles = true;  // Splash asserts on it too
    }
    if (o.shrink_grid && shard_without_tiles) {
      CHECK_THROWS_WITH(Splash::mask_info(bm, heads, o), ContainsSubstring("has no non-empty tile"));
      continue;
    }
    compare(Splash::mask_info(bm, heads, o), want, o, block, false);
    ++checked;
  }
  CHECK(checked > 250);
}

TEST_CASE("Splash MaskInfo from a BlockMask without tile bits reads the predicate") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const BlockShape block{pick(rng, 1, 9), pick(rng, 1, 9)};
    const index_t q_len = block.q * pick(rng, 1, 6), kv_len = block.kv * pick(rng, 1, 6);
    const index_t heads = pick(rng, 1, 4);
    const AnyMask mask = random_mask(rng, q_len, kv_len, heads);
    BlockMaskOptions bo;
    bo.store_tile_bits = false;
    const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(1, q_len, kv_len), heads, block, bo);
    SplashOptions o = random_options(rng, heads, q_len / block.q);
    o.shrink_grid = false;
    auto allowed = [&](index_t h, index_t q, index_t k) { return mask.allowed({0, h, q_len, kv_len}, q, k); };
    INFO("trial " << trial);
    compare(Splash::mask_info(bm, heads, o), oracle(allowed, heads, q_len, kv_len, block, o), o, block, false);
  }
}

TEST_CASE("Splash computes its own kinds in the kernel: q_sequence and no stored tiles") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 80; ++trial) {
    const BlockShape block{pick(rng, 1, 8), pick(rng, 1, 8)};
    const index_t q_len = block.q * pick(rng, 2, 6), kv_len = block.kv * pick(rng, 2, 6);
    const index_t heads = pick(rng, 1, 4);
    const auto align = pick(rng, 0, 1) ? Alignment::top_left : Alignment::bottom_right;
    const index_t shift = align == Alignment::bottom_right ? kv_len - q_len : 0;
    SplashOptions o = random_options(rng, heads, q_len / block.q);
    o.shrink_grid = false;  // a causal shard may be empty when kv_len < q_len
    const int kind = int(pick(rng, 0, 2));
    AnyMask mask = CausalMask{align};
    backends::SplashMaskFunction want{backends::SplashMaskFunction::Kind::causal, shift, -1, -1, 0};
    if (kind == 1) {
      const index_t left = pick(rng, -1, 9), right = pick(rng, -1, 9);
      mask = SlidingWindowMask{left, right, align};
      want = {backends::SplashMaskFunction::Kind::local, shift, left, right, 0};
    } else if (kind == 2) {
      const index_t chunk = pick(rng, 1, 9);
      mask = ChunkedCausalMask{chunk, align};
      want = {backends::SplashMaskFunction::Kind::chunked_causal, 0, -1, -1, chunk};
    }
    INFO("trial " << trial << " kind " << kind);
    const SplashMaskInfo info = Splash::mask_info(mask, q_len, kv_len, heads, block, o);
    auto allowed = [&](index_t h, index_t q, index_t k) { return mask.allowed({0, h, q_len, kv_len}, q, k); };
    const bool in_kernel = kind != 2 || shift == 0;
    REQUIRE(info.mask_function.has_value() == in_kernel);
    if (in_kernel) CHECK(*info.mask_function == want);
    compare(info, oracle(allowed, heads, q_len, kv_len, block, o), o, block, in_kernel);
  }
}

TEST_CASE("Splash deduplicates the causal diagonal to one tile whatever the length") {
  for (index_t n : {4, 16, 64}) {
    SplashOptions o;
    o.mask_function = std::nullopt;
    const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, n * 8, n * 8), 1, {8, 8});
    const SplashMaskInfo info = Splash::mask_info(bm, 8, o);
    REQUIRE(info.partial_mask_blocks.has_value());
    CHECK(info.partial_mask_blocks->extent(0) == 1);
    CHECK(info.block_mask.values.shape() == Extents{1, n, n});
    // data_next of an empty cell points at the next row's first block: kv 0.
    CHECK(info.data_next.values(0, 0, n - 1) == 0);
  }
}

TEST_CASE("Splash::mask_info rejects what Splash cannot represent, naming the argument") {
  const BlockShape block{8, 8};
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 20, 16, 1, block),
                    ContainsSubstring("block shape (8, 8) must divide the mask shape (20, 16)"));
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 16, 12, 1, block), ContainsSubstring("(16, 12)"));
  SplashOptions o;
  o.head_shards = 3;
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 16, 16, 4, block, o),
                    ContainsSubstring("head_shards=3 must be positive and divide heads=4"));
  o = {};
  o.q_seq_shards = 4;
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 16, 16, 1, block, o),
                    ContainsSubstring("block_q=8 must divide the q_len of one of q_seq_shards=4 shards"));
  o.q_seq_shards = 3;
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 16, 16, 1, block, o),
                    ContainsSubstring("q_seq_shards=3 must be positive and divide q_len=16"));
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(2, 16, 16), 1, block);
  CHECK_THROWS_WITH(Splash::mask_info(bm, 1, {}, 2), ContainsSubstring("batch 2 outside the BlockMask's 2 sequences"));
  const std::vector<AnyMask> per_head{CausalMask{}, FullMask{}};
  const BlockMask two = build_block_mask(PerHeadMask<AnyMask>{per_head}, RaggedLengths::uniform(1, 16, 16), 2, block);
  CHECK_THROWS_WITH(Splash::mask_info(two, 4), ContainsSubstring("stores 2 heads but heads=4"));
  o = {};
  o.mask_function = backends::SplashMaskFunction{};
  CHECK_THROWS_WITH(Splash::mask_info(two, 2, o), ContainsSubstring("2 distinct head masks"));
  CHECK_THROWS_WITH(Splash::mask_info(CausalMask{}, 0, 16, 1, block), ContainsSubstring("must be positive"));
}

}  // namespace seqattn_test_masks_splash_test
