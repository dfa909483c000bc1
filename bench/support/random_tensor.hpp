// Benchmark inputs: a tensor of standard-normal values from a fixed seed,
// stored as T (float or bfloat16).
#pragma once

#include <cstdint>
#include <random>

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn::bench {

template <class T>
Tensor<T> random_tensor(const Extents& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor<T> t(shape);
  for (auto& x : t.values()) x = from_float<T>(dist(rng));
  return t;
}

}  // namespace seqattn::bench
