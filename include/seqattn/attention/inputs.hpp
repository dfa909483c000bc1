// What one attention call computes on: Q, K and V as strided views, and the
// shape of the problem they pose (what an AttentionPlan is made for).
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// Q, K and V of one attention call, as strided views (nothing is copied).
//
//   BSHD (segments == nullptr): q [B, Sq, Hq, Dk], k [B, Skv, Hkv, Dk], v [B, Skv, Hkv, Dv]
//   THD  (segments != nullptr): q [Tq, Hq, Dk],    k [Tkv, Hkv, Dk],    v [Tkv, Hkv, Dv]
//
// In THD form every segment of the table is an independent sequence (varlen):
// its queries are tokens [q_offsets[i], q_offsets[i] + q_lens[i]) and its keys
// [kv_offsets[i], kv_offsets[i] + kv_lens[i]); masks see sequence-local
// coordinates with MaskContext::batch = i. Query tokens no segment covers are
// not written.
//
// Hq must be a multiple of Hkv: query head h reads key/value head h / (Hq / Hkv)
// (GQA; MQA when Hkv == 1). K and V are never copied per head.
//
// Outputs:
//   out: BSHD [B, Sq, Hq, Dv]; THD [Tq, Hq, Dv]   (storage type of the inputs)
//   lse: BSHD [B, Hq, Sq];     THD [Hq, Tq]        (fp32, natural log)
// lse may be an empty view (no data) when it is not wanted. A row that no key
// may attend to gets out = 0 and lse = -inf (lse = sink when there is a sink).
class SegmentIds;  // attention/segment_ids.hpp

template <class T>
struct AttentionInputs {
  TensorView<const T> q;
  TensorView<const T> k;
  TensorView<const T> v;
  const SegmentTable* segments = nullptr;
  // BSHD: this call's segment ids, refining the plan's static mask
  // (attention/segment_ids.hpp); null: none.
  const SegmentIds* segment_ids = nullptr;
};

enum class Layout : std::uint8_t { bshd, thd };

// The shape of an attention problem: everything a plan depends on, and
// nothing that may change between calls that reuse it (data, strides, THD
// offsets).
struct AttentionShape {
  Layout layout = Layout::bshd;
  RaggedLengths lengths;  // per sequence: BSHD batch entries, THD segments
  index_t heads = 0;      // query heads
  index_t kv_heads = 0;
  index_t dk = 0;  // q/k head dim
  index_t dv = 0;  // v head dim

  index_t batch() const { return lengths.batch(); }
  index_t group() const { return kv_heads > 0 ? heads / kv_heads : 0; }
  index_t q_len(index_t b) const { return lengths.q[static_cast<std::size_t>(b)]; }
  index_t kv_len(index_t b) const { return lengths.kv[static_cast<std::size_t>(b)]; }
  index_t max_q_len() const {
    index_t n = 0;
    for (index_t x : lengths.q) n = std::max(n, x);
    return n;
  }
  friend bool operator==(const AttentionShape& a, const AttentionShape& b) {
    return a.layout == b.layout && a.lengths.q == b.lengths.q && a.lengths.kv == b.lengths.kv && a.heads == b.heads &&
           a.kv_heads == b.kv_heads && a.dk == b.dk && a.dv == b.dv;
  }
};

// e.g. "BSHD, 2 sequences of (q 77, kv 130), 4 heads over 2 kv heads, dk 72, dv 40"
inline std::ostream& operator<<(std::ostream& os, const AttentionShape& s) {
  os << (s.layout == Layout::bshd ? "BSHD, " : "THD, ") << s.batch() << (s.batch() == 1 ? " sequence" : " sequences");
  bool uniform = true;
  for (index_t b = 1; b < s.batch(); ++b) uniform = uniform && s.q_len(b) == s.q_len(0) && s.kv_len(b) == s.kv_len(0);
  if (s.batch() > 0 && uniform) {
    os << " of (q " << s.q_len(0) << ", kv " << s.kv_len(0) << ")";
  } else if (s.batch() > 0) {
    os << " (q, kv):";
    const index_t shown = std::min<index_t>(s.batch(), 4);
    for (index_t b = 0; b < shown; ++b) os << " (" << s.q_len(b) << ", " << s.kv_len(b) << ")";
    if (shown < s.batch()) os << " ...";
  }
  return os << ", " << s.heads << " heads over " << s.kv_heads << " kv heads, dk " << s.dk << ", dv " << s.dv;
}

