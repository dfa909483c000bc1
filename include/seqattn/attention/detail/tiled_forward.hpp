// The running half of the CPU tiled engine, shared by every tiled backend:
// one task of the plan's work partition, written as named steps.
//
//   pack_band            before a band's tasks (prefill: the tasks of one sequence
//                        and K/V head), its K rows and V copied once into the
//                        layout the tasks read (packed_kv.hpp)
//   load_query_tile      Q rows of the task -> Qt [dk][kBlockQ], pre-scaled
//   (from here to accumulate_pv once per row band of a partial tile: the
//    band's rows against the keys they allow, TiledWork::spans)
//   load_kv_tile         K or V rows of one tile, used in place or staged as fp32
//                        (stage_rows; through the page table of a paged cache;
//                        the next rows are requested as it goes: kv_rows_ahead)
//   Kernel::scores       St = K Qt (transposed scores)
//   transform_scores     the score variant's hook (softcap, ALiBi, score_mod ...)
//   mask_tile            -inf where a partial tile's mask says no
//   mask_segments        -inf across segments, where a call's segment ids mark
//                        the tile (segment_tiles.hpp refines the plan's lists)
//   online_softmax       running max / sum per row, St -> P (Kernel's; the
//                        bf16 arithmetic's with exponentials to bf16 precision),
//                        and whether some weight is tiny (zero or denormal)
//   Kernel::accumulate_pv    O = alpha O + P V; unguarded (no NaN-policy scans)
//                        where no weight is tiny
//   finalize_rows / store_partials, then merge_partials for split-KV tasks
//
// run_task_steps is the one loop; the tile arithmetic it calls (load the
// queries, scores, softmax, accumulate) is a type: WidenedTiles (fp32) here, the bf16
// pair dot products in backends/highway_bf16-inl.h.
//
// A Kernel supplies the arithmetic on fp32 tiles (backends/tile_kernel.hpp
// states the contract; backends/scalar.hpp writes it out in plain C++). Tile
// layouts, in per-worker scratch:
//   Qt [dk][kBlockQ]       queries transposed: one vector holds one dim of many rows
//   St [kBlockKv][kBlockQ] scores transposed the same way, then probabilities
//   O  [kBlockQ][dvp]      unnormalized output rows, dvp = padded_dim(dv)
// Rows are padded to padded_rows(rows) <= kBlockQ with zero queries; their
// results are dropped. Nothing here allocates: scratch is sized from the plan
// before the parallel region.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/aligned_buffer.hpp"
#include "seqattn/attention/detail/bf16_dot.hpp"
#include "seqattn/attention/detail/packed_kv.hpp"
#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/segment_tiles.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/softmax_state.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/tile_kernel.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/bits.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One worker's tiles and row bookkeeping.
template <class Kernel>
struct TileScratch {
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  AlignedFloats qt, kbuf, vbuf, st, o, m, l, alpha, ones;
  std::vector<index_t> row_q, row_head;

  TileScratch(index_t dk, index_t dvp)
      : qt(dk * kBq),
        kbuf(kBkv * dk),
        vbuf(kBkv * dvp),
        st(kBkv * kBq),
        o(kBq * dvp),
        m(kBq),
        l(kBq),
        alpha(kBq),
        ones(kBq, AlignedFloats::Uninitialized{}),
        row_q(static_cast<std::size_t>(kBq)),
        row_head(static_cast<std::size_t>(kBq)) {
    std::fill_n(ones.get(), kBq, 1.0f);
  }
};

// The rows of one task: which query and head each row is.
struct TaskRows {
  index_t rows = 0;        // real rows
  index_t rows_p = 0;      // rows the kernels compute (padded)
  index_t group_rows = 0;  // rows per K/V group
  index_t group_rows_p = 0;
};

template <class Kernel>
TaskRows task_rows(const WorkUnit& u, index_t* row_q, index_t* row_head) {
  TaskRows t;
  t.rows = u.rows();
  t.group_rows = u.group_rows();
  // With several K/V groups each group's rows are already whole vectors.
  t.rows_p = u.kv_groups == 1 ? Kernel::padded_rows(t.rows) : t.rows;
  t.group_rows_p = u.kv_groups == 1 ? t.rows_p : t.group_rows;
  for (index_t r = 0; r < t.rows; ++r) {
    row_q[r] = u.q_of(r);
    row_head[r] = u.head_of(r);
  }
  return t;
}

