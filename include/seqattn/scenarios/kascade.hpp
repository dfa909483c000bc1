// Kascade sparse attention, with the paper's semantics (arXiv 2512.16391,
// microsoft/kascade `KascadeStrategy`; docs/semantics/multi-item-topk-kascade.md §C.1) —
// not the TPU fork's key-tile heuristics (C.2, C.3).
//
// Queries are cut into tiles of T = 32. An ANCHOR layer computes the exact
// softmax P, pools it per KV group and query tile over the keys strictly
// before the tile,
//     S[g, t, j] = sum_{h in g} sum_{q in tile t} P[h, q, j]      (j < first query position of tile t)
// and keeps the top-k keys (k = min(max(128, floor(10% Lk)), Lk) - T; ties lowest index). A REUSE layer maps
// each of its KV groups to an anchor group (head map) and attends, for query q of tile t, to
//     I(hm[g], t)  ∪  [tile_start(t), q]                          (selected keys ∪ causal part of its own tile)
// Because every selected key lies before the tile, the two parts never overlap: no key is counted twice
// (the fork's gather path double-counts the diagonal tile, C.3 path C / TV-C2).
//
// Execution: gather() copies, per query tile, its selected keys followed by the tile's own keys into a
// THD-packed K/V (each KV head holds its own group's keys in the same slots), and the tile's queries attend to
// that segment with a bottom-right causal mask. Layer 0 stays dense; later anchors use their own selection.
// The anchor's pooling needs the exact softmax of every causal pair, so an anchor costs about one dense pass on
// top of its own attention; the savings are in the reuse layers. It runs runtime-dispatched Highway kernels
// (scenarios/kernels.hpp; link seqattn::scenario_kernels).
//
// Not implemented: the reference's decode / short-input path (Lq <= T: per-query top-k over all keys, reuse
// layers attend only to the k selected keys; here such a block is one tile with its own causal part) and its
// optional rolling-prefill budget. Calibration: calibrate_head_map picks, per reuse group, the anchor group whose
// keys capture most of the reuse layer's pooled mass summed over tiles (the reference takes a min over tiles of a
// mass ratio); select_anchor_layers is the reference's DP over a given similarity matrix (TV-C6).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/structural.hpp"
#include "seqattn/scenarios/attend.hpp"
#include "seqattn/scenarios/kernels.hpp"
#include "seqattn/scenarios/reference.hpp"

namespace seqattn::scenarios::kascade {

struct Config {
  index_t tile = 32;  // queries per tile
  double top_percent = 10.0;
  index_t min_keys = 128;  // the budget never drops below this many keys (before subtracting the tile)
};

// C.1 budget: min(max(min_keys, floor(pct/100 * Lk)), Lk) - T for T > 1, never below 0 (the reference would
// call topk with k <= 0 for very short inputs, C.4).
inline index_t budget(index_t kv_len, const Config& c = {}) {
  const auto pct = static_cast<index_t>(std::floor(c.top_percent / 100.0 * static_cast<double>(kv_len)));
  index_t k = std::min(std::max(c.min_keys, pct), kv_len);
  if (c.tile > 1) k -= c.tile;
  return std::max<index_t>(k, 0);
}

// Where the query tiles sit: queries are the last q_len of kv_len positions
// (start = kv_len - q_len; 0 for prefill from scratch).
struct Tiling {
  index_t tile = 32;
  index_t q_len = 0;
  index_t kv_len = 0;

  index_t start() const { return kv_len - q_len; }
  index_t num_tiles() const { return (q_len + tile - 1) / tile; }
  index_t tile_of(index_t q) const { return q / tile; }
  index_t first_row(index_t t) const { return t * tile; }  // query row index
  index_t rows(index_t t) const { return std::min(tile, q_len - t * tile); }
  index_t first_position(index_t t) const { return start() + t * tile; }  // key position of its first query
};

// The keys an anchor chose: for KV group g and query tile t, count(t) token
// indices, ascending, all < first_position(t).
struct Selection {
  Tiling tiling;
  index_t groups = 0;
  index_t k = 0;                      // budget
  std::vector<std::int32_t> indices;  // [groups, tiles, k]; the first count(t) of each are used

