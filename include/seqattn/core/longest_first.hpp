// Longest-first ordering of work: the CPU planners (forward tasks, backward
// key and query tasks) and the CUDA launch planner hand out the costliest
// tasks first, so that the tail of a run is short work. Plain C++ (no
// Highway): the CUDA planner's headers are compiled by nvcc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "seqattn/core/checked.hpp"

namespace seqattn::detail {

// The indices 0 .. n-1, largest cost(i) first; equal costs keep index order.
template <class Cost>
std::vector<index_t> longest_first(index_t n, Cost&& cost) {
  std::vector<index_t> order(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return cost(a) > cost(b); });
  return order;
}

// The same for costs given as a vector: the indices of `cost`, largest first.
inline std::vector<index_t> longest_first(const std::vector<index_t>& cost) {
  return longest_first(static_cast<index_t>(cost.size()), [&](index_t i) { return cost[static_cast<std::size_t>(i)]; });
}

}  // namespace seqattn::detail