// Qt[d][r] = q[row r][d] * scale; padded rows are zero. fp32 rows along a
// unit dim stride go through Kernel::transpose_rows from where they lie.
template <class Kernel, class T>
void load_query_tile(const AttentionProblem<T>& p, const SequenceGeometry& seq, const TaskRows& t, const index_t* row_q,
                     const index_t* row_head, float scale, float* qt) {
  constexpr index_t kBq = Kernel::kBlockQ;
  if constexpr (std::is_same_v<T, float>) {
    if (p.q_strides.dim == 1) {
      const float* rows[kBq] = {};
      for (index_t r = 0; r < t.rows; ++r) rows[r] = p.q_row(seq, row_q[r], row_head[r]);
      Kernel::transpose_rows(rows, t.rows, t.rows_p, p.dk, scale, qt);
      return;
    }
  }
  for (index_t r = 0; r < t.rows_p; ++r) {
    if (r >= t.rows) {
      for (index_t d = 0; d < p.dk; ++d) qt[d * kBq + r] = 0.0f;
      continue;
    }
    const T* src = p.q_row(seq, row_q[r], row_head[r]);
    for (index_t d = 0; d < p.dk; ++d) qt[d * kBq + r] = to_float(src[d * p.q_strides.dim]) * scale;
  }
}

// `n` rows of a [token, head, dim] tensor (`row(j)` points at row j; rows
// evenly strided by `token_stride`) as fp32 with a row stride, for the
// forward's K and V tiles and the backward's Q, dO, K and V: in place when
// the caller allows it and they are fp32, else staged into `buf` (widened,
// gathered along `dim_stride` and zero-padded to `padded_width`). The forward
// uses K and V in place when contiguous and the tile has many rows. Rows interleaved with
// other heads (BSHD, token stride Hkv * D) at a 4 KiB stride all map to the
// same few L1 sets, and with few rows (decode) the broadcast-driven QK^T loop
// reading straight from DRAM is latency-bound: copy-then-compute streamed
// 32k x 4 heads of K/V in 13.3 ms against 19.4 ms in place (one thread). In
// prefill the copy is under 1% of a tile.
struct RowsView {
  const float* rows = nullptr;
  index_t stride = 0;
  bool staged = false;  // a copy, whose staging requested the caller's RowsAhead
};

// A staging copy requests the rows ahead as it goes, `stream` stepping once
// per row (the kernel then reads the copy); in place, the caller hands the
// rows ahead to the kernel instead.
template <class Kernel, class T, class Row>
RowsView stage_rows(Row row, index_t n, index_t token_stride, index_t dim_stride, index_t width, index_t padded_width,
                    bool in_place, float* buf, AheadStream* stream = nullptr) {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
    if (in_place) return {row(0), token_stride};
  }
  for (index_t j = 0; j < n; ++j) {
    if (stream != nullptr) stream->step();
    const T* src = row(j);
    float* dst = buf + j * padded_width;
    if (dim_stride == 1) {
      Kernel::to_f32(src, width, dst);
    } else {
      for (index_t e = 0; e < width; ++e) dst[e] = to_float(src[e * dim_stride]);
    }
    std::fill(dst + width, dst + padded_width, 0.0f);
  }
  return {buf, padded_width, true};
}

// K (value = false) or V rows [kv0, kv0 + n) of one K/V head: stage_rows on the
// rows in place where they are evenly strided (always for contiguous K/V; in a
// paged cache when the tile lies in one page, e.g. pages of 64 or 256 keys),
// else staged page run by page run, one table lookup per page the tile
// touches: no gather copy of the cache beyond the tile being computed.
template <class Kernel, class T>
RowsView load_kv_tile(const AttentionProblem<T>& p, const SequenceGeometry& seq, bool value, index_t kv0,
                      index_t kv_head, index_t n, index_t width, index_t padded_width, bool in_place, float* buf,
                      const RowsAhead& ahead = {}) {
  const TensorStrides& s = value ? p.v_strides : p.k_strides;
  AheadStream stream(ahead, n);
  const bool one_run = p.kv_run(seq, kv0) >= n;
  RowsView view{buf, padded_width, true};
  p.for_kv_runs(seq, value, kv0, n, kv_head, [&](index_t j, index_t run, const T* first) {
    const auto row = [&s, first](index_t i) { return first + i * s.token; };
    const RowsView part = stage_rows<Kernel, T>(row, run, s.token, s.dim, width, padded_width, in_place && one_run,
                                                buf + j * padded_width, &stream);
    if (one_run) view = part;
  });
  return view;
}

