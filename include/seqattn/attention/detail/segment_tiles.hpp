// A call's segment ids (SegmentIds, attention/segment_ids.hpp) refining the
// tile classes of a plan made for the static mask alone, in O(tiles the plan
// lists + tokens) per call, and the masking step of the tiles it marks. The
// forward's and the backward's work lists are refined here; both kernels then
// run their usual loop over the refined lists.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/segment_ids.hpp"
#include "seqattn/attention/variants.hpp"

namespace seqattn::detail {

// The segment keys (SegmentIds::q_keys / kv_keys) the tokens of one tile
// hold: their range, and whether every token holds one and the same.
struct TileSegments {
  std::int32_t lo = std::numeric_limits<std::int32_t>::max();
  std::int32_t hi = std::numeric_limits<std::int32_t>::min();
  bool single = false;

  bool any() const { return lo <= hi; }
};

inline std::vector<TileSegments> tile_segments(std::span<const std::int32_t> keys, index_t block, std::int32_t none) {
  const auto len = static_cast<index_t>(keys.size());
  std::vector<TileSegments> tiles(static_cast<std::size_t>((len + block - 1) / block));
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    TileSegments& t = tiles[i];
    bool gap = false;
    const index_t end = std::min(len, static_cast<index_t>(i + 1) * block);
    for (index_t j = static_cast<index_t>(i) * block; j < end; ++j) {
      const std::int32_t k = keys[static_cast<std::size_t>(j)];
      if (k == none) {
        gap = true;
        continue;
      }
      t.lo = std::min(t.lo, k);
      t.hi = std::max(t.hi, k);
    }
    t.single = !gap && t.any() && t.lo == t.hi;
  }
  return tiles;
}

// What a call's ids make of a tile the plan lists.
enum class SegmentRefinement : std::uint8_t {
  drop,  // no query of the tile shares a segment with a key of it
  keep,  // one segment on both sides: the plan's class stands
  mask,  // the plan's class, and the kernel compares segments per element
};

// A range of tile indices, both ends included (empty when first > last).
struct TileWindow {
  std::int32_t first = 0, last = -1;
  bool contains(std::int32_t i) const { return i >= first && i <= last; }
};

class SegmentTiles {
 public:
  SegmentTiles(const SegmentIds& ids, index_t block_q, index_t block_kv) {
    const DocumentLayoutView layout = ids.layout().view();
    for (index_t b = 0; b < ids.batch(); ++b) {
      q_.push_back(tile_segments(ids.q_keys(b), block_q, SegmentIds::kNoQueryRun));
      kv_.push_back(tile_segments(ids.kv_keys(b), block_kv, SegmentIds::kNoKeyRun));
      // Where each key run's queries lie: the q run matched to it (-1: none).
      const auto q_runs = layout.q_row(b), kv_runs = layout.kv_row(b);
      std::vector<std::int32_t> query_run(kv_runs.size(), -1);
      for (std::size_t r = 0; r < q_runs.size(); ++r) {
        if (q_runs[r].match >= 0) query_run[static_cast<std::size_t>(q_runs[r].match)] = static_cast<std::int32_t>(r);
      }
      std::vector<TileWindow> kv_windows, q_windows;
      for (const TileSegments& t : q_.back()) {  // the kv-tiles holding the keys of the runs [lo, hi]
        kv_windows.push_back(
            t.any()
                ? TileWindow{static_cast<std::int32_t>(kv_runs[static_cast<std::size_t>(t.lo)].begin / block_kv),
                             static_cast<std::int32_t>((kv_runs[static_cast<std::size_t>(t.hi)].end - 1) / block_kv)}
                : TileWindow{});
      }
      for (const TileSegments& t : kv_.back()) {  // the q-tiles holding queries of the runs [lo, hi]
        TileWindow w{std::numeric_limits<std::int32_t>::max(), -1};
        for (std::int32_t r = t.any() ? t.lo : 0; t.any() && r <= t.hi; ++r) {
          const std::int32_t qr = query_run[static_cast<std::size_t>(r)];
          if (qr < 0) continue;
          w.first = std::min(w.first, static_cast<std::int32_t>(q_runs[static_cast<std::size_t>(qr)].begin / block_q));
          w.last =
              std::max(w.last, static_cast<std::int32_t>((q_runs[static_cast<std::size_t>(qr)].end - 1) / block_q));
        }
        q_windows.push_back(w);
      }
      kv_window_.push_back(std::move(kv_windows));
      q_window_.push_back(std::move(q_windows));
    }
  }

  // The kv-tiles a q-tile may keep (every other one is dropped), and the
  // q-tiles a kv-tile may keep: a cheap first test before refine.
  TileWindow kv_window(index_t b, index_t q_block) const {
    return kv_window_[static_cast<std::size_t>(b)][static_cast<std::size_t>(q_block)];
  }
  TileWindow q_window(index_t b, index_t kv_block) const {
    return q_window_[static_cast<std::size_t>(b)][static_cast<std::size_t>(kv_block)];
  }

