// The planning half of the CPU tiled engine: how the tiles of one problem are
// cut into tasks, once per AttentionPlan.
//
// Tasks are (sequence, head or head group, q-block, kv-split). When the mask
// does not depend on the head and all queries of a sequence fit in
// kBlockQ / group rows (decode), the query heads that share a K/V head are
// stacked as rows of one tile, so K and V stream from memory once per group;
// when all heads fit and each group fills whole vectors, every K/V head goes
// into one task (rows ordered by K/V group), so a BSHD cache is read a whole
// token row at a time. With fewer such units than 4x the workers, each
// unit's tile list is split into kv_splits chunks (flash-decoding) whose
// partial results are merged by SoftmaxState::merge before normalization.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/core/bits.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/longest_first.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::detail {

// One kv-block of one row of tiles: full (tile_id == kFull), partial with
// stored bits (tile_id >= 0) or partial to be masked by the predicate; and,
// in a call with segment ids, whether the kernel also compares segments
// (segment_tiles.hpp).
struct TileRef {
  static constexpr std::int32_t kFull = -1;
  static constexpr std::int32_t kPredicate = -2;
  std::int32_t kv_block = 0;
  std::int32_t tile_id = kFull;
  bool by_segments = false;
};

// Rows [row_begin, row_end) and keys [col_begin, col_end) of a tile.
struct TileSpan {
  std::int32_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
};
// Row bands start and end on multiples of this many rows (or at the tile's
// last row; the forward clips them to the unit's padded rows): a multiple of
// every kernel's row alignment (vectors of up to 16 fp32 lanes, AMX's 16-row
// tiles), so the kernels see whole aligned vectors of Qt and St from the
// band's first row. Their keys start on an even key (choose_row_bands) and
// end anywhere: the kernels take any key count.
inline constexpr index_t kRowSpanAlign = 16;

struct WorkUnit {
  index_t sequence = 0;
  index_t head0 = 0;        // first query head
  index_t group_heads = 1;  // query heads stacked per K/V head (1, or the GQA group)
  index_t kv_groups = 1;    // K/V heads whose groups are stacked one after another
  index_t kv_head = 0;      // the first K/V head it reads
  index_t q_block = 0;
  index_t q_begin = 0;  // sequence-local query range of this unit
  index_t q_end = 0;
  std::size_t tiles_begin = 0;  // into the flat TileRef list
  std::size_t tiles_end = 0;
  // Where the partial tiles start: [tiles_begin, partial_begin) are the full
  // ones; each part is in increasing kv-block order (BlockMask's rows).
  std::size_t partial_begin = 0;

  // Rows are ordered (K/V group, query, head within the group).
  index_t group_rows() const { return (q_end - q_begin) * group_heads; }
  index_t rows() const { return group_rows() * kv_groups; }
  index_t q_of(index_t r) const { return q_begin + r % group_rows() / group_heads; }
  index_t head_of(index_t r) const { return head0 + r / group_rows() * group_heads + r % group_heads; }
  index_t num_tiles() const { return static_cast<index_t>(tiles_end - tiles_begin); }
};

struct TiledWork {
  std::vector<WorkUnit> units;
  std::vector<TileRef> tiles;
  index_t splits = 1;          // KV chunks per unit
  std::vector<index_t> order;  // task ids (order_tasks); task = unit * splits + split
  index_t workers = 1;         // the plan's, for order_tasks
  bool stack_heads = false;
  // Partial tiles' bits transposed to one bit per row for each key (the
  // layout of the transposed score tile), so the kernel masks a vector of
  // rows with one mask load. Only when rows are one q-tile of one head.
  std::vector<std::uint8_t> column_bits;
  index_t column_tile_bytes = 0;
  // Beside column_bits, per distinct partial tile: its row bands
  // (choose_row_bands), spans[span_begin[id], span_begin[id + 1]). The forward
  // computes only those parts of the tile, each band's rows against its
  // keys: a row the tile hides entirely would leave its running max, sum
  // and output as they are (alpha 1, P 0), and keys a band's rows all hide
  // add nothing to those rows. A document or window edge crossing a tile
  // hides a part of its rows or keys.
  std::vector<TileSpan> spans;
  std::vector<index_t> span_begin;
  index_t dvp = 0;  // the kernel's padded V head dim

  // The row bands of distinct partial tile `tile_id`, where the plan made them
  // (beside column_bits).
  std::span<const TileSpan> row_bands(std::int32_t tile_id) const {
    const auto id = static_cast<std::size_t>(tile_id);
    return std::span<const TileSpan>(spans).subspan(static_cast<std::size_t>(span_begin[id]),
                                                    static_cast<std::size_t>(span_begin[id + 1] - span_begin[id]));
  }

