// The backward pass of the CPU tiled engine (FlashAttention-2's algorithm:
// P recomputed from the saved LSE, D = rowsum(dO * O)), deterministic for any
// number of workers: every output element is computed by one task in a fixed
// order, with no atomics and no cross-task reductions.
//
//   rows pass   D and the sinks' gradient, per (sequence, head)
//   key pass    dK, dV per (sequence, K/V head, kv-tile): the q-tiles that see
//               the kv-tile, taken from the BlockMask's transpose, for every
//               query head of the GQA group, summed in that order
//   query pass  dQ per (sequence, head, q-tile): the kv-tiles of its row
//
// The query pass recomputes S and dP, which the key pass also computes: that
// is the price of determinism without a dQ buffer per kv-tile (7 tile matmuls
// per visited tile instead of FlashAttention-2's 5 with atomic dQ adds).
//
// Every matmul is one of the kernel's two tile operations: Kernel::scores
// (S^T = K Qt, dP^T = V dOt) and Kernel::accumulate_pv (dV += P^T dO,
// dK += dS^T Q, dQ += dS K), with P^T and dS^T transposed through scratch.
// Empty tiles are never visited; full tiles get no mask work.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled_forward.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/longest_first.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::detail {

// ---- Planning ---------------------------------------------------------------

// One q-tile that sees a kv-tile, for one query head.
struct QTileRef {
  index_t head = 0;
  std::int32_t q_block = 0;
  std::int32_t tile_id = TileRef::kFull;  // as in TileRef
};

struct KeyTask {  // dK, dV of one kv-tile of one K/V head
  index_t sequence = 0;
  index_t kv_head = 0;
  index_t kv_block = 0;
  std::size_t refs_begin = 0, refs_end = 0;  // into q_refs
};

struct QueryTask {  // dQ of one q-tile of one head
  index_t sequence = 0;
  index_t head = 0;
  index_t q_block = 0;
  std::size_t tiles_begin = 0, tiles_end = 0;  // into tiles
};

struct TiledBackwardWork {
  std::vector<KeyTask> key_tasks;
  std::vector<QTileRef> q_refs;
  std::vector<QueryTask> query_tasks;
  std::vector<TileRef> tiles;
  std::vector<index_t> key_order, query_order;  // longest first
  std::vector<std::uint8_t> column_bits;        // as in TiledWork
  index_t column_tile_bytes = 0;
  index_t dkp = 0, dvp = 0;       // the kernel's padded head dims
  std::vector<index_t> row_base;  // per sequence: first row of D, rows ordered (head, query)
  index_t total_rows = 0;
};

// Key tasks from the transposed BlockMask: its row (b, h, kb) lists the
// q-blocks that see kv-block kb; partial tiles keep their ids (the
// transpose shares them), so the forward tile bits mask them.
inline void plan_key_tasks(const AttentionShape& shape, const BlockMask& bm, TiledBackwardWork& w) {
  const BlockMask t = bm.transposed();
  std::vector<index_t> cost;
  for (index_t b = 0; b < shape.batch(); ++b) {
    for (index_t kvh = 0; kvh < shape.kv_heads; ++kvh) {
      for (index_t kb = 0; kb < bm.num_kv_blocks(b); ++kb) {
        KeyTask task{b, kvh, kb, w.q_refs.size(), 0};
        for (index_t h = kvh * shape.group(); h < (kvh + 1) * shape.group(); ++h) {
          for_each_listed_tile(t, b, h, kb, [&](TileRef r) { w.q_refs.push_back({h, r.kv_block, r.tile_id}); });
        }
        task.refs_end = w.q_refs.size();
        cost.push_back(static_cast<index_t>(task.refs_end - task.refs_begin));
        w.key_tasks.push_back(task);
      }
    }
  }
  w.key_order = longest_first(cost);
}

inline void plan_query_tasks(const AttentionShape& shape, const BlockMask& bm, TiledBackwardWork& w) {
  std::vector<index_t> cost;
  for (index_t b = 0; b < shape.batch(); ++b) {
    w.row_base.push_back(w.total_rows);
    w.total_rows += shape.heads * shape.q_len(b);
    for (index_t h = 0; h < shape.heads; ++h) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        QueryTask task{b, h, qb, w.tiles.size(), 0};
        for_each_listed_tile(bm, b, h, qb, [&](TileRef t) { w.tiles.push_back(t); });
        task.tiles_end = w.tiles.size();
        cost.push_back(static_cast<index_t>(task.tiles_end - task.tiles_begin));
        w.query_tasks.push_back(task);
      }
    }
  }
  w.query_order = longest_first(cost);
}