// Decode (few rows) streams K and V once at a few FLOP per byte.
//   - SEQATTN_DECODE_IN_PLACE: fp32 K/V rows are read in place (any token
//     stride) instead of staged. Measured on a 2-vCPU Intel Xeon (Cascade
//     Lake, KVM guest), 1 query, 32k keys, d = 128, 2 threads: GQA 32/4
//     20.6 -> 15.0 ms, 8/1 4.5 -> 3.8 ms; the staging copy was the larger part
//     of an 8-row tile's time.
//   - Rows ahead (kv_rows_ahead, RowsAhead and AheadStream in
//     backends/tile_kernel.hpp): a decode kernel's loads and its arithmetic
//     overlap only if the rows after the ones it computes on are requested
//     while it computes, at an even rate. Each K/V group's scores request the
//     next group's K rows (this tile's next group, else the task's next
//     tile's first) and its P.V the next group's V rows, each stream spread
//     over the kernel's whole loop; a task's first group requests its own V
//     rows first. Measured on a 2-vCPU AMD EPYC (Zen 5) VM, 2026-11-27,
//     bench/attention.cpp, 1 query over 32k keys, d = 128, GQA 32/4, 2
//     threads, two alternations against the build before (which requested
//     the next group's K and V rows together, in the first third of its P.V):
//     bf16 2.90, 3.22 -> 1.96, 2.19 ms; fp32 5.19, 4.99 -> 4.33, 3.94 ms;
//     fp32 head-major 4.13, 4.48 -> 3.89, 4.31 ms; 1 thread fp32 8.73, 8.63 ->
//     7.11, 7.10 ms; paged bf16 (pages of 16) 3.89, 3.73 -> 2.68, 2.69 ms. In
//     a faster minute of the same VM (streaming read 60-69 GB/s against 37-42
//     then) bf16 went from 2.6-3.1 to 1.6-1.8 ms, a program calling the forward
//     repeatedly. GQA 8/1, whose K/V stay in the last-level cache between
//     calls, moved within the noise (bf16 0.436, 0.484 -> 0.494, 0.473 ms).
//     Where rows are requested matters: once per pair of keys in the bf16
//     P.V, or inside the dims loop of a score kernel, cost 4-25 % in cache.
//     Before that, on 2026-11-26, the requests themselves (which GCC 12 had
//     deleted from an earlier prefetch loop: see PrefetchLine) took bf16
//     from 5.9-6.3 to 3.3-3.5 ms.
// Prefill (K/V groups of many rows: run_task_steps' decode_groups) requests
// the same rows, into L2: a packed band of K/V (4 MiB at 4k keys, d = 128,
// fp32) is larger than L2, so every tile's K and V came from the last-level
// cache on demand, and the in-cache tile kernels (bench/bf16_dot.cpp
// BM_TileQK, BM_TilePV: 0.85-0.95 of the FMA rate) ran at about 0.8 of
// that rate inside the forward. Into L1, the next tile's 32 KiB of K or V
// likely evict the running tile's Qt and K (L1 holds 48 KiB): it measured
// worse on the median (below).
// The requests of a staged copy (fp32 BSHD K/V not worth a band's copy, as
// 16 documents in 8k) come one row's lines per row copied. Measured on the
// 2-vCPU Intel Xeon VM with AMX of the README (model 207, 2026-11-28, with a
// neighbour on the cores), fp32, d = 128, 8 heads, 2 threads unless said:
// calls with and without the requests alternating in one process (minimum /
// first quartile / median): causal 4k 197 / 207 / 224 -> 186 / 191 / 200 ms,
// on 1 thread 277 / 284 / 293 -> 273 / 277 / 326 ms; a 1k window over 16k
// (its K/V tiles mostly in L2 already) 346 / 355 / 372 -> 345 / 368 / 373 ms
// and 16 documents in 8k 77 / 83 / 91 -> 80 / 83 / 87 ms, both within the
// noise. L1 against L2 (bench/attention.cpp, four alternating runs of
// three binaries: minimum / median): causal 4k on 1 thread 357 / 360 ms
// without requests, 295 / 390 into L1, 268 / 296 into L2.
#ifndef SEQATTN_DECODE_IN_PLACE
#define SEQATTN_DECODE_IN_PLACE 1
#endif

// The rows [kv0, kv0 + n) of K (value = false) or V of one K/V head, as a
// RowsAhead over `ptrs` (n <= kBlockKv pointers), `width` elements each,
// requested into L2 or (decode) L1.
template <class T>
RowsAhead kv_rows_ahead(const AttentionProblem<T>& p, const SequenceGeometry& seq, bool value, index_t kv0, index_t n,
                        index_t kv_head, index_t width, bool into_l2, const void** ptrs) {
  const TensorStrides& s = value ? p.v_strides : p.k_strides;
  p.for_kv_rows(seq, value, kv0, n, kv_head, [ptrs](index_t j, const T* row) { ptrs[j] = row; });
  return {ptrs, n, ((width - 1) * s.dim + 1) * static_cast<index_t>(sizeof(T)), nullptr, into_l2};
}

