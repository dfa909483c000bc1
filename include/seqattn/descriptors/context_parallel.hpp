// Context-parallel load balancing (docs/semantics/sequence-descriptors.md §2.10): reorder the sequence axis so
// that, after splitting it evenly over cp_size ranks, every rank gets a fair
// share of causal work. Segment ids and positions are reordered with the same
// function as q, k and v.
//   DualChunkSwap: 2*cp chunks; rank r holds chunks r and 2*cp-1-r.
//   Striped:       blocks of stripe_size tokens; rank r holds blocks
//                  r, r+cp, r+2cp, ...
// (S = 8, cp = 2: DualChunkSwap [0,1,6,7,2,3,4,5], Striped(1)
// [0,2,4,6,1,3,5,7], Striped(2) [0,1,4,5,2,3,6,7].)
// TE additionally requires an even cp_size for DualChunkSwap; the reorder is
// well defined for any cp_size, so we only require S % (2*cp) == 0.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn {

enum class ReorderStrategy : std::uint8_t { dual_chunk_swap, striped };

// perm[i] = the original index of the token placed at position i.
// stripe_size: Striped only (default 1); giving it for DualChunkSwap throws.
inline std::vector<index_t> causal_load_balancing_permutation(ReorderStrategy strategy, int cp_size, index_t seq_len,
                                                              std::optional<int> stripe_size = std::nullopt) {
  detail::require(cp_size >= 1, "reorder_causal_load_balancing: cp_size must be >= 1, got ", cp_size);
  detail::require(seq_len >= 0, "reorder_causal_load_balancing: sequence length must be >= 0, got ", seq_len);
  std::vector<index_t> perm(static_cast<std::size_t>(seq_len));
  std::size_t i = 0;
  if (strategy == ReorderStrategy::dual_chunk_swap) {
    detail::require(!stripe_size.has_value(),
                    "reorder_causal_load_balancing: stripe_size applies to Striped only, got ", stripe_size.value_or(0),
                    " with DualChunkSwap");
    detail::require(seq_len % (2 * cp_size) == 0,
                    "reorder_causal_load_balancing: DualChunkSwap needs the sequence "
                    "length (",
                    seq_len, ") divisible by 2*cp_size (", 2 * cp_size, ")");
    const index_t chunk = seq_len / (2 * cp_size);
    for (index_t r = 0; r < cp_size; ++r) {
      for (index_t c : {r, 2 * index_t{cp_size} - 1 - r}) {
        for (index_t t = 0; t < chunk; ++t) perm[i++] = c * chunk + t;
      }
    }
    return perm;
  }
  const int stripe = stripe_size.value_or(1);
  detail::require(stripe >= 1, "reorder_causal_load_balancing: stripe_size must be >= 1, got ", stripe);
  detail::require(seq_len % (index_t{cp_size} * stripe) == 0,
                  "reorder_causal_load_balancing: Striped needs the "
                  "sequence length (",
                  seq_len, ") divisible by cp_size*stripe_size (", index_t{cp_size} * stripe, ")");
  const index_t blocks = seq_len / stripe;
  for (index_t r = 0; r < cp_size; ++r) {
    for (index_t b = r; b < blocks; b += cp_size) {
      for (index_t t = 0; t < stripe; ++t) perm[i++] = b * stripe + t;
    }
  }
  return perm;
}

namespace detail {

// out[..., i, ...] = x[..., perm[i], ...] along dimension `dim`.
template <class T>
Tensor<std::remove_cv_t<T>> permute_axis(TensorView<T> x, int dim, const std::vector<index_t>& perm) {
  Tensor<std::remove_cv_t<T>> out(x.shape());
  std::vector<index_t> idx(static_cast<std::size_t>(x.rank()), 0);
  for (index_t flat = 0; flat < x.size(); ++flat) {
    const index_t at_out = idx[static_cast<std::size_t>(dim)];
    idx[static_cast<std::size_t>(dim)] = perm[static_cast<std::size_t>(at_out)];
    out.data()[flat] = x.at(idx);
    idx[static_cast<std::size_t>(dim)] = at_out;
    for (int d = x.rank() - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < x.extent(d)) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  return out;
}

inline int normalize_dim(int dim, int rank) {
  const int d = dim < 0 ? dim + rank : dim;
  require(d >= 0 && d < rank, "reorder_causal_load_balancing: seq_dim ", dim, " out of range for rank ", rank);
  return d;
}

}  // namespace detail

// Reorders x along seq_dim (negative counts from the back) for causal load
// balancing over cp_size ranks.
template <class T>
Tensor<std::remove_cv_t<T>> reorder_causal_load_balancing(TensorView<T> x, ReorderStrategy strategy, int cp_size,
                                                          int seq_dim, std::optional<int> stripe_size = std::nullopt) {
  const int dim = detail::normalize_dim(seq_dim, x.rank());
  return detail::permute_axis(x, dim, causal_load_balancing_permutation(strategy, cp_size, x.extent(dim), stripe_size));
}

// The exact inverse of reorder_causal_load_balancing with the same arguments.
template <class T>
Tensor<std::remove_cv_t<T>> inverse_reorder_causal_load_balancing(TensorView<T> x, ReorderStrategy strategy,
                                                                  int cp_size, int seq_dim,
                                                                  std::optional<int> stripe_size = std::nullopt) {
  const int dim = detail::normalize_dim(seq_dim, x.rank());
  const std::vector<index_t> perm = causal_load_balancing_permutation(strategy, cp_size, x.extent(dim), stripe_size);
  std::vector<index_t> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<index_t>(i);
  return detail::permute_axis(x, dim, inverse);
}

}  // namespace seqattn
