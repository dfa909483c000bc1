// The geometry of one attention call: where every sequence of q, k, v, out
// and lse lives, after the outputs were checked against the inputs' shape.
//
// BSHD and THD inputs both become a list of sequences, each with its own
// element offset into q, k, v, out and lse, plus strides shared by all
// sequences. Backends address element (token i, head h, dim d) of sequence s
// as base[s] + i * token_stride + h * head_stride + d * dim_stride, whatever
// the input layout or strides. A paged K/V cache (PagedKV) replaces base[s]
// for K and V by a page lookup: key j of sequence s is slot j % page_size of
// page pages[s][j / page_size]; engines ask kv_run() how many keys from j on
// share a page, so a tile costs one lookup per page it touches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/segment_ids.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/overlap.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn::detail {

struct TensorStrides {
  index_t token = 0;
  index_t head = 0;
  index_t dim = 0;
};

struct SequenceGeometry {
  index_t q_len = 0;
  index_t kv_len = 0;
  index_t q_base = 0;  // element offsets of this sequence's token 0
  index_t k_base = 0;
  index_t v_base = 0;
  index_t out_base = 0;
  index_t lse_base = 0;
  const std::int32_t* pages = nullptr;  // paged K/V: this sequence's block-table row; null: contiguous
};

// Where a paged cache's pages are (unused when K/V are contiguous).
struct KvPaging {
  index_t page_size = 0;
  index_t table_stride = 1;  // between consecutive entries of a block-table row
  index_t k_page_stride = 0;
  index_t v_page_stride = 0;
};

template <class T>
struct AttentionProblem {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  T* out = nullptr;
  float* lse = nullptr;  // null: not requested
  TensorStrides q_strides, k_strides, v_strides, out_strides, lse_strides;
  std::vector<SequenceGeometry> sequences;
  index_t heads = 0;
  index_t kv_heads = 0;
  index_t group = 1;  // query heads per key/value head
  index_t dk = 0;
  index_t dv = 0;
  KvPaging paging;
  const SegmentIds* segment_ids = nullptr;  // a BSHD call's segment ids (segment_ids.hpp), or null

  index_t batch() const { return static_cast<index_t>(sequences.size()); }
  const SequenceGeometry& sequence(index_t b) const { return sequences[static_cast<std::size_t>(b)]; }
  const T* q_row(const SequenceGeometry& s, index_t i, index_t h) const {
    return q + s.q_base + i * q_strides.token + h * q_strides.head;
  }
  const T* k_row(const SequenceGeometry& s, index_t j, index_t kv_head) const {
    const index_t at = s.pages ? paged_offset(s, j, paging.k_page_stride, k_strides) : s.k_base + j * k_strides.token;
    return k + at + kv_head * k_strides.head;
  }
  const T* v_row(const SequenceGeometry& s, index_t j, index_t kv_head) const {
    const index_t at = s.pages ? paged_offset(s, j, paging.v_page_stride, v_strides) : s.v_base + j * v_strides.token;
    return v + at + kv_head * v_strides.head;
  }
  // Keys j, j + 1, ... that lie token_stride apart from k_row(s, j) (and v_row).
  index_t kv_run(const SequenceGeometry& s, index_t j) const {
    return s.pages ? paging.page_size - j % paging.page_size : s.kv_len - j;
  }
  // f(i, run, row) for each run of rows kv0 + i .. kv0 + i + run - 1 (i < n)
  // of K (value = false) or V of one K/V head lying a token stride apart
  // from `row`, the first: the whole range when contiguous, else page by page.
  template <class F>
  void for_kv_runs(const SequenceGeometry& s, bool value, index_t kv0, index_t n, index_t kv_head, F&& f) const {
    for (index_t i = 0; i < n;) {
      const index_t run = std::min(kv_run(s, kv0 + i), n - i);
      f(i, run, value ? v_row(s, kv0 + i, kv_head) : k_row(s, kv0 + i, kv_head));
      i += run;
    }
  }
  // f(i, row) for rows kv0 + i, i < n, with one block-table lookup per page
  // (for_kv_runs): k_row's division per row cost paged bf16 decode, which
  // takes 2 x 64 row pointers per tile and K/V head, 15-20 % (bench/attention.cpp,
  // pages of 16, 2026-11-27: GQA 32/4 2.21, 2.27 -> 1.87, 1.82 ms).
  template <class F>
  void for_kv_rows(const SequenceGeometry& s, bool value, index_t kv0, index_t n, index_t kv_head, F&& f) const {
    const index_t token = value ? v_strides.token : k_strides.token;
    for_kv_runs(s, value, kv0, n, kv_head, [&](index_t i, index_t run, const T* first) {
      for (index_t r = 0; r < run; ++r) f(i + r, first + r * token);
    });
  }
  index_t paged_offset(const SequenceGeometry& s, index_t j, index_t page_stride, const TensorStrides& st) const {
    const index_t page = s.pages[j / paging.page_size * paging.table_stride];
    return page * page_stride + j % paging.page_size * st.token;
  }
  T* out_row(const SequenceGeometry& s, index_t i, index_t h) const {
    return out + s.out_base + i * out_strides.token + h * out_strides.head;
  }
  float* lse_at(const SequenceGeometry& s, index_t i, index_t h) const {
    return lse ? lse + s.lse_base + i * lse_strides.token + h * lse_strides.head : nullptr;
  }
};