  index_t num_tasks() const { return static_cast<index_t>(order.size()); }
  const WorkUnit& unit_of(index_t task) const { return units[static_cast<std::size_t>(task / splits)]; }
};

// Calls visit(TileRef) for every tile BlockMask row (b, h, row) lists: the
// full blocks first, then the partial ones with their stored tile id (or
// kPredicate when the BlockMask keeps no bits).
template <class Visit>
void for_each_listed_tile(const BlockMask& bm, index_t b, index_t h, index_t row, Visit&& visit) {
  for (const BlockRange r : bm.full_ranges(b, h, row)) {
    for (std::int32_t block = r.begin; block < r.end; ++block) visit(TileRef{block, TileRef::kFull});
  }
  const auto partial = bm.partial_blocks(b, h, row);
  const auto ids = bm.partial_tile_ids(b, h, row);
  const bool bits = bm.has_tile_bits();
  for (std::size_t i = 0; i < partial.size(); ++i) visit(TileRef{partial[i], bits ? ids[i] : TileRef::kPredicate});
}

// Stacks GQA heads (and K/V heads) into one task when that fits (see top).
template <class Kernel>
void choose_row_stacking(const AttentionShape& shape, const BlockMask& bm, index_t& group_heads, index_t& kv_groups) {
  constexpr index_t kBq = Kernel::kBlockQ;
  const bool stack = bm.heads() == 1 && shape.group() > 1 && shape.max_q_len() * shape.group() <= kBq;
  group_heads = stack ? shape.group() : 1;
  kv_groups = 1;
  // Needs each group's rows to fill whole vectors (no padding between groups).
  if (stack && shape.kv_heads > 1 && shape.max_q_len() * shape.heads <= kBq) {
    bool aligned = true;
    for (const index_t q_len : shape.lengths.q) {
      const index_t gr = q_len * shape.group();
      aligned = aligned && (gr == 0 || Kernel::padded_rows(gr) == gr);
    }
    if (aligned) kv_groups = shape.kv_heads;
  }
}

// One unit per (sequence, head group, q-block), with its tiles listed in
// BlockMask order: full ranges first, then the partial blocks.
template <class Kernel>
void collect_units(const AttentionShape& shape, const BlockMask& bm, TiledWork& w) {
  constexpr index_t kBq = Kernel::kBlockQ;
  index_t group_heads = 1, kv_groups = 1;
  choose_row_stacking<Kernel>(shape, bm, group_heads, kv_groups);
  w.stack_heads = group_heads > 1;
  for (index_t b = 0; b < shape.batch(); ++b) {
    const index_t q_len = shape.q_len(b);
    if (q_len == 0) continue;
    for (index_t h0 = 0; h0 < shape.heads; h0 += group_heads * kv_groups) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        WorkUnit u{b,
                   h0,
                   group_heads,
                   kv_groups,
                   h0 / shape.group(),
                   qb,
                   qb * kBq,
                   std::min(q_len, (qb + 1) * kBq),
                   w.tiles.size(),
                   0};
        for_each_listed_tile(bm, b, h0, qb, [&](TileRef t) { w.tiles.push_back(t); });
        u.tiles_end = w.tiles.size();
        u.partial_begin = u.tiles_begin + static_cast<std::size_t>(bm.num_full_blocks(b, h0, qb));
        w.units.push_back(u);
      }
    }
  }
}

// Enough tasks to keep every worker busy: split units over KV chunks when
// there are fewer than 4 per worker (decode), never below 2 tiles a chunk.
inline index_t choose_kv_splits(const std::vector<WorkUnit>& units, index_t requested, int workers) {
  if (requested > 0) return requested;
  const auto n_units = static_cast<index_t>(units.size());
  // plan_attention bounds workers by limits::kMaxThreads; 64-bit here as well,
  // so that 4 tasks per worker cannot wrap for any int.
  const index_t wanted_tasks = 4 * index_t{workers};
  if (workers <= 1 || n_units == 0 || n_units >= wanted_tasks) return 1;
  index_t max_tiles = 0;
  for (const auto& u : units) max_tiles = std::max(max_tiles, u.num_tiles());
  return std::clamp<index_t>((wanted_tasks + n_units - 1) / n_units, 1, std::max<index_t>(1, max_tiles / 2));
}