namespace detail {

// Throws unless `s` is within the documented limits (limits::kMaxHeads,
// limits::kMaxHeadDim, non-negative lengths): then every size the engines
// derive from it (scratch, tasks, rows) fits in 64 bits. shape_of checks
// every shape it returns; plan_attention checks shapes built by hand.
inline void check_shape_limits(const AttentionShape& s, const char* who) {
  require(s.heads <= limits::kMaxHeads && s.kv_heads <= limits::kMaxHeads, who, ": ", s.heads, " heads over ",
          s.kv_heads, " kv heads exceed the limit of ", limits::kMaxHeads, " (limits::kMaxHeads)");
  require(s.dk <= limits::kMaxHeadDim && s.dv <= limits::kMaxHeadDim, who, ": head dims dk ", s.dk, ", dv ", s.dv,
          " exceed the limit of ", limits::kMaxHeadDim, " (limits::kMaxHeadDim)");
  require(s.lengths.q.size() == s.lengths.kv.size(), who, ": ", s.lengths.q.size(), " q lengths but ",
          s.lengths.kv.size(), " kv lengths");
  for (std::size_t b = 0; b < s.lengths.q.size(); ++b) {
    if (s.lengths.q[b] < 0 || s.lengths.kv[b] < 0) {
      throw_invalid(who, ": sequence ", b, " has a negative length (q ", s.lengths.q[b], ", kv ", s.lengths.kv[b], ")");
    }
  }
}

}  // namespace detail

// The shape of `in`, after checking that q, k, v and the segment table agree.
template <class T>
AttentionShape shape_of(const AttentionInputs<T>& in) {
  constexpr const char* kWho = "attention: ";
  const bool packed = in.segments != nullptr;
  const int rank = packed ? 3 : 4;
  const char* layout = packed ? " (THD layout: [tokens, heads, dim])" : " (BSHD layout: [batch, seq, heads, dim])";
  detail::require(
      in.q.rank() == rank, kWho, "q must have rank ", rank, layout, ", got shape ", in.q.shape(),
      !packed && in.q.rank() == 3 ? " (packed THD input needs a SegmentTable: AttentionInputs{q, k, v, &table})" : "");
  detail::require(in.k.rank() == rank, kWho, "k must have rank ", rank, layout, ", got shape ", in.k.shape());
  detail::require(in.v.rank() == rank, kWho, "v must have rank ", rank, layout, ", got shape ", in.v.shape());
  detail::require(!in.q.shape().any_negative() && !in.k.shape().any_negative() && !in.v.shape().any_negative(), kWho,
                  "extents must be non-negative, got q ", in.q.shape(), ", k ", in.k.shape(), ", v ", in.v.shape());
  detail::require(in.q.data() != nullptr || in.q.size() == 0, kWho, "q has no data");
  detail::require(in.k.data() != nullptr || in.k.size() == 0, kWho, "k has no data");
  detail::require(in.v.data() != nullptr || in.v.size() == 0, kWho, "v has no data");

  AttentionShape s;
  s.layout = packed ? Layout::thd : Layout::bshd;
  const int h_axis = rank - 2;
  s.heads = in.q.extent(h_axis);
  s.kv_heads = in.k.extent(h_axis);
  s.dk = in.q.extent(-1);
  s.dv = in.v.extent(-1);
  detail::require(in.k.extent(-1) == s.dk, kWho, "q and k must have the same head dim, got q ", in.q.shape(), " and k ",
                  in.k.shape());
  detail::require(in.v.extent(h_axis) == s.kv_heads && in.v.extent(h_axis - 1) == in.k.extent(h_axis - 1), kWho,
                  "k and v must agree in tokens and heads, got k ", in.k.shape(), " and v ", in.v.shape());
  detail::require(s.heads > 0 && s.kv_heads > 0 && s.dk > 0 && s.dv > 0, kWho,
                  "heads and head dims must be positive, got q ", in.q.shape(), ", k ", in.k.shape(), ", v ",
                  in.v.shape());
  detail::require(s.heads % s.kv_heads == 0, kWho, "query heads (", s.heads,
                  ") must be a multiple of key/value heads (", s.kv_heads, "), got q ", in.q.shape(), " and k ",
                  in.k.shape());
  if (!packed) {
    const index_t batch = in.q.extent(0);
    detail::require(in.k.extent(0) == batch && in.v.extent(0) == batch, kWho,
                    "q, k and v must have the same batch size, got q ", in.q.shape(), ", k ", in.k.shape(), ", v ",
                    in.v.shape());
    s.lengths = RaggedLengths::uniform(batch, in.q.extent(1), in.k.extent(1));
  } else {
    const SegmentTable& seg = *in.segments;
    seg.validate(in.q.extent(0), in.k.extent(0));
    for (std::size_t i = 0; i < seg.q_lens.size(); ++i) {
      s.lengths.q.push_back(seg.q_lens[i]);
      s.lengths.kv.push_back(seg.kv_lens[i]);
    }
  }
  detail::check_shape_limits(s, "attention");
  return s;
}

