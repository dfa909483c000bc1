// Packing per-row descriptors into what a fused kernel consumes (docs/semantics/sequence-descriptors.md §2.8):
// segments on the flat (rows * S) token axis, as global offsets, lengths and
// cu_seqlens, plus a SegmentTable view for seqattn's attention engine.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/derive.hpp"
#include "seqattn/descriptors/types.hpp"

namespace seqattn {

// Owning packed descriptors. For THD (rows = prod(*E, B), M slots per row):
//   seqlens    (*E, B, M):   positive lengths first in batch order, then 0
//                            (cuDNN >= 9.3 fill);
//   offsets    (*E, B, M+1): global start of each of those segments on the
//                            flat token axis (row r starts at r * S), then
//                            rows * S;
//   cu_seqlens (rows*M + 1,): [0, cumsum(seqlens)].
// For BSHD every row is one segment: seqlens (*E, B) unchanged, offsets
// (*E, B) = r * S, cu_seqlens (rows + 1,).
// The i-th q segment and the i-th kv segment belong together; num_segments
// is the same for both.
struct PackedSegments {
  SeqLayout layout = SeqLayout::thd;
  QkvPair<Tensor<std::int32_t>> seqlens;
  QkvPair<Tensor<std::int32_t>> offsets;
  QkvPair<Tensor<std::int32_t>> cu_seqlens;
  QkvPair<index_t> total_tokens{0, 0};  // rows * S: the flat token axis
  index_t num_segments = 0;

