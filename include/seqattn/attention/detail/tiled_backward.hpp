// The backward pass of the CPU tiled engine (FlashAttention-2's algorithm:
// P recomputed from the saved LSE, D = rowsum(dO * O)), deterministic for any
// number of workers: every sum is taken in an order fixed by the plan, with no
// atomics.
//
//   rows pass   D and the sinks' gradient, per (sequence, head)
//   key pass    per (sequence, K/V head, range of kv-tiles), the tiles in
//               sweeps of kKeyTilesPerSweep: for each q-tile that sees a
//               tile of the sweep (from the BlockMask's transpose, for every
//               query head of the GQA group), loaded once for the tiles that
//               meet it together, and each such tile: S, dP, then
//               dV += P^T dO, dK += dS^T Q and dQ_c += dS K into copy c of
//               an fp32 dQ, c the range's index
//   dQ pass     dQ = scale * sum over c of dQ_c, in the order of c, per
//               (sequence, head, q-tile)
//
// Five tile matmuls per visited tile, as FlashAttention-2 with atomic dQ adds,
// and deterministic: the number of ranges (dQ copies) per K/V head depends on
// the shape only (dq_copies), each range runs in one task, and a copy's rows
// of one head are written by one range only.
//
// Every matmul is one of the kernel's two tile operations: Kernel::scores
// (S = Q Kt, dP = dO Vt, keys on the lanes) and Kernel::accumulate_pv
// (dV += P^T dO, dK += dS^T Q, dQ += dS K), the last with dS transposed
// (Kernel::transpose_rows). bf16 calls may run the same five products on
// AMX tiles (AmxKeyPass, which sums a q-tile's dQ products of a sweep in one
// pass over its dQ rows: end_q_tile) or bf16 pair dot products
// (PairKeyPass), as the backend's probe chose for its forward
// (Bf16DotTask::backward_tiles).
// Empty tiles are never visited; full tiles get no mask work.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/bf16_dot.hpp"
#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/segment_tiles.hpp"
#include "seqattn/attention/detail/tiled_forward.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/amx.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/longest_first.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::detail {

// ---- Planning ---------------------------------------------------------------

// One q-tile that sees a kv-tile, for one query head.
struct QTileRef {
  index_t head = 0;
  std::int32_t q_block = 0;
  std::int32_t tile_id = TileRef::kFull;  // as in TileRef
  bool by_segments = false;               // as in TileRef
};

struct KeyBlock {  // one kv-tile of one K/V head and the q-tiles that see it
  index_t kv_block = 0;
  std::size_t refs_begin = 0, refs_end = 0;  // into q_refs
  // Its refs in runs of increasing q-block (per query head: the full q-tiles,
  // then the partial ones): run i starts at ref_runs[runs_begin + i].
  std::size_t runs_begin = 0, runs_end = 0;  // into ref_runs
};

struct KeyTask {  // dK, dV of a range of kv-tiles of one K/V head; their dQ share goes to copy `copy`
  index_t sequence = 0;
  index_t kv_head = 0;
  index_t copy = 0;
  std::size_t blocks_begin = 0, blocks_end = 0;  // into key_blocks, in increasing kv-block order
};

struct QueryTask {  // dQ of one q-tile of one head: the sum of the copies
  index_t sequence = 0;
  index_t head = 0;
  index_t q_block = 0;
};

struct KeyGroup {  // the kv-tiles of one (sequence, K/V head), cut into key tasks
  index_t sequence = 0;
  index_t kv_head = 0;
  std::size_t blocks_begin = 0, blocks_end = 0;  // into key_blocks
};

struct TiledBackwardWork {
  std::vector<KeyGroup> key_groups;
  std::vector<KeyTask> key_tasks;
  std::vector<KeyBlock> key_blocks;
  std::vector<QTileRef> q_refs;
  std::vector<std::size_t> ref_runs;  // KeyBlock::runs_begin
  std::vector<QueryTask> query_tasks;
  std::vector<index_t> key_order;  // longest first
  index_t dkp = 0, dvp = 0;        // the kernel's padded head dims
  std::vector<index_t> row_base;   // per sequence: first row of D and of a dQ copy, rows ordered (head, query)
  index_t total_rows = 0;
  index_t dq_copies = 1;
  std::vector<index_t> q_block_base;  // per sequence: first (head, q-block) slot of the touched flags
  std::vector<index_t> q_blocks;      // per sequence
  index_t q_block_slots = 0;

  index_t q_block_slot(index_t b, index_t head, index_t q_block) const {
    return q_block_base[static_cast<std::size_t>(b)] + head * q_blocks[static_cast<std::size_t>(b)] + q_block;
  }
};

// Key tasks per (sequence, K/V head): kMinKeyTasks in all when there are
// fewer K/V heads than that, by cutting each head's kv-tiles into up to
// kMaxDqCopies ranges of about equal work. Every range adds its dQ share into
// its own copy, so the copies (memory: that many fp32 dQs) buy parallelism
// over the kv axis; the count depends on the shape alone, which keeps the
// result identical for any number of workers.
inline constexpr index_t kMinKeyTasks = 16;
inline constexpr index_t kMaxDqCopies = 4;

inline index_t dq_copies(const AttentionShape& shape, const BlockMask& bm) {
  index_t kv_blocks = 1;
  for (index_t b = 0; b < shape.batch(); ++b) kv_blocks = std::max(kv_blocks, bm.num_kv_blocks(b));
  const index_t groups = std::max<index_t>(1, shape.batch() * shape.kv_heads);
  return std::clamp<index_t>((kMinKeyTasks + groups - 1) / groups, 1, std::min(kMaxDqCopies, kv_blocks));
}

// Each key group cut into w.dq_copies ranges at equal shares of its visits
// (the q-tiles its key blocks list), longest first.
inline void cut_key_tasks(TiledBackwardWork& w) {
  w.key_tasks.clear();
  std::vector<index_t> cost;
  const auto visits = [&](std::size_t i) {
    return static_cast<index_t>(w.key_blocks[i].refs_end - w.key_blocks[i].refs_begin);
  };
  for (const KeyGroup& g : w.key_groups) {
    index_t total = 0;
    for (std::size_t i = g.blocks_begin; i < g.blocks_end; ++i) total += visits(i);
    std::size_t begin = g.blocks_begin;
    index_t done = 0;
    for (index_t c = 0; c < w.dq_copies && begin < g.blocks_end; ++c) {
      // Range c ends where the visits reach (c + 1) / copies of the total.
      const index_t goal = (total * (c + 1) + w.dq_copies - 1) / w.dq_copies;
      std::size_t end = begin;
      index_t range_cost = 0;
      while (end < g.blocks_end && (end == begin || done + range_cost < goal)) range_cost += visits(end++);
      if (c + 1 == w.dq_copies) {
        while (end < g.blocks_end) range_cost += visits(end++);
      }
      w.key_tasks.push_back({g.sequence, g.kv_head, c, begin, end});
      cost.push_back(range_cost);
      done += range_cost;
      begin = end;
    }
  }
  w.key_order = longest_first(cost);
}

