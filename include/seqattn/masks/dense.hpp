// Explicit masks: a dense bool (or any 0/1) array, or FlashInfer-style packed bits.
//
// DenseMask<T> views an array of shape (Q, KV), (B, Q, KV) or
// (*E, B, H, Q, KV) (strides honoured, so a stride-0 dim broadcasts). The
// leading dims flatten to MaskContext.batch; a leading or head extent of 1
// broadcasts. Sequence b uses the top-left q_len x kv_len corner, so a ragged
// batch can share one padded array. Non-zero = allowed.
//
// PackedMask is FlashInfer's bit-packed custom mask (segment_packbits with
// bitorder="little"): for each (sequence, head) the row-major q_len x kv_len
// matrix is packed 8 elements per byte, element i at bit i % 8 of byte i / 8,
// each segment padded to a whole byte; indptr holds the byte offset of each
// segment (ragged). DenseBitsMask reads it back as a description.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

template <class T = bool>
struct DenseMask {
  TensorView<const T> values;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return values.data()[offset(ctx) + q * values.stride(-2) + kv * values.stride(-1)] != T{};
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }

  void check(const RaggedLengths& lengths, index_t heads) const {
    const int r = values.rank();
    detail::require(r >= 2, "DenseMask: values must have shape (Q, KV), (B, Q, KV) or ", "(*E, B, H, Q, KV), got ",
                    values.shape());
    const index_t batch = leading_batch();
    detail::require(batch == 1 || batch == lengths.batch(), "DenseMask: values of shape ", values.shape(), " hold ",
                    batch, " sequences but the batch has ", lengths.batch());
    if (r >= 4) {
      detail::require(values.extent(-3) == 1 || values.extent(-3) == heads, "DenseMask: values of shape ",
                      values.shape(), " hold ", values.extent(-3), " heads but attention has ", heads);
    }
    for (index_t b = 0; b < lengths.batch(); ++b) {
      detail::require(lengths.q[static_cast<std::size_t>(b)] <= values.extent(-2) &&
                          lengths.kv[static_cast<std::size_t>(b)] <= values.extent(-1),
                      "DenseMask: sequence ", b, " has lengths (", lengths.q[static_cast<std::size_t>(b)], ", ",
                      lengths.kv[static_cast<std::size_t>(b)], ") but values have shape ", values.shape());
    }
  }

 private:
  int batch_dims() const { return values.rank() == 2 ? 0 : values.rank() == 3 ? 1 : values.rank() - 3; }
  index_t leading_batch() const { return values.shape().first(batch_dims()).size(); }
  index_t offset(const MaskContext& ctx) const {
    index_t off = 0;
    index_t b = leading_batch() == 1 ? 0 : ctx.batch;
    for (int d = batch_dims() - 1; d >= 0; --d) {
      off += (b % values.extent(d)) * values.stride(d);
      b /= values.extent(d);
    }
    if (values.rank() >= 4 && values.extent(-3) > 1) off += ctx.head * values.stride(-3);
    return off;
  }
};

template <class T>
DenseMask(TensorView<const T>) -> DenseMask<T>;

struct PackedMaskView {
  index_t heads = 1;  // stored heads: 1 when the source mask was head-invariant
  std::span<const std::uint8_t> bits;
  std::span<const index_t> indptr;  // batch * heads + 1 byte offsets
};

// Owning bit-packed mask (FlashInfer layout).
struct PackedMask {
  RaggedLengths lengths;
  index_t heads = 1;
  std::vector<std::uint8_t> bits;
  std::vector<index_t> indptr{0};

  PackedMaskView view() const { return {heads, bits, indptr}; }
};

// Reads a PackedMask back as a description.
struct DenseBitsMask {
  PackedMaskView packed;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const index_t seg = ctx.batch * packed.heads + (packed.heads == 1 ? 0 : ctx.head);
    const index_t i = q * ctx.kv_len + kv;
    return (packed.bits[static_cast<std::size_t>(packed.indptr[static_cast<std::size_t>(seg)] + i / 8)] >> (i % 8)) &
           1u;
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
  void check(const RaggedLengths& lengths, index_t heads) const {
    detail::require(static_cast<index_t>(packed.indptr.size()) == lengths.batch() * packed.heads + 1,
                    "DenseBitsMask: indptr has ", packed.indptr.size(), " entries but ", lengths.batch(),
                    " sequences x ", packed.heads, " heads need ", lengths.batch() * packed.heads + 1);
    detail::require(packed.heads == 1 || packed.heads == heads, "DenseBitsMask: packed for ", packed.heads,
                    " heads but attention has ", heads);
    for (index_t s = 0; s + 1 < static_cast<index_t>(packed.indptr.size()); ++s) {
      const index_t b = s / packed.heads;
      const index_t need = (lengths.q[static_cast<std::size_t>(b)] * lengths.kv[static_cast<std::size_t>(b)] + 7) / 8;
      detail::require(
          packed.indptr[static_cast<std::size_t>(s) + 1] - packed.indptr[static_cast<std::size_t>(s)] == need,
          "DenseBitsMask: segment ", s, " holds ",
          packed.indptr[static_cast<std::size_t>(s) + 1] - packed.indptr[static_cast<std::size_t>(s)],
          " bytes but sequence ", b, " of lengths (", lengths.q[static_cast<std::size_t>(b)], ", ",
          lengths.kv[static_cast<std::size_t>(b)], ") needs ", need);
    }
  }
};

}  // namespace seqattn
