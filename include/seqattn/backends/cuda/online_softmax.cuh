// The online softmax of the Cuda backend's forward kernels (mma.sync
// prefill and decode, the Hopper wgmma kernel): one step of the running max
// m and sum l for the two score rows a thread holds of an m16 slice, and
// the rescale of the output that a moved max asks for. Scores enter the
// exponent as s * unit: the log2-unit scale for plain scores (m then stays
// in raw units), 1 after a score hook made them log2-unit logits.
//
// NaN policy (device_primitives.cuh): fmaxf drops a NaN score from the max,
// ex2 keeps it in the weight and so in l; the epilogues turn a NaN l into a
// NaN row and LSE.
#pragma once

#include <cuda_runtime.h>

#include "seqattn/backends/cuda/device_primitives.cuh"

namespace seqattn::cuda::detail {

// Scores s (C fragments of kN * 8 columns: rows lane / 4 and lane / 4 + 8)
// become weights exp2(s * unit - m); corr[i] is the factor of row i's
// earlier output. Returns whether some row of this thread moved its max.
template <int kN>
__device__ __forceinline__ bool online_softmax_step(float (&s)[kN][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                                    float unit) {
  bool moved = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[i], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new * unit;  // a row with nothing allowed yet: 0
    corr[i] = fast_exp2(m[i] * unit - m_use);
    moved |= corr[i] != 1.0f;
    m[i] = m_new;
    l[i] *= corr[i];
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      s[nt][2 * i] = fast_exp2(fmaf(s[nt][2 * i], unit, -m_use));
      s[nt][2 * i + 1] = fast_exp2(fmaf(s[nt][2 * i + 1], unit, -m_use));
      l[i] += s[nt][2 * i] + s[nt][2 * i + 1];
    }
  }
  return moved;
}

// Output fragments (rows as in the scores) times their rows' corr.
template <int kN>
__device__ __forceinline__ void rescale_output(float (&o)[kN][4], const float (&corr)[2]) {
#pragma unroll
  for (int nd = 0; nd < kN; ++nd) {
    o[nd][0] *= corr[0];
    o[nd][1] *= corr[0];
    o[nd][2] *= corr[1];
    o[nd][3] *= corr[1];
  }
}

// P as the A fragments of the next MMA (m16n8k16 layout): keys 16 kk ..
// 16 kk + 15 of the weights, rounded to the storage type.
template <class T, int kN>
__device__ __forceinline__ void weights_as_a(uint32_t (&a)[4], const float (&s)[kN][4], int kk) {
  using Mma = MmaType<T>;
  a[0] = Mma::pack(s[2 * kk][0], s[2 * kk][1]);
  a[1] = Mma::pack(s[2 * kk][2], s[2 * kk][3]);
  a[2] = Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

}  // namespace seqattn::cuda::detail
