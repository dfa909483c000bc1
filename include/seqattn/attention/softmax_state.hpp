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
//
// NaN and infinity: the one policy of every backend (README, "NaN and
// infinity"; Reference, Scalar, Highway on every target and its bf16 path,
// Dispatched, CUDA, ring attention):
//   1. A key the mask hides from a row is never read into that row's result,
//      whatever its K and V hold (padding and unused cache pages may hold
//      garbage): masked scores are selected away, and a value row contributes
//      to an output row only where the row's weight P is nonzero (a select,
//      not a multiply: 0 * NaN must not happen). So keys of zero weight
//      (masked, a visible logit of -inf, exp underflowing to exactly 0)
//      contribute nothing. This is where we differ from IEEE arithmetic (and
//      from PyTorch, where 0 * NaN = NaN).
//   2. A NaN in q, in a visible k element, or from a score variant makes the
//      rows it reaches NaN: output row and LSE. The row max propagates NaN.
//      A NaN or infinity in a visible v row of nonzero weight reaches the
//      output by IEEE arithmetic.
//   3. +inf logits follow IEEE: the row max becomes +inf and
//      exp(inf - inf) = NaN, so the row is NaN (as PyTorch SDPA). A row whose
//      visible logits are all -inf sees nothing: out 0, LSE -inf.
//   4. Backward: hidden keys get no gradient from a row and are never read
//      into its dQ; NaN rows carry NaN into the gradients they reach.
//   5. Merges (split-KV, ring attention): a NaN partial makes the row NaN, a
//      partial with LSE -inf contributes nothing.
// Here: a state with a NaN max or sum is NaN; it stays NaN through merges and
// finalizes to out NaN, LSE NaN.
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

  // A NaN lse gives a NaN state.
  static SoftmaxState from_lse(float lse) { return lse == kNegInf ? SoftmaxState{} : SoftmaxState{lse, 1.0f}; }

  bool is_nan() const { return std::isnan(max) || std::isnan(sum); }
  bool empty() const { return !(sum > 0.0f) && !is_nan(); }
  float lse() const {
    if (is_nan()) return std::numeric_limits<float>::quiet_NaN();
    return empty() ? kNegInf : max + std::log(sum);
  }
  // Multiplies the O accumulator into the normalized output (0 when empty,
  // NaN when NaN: the output row is NaN whatever O holds).
  float normalizer() const {
    if (is_nan()) return std::numeric_limits<float>::quiet_NaN();
    return empty() ? 0.0f : 1.0f / sum;
  }

  // Folds `other` into this state. O_this = O_this * w.self + O_other * w.other.
  // Either side NaN: the state and both weights become NaN (std::max would
  // drop a NaN max, and exp(NaN) weights alone leave sum finite when the
  // other side is empty).
  Weights merge(const SoftmaxState& other) {
    if (is_nan() || other.is_nan()) {
      constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
      max = sum = kNaN;
      return {kNaN, kNaN};
    }
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
