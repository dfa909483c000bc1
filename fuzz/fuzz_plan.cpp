// libFuzzer target: plans, forward and backward, backends::Highway against
// backends::Reference, element by element: BSHD and THD (random segment
// tables, gaps, shared keys), GQA, head dims with odd sizes (dk != dv), masks
// from fuzz_masks.hpp (every kind and composition, through AnyMask), the
// Standard variant (scale, softcap, sinks), kv_splits and worker counts.
// Values are finite unless the input picks the non-finite mode, which puts
// NaN / +-inf into q, k, v or dout: then NaN positions must agree.
// Invalid requests (non-finite scale, softcap or sinks, wrong sink count,
// bad kv_splits or workers, null or overlapping gradients, bad segment
// tables) must be rejected with seqattn::invalid_argument by both backends.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fuzzer/FuzzedDataProvider.h>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "fuzz_masks.hpp"

using namespace seqattn;

namespace {

constexpr double kMaxWork = 40000;  // heads * sum(q * kv) * (dk + dv): keeps a run fast under ASan
constexpr double kForwardTol = 1e-4;
constexpr double kLseTol = 1e-4;
constexpr double kBackwardTol = 1e-3;
constexpr float kSentinel = 7.0f;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Values in [-4, 4) from the input bytes, cycled (mixed with the index) when they run out.
struct ValueSource {
  std::vector<std::uint8_t> bytes;
  std::size_t next = 0;
  float operator()() {
    const std::size_t i = next++;
    const std::uint8_t b = bytes.empty() ? 0 : bytes[i % bytes.size()];
    const auto mixed =
        static_cast<std::uint8_t>(b ^ static_cast<std::uint8_t>((i / std::max<std::size_t>(1, bytes.size())) * 37u));
    return (static_cast<float>(mixed) - 128.0f) / 32.0f;
  }
};

enum class Grads { normal, null_dq, dk_over_k, dq_is_dk, dv_over_v };

struct Problem {
  bool thd = false;
  index_t sequences = 0, sq = 0, skv = 0;  // BSHD: batch, Sq, Skv
  index_t tq = 0, tkv = 0;                 // THD tokens
  std::vector<std::int32_t> q_off, q_len, kv_off, kv_len;
  SegmentTable table;
  index_t heads = 1, kv_heads = 1, dk = 1, dv = 1;
  Tensor<float> q, k, v, dout;
  float scale = kNaN, softcap = 0;
  std::vector<float> sinks;
  index_t kv_splits = 0;
  int workers = 1;
  bool backward = false, nonfinite = false;
  Grads grads = Grads::normal;
  bool must_reject = false;  // an invalid request the engine has to refuse
  // (kv head, dim) of every non-finite V element: see value_may_underflow.
  std::vector<std::pair<index_t, index_t>> nonfinite_v;
  int prebuilt = 0;  // 0: plan from the mask; 1: a BlockMask built first; 2: ... built for 1 head