template <class Kernel>
TiledBackwardWork plan_tiled_backward(const AttentionShape& shape, const BlockMask& bm) {
  constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  TiledBackwardWork w;
  w.dkp = Kernel::padded_dim(shape.dk);
  w.dvp = Kernel::padded_dim(shape.dv);
  plan_key_tasks(shape, bm, w);
  plan_query_tasks(shape, bm, w);
  if (bm.has_tile_bits() && kBq % 8 == 0 && bm.num_distinct_partial_tiles() > 0) {
    w.column_tile_bytes = kBkv * (kBq / 8);
    w.column_bits = transpose_tile_bits(bm, kBq, kBkv);
  }
  return w;
}

// ---- Running ----------------------------------------------------------------
//
// Key pass tiles put keys on the lanes: S[q][key] = scores(Kt, Q rows), so
// P and dS come out in the [query][key] layout accumulate_pv wants for
// dV += P^T dO and dK += dS^T Q, and Q and dO are read as rows (in place
// for contiguous fp32) without a transpose per visit; K^T and V^T are built
// once per task. Query pass tiles use the forward layout (queries on lanes):
// dQ += dS K reads dS^T directly, Qt and dO^T are built once per task.

template <class Kernel>
struct BackwardScratch {
  static constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  AlignedFloats qt, dot, kt, vt, q_rows, do_rows, k_rows, v_rows, s, raw, dp, acc_k, acc_v, acc_q, lse, delta, ones;
  std::vector<index_t> row_q, row_head;