  SegmentRefinement refine(index_t b, index_t q_block, index_t kv_block) const {
    const TileSegments& q = q_[static_cast<std::size_t>(b)][static_cast<std::size_t>(q_block)];
    const TileSegments& kv = kv_[static_cast<std::size_t>(b)][static_cast<std::size_t>(kv_block)];
    if (!q.any() || !kv.any() || q.hi < kv.lo || kv.hi < q.lo) return SegmentRefinement::drop;
    if (q.single && kv.single && q.lo == kv.lo) return SegmentRefinement::keep;
    return SegmentRefinement::mask;
  }

 private:
  std::vector<std::vector<TileSegments>> q_, kv_;  // per sequence, per tile
  std::vector<std::vector<TileWindow>> kv_window_, q_window_;
};

// Appends to `out` the refs of `run` (ordered by the tile index `index_of`
// reads from a ref) inside `window` that `refine_of` keeps, marked where the
// kernel compares segments. Binary search to the window: a call costs the
// tiles it keeps, not the plan's (a static causal plan lists every tile below
// the diagonal; a document's tiles are a few of them).
template <class Ref, class IndexOf, class RefineOf>
void keep_refined(std::span<const Ref> run, TileWindow window, const IndexOf& index_of, const RefineOf& refine_of,
                  std::vector<Ref>& out) {
  auto it = std::partition_point(run.begin(), run.end(), [&](const Ref& r) { return index_of(r) < window.first; });
  for (; it != run.end() && index_of(*it) <= window.last; ++it) {
    const SegmentRefinement how = refine_of(index_of(*it));
    if (how == SegmentRefinement::drop) continue;
    Ref ref = *it;
    ref.by_segments = how == SegmentRefinement::mask;
    out.push_back(ref);
  }
}

// The forward's work with each unit's tiles refined: the same units, tasks
// and splits (so the partials merge as planned), dropped tiles gone, the
// order recomputed from the tiles left. The plan's column bits are not
// copied: the caller keeps reading them from the plan's work.
inline TiledWork refine_tiled_work(const TiledWork& w, const SegmentTiles& st) {
  TiledWork r;
  r.units = w.units;
  r.splits = w.splits;
  r.workers = w.workers;
  r.stack_heads = w.stack_heads;
  r.column_tile_bytes = w.column_tile_bytes;
  r.dvp = w.dvp;
  r.tiles.reserve(w.tiles.size());
  const std::span<const TileRef> tiles(w.tiles);
  for (WorkUnit& u : r.units) {
    const TileWindow window = st.kv_window(u.sequence, u.q_block);
    const auto kv_block_of = [](const TileRef& t) { return t.kv_block; };
    const auto refine_of = [&](std::int32_t kv_block) { return st.refine(u.sequence, u.q_block, kv_block); };
    const std::size_t begin = r.tiles.size();
    keep_refined(tiles.subspan(u.tiles_begin, u.partial_begin - u.tiles_begin), window, kv_block_of, refine_of,
                 r.tiles);
    const std::size_t partial_begin = r.tiles.size();
    keep_refined(tiles.subspan(u.partial_begin, u.tiles_end - u.partial_begin), window, kv_block_of, refine_of,
                 r.tiles);
    u.tiles_begin = begin;
    u.partial_begin = partial_begin;
    u.tiles_end = r.tiles.size();
  }
  r.order = order_tasks(r.units, r.splits, r.workers);
  return r;
}

// -inf where the query's segment is not the key's, in either ScoreTile
// layout; for the tiles the refinement marked (SegmentRefinement::mask).
inline void mask_segments(const ScoreTile& t, const SegmentIds& ids) {
  constexpr float kHidden = -std::numeric_limits<float>::infinity();
  const std::span<const std::int32_t> q_keys = ids.q_keys(t.batch), kv_keys = ids.kv_keys(t.batch);
  for (index_t j = 0; j < t.cols; ++j) {
    float* col = t.scores + j * t.stride;
    if (t.keys_on_lanes) {  // lanes: keys, columns: queries
      const std::int32_t q_key = q_keys[static_cast<std::size_t>(t.row_q[j])];
      const std::int32_t* kv = kv_keys.data() + t.kv_begin;
      for (index_t r = 0; r < t.rows; ++r) col[r] = kv[r] == q_key ? col[r] : kHidden;
    } else {  // lanes: queries, columns: keys
      const std::int32_t kv_key = kv_keys[static_cast<std::size_t>(t.kv_begin + j)];
      for (index_t r = 0; r < t.rows; ++r)
        col[r] = q_keys[static_cast<std::size_t>(t.row_q[r])] == kv_key ? col[r] : kHidden;
    }
  }
}

}  // namespace seqattn::detail
