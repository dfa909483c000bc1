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
//   online_softmax(st, cols, rows_p, m, l, alpha)     St -> P, running max/sum, rescale factors;
//                                        returns whether some weight is below the smallest normal float
//   accumulate_pv(pt, rows, cols, v, v_stride, dvp, alpha, o[, ahead])  O = alpha * O + P V, a zero
//                                        weight never multiplying V (the NaN policy)
//   accumulate_pv_unguarded(...)         the same where no weight is below the smallest normal float
//                                        (online_softmax said so) or V is finite: no guard
//   softmax_backward_lanes(s, dp, cols, rows_p, lse, delta)    P = exp(S - lse[r]), dS = P (dP - delta[r])
//   softmax_backward_columns(s, dp, cols, rows_p, lse, delta)  the same with lse[j], delta[j]
//   transpose_rows(rows, n, n_p, width, scale, dst)  dst[d][r] = rows[r][d] * scale, lanes [n, n_p) zero
//
// St and Qt have a row stride of kBlockQ; O has dvp floats per row. `ahead`
// (RowsAhead) names rows to request from memory while the call streams its
// own: a hint with no effect on any value, which a kernel may ignore.
#pragma once

#include <algorithm>
#include <cassert>
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

// Rows of K or V that a tile kernel requests from memory while it computes
// on a tile of its own (tiled_forward.hpp, kv_rows_ahead). Decode
// reads every K and V row once at a few FLOP per byte; its loads overlap its
// arithmetic only when the next rows are requested while this tile computes,
// at an even rate: requests in bursts fill the core's miss buffers, and
// the loads behind them wait (measured in tiled_forward.hpp's decode notes).
// Prefill requests the next tile's rows into L2, where a tile's K and V would
// otherwise come from the last-level cache on demand (the same notes).
// A kernel requests them through an AheadStream over its loop.
struct RowsAhead {
  const void* const* rows = nullptr;  // n row pointers
  index_t n = 0;
  index_t bytes = 0;                // read from each row
  const RowsAhead* also = nullptr;  // another list, requested after this one
  bool into_l2 = false;             // into L2 only (prefill: L1 holds the tile being computed)

  static constexpr index_t kLine = 64;

  // Whether neither this list nor the ones it chains name a row.
  bool empty() const { return n == 0 && (also == nullptr || also->empty()); }

  // Cache lines of this list and those it chains.
  index_t lines() const {
    index_t total = 0;
    for (const RowsAhead* list = this; list != nullptr; list = list->also) {
      total += list->n * ((std::max<index_t>(list->bytes, 0) + kLine - 1) / kLine);
    }
    return total;
  }
};

// The rows from fraction begin / total to end / total of a RowsAhead chain of
// at most two lists, for a loop split into parts that each request their
// share (decode over a tile that crosses pages: one kernel call per page run).
class RowsAheadPart {
 public:
  RowsAheadPart(const RowsAhead& whole, index_t begin, index_t end, index_t total) {
    index_t rows = 0;
    for (const RowsAhead* list = &whole; list != nullptr; list = list->also) rows += list->n;
    const index_t first = rows * begin / std::max<index_t>(total, 1), last = rows * end / std::max<index_t>(total, 1);
    index_t at = 0;
    int used = 0;
    for (const RowsAhead* list = &whole; list != nullptr; list = list->also) {
      const index_t lo = std::max(first, at), hi = std::min(last, at + list->n);
      if (lo < hi) {
        assert(used < 2);
        lists_[used] = {list->rows + (lo - at), hi - lo, list->bytes, nullptr, list->into_l2};
        if (used > 0) lists_[used - 1].also = &lists_[used];
        ++used;
      }
      at += list->n;
    }
  }
  RowsAheadPart(const RowsAheadPart&) = delete;  // the first list points at the second
  RowsAheadPart& operator=(const RowsAheadPart&) = delete;
  const RowsAhead& get() const { return lists_[0]; }

