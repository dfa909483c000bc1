// Top-k index masks (DeepSeek-V3.2 DSA lightning indexer,
// docs/semantics/multi-item-topk-kascade.md §B.3): each query row attends to its own set of
// at most k keys.
//
// Indices have shape (*E, B, t, k), int32, one set per query row of each
// sequence (MaskContext.batch is the flat index over (*E, B); ctx.q_len = t,
// ctx.kv_len = s). -1 is padding ("no index"), so rows may hold fewer than k
// keys; any other value outside [0, s) and any repeated index in a row is an
// error. The set is shared by all heads, as MaxText shares it.
//
// Also here: top_k with jax.lax.top_k's order (value descending in XLA's
// total order of floats: +0.0 above -0.0, NaN above +inf; ties by lower index
// first), and the additive top-k mask built by scatter
// (MaxText PR #4261): a fill plus O(b·t·k) writes, or O(b·t·k) writes alone
// when a buffer moves from one selection to the next (topk_rescatter_mask).
// The O(b·t·k·s) broadcast-compare form is kept only as
// detail::topk_broadcast_mask, the test oracle.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

struct TopKLayoutView {
  index_t batch = 0;                     // flat over (*E, B)
  index_t q_len = 0;                     // t
  index_t kv_len = 0;                    // s
  std::span<const index_t> row_offsets;  // batch * t + 1
  std::span<const std::int32_t> keys;    // each row's indices, sorted ascending, padding dropped

  std::span<const std::int32_t> row(index_t b, index_t q) const {
    const auto r = static_cast<std::size_t>(b * q_len + q);
    return keys.subspan(static_cast<std::size_t>(row_offsets[r]),
                        static_cast<std::size_t>(row_offsets[r + 1] - row_offsets[r]));
  }
};

// Owning, validated, per-row sorted top-k sets.
class TopKLayout {
 public:
  static TopKLayout from_indices(TensorView<const std::int32_t> indices, index_t kv_len) {
    detail::require(indices.rank() >= 3, "TopKLayout: indices must have shape (*E, B, t, k), got ", indices.shape());
    // Keys are int32 indices: a longer kv axis could not be addressed.
    detail::require(kv_len >= 0 && kv_len <= index_t{std::numeric_limits<std::int32_t>::max()} + 1,
                    "TopKLayout: kv_len must be in [0, 2^31] (indices are int32), got ", kv_len);
    TopKLayout l;
    l.batch_ = indices.shape().drop_last(2).size();
    l.q_len_ = indices.extent(-2);
    l.kv_len_ = kv_len;
    const index_t k = indices.extent(-1);
    const Tensor<std::int32_t> copy = indices.is_contiguous() ? Tensor<std::int32_t>{} : to_tensor(indices);
    const std::int32_t* data = indices.is_contiguous() ? indices.data() : copy.data();
    const index_t rows = l.batch_ * l.q_len_;
    detail::checked_size("TopKLayout: indices", limits::kMaxTensorElements, rows, k);
    l.row_offsets_.reserve(static_cast<std::size_t>(rows + 1));
    l.row_offsets_.push_back(0);
    l.keys_.reserve(static_cast<std::size_t>(rows * k));
    for (index_t r = 0; r < rows; ++r) {
      const auto begin = l.keys_.size();
      for (index_t j = 0; j < k; ++j) {
        const std::int32_t v = data[r * k + j];
        if (v == -1) continue;
        detail::require(v >= 0 && v < kv_len, "TopKLayout: indices of shape ", indices.shape(), ": row ", r, " entry ",
                        j, " is ", v, ", outside [0, ", kv_len, ") (use -1 for no index)");
        l.keys_.push_back(v);
      }
      std::sort(l.keys_.begin() + static_cast<std::ptrdiff_t>(begin), l.keys_.end());
      const auto dup = std::adjacent_find(l.keys_.begin() + static_cast<std::ptrdiff_t>(begin), l.keys_.end());
      detail::require(dup == l.keys_.end(), "TopKLayout: indices of shape ", indices.shape(), ": row ", r,
                      " repeats index ", dup == l.keys_.end() ? 0 : *dup);
      l.row_offsets_.push_back(static_cast<index_t>(l.keys_.size()));
    }
    return l;
  }

  TopKLayoutView view() const { return {batch_, q_len_, kv_len_, row_offsets_, keys_}; }
  RaggedLengths lengths() const { return RaggedLengths::uniform(batch_, q_len_, kv_len_); }

 private:
  index_t batch_ = 0, q_len_ = 0, kv_len_ = 0;
  std::vector<index_t> row_offsets_;
  std::vector<std::int32_t> keys_;
};

