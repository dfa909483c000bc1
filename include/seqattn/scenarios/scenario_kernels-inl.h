// Highway SIMD kernels of the scenarios: the DSA lightning indexer's scoring
// (scenarios/dsa.hpp) and Kascade's anchor pooling (scenarios/kascade.hpp).
//
// Included once per Highway target by src/scenario_kernels.cc through
// foreach_target.h (hence the toggle guard and seqattn::HWY_NAMESPACE); the
// scenario headers reach them through the runtime-dispatch entry point
// dispatch::scenario_kernels() (scenarios/kernels.hpp), never through static
// dispatch, so a scenario runs the best target of the CPU whatever flags its
// translation unit was built with.
//
// Key layout shared by the kernels: keys in chunks of W = chunk_width() = 2
// vectors, [n / W][d][W], zero-padded, so each chunk's d x W floats are
// contiguous (a plain [d][s] transpose has a stride of s floats between
// dimensions, which 4K-aliases in L1 and ran 15x slower).
//
// index_rows (DSA), for two query rows at a time and keys [0, n), n a multiple of W:
//   out[r][j] = sum_h relu(sum_c q[r][h][c] kt[c][j]) w[r][h]
// Tile: 2 rows x W keys (2 vectors: 16 keys on AVX2, 32 on AVX-512); per
// dimension c, 2 key loads feed 4 FMAs. 8 dot accumulators (two sets for
// even/odd c) + 4 totals + 4 key vectors = 16 registers: all of AVX2's, half
// of AVX-512's. kt is streamed once per row pair (d x n floats, L2-resident up
// to n of several thousand). Measured on Zen 4 (EPYC, AVX-512), bench/scenarios.cpp.
// relu is hn::Max(dot, 0), which returns 0 for a NaN dot on every target
// (Highway's Max returns the other operand of a NaN); +-inf follow IEEE.
//
// pool_scores (Kascade): p[j] = q . k_j for keys [0, n), n a multiple of W.
//   2 vector accumulators, 2 loads + 2 FMAs per dimension: load-bound, but
//   contiguous (a [D][Lk] transpose 4K-aliases in L1 for Lk = 4096).
// pool_softmax (Kascade): p <- exp(p - max) over [0, n), then
//   dst[j] += p[j] / sum for j < before (before <= n); hn::Exp keeps the n
//   exps per row (the anchor's dominant cost when scalar) in SIMD. p holds
//   finite scores or -inf (weight 0), at least one finite.
//
// Targets without FMA (SSSE3, SSE4, the portable one) round MulAdd as a
// multiply then an add, so their results may differ from the others' in the
// last bits; tests/scenarios/scenario_kernels_test.cpp checks every target.

// Non-SIMD includes: normal include guard.
#ifndef SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_DEPS
#define SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_DEPS
#include <algorithm>
#include <cmath>
#include <limits>

#include "seqattn/core/tensor.hpp"
#endif

#if defined(SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_
#undef SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_
#else
#define SEQATTN_SCENARIOS_SCENARIO_KERNELS_INL_H_
#endif

#include <hwy/highway.h>
// clang-format off
#include <hwy/contrib/math/math-inl.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqattn::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

struct ScenarioSimd {
  // Keys per chunk of the [n / W][d][W] layout: two vectors.
  static index_t chunk_width() { return 2 * static_cast<index_t>(hn::Lanes(hn::ScalableTag<float>())); }