  BackwardScratch(index_t dk, index_t dkp, index_t dv, index_t dvp)
      : qt(dk * kBq),
        dot(dv * kBq),
        kt(dk * kBq),
        vt(dv * kBq),
        q_rows(kBq * dkp),
        do_rows(kBq * dvp),
        k_rows(kBkv * dkp),
        v_rows(kBkv * dvp),
        s(kBq * kBq),
        raw(kBq * kBq),
        dp(kBq * kBq),
        acc_k(kBkv * dkp),
        acc_v(kBkv * dvp),
        acc_q(kBq * dkp),
        lse(kBq),
        delta(kBq),
        ones(kBq),
        row_q(static_cast<std::size_t>(kBq)),
        row_head(static_cast<std::size_t>(kBq)) {
    std::fill_n(ones.get(), ones.size(), 1.0f);
  }
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

// dst[d * kBq + i] = rows[i][d] * scale for i < n; lanes [n, n_p) are zero.
template <index_t kBq>
void transpose_rows(RowsView rows, index_t n, index_t n_p, index_t width, float scale, float* dst) {
  for (index_t d = 0; d < width; ++d) {
    float* out = dst + d * kBq;
    for (index_t i = 0; i < n; ++i) out[i] = rows.rows[i * rows.stride + d] * scale;
    std::fill(out + n, out + n_p, 0.0f);
  }
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
  float scale = 1.0f;
};

// dK and dV of one kv-tile of one K/V head.
template <class Kernel, class T, class V>
void key_task(const BackwardCall<T, V>& c, const KeyTask& task, BackwardScratch<Kernel>& sc) {
  constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  const AttentionProblem<T>& p = c.bp.fwd;
  const TiledBackwardWork& w = c.w;
  const SequenceGeometry& seq = p.sequence(task.sequence);
  const index_t b = task.sequence, kv0 = task.kv_block * kBkv, cols = std::min(kBkv, seq.kv_len - kv0);
  const index_t cols_p = Kernel::padded_rows(cols);
  const RowsView k = rows_of<Kernel, const T>([&](index_t j) { return p.k_row(seq, kv0 + j, task.kv_head); }, cols,
                                              p.k_strides.token, p.k_strides.dim, p.dk, p.dk, sc.k_rows.get());
  const RowsView v = rows_of<Kernel, const T>([&](index_t j) { return p.v_row(seq, kv0 + j, task.kv_head); }, cols,
                                              p.v_strides.token, p.v_strides.dim, p.dv, p.dv, sc.v_rows.get());
  transpose_rows<kBq>(k, cols, cols_p, p.dk, c.scale, sc.kt.get());
  transpose_rows<kBq>(v, cols, cols_p, p.dv, 1.0f, sc.vt.get());
  std::fill_n(sc.acc_k.get(), cols * w.dkp, 0.0f);
  std::fill_n(sc.acc_v.get(), cols * w.dvp, 0.0f);
  for (std::size_t i = task.refs_begin; i < task.refs_end; ++i) {
    const QTileRef ref = w.q_refs[i];
    const index_t h = ref.head, q0 = index_t{ref.q_block} * kBq, n = std::min(kBq, seq.q_len - q0);
    const RowsView q = rows_of<Kernel, const T>([&](index_t r) { return p.q_row(seq, q0 + r, h); }, n,
                                                p.q_strides.token, p.q_strides.dim, p.dk, w.dkp, sc.q_rows.get());
    const RowsView d_o =
        rows_of<Kernel, const T>([&](index_t r) { return c.bp.dout.row(b, q0 + r, h); }, n, c.bp.dout.strides.token,
                                 c.bp.dout.strides.dim, p.dv, w.dvp, sc.do_rows.get());
    for (index_t r = 0; r < n; ++r) {
      sc.row_q[static_cast<std::size_t>(r)] = q0 + r;
      sc.row_head[static_cast<std::size_t>(r)] = h;
    }
    load_row_stats(c.bp, w, c.delta, b, h, q0, n, n, sc.lse.get(), sc.delta.get());
    const ScoreTile t{sc.s.get(),         kBq, cols, cols_p,    n,          sc.row_q.data(),
                      sc.row_head.data(), b,   kv0,  seq.q_len, seq.kv_len, true};
    Kernel::scores(sc.kt.get(), cols_p, p.dk, q.rows, q.stride, n, t.scores);  // S[q][key], scaled
    if constexpr (HasScoreHook<V>) std::copy_n(t.scores, n * kBq, sc.raw.get());
    transform_scores<Kernel>(c.variant, t);
    // Key-major: the forward tile's row bits (per query, one bit per key)
    // are this layout's column bits (little-endian words read as bytes).
    const auto* bits =
        ref.tile_id >= 0 ? reinterpret_cast<const std::uint8_t*>(c.bm.tile_bits(ref.tile_id).data()) : nullptr;
    mask_tile<Kernel>(t, c.bm, ref.tile_id, bits, c.bm.words_per_row() * 8, q0);
    Kernel::scores(sc.vt.get(), cols_p, p.dv, d_o.rows, d_o.stride, n, sc.dp.get());  // dP[q][key]
    Kernel::softmax_backward_columns(t.scores, sc.dp.get(), n, cols_p, sc.lse.get(), sc.delta.get());
    apply_score_grad(c.variant, t, sc.dp.get(), sc.raw.get());
    Kernel::accumulate_pv(t.scores, cols, n, d_o.rows, d_o.stride, w.dvp, sc.ones.get(), sc.acc_v.get());
    Kernel::accumulate_pv(sc.dp.get(), cols, n, q.rows, q.stride, w.dkp, sc.ones.get(), sc.acc_k.get());
  }
  store_rows(c.bp.dk, b, kv0, task.kv_head, sc.acc_k.get(), cols, p.dk, w.dkp, c.scale);
  store_rows(c.bp.dv, b, kv0, task.kv_head, sc.acc_v.get(), cols, p.dv, w.dvp, 1.0f);
}

// dQ of one q-tile of one head.
template <class Kernel, class T, class V>
void query_task(const BackwardCall<T, V>& c, const QueryTask& task, BackwardScratch<Kernel>& sc) {
  constexpr index_t kBq = Kernel::kBlockQ, kBkv = Kernel::kBlockKv;
  const AttentionProblem<T>& p = c.bp.fwd;
  const TiledBackwardWork& w = c.w;
  const SequenceGeometry& seq = p.sequence(task.sequence);
  const index_t b = task.sequence, h = task.head, kv_head = h / p.group;
  const index_t q0 = task.q_block * kBq, n = std::min(kBq, seq.q_len - q0), n_p = Kernel::padded_rows(n);
  const RowsView q = rows_of<Kernel, const T>([&](index_t r) { return p.q_row(seq, q0 + r, h); }, n, p.q_strides.token,
                                              p.q_strides.dim, p.dk, p.dk, sc.q_rows.get());
  const RowsView d_o =
      rows_of<Kernel, const T>([&](index_t r) { return c.bp.dout.row(b, q0 + r, h); }, n, c.bp.dout.strides.token,
                               c.bp.dout.strides.dim, p.dv, p.dv, sc.do_rows.get());
  transpose_rows<kBq>(q, n, n_p, p.dk, c.scale, sc.qt.get());
  transpose_rows<kBq>(d_o, n, n_p, p.dv, 1.0f, sc.dot.get());
  for (index_t r = 0; r < n; ++r) {
    sc.row_q[static_cast<std::size_t>(r)] = q0 + r;
    sc.row_head[static_cast<std::size_t>(r)] = h;
  }
  load_row_stats(c.bp, w, c.delta, b, h, q0, n, n_p, sc.lse.get(), sc.delta.get());
  std::fill_n(sc.acc_q.get(), n * w.dkp, 0.0f);
  for (std::size_t i = task.tiles_begin; i < task.tiles_end; ++i) {
    const TileRef ref = w.tiles[i];
    const index_t kv0 = index_t{ref.kv_block} * kBkv, cols = std::min(kBkv, seq.kv_len - kv0);
    const RowsView k = rows_of<Kernel, const T>([&](index_t j) { return p.k_row(seq, kv0 + j, kv_head); }, cols,
                                                p.k_strides.token, p.k_strides.dim, p.dk, w.dkp, sc.k_rows.get());
    const RowsView v = rows_of<Kernel, const T>([&](index_t j) { return p.v_row(seq, kv0 + j, kv_head); }, cols,
                                                p.v_strides.token, p.v_strides.dim, p.dv, p.dv, sc.v_rows.get());
    const ScoreTile t{sc.s.get(),         kBq, n,   n_p,       cols,       sc.row_q.data(),
                      sc.row_head.data(), b,   kv0, seq.q_len, seq.kv_len, false};
    Kernel::scores(sc.qt.get(), n_p, p.dk, k.rows, k.stride, cols, t.scores);  // S^T[key][q], scaled
    if constexpr (HasScoreHook<V>) std::copy_n(t.scores, cols * kBq, sc.raw.get());
    transform_scores<Kernel>(c.variant, t);
    mask_tile<Kernel>(t, c.bm, ref.tile_id, transposed_tile_bits(w.column_bits, w.column_tile_bytes, ref.tile_id),
                      kBq / 8, q0);
    Kernel::scores(sc.dot.get(), n_p, p.dv, v.rows, v.stride, cols, sc.dp.get());  // dP^T[key][q]
    Kernel::softmax_backward_lanes(t.scores, sc.dp.get(), cols, n_p, sc.lse.get(), sc.delta.get());
    apply_score_grad(c.variant, t, sc.dp.get(), sc.raw.get());
    Kernel::accumulate_pv(sc.dp.get(), n, cols, k.rows, k.stride, w.dkp, sc.ones.get(), sc.acc_q.get());
  }
  store_rows(c.bp.dq, b, q0, h, sc.acc_q.get(), n, p.dk, w.dkp, c.scale);
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
      const T* o = p.out_row(seq, i, h);
      const T* d_o = bp.dout.row(b, i, h);
      float dot = 0.0f;
      for (index_t e = 0; e < p.dv; ++e)
        dot += to_float(o[e * p.out_strides.dim]) * to_float(d_o[e * bp.dout.strides.dim]);
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

template <class Kernel, class T, class V, class Exec>
void run_tiled_backward(const TiledBackwardWork& w, const BlockMask& bm, const BackwardProblem<T>& bp, const V& variant,
                        Exec& exec) {
  const AttentionProblem<T>& p = bp.fwd;
  const int workers = std::max(1, exec.workers());
  std::vector<BackwardScratch<Kernel>> scratch;
  scratch.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) scratch.emplace_back(p.dk, w.dkp, p.dv, w.dvp);
  std::vector<float> delta(static_cast<std::size_t>(w.total_rows));
  backward_rows(bp, w, variant, delta, exec);

  const BackwardCall<T, V> call{bp, w, bm, variant, delta, variant_scale(variant, p.dk)};
  exec.parallel_for(static_cast<index_t>(w.key_order.size()), [&](index_t i, int worker) {
    const KeyTask& task = w.key_tasks[static_cast<std::size_t>(w.key_order[static_cast<std::size_t>(i)])];
    key_task(call, task, scratch[static_cast<std::size_t>(worker)]);
  });
  exec.parallel_for(static_cast<index_t>(w.query_order.size()), [&](index_t i, int worker) {
    const QueryTask& task = w.query_tasks[static_cast<std::size_t>(w.query_order[static_cast<std::size_t>(i)])];
    query_task(call, task, scratch[static_cast<std::size_t>(worker)]);
  });
}

}  // namespace seqattn::detail
