// The Cuda backend's prefill kernel for Hopper (sm_90a): the same tiles,
// mask, score hooks, online softmax and epilogue as forward_kernel (the
// shared steps of forward_tiles.cuh, online_softmax.cuh and
// forward_epilogue.cuh), with the two tile products on warpgroup MMAs
// (wgmma.cuh) instead of mma.sync.
//
// Tile shape: 128 score rows x 64 keys per step, two warpgroups of 64 rows.
// Per step a warpgroup issues S = Q K^T as D / 16 wgmma m64n64k16 (Q and K
// from shared memory), waits, applies hook, mask and softmax to S in
// registers, and issues O += P V as 4 wgmma m64nDk16 (P from registers, V
// from shared memory, transposed by the instruction). No ldmatrix: the
// tensor cores read Q, K and V from shared memory themselves.
// Two CTAs per SM (__launch_bounds__(256, 2)): a warpgroup waits on its own
// MMAs, and the SM's three other warpgroups keep the tensor cores busy
// meanwhile. Register budget per thread: 128 (ptxas: 16 bytes of spills at
// D = 128 bf16): O D/2 floats, S 32 floats, P 16 registers.
// Shared memory: Q 128 x D, K and V 64 x D each, double-buffered, in
// WgmmaTile's 128-byte swizzled layout: 96 KiB at D = 128 (two CTAs: 192 of
// the SM's 227 KiB).
// Memory traffic: as forward_kernel (Q once per CTA, K and V once per CTA
// and listed tile, loaded with cp.async one tile ahead).
// Measured on an H100 80GB HBM3 (2026-11-27, bench/cuda/bench_cuda.cu, bf16,
// d = 128, 32 heads; before the descriptors were built once, which took
// another 2-3 %): causal 4k 0.525 ms, 16k 6.18 ms; one CTA per SM (255
// registers) took 0.648 / 8.09 ms, and FlashAttention-3's intra-warpgroup
// overlap (S_{j+1} and P_j V_j in flight while the softmax of S_{j+1} runs;
// three K/V stages, one CTA per SM) 0.644 / 8.07 ms, where the mma.sync
// kernel took 0.672 / 8.09 ms. Still missing against FlashAttention-3:
// TMA loads and producer/consumer warp specialization.
//
// Built only for sm_90a (the instruction set's arch-specific part); in any
// other device pass the kernel is an empty trap, and the host launches it
// only when the TU defines SEQATTN_CUDA_WGMMA (cuda.cuh) and the device is
// compute capability 9.x.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/forward_epilogue.cuh"
#include "seqattn/backends/cuda/forward_tiles.cuh"
#include "seqattn/backends/cuda/online_softmax.cuh"
#include "seqattn/backends/cuda/wgmma.cuh"

