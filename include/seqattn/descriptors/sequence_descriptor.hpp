// SequenceDescriptor: TransformerEngine's description of which tokens of a
// batch are real and how they group into sequences (docs/semantics/sequence-descriptors.md §1.2), built from
//   - seqlens (BSHD: one right-padded sequence per row),
//   - seqlens + start offsets (THD: several segments packed per row), or
//   - segment ids + positions (either layout; positions are mandatory).
// get_seqlens_and_offsets() turns any of them into per-row seqlens/offsets;
// pack_segments() (packing.hpp) then gives what a fused kernel consumes.
#pragma once

#include <cstdint>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/derive.hpp"
#include "seqattn/descriptors/detail/rows.hpp"
#include "seqattn/descriptors/types.hpp"

namespace seqattn {

// Owning: the constructors copy their inputs, so a descriptor outlives them.
// Each field is a (q, kv) pair; single-tensor overloads use it for both.
class SequenceDescriptor {
 public:
  enum class Source : std::uint8_t { seqlens, seqlens_and_offsets, segment_ids_and_pos };

  // BSHD lengths, shape (*E, B), each in [0, S].
  static SequenceDescriptor from_seqlens(const QkvPair<Int32View>& seqlens) {
    detail::require(seqlens.q.rank() >= 1 && seqlens.q.shape() == seqlens.kv.shape(),
                    "from_seqlens: q_seqlens and kv_seqlens must share a shape (*E, B); got ", seqlens.q.shape(),
                    " and ", seqlens.kv.shape());
    require_non_negative(seqlens.q, "q_seqlens");
    require_non_negative(seqlens.kv, "kv_seqlens");
    SequenceDescriptor d(Source::seqlens);
    d.seqlens_ = {to_tensor(seqlens.q), to_tensor(seqlens.kv)};
    return d;
  }
  static SequenceDescriptor from_seqlens(Int32View seqlens) { return from_seqlens({seqlens, seqlens}); }

  // THD lengths (*E, B, N) (unused slots -1 or 0) and segment *start* offsets
  // within the row (*E, B, N+1) (unused slots -1). TE's docstring example with
  // an extra end offset misaligns later rows; pack_segments rejects it.
  static SequenceDescriptor from_seqlens_and_offsets(const QkvPair<Int32View>& seqlens,
                                                     const QkvPair<Int32View>& offsets) {
    const auto check = [](const Int32View& lens, const Int32View& offs, const char* side) {
      detail::require(lens.rank() >= 2 && offs.rank() == lens.rank() &&
                          offs.shape().drop_last(1) == lens.shape().drop_last(1) &&
                          offs.extent(-1) == lens.extent(-1) + 1,
                      "from_seqlens_and_offsets: ", side, "_seqlens must be (*E, B, N) and ", side,
                      "_seq_offsets (*E, B, N+1); got ", lens.shape(), " and ", offs.shape());
    };
    check(seqlens.q, offsets.q, "q");
    check(seqlens.kv, offsets.kv, "kv");
    detail::require(seqlens.q.shape() == seqlens.kv.shape(),
                    "from_seqlens_and_offsets: q_seqlens and kv_seqlens must share a shape; got ", seqlens.q.shape(),
                    " and ", seqlens.kv.shape());
    SequenceDescriptor d(Source::seqlens_and_offsets);
    d.seqlens_ = {to_tensor(seqlens.q), to_tensor(seqlens.kv)};
    d.offsets_ = {to_tensor(offsets.q), to_tensor(offsets.kv)};
    return d;
  }
  static SequenceDescriptor from_seqlens_and_offsets(Int32View seqlens, Int32View offsets) {
    return from_seqlens_and_offsets({seqlens, seqlens}, {offsets, offsets});
  }

