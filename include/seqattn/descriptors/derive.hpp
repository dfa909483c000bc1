// Segment ids + positions -> per-row seqlens and offsets, with the reference
// (mask-defined) semantics of TransformerEngine's slow path (docs/semantics/sequence-descriptors.md §2.6).
//
// For THD, within each batch row a query token is *active* iff some key token
// of the same segment is allowed for it by the mask (and a key token iff some
// query token of its segment may attend it):
//   padding / no_mask:       the segment exists on the other side;
//   causal (top-left):       pos_q >= pos_kv;
//   causal bottom-right:     runlen_q - pos_q <= runlen_kv - pos_kv.
// (Segments are always kept apart, as in TE's dense reference, so under THD
// no_mask / causal behave like padding / padding_causal.)
// seqlens[k] counts the active tokens of segment k+1, offsets[k] is its first
// active token within the row (-1 when none; unused slots 0 / -1). That is
// exactly "build the dense allow mask, derive row_ids / col_ids, apply P", in
// O(T + M) per row instead of O(T^2).
//
// Deliberate differences from TE:
//  - No fast path: TE's causal fast path reads row 0's positions for every
//    row (docs/semantics/sequence-descriptors.md §6 D1) and trims keys under non-causal masks (D3). Reference
//    values are what we return for every mask and window.
//  - The sliding window never changes the descriptor (as in TE since PR
//    #2201); it is applied by the kernel. It is accepted for parity only.
//  - offsets[k] belongs to segment k+1 even when an earlier segment is
//    entirely inactive (TE lists starts in order of appearance, so its slots
//    misalign there; both pack to the same cu_seqlens and global offsets).
//  - Ids are validated instead of silently corrupting the result: each row
//    numbers its segments 1, 2, 3, ... in order of appearance, each segment
//    one contiguous run, ids <= max_segments_per_seq (§6 D5; vectors E7, E10 of §5).
//    SegmentIdGaps::renumber accepts what TE repairs, increasing ids with
//    gaps ([1, 1, 3, 3]), and nothing that TE corrupts.
//    The active tokens of a segment must form one range (true whenever
//    positions are monotone inside segments); TE emits extra, misaligned
//    offsets otherwise, we throw.
//  - BSHD padding seqlens count the non-padding tokens; TE sums the id
//    values (D4), which differs as soon as an id is not 1. A BSHD row must be
//    one right-padded sequence. Non-padding BSHD masks give every row the
//    full length S, shaped (*E, B) rather than TE's 0-d scalar.
//  - max_segments_per_seq only matters for THD; BSHD ignores it (TE warns).
//  - Extra leading dims on one side only are broadcast: the side without them
//    is shared by every slice of the other (TE raises or crashes there).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/detail/rows.hpp"
#include "seqattn/descriptors/detail/thd_rows.hpp"
#include "seqattn/descriptors/types.hpp"

