// The reference backend: the test oracle.
//
// Materializes every score row, asks the mask's element predicate about every
// (q, kv) pair (the one the plan's BlockMask carries: the tile lists are never
// consulted when the BlockMask has it), applies the variant's element hooks,
// and takes an exact softmax in double precision. Slow and simple on purpose:
// every tiled backend is checked against it element by element, NaN and
// infinities included (the policy of attention/softmax_state.hpp: masked keys
// are skipped, keys of zero weight are never read, a NaN logit or a +inf
// logit makes the row NaN).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::detail {

// max that keeps a NaN from either side (std::max drops a NaN second argument).
inline double nan_max(double a, double b) { return std::isnan(a) || a > b ? a : b; }

// Logits of row (b, h, i) into `scores` (-inf where masked); returns their
// max. `raw`, when given, receives the scaled scores before the variant.
template <class T, class V>
double reference_logits(const AttentionProblem<T>& p, const BlockMask& mask, const V& variant, index_t b, index_t h,
                        index_t i, double scale, std::vector<double>& scores, std::vector<double>* raw = nullptr) {
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
    if (raw) (*raw)[static_cast<std::size_t>(j)] = x;
    if constexpr (HasScoreHook<V>) {
      x = variant.score(static_cast<float>(x), ScoreIndex{b, h, i, j, s.q_len, s.kv_len});
    }
    top = nan_max(x, top);
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
      const double top = nan_max(reference_logits(p, mask, variant, b, h, i, scale, sc), sink_logit);
      std::fill(o.begin(), o.end(), 0.0);
      double sum = 0.0;
      if (top != neg_inf) {
        for (index_t j = 0; j < s.kv_len; ++j) {
          const double x = sc[static_cast<std::size_t>(j)];
          if (x == neg_inf) continue;
          const double w = std::exp(x - top);
          sum += w;
          // A weight that is zero in fp32, the precision of every kernel's
          // weights, leaves v_j unread (it may hold NaN).
          if (static_cast<float>(w) == 0.0f) continue;
          const T* v = p.v_row(s, j, h / p.group);
          for (index_t e = 0; e < p.dv; ++e) o[static_cast<std::size_t>(e)] += w * to_float(v[e * p.v_strides.dim]);
        }
        if (sink) sum += std::exp(sink_logit - top);
      }
      T* out = p.out_row(s, i, h);
      for (index_t e = 0; e < p.dv; ++e) {
        // A NaN sum (a NaN or +inf logit) gives NaN; an empty row 0.
        out[e * p.out_strides.dim] = from_float<T>(
            sum > 0.0 || std::isnan(sum) ? static_cast<float>(o[static_cast<std::size_t>(e)] / sum) : 0.0f);
      }
      if (float* lse = p.lse_at(s, i, h)) {
        *lse = sum > 0.0 || std::isnan(sum) ? static_cast<float>(top + std::log(sum))
                                            : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

// The exact gradient, in double: per row, logits z (variant applied, -inf
// where masked), P = exp(z - lse) with lse recomputed (sink included), O
// recomputed, D = dO . O, dP_j = dO . v_j, dS_j = P_j (dP_j - D) dz_j/ds_j;
// dq = scale sum_j dS_j k_j, dk_j += scale dS_j q, dv_j += P_j dO, and the
// sink's gradient -sum_rows exp(sink - lse) D.
template <class T, class V>
void reference_backward_row(const BackwardProblem<T>& bp, const BlockMask& mask, const V& variant, index_t b, index_t h,
                            index_t i, double scale, std::vector<double>& dk, std::vector<double>& dv,
                            double& sink_grad) {
  const AttentionProblem<T>& p = bp.fwd;
  const SequenceGeometry& s = p.sequence(b);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const index_t kvh = h / p.group;
  std::vector<double> raw(static_cast<std::size_t>(s.kv_len)), z(raw.size(), neg_inf);
  std::vector<double> dq(static_cast<std::size_t>(p.dk), 0.0), o(static_cast<std::size_t>(p.dv), 0.0);
  const T* q = p.q_row(s, i, h);
  const T* d_o = bp.dout.row(b, i, h);
  auto at = [&](const T* row, index_t stride, index_t e) { return static_cast<double>(to_float(row[e * stride])); };
  double top = reference_logits(p, mask, variant, b, h, i, scale, z, &raw);
  double sink = neg_inf;
  if constexpr (HasSinkHook<V>) {
    if (variant_has_sink(variant)) sink = variant.sink(h);
  }
  top = nan_max(top, sink);
  if (top == neg_inf) return;  // nothing allowed, no sink: every gradient of this row is 0
  double sum = std::exp(sink - top);
  for (double x : z) sum += std::exp(x - top);
  const double lse = top + std::log(sum);
  // P_j = 0 for a -inf logit even when lse is NaN: hidden keys stay out of a NaN row.
  auto weight = [&](index_t j) {
    const double x = z[static_cast<std::size_t>(j)];
    const double w = x == neg_inf ? 0.0 : std::exp(x - lse);
    return static_cast<float>(w) == 0.0f ? 0.0 : w;  // zero in fp32, as in the kernels: v_j and k_j unread
  };
  for (index_t j = 0; j < s.kv_len; ++j) {
    const double pj = weight(j);
    if (pj == 0.0) continue;
    for (index_t e = 0; e < p.dv; ++e)
      o[static_cast<std::size_t>(e)] += pj * at(p.v_row(s, j, kvh), p.v_strides.dim, e);
  }
  double delta = 0.0;
  for (index_t e = 0; e < p.dv; ++e) delta += at(d_o, bp.dout.strides.dim, e) * o[static_cast<std::size_t>(e)];
  if (variant_has_sink(variant)) sink_grad -= std::exp(sink - lse) * delta;  // no sink: no gradient, NaN rows too
  for (index_t j = 0; j < s.kv_len; ++j) {
    const double pj = weight(j);
    if (pj == 0.0) continue;
    const T* v = p.v_row(s, j, kvh);
    const T* k = p.k_row(s, j, kvh);
    double dp = 0.0;
    for (index_t e = 0; e < p.dv; ++e) dp += at(d_o, bp.dout.strides.dim, e) * at(v, p.v_strides.dim, e);
    double ds = pj * (dp - delta);
    if constexpr (HasScoreHook<V>) {
      ds *= variant.score_grad(static_cast<float>(raw[static_cast<std::size_t>(j)]),
                               ScoreIndex{b, h, i, j, s.q_len, s.kv_len});
    }
    const std::size_t row = static_cast<std::size_t>(j * p.kv_heads + kvh);
    for (index_t d = 0; d < p.dk; ++d) {
      dq[static_cast<std::size_t>(d)] += scale * ds * at(k, p.k_strides.dim, d);
      dk[row * static_cast<std::size_t>(p.dk) + static_cast<std::size_t>(d)] += scale * ds * at(q, p.q_strides.dim, d);
    }
    for (index_t e = 0; e < p.dv; ++e) {
      dv[row * static_cast<std::size_t>(p.dv) + static_cast<std::size_t>(e)] += pj * at(d_o, bp.dout.strides.dim, e);
    }
  }
  T* dst = bp.dq.row(b, i, h);
  for (index_t d = 0; d < p.dk; ++d) {
    dst[d * bp.dq.strides.dim] = from_float<T>(static_cast<float>(dq[static_cast<std::size_t>(d)]));
  }
}

template <class T, class V>
void run_reference_backward(const BackwardProblem<T>& bp, const BlockMask& mask, const V& variant) {
  const AttentionProblem<T>& p = bp.fwd;
  const double scale = variant_scale(variant, p.dk);
  std::vector<double> sink_grad(static_cast<std::size_t>(p.heads), 0.0);
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceGeometry& s = p.sequence(b);
    std::vector<double> dk(static_cast<std::size_t>(s.kv_len * p.kv_heads * p.dk), 0.0);
    std::vector<double> dv(static_cast<std::size_t>(s.kv_len * p.kv_heads * p.dv), 0.0);
    for (index_t h = 0; h < p.heads; ++h) {
      for (index_t i = 0; i < s.q_len; ++i) {
        T* dq = bp.dq.row(b, i, h);
        for (index_t d = 0; d < p.dk; ++d) dq[d * bp.dq.strides.dim] = from_float<T>(0.0f);
        reference_backward_row(bp, mask, variant, b, h, i, scale, dk, dv, sink_grad[static_cast<std::size_t>(h)]);
      }
    }
    for (index_t j = 0; j < s.kv_len; ++j) {
      for (index_t kvh = 0; kvh < p.kv_heads; ++kvh) {
        const auto row = static_cast<std::size_t>(j * p.kv_heads + kvh);
        T* k = bp.dk.row(b, j, kvh);
        T* v = bp.dv.row(b, j, kvh);
        for (index_t d = 0; d < p.dk; ++d) {
          k[d * bp.dk.strides.dim] =
              from_float<T>(static_cast<float>(dk[row * static_cast<std::size_t>(p.dk) + static_cast<std::size_t>(d)]));
        }
        for (index_t e = 0; e < p.dv; ++e) {
          v[e * bp.dv.strides.dim] =
              from_float<T>(static_cast<float>(dv[row * static_cast<std::size_t>(p.dv) + static_cast<std::size_t>(e)]));
        }
      }
    }
  }
  for (std::size_t h = 0; h < bp.dsinks.size(); ++h) bp.dsinks[h] = static_cast<float>(sink_grad[h]);
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
  // Serial whatever the executor: the oracle favours plainness.
  template <class Backend, class T, class V, class Exec>
  static void backward(const AttentionPlan<Backend>& plan, const detail::BackwardProblem<T>& problem, const V& variant,
                       Exec&) {
    detail::run_reference_backward(problem, plan.block_mask(), variant);
  }
};

}  // namespace seqattn::backends