// The geometry alone; make_attention_problem and make_backward_problem add
// the memory checks of their own outputs.
template <class T>
AttentionProblem<T> attention_geometry(const AttentionInputs<T>& in, const AttentionShape& shape, TensorView<T> out,
                                       TensorView<float> lse, const char* who) {
  const std::string out_name = concat(who, ": out"), lse_name = concat(who, ": lse");
  const bool packed = shape.layout == Layout::thd;
  const int rank = packed ? 3 : 4;
  AttentionProblem<T> p;
  if (in.segment_ids) in.segment_ids->require_fits(shape, who);
  p.segment_ids = in.segment_ids;
  p.heads = shape.heads;
  p.kv_heads = shape.kv_heads;
  p.group = shape.group();
  p.dk = shape.dk;
  p.dv = shape.dv;
  auto strides_of = [&](const auto& view) {
    return TensorStrides{view.stride(rank - 3), view.stride(rank - 2), view.stride(rank - 1)};
  };
  require(out.data() != nullptr || out.size() == 0, who, ": out has no data");
  p.q = in.q.data();
  p.k = in.k.data();
  p.v = in.v.data();
  p.out = out.data();
  p.lse = lse.data();
  p.q_strides = strides_of(in.q);
  p.k_strides = strides_of(in.k);
  p.v_strides = strides_of(in.v);

  if (!packed) {
    const index_t batch = shape.batch(), sq = in.q.extent(1), skv = in.k.extent(1);
    require_shape(out, make_extents({batch, sq, p.heads, p.dv}), out_name.c_str());
    p.out_strides = strides_of(out);
    if (p.lse) {
      require_shape(lse, make_extents({batch, p.heads, sq}), lse_name.c_str());
      p.lse_strides = {lse.stride(2), lse.stride(1), 0};
    }
    const char* what = "attention_forward: element offset of a batch entry";
    for (index_t b = 0; b < batch; ++b) {
      p.sequences.push_back({sq, skv, checked_mul(b, in.q.stride(0), what), checked_mul(b, in.k.stride(0), what),
                             checked_mul(b, in.v.stride(0), what), checked_mul(b, out.stride(0), what),
                             p.lse ? checked_mul(b, lse.stride(0), what) : 0});
    }
    return p;
  }
  const SegmentTable& seg = *in.segments;
  const index_t tq = in.q.extent(0);
  require_shape(out, make_extents({tq, p.heads, p.dv}), out_name.c_str());
  p.out_strides = strides_of(out);
  if (p.lse) {
    require_shape(lse, make_extents({p.heads, tq}), lse_name.c_str());
    p.lse_strides = {lse.stride(1), lse.stride(0), 0};
  }
  // Overlapping query ranges would make two segments write the same rows.
  std::vector<std::pair<index_t, index_t>> ranges;
  for (index_t i = 0; i < seg.size(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (seg.q_lens[u] > 0) ranges.emplace_back(seg.q_offsets[u], index_t{seg.q_offsets[u]} + seg.q_lens[u]);
    const char* what = "attention_forward: element offset of a segment";
    p.sequences.push_back({seg.q_lens[u], seg.kv_lens[u], checked_mul(seg.q_offsets[u], in.q.stride(0), what),
                           checked_mul(seg.kv_offsets[u], in.k.stride(0), what),
                           checked_mul(seg.kv_offsets[u], in.v.stride(0), what),
                           checked_mul(seg.q_offsets[u], out.stride(0), what),
                           p.lse ? checked_mul(seg.q_offsets[u], lse.stride(1), what) : 0});
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    require(ranges[i].first >= ranges[i - 1].second, who, ": segments overlap on the query axis: tokens [",
            ranges[i - 1].first, ", ", ranges[i - 1].second, ") and [", ranges[i].first, ", ", ranges[i].second, ")");
  }
  return p;
}

// `shape` must be shape_of(in): the inputs are already validated.
template <class T>
AttentionProblem<T> make_attention_problem(const AttentionInputs<T>& in, const AttentionShape& shape, TensorView<T> out,
                                           TensorView<float> lse, const char* who = "attention_forward") {
  AttentionProblem<T> p = attention_geometry(in, shape, out, lse, who);
  require_disjoint(who, {footprint("out", out), footprint("lse", lse)},
                   {footprint("q", in.q), footprint("k", in.k), footprint("v", in.v)});
  return p;
}

// One more [tokens, heads, dim] tensor of a call (out, dout, dq, dk, dv in the
// backward pass), addressed per sequence like q, k and v above.
template <class P>
struct SequenceTensor {
  P* data = nullptr;
  TensorStrides strides;
  std::vector<index_t> base;  // per sequence: element offset of its token 0

  P* row(index_t s, index_t token, index_t head) const {
    return data + base[static_cast<std::size_t>(s)] + token * strides.token + head * strides.head;
  }
};

// `view` must have the shape of q (query side) or k/v (key side) with `dim`
// as its last extent; `shape` is shape_of(in).
template <class P, class T>
SequenceTensor<P> sequence_tensor(TensorView<P> view, const AttentionInputs<T>& in, const AttentionShape& shape,
                                  bool key_side, index_t dim, const char* name) {
  const TensorView<const T>& like = key_side ? in.k : in.q;
  Extents expected = like.shape();
  expected[expected.rank() - 1] = dim;
  require_shape(view, expected, name);
  require(view.data() != nullptr || view.size() == 0, name, " has no data");
  const int rank = like.rank();
  SequenceTensor<P> t;
  t.data = view.data();
  t.strides = {view.stride(rank - 3), view.stride(rank - 2), view.stride(rank - 1)};
  for (index_t b = 0; b < shape.batch(); ++b) {
    index_t token0 = b;  // BSHD: batch entry b
    if (in.segments) {
      const auto u = static_cast<std::size_t>(b);
      token0 = key_side ? in.segments->kv_offsets[u] : in.segments->q_offsets[u];
    }
    t.base.push_back(token0 * view.stride(0));
  }
  return t;
}

// The geometry of a backward call: the forward problem's q, k, v and lse,
// the forward output and its gradient, and the gradients of q, k and v.
template <class T>
struct BackwardProblem {
  AttentionProblem<T> fwd;  // its `out` is the forward output, read only
  SequenceTensor<const T> dout;
  SequenceTensor<T> dq, dk, dv;
  std::span<float> dsinks;  // one per query head, or empty
};

template <class T>
BackwardProblem<T> make_backward_problem(const AttentionInputs<T>& in, const AttentionShape& shape,
                                         TensorView<const T> out, TensorView<const float> lse, TensorView<const T> dout,
                                         TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
                                         std::span<float> dsinks) {
  require(lse.data() != nullptr, "attention_backward: lse is required (the log-sum-exp the forward pass returned)");
  if (in.segments) in.segments->require_disjoint_keys("attention_backward");
  BackwardProblem<T> bp;
  // The forward geometry validates out and lse; out is only read here.
  bp.fwd = attention_geometry(in, shape, TensorView<T>(const_cast<T*>(out.data()), out.shape(), out.strides()),
                              TensorView<float>(const_cast<float*>(lse.data()), lse.shape(), lse.strides()),
                              "attention_backward");
  bp.dout = sequence_tensor(dout, in, shape, false, shape.dv, "attention_backward: dout");
  bp.dq = sequence_tensor(dq, in, shape, false, shape.dk, "attention_backward: dq");
  bp.dk = sequence_tensor(dk, in, shape, true, shape.dk, "attention_backward: dk");
  bp.dv = sequence_tensor(dv, in, shape, true, shape.dv, "attention_backward: dv");
  require(dsinks.empty() || static_cast<index_t>(dsinks.size()) == shape.heads,
          "attention_backward: dsinks must hold one value per query head (", shape.heads, "), got ", dsinks.size());
  bp.dsinks = dsinks;
  // The kernels read q, k, v, out, lse and dout while they write dq, dk, dv
  // and dsinks (dk of a key block before dq of its queries is final).
  require_disjoint("attention_backward",
                   {footprint("dq", dq), footprint("dk", dk), footprint("dv", dv), footprint("dsinks", dsinks)},
                   {footprint("q", in.q), footprint("k", in.k), footprint("v", in.v), footprint("out", out),
                    footprint("lse", lse), footprint("dout", dout)});
  return bp;
}

// The geometry of a paged call; `shape` must be shape_of(in).
template <class T>
AttentionProblem<T> make_paged_problem(const PagedAttentionInputs<T>& in, const AttentionShape& shape,
                                       TensorView<T> out, TensorView<float> lse,
                                       const char* who = "attention_forward (paged K/V)") {
  const std::string out_name = concat(who, ": out"), lse_name = concat(who, ": lse");
  const bool packed = shape.layout == Layout::thd;
  const PagedKV<T>& kv = in.kv;
  AttentionProblem<T> p;  // paged inputs carry no segment ids
  p.heads = shape.heads;
  p.kv_heads = shape.kv_heads;
  p.group = shape.group();
  p.dk = shape.dk;
  p.dv = shape.dv;
  require(out.data() != nullptr || out.size() == 0, who, ": out has no data");
  p.q = in.q.data();
  p.k = kv.k_pages.data();
  p.v = kv.v_pages.data();
  p.out = out.data();
  p.lse = lse.data();
  const int q_rank = packed ? 3 : 4;
  p.q_strides = {in.q.stride(q_rank - 3), in.q.stride(q_rank - 2), in.q.stride(q_rank - 1)};
  p.k_strides = {kv.k_pages.stride(1), kv.k_pages.stride(2), kv.k_pages.stride(3)};
  p.v_strides = {kv.v_pages.stride(1), kv.v_pages.stride(2), kv.v_pages.stride(3)};
  p.paging = {kv.k_pages.extent(1), kv.block_table.stride(1), kv.k_pages.stride(0), kv.v_pages.stride(0)};
  const index_t batch = shape.batch();
  const char* what = "attention_forward (paged K/V): element offset of a sequence";
  if (!packed) {
    const index_t sq = in.q.extent(1);
    require_shape(out, make_extents({batch, sq, p.heads, p.dv}), out_name.c_str());
    if (p.lse) require_shape(lse, make_extents({batch, p.heads, sq}), lse_name.c_str());
  } else {
    const index_t tq = in.q.extent(0);
    require_shape(out, make_extents({tq, p.heads, p.dv}), out_name.c_str());
    if (p.lse) require_shape(lse, make_extents({p.heads, tq}), lse_name.c_str());
  }
  p.out_strides = {out.stride(q_rank - 3), out.stride(q_rank - 2), out.stride(q_rank - 1)};
  if (p.lse)
    p.lse_strides =
        packed ? TensorStrides{lse.stride(1), lse.stride(0), 0} : TensorStrides{lse.stride(2), lse.stride(1), 0};
  for (index_t b = 0; b < batch; ++b) {
    SequenceGeometry g;
    g.q_len = shape.q_len(b);
    g.kv_len = shape.kv_len(b);
    g.pages = kv.block_table.data() + b * kv.block_table.stride(0);
    if (!packed) {
      g.q_base = checked_mul(b, in.q.stride(0), what);
      g.out_base = checked_mul(b, out.stride(0), what);
      g.lse_base = p.lse ? checked_mul(b, lse.stride(0), what) : 0;
    } else {
      const index_t t0 = in.cu_seqlens_q.data()[b * in.cu_seqlens_q.stride(0)];
      g.q_base = checked_mul(t0, in.q.stride(0), what);
      g.out_base = checked_mul(t0, out.stride(0), what);
      g.lse_base = p.lse ? checked_mul(t0, lse.stride(1), what) : 0;
    }
    p.sequences.push_back(g);
  }
  // The block table is read while out is written.
  require_disjoint(who, {footprint("out", out), footprint("lse", lse)},
                   {footprint("q", in.q), footprint("k_pages", kv.k_pages), footprint("v_pages", kv.v_pages),
                    footprint("block_table", kv.block_table)});
  return p;
}

}  // namespace seqattn::detail
