// Seeded, platform-independent random numbers for the scenarios' tiny models,
// examples and tests. <random>'s distributions differ between standard
// libraries, so the weights of a "seeded" model would differ too; SplitMix64
// plus our own float conversion gives the same numbers everywhere.
#pragma once

#include <cmath>
#include <cstdint>

#include "seqattn/core/tensor.hpp"

namespace seqattn::scenarios {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float unit() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * unit(); }
  // Uniform integer in [0, n); n > 0.
  index_t below(index_t n) { return static_cast<index_t>(next() % static_cast<std::uint64_t>(n)); }
  // Standard normal (Box-Muller; one of the pair is dropped for simplicity).
  float normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  std::uint64_t state_;
};

// A tensor of independent N(0, stddev^2) values.
inline Tensor<float> random_normal(const Extents& shape, SplitMix64& rng, float stddev = 1.0f) {
  Tensor<float> t(shape);
  for (float& x : t.values()) x = stddev * rng.normal();
  return t;
}

}  // namespace seqattn::scenarios