// A paged K/V cache (vLLM / FlashInfer layout) and the queries that read it.
//
//   k_pages      [num_pages, page_size, Hkv, Dk]   pages of keys, any page order
//   v_pages      [num_pages, page_size, Hkv, Dv]
//   block_table  [B, max_pages] int32   sequence b's key j lives in page
//                                       block_table[b][j / page_size], slot j % page_size
//   kv_lens      [B] int32              keys of each sequence (<= max_pages * page_size)
//
// Queries: BSHD q [B, Sq, Hq, Dk] (decode: Sq = 1), or THD q [Tq, Hq, Dk] with
// cu_seqlens_q [B + 1] (sequence b's queries are tokens [cu[b], cu[b + 1])).
// Outputs as for AttentionInputs of the same layout. Only the first
// ceil(kv_lens[b] / page_size) entries of a table row are read; the rest may
// hold anything (-1 padding). Pages are read in place through the table (no
// gather copy of the cache): plan with plan_attention(shape_of(paged), mask)
// and run with attention_forward(plan, paged, out, lse[, variant][, exec]) on
// any backend (Highway, Scalar, Reference).
template <class T>
struct PagedKV {
  TensorView<const T> k_pages;
  TensorView<const T> v_pages;
  TensorView<const std::int32_t> block_table;
  TensorView<const std::int32_t> kv_lens;
};

template <class T>
struct PagedAttentionInputs {
  TensorView<const T> q;
  PagedKV<T> kv;
  TensorView<const std::int32_t> cu_seqlens_q = {};  // THD only: [B + 1]; empty for BSHD q
};

