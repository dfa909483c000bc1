// Batch rows of segment-id / position inputs: shape checks, broadcasting of
// extra leading ("vmapped") dimensions, and the row context every error
// message carries.
#pragma once

#include <cstdint>
#include <string>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/types.hpp"

namespace seqattn::detail {

// "(1, 0)": the multi-index of flat row `r` over a batch shape.
inline std::string multi_index_string(const Extents& batch_shape, index_t r) {
  Extents idx = batch_shape;
  for (int d = batch_shape.rank() - 1; d >= 0; --d) {
    const index_t n = batch_shape[d];
    idx[d] = n > 0 ? r % n : 0;
    r = n > 0 ? r / n : 0;
  }
  std::string s = "(";
  for (int d = 0; d < idx.rank(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + (idx.rank() == 1 ? ",)" : ")");
}

// A view seen as rows along its last axis. Leading dimensions (the batch
// shape) are flattened row-major; the view may have any strides.
struct RowSource {
  const char* name = "";
  TensorView<const std::int32_t> view;
  Extents batch_shape;  // view.shape()[:-1]
  index_t rows = 0;     // prod(batch_shape)
  index_t len = 0;      // tokens per row
  index_t step = 1;     // stride of the token axis

  RowSource() = default;
  RowSource(const char* arg_name, TensorView<const std::int32_t> v)
      : name(arg_name),
        view(v),
        batch_shape(v.shape().drop_last(1)),
        rows(batch_shape.size()),
        len(v.extent(-1)),
        step(v.stride(-1)) {}

  const std::int32_t* row(index_t r) const {
    const std::int32_t* p = view.data();
    for (int d = batch_shape.rank() - 1; d >= 0; --d) {
      const index_t n = batch_shape[d];
      p += (r % n) * view.stride(d);
      r /= n;
    }
    return p;
  }

  // "q_segment_ids of shape (2, 1, 8), row 1 (index (1, 0))" for a row of this input.
  std::string where(index_t r) const {
    std::string s = concat(name, " of shape ", view.shape(), ", row ", r);
    if (batch_shape.rank() > 1) s += concat(" (index ", multi_index_string(batch_shape, r), ")");
    return s;
  }
};

// Every input's batch shape is a suffix of the output batch shape, so output
// row r reads row r % rows of each input: that is the broadcast of positions
// over extra dims and of a side without extras over the other side's extras.
inline index_t source_row(const RowSource& src, index_t out_row) { return out_row % src.rows; }

// The shape rules of TE PR #2692 (docs/semantics/sequence-descriptors.md §3), extended:
//   ids (*E, B, T); pos = any trailing part of the ids shape with the token
//   axis, broadcast over the rest; q and kv agree on B, and their extras E
//   are equal or one is a suffix of the other (e.g. absent), in which case
//   the shorter side is shared by every slice of the longer one.
// Returns the output batch shape (*E, B).
inline Extents check_segment_shapes(const QkvPair<TensorView<const std::int32_t>>& ids,
                                    const QkvPair<TensorView<const std::int32_t>>& pos) {
  const auto shapes = [&] {
    return concat("q_segment_ids.shape=", ids.q.shape(), ", q_segment_pos.shape=", pos.q.shape(),
                  ", kv_segment_ids.shape=", ids.kv.shape(), ", kv_segment_pos.shape=", pos.kv.shape());
  };
  // Extents non-negative and sizes within limits::kMaxTensorElements: views
  // may be broadcast (stride 0) far beyond any memory a copy could take.
  checked_tensor_size(ids.q.shape(), "q_segment_ids");
  checked_tensor_size(ids.kv.shape(), "kv_segment_ids");
  checked_tensor_size(pos.q.shape(), "q_segment_pos");
  checked_tensor_size(pos.kv.shape(), "kv_segment_pos");
  require(ids.q.rank() >= 2 && ids.kv.rank() >= 2,
          "segment_ids must have at least two dims (batch, tokens) plus any extra leading dims; got ", shapes());
  require(ids.q.rank() >= pos.q.rank() && ids.kv.rank() >= pos.kv.rank(),
          "segment_ids must not have fewer dims than segment_pos; got q_segment_ids.ndim=", ids.q.rank(),
          ", q_segment_pos.ndim=", pos.q.rank(), ", kv_segment_ids.ndim=", ids.kv.rank(),
          ", kv_segment_pos.ndim=", pos.kv.rank(), " (", shapes(), ")");
  require(pos.q.rank() >= 1 && pos.kv.rank() >= 1,
          "segment_pos must have at least the token dim (positions are mandatory); got ", shapes());
  require(ids.q.shape().last(pos.q.rank()) == pos.q.shape() && ids.kv.shape().last(pos.kv.rank()) == pos.kv.shape(),
          "segment_pos trailing shape must match segment_ids; got ", shapes());
  require(ids.q.extent(-2) == ids.kv.extent(-2), "q_segment_ids and kv_segment_ids must have the same batch size B (",
          ids.q.extent(-2), " vs ", ids.kv.extent(-2), "); got ", shapes());
  const Extents q_extra = ids.q.shape().drop_last(2);
  const Extents kv_extra = ids.kv.shape().drop_last(2);
  const Extents& longer = q_extra.rank() >= kv_extra.rank() ? q_extra : kv_extra;
  const Extents& shorter = q_extra.rank() >= kv_extra.rank() ? kv_extra : q_extra;
  require(longer.last(shorter.rank()) == shorter,
          "extra (vmapped) batch dims of q_segment_ids and kv_segment_ids disagree: q_segment_ids.shape=",
          ids.q.shape(), " has extras ", q_extra, ", kv_segment_ids.shape=", ids.kv.shape(), " has extras ", kv_extra,
          "; they must be equal, or one side's extras a trailing part of the other's (then it is shared by every "
          "slice)");
  return longer.concat(Extents{ids.q.extent(-2)});
}

}  // namespace seqattn::detail