// Key blocks from the transposed BlockMask: its row (b, h, kb) lists the
// q-blocks that see kv-block kb; partial tiles keep their ids (the
// transpose shares them), so the forward tile bits mask them. Then the key
// tasks (cut_key_tasks).
inline void plan_key_tasks(const AttentionShape& shape, const BlockMask& bm, TiledBackwardWork& w) {
  const BlockMask t = bm.transposed();
  for (index_t b = 0; b < shape.batch(); ++b) {
    for (index_t kvh = 0; kvh < shape.kv_heads; ++kvh) {
      KeyGroup group{b, kvh, w.key_blocks.size(), 0};
      for (index_t kb = 0; kb < bm.num_kv_blocks(b); ++kb) {
        KeyBlock block{kb, w.q_refs.size(), 0, w.ref_runs.size(), 0};
        for (index_t h = kvh * shape.group(); h < (kvh + 1) * shape.group(); ++h) {
          w.ref_runs.push_back(w.q_refs.size());
          w.ref_runs.push_back(w.q_refs.size() + static_cast<std::size_t>(t.num_full_blocks(b, h, kb)));
          for_each_listed_tile(t, b, h, kb, [&](TileRef r) { w.q_refs.push_back({h, r.kv_block, r.tile_id}); });
        }
        block.refs_end = w.q_refs.size();
        block.runs_end = w.ref_runs.size();
        w.key_blocks.push_back(block);  // also when no q-tile sees it: its dK and dV are zeros
      }
      group.blocks_end = w.key_blocks.size();
      w.key_groups.push_back(group);
    }
  }
  cut_key_tasks(w);
}

inline void plan_query_tasks(const AttentionShape& shape, const BlockMask& bm, TiledBackwardWork& w) {
  for (index_t b = 0; b < shape.batch(); ++b) {
    w.row_base.push_back(w.total_rows);
    w.total_rows += shape.heads * shape.q_len(b);
    w.q_block_base.push_back(w.q_block_slots);
    w.q_blocks.push_back(bm.num_q_blocks(b));
    w.q_block_slots += shape.heads * bm.num_q_blocks(b);
    for (index_t h = 0; h < shape.heads; ++h) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) w.query_tasks.push_back({b, h, qb});
    }
  }
}

template <class Kernel>
TiledBackwardWork plan_tiled_backward(const AttentionShape& shape, const BlockMask& bm) {
  TiledBackwardWork w;
  w.dkp = Kernel::padded_dim(shape.dk);
  w.dvp = Kernel::padded_dim(shape.dv);
  w.dq_copies = dq_copies(shape, bm);
  plan_key_tasks(shape, bm, w);
  plan_query_tasks(shape, bm, w);
  return w;
}

// The plan's backward work refined by a call's segment ids (segment_tiles.hpp):
// each key block's q-tiles without the dropped ones, marked where the kernel
// compares segments, and the key tasks cut again at the visits left (so the
// result stays independent of the worker count).
inline TiledBackwardWork refine_backward_work(const TiledBackwardWork& w, const SegmentTiles& st) {
  TiledBackwardWork r;  // every field of w but q_refs, ref_runs (refined below) and the key tasks (cut again)
  r.key_groups = w.key_groups;
  r.key_blocks = w.key_blocks;
  r.query_tasks = w.query_tasks;
  r.dkp = w.dkp;
  r.dvp = w.dvp;
  r.row_base = w.row_base;
  r.total_rows = w.total_rows;
  r.dq_copies = w.dq_copies;
  r.q_block_base = w.q_block_base;
  r.q_blocks = w.q_blocks;
  r.q_block_slots = w.q_block_slots;
  const std::span<const QTileRef> refs(w.q_refs);
  for (const KeyGroup& g : r.key_groups) {
    for (std::size_t i = g.blocks_begin; i < g.blocks_end; ++i) {
      KeyBlock& block = r.key_blocks[i];
      const TileWindow window = st.q_window(g.sequence, block.kv_block);
      const auto q_block_of = [](const QTileRef& t) { return t.q_block; };
      const auto refine_of = [&](std::int32_t q_block) { return st.refine(g.sequence, q_block, block.kv_block); };
      const std::size_t begin = r.q_refs.size(), runs_begin = r.ref_runs.size();
      for (std::size_t run = block.runs_begin; run < block.runs_end; ++run) {
        const std::size_t first = w.ref_runs[run],
                          last = run + 1 < block.runs_end ? w.ref_runs[run + 1] : block.refs_end;
        r.ref_runs.push_back(r.q_refs.size());
        keep_refined(refs.subspan(first, last - first), window, q_block_of, refine_of, r.q_refs);
      }
      block.refs_begin = begin;
      block.refs_end = r.q_refs.size();
      block.runs_begin = runs_begin;
      block.runs_end = r.ref_runs.size();
    }
  }
  cut_key_tasks(r);
  return r;
}

// ---- Running ----------------------------------------------------------------
//
// Key pass tiles put keys on the lanes: S[q][key] = scores(Kt, Q rows), so
// P and dS come out in the [query][key] layout accumulate_pv wants for
// dV += P^T dO and dK += dS^T Q, and Q and dO are read as rows (copied
// once per q-tile, VectorKeyPass) without a transpose per visit; K^T and
// V^T are built once per kv-tile. dQ += dS K takes dS^T, one tile
// transpose per visit.
//
// A key task sweeps kKeyTilesPerSweep of its kv-tiles at once over the
// q-tiles that see them (sweep_key_task): a q-tile's Q, dO and dQ rows are
// fetched and prepared once for the kv-tiles that visit it together (all of
// them for a full tile; a causal diagonal's q-tile is met twice, as full and
// as partial tile). One kv-tile at a time, every visit fetched them again,
// from DRAM at long sequences (a head's Q, dO and dQ copy are 24 MiB in fp32
// at 16k, one sweep per worker).

inline constexpr index_t kKeyTilesPerSweep = 8;

// The AMX operands of one kv-tile: B operands, bf16 pairs in 32-bit words.
struct AmxKeyOperands {
  AlignedFloats k_by_d, v_by_d, k_by_key;
  AmxKeyOperands(index_t kBkv, index_t dk, index_t dv)
      : k_by_d(dk / 2 * kBkv), v_by_d(dv / 2 * kBkv), k_by_key(kBkv / 2 * dk) {}
};

// The AMX operands of one q-tile and of a visit; A operands hold bf16 rows.
struct AmxVisitScratch {
  AlignedFloats q_rows, do_rows, p_t, ds_t, ds, do_by_q, q_by_q, dq;
  AmxVisitScratch(index_t kBq, index_t kBkv, index_t dk, index_t dv)
      : q_rows(kBq * dk / 2),
        do_rows(kBq * dv / 2),
        p_t(kBkv * kBq / 2),
        ds_t(kBkv * kBq / 2),
        ds(kKeyTilesPerSweep * kBq * kBkv / 2),
        do_by_q(kBq / 2 * dv),
        q_by_q(kBq / 2 * dk),
        dq(kBq * dk) {}
};

// One kv-tile of a sweep: its K and V operands (as the pass packs them) and
// its dK, dV accumulators.
template <class Kernel>
struct KeyTile {
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  AlignedFloats kt, vt, k_rows, v_rows, acc_k, acc_v;
  std::unique_ptr<AmxKeyOperands> amx;  // where the key pass runs on AMX
  RowsView k{};                         // the vector pass's K rows (in k_rows)
  bool k_finite = false;                // and whether they are all finite
  index_t kv0 = 0, cols = 0, cols_p = 0;

  // The buffers the pass on `tiles` uses: fp32 rows all four, pairs no V
  // rows, AMX its own operands.
  KeyTile(index_t dk, index_t dkp, index_t dv, index_t dvp, Bf16Tiles tiles)
      : kt(tiles == Bf16Tiles::amx ? 0 : dk * kBq),
        vt(tiles == Bf16Tiles::amx ? 0 : dv * kBq),
        k_rows(tiles == Bf16Tiles::amx ? 0 : kBkv * dkp),
        v_rows(tiles == Bf16Tiles::widen ? kBkv * dvp : 0),
        acc_k(kBkv * dkp),
        acc_v(kBkv * dvp),
        amx(tiles == Bf16Tiles::amx ? std::make_unique<AmxKeyOperands>(kBkv, dk, dv) : nullptr) {}
};

