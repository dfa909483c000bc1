// What every forward kernel of the Cuda backend shares (the mma.sync
// kernels of forward_kernel.cuh and the Hopper kernel of
// wgmma_forward_kernel.cuh): the kernel parameters, the tile scheduler
// (cta_task: which sequence, queries, head group and mask entries a CTA
// takes; row_id: which (query, head) a score row is), the loads into a
// shared-memory layout (RowSwizzle or WgmmaTile), the score hook applied to
// a fragment slice and the mask applied from the device layout.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/device_primitives.cuh"
#include "seqattn/backends/cuda/score_hooks.cuh"

namespace seqattn::cuda::detail {

// One sequence of the call: element offsets of token 0 in each tensor, the
// lengths, the mask row of (head 0, q-block 0) and the compact token index
// (split workspace row) of query 0.
struct DeviceSequence {
  long long q_base, k_base, v_base, out_base, lse_base;
  int q_len, kv_len;
  long long mask_row;
  long long q_token;
  long long page_list;  // paged K/V: this sequence's first entry in ForwardParams::pages
};

template <class T>
struct ForwardParams {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  float* lse;  // null: not requested
  long long q_token_stride, q_head_stride, k_token_stride, k_head_stride, v_token_stride, v_head_stride;
  long long out_token_stride, out_head_stride, lse_token_stride, lse_head_stride;
  const DeviceSequence* sequences;
  const int* row_offsets;
  const int2* entries;  // (kv_block, tile); tile -1 = full
  const unsigned long long* tile_bits;
  const int2* items;  // (sequence, first query)
  int heads, group, heads_per_cta, queries_per_cta, mask_heads, dk, dv, kv_splits;
  // Score variant: logit = softcap(scale * q.k) - alibi, kept in log2 units.
  float scale_log2;           // scale * log2(e) (no softcap)
  float softcap_inner;        // scale / cap (softcap on)
  float softcap_log2;         // cap * log2(e); 0 = no softcap
  const float* alibi_slopes;  // per query head, null = none
  const float* sinks;         // per query head, null = none
  // Split workspace (kv_splits > 1): [split][token][head][dv] and [split][token][head].
  float* part_out;
  float* part_lse;
  long long q_tokens;  // compact query tokens of the call (workspace rows per split)
  // Paged K/V (null pages: contiguous): key j of a sequence is slot
  // j % page_size of page pages[page_list + j / page_size].
  const int* pages;
  int page_size;
  long long k_page_stride, v_page_stride;
};

// Which query and head a score row of this CTA is, and whether it exists.
struct RowId {
  int q;
  int head;
  bool valid;
};
template <class T>
__device__ __forceinline__ RowId row_id(const ForwardParams<T>& p, int row, int q_begin, int q_len, int head_group) {
  const int q = q_begin + row / p.heads_per_cta;
  const int head = head_group * p.heads_per_cta + row % p.heads_per_cta;
  return {q, head, q < q_len && q < q_begin + p.queries_per_cta};
}

// What one CTA computes: its sequence (and its index, ScoreIndex's batch),
// queries, kv head and the slice of its mask row's entries that its KV split covers.
struct CtaTask {
  const DeviceSequence* seq;
  int batch, head_group, split;
  int q_begin, q_len, kv_len, q_block, kv_head;
  int e_begin, e_end;  // entries [e_begin, e_end)
};

template <class T>
__device__ __forceinline__ CtaTask cta_task(const ForwardParams<T>& p) {
  CtaTask c;
  const int2 item = p.items[blockIdx.x];
  c.seq = &p.sequences[item.x];
  c.batch = item.x;
  c.head_group = blockIdx.y;
  c.split = blockIdx.z;
  c.q_begin = item.y;
  c.q_len = c.seq->q_len;
  c.kv_len = c.seq->kv_len;
  c.q_block = c.q_begin / kRows;
  c.kv_head = c.head_group * p.heads_per_cta / p.group;
  const long long mask_row =
      c.seq->mask_row + static_cast<long long>(p.mask_heads > 1 ? c.head_group : 0) * ((c.q_len + kRows - 1) / kRows) +
      c.q_block;
  const int row_begin = p.row_offsets[mask_row], n_row = p.row_offsets[mask_row + 1] - row_begin;
  c.e_begin = row_begin + static_cast<int>(static_cast<long long>(n_row) * c.split / p.kv_splits);
  c.e_end = row_begin + static_cast<int>(static_cast<long long>(n_row) * (c.split + 1) / p.kv_splits);
  return c;
}

// load_q: the CTA's first `rows` score rows of Q (zero rows past the end).
template <int D, int kThreads, class T, class Layout = RowSwizzle<D>>
__device__ __forceinline__ void load_q(T* q_smem, int rows, const ForwardParams<T>& p, const CtaTask& c) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const RowId r = row_id(p, row, c.q_begin, c.q_len, c.head_group);
    const bool ok = r.valid && chunk * 8 < p.dk;
    const T* src = ok ? p.q + c.seq->q_base + r.q * p.q_token_stride + r.head * p.q_head_stride + chunk * 8 : p.q;
    cp_async_16(q_smem + Layout::offset(row, chunk * 8), src, ok ? 16 : 0);
  }
}

