// The Cuda backend's forward kernel: FlashAttention-2 style tiled online
// softmax on tensor cores (mma.sync m16n8k16, bf16 or fp16 in, fp32
// accumulate), driven by the plan's device BlockMask.
//
// Tile shape: 128 score rows x 64 keys per step. D <= 128: 4 warps of 32
// rows (two m16 slices per warp share each K/V fragment); D = 256: 8 warps of
// 16 rows.
// Register budget per thread (D = padded head dim): output D/2 floats and
// scores 32 floats per slice, fragments ~12 registers: about 230 registers at
// D = 128 (one CTA of 4 warps needs 30K of the SM's 64K registers: two CTAs
// per SM), 255 at D = 256 (one CTA of 8 warps).
// Shared memory: Q 128 x D, K and V 64 x D each, double-buffered for D <= 128
// (96 KiB at D = 128), single-buffered at D = 256 (128 KiB). Rows are 16-byte
// chunks XOR-swizzled by row so ldmatrix reads are bank-conflict free.
// Memory traffic: Q once per CTA, K and V once per (CTA, non-empty tile);
// empty tiles are never listed, full tiles skip all mask work, partial tiles
// read one 64-bit word of deduplicated tile bits per row.
// Defaults measured on an NVIDIA H100 80GB HBM3 (sm_90).
//
// Register budget measured with nvcc 13.0: ptxas gives the D = 128 prefill
// kernel 255 registers and about 5 KB of spill stores per thread.
//
// The kernels are sequences of named steps, shared with the Hopper kernel
// (wgmma_forward_kernel.cuh) where the MMAs do not differ: cta_task and
// load_q / load_kv (forward_tiles.cuh: cp.async, zero-filled past the ends;
// paged K/V through the page list), warp_scores (S = Q K^T), score_and_mask
// (forward_tiles.cuh: hook + mask), online_softmax (online_softmax.cuh:
// running max and sum, rescale of the output), warp_accumulate (O += P V
// with P kept in registers), and the epilogue (forward_epilogue.cuh:
// normalize, sinks, LSE, or a partial result for the split merge). On
// compute capability 9.x the backend runs prefill on the Hopper kernel when
// it was built (cuda.cuh, SEQATTN_CUDA_WGMMA); decode and D = 256 stay here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/forward_epilogue.cuh"
#include "seqattn/backends/cuda/forward_tiles.cuh"
#include "seqattn/backends/cuda/online_softmax.cuh"

