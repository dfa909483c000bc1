// libFuzzer target: small BSHD attention problems (GQA, ragged-free, fp32)
// with fuzzed values, masks and options (softcap, sinks, kv_splits, 1 or 2
// workers), forward and backward, backends::Highway against
// backends::Reference: every accepted input is compared.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <limits>
#include <vector>

#include "fuzz_common.hpp"

using namespace seqattn;

namespace {

constexpr double kMaxWork = 50000;  // batch * heads * sq * skv * d: keeps a run fast under ASan
constexpr double kForwardTol = 1e-4;
constexpr double kLseTol = 1e-4;
constexpr double kBackwardTol = 1e-3;

// Values in [-4, 4) from the input bytes, cycled (and mixed with the index) when they run out.
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

void fill(Tensor<float>& t, ValueSource& src) {
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = src();
}

double max_abs(const Tensor<float>& t) {
  double m = 0;
  for (index_t i = 0; i < t.size(); ++i) m = std::max(m, static_cast<double>(std::abs(t.data()[i])));
  return m;
}

// max |got - want| / max |want|; NaN or inf anywhere gives +inf.
double relative_error(const Tensor<float>& got, const Tensor<float>& want) {
  double err = 0;
  for (index_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got.data()[i]) - want.data()[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    err = std::max(err, d);
  }
  const double ref = max_abs(want);
  return err == 0 ? 0 : err / std::max(ref, 1e-30);
}

void check_lse(const Tensor<float>& got, const Tensor<float>& want) {
  for (index_t i = 0; i < want.size(); ++i) {
    const float a = got.data()[i], b = want.data()[i];
    if (std::isinf(b) && b < 0) {
      FUZZ_CHECK(std::isinf(a) && a < 0, "lse[%lld] = %g but the reference is -inf", (long long)i, a);
      continue;
    }
    FUZZ_CHECK(std::abs(a - b) <= kLseTol * std::max(1.0f, std::abs(b)), "lse[%lld] = %.9g, reference %.9g",
               (long long)i, a, b);
  }
}

struct Problem {
  index_t batch, sq, skv, kv_heads, heads, d;
  Tensor<float> q, k, v, dout;
  std::vector<float> sinks;
  float softcap = 0;
  index_t kv_splits = 0;
  int workers = 1;
  bool backward = false;

