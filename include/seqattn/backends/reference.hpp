// The reference backend: the test oracle.
//
// Materializes every score row, asks the mask's element predicate about every
// (q, kv) pair (the one the plan's BlockMask carries: the tile lists are never
// consulted when the BlockMask has it), applies the variant's element hooks,
// and takes an exact softmax in double precision. Slow and simple on purpose:
// every tiled backend is checked against it element by element.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::detail {

// Logits of row (b, h, i) into `scores` (-inf where masked); returns their max.
template <class T, class V>
double reference_logits(const AttentionProblem<T>& p, const BlockMask& mask, const V& variant, index_t b, index_t h,
                        index_t i, double scale, std::vector<double>& scores) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const SequenceGeometry& s = p.sequence(b);
  const MaskContext ctx{b, h, s.q_len, s.kv_len};
  const T* q = p.q_row(s, i, h);
  double top = neg_inf;
  for (index_t j = 0; j < s.kv_len; ++j) {
    double& x = scores[static_cast<std::size_t>(j)];
    x = neg_inf;
    if (!mask.allowed(ctx, i, j)) continue;
    const T* k = p.k_row(s, j, h / p.group);
    double dot = 0.0;
    for (index_t d = 0; d < p.dk; ++d) {
      dot += static_cast<double>(to_float(q[d * p.q_strides.dim])) * to_float(k[d * p.k_strides.dim]);
    }
    x = dot * scale;
    if constexpr (HasScoreHook<V>) {
      x = variant.score(static_cast<float>(x), ScoreIndex{b, h, i, j, s.q_len, s.kv_len});
    }
    top = std::max(top, x);
  }
  return top;
}

template <class T, class V, class Exec>
void run_reference_forward(const AttentionProblem<T>& p, const BlockMask& mask, const V& variant, Exec& exec) {
  index_t max_kv = 0;
  for (const auto& s : p.sequences) max_kv = std::max(max_kv, s.kv_len);
  const int workers = std::max(1, exec.workers());
  std::vector<std::vector<double>> scores(static_cast<std::size_t>(workers),
                                          std::vector<double>(static_cast<std::size_t>(max_kv)));
  std::vector<std::vector<double>> acc(static_cast<std::size_t>(workers),
                                       std::vector<double>(static_cast<std::size_t>(p.dv)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double scale = variant_scale(variant, p.dk);

  exec.parallel_for(p.batch() * p.heads, [&](index_t task, int worker) {
    const index_t b = task / p.heads, h = task % p.heads;
    const SequenceGeometry& s = p.sequence(b);
    auto& sc = scores[static_cast<std::size_t>(worker)];
    auto& o = acc[static_cast<std::size_t>(worker)];
    const bool sink = variant_has_sink(variant);
    double sink_logit = neg_inf;
    if constexpr (HasSinkHook<V>) {
      if (sink) sink_logit = variant.sink(h);
    }
    for (index_t i = 0; i < s.q_len; ++i) {
      const double top = std::max(sink_logit, reference_logits(p, mask, variant, b, h, i, scale, sc));
      std::fill(o.begin(), o.end(), 0.0);
      double sum = 0.0;
      if (top != neg_inf) {
        for (index_t j = 0; j < s.kv_len; ++j) {
          const double x = sc[static_cast<std::size_t>(j)];
          if (x == neg_inf) continue;
          const double w = std::exp(x - top);
          sum += w;
          const T* v = p.v_row(s, j, h / p.group);
          for (index_t e = 0; e < p.dv; ++e) o[static_cast<std::size_t>(e)] += w * to_float(v[e * p.v_strides.dim]);
        }
        if (sink) sum += std::exp(sink_logit - top);
      }
      T* out = p.out_row(s, i, h);
      for (index_t e = 0; e < p.dv; ++e) {
        out[e * p.out_strides.dim] =
            from_float<T>(sum > 0.0 ? static_cast<float>(o[static_cast<std::size_t>(e)] / sum) : 0.0f);
      }
      if (float* lse = p.lse_at(s, i, h)) {
        *lse = sum > 0.0 ? static_cast<float>(top + std::log(sum)) : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace seqattn::detail

namespace seqattn::backends {

// Policy type: materialized scores, exact softmax.
struct Reference {
  static constexpr bool kMaterializesScores = true;
  struct Work {};

  static const char* name() { return "Reference"; }
  // Only for the BlockMask the plan builds (it carries the predicate).
  static constexpr BlockShape block_shape() { return {128, 128}; }
  static Support supports(const AttentionShape&) { return {}; }
  static Work plan_work(const AttentionShape&, const BlockMask&, const PlanOptions&, int) { return {}; }
  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& problem, const V& variant,
                      Exec& exec) {
    detail::run_reference_forward(problem, plan.block_mask(), variant, exec);
  }
};

}  // namespace seqattn::backends