// Sets the elements of tile `tile_id` (a TileRef's) that the mask disallows
// to -inf, in either ScoreTile layout: from column bits (one bit per lane for
// each column, `column_bytes` apart: in the forward layout the plan's
// transposed tile bits, in the backward's key-major one the BlockMask's own
// row bits), else from the BlockMask's row bits of the tile, whose first
// query is `tile_q_begin`, or from the mask's element predicate when no bits
// were stored.
template <class Kernel>
void mask_tile(const ScoreTile& t, const BlockMask& bm, std::int32_t tile_id, const std::uint8_t* column_bits,
               index_t column_bytes, index_t tile_q_begin) {
  if (tile_id == TileRef::kFull) return;
  if (column_bits != nullptr) {
    Kernel::apply_column_bits(t.scores, t.cols, t.rows_padded, column_bits, column_bytes);
    return;
  }
  const std::uint64_t* row_bits = tile_id >= 0 ? bm.tile_bits(tile_id).data() : nullptr;
  const index_t wpr = bm.words_per_row();
  for (index_t j = 0; j < t.cols; ++j) {
    for (index_t r = 0; r < t.rows; ++r) {
      const ScoreIndex x = t.index(r, j);
      const bool allowed = row_bits != nullptr ? test_bit(row_bits + (x.q - tile_q_begin) * wpr, x.kv - t.kv_begin)
                                               : bm.allowed(MaskContext{x.batch, x.head, x.q_len, x.kv_len}, x.q, x.kv);
      if (!allowed) t.at(r, j) = kNegInf;
    }
  }
}

// The forward layout's column bits of a partial tile: the plan's transposed
// copy (TiledWork::column_bits), where it made one.
inline const std::uint8_t* transposed_tile_bits(std::span<const std::uint8_t> column_bits, index_t column_tile_bytes,
                                                std::int32_t tile_id) {
  return tile_id >= 0 && !column_bits.empty()
             ? column_bits.data() + static_cast<std::size_t>(tile_id) * column_tile_bytes
             : nullptr;
}

// out = O / l and lse, with the variant's sink folded into the denominator.
template <class T, class V>
void finalize_row(const AttentionProblem<T>& p, const SequenceGeometry& seq, index_t q, index_t head,
                  SoftmaxState state, const float* o, const V& variant) {
  float scale = 1.0f;
  if constexpr (HasSinkHook<V>) {
    if (variant_has_sink(variant)) scale = state.absorb_sink(variant.sink(head));
  }
  scale *= state.normalizer();
  T* dst = p.out_row(seq, q, head);
  if (p.out_strides.dim == 1) {  // the usual layout, as a loop the compiler vectorizes
    for (index_t e = 0; e < p.dv; ++e) dst[e] = from_float<T>(o[e] * scale);
  } else {
    for (index_t e = 0; e < p.dv; ++e) dst[e * p.out_strides.dim] = from_float<T>(o[e] * scale);
  }
  if (float* lse = p.lse_at(seq, q, head)) *lse = state.lse();
}

// Partial results of split tasks: per row the O accumulator, then m and l.
struct Partials {
  AlignedFloats data;
  index_t row_floats = 0;
  index_t rows_per_task = 0;
  float* row(index_t task, index_t r) const { return data.get() + (task * rows_per_task + r) * row_floats; }
};

template <class Kernel>
void store_partials(const Partials& parts, index_t task, const TaskRows& t, index_t dvp, const float* o, const float* m,
                    const float* l) {
  for (index_t r = 0; r < t.rows; ++r) {
    float* dst = parts.row(task, r);
    std::copy_n(o + r * dvp, dvp, dst);
    dst[dvp] = m[r];
    dst[dvp + 1] = l[r];
  }
}

// Merges the KV splits of one unit row by row (SoftmaxState::merge), then
// finalizes. `acc` holds dvp floats.
template <class T, class V>
void merge_partials(const AttentionProblem<T>& p, const TiledWork& w, const Partials& parts, index_t unit,
                    const V& variant, float* acc) {
  const WorkUnit& u = w.units[static_cast<std::size_t>(unit)];
  const auto& seq = p.sequence(u.sequence);
  for (index_t r = 0; r < u.rows(); ++r) {
    SoftmaxState state;
    std::fill_n(acc, w.dvp, 0.0f);
    for (index_t s = 0; s < w.splits; ++s) {
      const float* part = parts.row(unit * w.splits + s, r);
      merge_partial_rows(state, acc, SoftmaxState{part[w.dvp], part[w.dvp + 1]}, part, w.dvp);
    }
    finalize_row(p, seq, u.q_of(r), u.head_of(r), state, acc, variant);
  }
}