// A worker's scratch: the kv-tiles of a sweep (sweep_tiles: as many as the
// longest key task has, up to kKeyTilesPerSweep) and what a q-tile and a
// visit use. Each worker builds its own on its first task, so the zeroing
// and first touch of its pages run in parallel.
template <class Kernel>
struct BackwardScratch {
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  std::vector<KeyTile<Kernel>> tiles;
  AlignedFloats q_rows, do_rows, s, raw, dp, ds_t, lse, delta, ones;
  std::vector<index_t> row_q, row_head;
  std::unique_ptr<AmxVisitScratch> amx;  // where the key pass runs on AMX

  BackwardScratch(index_t dk, index_t dkp, index_t dv, index_t dvp, index_t sweep_tiles, Bf16Tiles arithmetic)
      : q_rows(arithmetic == Bf16Tiles::amx ? 0 : kBq * dkp),  // AMX packs its own (AmxVisitScratch)
        do_rows(arithmetic == Bf16Tiles::amx ? 0 : kBq * dvp),
        s(kBq * kBq),
        raw(kBq * kBq),
        dp(kBq * kBq),
        ds_t(kBq * kBq),
        lse(kBq),
        delta(kBq),
        ones(kBq),
        row_q(static_cast<std::size_t>(kBq)),
        row_head(static_cast<std::size_t>(kBq)) {
    std::fill_n(ones.get(), ones.size(), 1.0f);
    tiles.reserve(static_cast<std::size_t>(sweep_tiles));
    for (index_t i = 0; i < sweep_tiles; ++i) tiles.emplace_back(dk, dkp, dv, dvp, arithmetic);
    if (arithmetic == Bf16Tiles::amx) amx = std::make_unique<AmxVisitScratch>(kBq, kBkv, dk, dv);
  }
};

// The fp32 dQ copies: rows (copy, row of D) of dkp floats. A copy's q-tile is
// zeroed when its range first touches it (`touched`, one flag per copy and
// (sequence, head, q-block)), so untouched tiles cost neither a write nor a read.
struct DqCopies {
  AlignedFloats rows;
  std::vector<std::uint8_t> touched;
  index_t copy_rows = 0, dkp = 0, slots = 0;
  AlignedFloats sums;  // one row per worker: the dQ pass's sum of the copies

  DqCopies(const TiledBackwardWork& w, int workers)
      : rows(w.dq_copies * w.total_rows * w.dkp, AlignedFloats::Uninitialized{}),
        touched(static_cast<std::size_t>(w.dq_copies * w.q_block_slots), 0),
        copy_rows(w.total_rows),
        dkp(w.dkp),
        slots(w.q_block_slots),
        sums(workers * w.dkp) {}

  float* at(index_t copy, index_t row) const { return rows.get() + (copy * copy_rows + row) * dkp; }
  float* row_sum(int worker) const { return sums.get() + worker * dkp; }
  std::uint8_t& flag(index_t copy, index_t slot) { return touched[static_cast<std::size_t>(copy * slots + slot)]; }
};

// `n` rows of a [token, head, dim] tensor as fp32 rows of `padded` floats
// (the forward's stage_rows): in place when they already are (fp32, unit dim
// stride, no padding needed), else staged into `buf`. `row(i)` points at row i.
template <class Kernel, class P, class Row>
RowsView rows_of(Row row, index_t n, index_t token_stride, index_t dim_stride, index_t width, index_t padded,
                 float* buf) {
  return stage_rows<Kernel, P>(row, n, token_stride, dim_stride, width, padded, dim_stride == 1 && width == padded,
                               buf);
}

// Whether n elements `stride` apart are all finite: an exponent of all ones
// is inf or NaN. No early exit, so the loop over a row vectorizes.
template <class T, class Bits>
bool all_finite(const T* row, index_t n, index_t stride, Bits exponent) {
  unsigned bad = 0;
  for (index_t e = 0; e < n; ++e) {
    Bits bits = 0;
    std::memcpy(&bits, row + e * stride, sizeof(bits));
    bad |= (bits & exponent) == exponent ? 1u : 0u;
  }
  return bad == 0;
}
inline bool all_finite(const float* row, index_t n, index_t stride) {
  return all_finite(row, n, stride, std::uint32_t{0x7F800000u});
}
inline bool all_finite(const bfloat16* row, index_t n, index_t stride) {
  return all_finite(row, n, stride, std::uint16_t{0x7F80u});
}

// Whether n staged rows, `width` floats each, are all finite.
inline bool rows_finite(RowsView rows, index_t n, index_t width) {
  for (index_t i = 0; i < n; ++i) {
    if (!all_finite(rows.rows + i * rows.stride, width, 1)) return false;
  }
  return true;
}

// Kernel::transpose_rows of n rows of `rows` (evenly strided).
template <class Kernel>
void transpose_rows(RowsView rows, index_t n, index_t n_p, index_t width, float scale, float* dst) {
  const float* row[Kernel::kBlockQ] = {};
  for (index_t i = 0; i < n; ++i) row[i] = rows.rows + i * rows.stride;
  Kernel::transpose_rows(row, n, n_p, width, scale, dst);
}

// LSE (+inf where the row saw nothing: its P is 0) and D of q rows [q0, q0+n)
// of one head; rows past n get +inf and 0.
template <class T>
void load_row_stats(const BackwardProblem<T>& bp, const TiledBackwardWork& w, const std::vector<float>& delta,
                    index_t b, index_t h, index_t q0, index_t n, index_t n_p, float* lse, float* d) {
  const AttentionProblem<T>& p = bp.fwd;
  const SequenceGeometry& seq = p.sequence(b);
  const float inf = std::numeric_limits<float>::infinity();
  const index_t base = w.row_base[static_cast<std::size_t>(b)] + h * seq.q_len + q0;
  for (index_t r = 0; r < n_p; ++r) {
    const float x = r < n ? *p.lse_at(seq, q0 + r, h) : inf;
    lse[r] = x == -inf ? inf : x;
    d[r] = r < n ? delta[static_cast<std::size_t>(base + r)] : 0.0f;
  }
}

// dS *= d logit / d score, per element, for variants with a score hook.
// A zero dS (a masked key: NaN policy, attention/softmax_state.hpp) stays 0:
// the raw score of a hidden key may be NaN (a NaN K row), and so its
// derivative (softcap's 1 - tanh^2).
template <class V>
void apply_score_grad(const V& variant, const ScoreTile& t, float* ds, const float* raw) {
  if constexpr (HasScoreHook<V>) {
    for (index_t j = 0; j < t.cols; ++j) {
      for (index_t r = 0; r < t.rows; ++r) {
        float& d = ds[j * t.stride + r];
        if (d != 0.0f) d *= variant.score_grad(raw[j * t.stride + r], t.index(r, j));
      }
    }
  }
}

template <class T>
void store_rows(const SequenceTensor<T>& dst, index_t b, index_t token0, index_t head, const float* acc, index_t rows,
                index_t width, index_t padded, float scale) {
  for (index_t r = 0; r < rows; ++r) {
    T* out = dst.row(b, token0 + r, head);
    for (index_t e = 0; e < width; ++e) out[e * dst.strides.dim] = from_float<T>(acc[r * padded + e] * scale);
  }
}

