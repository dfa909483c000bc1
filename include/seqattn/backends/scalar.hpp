// The portable tiled backend: the engine's tile contract in plain C++.
//
// It tiles exactly like the SIMD backend (same block shape, same transposed
// layouts), so it exercises every engine path on any compiler and target;
// its loops run unit-stride on the innermost index so compilers may
// auto-vectorize them. It is also the specification of the TileKernel
// contract (backends/tile_kernel.hpp) that backends/highway-inl.h implements
// with explicit vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "seqattn/backends/cpu_tiled.hpp"
#include "seqattn/backends/tile_kernel.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn::backends {

struct ScalarKernel {
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  static constexpr index_t kBlockQ = 64;   // query rows per tile
  static constexpr index_t kBlockKv = 64;  // keys per tile

  // Rows the kernels compute (rows_p >= rows, padding queries are zero).
  static index_t padded_rows(index_t rows) { return rows; }
  // Width of the O accumulator rows for head dim dv (V rows are padded to it).
  static index_t padded_dim(index_t dv) { return dv; }

  template <class T>
  static void to_f32(const T* src, index_t n, float* dst) {
    for (index_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  }

  // St[j][r] = sum_d K[j][d] * Qt[d][r] for j < cols, r < rows_p. The
  // specification leaves out the prefetch hint (RowsAhead) here and below.
  static void scores(const float* qt, index_t rows_p, index_t dk, const float* k, index_t k_stride, index_t cols,
                     float* st, const RowsAhead& = {}) {
    for (index_t j = 0; j < cols; ++j) {
      float* s = st + j * kBlockQ;
      std::fill_n(s, rows_p, 0.0f);
      for (index_t d = 0; d < dk; ++d) {
        const float kd = k[j * k_stride + d];
        const float* q = qt + d * kBlockQ;
        for (index_t r = 0; r < rows_p; ++r) s[r] += kd * q[r];
      }
    }
  }

  static void softcap(float* st, index_t cols, index_t rows_p, float cap) {
    for (index_t j = 0; j < cols; ++j) {
      for (index_t r = 0; r < rows_p; ++r) st[j * kBlockQ + r] = cap * std::tanh(st[j * kBlockQ + r]);
    }
  }

  // max that keeps a NaN from either side (std::max drops a NaN second argument).
  static float nan_max(float a, float b) { return std::isnan(a) || a > b ? a : b; }

  // One online-softmax step per row r < rows_p: m = max(m, max_j St), the
  // scores become exp(St - m), l = l * alpha + sum_j exp(St - m) with
  // alpha = exp(m_old - m). A row that has seen only -inf keeps m = -inf and
  // uses 0 as its reference so no -inf - -inf arises. NaN policy
  // (attention/softmax_state.hpp): a NaN score, or a +inf one (exp(inf - inf)),
  // makes l NaN, and then m and alpha NaN too (alpha NaN turns O NaN).
  // Returns whether some weight is below the smallest normal float, zero
  // included (masked and underflowed keys, NaN rows): where none is, P.V
  // needs no zero-weight guard (accumulate_pv_unguarded).
  static bool online_softmax(float* st, index_t cols, index_t rows_p, float* m, float* l, float* alpha) {
    bool tiny = false;
    for (index_t r = 0; r < rows_p; ++r) {
      float mx = kNegInf;
      for (index_t j = 0; j < cols; ++j) mx = nan_max(st[j * kBlockQ + r], mx);
      const float m_new = nan_max(mx, m[r]);
      const float ref = m_new == kNegInf ? 0.0f : m_new;
      alpha[r] = std::exp(m[r] - ref);
      float sum = 0.0f;
      for (index_t j = 0; j < cols; ++j) {
        const float e = std::exp(st[j * kBlockQ + r] - ref);
        st[j * kBlockQ + r] = e;
        sum += e;
        tiny |= !(e >= std::numeric_limits<float>::min());
      }
      l[r] = l[r] * alpha[r] + sum;
      m[r] = m_new;
      if (std::isnan(l[r])) m[r] = alpha[r] = l[r];  // NaN rows: the whole state NaN, on every kernel alike
    }
    return tiny;
  }

  // Backward: P = exp(S - lse), then dP -> dS = P * (dP - delta), with lse
  // and delta given per lane r (lanes) or per column j (columns). An lse of
  // +inf gives P = 0 (rows that saw nothing, padding). NaN policy: a masked
  // score (-inf) gives P = 0 and dS = 0 even where lse is NaN or dP is NaN
  // (a hidden V row); elsewhere NaN propagates.
  static void softmax_backward_lanes(float* s, float* dp, index_t cols, index_t rows_p, const float* lse,
                                     const float* delta) {
    softmax_backward<true>(s, dp, cols, rows_p, lse, delta);
  }
  static void softmax_backward_columns(float* s, float* dp, index_t cols, index_t rows_p, const float* lse,
                                       const float* delta) {
    softmax_backward<false>(s, dp, cols, rows_p, lse, delta);
  }
  template <bool kPerLane>
  static void softmax_backward(float* s, float* dp, index_t cols, index_t rows_p, const float* lse,
                               const float* delta) {
    for (index_t j = 0; j < cols; ++j) {
      for (index_t r = 0; r < rows_p; ++r) {
        const index_t k = kPerLane ? r : j;
        const float x = s[j * kBlockQ + r];
        const float p = x == kNegInf ? 0.0f : std::exp(x - lse[k]);
        s[j * kBlockQ + r] = p;
        dp[j * kBlockQ + r] = p == 0.0f ? 0.0f : p * (dp[j * kBlockQ + r] - delta[k]);
      }
    }
  }

  // St[j][r] = -inf where bit r of key j's row bits is clear.
  static void apply_column_bits(float* st, index_t cols, index_t rows_p, const std::uint8_t* bits,
                                index_t bytes_per_key) {
    for (index_t j = 0; j < cols; ++j) {
      const std::uint8_t* key = bits + j * bytes_per_key;
      for (index_t r = 0; r < rows_p; ++r) {
        if (!((key[r / 8] >> (r % 8)) & 1u)) st[j * kBlockQ + r] = kNegInf;
      }
    }
  }

  // O[r][e] = alpha[r] * O[r][e] + sum_j Pt[j][r] * V[j][e] for r < rows, e < dvp,
  // where a zero weight Pt[j][r] skips V[j] (NaN policy: 0 * NaN must not
  // reach O; a masked or underflowed key's V may hold anything).
  static void accumulate_pv(const float* pt, index_t rows, index_t cols, const float* v, index_t v_stride, index_t dvp,
                            const float* alpha, float* o, const RowsAhead& = {}) {
    AccumulatePv<true>(pt, rows, cols, v, v_stride, dvp, alpha, o);
  }

  // accumulate_pv where the caller knows that no weight is below the smallest
  // normal float (online_softmax said so), or that V is finite: every weight
  // multiplies its V row.
  static void accumulate_pv_unguarded(const float* pt, index_t rows, index_t cols, const float* v, index_t v_stride,
                                      index_t dvp, const float* alpha, float* o, const RowsAhead& = {}) {
    AccumulatePv<false>(pt, rows, cols, v, v_stride, dvp, alpha, o);
  }

  // dst[d][r] = rows[r][d] * scale for r < n, d < width (kBlockQ floats per
  // dst row), lanes [n, n_p) zero: Q into Qt, and the backward's Kt, Vt, dS^T.
  static void transpose_rows(const float* const* rows, index_t n, index_t n_p, index_t width, float scale, float* dst) {
    transpose_rows_by_element<kBlockQ>(rows, n, n_p, width, scale, dst);
  }

 private:
  // kSelect: a zero weight skips its V row (accumulate_pv), else every
  // weight multiplies its row (accumulate_pv_unguarded).
  template <bool kSelect>
  static void AccumulatePv(const float* pt, index_t rows, index_t cols, const float* v, index_t v_stride, index_t dvp,
                           const float* alpha, float* o) {
    for (index_t r = 0; r < rows; ++r) {
      float* out = o + r * dvp;
      for (index_t e = 0; e < dvp; ++e) out[e] *= alpha[r];
      for (index_t j = 0; j < cols; ++j) {
        const float pj = pt[j * kBlockQ + r];
        if (kSelect && pj == 0.0f) continue;
        const float* vj = v + j * v_stride;
        for (index_t e = 0; e < dvp; ++e) out[e] += pj * vj[e];
      }
    }
  }
};

// Policy type: the portable tiled backend.
struct Scalar : CpuTiled<ScalarKernel> {
  static const char* name() { return "Scalar"; }
};

}  // namespace seqattn::backends