// Everything one call shares across its tasks.
template <class Kernel, class T, class V>
struct TiledCall {
  const AttentionProblem<T>& p;
  const TiledWork& w;
  const BlockMask& bm;
  const V& variant;
  // The plan's work, for its transposed tile bits and row bands
  // (TiledWork::column_bits, row_bands): `w` may be a call's refinement of
  // it, which copies neither.
  const TiledWork& planned;
  float q_scale = 1.0f;
  bool k_in_place = false;  // fp32 K rows contiguous: usable without staging
  bool v_in_place = false;
  Partials partials;
  const BandKv<T>* band = nullptr;  // the running band's packed K/V (pack_band), or null
};

// The arithmetic of a task's tiles, widened to fp32 (every backend's path):
// Q pre-scaled into Qt, K and V rows used in place or staged as fp32, then
// the Kernel's scores, online_softmax and accumulate_pv. run_task_steps
// calls the four steps; a backend with other arithmetic for some tasks (the bf16 pair dot
// products of highway_bf16-inl.h) supplies its own type with the same steps.
template <class Kernel>
struct WidenedTiles {
  // Its kernels and staging copies request the rows ahead they are handed.
  static constexpr bool kDecodeRowsAhead = true, kPrefillRowsAhead = true;
  bool k_in_place = false;
  bool v_in_place = false;
  // Decode: fp32 K/V rows read in place page by page where a tile
  // crosses a page boundary (a kernel call per page run, each requesting its share
  // of the rows ahead: RowsAheadPart) rather than staged. Paged fp32 decode,
  // pages of 16, 1 query over 32k keys, GQA 32/4, 2 threads of the 2-vCPU Zen
  // 5 VM (bench/attention.cpp, 2026-11-27): 6.04, 6.51 -> 4.17, 4.19 ms.
  bool by_pages = false;

  static bool online_softmax(float* st, index_t cols, index_t rows_p, float* m, float* l, float* alpha) {
    return Kernel::online_softmax(st, cols, rows_p, m, l, alpha);
  }
  // The by_pages path for K (value = false) or V: f(j, run, rows, ahead) for
  // each page run of the tile's keys, `ahead` that run's share of the rows
  // ahead; false (f not called) where the tile is read otherwise.
  template <class T, class F>
  bool by_page_runs(const AttentionProblem<T>& p, const SequenceGeometry& seq, bool value, const ScoreTile& tile,
                    index_t kv_head, const RowsAhead& ahead, F&& f) const {
    if constexpr (std::is_same_v<T, float>) {
      if (by_pages && (value ? v_in_place : k_in_place) && p.kv_run(seq, tile.kv_begin) < tile.cols) {
        p.for_kv_runs(seq, value, tile.kv_begin, tile.cols, kv_head, [&](index_t j, index_t run, const float* rows) {
          const RowsAheadPart part(ahead, j, j + run, tile.cols);
          f(j, run, rows, part.get());
        });
        return true;
      }
    }
    return false;
  }
  template <class T>
  void load_query(const AttentionProblem<T>& p, const SequenceGeometry& seq, const TaskRows& t, float q_scale,
                  TileScratch<Kernel>& sc) const {
    load_query_tile<Kernel>(p, seq, t, sc.row_q.data(), sc.row_head.data(), q_scale, sc.qt.get());
  }
  // tile.scores = K Qt for the K/V group whose rows start at row r0; `ahead`
  // is requested while the K rows stream (by the staging copy, else by the kernel).
  template <class T>
  void scores(const AttentionProblem<T>& p, const SequenceGeometry& seq, index_t kv_head, index_t r0, float,
              const ScoreTile& tile, TileScratch<Kernel>& sc, const RowsAhead& ahead) const {
    const bool paged = by_page_runs(p, seq, false, tile, kv_head, ahead,
                                    [&](index_t j, index_t run, const float* k, const RowsAhead& part) {
                                      Kernel::scores(sc.qt.get() + r0, tile.rows_padded, p.dk, k, p.k_strides.token,
                                                     run, tile.scores + j * Kernel::kBlockQ, part);
                                    });
    if (paged) return;
    const RowsView k = load_kv_tile<Kernel>(p, seq, false, tile.kv_begin, kv_head, tile.cols, p.dk, p.dk, k_in_place,
                                            sc.kbuf.get(), ahead);
    Kernel::scores(sc.qt.get() + r0, tile.rows_padded, p.dk, k.rows, k.stride, tile.cols, tile.scores,
                   k.staged ? RowsAhead{} : ahead);
  }
  // o = alpha o + P V, P being the tile's probabilities; `tiny_weight`:
  // online_softmax's answer (false: no weight is below the smallest normal
  // float, so none is zero and P.V needs no guard).
  template <class T>
  void accumulate(const AttentionProblem<T>& p, const SequenceGeometry& seq, index_t kv_head, index_t dvp,
                  const ScoreTile& tile, const float* alpha, float* o, TileScratch<Kernel>& sc, const RowsAhead& ahead,
                  bool tiny_weight) const {
    const auto pv = [tiny_weight](const float* pt, index_t rows, index_t cols, const float* v, index_t v_stride,
                                  index_t width, const float* a, float* out, const RowsAhead& rows_ahead) {
      if (tiny_weight) {
        Kernel::accumulate_pv(pt, rows, cols, v, v_stride, width, a, out, rows_ahead);
      } else {
        Kernel::accumulate_pv_unguarded(pt, rows, cols, v, v_stride, width, a, out, rows_ahead);
      }
    };
    const bool paged = by_page_runs(p, seq, true, tile, kv_head, ahead,
                                    [&](index_t j, index_t run, const float* v, const RowsAhead& part) {
                                      pv(tile.scores + j * Kernel::kBlockQ, tile.rows, run, v, p.v_strides.token, dvp,
                                         j == 0 ? alpha : sc.ones.get(), o, part);
                                    });
    if (paged) return;
    const RowsView v = load_kv_tile<Kernel>(p, seq, true, tile.kv_begin, kv_head, tile.cols, p.dv, dvp, v_in_place,
                                            sc.vbuf.get(), ahead);
    pv(tile.scores, tile.rows, tile.cols, v.rows, v.stride, dvp, alpha, o, v.staged ? RowsAhead{} : ahead);
  }
};