  static void index_rows(const float* HWY_RESTRICT q, const float* HWY_RESTRICT w, index_t h, index_t d,
                         const float* HWY_RESTRICT kt, index_t n, float* HWY_RESTRICT out0, float* HWY_RESTRICT out1) {
    const hn::ScalableTag<float> df;
    const auto lanes = static_cast<index_t>(hn::Lanes(df));
    const auto zero = hn::Zero(df);
    for (index_t j0 = 0; j0 < n; j0 += 2 * lanes) {
      const float* chunk = kt + j0 * d;  // [d][2 * lanes]
      auto t00 = zero, t01 = zero, t10 = zero, t11 = zero;
      for (index_t hh = 0; hh < h; ++hh) {
        // Two sets of 4 accumulators (even and odd c): 8 independent FMA chains
        // hide the FMA latency (4 cycles x 2 per cycle); 4 would halve throughput.
        auto a00 = zero, a01 = zero, a10 = zero, a11 = zero;
        auto e00 = zero, e01 = zero, e10 = zero, e11 = zero;
        const float* q0 = q + hh * d;
        const float* q1 = q + (h + hh) * d;
        index_t c = 0;
        for (; c + 2 <= d; c += 2) {
          const float* kc = chunk + c * 2 * lanes;
          const auto k0 = hn::LoadU(df, kc);
          const auto k1 = hn::LoadU(df, kc + lanes);
          const auto k2 = hn::LoadU(df, kc + 2 * lanes);
          const auto k3 = hn::LoadU(df, kc + 3 * lanes);
          a00 = hn::MulAdd(hn::Set(df, q0[c]), k0, a00);
          a01 = hn::MulAdd(hn::Set(df, q0[c]), k1, a01);
          a10 = hn::MulAdd(hn::Set(df, q1[c]), k0, a10);
          a11 = hn::MulAdd(hn::Set(df, q1[c]), k1, a11);
          e00 = hn::MulAdd(hn::Set(df, q0[c + 1]), k2, e00);
          e01 = hn::MulAdd(hn::Set(df, q0[c + 1]), k3, e01);
          e10 = hn::MulAdd(hn::Set(df, q1[c + 1]), k2, e10);
          e11 = hn::MulAdd(hn::Set(df, q1[c + 1]), k3, e11);
        }
        if (c < d) {
          const float* kc = chunk + c * 2 * lanes;
          a00 = hn::MulAdd(hn::Set(df, q0[c]), hn::LoadU(df, kc), a00);
          a01 = hn::MulAdd(hn::Set(df, q0[c]), hn::LoadU(df, kc + lanes), a01);
          a10 = hn::MulAdd(hn::Set(df, q1[c]), hn::LoadU(df, kc), a10);
          a11 = hn::MulAdd(hn::Set(df, q1[c]), hn::LoadU(df, kc + lanes), a11);
        }
        const auto w0 = hn::Set(df, w[hh]);
        const auto w1 = hn::Set(df, w[h + hh]);
        t00 = hn::MulAdd(hn::Max(hn::Add(a00, e00), zero), w0, t00);
        t01 = hn::MulAdd(hn::Max(hn::Add(a01, e01), zero), w0, t01);
        t10 = hn::MulAdd(hn::Max(hn::Add(a10, e10), zero), w1, t10);
        t11 = hn::MulAdd(hn::Max(hn::Add(a11, e11), zero), w1, t11);
      }
      hn::StoreU(t00, df, out0 + j0);
      hn::StoreU(t01, df, out0 + j0 + lanes);
      hn::StoreU(t10, df, out1 + j0);
      hn::StoreU(t11, df, out1 + j0 + lanes);
    }
  }

  static void pool_scores(const float* HWY_RESTRICT q, index_t d, const float* HWY_RESTRICT kt, index_t n,
                          float* HWY_RESTRICT p) {
    const hn::ScalableTag<float> df;
    const auto lanes = static_cast<index_t>(hn::Lanes(df));
    for (index_t j0 = 0; j0 < n; j0 += 2 * lanes) {
      const float* chunk = kt + j0 * d;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df);
      for (index_t c = 0; c < d; ++c) {
        const auto b = hn::Set(df, q[c]);
        a0 = hn::MulAdd(b, hn::LoadU(df, chunk + c * 2 * lanes), a0);
        a1 = hn::MulAdd(b, hn::LoadU(df, chunk + c * 2 * lanes + lanes), a1);
      }
      hn::StoreU(a0, df, p + j0);
      hn::StoreU(a1, df, p + j0 + lanes);
    }
  }

  static void pool_softmax(float* HWY_RESTRICT p, index_t n, index_t before, float* HWY_RESTRICT dst) {
    const hn::ScalableTag<float> df;
    const auto lanes = static_cast<index_t>(hn::Lanes(df));
    auto vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
    index_t j = 0;
    for (; j + lanes <= n; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, p + j));
    float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (; j < n; ++j) m = std::max(m, p[j]);
    const auto vm = hn::Set(df, m);
    auto vsum = hn::Zero(df);
    for (j = 0; j + lanes <= n; j += lanes) {
      const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, p + j), vm));
      hn::StoreU(e, df, p + j);
      vsum = hn::Add(vsum, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
    for (; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
    const float inv = 1.0f / sum;
    const auto vinv = hn::Set(df, inv);
    for (j = 0; j + lanes <= before; j += lanes) {
      hn::StoreU(hn::MulAdd(hn::LoadU(df, p + j), vinv, hn::LoadU(df, dst + j)), df, dst + j);
    }
    for (; j < before; ++j) dst[j] += p[j] * inv;
  }
};

}  // namespace seqattn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
