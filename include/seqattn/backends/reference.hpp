// The reference backend: the test oracle.
//
// Materializes every score row, applies the mask through the description's
// element predicate (never through a BlockMask), and takes an exact softmax
// in double precision. Slow and simple on purpose: every tiled backend is
// checked against it element by element.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::backends {

// Policy type: materialized scores, exact softmax.
struct Reference {
  static constexpr bool kMaterializesScores = true;
};

}  // namespace seqattn::backends

namespace seqattn::detail {

template <class T, MaskDescription M, class Exec>
void run_reference_attention(const AttentionProblem<T>& p, const M& mask, Exec& exec) {
  index_t max_kv = 0;
  for (const auto& s : p.sequences) max_kv = std::max(max_kv, s.kv_len);
  const int workers = std::max(1, exec.workers());
  std::vector<std::vector<double>> scores(static_cast<std::size_t>(workers),
                                          std::vector<double>(static_cast<std::size_t>(max_kv)));
  std::vector<std::vector<double>> acc(static_cast<std::size_t>(workers),
                                       std::vector<double>(static_cast<std::size_t>(p.dv)));
  const double neg_inf = -std::numeric_limits<double>::infinity();

  exec.parallel_for(p.batch() * p.heads, [&](index_t task, int worker) {
    const index_t b = task / p.heads, h = task % p.heads, kvh = h / p.group;
    const auto& s = p.sequences[static_cast<std::size_t>(b)];
    const MaskContext ctx{b, h, s.q_len, s.kv_len};
    auto& sc = scores[static_cast<std::size_t>(worker)];
    auto& o = acc[static_cast<std::size_t>(worker)];
    for (index_t i = 0; i < s.q_len; ++i) {
      const T* q = p.q + s.q_base + i * p.q_strides.token + h * p.q_strides.head;
      double top = p.sinks.empty() ? neg_inf : static_cast<double>(p.sinks[static_cast<std::size_t>(h)]);
      for (index_t j = 0; j < s.kv_len; ++j) {
        if (!mask.allowed(ctx, i, j)) {
          sc[static_cast<std::size_t>(j)] = neg_inf;
          continue;
        }
        const T* k = p.k + s.k_base + j * p.k_strides.token + kvh * p.k_strides.head;
        double dot = 0.0;
        for (index_t d = 0; d < p.dk; ++d) {
          dot += static_cast<double>(to_float(q[d * p.q_strides.dim])) * to_float(k[d * p.k_strides.dim]);
        }
        double x = dot * p.scale;
        if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
        sc[static_cast<std::size_t>(j)] = x;
        top = std::max(top, x);
      }
      std::fill(o.begin(), o.end(), 0.0);
      double sum = 0.0;
      if (top != neg_inf) {
        for (index_t j = 0; j < s.kv_len; ++j) {
          const double x = sc[static_cast<std::size_t>(j)];
          if (x == neg_inf) continue;
          const double w = std::exp(x - top);
          sum += w;
          const T* v = p.v + s.v_base + j * p.v_strides.token + kvh * p.v_strides.head;
          for (index_t e = 0; e < p.dv; ++e) o[static_cast<std::size_t>(e)] += w * to_float(v[e * p.v_strides.dim]);
        }
        if (!p.sinks.empty()) sum += std::exp(static_cast<double>(p.sinks[static_cast<std::size_t>(h)]) - top);
      }
      T* out = p.out + s.out_base + i * p.out_strides.token + h * p.out_strides.head;
      for (index_t e = 0; e < p.dv; ++e) {
        out[e * p.out_strides.dim] =
            from_float<T>(sum > 0.0 ? static_cast<float>(o[static_cast<std::size_t>(e)] / sum) : 0.0f);
      }
      if (p.lse) {
        p.lse[s.lse_base + i * p.lse_strides.token + h * p.lse_strides.head] =
            sum > 0.0 ? static_cast<float>(top + std::log(sum)) : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace seqattn::detail