// One task, the one loop of the forward pass: a unit's rows against its
// share of the unit's tiles, each tile's scores transformed (variant), masked
// and folded into the online softmax by `tiles`' arithmetic.
template <class Kernel, class T, class V, class Tiles>
void run_task_steps(const TiledCall<Kernel, T, V>& c, index_t task, TileScratch<Kernel>& sc, const Tiles& tiles) {
  constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  const AttentionProblem<T>& p = c.p;
  const WorkUnit& u = c.w.unit_of(task);
  const index_t split = task % c.w.splits;
  const SequenceGeometry& seq = p.sequence(u.sequence);
  const TaskRows t = task_rows<Kernel>(u, sc.row_q.data(), sc.row_head.data());
  tiles.load_query(p, seq, t, c.q_scale, sc);
  float *m = sc.m.get(), *l = sc.l.get(), *o = sc.o.get();
  std::fill_n(m, kBq, kNegInf);
  std::fill_n(l, kBq, 0.0f);
  std::fill_n(o, t.rows_p * c.w.dvp, 0.0f);
  // Rows ahead (the notes above kv_rows_ahead): groups of few rows run the
  // decode kernels and request into L1; many rows (prefill), into L2.
  const bool decode_groups = t.group_rows_p <= kBq / 4;
  const bool requests = decode_groups ? Tiles::kDecodeRowsAhead : Tiles::kPrefillRowsAhead;

  const index_t n = u.num_tiles();
  const index_t first_tile = n * split / c.w.splits;
  for (index_t i = first_tile; i < n * (split + 1) / c.w.splits; ++i) {
    const TileRef ref = c.w.tiles[u.tiles_begin + static_cast<std::size_t>(i)];
    const index_t kv0 = static_cast<index_t>(ref.kv_block) * kBkv;
    const index_t cols = std::min(kBkv, seq.kv_len - kv0);
    // The task's next tile, whose first group's K rows the last group requests.
    const bool next_tile = i + 1 < n * (split + 1) / c.w.splits;
    const index_t next_kv0 =
        next_tile ? static_cast<index_t>(c.w.tiles[u.tiles_begin + static_cast<std::size_t>(i + 1)].kv_block) * kBkv
                  : 0;
    for (index_t g = 0; g < u.kv_groups; ++g) {
      const index_t kv_head = u.kv_head + g;
      // The group's rows and the tile's keys, or (one group) the tile's row bands.
      const std::uint8_t* bits = transposed_tile_bits(c.planned.column_bits, c.planned.column_tile_bytes, ref.tile_id);
      const TileSpan whole{static_cast<std::int32_t>(g * t.group_rows),
                           static_cast<std::int32_t>(g * t.group_rows + t.group_rows_p), 0,
                           static_cast<std::int32_t>(cols)};
      std::span<const TileSpan> bands(&whole, 1);
      if (bits != nullptr) bands = c.planned.row_bands(ref.tile_id);  // made beside the bits
      // Each group's scores request the next group's K rows (this tile's
      // next group, else the task's next tile's first), and its P.V the next
      // group's V rows; the task's first group requests its own V rows
      // first, during its scores. The first row band that runs makes the
      // requests (a decode task's kBlockQ / 4 rows at most may make two).
      // Tiles whose kernels ignore them get none.
      const void* v_rows[kBkv];
      const void* k_rows[kBkv];
      const void* own_rows[kBkv];
      RowsAhead own_v, next_k, next_v;
      if (requests && (g + 1 < u.kv_groups || next_tile)) {
        const bool same_tile = g + 1 < u.kv_groups;
        const index_t head = same_tile ? kv_head + 1 : u.kv_head, at = same_tile ? kv0 : next_kv0;
        const index_t n_rows = std::min(kBkv, seq.kv_len - at);
        next_k = kv_rows_ahead(p, seq, false, at, n_rows, head, p.dk, !decode_groups, k_rows);
        next_v = kv_rows_ahead(p, seq, true, at, n_rows, head, p.dv, !decode_groups, v_rows);
      }
      bool requested = false;
      for (const TileSpan& band : bands) {
        const index_t r0 = band.row_begin, key0 = kv0 + band.col_begin;
        const index_t rows = std::min<index_t>(t.rows, band.row_end) - r0;
        const index_t rows_p = std::min<index_t>(t.rows_p, band.row_end) - r0;
        const index_t keys = std::min<index_t>(cols, band.col_end) - band.col_begin;
        if (rows <= 0 || keys <= 0) continue;
        const ScoreTile tile{sc.st.get() + r0,        kBq,        rows, rows_p,    keys,      sc.row_q.data() + r0,
                             sc.row_head.data() + r0, u.sequence, key0, seq.q_len, seq.kv_len};
        const bool first_band = !requested;
        requested = true;
        if (requests && i == first_tile && g == 0 && first_band) {
          own_v = kv_rows_ahead(p, seq, true, key0, keys, kv_head, p.dv, !decode_groups, own_rows);
          own_v.also = &next_k;
        }
        const std::uint8_t* band_bits = bits == nullptr ? nullptr : bits + band.col_begin * (kBq / 8) + r0 / 8;
        tiles.scores(p, seq, kv_head, r0, c.q_scale, tile, sc,
                     !first_band   ? RowsAhead{}
                     : own_v.n > 0 ? own_v
                                   : next_k);
        transform_scores<Kernel>(c.variant, tile);
        mask_tile<Kernel>(tile, c.bm, ref.tile_id, band_bits, kBq / 8, u.q_block * kBq);
        if (ref.by_segments) mask_segments(tile, *p.segment_ids);
        const bool tiny_weight = tiles.online_softmax(tile.scores, keys, rows_p, m + r0, l + r0, sc.alpha.get() + r0);
        tiles.accumulate(p, seq, kv_head, c.w.dvp, tile, sc.alpha.get() + r0, o + r0 * c.w.dvp, sc,
                         first_band ? next_v : RowsAhead{}, tiny_weight);
      }
    }
  }
  if (c.w.splits > 1) {
    store_partials<Kernel>(c.partials, task, t, c.w.dvp, o, m, l);
    return;
  }
  for (index_t r = 0; r < t.rows; ++r) {
    finalize_row(p, seq, sc.row_q[static_cast<std::size_t>(r)], sc.row_head[static_cast<std::size_t>(r)],
                 SoftmaxState{m[r], l[r]}, o + r * c.w.dvp, c.variant);
  }
}

