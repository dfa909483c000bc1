// SoftmaxState: the running (max, sum) of one softmax row, and the exact
// merge of two partial results of the same row computed over disjoint sets of
// keys: split-KV chunks (flash-decoding), context-parallel ranks, a sink.
//
// A partial result over some keys is (m, l, O): m the largest logit seen,
// l = sum_j exp(s_j - m) and the unnormalized O = sum_j exp(s_j - m) v_j. Two
// partials of one row merge exactly into m = max(m1, m2),
// l = l1 exp(m1 - m) + l2 exp(m2 - m) and O likewise, whatever the split.
// A normalized output with its log-sum-exp is the partial (lse, 1, out).
// A row that has seen no allowed key is empty (l = 0, m = -inf): it merges as
// the identity and finalizes to out = 0, lse = -inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "seqattn/core/tensor.hpp"

namespace seqattn {

struct SoftmaxState {
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  float max = kNegInf;  // m
  float sum = 0.0f;     // l, relative to m

  // What multiplies each side's O accumulator in a merge.
  struct Weights {
    float self = 1.0f;
    float other = 0.0f;
  };

  static SoftmaxState from_lse(float lse) { return lse == kNegInf ? SoftmaxState{} : SoftmaxState{lse, 1.0f}; }

  bool empty() const { return !(sum > 0.0f); }
  float lse() const { return empty() ? kNegInf : max + std::log(sum); }
  // Multiplies the O accumulator into the normalized output (0 when empty).
  float normalizer() const { return empty() ? 0.0f : 1.0f / sum; }

  // Folds `other` into this state. O_this = O_this * w.self + O_other * w.other.
  Weights merge(const SoftmaxState& other) {
    if (other.empty()) return {1.0f, 0.0f};
    if (empty()) {
      *this = other;
      return {0.0f, 1.0f};
    }
    const float top = std::max(max, other.max);
    const Weights w{std::exp(max - top), std::exp(other.max - top)};
    sum = sum * w.self + other.sum * w.other;
    max = top;
    return w;
  }

  // Adds a logit that joins the denominator without a value (an attention
  // sink). Returns the factor that rescales the O accumulator.
  float absorb_sink(float logit) { return merge(SoftmaxState{logit, 1.0f}).self; }
};

// O_a = O_a * w.self + O_b * w.other over n accumulators, with a's state
// updated: the whole merge of two partial rows.
inline void merge_partial_rows(SoftmaxState& a, float* o_a, const SoftmaxState& b, const float* o_b, index_t n) {
  const SoftmaxState::Weights w = a.merge(b);
  if (w.other == 0.0f) return;
  for (index_t e = 0; e < n; ++e) o_a[e] = o_a[e] * w.self + o_b[e] * w.other;
}

}  // namespace seqattn