// The tasks of one (sequence, K/V head) together, in the units' order, and
// longest first among them: concurrent workers read the same K and V rows,
// which the first task brought into the last-level cache. Longest first over
// all tasks ran every head's longest task side by side, each streaming its
// own head's K and V (fp32 causal 4k, 8 heads: 32 MiB of K/V against a 32
// MiB L3 on Zen 5; 91-93 ms per call, 87-88 ms in bands). The forward also
// copies a band's K/V once before its tasks where that pays (packed_kv.hpp).
// (A profile of bench/attention.cpp had put "staging copies" at 13 % then
// 9 %: those memmove samples were the benchmark's own memcpy-bandwidth
// measurement, as a DWARF call graph showed on 2026-11-27.) A band ends with
// its short tasks, but its longest task starts only when the band does: bands are used where
// each band keeps every worker busy for at least its longest task, else (many
// workers, few or short tasks per band) longest first over all tasks.
inline std::vector<index_t> order_tasks(const std::vector<WorkUnit>& units, index_t splits, index_t workers) {
  const index_t n_tasks = checked_mul(static_cast<index_t>(units.size()), splits, "plan_attention: tasks");
  std::vector<std::size_t> band(units.size());
  for (std::size_t i = 1; i < units.size(); ++i) {
    const bool same = units[i].sequence == units[i - 1].sequence && units[i].kv_head == units[i - 1].kv_head;
    band[i] = band[i - 1] + (same ? 0 : 1);
  }
  const std::size_t bands = units.empty() ? 0 : band.back() + 1;
  std::vector<index_t> cost(static_cast<std::size_t>(n_tasks)), band_work(bands), band_longest(bands);
  for (index_t t = 0; t < n_tasks; ++t) {
    const auto& u = units[static_cast<std::size_t>(t / splits)];
    const index_t s = t % splits, n = u.num_tiles();
    const index_t c = (n * (s + 1) / splits - n * s / splits) * u.rows();
    const std::size_t b = band[static_cast<std::size_t>(t / splits)];
    cost[static_cast<std::size_t>(t)] = c;
    band_work[b] += c;
    band_longest[b] = std::max(band_longest[b], c);
  }
  std::vector<index_t> order = longest_first(cost);
  bool banded = true;
  for (std::size_t b = 0; b < bands; ++b) banded = banded && band_work[b] >= workers * band_longest[b];
  if (banded) {
    std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
      return band[static_cast<std::size_t>(a / splits)] < band[static_cast<std::size_t>(b / splits)];
    });
  }
  return order;
}

// The estimated cost of a row band of `groups` groups of kRowSpanAlign rows
// against `keys` keys, in score pairs: rows x (keys + 2) (the 2: P.V's reload
// of the rows' output), a third more for a band of one group (one vector of
// rows: on AVX-512, 6 QK^T accumulators, too few to cover the FMA latency), and
// 256 for the calls (scores, softmax, P.V). Estimates, not tuned (other
// weights were not measured). With the bands they chose (the tree at
// a854dd4), bench/attention.cpp's 16 documents in 8k ran in 36.0 ms (median;
// 35.4-37.6) against 37.1 (36.1-40.0) at a75a269 (one span per tile), its
// window of 1k over 16k in 178 (175-184) against 191.5 (182-212) ms: fp32, 2
// threads, six alternating rounds, the Zen 5 VM of packed_kv.hpp, 2026-11-27.
inline double row_band_cost(index_t groups, index_t keys) {
  const auto pairs = static_cast<double>(groups * kRowSpanAlign * (keys + 2));
  return pairs * (groups == 1 ? 4.0 / 3.0 : 1.0) + 256.0;
}