template <class T, class V>
struct BackwardCall {
  const BackwardProblem<T>& bp;
  const TiledBackwardWork& w;
  const BlockMask& bm;
  const V& variant;
  const std::vector<float>& delta;
  DqCopies& dq;
  float scale = 1.0f;
  Bf16Tiles arithmetic = Bf16Tiles::widen;  // of the key pass (backward_tiles)
  bool finite = false;                      // every input finite (known for bf16 calls off the vector path)
};

// This copy's dQ rows of one visited q-tile, zeroed when first touched.
template <class T, class V>
float* dq_rows(const BackwardCall<T, V>& c, const KeyTask& task, index_t b, index_t h, index_t q_len, index_t q0,
               index_t n, std::int32_t q_block) {
  const TiledBackwardWork& w = c.w;
  float* dq = c.dq.at(task.copy, w.row_base[static_cast<std::size_t>(b)] + h * q_len + q0);
  std::uint8_t& touched = c.dq.flag(task.copy, w.q_block_slot(b, h, q_block));
  if (!touched) {
    std::fill_n(dq, n * w.dkp, 0.0f);
    touched = 1;
  }
  return dq;
}

// The scaled scores of a key-pass visit through the variant and the mask
// (the raw scores kept for a score hook's gradient). Key-major: the forward
// tile's row bits (per query, one bit per key) are this layout's column bits
// (little-endian words read as bytes).
template <class Kernel, class T, class V>
void transform_and_mask(const BackwardCall<T, V>& c, const ScoreTile& t, const QTileRef& ref, index_t q0,
                        BackwardScratch<Kernel>& sc) {
  if constexpr (HasScoreHook<V>) std::copy_n(t.scores, t.cols * Kernel::kBlockQ, sc.raw.get());  // cols: queries
  transform_scores<Kernel>(c.variant, t);
  const auto* bits =
      ref.tile_id >= 0 ? reinterpret_cast<const std::uint8_t*>(c.bm.tile_bits(ref.tile_id).data()) : nullptr;
  mask_tile<Kernel>(t, c.bm, ref.tile_id, bits, c.bm.words_per_row() * 8, q0);
  if (ref.by_segments) mask_segments(t, *c.bp.fwd.segment_ids);
}

// What every key pass shares: the task's geometry, the q-tile whose visits
// run now (its rows' query, head, LSE and D), a kv-tile's extent and
// accumulators, and the ScoreTile over S[q][key] of a visit. A pass adds
// load_tile (its K and V operands), load_q_tile (its Q and dO operands),
// visit (the five products) and, where it defers a product to the end of
// the q-tile's visits (AmxKeyPass: dQ), end_q_tile.
template <class Kernel, class T, class V>
struct KeyPassBase {
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  const BackwardCall<T, V>& c;
  const KeyTask& task;
  BackwardScratch<Kernel>& sc;
  const AttentionProblem<T>& p;
  const TiledBackwardWork& w;
  const SequenceGeometry& seq;
  index_t b = 0;
  index_t h = 0, q0 = 0, n = 0;  // the q-tile
  std::int32_t q_block = 0;

  KeyPassBase(const BackwardCall<T, V>& call, const KeyTask& key_task, BackwardScratch<Kernel>& scratch)
      : c(call),
        task(key_task),
        sc(scratch),
        p(call.bp.fwd),
        w(call.w),
        seq(call.bp.fwd.sequence(key_task.sequence)),
        b(key_task.sequence) {}

  void start_tile(const KeyBlock& block, KeyTile<Kernel>& tile) const {
    tile.kv0 = block.kv_block * kBkv;
    tile.cols = std::min(kBkv, seq.kv_len - tile.kv0);
    tile.cols_p = Kernel::padded_rows(tile.cols);
    std::fill_n(tile.acc_k.get(), tile.acc_k.size(), 0.0f);  // all rows: AMX adds whole 16-row blocks
    std::fill_n(tile.acc_v.get(), tile.acc_v.size(), 0.0f);
  }

  void start_q_tile(index_t head, std::int32_t block) {
    h = head;
    q_block = block;
    q0 = index_t{block} * kBq;
    n = std::min(kBq, seq.q_len - q0);
    for (index_t r = 0; r < n; ++r) {
      sc.row_q[static_cast<std::size_t>(r)] = q0 + r;
      sc.row_head[static_cast<std::size_t>(r)] = h;
    }
    load_row_stats(c.bp, w, c.delta, b, h, q0, n, n, sc.lse.get(), sc.delta.get());
  }

  ScoreTile score_tile(const KeyTile<Kernel>& tile) const {
    return ScoreTile{sc.s.get(),         kBq, tile.cols, tile.cols_p, n,          sc.row_q.data(),
                     sc.row_head.data(), b,   tile.kv0,  seq.q_len,   seq.kv_len, true};
  }

  // This copy's dQ rows of the q-tile (dq_rows).
  float* dq() const { return dq_rows(c, task, b, h, seq.q_len, q0, n, q_block); }

  // After a q-tile's visits (a pass that defers a product to it says so).
  void end_q_tile() {}

  // dK (scaled: the products took unscaled Q and K) and dV of the kv-tile.
  void store(const KeyTile<Kernel>& tile) const {
    store_rows(c.bp.dk, b, tile.kv0, task.kv_head, tile.acc_k.get(), tile.cols, p.dk, w.dkp, c.scale);
    store_rows(c.bp.dv, b, tile.kv0, task.kv_head, tile.acc_v.get(), tile.cols, p.dv, w.dvp, 1.0f);
  }
};

// ---- The bf16 key pass on AMX tiles (backends/amx.hpp) ---------------------------
//
// The same five products with bf16 operands and fp32 accumulation, where the
// backend puts the bf16 backward on AMX (Bf16DotTask::backward_tiles), dk
// and dv are multiples of 32, rows are contiguous along the head dim, and
// every input is finite (checked once per call: a hidden non-finite value
// would meet a zero weight inside a tile product, which AMX does not skip).
// P and dS are rounded to bf16 (nearest even) before the products that take
// them, as FlashAttention does on tensor cores.
//   S  = Q K^T     A: Q rows               B: K as pairs along d     [d/2][key]
//   dP = dO V^T    A: dO rows              B: V as pairs along d     [e/2][key]
//   dV += P^T dO   A: P^T [key][query]     B: dO as pairs along q    [q/2][e]
//   dK += dS^T Q   A: dS^T [key][query]    B: Q as pairs along q     [q/2][d]
//   dQ += dS K     A: dS [query][key]      B: K as pairs along keys  [key/2][d]
// K and V operands are packed once per kv-tile, Q and dO once per q-tile of
// a sweep, P and dS once per visit.
namespace amx_pack {

inline std::uint16_t bits(const bfloat16* p) {
  std::uint16_t b;
  std::memcpy(&b, p, sizeof(b));
  return b;
}
inline index_t up(index_t n, index_t m) { return (n + m - 1) / m * m; }

// out[r * d + e] = R_r[e]; rows [n, n_pad) zero.
template <class Row>
void rows(const Row& row, index_t n, index_t n_pad, index_t d, std::uint16_t* out) {
  for (index_t r = 0; r < n; ++r) std::memcpy(out + r * d, row(r), static_cast<std::size_t>(d) * sizeof(std::uint16_t));
  std::fill(out + n * d, out + n_pad * d, std::uint16_t{0});
}

}  // namespace amx_pack

template <class Kernel, class V>
struct AmxKeyPass : KeyPassBase<Kernel, bfloat16, V> {
  using Base = KeyPassBase<Kernel, bfloat16, V>;
  using Base::Base;
  using Base::c, Base::task, Base::sc, Base::p, Base::seq, Base::b, Base::h, Base::q0, Base::n;
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  static constexpr std::size_t kF = sizeof(float), kH = sizeof(std::uint16_t);