  index_t count(index_t t) const { return std::min(k, tiling.first_position(t)); }
  std::span<const std::int32_t> keys(index_t g, index_t t) const {
    return std::span(indices).subspan(static_cast<std::size_t>((g * tiling.num_tiles() + t) * k),
                                      static_cast<std::size_t>(count(t)));
  }
};

namespace detail {

inline Tiling tiling_of(index_t q_len, index_t kv_len, index_t tile) {
  seqattn::detail::require(tile > 0, "kascade: tile must be positive, got ", tile);
  seqattn::detail::require(q_len <= kv_len, "kascade: q_len (", q_len, ") must not exceed kv_len (", kv_len, ")");
  return Tiling{tile, q_len, kv_len};
}

// Adds one query row's probabilities (over keys [0, n)) to the pooled row of its tile.
inline void pool_row(const Tiling& tl, index_t q, const float* p, index_t n, float* pooled_tile_row) {
  const index_t limit = std::min(n, tl.first_position(tl.tile_of(q)));
  for (index_t j = 0; j < limit; ++j) pooled_tile_row[j] += p[j];
}

}  // namespace detail

// S[g, t, j] from explicit probabilities probs [H, Lq, Lk] (H = groups * g).
inline Tensor<float> pooled_mass_from_probs(TensorView<const float> probs, index_t groups, index_t tile) {
  seqattn::detail::require(probs.rank() == 3 && groups > 0 && probs.extent(0) % groups == 0,
                           "kascade::pooled_mass_from_probs: probs must be [heads, q_len, kv_len] with heads a "
                           "multiple of groups (",
                           groups, "), got ", probs.shape());
  const Tiling tl = detail::tiling_of(probs.extent(1), probs.extent(2), tile);
  const index_t heads = probs.extent(0), lk = tl.kv_len, per = heads / groups;
  Tensor<float> pooled(seqattn::detail::make_extents({groups, tl.num_tiles(), lk}));
  std::vector<float> row(static_cast<std::size_t>(lk));
  for (index_t h = 0; h < heads; ++h) {
    for (index_t q = 0; q < tl.q_len; ++q) {
      for (index_t j = 0; j < lk; ++j) row[static_cast<std::size_t>(j)] = probs(h, q, j);
      detail::pool_row(tl, q, row.data(), lk, pooled.data() + ((h / per) * tl.num_tiles() + tl.tile_of(q)) * lk);
    }
  }
  return pooled;
}

// S[g, t, j] from q [Lq, H, D] and k [Lk, Hkv, D]: the causal softmax is
// computed one row at a time and never stored.
inline Tensor<float> pooled_mass(TensorView<const float> q, TensorView<const float> k, float scale, index_t tile) {
  seqattn::detail::require(
      q.rank() == 3 && k.rank() == 3 && q.extent(2) == k.extent(2) && k.extent(1) > 0 && q.extent(1) % k.extent(1) == 0,
      "kascade::pooled_mass: expected q [Lq, H, D] and k [Lk, Hkv, D] with H a multiple of "
      "Hkv; got q ",
      q.shape(), ", k ", k.shape());
  seqattn::detail::require(q.is_contiguous() && k.is_contiguous(), "kascade::pooled_mass: q and k must be contiguous");
  const Tiling tl = detail::tiling_of(q.extent(0), k.extent(0), tile);
  const index_t hq = q.extent(1), hkv = k.extent(1), d = q.extent(2), lk = tl.kv_len, per = hq / hkv;
  Tensor<float> pooled(seqattn::detail::make_extents({hkv, tl.num_tiles(), lk}));
  // K of each group laid out in zero-padded chunks of W keys, [Hkv][Lk / W][D][W],
  // for the Highway kernels (scores of one head against W keys per step, then
  // a vectorized exp; runtime-dispatched: scenarios/kernels.hpp). This is
  // dense work: the price of an anchor layer.
  const dispatch::ScenarioKernels kernels = dispatch::scenario_kernels();
  const index_t width = kernels.chunk_width;
  const index_t lp = (lk + width - 1) / width * width;
  std::vector<float> kt(static_cast<std::size_t>(hkv * d * lp), 0.0f);
  for (index_t j = 0; j < lk; ++j) {
    for (index_t g = 0; g < hkv; ++g) {
      float* chunk = kt.data() + g * d * lp + (j / width) * width * d + j % width;
      for (index_t c = 0; c < d; ++c) chunk[c * width] = k.data()[(j * hkv + g) * d + c];
    }
  }
  std::vector<float> p(static_cast<std::size_t>(lp)), qs(static_cast<std::size_t>(d));
  for (index_t i = 0; i < tl.q_len; ++i) {
    const index_t n = tl.start() + i + 1;                     // causal keys of row i
    const index_t before = tl.first_position(tl.tile_of(i));  // only these are pooled
    if (before == 0) continue;                                // nothing before the tile: the row adds nothing
    for (index_t h = 0; h < hq; ++h) {
      const index_t g = h / per;
      for (index_t c = 0; c < d; ++c) qs[static_cast<std::size_t>(c)] = q.data()[(i * hq + h) * d + c] * scale;
      kernels.pool_scores(qs.data(), d, kt.data() + g * d * lp, (n + width - 1) / width * width, p.data());
      kernels.pool_softmax(p.data(), n, before, pooled.data() + (g * tl.num_tiles() + tl.tile_of(i)) * lk);
    }
  }
  return pooled;
}

// Top-k of every pooled row over the keys before its tile (descending mass,
// ties lowest index), stored ascending. pooled [groups, tiles, Lk].
inline Selection select_from_pooled(TensorView<const float> pooled, index_t q_len, index_t tile, index_t k) {
  seqattn::detail::require(pooled.rank() == 3,
                           "kascade::select_from_pooled: pooled must be [groups, tiles, kv_len], got ", pooled.shape());
  seqattn::detail::require(k >= 0, "kascade::select_from_pooled: k must be non-negative, got ", k);
  Selection s{detail::tiling_of(q_len, pooled.extent(2), tile), pooled.extent(0), k, {}};
  seqattn::detail::require(pooled.extent(1) == s.tiling.num_tiles(), "kascade::select_from_pooled: pooled ",
                           pooled.shape(), " must have ", s.tiling.num_tiles(), " tiles for q_len ", q_len,
                           " and tile ", tile);
  const index_t tiles = s.tiling.num_tiles();
  s.indices.assign(static_cast<std::size_t>(s.groups * tiles * k), -1);
  std::vector<std::int32_t> cand;
  for (index_t g = 0; g < s.groups; ++g) {
    for (index_t t = 0; t < tiles; ++t) {
      const index_t n = s.tiling.first_position(t), c = s.count(t);
      cand.resize(static_cast<std::size_t>(n));
      for (index_t j = 0; j < n; ++j) cand[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
      if (c < n) {
        const auto better = [&](std::int32_t a, std::int32_t b) {
          const float sa = pooled(g, t, a), sb = pooled(g, t, b);
          return sa > sb || (sa == sb && a < b);
        };
        std::nth_element(cand.begin(), cand.begin() + c, cand.end(), better);
        cand.resize(static_cast<std::size_t>(c));
        std::sort(cand.begin(), cand.end());
      }
      std::copy(cand.begin(), cand.end(), s.indices.begin() + (g * tiles + t) * k);
    }
  }
  return s;
}

// Anchor layer: exact pooled attention mass, then top-k.
inline Selection select_anchor(TensorView<const float> q, TensorView<const float> k, float scale,
                               const Config& config = {}) {
  const Tensor<float> pooled = pooled_mass(q, k, scale, config.tile);
  return select_from_pooled(pooled.view(), q.extent(0), config.tile, budget(k.extent(0), config));
}

// For each reuse KV group g2, the anchor group whose selected keys capture
// most of this layer's pooled mass (first maximum wins). `reuse_pooled` is
// pooled_mass() of the reuse layer.
inline std::vector<index_t> calibrate_head_map(const Selection& anchor, TensorView<const float> reuse_pooled) {
  seqattn::detail::require(reuse_pooled.rank() == 3 && reuse_pooled.extent(1) == anchor.tiling.num_tiles() &&
                               reuse_pooled.extent(2) == anchor.tiling.kv_len,
                           "kascade::calibrate_head_map: reuse_pooled ", reuse_pooled.shape(),
                           " does not match the anchor's tiles (", anchor.tiling.num_tiles(), ") and kv_len (",
                           anchor.tiling.kv_len, ")");
  std::vector<index_t> map(static_cast<std::size_t>(reuse_pooled.extent(0)), 0);
  for (index_t g2 = 0; g2 < reuse_pooled.extent(0); ++g2) {
    double best = -1.0;
    for (index_t g1 = 0; g1 < anchor.groups; ++g1) {
      double mass = 0.0;
      for (index_t t = 0; t < anchor.tiling.num_tiles(); ++t) {
        for (std::int32_t j : anchor.keys(g1, t)) mass += reuse_pooled(g2, t, j);
      }
      if (mass > best) {
        best = mass;
        map[static_cast<std::size_t>(g2)] = g1;
      }
    }
  }
  return map;
}

// Sparse K/V of one layer, THD-packed: segment t holds query tile t's
// selected keys (from anchor group head_map[g], this layer's K/V of group g),
// then the tile's own keys.
struct Gathered {
  Tensor<float> k, v;  // [total, Hkv, D]
  std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;
  std::vector<std::int32_t> selected;  // per tile: how many of its keys are selected (the rest are its own)

  SegmentTable table() const { return {q_offsets, q_lens, kv_offsets, kv_lens}; }
};

inline void validate_head_map(std::span<const index_t> head_map, index_t kv_heads, index_t anchor_groups) {
  seqattn::detail::require(static_cast<index_t>(head_map.size()) == kv_heads, "kascade: head_map has ", head_map.size(),
                           " entries but the layer has ", kv_heads, " KV heads");
  for (std::size_t g = 0; g < head_map.size(); ++g) {
    seqattn::detail::require(head_map[g] >= 0 && head_map[g] < anchor_groups, "kascade: head_map[", g,
                             "] = ", head_map[g], " outside the anchor's groups [0, ", anchor_groups, ")");
  }
}

// Throws unless every used index of the selection is a key strictly before
// its tile (the only keys a tile may select), ascending and without repeats.
inline void validate_selection(const Selection& sel) {
  const index_t tiles = sel.tiling.num_tiles();
  seqattn::detail::require(
      sel.groups >= 0 && sel.k >= 0 && static_cast<index_t>(sel.indices.size()) == sel.groups * tiles * sel.k,
      "kascade: Selection.indices holds ", sel.indices.size(), " entries but [groups, tiles, k] = [", sel.groups, ", ",
      tiles, ", ", sel.k, "] needs ", sel.groups * tiles * sel.k);
  for (index_t g = 0; g < sel.groups; ++g) {
    for (index_t t = 0; t < tiles; ++t) {
      std::int32_t prev = -1;
      for (std::int32_t j : sel.keys(g, t)) {
        seqattn::detail::require(j > prev && j < sel.tiling.first_position(t), "kascade: Selection.indices [",
                                 sel.groups, ", ", tiles, ", ", sel.k, "] group ", g, " tile ", t, " holds key ", j,
                                 "; keys must ascend and lie in [0, ", sel.tiling.first_position(t),
                                 ") (before the tile)");
        prev = j;
      }
    }
  }
}

inline Gathered gather(const Selection& sel, std::span<const index_t> head_map, TensorView<const float> k,
                       TensorView<const float> v) {
  seqattn::detail::require(k.rank() == 3 && k.shape() == v.shape(), "kascade::gather: k ", k.shape(), " and v ",
                           v.shape(), " must be equal [Lk, Hkv, D]");
  seqattn::detail::require(k.extent(0) == sel.tiling.kv_len, "kascade::gather: k ", k.shape(),
                           " must have the selection's kv_len ", sel.tiling.kv_len);
  seqattn::detail::require(k.is_contiguous() && v.is_contiguous(), "kascade::gather: k and v must be contiguous");
  const index_t hkv = k.extent(1), d = k.extent(2), tiles = sel.tiling.num_tiles();
  validate_head_map(head_map, hkv, sel.groups);
  validate_selection(sel);
  Gathered out;
  index_t total = 0;
  for (index_t t = 0; t < tiles; ++t) {
    out.q_offsets.push_back(static_cast<std::int32_t>(sel.tiling.first_row(t)));
    out.q_lens.push_back(static_cast<std::int32_t>(sel.tiling.rows(t)));
    out.kv_offsets.push_back(static_cast<std::int32_t>(total));
    out.selected.push_back(static_cast<std::int32_t>(sel.count(t)));
    out.kv_lens.push_back(static_cast<std::int32_t>(sel.count(t) + sel.tiling.rows(t)));
    total += out.kv_lens.back();
  }
  out.k = Tensor<float>(seqattn::detail::make_extents({total, hkv, d}));
  out.v = Tensor<float>(seqattn::detail::make_extents({total, hkv, d}));
  const auto copy_row = [&](index_t dst, index_t src, index_t g) {
    const auto n = static_cast<std::size_t>(d);
    std::copy_n(k.data() + (src * hkv + g) * d, n, out.k.data() + (dst * hkv + g) * d);
    std::copy_n(v.data() + (src * hkv + g) * d, n, out.v.data() + (dst * hkv + g) * d);
  };
  for (index_t t = 0; t < tiles; ++t) {
    const index_t base = out.kv_offsets[static_cast<std::size_t>(t)];
    for (index_t g = 0; g < hkv; ++g) {
      index_t r = 0;
      for (std::int32_t j : sel.keys(head_map[static_cast<std::size_t>(g)], t)) copy_row(base + r++, j, g);
      for (index_t i = 0; i < sel.tiling.rows(t); ++i) copy_row(base + r++, sel.tiling.first_position(t) + i, g);
    }
  }
  return out;
}

// Attention of q [Lq, H, D] over gathered K/V: tile t's queries attend to
// segment t with a bottom-right causal mask (selected keys fully, own keys causally).
template <class Exec = execution::Serial>
AttentionOutput sparse_attention(TensorView<const float> q, const Gathered& kv, float scale, Exec&& exec = Exec{}) {
  return attend_thd(q, kv.k.view(), kv.v.view(), kv.table(), scale, CausalMask{Alignment::bottom_right},
                    std::forward<Exec>(exec));
}

// The key-set predicate of a reuse layer (oracle form): may q head h of row i
// see key j? heads_per_group = H / Hkv.
inline bool reuse_allowed(const Selection& sel, std::span<const index_t> head_map, index_t heads_per_group, index_t h,
                          index_t i, index_t j) {
  const index_t t = sel.tiling.tile_of(i);
  const index_t pos = sel.tiling.start() + i;
  if (j >= sel.tiling.first_position(t)) return j <= pos;
  const auto keys = sel.keys(head_map[static_cast<std::size_t>(h / heads_per_group)], t);
  return std::binary_search(keys.begin(), keys.end(), static_cast<std::int32_t>(j));
}

// The reference's anchor-layer DP (C.1 calibration; TV-C6): choose `pivots`
// anchor layers (layer 0 first) maximising the summed similarity of every
// layer to the anchor that covers it. sim [N, N], row l = similarity of the
// later layers to anchor l. Returns the pivots, ascending; `value` gets V[K][N].
inline std::vector<index_t> select_anchor_layers(TensorView<const float> sim, index_t pivots, double* value = nullptr) {
  seqattn::detail::require(sim.rank() == 2 && sim.extent(0) == sim.extent(1) && sim.extent(0) > 0,
                           "kascade::select_anchor_layers: sim must be a non-empty square [N, N], got ", sim.shape());
  const index_t n = sim.extent(0);
  seqattn::detail::require(pivots >= 1 && pivots <= n, "kascade::select_anchor_layers: pivots (", pivots,
                           ") must be in [1, ", n, "]");
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> val(static_cast<std::size_t>(pivots + 1),
                                       std::vector<double>(static_cast<std::size_t>(n + 1), ninf));
  std::vector<std::vector<index_t>> arg(val.size(), std::vector<index_t>(static_cast<std::size_t>(n + 1), -1));
  val[0][0] = sim(0, 0);
  for (index_t kk = 1; kk <= pivots; ++kk) {
    for (index_t i = 1; i <= n; ++i) {
      for (index_t l = 0; l < i; ++l) {
        const double prev = val[static_cast<std::size_t>(kk - 1)][static_cast<std::size_t>(l)];
        if (prev == ninf) continue;
        double v = prev + sim(l, l);
        for (index_t j = l + 1; j < i; ++j) v += sim(l, j);
        if (v > val[static_cast<std::size_t>(kk)][static_cast<std::size_t>(i)]) {
          val[static_cast<std::size_t>(kk)][static_cast<std::size_t>(i)] = v;
          arg[static_cast<std::size_t>(kk)][static_cast<std::size_t>(i)] = l;
        }
      }
    }
  }
  if (value) *value = val[static_cast<std::size_t>(pivots)][static_cast<std::size_t>(n)];
  std::vector<index_t> out;
  for (index_t kk = pivots, i = n; kk >= 1; --kk) {
    const index_t l = arg[static_cast<std::size_t>(kk)][static_cast<std::size_t>(i)];
    seqattn::detail::require(l >= 0, "kascade::select_anchor_layers: no valid placement of ", pivots, " pivots");
    out.push_back(l);
    i = l;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace seqattn::scenarios::kascade