// One task: the bf16 pair or AMX arithmetic when the backend chooses it for
// this task (bf16_dot.hpp), else the widening arithmetic, K and V in place where
// that pays; either way the one loop, run_task_steps.
template <class Kernel, class T, class V>
void run_task(const TiledCall<Kernel, T, V>& c, index_t task, TileScratch<Kernel>& sc) {
  if constexpr (std::is_same_v<T, bfloat16> && Bf16DotTask<Kernel>::kPairs) {
    using Pairs = Bf16DotTask<Kernel>;
    switch (Pairs::choose(c, task)) {
      case Bf16Tiles::pairs:
        if constexpr (Pairs::kHardwarePairs)
          return run_task_steps(c, task, sc, typename Pairs::template PairTiles<true>{c.band});
        break;  // not chosen where the instruction is not compiled in
      case Bf16Tiles::emulated_pairs:
        return run_task_steps(c, task, sc, typename Pairs::template PairTiles<false>{c.band});
      case Bf16Tiles::amx:
        return run_task_steps(c, task, sc, typename Pairs::AmxTiles{});
      case Bf16Tiles::widen:
        break;
    }
  }
  const AttentionProblem<T>& p = c.p;
  const bool many_rows = c.w.unit_of(task).rows() > Kernel::kBlockQ / 4;
  const bool decode_in_place = SEQATTN_DECODE_IN_PLACE && std::is_same_v<T, float>;
  WidenedTiles<Kernel> tiles;
  tiles.k_in_place = many_rows ? c.k_in_place : decode_in_place && p.k_strides.dim == 1;
  tiles.v_in_place = many_rows ? c.v_in_place : decode_in_place && p.v_strides.dim == 1 && c.w.dvp == p.dv;
  tiles.by_pages = !many_rows;
  run_task_steps(c, task, sc, tiles);
}

