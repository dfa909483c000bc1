// Longest-first ordering of work: the CPU planners (forward tasks, within
// bands of one K/V head where that keeps the workers busy; backward key and
// query tasks) and the CUDA launch planner hand out the costliest tasks
// first, so that the tail of a run is short work. Plain C++ (no
// Highway): the CUDA planner's headers are compiled by nvcc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "seqattn/core/checked.hpp"

namespace seqattn::detail {

// The indices of `cost`, largest cost first; equal costs keep index order.
inline std::vector<index_t> longest_first(const std::vector<index_t>& cost) {
  std::vector<index_t> order(cost.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<index_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
    return cost[static_cast<std::size_t>(a)] > cost[static_cast<std::size_t>(b)];
  });
  return order;
}

// The same for the indices 0 .. n-1 by cost(i), each cost computed once.
template <class Cost>
std::vector<index_t> longest_first(index_t n, Cost&& cost) {
  std::vector<index_t> costs(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) costs[static_cast<std::size_t>(i)] = cost(i);
  return longest_first(costs);
}

}  // namespace seqattn::detail