  AttentionInputs<float> inputs() const { return {q.view(), k.view(), v.view(), thd ? &table : nullptr}; }
  Extents out_shape() const { return thd ? Extents{tq, heads, dv} : Extents{sequences, sq, heads, dv}; }
  Extents lse_shape() const { return thd ? Extents{heads, tq} : Extents{sequences, heads, sq}; }
  variants::Standard variant() const { return variants::Standard{scale, {softcap}, {sinks}}; }
  index_t q_tokens_of(index_t b) const { return thd ? q_len[static_cast<std::size_t>(b)] : sq; }
  index_t kv_tokens_of(index_t b) const { return thd ? kv_len[static_cast<std::size_t>(b)] : skv; }
  index_t q_token(index_t b, index_t i) const { return thd ? q_off[static_cast<std::size_t>(b)] + i : b * sq + i; }
  index_t kv_token(index_t b, index_t j) const { return thd ? kv_off[static_cast<std::size_t>(b)] + j : b * skv + j; }
  index_t lse_index(index_t b, index_t h, index_t i) const {
    return thd ? h * tq + q_token(b, i) : (b * heads + h) * sq + i;
  }
  RaggedLengths lengths() const {
    RaggedLengths l;
    for (index_t b = 0; b < sequences; ++b) {
      l.q.push_back(q_tokens_of(b));
      l.kv.push_back(kv_tokens_of(b));
    }
    return l;
  }
};

struct Result {
  Tensor<float> out, lse, dq, dk, dv;
  std::vector<float> dsinks;
  std::shared_ptr<const BlockMask> block_mask;
};

// Runs the plan; nullopt when the request is rejected (seqattn::invalid_argument).
template <class Backend, class M>
std::optional<Result> run(Problem& p, const M& mask) {
  try {
    PlanOptions options;
    options.kv_splits = p.kv_splits;
    options.backward = p.backward;
    // A BlockMask built beforehand (at Highway's tiles, which the reference
    // accepts too), sometimes for 1 head: only a head-invariant mask may be
    // broadcast over the plan's heads.
    const auto plan = [&] {
      if (p.prebuilt == 0) return plan_attention<Backend>(shape_of(p.inputs()), mask, options, p.workers);
      const index_t bm_heads = p.prebuilt == 2 ? 1 : p.heads;
      return plan_attention<Backend>(
          shape_of(p.inputs()),
          std::make_shared<const BlockMask>(build_block_mask(
              mask, p.lengths(), bm_heads, backends::Highway::block_shape(), {options.store_tile_bits})),
          options, p.workers);
    }();
    execution::ThreadPool pool(std::clamp(p.workers, 1, 2));
    Result r{Tensor<float>(p.out_shape(), kSentinel), Tensor<float>(p.lse_shape(), kSentinel), {}, {}, {}, {}, {}};
    r.block_mask = std::shared_ptr<const BlockMask>(std::make_shared<BlockMask>(plan.block_mask()));
    attention_forward(plan, p.inputs(), r.out.view(), r.lse.view(), p.variant(), pool);
    if (p.backward) {
      r.dq = Tensor<float>(p.q.shape(), kSentinel);
      r.dk = Tensor<float>(p.k.shape(), kSentinel);
      r.dv = Tensor<float>(p.v.shape(), kSentinel);
      r.dsinks.assign(p.sinks.size(), kSentinel);
      AttentionGrads<float> g{r.dq.view(), r.dk.view(), r.dv.view(), r.dsinks};
      switch (p.grads) {
        case Grads::null_dq:
          g.dq = TensorView<float>(nullptr, p.q.shape());
          break;
        case Grads::dk_over_k:
          g.dk = p.k.view();
          break;
        case Grads::dq_is_dk:
          g.dk = TensorView<float>(r.dq.data(), p.k.shape());
          break;
        case Grads::dv_over_v:
          g.dv = p.v.view();
          break;
        default:
          break;
      }
      attention_backward(plan, p.inputs(), r.out.view(), r.lse.view(), p.dout.view(), g, p.variant(), pool);
    }
    return r;
  } catch (const seqattn::invalid_argument&) {
    return std::nullopt;
  }
}

double max_finite_abs(const Tensor<float>& t) {
  double m = 0;
  for (index_t i = 0; i < t.size(); ++i) {
    if (std::isfinite(t.data()[i])) m = std::max(m, static_cast<double>(std::abs(t.data()[i])));
  }
  return m;
}

// How far fp32 rounding may move a logit: its dot product's dk terms are
// rounded as they add, a random walk of sqrt(dk) steps of 2^-24 of the
// largest logit the inputs allow. The softmax passes a logit's error on to an
// output element as at most twice the largest |v| times it. Where logits
// reach the hundreds this exceeds kForwardTol of the outputs: an input with
// scale 1.93, dk 40 and |q|, |k| up to 4 had two keys at logits 914.83 and
// 914.31 deciding one output; Highway and Reference differed by 7.3e-4 (a
// difference of 6.5e-4 between their fp32 logits), 1e-4 of the largest output
// being 7e-4, and a double-precision sum lay 2.4e-5 from Reference.
double logit_rounding(const Problem& p) {
  const double scale = std::isnan(p.scale) ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : std::abs(p.scale);
  const double largest = scale * static_cast<double>(p.dk) * max_finite_abs(p.q) * max_finite_abs(p.k);
  return std::sqrt(static_cast<double>(p.dk)) * std::ldexp(1.0, -24) * largest;
}

// Element by element: NaN positions agree, infinities agree exactly, finite
// values within tol * max(max finite |want|, magnitude). With finite inputs
// there must be no NaN or infinity at all.
template <class Ambiguous = bool (*)(index_t)>
void compare_values(
    const Tensor<float>& got, const Tensor<float>& want, double tol, double magnitude, bool finite_inputs,
    const char* what, Ambiguous ambiguous = [](index_t) { return false; }) {
  FUZZ_CHECK(got.shape() == want.shape(), "%s: shapes differ", what);
  const double bound = tol * std::max({max_finite_abs(want), magnitude, 1e-30});
  for (index_t i = 0; i < want.size(); ++i) {
    const float a = got.data()[i], b = want.data()[i];
    if (finite_inputs) {
      FUZZ_CHECK(std::isfinite(a) && std::isfinite(b), "%s[%lld]: Highway %g, Reference %g from finite inputs", what,
                 (long long)i, a, b);
    }
    if (!(std::isfinite(a) && std::isfinite(b)) && ambiguous(i)) continue;
    FUZZ_CHECK(std::isnan(a) == std::isnan(b), "%s[%lld]: Highway %g, Reference %g (NaN positions differ)", what,
               (long long)i, a, b);
    if (std::isnan(a)) continue;
    if (std::isinf(a) || std::isinf(b)) {
      FUZZ_CHECK(a == b, "%s[%lld]: Highway %g, Reference %g", what, (long long)i, a, b);
      continue;
    }
    FUZZ_CHECK(std::abs(static_cast<double>(a) - b) <= bound, "%s[%lld]: Highway %.9g, Reference %.9g (bound %g)", what,
               (long long)i, a, b, bound);
  }
}

// LSE within kLseTol of max(1, |LSE|, logit_bound): a softcapped logit (up to
// `softcap` in size) carries the vectorized tanh's error relative to itself,
// and the LSE inherits it (a fuzzer input with softcap 16 and scale 1.74 met
// 1.05e-4 against 1e-4 * max(1, |LSE|)).
void compare_lse(const Tensor<float>& got, const Tensor<float>& want, bool finite_inputs, float logit_bound) {
  for (index_t i = 0; i < want.size(); ++i) {
    const float a = got.data()[i], b = want.data()[i];
    FUZZ_CHECK(std::isnan(a) == std::isnan(b), "lse[%lld]: Highway %g, Reference %g (NaN positions differ)",
               (long long)i, a, b);
    if (finite_inputs) FUZZ_CHECK(!std::isnan(a), "lse[%lld] is NaN from finite inputs", (long long)i);
    if (std::isnan(a)) continue;
    if (std::isinf(a) || std::isinf(b)) {
      FUZZ_CHECK(a == b, "lse[%lld]: Highway %g, Reference %g", (long long)i, a, b);
      continue;
    }
    FUZZ_CHECK(std::abs(a - b) <= kLseTol * std::max({1.0f, std::abs(b), logit_bound}),
               "lse[%lld]: Highway %.9g, Reference %.9g", (long long)i, a, b);
  }
}

// Magnitudes of the terms that cancel in each gradient, in double from the
// reference's LSE (see fuzz_attention.cpp): with A_ij = P_ij (|dP_ij| + |D_i|),
// dq_i <= scale sum_j A_ij |k_j|, dk_j <= scale sum_i A_ij |q_i| (summed over
// the query heads of a kv head), dv_j <= sum_i P_ij |dout_i|. Terms that are
// not finite are left out (the non-finite mode compares them by position).
struct Magnitudes {
  double dq = 0, dk = 0, dv = 0;
};

Magnitudes gradient_magnitudes(const Problem& p, const BlockMask& bm, const Tensor<float>& lse) {
  Magnitudes m;
  const index_t group = p.heads / p.kv_heads;
  const double scale = std::isnan(p.scale) ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : p.scale;
  const auto row = [](const Tensor<float>& t, index_t token, index_t h, index_t heads, index_t d) {
    return t.data() + (token * heads + h) * d;
  };
  std::vector<double> mk, mv, prob, dprob;
  for (index_t b = 0; b < p.sequences; ++b) {
    const index_t ql = p.q_tokens_of(b), kl = p.kv_tokens_of(b);
    prob.assign(static_cast<std::size_t>(kl), 0);
    dprob.assign(static_cast<std::size_t>(kl), 0);
    for (index_t hk = 0; hk < p.kv_heads; ++hk) {
      mk.assign(static_cast<std::size_t>(kl * p.dk), 0);
      mv.assign(static_cast<std::size_t>(kl * p.dv), 0);
      for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
        const MaskContext ctx{b, h, ql, kl};
        for (index_t i = 0; i < ql; ++i) {
          const float l = lse.data()[p.lse_index(b, h, i)];
          if (!std::isfinite(l)) continue;
          const float* q = row(p.q, p.q_token(b, i), h, p.heads, p.dk);
          const float* dout = row(p.dout, p.q_token(b, i), h, p.heads, p.dv);
          double big_d = 0;
          for (index_t j = 0; j < kl; ++j) {
            prob[static_cast<std::size_t>(j)] = dprob[static_cast<std::size_t>(j)] = 0;
            if (!bm.allowed(ctx, i, j)) continue;
            const float* k = row(p.k, p.kv_token(b, j), hk, p.kv_heads, p.dk);
            const float* v = row(p.v, p.kv_token(b, j), hk, p.kv_heads, p.dv);
            double dot = 0, dp = 0;
            for (index_t e = 0; e < p.dk; ++e) dot += static_cast<double>(q[e]) * k[e];
            for (index_t e = 0; e < p.dv; ++e) dp += static_cast<double>(dout[e]) * v[e];
            double z = scale * dot;
            if (p.softcap > 0) z = p.softcap * std::tanh(z / p.softcap);
            const double pr = std::exp(z - l);
            if (!std::isfinite(pr) || !std::isfinite(dp)) continue;
            prob[static_cast<std::size_t>(j)] = pr;
            dprob[static_cast<std::size_t>(j)] = dp;
            big_d += pr * dp;
          }
          double dq_max = 0;
          std::vector<double> dq_sum(static_cast<std::size_t>(p.dk), 0);
          for (index_t j = 0; j < kl; ++j) {
            const double pr = prob[static_cast<std::size_t>(j)];
            if (pr == 0) continue;
            const double a = pr * (std::abs(dprob[static_cast<std::size_t>(j)]) + std::abs(big_d));
            const float* k = row(p.k, p.kv_token(b, j), hk, p.kv_heads, p.dk);
            for (index_t e = 0; e < p.dk; ++e) {
              if (std::isfinite(q[e])) mk[static_cast<std::size_t>(j * p.dk + e)] += scale * a * std::abs(q[e]);
              if (std::isfinite(k[e])) dq_sum[static_cast<std::size_t>(e)] += scale * a * std::abs(k[e]);
            }
            for (index_t e = 0; e < p.dv; ++e) {
              if (std::isfinite(dout[e])) mv[static_cast<std::size_t>(j * p.dv + e)] += pr * std::abs(dout[e]);
            }
          }
          for (double x : dq_sum) dq_max = std::max(dq_max, x);
          m.dq = std::max(m.dq, dq_max);
        }
      }
      for (double x : mk) m.dk = std::max(m.dk, x);
      for (double x : mv) m.dv = std::max(m.dv, x);
    }
  }
  return m;
}