// Whether a call's bands pack V as the bf16 pair arithmetic's pair words
// (PairDotTiles reads them) rather than as rows.
template <class Kernel, class T>
inline constexpr bool kPackVPairs = [] {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return Bf16DotTask<Kernel>::kPairs;
  } else {
    return false;
  }
}();

// The pair arithmetic's pack_v, for the band copies of V as pair words,
// and whether the words it wrote are all finite; never called where
// kPackVPairs is false.
template <class Kernel, class T>
auto band_pair_packer() {
  return [](const auto& row, index_t dim_stride, index_t keys, index_t dv, index_t dvp, float* dst) {
    if constexpr (kPackVPairs<Kernel, T>) {
      using Pairs = typename Bf16DotTask<Kernel>::PairKernel;
      Pairs::pack_v(row, dim_stride, keys, dv, dvp, dst);
      return Pairs::pairs_finite(dst, (keys + 1) / 2, dvp);
    } else {
      return false;
    }
  };
}

// The whole forward pass of a planned problem on `exec`: the plan's work, or
// its refinement by the call's segment ids.
template <class Kernel, class T, class V, class Exec>
void run_tiled_forward(const TiledWork& planned, const BlockMask& bm, const AttentionProblem<T>& given,
                       const V& variant, Exec& exec) {
  constexpr index_t kBq = Kernel::kBlockQ;
  if (planned.units.empty()) return;
  TiledWork refined;
  if (given.segment_ids) {
    refined = refine_tiled_work(planned, SegmentTiles(*given.segment_ids, kBq, Kernel::kBlockKv));
  }
  const TiledWork& w = given.segment_ids ? refined : planned;
  // pack_band (packed_kv.hpp): K/V copied once per band where that pays.
  const std::vector<KvBand> bands = kv_bands<Kernel>(given, w, kPackVPairs<Kernel, T>);
  std::optional<BandKv<T>> band_kv;
  if (!bands.empty()) band_kv.emplace(given, w.dvp, kPackVPairs<Kernel, T>);
  const AttentionProblem<T>& p = band_kv ? band_kv->problem : given;
  const int workers = std::max(1, exec.workers());
  std::vector<TileScratch<Kernel>> scratch;
  scratch.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) scratch.emplace_back(p.dk, w.dvp);

  TiledCall<Kernel, T, V> call{p, w, bm, variant, planned, 1.0f, false, false, {}};
  call.q_scale = variant_scale(variant, p.dk);
  call.k_in_place = std::is_same_v<T, float> && p.k_strides.dim == 1 && p.k_strides.token == p.dk;
  call.v_in_place = std::is_same_v<T, float> && p.v_strides.dim == 1 && w.dvp == p.dv && p.v_strides.token == p.dv;
  if (w.splits > 1) {
    call.partials.row_floats = w.dvp + 2;
    call.partials.rows_per_task = kBq;
    call.partials.data = AlignedFloats(checked_size("attention_forward: split-KV partials", limits::kMaxTensorElements,
                                                    w.num_tasks(), kBq, call.partials.row_floats));
  }
  if (band_kv) {
    call.band = &*band_kv;
    for (const KvBand& b : bands) {
      band_kv->pack(given, b, exec, band_pair_packer<Kernel, T>());
      exec.parallel_for(b.end - b.begin, [&](index_t i, int worker) {
        run_task(call, w.order[static_cast<std::size_t>(b.begin + i)], scratch[static_cast<std::size_t>(worker)]);
      });
    }
  } else {
    exec.parallel_for(w.num_tasks(), [&](index_t i, int worker) {
      run_task(call, w.order[static_cast<std::size_t>(i)], scratch[static_cast<std::size_t>(worker)]);
    });
  }
  if (w.splits == 1) return;
  exec.parallel_for(static_cast<index_t>(w.units.size()), [&](index_t unit, int worker) {
    merge_partials(p, w, call.partials, unit, variant, scratch[static_cast<std::size_t>(worker)].o.get());
  });
}

}  // namespace seqattn::detail