namespace seqattn::cuda::detail {

template <int D>
struct WgmmaConfig {
  static_assert(D == 64 || D == 128, "the wgmma kernel takes head dims 64 and 128");
  static constexpr int kWarpgroups = kRows / 64;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kStages = 2;
  static constexpr int kCtasPerSm = 2;
  using QTile = WgmmaTile<D, kRows>;
  using KvTile = WgmmaTile<D, kKeys>;
  static constexpr int kSmemBytes = (kRows * D + 2 * kStages * kKeys * D) * 2;
};

template <class T, int D, class Hook>
__global__ void __launch_bounds__(WgmmaConfig<D>::kThreads, WgmmaConfig<D>::kCtasPerSm)
    wgmma_forward_kernel(const ForwardParams<T> p, const Hook hook) {
#if defined(SEQATTN_CUDA_SM90A)
  constexpr bool kScoreMod = Hook::kModifiesScores;
  using Cfg = WgmmaConfig<D>;
  using QTile = typename Cfg::QTile;
  using KvTile = typename Cfg::KvTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  T* k_smem = q_smem + kRows * D;
  T* v_smem = k_smem + Cfg::kStages * kKeys * D;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = warp / 4;
  const CtaTask task = cta_task(p);
  const int q_begin = task.q_begin, q_len = task.q_len, e_begin = task.e_begin, e_end = task.e_end;
  // Warp w holds score rows 16 w .. 16 w + 15 (wgmma's accumulator layout:
  // per warp, mma.sync's m16n8 C fragments side by side).
  const int warp_row0 = warp * 16;
  const int valid_rows = min(kRows, (q_len - q_begin) * p.heads_per_cta);
  const bool warpgroup_active = warpgroup * 64 < valid_rows;  // uniform over the warpgroup, as wgmma needs

  // ---- load Q and the first K/V tile.
  load_q<D, Cfg::kThreads, T, QTile>(q_smem, kRows, p, task);
  auto load_kv_stage = [&](int entry, int stage) {
    load_kv<D, Cfg::kThreads, T, KvTile>(k_smem + stage * kKeys * D, v_smem + stage * kKeys * D, entry, p, task);
  };
  if (e_begin < e_end) load_kv_stage(e_begin, 0);
  cp_async_commit();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float unit = kScoreMod ? 1.0f : p.scale_log2;
  // Descriptors, built once: this warpgroup's 64 Q rows, stage 0 of K and
  // V. A k16 step is 32 bytes into a 128-byte row, the next 64 dims the next
  // column block; other stages and steps add their byte offset / 16 to the
  // address field (shared addresses stay below 2^18, so it never carries).
  constexpr uint32_t kQBlockBytes = QTile::kBlockElems * 2, kKvBlockBytes = KvTile::kBlockElems * 2;
  constexpr uint32_t kAtomBytes = 8 * 128;  // 8 rows of 128 bytes
  constexpr uint32_t kStageBytes = kKeys * D * 2;
  const uint64_t q_desc = wgmma_desc(smem_addr(q_smem) + warpgroup * 64 * 128, 16, kAtomBytes);
  const uint64_t k_desc = wgmma_desc(smem_addr(k_smem), 16, kAtomBytes);
  // V: LBO steps to the next 64 dims, SBO to the next 8 keys.
  const uint64_t v_desc = wgmma_desc(smem_addr(v_smem), kKvBlockBytes, kAtomBytes);

  for (int e = e_begin; e < e_end; ++e) {
    const int stage = (e - e_begin) & 1;
    if (e + 1 < e_end) load_kv_stage(e + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();  // this thread's cp.async writes, before wgmma reads them
    const T* v_stage = v_smem + stage * kKeys * D;
    const bool v_non_finite = __syncthreads_or(own_chunks_non_finite<D, Cfg::kThreads, T, kKeys, KvTile>(v_stage)) != 0;
    const int2 entry = p.entries[e];

    if (warpgroup_active) {
      // ---- warpgroup_scores: S (64 x 64) = Q_wg K^T.
      const uint64_t k_stage_desc = k_desc + stage * (kStageBytes >> 4);
      float s[kKeys / 8][4] = {};
      fence_fragments(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t at = ((kk / 4) * kQBlockBytes + (kk % 4) * 32u) >> 4;
        const uint32_t kv_at = ((kk / 4) * kKvBlockBytes + (kk % 4) * 32u) >> 4;
        wgmma_scores<T>(s, q_desc + at, k_stage_desc + kv_at, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_fragments(s);

      score_and_mask(p, hook, s, warp_row0, task, entry, lane);

      // ---- online_softmax.
      float corr[2];
      if (__any_sync(0xffffffffu, online_softmax_step(s, m, l, corr, unit))) rescale_output(o, corr);

      // ---- warpgroup_accumulate: O += P V (a V tile with a non-finite value: select_accumulate).
      if (v_non_finite) {
        select_accumulate<T, D, kKeys / 8, KvTile>(s, o, v_stage, 0, lane);
      } else {
        uint32_t a[kKeys / 16][4];
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) weights_as_a<T>(a[kk], s, kk);
        const uint64_t v_stage_desc = v_desc + stage * (kStageBytes >> 4);
        fence_fragments(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          // 16 keys: 2 atoms of 8 keys.
          wgmma_accumulate<T, D>(o, a[kk], v_stage_desc + ((kk * 2 * kAtomBytes) >> 4));
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_fragments(o);
      }
    }
    __syncthreads();  // the stage is overwritten next
  }
  cp_async_wait<0>();
  __syncthreads();  // no copy into the Q tile is in flight (a row without tiles never waited for its Q)

  // ---- epilogue (forward_epilogue.cuh), staged in the Q tile.
  finish_slice<D, QTile>(p, task, o, m, l, unit, warp_row0, q_smem, lane);
  if (p.kv_splits == 1) {
    __syncthreads();
    store_staged_rows<D, Cfg::kThreads, QTile>(p, task, q_smem);
  }
#else
  (void)p;
  (void)hook;
  __trap();
#endif
}

}  // namespace seqattn::cuda::detail
