// Vmapped sequence descriptors end to end (docs/semantics/sequence-descriptors.md §3,
// TransformerEngine issue #2685 / PR #2692).
//
// A function vmapped over V examples sees segment ids with an extra leading
// dim, (V, B, S), while positions built once outside stay (B, S): the extra
// dims broadcast against the shared positions. TE's old shape assert fired
// here, and even after PR #2692 only BSHD worked end to end (THD still asserts
// a single batch dim in the primitive). Both layouts run here:
//
//   bshd: q, k, v [*E, B, S, H, D] are attention over prod(E)*B rows; the mask
//         is the library's DocumentMask<CausalMask> over the ids (with the
//         broadcast positions), so cross-document and padding tiles are skipped;
//   thd:  SequenceDescriptor::from_segment_ids_and_pos -> get_seqlens_and_offsets
//         (padding_causal, THD, max_segments_per_seq) -> pack_segments gives a
//         SegmentTable over the flat prod(E)*B*S token axis, and every segment
//         is a causal sequence of its own.
//
// Both equal TE's dense reference (§4.1 there): token i sees j iff they are in the
// same row, ids[i] == ids[j] != 0 and pos[i] >= pos[j]. Padding tokens (id 0)
// get output 0 and LSE -inf.
//
// Broadcasting positions is only meaningful when every slice shares the
// segmentation or the positions count tokens within the row (TE's default
// arange, the #2685 case); the examples use the latter.
#pragma once

#include <cstdint>
#include <utility>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors.hpp"
#include "seqattn/masks/document.hpp"
#include "seqattn/masks/structural.hpp"
#include "seqattn/scenarios/attend.hpp"

namespace seqattn::scenarios::vmapped {

namespace detail {

// q, k, v [*E, B, S, H, D] as [rows, S, H, D] (contiguous inputs only).
inline TensorView<const float> as_rows(TensorView<const float> x, const char* name) {
  seqattn::detail::require(x.rank() >= 4 && x.is_contiguous(), "vmapped: ", name,
                           " must be a contiguous [*E, B, S, H, D] tensor, got shape ", x.shape());
  Extents shape;
  shape.push_back(x.shape().drop_last(3).size());
  for (int d = x.rank() - 3; d < x.rank(); ++d) shape.push_back(x.extent(d));
  return x.reshape(shape);
}

inline void check_ids(TensorView<const float> q, TensorView<const std::int32_t> ids) {
  seqattn::detail::require(q.rank() >= 4, "vmapped: q must be a contiguous [*E, B, S, H, D] tensor, got shape ",
                           q.shape());
  seqattn::detail::require(ids.shape() == q.shape().drop_last(2),
                           "vmapped: segment_ids must have shape (*E, B, S) = ", q.shape().drop_last(2), " to match q ",
                           q.shape(), ", got ", ids.shape());
}

}  // namespace detail

// BSHD: out [*E, B, S, H, D] and lse [*E, B, S, H] (as AttentionOutput with
// those shapes). positions: (B, S) or any (*E', B, S) with E' a suffix of E.
template <class Exec = execution::Serial>
AttentionOutput attend_bshd(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                            TensorView<const std::int32_t> segment_ids, TensorView<const std::int32_t> positions,
                            float scale, Exec&& exec = Exec{}) {
  detail::check_ids(q, segment_ids);
  const auto qr = detail::as_rows(q, "q"), kr = detail::as_rows(k, "k"), vr = detail::as_rows(v, "v");
  const index_t rows = qr.extent(0), s = qr.extent(1), h = qr.extent(2), dv = vr.extent(3);
  const DocumentLayout layout = DocumentLayout::from_segment_ids(segment_ids, positions);
  const auto mask = document_mask(layout, CausalMask{});
  AttentionOutput r{Tensor<float>(q.shape().drop_last(1).concat(seqattn::detail::make_extents({dv}))),
                    Tensor<float>(q.shape().drop_last(1))};
  Extents out_shape, lse_shape, lse_strides;
  for (index_t d : {rows, s, h, dv}) out_shape.push_back(d);
  for (index_t d : {rows, h, s}) lse_shape.push_back(d);
  for (index_t d : {s * h, index_t{1}, h}) lse_strides.push_back(d);
  AttentionOptions options;
  options.scale = scale;
  attention_forward<backends::Highway>(AttentionInputs<float>{qr, kr, vr}, mask, r.out.view().reshape(out_shape),
                                       TensorView<float>(r.lse.data(), lse_shape, lse_strides), options,
                                       std::forward<Exec>(exec));
  return r;
}

// The packed descriptors of vmapped ids: padding_causal, THD, with up to
// max_segments_per_seq segments per row.
inline PackedSegments packed_descriptors(TensorView<const std::int32_t> segment_ids,
                                         TensorView<const std::int32_t> positions, int max_segments_per_seq) {
  const SequenceDescriptor desc = SequenceDescriptor::from_segment_ids_and_pos(segment_ids, positions);
  return pack_segments(
      desc.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, max_segments_per_seq));
}

// THD: the same attention through derived, packed descriptors. Output shapes
// as attend_bshd; tokens outside every segment (padding) get 0 / -inf.
template <class Exec = execution::Serial>
AttentionOutput attend_thd(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                           TensorView<const std::int32_t> segment_ids, TensorView<const std::int32_t> positions,
                           float scale, int max_segments_per_seq, Exec&& exec = Exec{}) {
  detail::check_ids(q, segment_ids);
  const auto qr = detail::as_rows(q, "q"), kr = detail::as_rows(k, "k"), vr = detail::as_rows(v, "v");
  const index_t tokens = qr.extent(0) * qr.extent(1);
  const auto flat = [&](TensorView<const float> x) {
    Extents shape;
    for (index_t d : {tokens, x.extent(2), x.extent(3)}) shape.push_back(d);
    return x.reshape(shape);
  };
  const PackedSegments packed = packed_descriptors(segment_ids, positions, max_segments_per_seq);
  const SegmentTable table = packed.table();
  const AttentionOutput flat_out =
      scenarios::attend_thd(flat(qr), flat(kr), flat(vr), table, scale, CausalMask{}, std::forward<Exec>(exec));
  return {Tensor<float>(q.shape().drop_last(1).concat(seqattn::detail::make_extents({v.extent(-1)})),
                        std::vector<float>(flat_out.out.values().begin(), flat_out.out.values().end())),
          Tensor<float>(q.shape().drop_last(1),
                        std::vector<float>(flat_out.lse.values().begin(), flat_out.lse.values().end()))};
}

}  // namespace seqattn::scenarios::vmapped