template <class M>
void compare(Problem& p, const M& mask) {
  // Replaying a reproducer with FUZZ_VERBOSE=1 prints the problem.
  static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(
        stderr,
        "problem: %s, %lld sequences (sq %lld, skv %lld; tokens q %lld, kv %lld), heads %lld over %lld, dk %lld, "
        "dv %lld, scale %g, softcap %g, %zu sinks, kv_splits %lld, workers %d, backward %d, non-finite %d, "
        "gradients mode %d, prebuilt %d, must_reject %d\n",
        p.thd ? "THD" : "BSHD", (long long)p.sequences, (long long)p.sq, (long long)p.skv, (long long)p.tq,
        (long long)p.tkv, (long long)p.heads, (long long)p.kv_heads, (long long)p.dk, (long long)p.dv, p.scale,
        p.softcap, p.sinks.size(), (long long)p.kv_splits, p.workers, int(p.backward), int(p.nonfinite), int(p.grads),
        p.prebuilt, int(p.must_reject));
    for (index_t b = 0; b < p.sequences && p.thd; ++b) {
      std::fprintf(stderr, "  segment %lld: q [%d, +%d), kv [%d, +%d)\n", (long long)b, p.q_off[b], p.q_len[b],
                   p.kv_off[b], p.kv_len[b]);
    }
  }
  const std::optional<Result> want = run<backends::Reference>(p, mask);
  const std::optional<Result> got = run<backends::Highway>(p, mask);
  FUZZ_CHECK(want.has_value() == got.has_value(), "Reference %s the request but Highway %s it",
             want ? "accepted" : "rejected", got ? "accepted" : "rejected");
  FUZZ_CHECK(!(p.must_reject && want),
             "an invalid request was accepted (scale %g, softcap %g, %zu sinks, kv_splits %lld, "
             "workers %d, gradients mode %d)",
             p.scale, p.softcap, p.sinks.size(), (long long)p.kv_splits, p.workers, int(p.grads));
  if (!want) return;
  const bool finite = !p.nonfinite;
  // A NaN or infinity in V reaches an output element by IEEE arithmetic
  // where its key's weight is nonzero. A weight near fp32's underflow (a logit
  // ~87-104 below the row max) is zero or not depending on the running max
  // at the tile that reads the key (online softmax) and, in Reference, on
  // the final max: README, "NaN and infinity". The output elements such a V
  // element can reach (its dim, the query heads of its kv head) are compared
  // only where both backends give finite values.
  const index_t group = p.heads / p.kv_heads;
  const auto value_may_underflow = [&](index_t i) {
    const index_t e = i % p.dv, h = (i / p.dv) % p.heads;
    for (const auto& [kv_head, dim] : p.nonfinite_v) {
      if (dim == e && kv_head == h / group) return true;
    }
    return false;
  };
  compare_values(got->out, want->out, kForwardTol, 2 * max_finite_abs(p.v) * logit_rounding(p) / kForwardTol, finite,
                 "out", value_may_underflow);
  compare_lse(got->lse, want->lse, finite, p.softcap);
  if (!p.backward) return;
  // Open finding (issue 21): with non-finite inputs the backends can disagree
  // on which gradients are NaN where a weight underflows to 0 in one
  // precision and not in the other (Reference works in double). Until the
  // NaN policy defines that edge for gradients, backward with non-finite
  // inputs is compared only with SEQATTN_FUZZ_NONFINITE_BACKWARD=1.
  if (p.nonfinite && std::getenv("SEQATTN_FUZZ_NONFINITE_BACKWARD") == nullptr) return;
  const Magnitudes mag = gradient_magnitudes(p, *want->block_mask, want->lse);
  compare_values(got->dq, want->dq, kBackwardTol, mag.dq, finite, "dq");
  compare_values(got->dk, want->dk, kBackwardTol, mag.dk, finite, "dk");
  compare_values(got->dv, want->dv, kBackwardTol, mag.dv, finite, "dv");
  for (std::size_t h = 0; h < want->dsinks.size(); ++h) {
    const float a = got->dsinks[h], b = want->dsinks[h];
    FUZZ_CHECK(std::isnan(a) == std::isnan(b), "dsinks[%zu]: Highway %g, Reference %g", h, a, b);
    if (finite) FUZZ_CHECK(std::isfinite(a), "dsinks[%zu] = %g from finite inputs", h, a);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      FUZZ_CHECK(std::isnan(a) || a == b, "dsinks[%zu]: Highway %g, Reference %g", h, a, b);
      continue;
    }
    FUZZ_CHECK(std::abs(a - b) <= kBackwardTol * std::max(1.0f, std::abs(b)), "dsinks[%zu] = %g, reference %g", h, a,
               b);
  }
}