  using Pairs = typename Bf16DotTask<Kernel>::PairKernel;
  // The key task's tiles, loaded at its first product and released when the
  // pass (key_task's sweep) ends.
  mutable amx::TileScope scope;
  // The q-tile's dQ products, one per visit (its dS in its own block of
  // AmxVisitScratch::ds, the kv-tile's K pairs), summed by end_q_tile with
  // the dQ rows loaded and stored once: each visit's product reduces over 64
  // keys only, and loading and storing the 128 x dk fp32 rows around it took
  // as many tile loads and stores as the product's own operands. The dS
  // blocks (128 KiB a worker, 16 before) are read back from L2 rather than
  // L1; measured as a whole, the backward ran a few percent faster (2-vCPU
  // Xeon VM of the README, 2026-11-28, bf16 causal 4k, 2 threads, 40 paired
  // alternations: minimum 120.4 -> 116.4 ms, first quartile 167 -> 157 ms).
  amx::Term dq_terms[kKeyTilesPerSweep];
  int dq_count = 0;
  static std::uint32_t* pairs(const AlignedFloats& a) { return reinterpret_cast<std::uint32_t*>(a.get()); }
  static std::uint16_t* halves(const AlignedFloats& a) { return reinterpret_cast<std::uint16_t*>(a.get()); }
  // out[jj][e] = (R_2jj[e], R_2jj+1[e]) for jj < n_pad / 2 (Pairs::pack_v), pair rows past the n rows' zero.
  template <class Row>
  static void pairs_along_rows(const Row& row, index_t n, index_t n_pad, index_t d, const AlignedFloats& out) {
    Pairs::pack_v(row, 1, n, d, d, out.get());
    std::fill(out.get() + (n + 1) / 2 * d, out.get() + n_pad / 2 * d, 0.0f);
  }

  void load_tile(KeyTile<Kernel>& tile) const {
    const auto k_row = [&](index_t j) { return p.k_row(seq, tile.kv0 + j, task.kv_head); };
    const auto v_row = [&](index_t j) { return p.v_row(seq, tile.kv0 + j, task.kv_head); };
    Pairs::pairs_along_d(k_row, tile.cols, amx_pack::up(tile.cols, 16), p.dk, pairs(tile.amx->k_by_d), kBkv);
    Pairs::pairs_along_d(v_row, tile.cols, amx_pack::up(tile.cols, 16), p.dv, pairs(tile.amx->v_by_d), kBkv);
    pairs_along_rows(k_row, tile.cols, amx_pack::up(tile.cols, 32), p.dk, tile.amx->k_by_key);
  }

  void load_q_tile() const {
    const AmxVisitScratch& ax = *sc.amx;
    const auto q_row = [&](index_t r) { return p.q_row(seq, q0 + r, h); };
    const auto do_row = [&](index_t r) { return c.bp.dout.row(b, q0 + r, h); };
    amx_pack::rows(q_row, n, amx_pack::up(n, 16), p.dk, halves(ax.q_rows));
    amx_pack::rows(do_row, n, amx_pack::up(n, 16), p.dv, halves(ax.do_rows));
    pairs_along_rows(do_row, n, amx_pack::up(n, 32), p.dv, ax.do_by_q);
    pairs_along_rows(q_row, n, amx_pack::up(n, 32), p.dk, ax.q_by_q);
  }

  void visit(const QTileRef& ref, KeyTile<Kernel>& tile) {
    using amx_pack::up;
    const AmxVisitScratch& ax = *sc.amx;
    const AmxKeyOperands& kv = *tile.amx;
    const index_t dk = p.dk, dv = p.dv, cols = tile.cols, cols16 = up(cols, 16), cols32 = up(cols, 32);
    const index_t n16 = up(n, 16), n32 = up(n, 32);
    const ScoreTile t = this->score_tile(tile);
    amx::matmul(halves(ax.q_rows), dk * kH, n16, pairs(kv.k_by_d), kBkv * kF, cols16, dk / 32, t.scores, kBq * kF,
                false, &scope);  // S[q][key]
    for (index_t r = 0; r < n; ++r) {
      for (index_t j = 0; j < tile.cols_p; ++j) t.scores[r * kBq + j] *= c.scale;
    }
    transform_and_mask(c, t, ref, q0, sc);
    amx::matmul(halves(ax.do_rows), dv * kH, n16, pairs(kv.v_by_d), kBkv * kF, cols16, dv / 32, sc.dp.get(), kBq * kF,
                false, &scope);  // dP
    Kernel::softmax_backward_columns(t.scores, sc.dp.get(), n, tile.cols_p, sc.lse.get(), sc.delta.get());
    apply_score_grad(c.variant, t, sc.dp.get(), sc.raw.get());
    amx::bf16_rows(t.scores, 1, kBq, cols, n, n32, cols16, halves(ax.p_t));  // P^T [key][query]
    amx::bf16_rows(sc.dp.get(), 1, kBq, cols, n, n32, cols16, halves(ax.ds_t));
    amx::matmul(halves(ax.p_t), n32 * kH, cols16, pairs(ax.do_by_q), dv * kF, dv, n32 / 32, tile.acc_v.get(), dv * kF,
                true, &scope);
    amx::matmul(halves(ax.ds_t), n32 * kH, cols16, pairs(ax.q_by_q), dk * kF, dk, n32 / 32, tile.acc_k.get(), dk * kF,
                true, &scope);
    assert(dq_count < kKeyTilesPerSweep);
    std::uint16_t* ds = halves(ax.ds) + dq_count * kBq * kBkv;
    amx::bf16_rows(sc.dp.get(), kBq, 1, n, cols, cols32, n16, ds);  // dS [query][key]
    dq_terms[dq_count++] = {ds, static_cast<std::size_t>(cols32) * kH, pairs(kv.k_by_key), dk * kF, cols32 / 32};
  }

  // dQ += the sum of the q-tile's visits' dS K, in the order of the visits.
  void end_q_tile() {
    if (dq_count == 0) return;
    const index_t dk = p.dk, n16 = amx_pack::up(n, 16);
    float* dq = this->dq();
    // Whole 16-row blocks only: rows past n belong to other tasks' tiles.
    float* target = n == n16 ? dq : sc.amx->dq.get();
    if (target != dq) {
      std::copy_n(dq, n * dk, target);
      std::fill(target + n * dk, target + n16 * dk, 0.0f);
    }
    amx::matmul_sum(dq_terms, dq_count, n16, dk, target, dk * kF, true, &scope);
    if (target != dq) std::copy_n(target, n * dk, dq);
    dq_count = 0;
  }
};

// ---- The bf16 key pass on pair dot products (Bf16DotTask::PairKernel) -------
//
// The five products on bf16 pairs with fp32 accumulation, where the backend
// chooses its pair arithmetic for the bf16 backward (backward_tiles): the
// vector key pass's layouts, with every reduction axis in pairs. P and dS are
// rounded to bf16 (nearest even) before the products that take them, as on
// AMX; the scores and dP are fp32 sums of exact products.
//   S  = Q K^T    PairKernel::scores: Kt2 [d/2][key] pairs, Q rows in place
//   dP = dO V^T   the same with Vt2 [e/2][key] and the dO rows
//   dV += P^T dO  PairKernel::accumulate_pv: P packed in place into [q/2][key]
//                 pairs, dO rows paired along q [q/2][e]
//   dK += dS^T Q  dS packed the same way, Q rows paired along q
//   dQ += dS K    dS^T (transposed, then packed into [key/2][q] pairs), K
//                 rows paired along keys [key/2][d]
// Kt2, Vt2 and the K pairs are packed once per kv-tile, the Q and dO pairs
// once per q-tile of a sweep, P and dS once per visit. Conditions
// (backward_arithmetic): rows contiguous along the head dim (Q and dO are
// read in place as pairs). NaN policy as the vector path's: the three
// accumulations skip a zero weight's non-finite value (the select blocks of
// PairKernel::accumulate_pv), which a call whose inputs are all finite never
// needs (accumulate_pv_unguarded: no scans); the same sums either way.

