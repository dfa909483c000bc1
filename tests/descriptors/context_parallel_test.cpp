// Context-parallel reordering: the vectors of docs/semantics/sequence-descriptors.md §2.10 (and D7, §6), exact inverse
// along any axis, and argument errors.
#include <cstdint>
#include <random>
#include <vector>

#include "seqattn/descriptors.hpp"

#include "descriptor_oracle.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_context_parallel_test {

using namespace seqattn;
using Catch::Matchers::Contains;
using V = std::vector<int>;

namespace {
V reorder_iota(ReorderStrategy s, int cp, int len, std::optional<int> stripe = std::nullopt) {
  V x(static_cast<std::size_t>(len));
  for (int i = 0; i < len; ++i) x[static_cast<std::size_t>(i)] = i;
  const auto out = reorder_causal_load_balancing(TensorView<const int>(x.data(), Extents{len}), s, cp, 0, stripe);
  return {out.values().begin(), out.values().end()};
}
}  // namespace

TEST_CASE("CP reorder matches the spec vectors") {
  CHECK(reorder_iota(ReorderStrategy::striped, 2, 8) == V{0, 2, 4, 6, 1, 3, 5, 7});
  CHECK(reorder_iota(ReorderStrategy::striped, 2, 8, 1) == V{0, 2, 4, 6, 1, 3, 5, 7});
  CHECK(reorder_iota(ReorderStrategy::striped, 2, 8, 2) == V{0, 1, 4, 5, 2, 3, 6, 7});
  CHECK(reorder_iota(ReorderStrategy::dual_chunk_swap, 2, 8) == V{0, 1, 6, 7, 2, 3, 4, 5});
  // D7: the code's result for cp=4, S=16 (TE's docstring example disagrees).
  CHECK(reorder_iota(ReorderStrategy::dual_chunk_swap, 4, 16) ==
        V{0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9});
}

TEST_CASE("CP reorder and its inverse round-trip along any axis, strided input included") {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 60; ++iter) {
    const bool striped = iter % 2 == 0;
    const int cp = std::uniform_int_distribution<int>(1, 4)(rng);
    const int stripe = std::uniform_int_distribution<int>(1, 3)(rng);
    const int unit = striped ? cp * stripe : 2 * cp;
    const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    const int dim = std::uniform_int_distribution<int>(0, rank - 1)(rng);
    Extents shape;
    for (int d = 0; d < rank; ++d) {
      shape.push_back(d == dim ? unit * std::uniform_int_distribution<int>(0, 3)(rng)
                               : std::uniform_int_distribution<int>(1, 3)(rng));
    }
    // A strided view: every other element of a larger buffer.
    std::vector<float> buffer(static_cast<std::size_t>(shape.size() * 2));
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
    Strides strides = row_major_strides(shape);
    for (int d = 0; d < rank; ++d) strides[d] *= 2;
    const TensorView<const float> x(buffer.data(), shape, strides);
    const ReorderStrategy s = striped ? ReorderStrategy::striped : ReorderStrategy::dual_chunk_swap;
    std::optional<int> st;
    if (striped) st.emplace(stripe);
    CAPTURE(iter, shape, dim, cp, stripe, striped);
    const int seq_dim = iter % 3 == 0 ? dim - rank : dim;  // negative axes too
    const Tensor<float> y = reorder_causal_load_balancing(x, s, cp, seq_dim, st);
    const Tensor<float> back = inverse_reorder_causal_load_balancing(y.view(), s, cp, seq_dim, st);
    CHECK(back == to_tensor(x));
    // y is x permuted along dim by the permutation.
    const std::vector<index_t> perm = causal_load_balancing_permutation(s, cp, shape[dim], st);
    std::vector<index_t> idx(static_cast<std::size_t>(rank), 0);
    for (index_t flat = 0; flat < y.size(); ++flat) {
      index_t rem = flat;
      for (int d = rank - 1; d >= 0; --d) {
        idx[static_cast<std::size_t>(d)] = rem % shape[d];
        rem /= shape[d];
      }
      std::vector<index_t> src = idx;
      src[static_cast<std::size_t>(dim)] = perm[static_cast<std::size_t>(idx[static_cast<std::size_t>(dim)])];
      CHECK(y.data()[flat] == x.at(src));
    }
  }
}

TEST_CASE("Reordered segment ids break the id order and are refused by descriptors") {
  // Ids are reordered with the same function as q/k/v; TE derives per-rank
  // descriptors with dedicated helpers, not from reordered ids.
  const auto ids = seqattn::testing::make({1, 8}, {1, 1, 2, 2, 3, 3, 4, 4});
  const Tensor<std::int32_t> r = reorder_causal_load_balancing(ids.view(), ReorderStrategy::dual_chunk_swap, 2, -1);
  CHECK(seqattn::testing::values(r) == V{1, 1, 4, 4, 2, 2, 3, 3});
  CHECK_THROWS_WITH(derive_seqlens_and_offsets(r, Tensor<std::int32_t>(Extents{8}), AttnMaskType::padding_causal,
                                               SeqLayout::thd, {}, 4),
                    Contains("segment id 4 follows segment 1; expected id 2"));
}

TEST_CASE("CP reorder argument errors") {
  std::vector<int> x(12, 0);
  const TensorView<const int> v(x.data(), Extents{2, 6});
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::dual_chunk_swap, 2, 1),
                    Contains("DualChunkSwap needs the sequence length (6) divisible by 2*cp_size (4)"));
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::dual_chunk_swap, 1, 1, 1),
                    Contains("stripe_size applies to Striped only"));
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::striped, 2, 1, 0),
                    Contains("stripe_size must be >= 1, got 0"));
  CHECK_THROWS_WITH(inverse_reorder_causal_load_balancing(v, ReorderStrategy::striped, 4, 1),
                    Contains("Striped needs the sequence length (6) divisible by cp_size*stripe_size (4)"));
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::striped, 0, 1), Contains("cp_size must be >= 1"));
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::striped, 2, 2), Contains("seq_dim 2 out of range "
                                                                                               "for rank 2"));
  CHECK_THROWS_WITH(reorder_causal_load_balancing(v, ReorderStrategy::striped, 2, -3), Contains("seq_dim -3"));
  // Three ranks are fine for DualChunkSwap (TE insists on an even cp_size).
  std::vector<int> y(12);
  for (int i = 0; i < 12; ++i) y[static_cast<std::size_t>(i)] = i;
  const auto out = reorder_causal_load_balancing(TensorView<const int>(y.data(), Extents{12}),
                                                 ReorderStrategy::dual_chunk_swap, 3, 0);
  CHECK(V(out.values().begin(), out.values().end()) == V{0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7});
}

}  // namespace seqattn_test_descriptors_context_parallel_test