struct TopKMask {
  static constexpr bool head_invariant = true;
  TopKLayoutView layout;

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const auto row = layout.row(ctx.batch, q);
    return std::binary_search(row.begin(), row.end(), static_cast<std::int32_t>(kv));
  }

  // Scans the rows (two binary searches each): O(rows · log k) per tile.
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    bool any = false;
    bool all = true;
    for (index_t q = t.q_begin; q < t.q_end; ++q) {
      const index_t n = count_in(layout.row(ctx.batch, q), t.kv_begin, t.kv_end);
      any = any || n > 0;
      all = all && n == t.cols();
    }
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }

  // Hull of the rows' smallest and largest index.
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const {
    index_t lo = ctx.kv_len, hi = 0;
    for (index_t q = q_begin; q < q_end; ++q) {
      const auto row = layout.row(ctx.batch, q);
      if (row.empty()) continue;
      lo = std::min<index_t>(lo, row.front());
      hi = std::max<index_t>(hi, row.back() + 1);
    }
    return lo < hi ? KvSpan{lo, hi, 0, 0} : KvSpan{};
  }

  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end, std::uint64_t* words) const {
    const auto row = layout.row(ctx.batch, q);
    for (auto it = std::lower_bound(row.begin(), row.end(), static_cast<std::int32_t>(kv_begin));
         it != row.end() && *it < kv_end; ++it) {
      const index_t c = *it - kv_begin;
      words[c / 64] |= std::uint64_t{1} << (c % 64);
    }
  }

  void check(const RaggedLengths& lengths, index_t) const {
    detail::require_fixed_lengths(
        lengths, "TopKMask", layout.batch,
        [&] {
          return detail::concat("indices cover ", layout.batch, " sequences (flat over the extra and batch dims)");
        },
        [&](index_t) { return std::make_pair(layout.q_len, layout.kv_len); },
        [&](index_t) { return detail::concat("the indices are for t=", layout.q_len, ", s=", layout.kv_len); });
  }

 private:
  static index_t count_in(std::span<const std::int32_t> row, index_t b, index_t e) {
    const auto lo = std::lower_bound(row.begin(), row.end(), static_cast<std::int32_t>(b));
    const auto hi = std::lower_bound(lo, row.end(), static_cast<std::int32_t>(e));
    return hi - lo;
  }
};

inline TopKMask topk_mask(const TopKLayout& layout) { return {layout.view()}; }
// The mask views the layout: a temporary layout would dangle.
TopKMask topk_mask(TopKLayout&&) = delete;

// jax.lax.top_k's order of float32 values as an integer key: a > b in that
// order iff topk_order_key(a) > topk_order_key(b). XLA ranks with a total
// order on the bits, not with IEEE comparison, so
//   -NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN
// (+0.0 ranks above -0.0; a NaN with the sign bit clear, what arithmetic
// produces, ranks above +inf, and one with it set below -inf; NaNs with
// different payloads are distinct values). Checked against jax 0.10.2 on CPU:
// top_k([-0.0, 0.0], 2) -> [1, 0]; top_k([1, nan, inf, -inf, 2], 5) ->
// [1, 2, 4, 0, 3]; -NaN last. Keys equal only for identical bits.
inline std::int32_t topk_order_key(float x) {
  const auto bits = std::bit_cast<std::int32_t>(x);
  // Negative floats grow in magnitude as their bits grow: flip the magnitude
  // bits so that the key decreases instead.
  return bits < 0 ? bits ^ std::numeric_limits<std::int32_t>::max() : bits;
}