template <bool kHw, class Kernel, class V>
struct PairKeyPass : KeyPassBase<Kernel, bfloat16, V> {
  using Base = KeyPassBase<Kernel, bfloat16, V>;
  using Base::Base;
  using Base::c, Base::task, Base::sc, Base::p, Base::w, Base::seq, Base::b, Base::h, Base::q0, Base::n;
  using Pairs = typename Bf16DotTask<Kernel>::PairKernel;
  static constexpr index_t kBq = Kernel::kBlockQ;
  const std::uint16_t* q_rows[kBq] = {};  // the q-tile's rows, read in place
  const std::uint16_t* do_rows[kBq] = {};

  void load_tile(KeyTile<Kernel>& tile) const {
    const auto k_row = [&](index_t j) { return p.k_row(seq, tile.kv0 + j, task.kv_head); };
    const auto v_row = [&](index_t j) { return p.v_row(seq, tile.kv0 + j, task.kv_head); };
    Pairs::pairs_along_d(k_row, tile.cols, tile.cols_p, p.dk, reinterpret_cast<std::uint32_t*>(tile.kt.get()), kBq);
    Pairs::pairs_along_d(v_row, tile.cols, tile.cols_p, p.dv, reinterpret_cast<std::uint32_t*>(tile.vt.get()), kBq);
    Pairs::pack_v(k_row, 1, tile.cols, p.dk, w.dkp, tile.k_rows.get());  // K pairs along keys
  }

  void load_q_tile() {
    const auto q_row = [&](index_t r) { return p.q_row(seq, q0 + r, h); };
    const auto do_row = [&](index_t r) { return c.bp.dout.row(b, q0 + r, h); };
    for (index_t r = 0; r < n; ++r) {
      q_rows[r] = reinterpret_cast<const std::uint16_t*>(q_row(r));
      do_rows[r] = reinterpret_cast<const std::uint16_t*>(do_row(r));
    }
    Pairs::pack_v(do_row, 1, n, p.dv, w.dvp, sc.do_rows.get());  // dO pairs along q
    Pairs::pack_v(q_row, 1, n, p.dk, w.dkp, sc.q_rows.get());    // Q pairs along q
  }

  void visit(const QTileRef& ref, KeyTile<Kernel>& tile) const {
    const index_t cols = tile.cols, cols_p = tile.cols_p, n_p = Kernel::padded_rows(n);
    const index_t q_pairs = (n + 1) / 2, key_pairs = (cols + 1) / 2;
    const ScoreTile t = this->score_tile(tile);
    Pairs::template scores<kHw>(tile.kt.get(), cols_p, p.dk, q_rows, n, c.scale, t.scores);  // S[q][key], scaled
    transform_and_mask(c, t, ref, q0, sc);
    Pairs::template scores<kHw>(tile.vt.get(), cols_p, p.dv, do_rows, n, 1.0f, sc.dp.get());  // dP[q][key]
    Kernel::softmax_backward_columns(t.scores, sc.dp.get(), n, cols_p, sc.lse.get(), sc.delta.get());
    apply_score_grad(c.variant, t, sc.dp.get(), sc.raw.get());
    Pairs::pack_transposed_pairs(sc.dp.get(), n_p, cols, sc.ds_t.get());  // dS^T -> [key/2][q], before dS is packed
    Pairs::pack_p(t.scores, n, cols_p);                                   // P   -> [q/2][key]
    Pairs::pack_p(sc.dp.get(), n, cols_p);                                // dS  -> [q/2][key]
    const auto accumulate = [&](const float* weights, index_t rows, index_t pairs, const float* values, index_t width,
                                float* acc) {
      if (c.finite) {
        Pairs::template accumulate_pv_unguarded<kHw>(weights, rows, pairs, values, width, sc.ones.get(), acc);
      } else {
        Pairs::template accumulate_pv<kHw>(weights, rows, pairs, values, width, sc.ones.get(), acc);
      }
    };
    accumulate(t.scores, cols, q_pairs, sc.do_rows.get(), w.dvp, tile.acc_v.get());
    accumulate(sc.dp.get(), cols, q_pairs, sc.q_rows.get(), w.dkp, tile.acc_k.get());
    accumulate(sc.ds_t.get(), n, key_pairs, tile.k_rows.get(), w.dkp, this->dq());
  }
};

// ---- The key pass on fp32 rows, the sweep, and the passes' dispatch --------

// The key pass on the kernel's fp32 tile operations. Q, dO and K rows are
// copied (widened where narrower) into contiguous staging rows even where
// they could be read in place: in BSHD they lie heads * d floats apart (4 KiB
// for 8 heads of 128), all in the same L1 sets, and the products stream a
// tile's rows many times (Zen 5, causal 4k / 16k fp32: 250 / 3690 ms in
// place, 221-231 / 3340-3360 ms staged). V rows feed only the transpose.
template <class Kernel, class T, class V>
struct VectorKeyPass : KeyPassBase<Kernel, T, V> {
  using Base = KeyPassBase<Kernel, T, V>;
  using Base::Base;
  using Base::c, Base::task, Base::sc, Base::p, Base::w, Base::seq, Base::b, Base::h, Base::q0, Base::n;
  static constexpr index_t kBq = Kernel::kBlockQ;
  RowsView q{}, d_o{};  // the q-tile's Q and dO rows
  bool q_finite = false, do_finite = false;

  void load_tile(KeyTile<Kernel>& tile) const {
    tile.k = stage_rows<Kernel, const T>([&](index_t j) { return p.k_row(seq, tile.kv0 + j, task.kv_head); }, tile.cols,
                                         p.k_strides.token, p.k_strides.dim, p.dk, w.dkp, false, tile.k_rows.get());
    tile.k_finite = rows_finite(tile.k, tile.cols, p.dk);
    const RowsView v =
        rows_of<Kernel, const T>([&](index_t j) { return p.v_row(seq, tile.kv0 + j, task.kv_head); }, tile.cols,
                                 p.v_strides.token, p.v_strides.dim, p.dv, p.dv, tile.v_rows.get());
    transpose_rows<Kernel>(tile.k, tile.cols, tile.cols_p, p.dk, c.scale, tile.kt.get());
    transpose_rows<Kernel>(v, tile.cols, tile.cols_p, p.dv, 1.0f, tile.vt.get());
  }

  void load_q_tile() {
    q = stage_rows<Kernel, const T>([&](index_t r) { return p.q_row(seq, q0 + r, h); }, n, p.q_strides.token,
                                    p.q_strides.dim, p.dk, w.dkp, false, sc.q_rows.get());
    d_o =
        stage_rows<Kernel, const T>([&](index_t r) { return c.bp.dout.row(b, q0 + r, h); }, n, c.bp.dout.strides.token,
                                    c.bp.dout.strides.dim, p.dv, w.dvp, false, sc.do_rows.get());
    q_finite = rows_finite(q, n, p.dk);
    do_finite = rows_finite(d_o, n, p.dv);
  }

