// The Cuda backend's backward pass: FlashAttention-2's algorithm (P
// recomputed from the forward's LSE, D = rowsum(dO * O)) on tensor cores
// (mma.sync m16n8k16, bf16 or fp16 in, fp32 accumulate), deterministic: every
// gradient element is written by one CTA in a fixed order, with no atomics.
//
//   backward_rows_kernel  D and the log2-unit LSE of every (query, head) row,
//                         and the row's term of the sinks' gradient
//   sink_grad_kernel      the sinks' gradient of each head: a fixed-order sum
//   key_grad_kernel       dK, dV of 64 keys of one K/V head: the query blocks
//                         of the key's row of the transposed device mask, for
//                         every query head of the GQA group, 64 queries a step
//   query_grad_kernel     dQ of 128 queries of one head: the key tiles of the
//                         forward mask row, as the forward kernel visits them
//
// The query pass recomputes S and dP, which the key pass also computes (7 tile
// matmuls per visited tile where FA2 does 5 with atomic dQ adds): the price of
// determinism without a dQ buffer per key block, as in the CPU engine
// (attention/detail/tiled_backward.hpp).
//
// key_grad_kernel: 4 warps of 16 keys. Per step, S^T = K Q^T and dP^T = V dO^T
// (16 keys x 64 queries a warp, K and V fragments from shared memory), then
// dV += P^T dO and dK += dS^T Q with P^T and dS^T reused from registers.
// Register budget per thread at D = 128: dK and dV 64 floats each, S^T and
// dP^T 32 each (about 230 registers, two CTAs per SM). Shared memory: K and V
// 64 x D once, Q and dO 64 x D double-buffered, LSE and D of the step's
// queries: 97 KiB at D = 128. Memory traffic: K, V once per CTA; Q and dO once
// per (CTA, listed query block half).
// query_grad_kernel: 8 warps of 16 queries; Q and dO 128 x D once, K and V
// 64 x D double-buffered (128 KiB at D = 128, one CTA per SM); per tile
// S = Q K^T, dP = dO V^T, dQ += dS K. Registers: dQ 64 floats, S and dP 32 each.
// Head dims up to 128; tile shapes chosen like the forward's (kernel comment
// in forward_kernel.cuh), not yet tuned on a GPU.
//
// NaN policy (attention/softmax_state.hpp, rule 4): a hidden key gets no
// gradient from a row and is never read into its dQ. Masked scores are
// selected away (P = 0, dS = 0 by a select, not a product); the MMAs that
// multiply zero weights with values (P^T dO, dS^T Q, dS K) take
// select_accumulate when the stage they read holds a non-finite element.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/device_primitives.cuh"
#include "seqattn/backends/cuda/score_hooks.cuh"