 private:
  RowsAhead lists_[2];
};

// One cache line into L1, or into L2 only. Not __builtin_prefetch: GCC 12 deletes a loop
// whose body is only that builtin as a loop without side effects (no
// prefetch instruction was left in the binary), which an asm statement with
// a memory operand is not.
struct PrefetchLine {
  SEQATTN_ALWAYS_INLINE void operator()(const char* p, bool into_l2) const {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    if (into_l2) {
      asm volatile("prefetcht1 %0" : : "m"(*p));
    } else {
      asm volatile("prefetcht0 %0" : : "m"(*p));
    }
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if (into_l2) {
      asm volatile("prfm pldl2keep, %0" : : "Q"(*p));
    } else {
      asm volatile("prfm pldl1keep, %0" : : "Q"(*p));
    }
#else
    static_cast<void>(p);
    static_cast<void>(into_l2);
#endif
  }
};

// A RowsAhead's lines, list after list and row after row, requested at an
// even rate over a loop of `steps` iterations: step() once per iteration
// asks for the lines due by then (lines / steps of them, one more on the
// steps where the remainder adds up), so that the loop's last step has asked
// for every line. Inlined, its state in a few integers, its per-line work a
// request and an add: a call from a kernel's loop would spill the kernel's
// accumulators (every vector register is caller-saved). Request: what asks
// for one line (tests record them).
template <class Request = PrefetchLine>
class BasicAheadStream {
 public:
  BasicAheadStream(const RowsAhead& ahead, index_t steps, Request request = {})
      : list_(&ahead), steps_(std::max<index_t>(steps, 1)), request_(request) {
    const index_t lines = ahead.lines();
    per_step_ = lines / steps_;
    remainder_ = lines % steps_;
    skip_empty();
  }

#ifndef NDEBUG
  // A kernel steps its stream as often as it said it would (or not at all),
  // and then every line was asked for.
  ~BasicAheadStream() { assert(taken_ == 0 || (taken_ == steps_ && list_ == nullptr)); }
#endif

  SEQATTN_ALWAYS_INLINE void step() {
#ifndef NDEBUG
    ++taken_;
#endif
    index_t n = per_step_;
    due_ += remainder_;
    if (due_ >= steps_) {
      due_ -= steps_;
      ++n;
    }
    while (n > 0 && list_ != nullptr) {
      const char* row = static_cast<const char*>(list_->rows[row_]);
      const index_t bytes = list_->bytes;
      const bool into_l2 = list_->into_l2;
      for (; n > 0 && byte_ < bytes; --n, byte_ += RowsAhead::kLine) request_(row + byte_, into_l2);
      if (byte_ >= bytes) {
        byte_ = 0;
        if (++row_ == list_->n) {
          row_ = 0;
          list_ = list_->also;
          skip_empty();
        }
      }
    }
  }

 private:
  void skip_empty() {
    while (list_ != nullptr && (list_->n == 0 || list_->bytes <= 0)) list_ = list_->also;
  }

  const RowsAhead* list_;
  index_t row_ = 0, byte_ = 0;
  index_t steps_, per_step_ = 0, remainder_ = 0, due_ = 0;
#ifndef NDEBUG
  index_t taken_ = 0;
#endif
  [[no_unique_address]] Request request_;
};
using AheadStream = BasicAheadStream<>;

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
  { K::online_softmax(f, n, n, f, f, f) } -> std::same_as<bool>;
  K::accumulate_pv(cf, n, n, cf, n, n, cf, f);
  K::accumulate_pv(cf, n, n, cf, n, n, cf, f, RowsAhead{});
  K::accumulate_pv_unguarded(cf, n, n, cf, n, n, cf, f, RowsAhead{});
  K::softmax_backward_lanes(f, f, n, n, cf, cf);
  K::softmax_backward_columns(f, f, n, n, cf, cf);
  K::transpose_rows(&cf, n, n, n, 1.0f, f);
};

}  // namespace seqattn