// The row bands of one partial tile, from the keys each group of kRowSpanAlign
// rows allows (groups[g]: rows [g, g + 1) * kRowSpanAlign, keys [col_begin,
// col_end), none where col_end <= col_begin): runs of consecutive groups, each
// band computing its rows against the hull of their keys, at the least
// row_band_cost (dynamic programming over the groups), appended to `out`. A
// band neither starts nor ends on a group that allows nothing. One span per
// tile (the rows that allow some key against the keys some row allows), as
// until a75a269, computed a diagonal tile's hidden triangle and, where a
// document ends inside a tile, both documents' rows against both documents'
// keys. With the bands, bench/attention.cpp's `computed` counter (score pairs
// computed over allowed ones, 128 x 64 tiles) reads 1.068 for its 16
// documents in 8k, 1.031 for its window of 1k over 16k and 1.008 for causal
// 4k. Key ranges start on an even key (one more key where a band's first
// allowed key is odd), so that the bf16 pair arithmetic reads V's pair words
// from the packed K/V band (BandKv) where they lie (PairDotTiles).
inline void choose_row_bands(std::span<const TileSpan> groups, index_t block_q, std::vector<TileSpan>& out) {
  const auto n = static_cast<index_t>(groups.size());
  const auto group = [&](index_t g) { return groups[static_cast<std::size_t>(g)]; };
  const auto allows = [&](index_t g) { return group(g).col_begin < group(g).col_end; };
  // best[i]: the least cost of groups [0, i); band[i]: its last band, where
  // group i - 1 allows some key (else that group is in no band).
  std::vector<double> best(static_cast<std::size_t>(n + 1), 0.0);
  std::vector<TileSpan> band(static_cast<std::size_t>(n + 1));
  for (index_t i = 1; i <= n; ++i) {
    const auto at = static_cast<std::size_t>(i);
    best[at] = best[at - 1];
    if (!allows(i - 1)) continue;
    best[at] = std::numeric_limits<double>::infinity();
    index_t lo = group(i - 1).col_begin, hi = group(i - 1).col_end;
    for (index_t j = i - 1; j >= 0; --j) {  // the band [j, i)
      if (!allows(j)) continue;
      lo = std::min<index_t>(lo, group(j).col_begin);
      hi = std::max<index_t>(hi, group(j).col_end);
      const double cost = best[static_cast<std::size_t>(j)] + row_band_cost(i - j, hi - lo / 2 * 2);
      if (cost < best[at]) {
        best[at] = cost;
        band[at] = {static_cast<std::int32_t>(j * kRowSpanAlign),
                    static_cast<std::int32_t>(std::min(block_q, i * kRowSpanAlign)),
                    static_cast<std::int32_t>(lo / 2 * 2), static_cast<std::int32_t>(hi)};
      }
    }
  }
  const std::size_t first = out.size();
  for (index_t i = n; i > 0;) {
    if (!allows(i - 1)) {
      --i;
      continue;
    }
    out.push_back(band[static_cast<std::size_t>(i)]);
    i = band[static_cast<std::size_t>(i)].row_begin / kRowSpanAlign;
  }
  std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
}

// Column-major copies of the distinct partial tiles' bits, and each tile's
// row bands (see TiledWork).
inline void transpose_tile_bits(const BlockMask& bm, index_t block_q, index_t block_kv, TiledWork& w) {
  const index_t distinct = bm.num_distinct_partial_tiles(), wpr = bm.words_per_row();
  const index_t tile_bytes = block_kv * (block_q / 8);
  w.column_tile_bytes = tile_bytes;
  w.column_bits.assign(
      static_cast<std::size_t>(checked_mul(distinct, tile_bytes, "plan_attention: transposed tile bits")), 0);
  w.spans.clear();
  w.span_begin.assign(1, 0);
  std::vector<TileSpan> groups(static_cast<std::size_t>((block_q + kRowSpanAlign - 1) / kRowSpanAlign));
  for (index_t id = 0; id < distinct; ++id) {
    const auto rows_bits = bm.tile_bits(static_cast<std::int32_t>(id));
    std::uint8_t* dst = w.column_bits.data() + id * tile_bytes;
    std::fill(groups.begin(), groups.end(), TileSpan{0, 0, static_cast<std::int32_t>(block_kv), 0});
    for (index_t r = 0; r < block_q; ++r) {
      TileSpan& group = groups[static_cast<std::size_t>(r / kRowSpanAlign)];
      for (index_t c = 0; c < block_kv; ++c) {
        if (test_bit(rows_bits.data() + r * wpr, c)) {
          dst[c * (block_q / 8) + r / 8] |= static_cast<std::uint8_t>(1u << (r % 8));
          group.col_begin = std::min(group.col_begin, static_cast<std::int32_t>(c));
          group.col_end = std::max(group.col_end, static_cast<std::int32_t>(c + 1));
        }
      }
    }
    choose_row_bands(groups, block_q, w.spans);
    w.span_begin.push_back(static_cast<index_t>(w.spans.size()));
  }
}

template <class Kernel>
TiledWork plan_tiled_work(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options, int workers) {
  constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  TiledWork w;
  w.dvp = Kernel::padded_dim(shape.dv);
  collect_units<Kernel>(shape, bm, w);
  w.splits = choose_kv_splits(w.units, options.kv_splits, workers);
  w.workers = std::max(1, workers);
  w.order = order_tasks(w.units, w.splits, w.workers);
  static_assert(kBq % kRowSpanAlign == 0);
  if (!w.stack_heads && bm.has_tile_bits() && kBq % 8 == 0 && bm.num_distinct_partial_tiles() > 0) {
    transpose_tile_bits(bm, kBq, kBkv, w);
  }
  return w;
}

}  // namespace seqattn::detail