namespace seqattn::cuda::detail {

inline constexpr int kBackwardRowThreads = 128;
inline constexpr int kSinkGradThreads = 256;
inline constexpr int kKeyStepQueries = 64;  // queries per key_grad_kernel step: half a q-block

// One sequence of a backward call: element offsets of token 0 in each tensor,
// the lengths, its first rows in both device masks and its first compact
// query token (workspace row / heads).
struct BackwardSequence {
  long long q_base, k_base, v_base, out_base, lse_base, dout_base, dq_base, dk_base, dv_base;
  int q_len, kv_len;
  long long mask_row;  // forward layout: row of (head 0, q-block 0)
  long long key_row;   // transposed layout: row of (head 0, kv-block 0)
  long long q_token;
};

template <class T>
struct BackwardParams {
  const T* q;
  const T* k;
  const T* v;
  const T* out;
  const T* dout;
  T* dq_data;
  T* dk_data;
  T* dv_data;
  const float* lse;
  long long q_token_stride, q_head_stride, k_token_stride, k_head_stride, v_token_stride, v_head_stride;
  long long out_token_stride, out_head_stride, dout_token_stride, dout_head_stride;
  long long dq_token_stride, dq_head_stride, dk_token_stride, dk_head_stride, dv_token_stride, dv_head_stride;
  long long lse_token_stride, lse_head_stride;
  const BackwardSequence* sequences;
  // Forward device mask (query pass): rows (sequence, head, q-block) of
  // (kv-block, tile) entries, tile bits 128 rows x 1 word.
  const int* row_offsets;
  const int2* entries;
  const unsigned long long* tile_bits;
  // Transposed device mask (key pass): rows (sequence, head, kv-block) of
  // (q-block, tile) entries, tile bits 64 key rows x 2 words (128 queries).
  const int* key_row_offsets;
  const int2* key_entries;
  const unsigned long long* key_tile_bits;
  const int2* query_items;  // (sequence, first query): grid.x of the row and query kernels, grid.y = heads
  const int2* key_items;    // (sequence, kv-block): grid.x of the key kernel, grid.y = K/V heads
  int heads, group, mask_heads, dk, dv;
  // Score variant, as in ForwardParams: logit = softcap(scale * q.k) - ALiBi in log2 units.
  float scale;  // dQ and dK are scale * (dS K) and scale * (dS^T Q)
  float scale_log2, softcap_inner, softcap_log2;
  const float* alibi_slopes;  // per query head, null = none
  const float* sinks;         // per query head, null = none
  // Workspace rows [q_token][head]: D, LSE in log2 units (+inf where the row
  // saw nothing, so that its P is 0), the row's sink-gradient term.
  float* delta;
  float* lse_log2;
  float* sink_terms;
  float* dsinks;  // [heads], null = not requested
  long long q_tokens;
};

// ---- backward_rows_kernel: one warp per row, lanes across dv.
template <class T>
__global__ void __launch_bounds__(kBackwardRowThreads) backward_rows_kernel(const BackwardParams<T> p) {
  using Mma = MmaType<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int2 item = p.query_items[blockIdx.x];
  const BackwardSequence& seq = p.sequences[item.x];
  const int head = blockIdx.y;
  for (int r = warp; r < kRows; r += kBackwardRowThreads / 32) {
    const int q = item.y + r;
    if (q >= seq.q_len) break;
    const T* o = p.out + seq.out_base + q * p.out_token_stride + head * p.out_head_stride;
    const T* d_o = p.dout + seq.dout_base + q * p.dout_token_stride + head * p.dout_head_stride;
    float dot = 0.0f;
    for (int col = lane; col < p.dv; col += 32) dot += Mma::to_float(o[col]) * Mma::to_float(d_o[col]);
    for (int d = 16; d > 0; d /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, d);
    if (lane != 0) continue;
    const float lse = p.lse[seq.lse_base + q * p.lse_token_stride + head * p.lse_head_stride];
    const long long at = (seq.q_token + q) * p.heads + head;
    p.delta[at] = dot;
    p.lse_log2[at] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    if (p.sinks) p.sink_terms[at] = -__expf(p.sinks[head] - lse) * dot;
  }
}

// ---- sink_grad_kernel: one CTA per head; each thread sums a fixed stride of
// rows, then a fixed tree: the same sum whatever the launch.
template <class T>
__global__ void __launch_bounds__(kSinkGradThreads) sink_grad_kernel(const BackwardParams<T> p) {
  __shared__ float partial[kSinkGradThreads];
  const int head = blockIdx.x;
  float sum = 0.0f;
  for (long long t = threadIdx.x; t < p.q_tokens; t += kSinkGradThreads) sum += p.sink_terms[t * p.heads + head];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int n = kSinkGradThreads / 2; n > 0; n /= 2) {
    if (static_cast<int>(threadIdx.x) < n) partial[threadIdx.x] += partial[threadIdx.x + n];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[head] = partial[0];
}

// ---- Shared steps of the two gradient kernels.

// tile_scores: C (16 x 64) += A (16 rows of a stage at a_frag) B^T (64 rows of
// a stage at b_rows): S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T.
template <class T, int D>
__device__ __forceinline__ void tile_scores(float (&c)[kKeys / 8][4], uint32_t a_frag, uint32_t b_rows) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_at(a, a_frag ^ (32u * kk));
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_at(b, (b_rows + np * 16 * D * 2) ^ (32u * kk));
      mma_16816<T>(c[2 * np], a, b[0], b[1]);
      mma_16816<T>(c[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// tile_accumulate: acc (16 x D) += W (16 x 64, C fragments in registers) B
// (64 rows x D of a stage at b_cols, read transposed): dQ += dS K,
// dV += P^T dO, dK += dS^T Q. A stage holding a non-finite value takes
// select_accumulate, so that zero weights never multiply it.
template <class T, int D>
__device__ __forceinline__ void tile_accumulate(float (&acc)[D / 8][4], const float (&w)[kKeys / 8][4], uint32_t b_cols,
                                                const T* stage, bool non_finite, int lane) {
  using Mma = MmaType<T>;
  if (non_finite) {
    select_accumulate<T, D>(w, acc, stage, 0, lane);
    return;
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {Mma::pack(w[2 * kk][0], w[2 * kk][1]), Mma::pack(w[2 * kk][2], w[2 * kk][3]),
                           Mma::pack(w[2 * kk + 1][0], w[2 * kk + 1][1]),
                           Mma::pack(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans_at(b, (b_cols + kk * 16 * D * 2) ^ (32u * np));
      mma_16816<T>(acc[2 * np], a, b[0], b[1]);
      mma_16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// gradient_of_scores: raw scores s and dP (the thread's fragment elements) to
// P and dS in place: P = exp2(logit - LSE) where the mask word allows the
// pair, dS = P (dP - D) score_grad, 0 wherever P is 0; logit and score_grad
// come from the score hook (score_hooks.cuh), of one query head. `query_major`:
// rows are queries and columns keys (query pass), else rows are keys (key
// pass). row_*: the thread's two rows; col_*: per column of the slice.
struct PairGeometry {
  int row_pos[2];               // query (query_major) or key position of the thread's rows
  unsigned long long words[2];  // mask words of the thread's rows, bit c: column c
  int col0_pos;                 // position of column 0 of the slice
  int batch, q_len, kv_len;     // the sequence: its index and lengths
  int offset;                   // kv_len - q_len
  bool query_major;
};
template <class Hook, class T, class Stats>
__device__ __forceinline__ void gradient_of_scores(const BackwardParams<T>& p, const Hook& hook,
                                                   float (&s)[kKeys / 8][4], float (&dp)[kKeys / 8][4],
                                                   const PairGeometry& g, const typename Hook::Head& head, Stats stats,
                                                   int lane) {
  unsigned long long shifted[2] = {g.words[0] >> ((lane % 4) * 2), g.words[1] >> ((lane % 4) * 2)};
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = c / 2, col = nt * 8 + (lane % 4) * 2 + (c % 2);
      const bool allowed = (shifted[i] >> (nt * 8 + (c % 2))) & 1ull;
      const float raw = s[nt][c];
      const ScorePair at{g.batch,
                         g.query_major ? g.row_pos[i] : g.col0_pos + col,
                         g.query_major ? g.col0_pos + col : g.row_pos[i],
                         g.q_len,
                         g.kv_len,
                         g.offset};
      const float x = hook.logit(p, head, raw, at);
      float lse, delta;
      stats(i, col, lse, delta);
      const float prob = allowed ? fast_exp2(x - lse) : 0.0f;
      float ds = 0.0f;
      if (prob != 0.0f) ds = prob * (dp[nt][c] - delta) * hook.grad(p, head, raw, at);
      s[nt][c] = prob;
      dp[nt][c] = ds;
    }
  }
}

// Stores a 16 x D accumulator slice (rows row0 + lane / 4 + 8 i, only rows
// below n_rows) times `scale` into a [token, head, dim] tensor of `cols` columns.
template <class T, int D>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 8][4], T* row0_ptr, long long token_stride, int row0,
                                           int n_rows, int cols, float scale, int lane) {
  using Mma = MmaType<T>;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + lane / 4 + 8 * i;
    if (row >= n_rows) continue;
    T* dst = row0_ptr + row * token_stride;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const int col = nd * 8 + (lane % 4) * 2;
      if (col < cols) Mma::store2(dst + col, acc[nd][2 * i] * scale, acc[nd][2 * i + 1] * scale);
    }
  }
}

// ---- key_grad_kernel

template <int D>
struct KeyGradConfig {
  static constexpr int kThreads = 128;  // 4 warps x 16 keys
  static constexpr int kStageElems = kKeyStepQueries * D;
  static constexpr int kSmemBytes = (2 * kKeys * D + 2 * 2 * kStageElems) * 2 + 2 * 2 * kKeyStepQueries * 4;
};

// The key pass's walk: (query head of the group, entry of its transposed
// mask row, half of the entry's q-block), skipping halves past the queries.
struct KeyStep {
  int head, e, e_end, half;
};

template <class T, int D, class Hook>
__global__ void __launch_bounds__(KeyGradConfig<D>::kThreads, 2)
    key_grad_kernel(const BackwardParams<T> p, const Hook hook) {
  using Cfg = KeyGradConfig<D>;
  constexpr int kThreads = Cfg::kThreads, kQ = kKeyStepQueries;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* k_smem = reinterpret_cast<T*>(smem_raw);
  T* v_smem = k_smem + kKeys * D;
  T* q_stage = v_smem + kKeys * D;                                               // [2][kQ][D]
  T* do_stage = q_stage + 2 * Cfg::kStageElems;                                  // [2][kQ][D]
  float* lse_stage = reinterpret_cast<float*>(do_stage + 2 * Cfg::kStageElems);  // [2][kQ]
  float* delta_stage = lse_stage + 2 * kQ;                                       // [2][kQ]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int2 item = p.key_items[blockIdx.x];
  const BackwardSequence& seq = p.sequences[item.x];
  const int kv_head = blockIdx.y, kv_block = item.y, key0 = kv_block * kKeys;
  const int q_len = seq.q_len, kv_len = seq.kv_len;
  const int kv_blocks = (kv_len + kKeys - 1) / kKeys;
  const int h_begin = kv_head * p.group, h_end = h_begin + p.group;

  load_kv_tile<D, kThreads>(k_smem, p.k + seq.k_base + kv_head * p.k_head_stride, p.k_token_stride, key0, kv_len, p.dk,
                            p.k);
  load_kv_tile<D, kThreads>(v_smem, p.v + seq.v_base + kv_head * p.v_head_stride, p.v_token_stride, key0, kv_len, p.dv,
                            p.v);

  auto row_entries = [&](int head, int& e, int& e_end) {
    const long long row = seq.key_row + static_cast<long long>(p.mask_heads > 1 ? head : 0) * kv_blocks + kv_block;
    e = p.key_row_offsets[row];
    e_end = p.key_row_offsets[row + 1];
  };
  auto advance = [&](KeyStep st) {
    for (;;) {
      if (++st.half == 2) {
        st.half = 0;
        ++st.e;
      }
      while (st.e >= st.e_end) {
        if (++st.head >= h_end) return st;
        row_entries(st.head, st.e, st.e_end);
        st.half = 0;
      }
      if (p.key_entries[st.e].x * kRows + st.half * kQ < q_len) return st;
    }
  };
  // Queries q0 .. q0 + 63 of one head into a stage, with their LSE and D.
  auto issue = [&](const KeyStep& st, int stage) {
    const int q0 = p.key_entries[st.e].x * kRows + st.half * kQ;
    load_kv_tile<D, kThreads, T, kQ>(q_stage + stage * Cfg::kStageElems, p.q + seq.q_base + st.head * p.q_head_stride,
                                     p.q_token_stride, q0, q_len, p.dk, p.q);
    load_kv_tile<D, kThreads, T, kQ>(do_stage + stage * Cfg::kStageElems,
                                     p.dout + seq.dout_base + st.head * p.dout_head_stride, p.dout_token_stride, q0,
                                     q_len, p.dv, p.dout);
    if (threadIdx.x < kQ) {
      const int q = q0 + threadIdx.x;
      const long long at = (seq.q_token + q) * p.heads + st.head;
      lse_stage[stage * kQ + threadIdx.x] = q < q_len ? p.lse_log2[at] : INFINITY;
      delta_stage[stage * kQ + threadIdx.x] = q < q_len ? p.delta[at] : 0.0f;
    }
  };

  KeyStep cur{h_begin, 0, 0, -1};
  row_entries(h_begin, cur.e, cur.e_end);
  cur = advance(cur);
  if (cur.head < h_end) issue(cur, 0);
  cp_async_commit();

  // Per-thread ldmatrix addresses (frag_offset): A rows of the warp's 16 keys
  // in K and V; B rows of a Q / dO stage, plain (S^T, dP^T) and transposed (dV, dK).
  const int warp_key0 = warp * 16;
  const uint32_t k_frag = smem_addr(k_smem) + frag_offset<D>(warp_key0 + lane % 16, lane / 16);
  const uint32_t v_frag = smem_addr(v_smem) + frag_offset<D>(warp_key0 + lane % 16, lane / 16);
  const uint32_t b_rows = frag_offset<D>((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const uint32_t b_cols = frag_offset<D>(lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
  const bool warp_active = key0 + warp_key0 < kv_len;
  PairGeometry g{};
  g.query_major = false;
  g.batch = item.x;
  g.q_len = q_len;
  g.kv_len = kv_len;
  g.offset = kv_len - q_len;
  g.row_pos[0] = key0 + warp_key0 + lane / 4;
  g.row_pos[1] = g.row_pos[0] + 8;

  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int it = 0; cur.head < h_end; ++it) {
    const int stage = it & 1;
    const KeyStep next = advance(cur);
    if (next.head < h_end) issue(next, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    const T* qs = q_stage + stage * Cfg::kStageElems;
    const T* dos = do_stage + stage * Cfg::kStageElems;
    const bool non_finite = __syncthreads_or(own_chunks_non_finite<D, kThreads, T, kQ>(qs) |
                                             own_chunks_non_finite<D, kThreads, T, kQ>(dos)) != 0;
    if (warp_active) {
      const int2 entry = p.key_entries[cur.e];
      const int q0 = entry.x * kRows + cur.half * kQ;
      float s[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
      tile_scores<T, D>(s, k_frag, smem_addr(qs) + b_rows);    // S^T = K Q^T
      tile_scores<T, D>(dp, v_frag, smem_addr(dos) + b_rows);  // dP^T = V dO^T
      const unsigned long long live = low_bits(q_len - q0);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int key_row = warp_key0 + lane / 4 + 8 * i;
        g.words[i] =
            entry.y >= 0 ? p.key_tile_bits[(static_cast<long long>(entry.y) * kKeys + key_row) * 2 + cur.half] : ~0ull;
        g.words[i] &= live;
      }
      g.col0_pos = q0;
      const typename Hook::Head head = hook.head(p, cur.head, true);
      const float* lse_s = lse_stage + stage * kQ;
      const float* delta_s = delta_stage + stage * kQ;
      gradient_of_scores(
          p, hook, s, dp, g, head,
          [&](int, int col, float& lse, float& delta) {
            lse = lse_s[col];
            delta = delta_s[col];
          },
          lane);
      tile_accumulate<T, D>(dv_acc, s, smem_addr(dos) + b_cols, dos, non_finite, lane);  // dV += P^T dO
      tile_accumulate<T, D>(dk_acc, dp, smem_addr(qs) + b_cols, qs, non_finite, lane);   // dK += dS^T Q
    }
    __syncthreads();  // the stage is overwritten next
    cur = next;
  }
  cp_async_wait<0>();

  const int n_keys = kv_len - key0;
  store_rows<T, D>(
      dk_acc, p.dk_data + seq.dk_base + static_cast<long long>(key0) * p.dk_token_stride + kv_head * p.dk_head_stride,
      p.dk_token_stride, warp_key0, n_keys, p.dk, p.scale, lane);
  store_rows<T, D>(
      dv_acc, p.dv_data + seq.dv_base + static_cast<long long>(key0) * p.dv_token_stride + kv_head * p.dv_head_stride,
      p.dv_token_stride, warp_key0, n_keys, p.dv, 1.0f, lane);
}

// ---- query_grad_kernel

template <int D>
struct QueryGradConfig {
  static constexpr int kThreads = 256;  // 8 warps x 16 queries
  static constexpr int kSmemBytes = (2 * kRows * D + 2 * 2 * kKeys * D) * 2;
};

template <class T, int D, class Hook>
__global__ void __launch_bounds__(QueryGradConfig<D>::kThreads, 1)
    query_grad_kernel(const BackwardParams<T> p, const Hook hook) {
  constexpr int kThreads = QueryGradConfig<D>::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  T* do_smem = q_smem + kRows * D;
  T* k_stage = do_smem + kRows * D;      // [2][kKeys][D]
  T* v_stage = k_stage + 2 * kKeys * D;  // [2][kKeys][D]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int2 item = p.query_items[blockIdx.x];
  const BackwardSequence& seq = p.sequences[item.x];
  const int head = blockIdx.y, kv_head = head / p.group;
  const int q_begin = item.y, q_len = seq.q_len, kv_len = seq.kv_len, q_block = q_begin / kRows;
  const long long mask_row =
      seq.mask_row + static_cast<long long>(p.mask_heads > 1 ? head : 0) * ((q_len + kRows - 1) / kRows) + q_block;
  const int e_begin = p.row_offsets[mask_row], e_end = p.row_offsets[mask_row + 1];

  load_kv_tile<D, kThreads, T, kRows>(q_smem, p.q + seq.q_base + head * p.q_head_stride, p.q_token_stride, q_begin,
                                      q_len, p.dk, p.q);
  load_kv_tile<D, kThreads, T, kRows>(do_smem, p.dout + seq.dout_base + head * p.dout_head_stride, p.dout_token_stride,
                                      q_begin, q_len, p.dv, p.dout);
  auto issue = [&](int e, int stage) {
    const int kv0 = p.entries[e].x * kKeys;
    load_kv_tile<D, kThreads>(k_stage + stage * kKeys * D, p.k + seq.k_base + kv_head * p.k_head_stride,
                              p.k_token_stride, kv0, kv_len, p.dk, p.k);
    load_kv_tile<D, kThreads>(v_stage + stage * kKeys * D, p.v + seq.v_base + kv_head * p.v_head_stride,
                              p.v_token_stride, kv0, kv_len, p.dv, p.v);
  };
  if (e_begin < e_end) issue(e_begin, 0);
  cp_async_commit();

  const int warp_row0 = warp * 16;
  const bool warp_active = q_begin + warp_row0 < q_len;
  float lse[2], delta[2];
  PairGeometry g{};
  g.query_major = true;
  g.batch = item.x;
  g.q_len = q_len;
  g.kv_len = kv_len;
  g.offset = kv_len - q_len;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = q_begin + warp_row0 + lane / 4 + 8 * i;
    g.row_pos[i] = q;
    const long long at = (seq.q_token + q) * p.heads + head;
    lse[i] = q < q_len ? p.lse_log2[at] : INFINITY;
    delta[i] = q < q_len ? p.delta[at] : 0.0f;
  }
  const typename Hook::Head head_state = hook.head(p, head, true);
  const uint32_t q_frag = smem_addr(q_smem) + frag_offset<D>(warp_row0 + lane % 16, lane / 16);
  const uint32_t do_frag = smem_addr(do_smem) + frag_offset<D>(warp_row0 + lane % 16, lane / 16);
  const uint32_t b_rows = frag_offset<D>((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const uint32_t b_cols = frag_offset<D>(lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

  float dq_acc[D / 8][4] = {};
  for (int e = e_begin; e < e_end; ++e) {
    const int stage = (e - e_begin) & 1;
    if (e + 1 < e_end) issue(e + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    const T* ks = k_stage + stage * kKeys * D;
    const T* vs = v_stage + stage * kKeys * D;
    const bool k_non_finite = __syncthreads_or(own_chunks_non_finite<D, kThreads>(ks)) != 0;
    if (warp_active) {
      const int2 entry = p.entries[e];
      const int kv0 = entry.x * kKeys;
      float s[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
      tile_scores<T, D>(s, q_frag, smem_addr(ks) + b_rows);    // S = Q K^T
      tile_scores<T, D>(dp, do_frag, smem_addr(vs) + b_rows);  // dP = dO V^T
      const unsigned long long live = low_bits(kv_len - kv0);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q = g.row_pos[i];
        unsigned long long bits = ~0ull;
        if (entry.y >= 0)
          bits = q < q_len ? p.tile_bits[static_cast<long long>(entry.y) * kRows + (q - q_block * kRows)] : 0ull;
        g.words[i] = bits & live;
      }
      g.col0_pos = kv0;
      gradient_of_scores(
          p, hook, s, dp, g, head_state,
          [&](int i, int, float& l, float& d) {
            l = lse[i];
            d = delta[i];
          },
          lane);
      tile_accumulate<T, D>(dq_acc, dp, smem_addr(ks) + b_cols, ks, k_non_finite, lane);  // dQ += dS K
    }
    __syncthreads();  // the stage is overwritten next
  }
  cp_async_wait<0>();
  store_rows<T, D>(
      dq_acc, p.dq_data + seq.dq_base + static_cast<long long>(q_begin) * p.dq_token_stride + head * p.dq_head_stride,
      p.dq_token_stride, warp_row0, q_len - q_begin, p.dk, p.scale, lane);
}

}  // namespace seqattn::cuda::detail
