// Validation of an attention call and its normalized geometry.
//
// BSHD and THD inputs both become a list of sequences, each with its own
// element offset into q, k, v, out and lse, plus strides shared by all
// sequences. Kernels address element (token i, head h, dim d) of sequence s as
// base[s] + i * token_stride + h * head_stride + d * dim_stride, whatever the
// input layout or strides.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "seqattn/attention/options.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

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
  float scale = 1.0f;
  float softcap = 0.0f;
  std::span<const float> sinks;
  index_t kv_splits = 0;

  index_t batch() const { return static_cast<index_t>(sequences.size()); }
  index_t max_q_len() const {
    index_t n = 0;
    for (const auto& s : sequences) n = std::max(n, s.q_len);
    return n;
  }
  RaggedLengths lengths() const {
    RaggedLengths r;
    for (const auto& s : sequences) {
      r.q.push_back(s.q_len);
      r.kv.push_back(s.kv_len);
    }
    return r;
  }
};

// Extents built by push_back: GCC 12 reports a false maybe-uninitialized on
// brace-initialized Extents in some bf16 instantiations.
inline Extents make_extents(std::initializer_list<index_t> dims) {
  Extents e;
  for (index_t d : dims) e.push_back(d);
  return e;
}

template <class T>
AttentionProblem<T> make_attention_problem(const AttentionInputs<T>& in, TensorView<T> out, TensorView<float> lse,
                                           const AttentionOptions& options) {
  constexpr const char* kWho = "attention_forward: ";
  const bool packed = in.segments != nullptr;
  const int rank = packed ? 3 : 4;
  const char* layout = packed ? " (THD layout: [tokens, heads, dim])" : " (BSHD layout: [batch, seq, heads, dim])";
  require(in.q.rank() == rank, kWho, "q must have rank ", rank, layout, ", got shape ", in.q.shape());
  require(in.k.rank() == rank, kWho, "k must have rank ", rank, layout, ", got shape ", in.k.shape());
  require(in.v.rank() == rank, kWho, "v must have rank ", rank, layout, ", got shape ", in.v.shape());
  require(in.q.data() != nullptr || in.q.size() == 0, kWho, "q has no data");

  AttentionProblem<T> p;
  const int h_axis = rank - 2;
  p.heads = in.q.extent(h_axis);
  p.kv_heads = in.k.extent(h_axis);
  p.dk = in.q.extent(-1);
  p.dv = in.v.extent(-1);
  require(in.k.extent(-1) == p.dk, kWho, "q and k must have the same head dim, got q ", in.q.shape(), " and k ",
          in.k.shape());
  require(in.v.extent(h_axis) == p.kv_heads && in.v.extent(h_axis - 1) == in.k.extent(h_axis - 1), kWho,
          "k and v must agree in tokens and heads, got k ", in.k.shape(), " and v ", in.v.shape());
  require(p.heads > 0 && p.kv_heads > 0 && p.dk > 0 && p.dv > 0, kWho, "heads and head dims must be positive, got q ",
          in.q.shape(), ", k ", in.k.shape(), ", v ", in.v.shape());
  require(p.heads % p.kv_heads == 0, kWho, "query heads (", p.heads, ") must be a multiple of key/value heads (",
          p.kv_heads, "), got q ", in.q.shape(), " and k ", in.k.shape());
  p.group = p.heads / p.kv_heads;

  auto strides_of = [&](const auto& view) {
    return TensorStrides{view.stride(rank - 3), view.stride(rank - 2), view.stride(rank - 1)};
  };
  p.q = in.q.data();
  p.k = in.k.data();
  p.v = in.v.data();
  p.out = out.data();
  p.lse = lse.data();
  p.q_strides = strides_of(in.q);
  p.k_strides = strides_of(in.k);
  p.v_strides = strides_of(in.v);
  p.out_strides = strides_of(out);

  if (!packed) {
    const index_t batch = in.q.extent(0), sq = in.q.extent(1), skv = in.k.extent(1);
    require(in.k.extent(0) == batch && in.v.extent(0) == batch, kWho,
            "q, k and v must have the same batch size, got q ", in.q.shape(), ", k ", in.k.shape(), ", v ",
            in.v.shape());
    const Extents out_shape = make_extents({batch, sq, p.heads, p.dv});
    require_shape(out, out_shape, "attention_forward: out");
    if (p.lse) {
      const Extents lse_shape = make_extents({batch, p.heads, sq});
      require_shape(lse, lse_shape, "attention_forward: lse");
      p.lse_strides = {lse.stride(2), lse.stride(1), 0};
    }
    for (index_t b = 0; b < batch; ++b) {
      p.sequences.push_back({sq, skv, b * in.q.stride(0), b * in.k.stride(0), b * in.v.stride(0), b * out.stride(0),
                             p.lse ? b * lse.stride(0) : 0});
    }
  } else {
    const SegmentTable& seg = *in.segments;
    const index_t tq = in.q.extent(0);
    seg.validate(tq, in.k.extent(0));
    const Extents out_shape = make_extents({tq, p.heads, p.dv});
    require_shape(out, out_shape, "attention_forward: out");
    if (p.lse) {
      const Extents lse_shape = make_extents({p.heads, tq});
      require_shape(lse, lse_shape, "attention_forward: lse");
      p.lse_strides = {lse.stride(1), lse.stride(0), 0};
    }
    // Overlapping query ranges would make two segments write the same rows.
    std::vector<std::pair<index_t, index_t>> ranges;
    for (index_t i = 0; i < seg.size(); ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (seg.q_lens[u] > 0) ranges.emplace_back(seg.q_offsets[u], seg.q_offsets[u] + seg.q_lens[u]);
      p.sequences.push_back({seg.q_lens[u], seg.kv_lens[u], seg.q_offsets[u] * in.q.stride(0),
                             seg.kv_offsets[u] * in.k.stride(0), seg.kv_offsets[u] * in.v.stride(0),
                             seg.q_offsets[u] * out.stride(0), p.lse ? seg.q_offsets[u] * lse.stride(1) : 0});
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      require(ranges[i].first >= ranges[i - 1].second, kWho, "segments overlap on the query axis: tokens [",
              ranges[i - 1].first, ", ", ranges[i - 1].second, ") and [", ranges[i].first, ", ", ranges[i].second, ")");
    }
  }

  p.scale = std::isnan(options.scale) ? 1.0f / std::sqrt(static_cast<float>(p.dk)) : options.scale;
  require(std::isfinite(p.scale), kWho, "scale must be finite, got ", p.scale);
  require(std::isfinite(options.softcap) && options.softcap >= 0.0f, kWho,
          "softcap must be finite and >= 0 (0 disables it), got ", options.softcap);
  p.softcap = options.softcap;
  require(options.sinks.empty() || static_cast<index_t>(options.sinks.size()) == p.heads, kWho,
          "sinks must hold one logit per query head (", p.heads, "), got ", options.sinks.size());
  p.sinks = options.sinks;
  require(options.kv_splits >= 0, kWho, "kv_splits must be >= 0 (0 = automatic), got ", options.kv_splits);
  p.kv_splits = options.kv_splits;
  return p;
}

// Checks that a caller-built BlockMask fits this call and the engine's tiles.
template <class T>
void require_matching_block_mask(const BlockMask& bm, const AttentionProblem<T>& p, BlockShape block) {
  constexpr const char* kWho = "attention_forward: options.block_mask ";
  require(bm.block_shape().q == block.q && bm.block_shape().kv == block.kv, kWho, "has block shape (",
          bm.block_shape().q, ", ", bm.block_shape().kv, ") but this backend tiles by (", block.q, ", ", block.kv, ")");
  require(bm.batch() == p.batch(), kWho, "covers ", bm.batch(), " sequences but the inputs have ", p.batch());
  for (index_t b = 0; b < p.batch(); ++b) {
    const auto& s = p.sequences[static_cast<std::size_t>(b)];
    require(bm.q_len(b) == s.q_len && bm.kv_len(b) == s.kv_len, kWho, "has lengths (q ", bm.q_len(b), ", kv ",
            bm.kv_len(b), ") for sequence ", b, " but the inputs have (q ", s.q_len, ", kv ", s.kv_len, ")");
  }
  require(bm.heads() == 1 || bm.heads() == p.heads, kWho, "has ", bm.heads(), " heads but the inputs have ", p.heads);
}

}  // namespace seqattn::detail