  // The first num_segments entries, as the attention engine consumes them.
  SegmentTable table() const {
    const auto n = static_cast<std::size_t>(num_segments);
    return {offsets.q.values().first(n), seqlens.q.values().first(n), offsets.kv.values().first(n),
            seqlens.kv.values().first(n)};
  }
};

namespace detail {

struct RowSegment {
  std::int32_t offset;
  std::int32_t length;
};

// The segments of one row of (seqlens, offsets): the i-th positive length
// with the i-th non-negative offset (TE's pairing), checked so that the
// pairing is right: as many offsets as lengths (start offsets only; the
// end-offset convention of TE's docstring fails here, docs/semantics/sequence-descriptors.md §6 D2), in order,
// non-overlapping, inside [0, S).
inline void row_segments(const std::int32_t* lens, index_t n_lens, const std::int32_t* offs, index_t n_offs,
                         index_t seq_len, const char* label, index_t row, const Extents& batch,
                         std::vector<RowSegment>& out) {
  out.clear();
  index_t n_pos = 0, n_nonneg = 0;
  for (index_t k = 0; k < n_lens; ++k) n_pos += lens[k] > 0;
  for (index_t k = 0; k < n_offs; ++k) n_nonneg += offs[k] >= 0;
  // The row context of a message, built only when a check fails (this runs
  // once per row on the success path).
  const auto where = [&] {
    std::string s = concat(label, " row ", row);
    if (batch.rank() > 1) s += concat(" (index ", multi_index_string(batch, row), ")");
    return s;
  };
  if (n_pos != n_nonneg) {
    throw_invalid(where(), ": ", n_nonneg, " non-negative offsets for ", n_pos,
                  " positive seqlens; offsets must hold segment starts only (one per non-empty segment, -1 elsewhere)");
  }
  index_t k_off = 0;
  std::int64_t end_of_previous = 0;
  for (index_t k = 0; k < n_lens; ++k) {
    if (lens[k] <= 0) continue;
    while (offs[k_off] < 0) ++k_off;
    const std::int32_t off = offs[k_off++];
    if (off < end_of_previous || std::int64_t{off} + lens[k] > seq_len) {
      throw_invalid(where(), ": segment of length ", lens[k], " at offset ", off,
                    " overlaps the previous segment (ending at ", end_of_previous, ") or leaves the row of ", seq_len,
                    " tokens");
    }
    end_of_previous = std::int64_t{off} + lens[k];
    out.push_back({off, lens[k]});
  }
}

// rows * seq_len (checked: both may be huge) must fit int32 global offsets.
inline void require_int32_tokens(index_t rows, index_t seq_len, const char* side) {
  index_t total = 0;
  if (!mul_fits(rows, seq_len, total) || total > std::numeric_limits<std::int32_t>::max()) {
    throw_invalid(side, ": ", rows, " rows of ", seq_len,
                  " tokens overflow int32 global offsets (at most 2^31 - 1 "
                  "tokens in all)");
  }
}

}  // namespace detail

// Packs derived (or user-supplied) descriptors. seq_len gives S for q and kv;
// defaults to the descriptor's own (known when derived from segment ids).
inline PackedSegments pack_segments(const SeqlensAndOffsets& d, QkvPair<index_t> seq_len = {-1, -1}) {
  if (seq_len.q < 0) seq_len.q = d.seq_len.q;
  if (seq_len.kv < 0) seq_len.kv = d.seq_len.kv;
  detail::require(seq_len.q >= 0 && seq_len.kv >= 0,
                  "pack_segments: tokens per row (S) unknown for a descriptor built from seqlens; pass seq_len");
  PackedSegments p;
  p.layout = d.layout;
  const Tensor<std::int32_t>* lens[2] = {&d.seqlens.q, &d.seqlens.kv};
  const Tensor<std::int32_t>* offs[2] = {&d.offsets.q, &d.offsets.kv};
  Tensor<std::int32_t>* out_lens[2] = {&p.seqlens.q, &p.seqlens.kv};
  Tensor<std::int32_t>* out_offs[2] = {&p.offsets.q, &p.offsets.kv};
  Tensor<std::int32_t>* out_cu[2] = {&p.cu_seqlens.q, &p.cu_seqlens.kv};
  const index_t s_len[2] = {seq_len.q, seq_len.kv};
  const char* side[2] = {"q", "kv"};
  const char* label[2] = {"q_seqlens / q_offsets", "kv_seqlens / kv_offsets"};
  detail::require(d.seqlens.q.shape() == d.seqlens.kv.shape(), "pack_segments: q_seqlens shape ", d.seqlens.q.shape(),
                  " and kv_seqlens shape ", d.seqlens.kv.shape(), " differ");

  if (d.layout == SeqLayout::bshd) {
    const index_t rows = d.seqlens.q.size();
    for (int sd = 0; sd < 2; ++sd) {
      detail::require_int32_tokens(rows, s_len[sd], side[sd]);
      *out_lens[sd] = *lens[sd];
      *out_offs[sd] = Tensor<std::int32_t>(lens[sd]->shape());
      *out_cu[sd] = Tensor<std::int32_t>(Extents{rows + 1});
      for (index_t r = 0; r < rows; ++r) {
        const std::int32_t len = lens[sd]->data()[r];
        detail::require(len >= 0 && len <= s_len[sd], side[sd], "_seqlens row ", r, ": length ", len, " outside [0, ",
                        s_len[sd], "]");
        out_offs[sd]->data()[r] = static_cast<std::int32_t>(r * s_len[sd]);
        out_cu[sd]->data()[r + 1] = out_cu[sd]->data()[r] + len;
      }
      (sd == 0 ? p.total_tokens.q : p.total_tokens.kv) = rows * s_len[sd];
    }
    p.num_segments = rows;
    return p;
  }

  detail::require(d.seqlens.q.rank() >= 2, "pack_segments: THD seqlens must be (*E, B, M), got ", d.seqlens.q.shape());
  const Extents batch = d.seqlens.q.shape().drop_last(1);
  const index_t rows = batch.size(), m = d.seqlens.q.extent(-1);
  for (int sd = 0; sd < 2; ++sd) {
    detail::require(offs[sd]->shape().drop_last(1) == batch && offs[sd]->rank() >= 2, "pack_segments: ", side[sd],
                    "_offsets must be (*E, B, N) with (*E, B) = ", batch, ", got ", offs[sd]->shape());
    detail::require_int32_tokens(rows, s_len[sd], side[sd]);
  }
  std::vector<detail::RowSegment> q_row, kv_row;
  std::vector<detail::RowSegment>* row_segs[2] = {&q_row, &kv_row};
  for (int sd = 0; sd < 2; ++sd) {
    *out_lens[sd] = Tensor<std::int32_t>(lens[sd]->shape(), 0);
    *out_offs[sd] = Tensor<std::int32_t>(offs[sd]->shape(), static_cast<std::int32_t>(rows * s_len[sd]));
    *out_cu[sd] = Tensor<std::int32_t>(Extents{rows * m + 1}, 0);
    (sd == 0 ? p.total_tokens.q : p.total_tokens.kv) = rows * s_len[sd];
  }
  index_t n = 0;
  for (index_t r = 0; r < rows; ++r) {
    for (int sd = 0; sd < 2; ++sd) {
      detail::row_segments(lens[sd]->data() + r * m, m, offs[sd]->data() + r * offs[sd]->extent(-1),
                           offs[sd]->extent(-1), s_len[sd], label[sd], r, batch, *row_segs[sd]);
    }
    detail::require(q_row.size() == kv_row.size(), "pack_segments: row ", r, " has ", q_row.size(),
                    " non-empty q segments but ", kv_row.size(),
                    " non-empty kv segments; the i-th q segment pairs with the i-th kv segment");
    for (std::size_t i = 0; i < q_row.size(); ++i, ++n) {
      for (int sd = 0; sd < 2; ++sd) {
        const detail::RowSegment seg = (*row_segs[sd])[i];
        out_lens[sd]->data()[n] = seg.length;
        out_offs[sd]->data()[n] = static_cast<std::int32_t>(r * s_len[sd] + seg.offset);
      }
    }
  }
  for (int sd = 0; sd < 2; ++sd) {
    for (index_t i = 0; i < rows * m; ++i) out_cu[sd]->data()[i + 1] = out_cu[sd]->data()[i] + out_lens[sd]->data()[i];
  }
  p.num_segments = n;
  return p;
}

struct SegmentIdsAndPos {
  Tensor<std::int32_t> segment_ids;
  Tensor<std::int32_t> segment_pos;
};

// The inverse direction: segment ids (1, 2, ... per row, 0 = padding) and
// positions (0, 1, ... within each segment, 0 on padding) of shape (*E, B, S)
// from THD seqlens (*E, B, N) and start offsets (*E, B, N'), one side.
inline SegmentIdsAndPos segment_ids_from_seqlens_and_offsets(Int32View seqlens, Int32View offsets, index_t seq_len) {
  detail::require(seqlens.rank() >= 2 && offsets.rank() == seqlens.rank() &&
                      offsets.shape().drop_last(1) == seqlens.shape().drop_last(1),
                  "segment_ids_from_seqlens_and_offsets: seqlens (*E, B, N) and offsets (*E, B, N') must share "
                  "(*E, B); got seqlens ",
                  seqlens.shape(), " and offsets ", offsets.shape());
  detail::require(seq_len >= 0 && seq_len <= std::numeric_limits<std::int32_t>::max(),
                  "segment_ids_from_seqlens_and_offsets: seq_len must be in [0, 2^31 - 1] (positions are int32), got ",
                  seq_len);
  const Tensor<std::int32_t> lens = to_tensor(seqlens), offs = to_tensor(offsets);
  const Extents batch = seqlens.shape().drop_last(1);
  const Extents out_shape = batch.concat(Extents{seq_len});
  Tensor<std::int32_t> ids(out_shape, 0), pos(out_shape, 0);
  std::vector<detail::RowSegment> segs;
  const index_t n = seqlens.extent(-1), n_offs = offsets.extent(-1);
  for (index_t r = 0; r < batch.size(); ++r) {
    detail::row_segments(lens.data() + r * n, n, offs.data() + r * n_offs, n_offs, seq_len, "seqlens / offsets", r,
                         batch, segs);
    std::int32_t* id_row = ids.data() + r * seq_len;
    std::int32_t* pos_row = pos.data() + r * seq_len;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      for (std::int32_t t = 0; t < segs[i].length; ++t) {
        id_row[segs[i].offset + t] = static_cast<std::int32_t>(i + 1);
        pos_row[segs[i].offset + t] = t;
      }
    }
  }
  return {std::move(ids), std::move(pos)};
}

}  // namespace seqattn