  AttentionInputs<float> inputs() const { return {q.view(), k.view(), v.view(), nullptr}; }
  Extents out_shape() const { return Extents{batch, sq, heads, d}; }
  Extents lse_shape() const { return Extents{batch, heads, sq}; }
  variants::Standard variant() const {
    return variants::Standard{std::numeric_limits<float>::quiet_NaN(), {softcap}, {sinks}};
  }
};

struct Result {
  Tensor<float> out, lse, dq, dk, dv;
  std::vector<float> dsinks;
};

template <class Backend, class M, class Exec>
Result run(const Problem& p, const M& mask, Exec&& exec, int workers) {
  PlanOptions options;
  options.kv_splits = p.kv_splits;
  options.backward = p.backward;
  const auto plan = plan_attention<Backend>(shape_of(p.inputs()), mask, options, workers);
  Result r{Tensor<float>(p.out_shape(), 7.0f), Tensor<float>(p.lse_shape(), 7.0f), {}, {}, {}, {}};
  attention_forward(plan, p.inputs(), r.out.view(), r.lse.view(), p.variant(), exec);
  if (p.backward) {
    r.dq = Tensor<float>(p.q.shape(), 7.0f);
    r.dk = Tensor<float>(p.k.shape(), 7.0f);
    r.dv = Tensor<float>(p.v.shape(), 7.0f);
    r.dsinks.assign(p.sinks.size(), 7.0f);
    attention_backward(plan, p.inputs(), r.out.view(), r.lse.view(), p.dout.view(),
                       AttentionGrads<float>{r.dq.view(), r.dk.view(), r.dv.view(), r.dsinks}, p.variant(), exec);
  }
  return r;
}

// Magnitudes of the terms that cancel in each gradient, in double from the
// reference's LSE: with A_ij = P_ij (|dP_ij| + |D_i|), dq_i <= scale sum_j A_ij |k_j|,
// dk_j <= scale sum_i A_ij |q_i|, dv_j <= sum_i P_ij |dout_i|. A gradient that
// is small only because large terms cancel is compared against these, not
// against its own (tiny) maximum, which float rounding cannot meet.
struct Magnitudes {
  double dq = 0, dk = 0, dv = 0;
};

template <class M>
Magnitudes gradient_magnitudes(const Problem& p, const M& mask, const Tensor<float>& lse) {
  Magnitudes m;
  const index_t group = p.heads / p.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  const auto at = [&](const Tensor<float>& t, index_t b, index_t s, index_t h, index_t heads, index_t len) {
    return t.data() + ((b * len + s) * heads + h) * p.d;
  };
  std::vector<double> mk(static_cast<std::size_t>(p.skv * p.d)), mv(mk.size()), prob(static_cast<std::size_t>(p.skv)),
      dprob(prob.size());
  for (index_t b = 0; b < p.batch; ++b) {
    for (index_t h = 0; h < p.heads; ++h) {
      const MaskContext ctx{b, h, p.sq, p.skv};
      std::fill(mk.begin(), mk.end(), 0.0);
      std::fill(mv.begin(), mv.end(), 0.0);
      for (index_t i = 0; i < p.sq; ++i) {
        const float l = lse.data()[(b * p.heads + h) * p.sq + i];
        if (!std::isfinite(l)) continue;
        const float* q = at(p.q, b, i, h, p.heads, p.sq);
        const float* dout = at(p.dout, b, i, h, p.heads, p.sq);
        double big_d = 0;
        for (index_t j = 0; j < p.skv; ++j) {
          prob[static_cast<std::size_t>(j)] = dprob[static_cast<std::size_t>(j)] = 0;
          if (!mask.allowed(ctx, i, j)) continue;
          const float* k = at(p.k, b, j, h / group, p.kv_heads, p.skv);
          const float* v = at(p.v, b, j, h / group, p.kv_heads, p.skv);
          double dot = 0, dp = 0;
          for (index_t e = 0; e < p.d; ++e) {
            dot += static_cast<double>(q[e]) * k[e];
            dp += static_cast<double>(dout[e]) * v[e];
          }
          double z = scale * dot;
          if (p.softcap > 0) z = p.softcap * std::tanh(z / p.softcap);
          prob[static_cast<std::size_t>(j)] = std::exp(z - l);
          dprob[static_cast<std::size_t>(j)] = dp;
          big_d += prob[static_cast<std::size_t>(j)] * dp;
        }
        for (index_t j = 0; j < p.skv; ++j) {
          const double pr = prob[static_cast<std::size_t>(j)];
          if (pr == 0) continue;
          const double a = pr * (std::abs(dprob[static_cast<std::size_t>(j)]) + std::abs(big_d));
          for (index_t e = 0; e < p.d; ++e) {
            mk[static_cast<std::size_t>(j * p.d + e)] += scale * a * std::abs(q[e]);
            mv[static_cast<std::size_t>(j * p.d + e)] += pr * std::abs(dout[e]);
          }
        }
        // dq_i: the full sum over j for each e.
        for (index_t e = 0; e < p.d; ++e) {
          double sum = 0;
          for (index_t j = 0; j < p.skv; ++j) {
            const double pr = prob[static_cast<std::size_t>(j)];
            if (pr == 0) continue;
            const double a = pr * (std::abs(dprob[static_cast<std::size_t>(j)]) + std::abs(big_d));
            sum += scale * a * std::abs(at(p.k, b, j, h / group, p.kv_heads, p.skv)[e]);
          }
          m.dq = std::max(m.dq, sum);
        }
      }
      for (double x : mk) m.dk = std::max(m.dk, x);
      for (double x : mv) m.dv = std::max(m.dv, x);
    }
  }
  return m;
}

// max |got - want| / max(max |want|, magnitude): NaN or inf anywhere gives +inf.
double gradient_error(const Tensor<float>& got, const Tensor<float>& want, double magnitude) {
  double err = 0;
  for (index_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got.data()[i]) - want.data()[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    err = std::max(err, d);
  }
  return err == 0 ? 0 : err / std::max({max_abs(want), magnitude, 1e-30});
}

template <class M>
void compare(const Problem& p, const M& mask) {
  const Result want = run<backends::Reference>(p, mask, execution::Serial{}, 1);
  execution::ThreadPool pool(p.workers);
  const Result got = run<backends::Highway>(p, mask, pool, p.workers);
  const double out_err = relative_error(got.out, want.out);
  FUZZ_CHECK(out_err <= kForwardTol, "forward out relative error %g (max |ref| %g)", out_err, max_abs(want.out));
  check_lse(got.lse, want.lse);
  if (!p.backward) return;
  const Magnitudes mag = gradient_magnitudes(p, mask, want.lse);
  const double dq = gradient_error(got.dq, want.dq, mag.dq), dk = gradient_error(got.dk, want.dk, mag.dk),
               dv = gradient_error(got.dv, want.dv, mag.dv);
  FUZZ_CHECK(dq <= kBackwardTol && dk <= kBackwardTol && dv <= kBackwardTol,
             "backward relative errors dq %g dk %g dv %g (max |ref| %g %g %g, term magnitudes %g %g %g)", dq, dk, dv,
             max_abs(want.dq), max_abs(want.dk), max_abs(want.dv), mag.dq, mag.dk, mag.dv);
  for (std::size_t h = 0; h < want.dsinks.size(); ++h) {
    FUZZ_CHECK(std::abs(got.dsinks[h] - want.dsinks[h]) <= kBackwardTol * std::max(1.0f, std::abs(want.dsinks[h])),
               "dsinks[%zu] = %g, reference %g", h, got.dsinks[h], want.dsinks[h]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Problem p;
  p.batch = fdp.ConsumeIntegralInRange<int>(1, 2);
  p.sq = fdp.ConsumeIntegralInRange<int>(1, 70);
  p.skv = fdp.ConsumeIntegralInRange<int>(1, 90);
  p.kv_heads = fdp.ConsumeIntegralInRange<int>(1, 2);
  p.heads = p.kv_heads * fdp.ConsumeIntegralInRange<int>(1, 4);
  p.d = fdp.ConsumeIntegralInRange<int>(1, 80);
  // Shrink the largest of (sq, skv, d) until the problem is cheap.
  while (static_cast<double>(p.batch * p.heads) * static_cast<double>(p.sq * p.skv * p.d) > kMaxWork) {
    index_t* largest = &p.sq;
    if (p.skv > *largest) largest = &p.skv;
    if (p.d > *largest) largest = &p.d;
    *largest = (*largest + 1) / 2;
  }
  const int which_mask = fdp.ConsumeIntegralInRange<int>(0, 6);
  const bool alt_alignment = fdp.ConsumeBool();
  SlidingWindowMask window;
  window.left = fdp.ConsumeIntegralInRange<int>(-1, 40);
  window.right = fdp.ConsumeIntegralInRange<int>(-1, 40);
  window.alignment = alt_alignment ? Alignment::bottom_right : Alignment::top_left;
  ChunkedCausalMask chunked;
  chunked.chunk = fdp.ConsumeIntegralInRange<int>(1, 40);
  chunked.alignment = window.alignment;
  p.softcap = fdp.ConsumeBool() ? 0.0f : static_cast<float>(fdp.ConsumeIntegralInRange<int>(1, 30));
  const bool with_sinks = fdp.ConsumeBool();
  p.kv_splits = fdp.ConsumeIntegralInRange<int>(0, 5);
  p.workers = fdp.ConsumeBool() ? 2 : 1;
  p.backward = fdp.ConsumeBool();

  ValueSource src{fdp.ConsumeRemainingBytes<std::uint8_t>()};
  p.q = Tensor<float>(Extents{p.batch, p.sq, p.heads, p.d});
  p.k = Tensor<float>(Extents{p.batch, p.skv, p.kv_heads, p.d});
  p.v = Tensor<float>(Extents{p.batch, p.skv, p.kv_heads, p.d});
  p.dout = Tensor<float>(Extents{p.batch, p.sq, p.heads, p.d});
  fill(p.q, src);
  fill(p.k, src);
  fill(p.v, src);
  fill(p.dout, src);
  if (with_sinks) {
    for (index_t h = 0; h < p.heads; ++h) p.sinks.push_back(src());
  }

  seqattn::fuzz::guarded([&] {
    const CausalMask causal{window.alignment};
    switch (which_mask) {
      case 0:
        compare(p, FullMask{});
        break;
      case 1:
        compare(p, causal);
        break;
      case 2:
        compare(p, window);
        break;
      case 3:
        compare(p, chunked);
        break;
      case 4:
        compare(p, causal & ~window);  // may leave rows fully masked
        break;
      case 5: {
        PrefixLMMask prefix;
        prefix.prefix = window.left < 0 ? 0 : window.left;
        prefix.alignment = window.alignment;
        compare(p, prefix);
        break;
      }
      default:
        compare(p, window | chunked);
        break;
    }
  });
  return 0;
}