// Indices of the k largest scores along the last axis, as jax.lax.top_k:
// values descending in topk_order_key's total order (so +0.0 before -0.0 and
// NaN first), equal values lower index first. scores (..., s) -> indices
// (..., k), int32.
inline Tensor<std::int32_t> top_k(TensorView<const float> scores, index_t k) {
  detail::require(scores.rank() >= 1, "top_k: scores must have at least one dim, got ", scores.shape());
  const index_t s = scores.extent(-1);
  detail::require(k >= 0 && k <= s, "top_k: k must be in [0, ", s, "] for scores of shape ", scores.shape(), ", got ",
                  k);
  const Tensor<float> copy = scores.is_contiguous() ? Tensor<float>{} : to_tensor(scores);
  const float* data = scores.is_contiguous() ? scores.data() : copy.data();
  Extents out_shape = scores.shape().drop_last(1);
  out_shape.push_back(k);
  Tensor<std::int32_t> out(out_shape);
  const index_t rows = s == 0 ? out_shape.drop_last(1).size() : scores.size() / s;
  std::vector<std::int32_t> order(static_cast<std::size_t>(s));
  std::vector<std::int32_t> keys(static_cast<std::size_t>(s));
  for (index_t r = 0; r < rows; ++r) {
    const float* row = data + r * s;
    for (index_t j = 0; j < s; ++j) keys[static_cast<std::size_t>(j)] = topk_order_key(row[j]);
    std::iota(order.begin(), order.end(), 0);
    const std::int32_t* key = keys.data();
    auto before = [key](std::int32_t a, std::int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    std::copy_n(order.begin(), k, out.data() + r * k);
  }
  return out;
}

namespace detail {

inline void require_scatter_shapes(const TensorView<float>& out, const TensorView<const std::int32_t>& indices,
                                   const char* fn) {
  detail::require(indices.rank() >= 2 && out.rank() == indices.rank() &&
                      out.shape().drop_last(1) == indices.shape().drop_last(1) && out.is_contiguous() &&
                      indices.is_contiguous(),
                  fn, ": out (..., t, s) and indices (..., t, k) must be contiguous and agree but the last dim; got ",
                  out.shape(), " and ", indices.shape());
}

// Writes `value` at each row's indices; -1 is skipped, others must be in [0, s).
inline void scatter_rows(const TensorView<float>& out, const TensorView<const std::int32_t>& indices, float value,
                         const char* fn) {
  const index_t k = indices.extent(-1), s = out.extent(-1);
  const index_t rows = indices.shape().drop_last(1).size();
  const std::int32_t* idx = indices.data();
  for (index_t r = 0; r < rows; ++r) {
    float* row = out.data() + r * s;
    for (index_t j = 0; j < k; ++j) {
      const std::int32_t v = idx[r * k + j];
      if (v == -1) continue;
      detail::require(v >= 0 && v < s, fn, ": indices of shape ", indices.shape(), ": row ", r, " entry ", j, " is ", v,
                      ", outside [0, ", s, ")");
      row[v] = value;
    }
  }
}

}  // namespace detail

// Additive top-k mask by scatter into a caller's buffer (no allocation):
// out (..., t, s) is filled with mask_value, then 0 is written at each row's
// indices (..., t, k) (-1 = no index): O(t·s) fill + O(t·k) writes.
inline void topk_scatter_mask_into(TensorView<float> out, TensorView<const std::int32_t> indices,
                                   float mask_value = kDefaultMaskValue) {
  detail::require_scatter_shapes(out, indices, "topk_scatter_mask_into");
  std::fill(out.data(), out.data() + out.size(), mask_value);
  detail::scatter_rows(out, indices, 0.0f, "topk_scatter_mask_into");
}

// Moves a scattered mask from one selection to the next in O(t·k) writes:
// the previous indices go back to mask_value, the new ones become 0 (decode
// steps, or layers that share a buffer).
inline void topk_rescatter_mask(TensorView<float> out, TensorView<const std::int32_t> previous,
                                TensorView<const std::int32_t> indices, float mask_value = kDefaultMaskValue) {
  detail::require_scatter_shapes(out, previous, "topk_rescatter_mask");
  detail::require_scatter_shapes(out, indices, "topk_rescatter_mask");
  detail::scatter_rows(out, previous, mask_value, "topk_rescatter_mask");
  detail::scatter_rows(out, indices, 0.0f, "topk_rescatter_mask");
}

// The same, returning a new tensor (..., t, s).
inline Tensor<float> topk_scatter_mask(TensorView<const std::int32_t> indices, index_t kv_len,
                                       float mask_value = kDefaultMaskValue) {
  detail::require(indices.rank() >= 2, "topk_scatter_mask: indices must have shape (..., t, k), got ", indices.shape());
  detail::require(kv_len >= 0, "topk_scatter_mask: kv_len must be non-negative, got ", kv_len);
  Extents shape = indices.shape().drop_last(1);
  shape.push_back(kv_len);
  Tensor<float> out(shape, mask_value);
  const Tensor<std::int32_t> copy = indices.is_contiguous() ? Tensor<std::int32_t>{} : to_tensor(indices);
  detail::scatter_rows(out.view(), indices.is_contiguous() ? indices : copy.view(), 0.0f, "topk_scatter_mask");
  return out;
}

namespace detail {

// The broadcast-compare form MaxText used before PR #4261:
// selected[j] = any_i(idx[i] == j), O(rows · k · s). Test oracle only.
inline Tensor<float> topk_broadcast_mask(TensorView<const std::int32_t> indices, index_t kv_len,
                                         float mask_value = kDefaultMaskValue) {
  const index_t k = indices.extent(-1);
  Extents shape = indices.shape().drop_last(1);
  shape.push_back(kv_len);
  Tensor<float> out(shape);
  const Tensor<std::int32_t> idx = to_tensor(indices);
  const index_t rows = shape.drop_last(1).size();
  for (index_t r = 0; r < rows; ++r) {
    const std::int32_t* ri = idx.data() + r * k;
    for (index_t j = 0; j < kv_len; ++j) {
      bool selected = false;
      for (index_t i = 0; i < k; ++i) selected |= ri[i] == j;  // every compare, as the JAX broadcast does
      out.data()[r * kv_len + j] = selected ? 0.0f : mask_value;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace seqattn