// load_kv: the K and V tiles of mask entry `entry` into one stage.
template <int D, int kThreads, class T, class Layout = RowSwizzle<D>>
__device__ __forceinline__ void load_kv(T* k_stage, T* v_stage, int entry, const ForwardParams<T>& p,
                                        const CtaTask& c) {
  const int key0 = p.entries[entry].x * kKeys;
  const int* pages = p.pages ? p.pages + c.seq->page_list : nullptr;
  load_kv_tile<D, kThreads, T, kKeys, Layout>(k_stage, p.k + c.seq->k_base + c.kv_head * p.k_head_stride,
                                              p.k_token_stride, key0, c.kv_len, p.dk, p.k, pages, p.page_size,
                                              p.k_page_stride);
  load_kv_tile<D, kThreads, T, kKeys, Layout>(v_stage, p.v + c.seq->v_base + c.kv_head * p.v_head_stride,
                                              p.v_token_stride, key0, c.kv_len, p.dv, p.v, pages, p.page_size,
                                              p.v_page_stride);
}

// score_mod_slice: one m16 x 64 slice of scores (C fragments, rows
// row0 + lane/4 and + 8) to log2-unit logits through the score hook
// (score_hooks.cuh), e.g. softcap(scale * s) - ALiBi.
template <class Hook, class T, int N>
__device__ __forceinline__ void score_mod_slice(const ForwardParams<T>& p, const Hook& hook, float (&s)[N][4], int row0,
                                                int batch, int q_begin, int q_len, int kv_len, int head_group, int key0,
                                                int lane, int col0 = 0) {
  typename Hook::Head head[2];
  int row_q[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const RowId r = row_id(p, row0 + lane / 4 + 8 * i, q_begin, q_len, head_group);
    row_q[i] = r.q;
    head[i] = hook.head(p, r.head, r.valid);
  }
#pragma unroll
  for (int nt = 0; nt < N; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = c / 2, key = key0 + col0 + nt * 8 + (lane % 4) * 2 + (c % 2);
      s[nt][c] = hook.logit(p, head[i], s[nt][c], ScorePair{batch, row_q[i], key, q_len, kv_len, kv_len - q_len});
    }
  }
}

// mask_slice: -inf where the tile's bits (tile >= 0) or the end of the keys
// exclude a score. Columns col0 + [0, 8N) of the 64-key tile.
template <class T, int N>
__device__ __forceinline__ void mask_slice(const ForwardParams<T>& p, float (&s)[N][4], int row0, int q_begin,
                                           int q_len, int kv_len, int head_group, int key0, int tile, int q_block,
                                           int lane, int col0 = 0) {
  unsigned long long words[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const RowId r = row_id(p, row0 + lane / 4 + 8 * i, q_begin, q_len, head_group);
    unsigned long long bits = ~0ull;
    if (tile >= 0) bits = r.valid ? p.tile_bits[static_cast<long long>(tile) * kRows + (r.q - q_block * kRows)] : 0ull;
    words[i] = bits & low_bits(kv_len - key0);  // 1 .. 63 keys of the last tile exist
  }
  apply_row_bits(s, words, col0, lane);
}

// score_and_mask: one slice of a tile's scores (mask entry `entry`: kv
// block, tile bits or -1) through the score hook, when it modifies scores
// (plain scores stay raw and are scaled inside the exponent), then -inf where
// the mask or the end of the keys excludes them.
template <class Hook, class T, int N>
__device__ __forceinline__ void score_and_mask(const ForwardParams<T>& p, const Hook& hook, float (&s)[N][4], int row0,
                                               const CtaTask& c, int2 entry, int lane, int col0 = 0) {
  const int key0 = entry.x * kKeys;
  if constexpr (Hook::kModifiesScores) {
    score_mod_slice(p, hook, s, row0, c.batch, c.q_begin, c.q_len, c.kv_len, c.head_group, key0, lane, col0);
  }
  if (entry.y >= 0 || key0 + kKeys > c.kv_len) {
    mask_slice(p, s, row0, c.q_begin, c.q_len, c.kv_len, c.head_group, key0, entry.y, c.q_block, lane, col0);
  }
}

}  // namespace seqattn::cuda::detail