  // acc += weights^T rows, unguarded where the rows are finite (a zero
  // weight then adds 0); else accumulate_pv's scans find where a zero
  // weight must skip a non-finite value.
  void accumulate(const float* weights, index_t out_rows, index_t n_weights, RowsView rows, bool finite, index_t width,
                  float* acc) const {
    if (finite) {
      Kernel::accumulate_pv_unguarded(weights, out_rows, n_weights, rows.rows, rows.stride, width, sc.ones.get(), acc);
    } else {
      Kernel::accumulate_pv(weights, out_rows, n_weights, rows.rows, rows.stride, width, sc.ones.get(), acc);
    }
  }

  void visit(const QTileRef& ref, KeyTile<Kernel>& tile) const {
    const ScoreTile t = this->score_tile(tile);
    Kernel::scores(tile.kt.get(), tile.cols_p, p.dk, q.rows, q.stride, n, t.scores);  // S[q][key], scaled
    transform_and_mask(c, t, ref, q0, sc);
    Kernel::scores(tile.vt.get(), tile.cols_p, p.dv, d_o.rows, d_o.stride, n, sc.dp.get());  // dP[q][key]
    Kernel::softmax_backward_columns(t.scores, sc.dp.get(), n, tile.cols_p, sc.lse.get(), sc.delta.get());
    apply_score_grad(c.variant, t, sc.dp.get(), sc.raw.get());
    accumulate(t.scores, tile.cols, n, d_o, do_finite, w.dvp, tile.acc_v.get());
    accumulate(sc.dp.get(), tile.cols, n, q, q_finite, w.dkp, tile.acc_k.get());
    float* dq = this->dq();
    transpose_rows<Kernel>({sc.dp.get(), kBq}, n, n, tile.cols, 1.0f, sc.ds_t.get());  // dS^T
    accumulate(sc.ds_t.get(), n, tile.cols, tile.k, tile.k_finite, w.dkp, dq);
  }
};

// One key task, a sweep of its kv-tiles at a time (as many as `tiles`
// holds, up to kKeyTilesPerSweep): each q-tile that sees some of them is
// loaded and visited by each of those, in tile order. Every tile keeps
// its own visits' order (its refs'), so its dK and dV, and each q-tile's dQ
// share, are summed in an order the plan fixes. A tile's refs run per head
// in increasing q-block, full tiles before partial ones, so the tiles of a
// sweep mostly meet a q-tile together.
template <class Pass, class Kernel>
void sweep_key_task(Pass& pass, const TiledBackwardWork& w, const KeyTask& task, std::span<KeyTile<Kernel>> tiles) {
  constexpr auto kMaxTiles = static_cast<std::size_t>(kKeyTilesPerSweep);
  const std::size_t sweep = std::min(tiles.size(), kMaxTiles);
  const auto order = [&](std::size_t ref) {
    const QTileRef& r = w.q_refs[ref];
    return std::pair{r.head, r.q_block};
  };
  for (std::size_t first = task.blocks_begin; first < task.blocks_end; first += sweep) {
    const std::size_t count = std::min(sweep, task.blocks_end - first);
    std::size_t next[kMaxTiles] = {}, end[kMaxTiles] = {};
    for (std::size_t i = 0; i < count; ++i) {
      const KeyBlock& block = w.key_blocks[first + i];
      pass.start_tile(block, tiles[i]);
      if (block.refs_begin != block.refs_end) pass.load_tile(tiles[i]);  // else its dK, dV stay zeros
      next[i] = block.refs_begin;
      end[i] = block.refs_end;
    }
    for (;;) {
      bool any = false;
      std::pair<index_t, std::int32_t> least{};
      for (std::size_t i = 0; i < count; ++i) {
        if (next[i] < end[i] && (!any || order(next[i]) < least)) {
          least = order(next[i]);
          any = true;
        }
      }
      if (!any) break;
      pass.start_q_tile(least.first, least.second);
      pass.load_q_tile();
      for (std::size_t i = 0; i < count; ++i) {
        if (next[i] < end[i] && order(next[i]) == least) pass.visit(w.q_refs[next[i]++], tiles[i]);
      }
      pass.end_q_tile();
    }
    for (std::size_t i = 0; i < count; ++i) pass.store(tiles[i]);
  }
}

// A key task on the arithmetic the call chose (backward_arithmetic; it
// chose only what this target runs).
template <class Kernel, class T, class V>
void key_task(const BackwardCall<T, V>& c, const KeyTask& task, BackwardScratch<Kernel>& sc) {
  const auto sweep = [&](auto pass) { sweep_key_task(pass, c.w, task, std::span<KeyTile<Kernel>>(sc.tiles)); };
  if constexpr (std::is_same_v<T, bfloat16>) {
    switch (c.arithmetic) {
      case Bf16Tiles::amx:
        if constexpr (Bf16DotTask<Kernel>::kPairs) return sweep(AmxKeyPass<Kernel, V>(c, task, sc));
        break;
      case Bf16Tiles::pairs:
        if constexpr (Bf16DotTask<Kernel>::kHardwarePairs) return sweep(PairKeyPass<true, Kernel, V>(c, task, sc));
        break;
      case Bf16Tiles::emulated_pairs:
        if constexpr (Bf16DotTask<Kernel>::kPairs) return sweep(PairKeyPass<false, Kernel, V>(c, task, sc));
        break;
      case Bf16Tiles::widen:
        break;
    }
  }
  sweep(VectorKeyPass<Kernel, T, V>(c, task, sc));
}

// dQ of one q-tile of one head: scale times the sum of the copies that hold
// a share of it, in the order of the copies (0 where none does).
template <class T, class V>
void query_task(const BackwardCall<T, V>& c, const QueryTask& task, index_t block_q, int worker) {
  const AttentionProblem<T>& p = c.bp.fwd;
  const TiledBackwardWork& w = c.w;
  const SequenceGeometry& seq = p.sequence(task.sequence);
  const index_t b = task.sequence, h = task.head, q0 = task.q_block * block_q;
  const index_t n = std::min(block_q, seq.q_len - q0), slot = w.q_block_slot(b, h, task.q_block);
  const index_t row = w.row_base[static_cast<std::size_t>(b)] + h * seq.q_len + q0;
  const float* shares[kMaxDqCopies];  // the touched copies' rows of this q-tile, in the order of the copies
  index_t touched = 0;
  for (index_t copy = 0; copy < w.dq_copies; ++copy) {
    if (c.dq.flag(copy, slot)) shares[touched++] = c.dq.at(copy, row);
  }
  float* sum = c.dq.row_sum(worker);
  for (index_t r = 0; r < n; ++r) {
    // Copy by copy over the row, the copies' order: each element's sum is the one fixed order.
    std::fill_n(sum, p.dk, 0.0f);
    for (index_t i = 0; i < touched; ++i) {
      const float* share = shares[i] + r * w.dkp;
      for (index_t e = 0; e < p.dk; ++e) sum[e] += share[e];
    }
    T* out = c.bp.dq.row(b, q0 + r, h);
    const index_t stride = c.bp.dq.strides.dim;
    for (index_t e = 0; e < p.dk; ++e) out[e * stride] = from_float<T>(sum[e] * c.scale);
  }
}

// sum_e a[e] b[e]: 16 partial sums added in a fixed order, so the compiler
// can keep them in vectors (a single running sum is a chain it may not
// reorder).
template <class T>
float row_dot(const T* a, index_t a_stride, const T* b, index_t b_stride, index_t n) {
  constexpr index_t kParts = 16;
  float part[kParts] = {};
  index_t e = 0;
  if (a_stride == 1 && b_stride == 1) {
    for (; e + kParts <= n; e += kParts) {
      for (index_t i = 0; i < kParts; ++i) part[i] += to_float(a[e + i]) * to_float(b[e + i]);
    }
  }
  for (; e < n; ++e) part[e % kParts] += to_float(a[e * a_stride]) * to_float(b[e * b_stride]);
  float dot = 0.0f;
  for (const float x : part) dot += x;
  return dot;
}