  // Segment ids (*E, B, T) (0 = padding, segments 1, 2, ... per row) and
  // positions within the segment, shaped like a trailing part of the ids
  // (broadcast over the rest, e.g. over vmapped extras). Shapes are checked
  // here; ids are checked against the layout and max_segments_per_seq when
  // seqlens are derived.
  static SequenceDescriptor from_segment_ids_and_pos(const QkvPair<Int32View>& segment_ids,
                                                     const QkvPair<Int32View>& segment_pos) {
    detail::check_segment_shapes(segment_ids, segment_pos);
    SequenceDescriptor d(Source::segment_ids_and_pos);
    d.ids_ = {to_tensor(segment_ids.q), to_tensor(segment_ids.kv)};
    d.pos_ = {to_tensor(segment_pos.q), to_tensor(segment_pos.kv)};
    return d;
  }
  // Self-attention: q and kv share one copy (and the derivation knows it).
  static SequenceDescriptor from_segment_ids_and_pos(Int32View segment_ids, Int32View segment_pos) {
    detail::check_segment_shapes({segment_ids, segment_ids}, {segment_pos, segment_pos});
    SequenceDescriptor d(Source::segment_ids_and_pos);
    d.ids_ = {to_tensor(segment_ids), Tensor<std::int32_t>()};
    d.pos_ = {to_tensor(segment_pos), Tensor<std::int32_t>()};
    d.ids_.kv = d.ids_.q;
    d.pos_.kv = d.pos_.q;
    d.shared_ = true;
    return d;
  }

  Source source() const { return source_; }
  const QkvPair<Tensor<std::int32_t>>& seqlens() const { return seqlens_; }
  const QkvPair<Tensor<std::int32_t>>& seq_offsets() const { return offsets_; }
  const QkvPair<Tensor<std::int32_t>>& segment_ids() const { return ids_; }
  const QkvPair<Tensor<std::int32_t>>& segment_pos() const { return pos_; }

  // Segment ids take priority; a descriptor built from seqlens returns them
  // unchanged (seq_len unknown), after checking they suit the layout.
  // `gaps` applies to segment ids only (types.hpp).
  SeqlensAndOffsets get_seqlens_and_offsets(AttnMaskType mask, SeqLayout layout, WindowSize window = {},
                                            int max_segments_per_seq = 1,
                                            SegmentIdGaps gaps = SegmentIdGaps::reject) const {
    if (source_ == Source::segment_ids_and_pos) {
      const Int32View kv_ids = shared_ ? ids_.q.view() : ids_.kv.view();
      const Int32View kv_pos = shared_ ? pos_.q.view() : pos_.kv.view();
      return derive_seqlens_and_offsets({ids_.q.view(), kv_ids}, {pos_.q.view(), kv_pos}, mask, layout, window,
                                        max_segments_per_seq, gaps);
    }
    detail::require((layout == SeqLayout::thd) == (source_ == Source::seqlens_and_offsets),
                    "get_seqlens_and_offsets: a descriptor built ",
                    source_ == Source::seqlens ? "from_seqlens describes BSHD rows, not "
                                               : "from_seqlens_and_offsets describes THD, not ",
                    to_string(layout),
                    "; build THD descriptors with from_seqlens_and_offsets or from_segment_ids_and_pos");
    SeqlensAndOffsets out;
    out.layout = layout;
    out.seqlens = {seqlens_.q, seqlens_.kv};
    if (layout == SeqLayout::thd) {
      out.offsets = {offsets_.q, offsets_.kv};
    } else {
      out.offsets = {Tensor<std::int32_t>(Extents{0}), Tensor<std::int32_t>(Extents{0})};
    }
    return out;
  }

 private:
  explicit SequenceDescriptor(Source s) : source_(s) {}

  static void require_non_negative(const Int32View& v, const char* name) {
    const Tensor<std::int32_t> t = to_tensor(v);
    for (index_t i = 0; i < t.size(); ++i) {
      detail::require(t.data()[i] >= 0, name, " of shape ", v.shape(), ": negative length ", t.data()[i],
                      " at flat index ", i);
    }
  }

  Source source_;
  bool shared_ = false;  // q and kv segment ids / positions are the same tensors
  QkvPair<Tensor<std::int32_t>> seqlens_, offsets_, ids_, pos_;
};

}  // namespace seqattn