namespace seqattn::cuda::detail {

inline constexpr int kMergeThreads = 256;

// D <= 128: 4 warps of 32 rows (two m16 slices share every K and V fragment
// read from shared memory, halving that traffic per MMA, FA2's layout), Q
// re-read from shared memory each step. D = 256: 8 warps of 16 rows, as the
// output alone takes 128 registers per thread.
template <int D>
struct KernelConfig {
  static constexpr int kSlices = D <= 128 ? 2 : 1;  // m16 slices per warp
  static constexpr int kWarps = kRows / (16 * kSlices);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = D <= 128 ? 2 : 1;
  static constexpr int kSmemElems = kRows * D + 2 * kStages * kKeys * D;
  static constexpr int kSmemBytes = kSmemElems * 2;
};

// Hook: the score hook (score_hooks.cuh). PlainScores (scale only) keeps the
// plain kernel's registers for the tiles; any other hook changes the scores
// into log2-unit logits before the mask.
template <class T, int D, class Hook>
__global__ void __launch_bounds__(KernelConfig<D>::kThreads, 1)
    forward_kernel(const ForwardParams<T> p, const Hook hook) {
  constexpr bool kScoreMod = Hook::kModifiesScores;
  using Cfg = KernelConfig<D>;
  constexpr int kS = Cfg::kSlices;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  T* k_smem = q_smem + kRows * D;
  T* v_smem = k_smem + Cfg::kStages * kKeys * D;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Per-thread ldmatrix addresses (see frag_offset): Q rows of each slice,
  // K rows of 16-key group 0, V rows of 16-key group 0.
  uint32_t q_frag[kS];
#pragma unroll
  for (int t = 0; t < kS; ++t)
    q_frag[t] = smem_addr(q_smem) + frag_offset<D>(warp * 16 * kS + t * 16 + lane % 16, lane / 16);
  const uint32_t k_frag = frag_offset<D>((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const uint32_t v_frag = frag_offset<D>(lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
  // The sequence is read in place (not copied to registers): most fields
  // serve only the loads or the epilogue, and registers are scarce here.
  const CtaTask task = cta_task(p);
  const int q_begin = task.q_begin, q_len = task.q_len, e_begin = task.e_begin, e_end = task.e_end;

  // Score rows of this thread: slice t, half i is row warp*16*kS + t*16 + lane/4 + 8*i.
  const int warp_row0 = warp * 16 * kS;
  const int valid_rows = min(kRows, (q_len - q_begin) * p.heads_per_cta);
  const bool warp_active = warp_row0 < valid_rows;

  // ---- load Q and the first K/V tile.
  load_q<D, Cfg::kThreads>(q_smem, kRows, p, task);
  auto load_kv_stage = [&](int entry, int stage) {
    load_kv<D, Cfg::kThreads>(k_smem + stage * kKeys * D, v_smem + stage * kKeys * D, entry, p, task);
  };
  if (e_begin < e_end) load_kv_stage(e_begin, 0);
  cp_async_commit();

  float o[kS][D / 8][4] = {};
  float m[kS][2], l[kS][2];
#pragma unroll
  for (int t = 0; t < kS; ++t)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[t][i] = -INFINITY;
      l[t][i] = 0.0f;
    }
  // Scores enter the exponent as s * unit: the log2-unit scale for plain
  // scores (m is then kept in raw units too), 1 after a score modification.
  const float unit = kScoreMod ? 1.0f : p.scale_log2;
  float corr[kS][2];

  for (int e = e_begin; e < e_end; ++e) {
    const int stage = Cfg::kStages == 2 ? (e - e_begin) & 1 : 0;
    if constexpr (Cfg::kStages == 2) {
      if (e + 1 < e_end) load_kv_stage(e + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const bool v_non_finite =
        __syncthreads_or(own_chunks_non_finite<D, Cfg::kThreads>(v_smem + stage * kKeys * D)) != 0;
    const int2 entry = p.entries[e];
    const uint32_t ks = smem_addr(k_smem + stage * kKeys * D) + k_frag;
    const uint32_t vs = smem_addr(v_smem + stage * kKeys * D) + v_frag;

    if (warp_active) {
      // ---- warp_scores: S (16 kS x 64) = Q_warp K^T; each K fragment feeds kS slices.
      float s[kS][kKeys / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[kS][4];
#pragma unroll
        for (int t = 0; t < kS; ++t) ldmatrix_x4_at(a[t], q_frag[t] ^ (32u * kk));
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4_at(b, (ks + np * 16 * D * 2) ^ (32u * kk));
#pragma unroll
          for (int t = 0; t < kS; ++t) {
            mma_16816<T>(s[t][2 * np], a[t], b[0], b[1]);
            mma_16816<T>(s[t][2 * np + 1], a[t], b[2], b[3]);
          }
        }
      }

      // ---- score_and_mask (forward_tiles.cuh).
#pragma unroll
      for (int t = 0; t < kS; ++t) score_and_mask(p, hook, s[t], warp_row0 + t * 16, task, entry, lane);

      // ---- online_softmax: running max and sum per row; rescale the output
      // only when some row's max moved (late tiles of long rows rarely do).
      bool moved = false;
#pragma unroll
      for (int t = 0; t < kS; ++t) moved |= online_softmax_step(s[t], m[t], l[t], corr[t], unit);
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int t = 0; t < kS; ++t) rescale_output(o[t], corr[t]);
      }

      // ---- warp_accumulate: O += P V, P reused from the score registers; each
      // V fragment feeds kS slices. A V tile with a non-finite value: select_accumulate.
      if (v_non_finite) {
#pragma unroll
        for (int t = 0; t < kS; ++t) select_accumulate<T, D>(s[t], o[t], v_smem + stage * kKeys * D, 0, lane);
      } else {
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          uint32_t a[kS][4];
#pragma unroll
          for (int t = 0; t < kS; ++t) weights_as_a<T>(a[t], s[t], kk);
#pragma unroll
          for (int np = 0; np < D / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4_trans_at(b, (vs + kk * 16 * D * 2) ^ (32u * np));
#pragma unroll
            for (int t = 0; t < kS; ++t) {
              mma_16816<T>(o[t][2 * np], a[t], b[0], b[1]);
              mma_16816<T>(o[t][2 * np + 1], a[t], b[2], b[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // the stage is overwritten next
    if constexpr (Cfg::kStages == 1) {
      if (e + 1 < e_end) load_kv_stage(e + 1, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // no copy into the Q tile is in flight (a row without tiles never waited for its Q)

  // ---- epilogue: row sums across the quad, sinks, normalize, write.
#pragma unroll
  for (int t = 0; t < kS; ++t) {
    finish_slice<D, RowSwizzle<D>>(p, task, o[t], m[t], l[t], unit, warp_row0 + t * 16, q_smem, lane);
  }
  if (p.kv_splits == 1) {
    __syncthreads();
    store_staged_rows<D, Cfg::kThreads, RowSwizzle<D>>(p, task, q_smem);
  }
}

// The decode kernel: 16 score rows (one m16 slice: a few queries times the
// packed GQA heads) against the CTA's kv tiles. Warp w takes keys
// [16w, 16w + 16) of every 64-key tile with its own running max, sum and
// output; the four states merge through shared memory at the end. Three
// stages of K/V in flight keep HBM busy (D = 128: 100 KiB of shared memory,
// two CTAs per SM). Register budget: output D/2 floats, Q fragments D/4.
inline constexpr int kDecodeThreads = 128;
template <int D>
struct DecodeConfig {
  static constexpr int kStages = 3;
  static constexpr int kSmemBytes = (16 * D + 2 * kStages * kKeys * D) * 2;
  static_assert(4 * 16 * D * 4 + 2 * 4 * 16 * 4 <= 2 * kStages * kKeys * D * 2, "merge buffer fits in K/V space");
};

template <class T, int D, class Hook>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_kernel(const ForwardParams<T> p, const Hook hook) {
  constexpr bool kScoreMod = Hook::kModifiesScores;
  static_assert(D <= 128, "the decode kernel keeps Q fragments in registers");
  using Cfg = DecodeConfig<D>;
  using Mma = MmaType<T>;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  T* k_smem = q_smem + 16 * D;
  T* v_smem = k_smem + kStages * kKeys * D;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const CtaTask task = cta_task(p);
  const DeviceSequence& seq = *task.seq;
  const int head_group = task.head_group, split = task.split, q_begin = task.q_begin, q_len = task.q_len,
            e_begin = task.e_begin, e_end = task.e_end;
  load_q<D, kDecodeThreads>(q_smem, 16, p, task);
  auto load_kv_stage = [&](int entry, int stage) {
    load_kv<D, kDecodeThreads>(k_smem + stage * kKeys * D, v_smem + stage * kKeys * D, entry, p, task);
  };
  // Prologue: kStages - 1 tiles in flight (Q rides with the first).
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (e_begin + j < e_end) load_kv_stage(e_begin + j, j);
    cp_async_commit();
  }

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t qa[D / 16][4];
  const float unit = kScoreMod ? 1.0f : p.scale_log2;
  const int col0 = warp * 16;  // this warp's keys within each tile

  for (int e = e_begin; e < e_end; ++e) {
    const int it = e - e_begin, stage = it % kStages;
    if (e + kStages - 1 < e_end) load_kv_stage(e + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    const bool v_non_finite =
        __syncthreads_or(own_chunks_non_finite<D, kDecodeThreads>(v_smem + stage * kKeys * D)) != 0;
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qa[kk], q_smem + swizzle<D>(lane % 16, kk * 16 + (lane / 16) * 8));
    }
    const int2 entry = p.entries[e];
    const T* ks = k_smem + stage * kKeys * D;
    const T* vs = v_smem + stage * kKeys * D;

    // ---- warp_scores: S (16 x 16) = Q K_w^T for this warp's quarter of the keys.
    float sc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + swizzle<D>(col0 + (lane / 16) * 8 + lane % 8, kk * 16 + ((lane / 8) % 2) * 8));
      mma_16816<T>(sc[0], qa[kk], b[0], b[1]);
      mma_16816<T>(sc[1], qa[kk], b[2], b[3]);
    }
    score_and_mask(p, hook, sc, 0, task, entry, lane, col0);

    // ---- online_softmax over this warp's keys.
    float corr[2];
    if (__any_sync(0xffffffffu, online_softmax_step(sc, m, l, corr, unit))) rescale_output(o, corr);

    // ---- warp_accumulate: O += P V over the same 16 keys (select_accumulate: see forward_kernel).
    if (v_non_finite) {
      select_accumulate<T, D>(sc, o, vs, col0, lane);
    } else {
      uint32_t a[4];
      weights_as_a<T>(a, sc, 0);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + swizzle<D>(col0 + lane % 8 + ((lane / 8) % 2) * 8, np * 16 + (lane / 16) * 8));
        mma_16816<T>(o[2 * np], a, b[0], b[1]);
        mma_16816<T>(o[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage is overwritten next
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the four warps' states (log2 units) through shared memory.
  float* o_red = reinterpret_cast<float*>(k_smem);  // [warp][row][D]
  float* m_red = o_red + 4 * 16 * D;                // [warp][row]
  float* l_red = m_red + 4 * 16;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = lane / 4 + 8 * i;
    float lw = l[i];
    lw += __shfl_xor_sync(0xffffffffu, lw, 1);
    lw += __shfl_xor_sync(0xffffffffu, lw, 2);
    if (lane % 4 == 0) {
      m_red[warp * 16 + row] = m[i] * unit;
      l_red[warp * 16 + row] = lw;
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int col = nd * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(o_red + (warp * 16 + row) * D + col) = make_float2(o[nd][2 * i], o[nd][2 * i + 1]);
    }
  }
  __syncthreads();

  // ---- epilogue: thread t finishes row t / 8, columns (t % 8) * 2 + 16 j.
  const int row = threadIdx.x / 8, part = threadIdx.x % 8;
  const RowId r = row_id(p, row, q_begin, q_len, head_group);
  if (!r.valid) return;
  const bool split_mode = p.kv_splits > 1;
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < 4; ++w) m_all = fmaxf(m_all, m_red[w * 16 + row]);
  float sink = -INFINITY;
  if (p.sinks && !split_mode) {
    sink = p.sinks[r.head] * kLog2e;
    m_all = fmaxf(m_all, sink);
  }
  const float shift = m_all == -INFINITY ? 0.0f : m_all;
  float weight[4], l_all = p.sinks && !split_mode ? fast_exp2(sink - shift) : 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    weight[w] = fast_exp2(m_red[w * 16 + row] - shift);
    l_all += l_red[w * 16 + row] * weight[w];
  }
  // NaN l (a NaN or +inf logit): NaN row and LSE; 0 for a row that saw nothing.
  const float inv = l_all > 0.0f ? 1.0f / l_all : isnan(l_all) ? l_all : 0.0f;
  const float lse = l_all > 0.0f ? (shift + __log2f(l_all)) * kLn2 : isnan(l_all) ? l_all : -INFINITY;
  T* out_row = p.out + seq.out_base + r.q * p.out_token_stride + r.head * p.out_head_stride;
  const long long at = (split * p.q_tokens + seq.q_token + r.q) * p.heads + r.head;
  for (int col = part * 2; col < p.dv; col += 16) {
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 x = *reinterpret_cast<const float2*>(o_red + (w * 16 + row) * D + col);
      v0 += x.x * weight[w];
      v1 += x.y * weight[w];
    }
    if (!split_mode) {
      Mma::store2(out_row + col, v0 * inv, v1 * inv);
    } else {
      *reinterpret_cast<float2*>(p.part_out + at * p.dv + col) = make_float2(v0 * inv, v1 * inv);
    }
  }
  if (part == 0) {
    if (!split_mode) {
      if (p.lse) p.lse[seq.lse_base + r.q * p.lse_token_stride + r.head * p.lse_head_stride] = lse;
    } else {
      p.part_lse[at] = lse;
    }
  }
}

// Merges the kv splits of a row by LSE (flash-decoding), adding the sink to
// the denominator: out = sum_s exp(lse_s - lse) out_s with
// lse = log(sum_s exp(lse_s) + exp(sink)). Same grid as the forward kernel;
// one warp per score row, lanes across the head dim.
template <class T>
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const ForwardParams<T> p) {
  using Mma = MmaType<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int2 item = p.items[blockIdx.x];
  const DeviceSequence seq = p.sequences[item.x];
  for (int row = warp; row < kRows; row += kMergeThreads / 32) {
    const RowId r = row_id(p, row, item.y, seq.q_len, blockIdx.y);
    if (!r.valid) continue;
    const long long at0 = (seq.q_token + r.q) * p.heads + r.head;
    const long long split_stride = p.q_tokens * p.heads;
    float mx = p.sinks ? p.sinks[r.head] : -INFINITY;
    for (int s = lane; s < p.kv_splits; s += 32) mx = fmaxf(mx, p.part_lse[s * split_stride + at0]);
    for (int d = 16; d > 0; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
    const float shift = mx == -INFINITY ? 0.0f : mx;
    float sum = 0.0f;
    for (int s = lane; s < p.kv_splits; s += 32) sum += __expf(p.part_lse[s * split_stride + at0] - shift);
    for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (p.sinks) sum += __expf(p.sinks[r.head] - shift);
    // A NaN partial (fmaxf dropped it from mx; __expf keeps it in sum) makes
    // the row NaN; a partial with LSE -inf has weight 0 and is not read.
    const float lse = sum > 0.0f ? shift + __logf(sum) : isnan(sum) ? sum : -INFINITY;
    T* out_row = p.out + seq.out_base + r.q * p.out_token_stride + r.head * p.out_head_stride;
    for (int col = 2 * lane; col < p.dv; col += 64) {
      float a0 = isnan(sum) ? sum : 0.0f, a1 = a0;
      if (sum > 0.0f) {
        for (int s = 0; s < p.kv_splits; ++s) {
          const float w = __expf(p.part_lse[s * split_stride + at0] - lse);
          if (w == 0.0f) continue;
          const float2 v = *reinterpret_cast<const float2*>(p.part_out + (s * split_stride + at0) * p.dv + col);
          a0 += w * v.x;
          a1 += w * v.y;
        }
      }
      Mma::store2(out_row + col, a0, a1);
    }
    if (p.lse && lane == 0) p.lse[seq.lse_base + r.q * p.lse_token_stride + r.head * p.lse_head_stride] = lse;
  }
}

}  // namespace seqattn::cuda::detail