namespace seqattn {

using Int32View = TensorView<const std::int32_t>;

// Per-row descriptors of a batch, q and kv.
//   THD:  seqlens (*E, B, M), offsets (*E, B, M+1), offsets within the row.
//   BSHD: seqlens (*E, B), offsets empty (shape (0,)).
// seq_len is the number of tokens per row (S) of q and kv, needed to make
// offsets global when packing; -1 when unknown (descriptor built from seqlens).
struct SeqlensAndOffsets {
  SeqLayout layout = SeqLayout::thd;
  QkvPair<Tensor<std::int32_t>> seqlens;
  QkvPair<Tensor<std::int32_t>> offsets;
  QkvPair<index_t> seq_len{-1, -1};
};

namespace detail {

template <bool QUnit, bool KvUnit>
void thd_row_dispatched(const RowSource (&src)[4], index_t r, AttnMaskType mask, int m, SegmentIdGaps gaps,
                        bool self_attention, SegmentRuns& q_runs, SegmentRuns& kv_runs, const ThdRowOutput& out) {
  const RowPtr<QUnit> q_ids{src[0].row(source_row(src[0], r)), src[0].step};
  const RowPtr<KvUnit> kv_ids{src[1].row(source_row(src[1], r)), src[1].step};
  const RowPtr<QUnit> q_pos{src[2].row(source_row(src[2], r)), src[2].step};
  const RowPtr<KvUnit> kv_pos{src[3].row(source_row(src[3], r)), src[3].step};
  thd_row(q_ids, q_pos, kv_ids, kv_pos, src, r, mask, m, gaps, self_attention, q_runs, kv_runs, out);
}

inline bool same_view(const TensorView<const std::int32_t>& a, const TensorView<const std::int32_t>& b) {
  return a.data() == b.data() && a.shape() == b.shape() && a.strides() == b.strides();
}

inline std::int32_t bshd_length(const RowSource& src, index_t r) {
  const index_t row = source_row(src, r);
  if (src.step == 1) return bshd_row_length(RowPtr<true>{src.row(row), 1}, src, row);
  return bshd_row_length(RowPtr<false>{src.row(row), src.step}, src, row);
}

}  // namespace detail

// Derives seqlens and offsets from segment ids (0 = padding, segments 1, 2,
// ...) and positions (mandatory). ids are (*E, B, T); positions match a
// trailing part of that shape and are broadcast over the rest. q and kv may
// differ in T; their extras must agree or be absent on one side.
// Throws seqattn::invalid_argument naming the argument, row and token on
// malformed input. `gaps` says whether THD ids may skip numbers (TE's
// repair, types.hpp); BSHD rows ignore it.
inline SeqlensAndOffsets derive_seqlens_and_offsets(const QkvPair<Int32View>& segment_ids,
                                                    const QkvPair<Int32View>& segment_pos, AttnMaskType mask,
                                                    SeqLayout layout, WindowSize window = {},
                                                    int max_segments_per_seq = 1,
                                                    SegmentIdGaps gaps = SegmentIdGaps::reject) {
  (void)window;  // never changes the descriptor (see above)
  const Extents batch = detail::check_segment_shapes(segment_ids, segment_pos);
  detail::require(max_segments_per_seq >= 1, "max_segments_per_seq must be >= 1, got ", max_segments_per_seq);
  detail::require(max_segments_per_seq <= limits::kMaxSegmentsPerSeq, "max_segments_per_seq must be at most ",
                  limits::kMaxSegmentsPerSeq, " (limits::kMaxSegmentsPerSeq), got ", max_segments_per_seq);
  const detail::RowSource src[4] = {{"q_segment_ids", segment_ids.q},
                                    {"kv_segment_ids", segment_ids.kv},
                                    {"q_segment_pos", segment_pos.q},
                                    {"kv_segment_pos", segment_pos.kv}};
  detail::require(
      src[0].len <= std::numeric_limits<std::int32_t>::max() && src[1].len <= std::numeric_limits<std::int32_t>::max(),
      "segment_ids rows of ", src[0].len, " (q) and ", src[1].len,
      " (kv) tokens: offsets are int32, rows must stay below 2^31 tokens");
  const index_t rows = batch.size();
  SeqlensAndOffsets out;
  out.layout = layout;
  out.seq_len = {src[0].len, src[1].len};

  if (layout == SeqLayout::bshd) {
    out.seqlens = {Tensor<std::int32_t>(batch), Tensor<std::int32_t>(batch)};
    out.offsets = {Tensor<std::int32_t>(Extents{0}), Tensor<std::int32_t>(Extents{0})};
    for (index_t r = 0; r < rows; ++r) {
      // Validate even when the mask ignores padding: malformed ids are a bug either way.
      const std::int32_t q_len = detail::bshd_length(src[0], r);
      const std::int32_t kv_len = detail::bshd_length(src[1], r);
      const bool pad = is_padding(mask);
      out.seqlens.q.data()[r] = pad ? q_len : static_cast<std::int32_t>(src[0].len);
      out.seqlens.kv.data()[r] = pad ? kv_len : static_cast<std::int32_t>(src[1].len);
    }
    return out;
  }

  const int m = max_segments_per_seq;
  out.seqlens = {Tensor<std::int32_t>(batch.concat(Extents{m})), Tensor<std::int32_t>(batch.concat(Extents{m}))};
  out.offsets = {Tensor<std::int32_t>(batch.concat(Extents{m + 1})),
                 Tensor<std::int32_t>(batch.concat(Extents{m + 1}))};
  detail::SegmentRuns q_runs, kv_runs;
  const bool q_unit = src[0].step == 1 && src[2].step == 1;
  const bool kv_unit = src[1].step == 1 && src[3].step == 1;
  const bool self_attention =
      detail::same_view(segment_ids.q, segment_ids.kv) && detail::same_view(segment_pos.q, segment_pos.kv);
  for (index_t r = 0; r < rows; ++r) {
    const detail::ThdRowOutput row_out{out.seqlens.q.data() + r * m, out.seqlens.kv.data() + r * m,
                                       out.offsets.q.data() + r * (m + 1), out.offsets.kv.data() + r * (m + 1)};
    if (q_unit && kv_unit) {
      detail::thd_row_dispatched<true, true>(src, r, mask, m, gaps, self_attention, q_runs, kv_runs, row_out);
    } else if (q_unit) {
      detail::thd_row_dispatched<true, false>(src, r, mask, m, gaps, self_attention, q_runs, kv_runs, row_out);
    } else if (kv_unit) {
      detail::thd_row_dispatched<false, true>(src, r, mask, m, gaps, self_attention, q_runs, kv_runs, row_out);
    } else {
      detail::thd_row_dispatched<false, false>(src, r, mask, m, gaps, self_attention, q_runs, kv_runs, row_out);
    }
  }
  return out;
}

// Self-attention: the same ids and positions for q and kv.
inline SeqlensAndOffsets derive_seqlens_and_offsets(Int32View segment_ids, Int32View segment_pos, AttnMaskType mask,
                                                    SeqLayout layout, WindowSize window = {},
                                                    int max_segments_per_seq = 1,
                                                    SegmentIdGaps gaps = SegmentIdGaps::reject) {
  return derive_seqlens_and_offsets({segment_ids, segment_ids}, {segment_pos, segment_pos}, mask, layout, window,
                                    max_segments_per_seq, gaps);
}

}  // namespace seqattn
