// The contract between the CPU tiled engine (attention/detail/tiled_forward.hpp)
// and a backend's arithmetic on fp32 tiles. backends/scalar.hpp is its
// specification in plain C++; backends/highway-inl.h implements it with SIMD.
//
//   kBlockQ, kBlockKv                    tile shape (query rows x keys)
//   padded_rows(rows), padded_dim(dv)    how far rows and head dims are padded
//   to_f32(src, n, dst)                  storage -> fp32 for one contiguous row (float, bfloat16)
//   scores(qt, rows_p, dk, k, k_stride, cols, st[, ahead])  St[j][r] = sum_d K[j][d] Qt[d][r]
//   softcap(st, cols, rows_p, cap)                    St = cap * tanh(St)
//   apply_column_bits(st, cols, rows_p, bits, bytes_per_key)  St[j][r] = -inf where bit r of key j is 0
//   online_softmax(st, cols, rows_p, m, l, alpha)     St -> P, running max/sum, rescale factors
//   accumulate_pv(pt, rows, cols, v, v_stride, dvp, alpha, o[, ahead])  O = alpha * O + P V
//   softmax_backward_lanes(s, dp, cols, rows_p, lse, delta)    P = exp(S - lse[r]), dS = P (dP - delta[r])
//   softmax_backward_columns(s, dp, cols, rows_p, lse, delta)  the same with lse[j], delta[j]
//   transpose_rows(rows, n, n_p, width, scale, dst)  dst[d][r] = rows[r][d] * scale, lanes [n, n_p) zero
//
// St and Qt have a row stride of kBlockQ; O has dvp floats per row. `ahead`
// (RowsAhead) names rows to request from memory while the call streams its
// own: a hint with no effect on any value, which a kernel may ignore.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/tensor.hpp"

// Inlined into its caller whatever the compiler's heuristics say.
#if defined(__GNUC__) || defined(__clang__)
#define SEQATTN_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define SEQATTN_ALWAYS_INLINE inline
#endif

namespace seqattn {

// Rows of K or V that a tile kernel prefetches while it streams a tile of its
// own, spread over its key loop: decode reads every K and V row once at a few
// FLOP per byte, and its loads overlap its arithmetic only when the next rows
// are requested a few KiB ahead while this tile computes, a few rows at a
// time: the same requests in one burst at the start of a kernel call fill the
// core's miss buffers and stall the loads behind them (measured in
// tiled_forward.hpp's decode notes). The engine fills it in decode only
// (tiled_forward.hpp, decode_rows_ahead).
struct RowsAhead {
  const void* const* rows = nullptr;  // n row pointers
  index_t n = 0;
  index_t bytes = 0;                // read from each row
  const RowsAhead* also = nullptr;  // another list, requested over the same keys

  // Whether neither this list nor the ones it chains name a row.
  bool empty() const { return n == 0 && (also == nullptr || also->empty()); }

  // Requests the rows that belong to keys [j, j + keys) of a loop over
  // `cols` keys: the rows in proportion, so that the loop's end has asked
  // for all of them; then those of `also`. Inlined: a call from a kernel's
  // loop would spill its accumulators (every vector register is caller-saved).
  SEQATTN_ALWAYS_INLINE void part(index_t j, index_t keys, index_t cols) const {
    for (const RowsAhead* list = this; list != nullptr; list = list->also) {
      if (list->n == 0) continue;
      index_t lo = j, hi = std::min(j + keys, cols);
      if (list->n != cols) {  // a tile's rows over another's keys (the task's last): in proportion
        lo = lo * list->n / cols;
        hi = hi * list->n / cols;
      }
      for (index_t r = lo; r < hi; ++r) {
        const char* row = static_cast<const char*>(list->rows[r]);
        for (index_t b = 0; b < list->bytes; b += 64) prefetch_line(row + b);
      }
    }
  }

  // One cache line into L1. Not __builtin_prefetch: GCC 12 deletes a loop
  // whose body is only that builtin as a loop without side effects (no
  // prefetch instruction was left in the binary), which an asm statement
  // with a memory operand is not.
  SEQATTN_ALWAYS_INLINE static void prefetch_line(const char* p) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    asm volatile("prefetcht0 %0" : : "m"(*p));
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    asm volatile("prfm pldl1keep, %0" : : "Q"(*p));
#else
    static_cast<void>(p);
#endif
  }
};

// transpose_rows element by element, dst rows kBlockQ floats apart: the
// specification (ScalarKernel) and the fallback of SIMD kernels' targets
// without a faster form.
template <index_t kBlockQ>
void transpose_rows_by_element(const float* const* rows, index_t n, index_t n_p, index_t width, float scale,
                               float* dst) {
  for (index_t d = 0; d < width; ++d) {
    for (index_t r = 0; r < n; ++r) dst[d * kBlockQ + r] = rows[r][d] * scale;
    for (index_t r = n; r < n_p; ++r) dst[d * kBlockQ + r] = 0.0f;
  }
}

template <class K>
concept TileKernel = requires(index_t n, const float* cf, float* f, const bfloat16* cb, const std::uint8_t* bits) {
  { K::kBlockQ } -> std::convertible_to<index_t>;
  { K::kBlockKv } -> std::convertible_to<index_t>;
  { K::padded_rows(n) } -> std::convertible_to<index_t>;
  { K::padded_dim(n) } -> std::convertible_to<index_t>;
  K::to_f32(cf, n, f);
  K::to_f32(cb, n, f);
  K::scores(cf, n, n, cf, n, n, f);
  K::scores(cf, n, n, cf, n, n, f, RowsAhead{});
  K::softcap(f, n, n, 1.0f);
  K::apply_column_bits(f, n, n, bits, n);
  K::online_softmax(f, n, n, f, f, f);
  K::accumulate_pv(cf, n, n, cf, n, n, cf, f);
  K::accumulate_pv(cf, n, n, cf, n, n, cf, f, RowsAhead{});
  K::softmax_backward_lanes(f, f, n, n, cf, cf);
  K::softmax_backward_columns(f, f, n, n, cf, cf);
  K::transpose_rows(&cf, n, n, n, 1.0f, f);
};

}  // namespace seqattn
