// The scenarios' own attention oracle, independent of the engine and of the
// mask descriptions: reference_attention materializes every score of a row,
// applies a plain predicate `allowed(head, q, kv)` and takes an exact
// (double-accumulated) softmax. Scenario tests compare the engine path
// (attend.hpp) against it; the examples use it to report parity errors.
//
// Layout of one sequence: q [Tq, Hq, D], k and v [Tk, Hkv, D] (BSHD without
// the batch, or one THD segment), Hq a multiple of Hkv (GQA: q head h reads kv
// head h / (Hq / Hkv)). Output [Tq, Hq, D] and LSE [Tq, Hq] (natural log of
// the sum of exp(scale * q.k) over allowed keys). A row that may see no key
// gets output 0 and LSE -inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/scenarios/random.hpp"

namespace seqattn::scenarios {

struct AttentionOutput {
  Tensor<float> out;  // [Tq, Hq, D]
  Tensor<float> lse;  // [Tq, Hq]
};

namespace detail {

inline void require_qkv(const TensorView<const float>& q, const TensorView<const float>& k,
                        const TensorView<const float>& v, const char* who) {
  seqattn::detail::require(q.rank() == 3 && k.rank() == 3 && v.rank() == 3, who,
                           ": q, k and v must have rank 3 ([tokens, heads, head_dim]), got q ", q.shape(), ", k ",
                           k.shape(), ", v ", v.shape());
  seqattn::detail::require(k.shape() == v.shape(), who, ": k ", k.shape(), " and v ", v.shape(),
                           " must have the same shape");
  seqattn::detail::require(q.extent(2) == k.extent(2), who, ": q ", q.shape(), " and k ", k.shape(),
                           " must have the same head_dim");
  seqattn::detail::require(k.extent(1) > 0 && q.extent(1) % k.extent(1) == 0, who, ": q heads (q ", q.shape(),
                           ") must be a positive multiple of kv heads (k ", k.shape(), ")");
}

}  // namespace detail

// Oracle: every score materialized, `allowed(head, q, kv)` applied, exact softmax.
template <class Allowed>
AttentionOutput reference_attention(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                    float scale, const Allowed& allowed) {
  detail::require_qkv(q, k, v, "reference_attention");
  const index_t tq = q.extent(0), hq = q.extent(1), d = q.extent(2), tk = k.extent(0);
  const index_t group = hq / k.extent(1);
  AttentionOutput r{Tensor<float>(seqattn::detail::make_extents({tq, hq, d})),
                    Tensor<float>(seqattn::detail::make_extents({tq, hq}))};
  std::vector<double> s(static_cast<std::size_t>(tk));
  std::vector<double> acc(static_cast<std::size_t>(d));
  for (index_t i = 0; i < tq; ++i) {
    for (index_t h = 0; h < hq; ++h) {
      const index_t g = h / group;
      double m = -std::numeric_limits<double>::infinity();
      for (index_t j = 0; j < tk; ++j) {
        double dot = 0.0;
        for (index_t c = 0; c < d; ++c) dot += static_cast<double>(q(i, h, c)) * static_cast<double>(k(j, g, c));
        s[static_cast<std::size_t>(j)] =
            allowed(h, i, j) ? dot * static_cast<double>(scale) : -std::numeric_limits<double>::infinity();
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      if (m == -std::numeric_limits<double>::infinity()) {
        r.lse(i, h) = -std::numeric_limits<float>::infinity();
        continue;  // output row stays 0
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (index_t j = 0; j < tk; ++j) {
        const double p = std::exp(s[static_cast<std::size_t>(j)] - m);
        if (p == 0.0) continue;
        sum += p;
        for (index_t c = 0; c < d; ++c) acc[static_cast<std::size_t>(c)] += p * static_cast<double>(v(j, g, c));
      }
      for (index_t c = 0; c < d; ++c) r.out(i, h, c) = static_cast<float>(acc[static_cast<std::size_t>(c)] / sum);
      r.lse(i, h) = static_cast<float>(m + std::log(sum));
    }
  }
  return r;
}

// Largest absolute element-wise difference of two same-shaped tensors.
inline float max_abs_diff(const Tensor<float>& a, const Tensor<float>& b) {
  seqattn::detail::require(a.shape() == b.shape(), "max_abs_diff: shapes ", a.shape(), " and ", b.shape(), " differ");
  float e = 0.0f;
  for (index_t i = 0; i < a.size(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0)) continue;
    e = std::max(e, std::fabs(x - y));
  }
  return e;
}

}  // namespace seqattn::scenarios