// The shape of paged inputs (THD when cu_seqlens_q is given), after checking
// q, the pages, the block table and the lengths against each other: every
// page a sequence reads must exist.
template <class T>
AttentionShape shape_of(const PagedAttentionInputs<T>& in) {
  constexpr const char* kWho = "attention (paged K/V): ";
  const PagedKV<T>& kv = in.kv;
  const bool packed = in.cu_seqlens_q.data() != nullptr || in.cu_seqlens_q.rank() > 0;
  const int q_rank = packed ? 3 : 4;
  detail::require(in.q.rank() == q_rank, kWho, "q must have rank ", q_rank,
                  packed ? " ([tokens, heads, dim] with cu_seqlens_q)" : " ([batch, seq, heads, dim])", ", got shape ",
                  in.q.shape());
  detail::require(kv.k_pages.rank() == 4 && kv.v_pages.rank() == 4, kWho,
                  "k_pages and v_pages must have rank 4 ([num_pages, page_size, kv_heads, dim]), got k_pages ",
                  kv.k_pages.shape(), " and v_pages ", kv.v_pages.shape());
  detail::require(kv.block_table.rank() == 2, kWho, "block_table must have rank 2 ([batch, max_pages]), got shape ",
                  kv.block_table.shape());
  detail::require(kv.kv_lens.rank() == 1, kWho, "kv_lens must have rank 1 ([batch]), got shape ", kv.kv_lens.shape());
  detail::require(!in.q.shape().any_negative() && !kv.k_pages.shape().any_negative() &&
                      !kv.v_pages.shape().any_negative() && !kv.block_table.shape().any_negative() &&
                      !kv.kv_lens.shape().any_negative() && !in.cu_seqlens_q.shape().any_negative(),
                  kWho, "extents must be non-negative, got q ", in.q.shape(), ", k_pages ", kv.k_pages.shape(),
                  ", v_pages ", kv.v_pages.shape(), ", block_table ", kv.block_table.shape(), ", kv_lens ",
                  kv.kv_lens.shape(), ", cu_seqlens_q ", in.cu_seqlens_q.shape());
  detail::require(in.q.data() != nullptr || in.q.size() == 0, kWho, "q has no data");
  detail::require(kv.k_pages.data() != nullptr || kv.k_pages.size() == 0, kWho, "k_pages has no data");
  detail::require(kv.v_pages.data() != nullptr || kv.v_pages.size() == 0, kWho, "v_pages has no data");
  detail::require(kv.block_table.data() != nullptr || kv.block_table.size() == 0, kWho, "block_table has no data");
  detail::require(kv.kv_lens.data() != nullptr || kv.kv_lens.size() == 0, kWho, "kv_lens has no data");
  const index_t num_pages = kv.k_pages.extent(0), page_size = kv.k_pages.extent(1);
  detail::require(kv.v_pages.extent(0) == num_pages && kv.v_pages.extent(1) == page_size &&
                      kv.v_pages.extent(2) == kv.k_pages.extent(2),
                  kWho, "k_pages and v_pages must agree in pages, page size and kv heads, got k_pages ",
                  kv.k_pages.shape(), " and v_pages ", kv.v_pages.shape());
  detail::require(page_size > 0, kWho, "page_size (k_pages extent 1) must be positive, got k_pages ",
                  kv.k_pages.shape());

  AttentionShape s;
  s.layout = packed ? Layout::thd : Layout::bshd;
  s.heads = in.q.extent(-2);
  s.kv_heads = kv.k_pages.extent(2);
  s.dk = in.q.extent(-1);
  s.dv = kv.v_pages.extent(3);
  detail::require(kv.k_pages.extent(3) == s.dk, kWho, "q and k_pages must have the same head dim, got q ", in.q.shape(),
                  " and k_pages ", kv.k_pages.shape());
  detail::require(s.heads > 0 && s.kv_heads > 0 && s.dk > 0 && s.dv > 0, kWho,
                  "heads and head dims must be positive, got q ", in.q.shape(), ", k_pages ", kv.k_pages.shape(),
                  ", v_pages ", kv.v_pages.shape());
  detail::require(s.heads % s.kv_heads == 0, kWho, "query heads (", s.heads,
                  ") must be a multiple of key/value heads (", s.kv_heads, "), got q ", in.q.shape(), " and k_pages ",
                  kv.k_pages.shape());

  const index_t batch = kv.block_table.extent(0), max_pages = kv.block_table.extent(1);
  detail::require(kv.kv_lens.extent(0) == batch, kWho, "kv_lens has shape ", kv.kv_lens.shape(),
                  " but block_table has shape ", kv.block_table.shape(), " (one entry per sequence)");
  if (packed) {
    detail::require(in.cu_seqlens_q.rank() == 1 && in.cu_seqlens_q.extent(0) == batch + 1, kWho,
                    "cu_seqlens_q must have shape (", batch + 1, ") for block_table ", kv.block_table.shape(), ", got ",
                    in.cu_seqlens_q.shape());
    detail::require(in.cu_seqlens_q.data() != nullptr, kWho, "cu_seqlens_q has no data (shape ",
                    in.cu_seqlens_q.shape(), ")");
  } else {
    detail::require(in.q.extent(0) == batch, kWho, "q has shape ", in.q.shape(), " but block_table has shape ",
                    kv.block_table.shape(), " (the batch sizes differ)");
  }
  auto table = [&](index_t b, index_t i) {
    return kv.block_table.data()[b * kv.block_table.stride(0) + i * kv.block_table.stride(1)];
  };
  for (index_t b = 0; b < batch; ++b) {
    const index_t kv_len = kv.kv_lens.data()[b * kv.kv_lens.stride(0)];
    detail::require(kv_len >= 0, kWho, "kv_lens[", b, "] = ", kv_len, " is negative");
    // Rounded up without kv_len + page_size - 1, which wraps for a page size
    // near INT64_MAX (and would then skip the table check below).
    const index_t pages = detail::ceil_div_nonneg(kv_len, page_size);
    detail::require(pages <= max_pages, kWho, "kv_lens[", b, "] = ", kv_len, " needs ", pages, " pages of ", page_size,
                    " tokens but block_table has shape ", kv.block_table.shape(), " (", max_pages,
                    " pages per sequence)");
    for (index_t i = 0; i < pages; ++i) {
      const index_t page = table(b, i);
      detail::require(page >= 0 && page < num_pages, kWho, "block_table[", b, "][", i, "] = ", page,
                      " is not a page of k_pages ", kv.k_pages.shape(), " (valid: 0 .. ", num_pages - 1, ")");
    }
    index_t q_len = 0;
    if (packed) {
      const auto cu = [&](index_t i) { return index_t{in.cu_seqlens_q.data()[i * in.cu_seqlens_q.stride(0)]}; };
      detail::require(cu(b) >= 0 && cu(b) <= cu(b + 1) && cu(b + 1) <= in.q.extent(0), kWho, "cu_seqlens_q[", b, "..",
                      b + 1, "] = (", cu(b), ", ", cu(b + 1), ") must be non-decreasing within the q tokens of q ",
                      in.q.shape());
      q_len = cu(b + 1) - cu(b);
    } else {
      q_len = in.q.extent(1);
    }
    s.lengths.q.push_back(q_len);
    s.lengths.kv.push_back(kv_len);
  }
  detail::check_shape_limits(s, "attention (paged K/V)");
  return s;
}

}  // namespace seqattn