index_t head_dim(FuzzedDataProvider& fdp) {
  static constexpr index_t kDims[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 40, 63, 64, 72, 80, 96};
  return kDims[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kDims) - 1)];
}

void fill(Tensor<float>& t, ValueSource& src) {
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = src();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Problem p;
  p.thd = fdp.ConsumeBool();
  p.kv_heads = fdp.ConsumeIntegralInRange<int>(1, 2);
  p.heads = p.kv_heads * fdp.ConsumeIntegralInRange<int>(1, 4);
  p.dk = head_dim(fdp);
  p.dv = fdp.ConsumeBool() ? p.dk : head_dim(fdp);
  bool bad_table = false;
  if (p.thd) {
    // Segments packed with gaps; keys sometimes shared with the previous segment.
    p.sequences = fdp.ConsumeIntegralInRange<int>(1, 4);
    std::int32_t tq = fdp.ConsumeIntegralInRange<std::int32_t>(0, 2), tkv = 0;
    for (index_t b = 0; b < p.sequences; ++b) {
      const auto ql = fdp.ConsumeIntegralInRange<std::int32_t>(0, 40),
                 kl = fdp.ConsumeIntegralInRange<std::int32_t>(0, 48);
      p.q_off.push_back(tq);
      p.q_len.push_back(ql);
      const bool share = b > 0 && fdp.ConsumeIntegralInRange<int>(0, 3) == 0;
      p.kv_off.push_back(share ? p.kv_off.back() : tkv);
      p.kv_len.push_back(kl);
      tq += ql + fdp.ConsumeIntegralInRange<std::int32_t>(0, 2);
      tkv = std::max(tkv, p.kv_off.back() + kl) + fdp.ConsumeIntegralInRange<std::int32_t>(0, 2);
    }
    p.tq = tq;
    p.tkv = tkv;
  } else {
    p.sequences = fdp.ConsumeIntegralInRange<int>(1, 2);
    p.sq = fdp.ConsumeIntegralInRange<int>(1, 48);
    p.skv = fdp.ConsumeIntegralInRange<int>(1, 64);
  }
  // Shrink lengths, then head dims, until the problem is cheap.
  for (;;) {
    double cells = 0;
    for (index_t b = 0; b < p.sequences; ++b) cells += static_cast<double>(p.q_tokens_of(b)) * p.kv_tokens_of(b);
    if (cells * static_cast<double>(p.heads * (p.dk + p.dv)) <= kMaxWork) break;
    if (p.thd) {
      // Halve every segment in place (offsets stay valid: they only shrink the covered part).
      for (std::size_t b = 0; b < p.q_len.size(); ++b) {
        p.q_len[b] /= 2;
        p.kv_len[b] /= 2;
      }
    } else if (p.sq * p.skv > 64) {
      (p.sq >= p.skv ? p.sq : p.skv) /= 2;
    } else {
      p.dk = (p.dk + 1) / 2;
      p.dv = (p.dv + 1) / 2;
    }
  }
  if (p.thd && fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {
    // A segment that reaches past the tokens or has a negative length: rejected.
    const auto b = fdp.ConsumeIntegralInRange<std::size_t>(0, p.q_len.size() - 1);
    if (fdp.ConsumeBool()) {
      p.q_len[b] = static_cast<std::int32_t>(p.tq - p.q_off[b] + 1);
    } else {
      p.kv_len[b] = -1;
    }
    bad_table = true;
  }
  p.table = SegmentTable{p.q_off, p.q_len, p.kv_off, p.kv_len};

  // Variant and plan options, sometimes invalid.
  const int invalid = fdp.ConsumeIntegralInRange<int>(0, 23);
  if (fdp.ConsumeBool()) p.scale = static_cast<float>(fdp.ConsumeIntegralInRange<int>(1, 200)) / 100.0f;
  if (fdp.ConsumeBool()) p.softcap = static_cast<float>(fdp.ConsumeIntegralInRange<int>(1, 30));
  const bool with_sinks = fdp.ConsumeBool();
  p.kv_splits = fdp.ConsumeIntegralInRange<int>(0, 5);
  p.workers = fdp.ConsumeIntegralInRange<int>(1, 2);
  p.backward = fdp.ConsumeBool();
  p.nonfinite = fdp.ConsumeIntegralInRange<int>(0, 7) == 0;
  const int mask_seed_mode = fdp.ConsumeIntegralInRange<int>(0, 2);
  const int prebuilt = fdp.ConsumeIntegralInRange<int>(0, 7);
  p.prebuilt = prebuilt == 0 ? 1 : prebuilt == 1 ? 2 : 0;

  p.q = Tensor<float>(p.thd ? Extents{p.tq, p.heads, p.dk} : Extents{p.sequences, p.sq, p.heads, p.dk});
  p.k = Tensor<float>(p.thd ? Extents{p.tkv, p.kv_heads, p.dk} : Extents{p.sequences, p.skv, p.kv_heads, p.dk});
  p.v = Tensor<float>(p.thd ? Extents{p.tkv, p.kv_heads, p.dv} : Extents{p.sequences, p.skv, p.kv_heads, p.dv});
  p.dout = Tensor<float>(p.thd ? Extents{p.tq, p.heads, p.dv} : Extents{p.sequences, p.sq, p.heads, p.dv});
  const RaggedLengths lengths = p.lengths();

  seqattn::fuzz::guarded([&] {
    // The mask consumes the input before the values do.
    seqattn::fuzz::MaskFactory factory(fdp, lengths, p.heads, false);
    const AnyMask mask = mask_seed_mode == 0 ? AnyMask(CausalMask{}) : factory.make();
    const int nonfinite_count = p.nonfinite ? fdp.ConsumeIntegralInRange<int>(1, 3) : 0;
    std::vector<std::uint32_t> spots;
    for (int i = 0; i < nonfinite_count; ++i) spots.push_back(fdp.ConsumeIntegral<std::uint32_t>());
    ValueSource src{fdp.ConsumeRemainingBytes<std::uint8_t>()};
    fill(p.q, src);
    fill(p.k, src);
    fill(p.v, src);
    fill(p.dout, src);
    if (with_sinks) {
      for (index_t h = 0; h < p.heads; ++h) p.sinks.push_back(src());
    }
    for (const std::uint32_t spot : spots) {
      Tensor<float>* tensors[] = {&p.q, &p.k, &p.v, &p.dout};
      Tensor<float>& t = *tensors[spot % 4];
      if (t.size() == 0) continue;
      const float values[] = {kNaN, kInf, -kInf};
      const index_t at = (spot / 4) % static_cast<std::uint32_t>(t.size());
      t.data()[at] = values[(spot / 16) % 3];
      if (&t == &p.v) p.nonfinite_v.emplace_back((at / p.dv) % p.kv_heads, at % p.dv);
    }
    switch (invalid) {
      case 0:
        p.scale = (invalid + src()) > 0 ? kInf : -kInf;
        p.must_reject = true;
        break;
      case 1:
        p.softcap = src() > 0 ? kInf : -1.0f;
        p.must_reject = true;
        break;
      case 2:
        p.sinks.assign(static_cast<std::size_t>(p.heads), 0.5f);
        p.sinks[0] = src() > 0 ? kNaN : kInf;
        p.must_reject = true;
        break;
      case 3:
        p.sinks.assign(static_cast<std::size_t>(p.heads + 1), 0.5f);
        p.must_reject = true;
        break;
      case 4:
        p.kv_splits = src() > 0 ? -1 : limits::kMaxKvSplits + 1;
        p.must_reject = true;
        break;
      case 5:
        p.workers = src() > 0 ? 0 : src() > 0 ? limits::kMaxThreads + 1 : std::numeric_limits<int>::max();
        p.must_reject = true;
        break;
      case 6:
      case 7:
        if (p.backward) {
          const int which = static_cast<int>(std::abs(src()) * 4) % 4;
          p.grads = which == 0   ? Grads::null_dq
                    : which == 1 ? Grads::dk_over_k
                    : which == 2 ? Grads::dv_over_v
                                 : Grads::dq_is_dk;
          // dq and dk in one buffer only when they have the same shape.
          if (p.grads == Grads::dq_is_dk && !(p.q.shape() == p.k.shape())) p.grads = Grads::dk_over_k;
          p.must_reject = p.q.size() > 0 && p.k.size() > 0 && p.v.size() > 0;
        }
        break;
      default:
        break;
    }
    if (bad_table) p.must_reject = true;
    compare(p, mask);
  });
  return 0;
}