// D of every row and the sinks' gradient, -sum_rows P(sink) D, per head.
template <class T, class V, class Exec>
void backward_rows(const BackwardProblem<T>& bp, const TiledBackwardWork& w, const V& variant,
                   std::vector<float>& delta, Exec& exec) {
  const AttentionProblem<T>& p = bp.fwd;
  const bool sinks = variant_has_sink(variant) && !bp.dsinks.empty();
  std::vector<double> sink_grad(static_cast<std::size_t>(p.batch() * p.heads), 0.0);
  exec.parallel_for(p.batch() * p.heads, [&](index_t task, int) {
    const index_t b = task / p.heads, h = task % p.heads;
    const SequenceGeometry& seq = p.sequence(b);
    for (index_t i = 0; i < seq.q_len; ++i) {
      const float dot =
          row_dot(p.out_row(seq, i, h), p.out_strides.dim, bp.dout.row(b, i, h), bp.dout.strides.dim, p.dv);
      delta[static_cast<std::size_t>(w.row_base[static_cast<std::size_t>(b)] + h * seq.q_len + i)] = dot;
      if constexpr (HasSinkHook<V>) {
        if (sinks) {
          sink_grad[static_cast<std::size_t>(task)] -= std::exp(double{variant.sink(h)} - *p.lse_at(seq, i, h)) * dot;
        }
      }
    }
  });
  if (bp.dsinks.empty()) return;
  for (index_t h = 0; h < p.heads; ++h) {
    double g = 0.0;
    for (index_t b = 0; b < p.batch(); ++b) g += sink_grad[static_cast<std::size_t>(b * p.heads + h)];
    bp.dsinks[static_cast<std::size_t>(h)] = static_cast<float>(g);
  }
}

// Whether every element of q, k, v and dO is finite.
inline bool inputs_finite(const BackwardProblem<bfloat16>& bp) {
  const AttentionProblem<bfloat16>& p = bp.fwd;
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceGeometry& seq = p.sequence(b);
    for (index_t i = 0; i < seq.q_len; ++i) {
      for (index_t h = 0; h < p.heads; ++h) {
        if (!all_finite(p.q_row(seq, i, h), p.dk, p.q_strides.dim) ||
            !all_finite(bp.dout.row(b, i, h), p.dv, bp.dout.strides.dim)) {
          return false;
        }
      }
    }
    for (index_t j = 0; j < seq.kv_len; ++j) {
      for (index_t h = 0; h < p.kv_heads; ++h) {
        if (!all_finite(p.k_row(seq, j, h), p.dk, p.k_strides.dim) ||
            !all_finite(p.v_row(seq, j, h), p.dv, p.v_strides.dim)) {
          return false;
        }
      }
    }
  }
  return true;
}

// The arithmetic of this call's key pass: the backend's choice for bf16
// (backward_tiles) where the call meets its conditions (AmxKeyPass's and
// PairKeyPass's, above them) and this target has it, else the vector
// path on fp32 rows; and whether every input is finite (AMX needs it; the
// pair dots then skip their scans).
struct BackwardArithmetic {
  Bf16Tiles tiles = Bf16Tiles::widen;
  bool finite = false;
};

template <class Kernel, class T>
BackwardArithmetic backward_arithmetic(const BackwardProblem<T>& bp, const TiledBackwardWork& w) {
  if constexpr (!std::is_same_v<T, bfloat16>) {
    return {};
  } else {
    const AttentionProblem<T>& p = bp.fwd;
    const Bf16Tiles chosen = Bf16DotTask<Kernel>::backward_tiles();
    const bool runnable = (chosen == Bf16Tiles::amx && Bf16DotTask<Kernel>::kPairs) ||
                          (chosen == Bf16Tiles::pairs && Bf16DotTask<Kernel>::kHardwarePairs) ||
                          (chosen == Bf16Tiles::emulated_pairs && Bf16DotTask<Kernel>::kPairs);
    if (!runnable) return {};
    if (p.q_strides.dim != 1 || p.k_strides.dim != 1 || p.v_strides.dim != 1 || bp.dout.strides.dim != 1) return {};
    if (chosen == Bf16Tiles::amx && (Kernel::kBlockQ % 32 != 0 || Kernel::kBlockKv % 32 != 0 || p.dk % 32 != 0 ||
                                     p.dv % 32 != 0 || w.dkp != p.dk || w.dvp != p.dv)) {
      return {};
    }
    const bool finite = inputs_finite(bp);
    if (chosen == Bf16Tiles::amx && !finite) return {};
    return {chosen, finite};
  }
}

template <class Kernel, class T, class V, class Exec>
void run_tiled_backward(const TiledBackwardWork& planned, const BlockMask& bm, const BackwardProblem<T>& bp,
                        const V& variant, Exec& exec) {
  const AttentionProblem<T>& p = bp.fwd;
  TiledBackwardWork refined;
  if (p.segment_ids) {
    refined = refine_backward_work(planned, SegmentTiles(*p.segment_ids, Kernel::kBlockQ, Kernel::kBlockKv));
  }
  const TiledBackwardWork& w = p.segment_ids ? refined : planned;
  const int workers = std::max(1, exec.workers());
  std::vector<std::optional<BackwardScratch<Kernel>>> scratch(static_cast<std::size_t>(workers));
  const BackwardArithmetic arithmetic = backward_arithmetic<Kernel>(bp, w);
  const bool on_amx = arithmetic.tiles == Bf16Tiles::amx;
  const bool on_pairs = arithmetic.tiles == Bf16Tiles::pairs || arithmetic.tiles == Bf16Tiles::emulated_pairs;
  std::size_t sweep_tiles = 1;
  for (const KeyTask& task : w.key_tasks) {
    sweep_tiles = std::max(sweep_tiles,
                           std::min(task.blocks_end - task.blocks_begin, static_cast<std::size_t>(kKeyTilesPerSweep)));
  }
  std::vector<float> delta(static_cast<std::size_t>(w.total_rows));
  backward_rows(bp, w, variant, delta, exec);

  DqCopies dq(w, workers);
  const BackwardCall<T, V> call{
      bp, w, bm, variant, delta, dq, variant_scale(variant, p.dk), arithmetic.tiles, arithmetic.finite};
  exec.parallel_for(static_cast<index_t>(w.key_order.size()), [&](index_t i, int worker) {
    const KeyTask& task = w.key_tasks[static_cast<std::size_t>(w.key_order[static_cast<std::size_t>(i)])];
    if (on_amx) bf16_amx_task_count().fetch_add(1, std::memory_order_relaxed);
    if (on_pairs) bf16_native_task_count().fetch_add(1, std::memory_order_relaxed);
    std::optional<BackwardScratch<Kernel>>& sc = scratch[static_cast<std::size_t>(worker)];
    if (!sc) sc.emplace(p.dk, w.dkp, p.dv, w.dvp, static_cast<index_t>(sweep_tiles), arithmetic.tiles);
    key_task(call, task, *sc);
  });
  exec.parallel_for(static_cast<index_t>(w.query_tasks.size()), [&](index_t i, int worker) {
    query_task(call, w.query_tasks[static_cast<std::size_t>(i)], Kernel::kBlockQ, worker);
  });
}

}  // namespace seqattn::detail
