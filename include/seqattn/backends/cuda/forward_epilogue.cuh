// The epilogue of the Cuda backend's prefill kernels (mma.sync and wgmma):
// per score row, the row sum across the quad, the sink, normalization and
// the LSE; the row is staged in shared memory (the Q tile, free by then) and
// stored in 16-byte chunks, or, with KV splits, written as a partial result
// (normalized by the split's own sum, no sink) for merge_splits_kernel.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/forward_tiles.cuh"

namespace seqattn::cuda::detail {

// finish_slice: the two rows (row0 + lane / 4 + 8 i) a thread holds of an
// m16 slice, from their output fragments o and softmax state (m in units of
// `unit`, l the thread's part of the row sum). Staged rows go to `stage` in
// Layout; store_staged_rows writes them after a barrier.
template <int D, class Layout, class T>
__device__ __forceinline__ void finish_slice(const ForwardParams<T>& p, const CtaTask& c, const float (&o)[D / 8][4],
                                             const float (&m)[2], const float (&l)[2], float unit, int row0, T* stage,
                                             int lane) {
  using Mma = MmaType<T>;
  const bool split_mode = p.kv_splits > 1;
  const int lane_col = (lane % 4) * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l_fin = l[i];
    l_fin += __shfl_xor_sync(0xffffffffu, l_fin, 1);
    l_fin += __shfl_xor_sync(0xffffffffu, l_fin, 2);
    const int row = row0 + lane / 4 + 8 * i;
    const RowId r = row_id(p, row, c.q_begin, c.q_len, c.head_group);
    if (!r.valid) continue;
    float scale_o = 1.0f, lse = -INFINITY, m_fin = m[i] * unit;
    if (p.sinks && !split_mode) {
      const float sink = p.sinks[r.head] * kLog2e;
      const float m_new = fmaxf(m_fin, sink);
      l_fin = l_fin * fast_exp2(m_fin - m_new) + fast_exp2(sink - m_new);
      scale_o = fast_exp2(m_fin - m_new);  // 0 when no key was allowed
      m_fin = m_new;
    }
    if (l_fin > 0.0f) {
      scale_o /= l_fin;
      lse = (m_fin + __log2f(l_fin)) * kLn2;
    } else if (isnan(l_fin)) {  // a NaN or +inf logit reached the row
      scale_o = lse = l_fin;
    } else {
      scale_o = 0.0f;
    }
    if (!split_mode) {
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        Mma::store2(stage + Layout::offset(row, nd * 8 + lane_col), o[nd][2 * i] * scale_o, o[nd][2 * i + 1] * scale_o);
      }
      if (p.lse && lane % 4 == 0) {
        p.lse[c.seq->lse_base + r.q * p.lse_token_stride + r.head * p.lse_head_stride] = lse;
      }
    } else {
      const long long at = (c.split * p.q_tokens + c.seq->q_token + r.q) * p.heads + r.head;
      float* part_row = p.part_out + at * p.dv;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const int col = nd * 8 + lane_col;
        if (col < p.dv) {
          *reinterpret_cast<float2*>(part_row + col) = make_float2(o[nd][2 * i] * scale_o, o[nd][2 * i + 1] * scale_o);
        }
      }
      if (lane % 4 == 0) p.part_lse[at] = lse;
    }
  }
}

// The staged rows (kRows of them, Layout) to out in 16-byte chunks; call
// after a barrier that follows every finish_slice, and only without splits.
template <int D, int kThreads, class Layout, class T>
__device__ __forceinline__ void store_staged_rows(const ForwardParams<T>& p, const CtaTask& c, const T* stage) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const RowId r = row_id(p, row, c.q_begin, c.q_len, c.head_group);
    if (!r.valid || chunk * 8 >= p.dv) continue;
    T* dst = p.out + c.seq->out_base + r.q * p.out_token_stride + r.head * p.out_head_stride + chunk * 8;
    const int4 v = *reinterpret_cast<const int4*>(stage + Layout::offset(row, chunk * 8));
    if ((reinterpret_cast<std::uintptr_t>(dst) & 15) == 0) {
      *reinterpret_cast<int4*>(dst) = v;
    } else {  // out rows need only 4-byte alignment
      const int* w = reinterpret_cast<const int*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) reinterpret_cast<int*>(dst)[j] = w[j];
    }
  }
}

}  // namespace seqattn::cuda::detail
