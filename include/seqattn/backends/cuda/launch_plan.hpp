// How the Cuda backend's forward kernel is launched for a shape and a mask:
// host-only planning, tested without a GPU.
//
// One CTA computes kBlockQ = 128 score rows against the kv tiles of one
// BlockMask row (a 128-query block). A row is a (query, head) pair:
//   - prefill: the CTA takes 128 queries of one head (grid.y = heads);
//   - packed GQA (decode and short queries): when the mask is the same for
//     every head and max_q_len * group <= 128, the CTA takes 128 / group
//     queries of all `group` heads that share one kv head, so each K/V tile
//     is read once per kv head instead of once per query head (grid.y = kv
//     heads). FlashInfer and FA2 decode pack GQA heads the same way.
// Work items (grid.x) are (sequence, first query) pairs, longest row first so
// the tail of the grid is short work.
//
// Decode kernel: when every CTA has at most 16 score rows (max_q_len *
// heads_per_cta <= 16, head dim <= 128), a CTA takes 16 rows and its 4 warps
// split each 64-key tile into four 16-key quarters, each warp keeping its own
// softmax state, merged through shared memory at the end. The prefill
// layout would leave one warp computing while three wait on it.
//
// KV splits (flash-decoding): when the grid would leave SMs idle, each row's
// entries are cut into `kv_splits` contiguous slices run by separate CTAs
// (grid.z); their partial outputs and LSEs go to an fp32 workspace and a
// second kernel merges them by LSE (adding sinks there).
//
// Backward (plan_backward_launch): the key pass takes 64 keys of one K/V head
// per CTA (grid.x: (sequence, kv-block) items, grid.y: K/V heads) and walks
// the key block's row of the transposed mask for every query head of its
// group; the query pass takes 128 queries of one head (grid.x: (sequence,
// first query) items, grid.y: heads) and walks the forward mask row. Items
// are ordered longest row first, as in the forward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/backends/device_mask.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/longest_first.hpp"

namespace seqattn::cuda {

inline constexpr index_t kBlockQ = 128;
inline constexpr index_t kBlockKv = 64;
inline constexpr index_t kMaxHeadDim = 256;
inline constexpr index_t kMaxKvSplits = 128;
inline constexpr index_t kDecodeRows = 16;
inline constexpr index_t kMinTilesPerSplit = 16;

struct WorkItem {
  std::int32_t batch = 0;
  std::int32_t q_begin = 0;  // first query of the CTA (sequence-local)
  friend bool operator==(const WorkItem&, const WorkItem&) = default;
};

struct LaunchPlan {
  index_t head_dim = 0;               // the kernel's padded head dim: 64, 128 or 256
  index_t heads_per_cta = 1;          // 1, or the GQA group when packed
  bool decode = false;                // the 16-row decode kernel
  bool wgmma = false;                 // the Hopper prefill kernel (use_wgmma)
  index_t rows_per_cta = kBlockQ;     // 128, or 16 for the decode kernel
  index_t queries_per_cta = kBlockQ;  // rows_per_cta / heads_per_cta
  index_t head_groups = 0;            // grid.y
  index_t kv_splits = 1;              // grid.z
  std::vector<WorkItem> items;        // grid.x
  // Compact query-token index of each sequence's token 0 (the split workspace
  // rows) and their total.
  std::vector<std::int64_t> q_token_base;
  index_t q_tokens = 0;

  index_t ctas() const { return static_cast<index_t>(items.size()) * head_groups * kv_splits; }
  // fp32 elements of the split workspace (partial outputs, partial LSEs).
  index_t workspace_out_elems(index_t heads, index_t dv) const {
    return kv_splits > 1 ? kv_splits * q_tokens * heads * dv : 0;
  }
  index_t workspace_lse_elems(index_t heads) const { return kv_splits > 1 ? kv_splits * q_tokens * heads : 0; }
};

// The head dim the kernel is instantiated for: the smallest of 64, 128 and
// 256 that holds both dk and dv (inputs are zero-padded on the way into
// shared memory).
inline index_t padded_head_dim(index_t dk, index_t dv) {
  const index_t d = std::max(dk, dv);
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// Whether a plan's prefill runs on the Hopper kernel
// (backends/cuda/wgmma_forward_kernel.cuh) rather than the mma.sync one: the
// kernels were built for sm_90a (SEQATTN_CUDA_WGMMA), the device has compute
// capability 9.x, the head dim is at most 128, and the decode kernel does
// not take the shape.
inline bool use_wgmma(const LaunchPlan& plan, int compute_major, bool built_for_sm90a) {
  return built_for_sm90a && compute_major == 9 && !plan.decode && plan.head_dim <= 128;
}

// Appends the items of (weight, item) pairs to `out`, heaviest first (ties
// keep their order), so that the tail of a grid is short work.
template <class Item>
void longest_first(const std::vector<std::pair<index_t, Item>>& weighted, std::vector<Item>& out) {
  const auto order = seqattn::detail::longest_first(
      static_cast<index_t>(weighted.size()), [&](index_t i) { return weighted[static_cast<std::size_t>(i)].first; });
  for (const index_t i : order) out.push_back(weighted[static_cast<std::size_t>(i)].second);
}

inline LaunchPlan plan_launch(const AttentionShape& shape, const backends::DeviceMaskLayout& mask,
                              const PlanOptions& options, index_t num_sms) {
  seqattn::detail::require(mask.block.q == kBlockQ && mask.block.kv == kBlockKv,
                           "Cuda backend: the BlockMask has block shape (", mask.block.q, ", ", mask.block.kv,
                           "), the kernels tile by (", kBlockQ, ", ", kBlockKv, ")");
  seqattn::detail::require(mask.lengths.q == shape.lengths.q && mask.lengths.kv == shape.lengths.kv,
                           "Cuda backend: the device mask was built for ", mask.lengths.batch(),
                           " sequences of other lengths than the shape's (", shape, ")");
  seqattn::detail::require(num_sms > 0, "Cuda backend: num_sms must be positive, got ", num_sms);
  LaunchPlan plan;
  plan.head_dim = padded_head_dim(shape.dk, shape.dv);
  const index_t group = shape.group();
  const bool packable =
      mask.mask_heads == 1 && group > 1 && kBlockQ % group == 0 && shape.max_q_len() * group <= kBlockQ;
  plan.heads_per_cta = packable ? group : 1;
  plan.decode = plan.head_dim <= 128 && kDecodeRows % plan.heads_per_cta == 0 &&
                shape.max_q_len() * plan.heads_per_cta <= kDecodeRows;
  plan.rows_per_cta = plan.decode ? kDecodeRows : kBlockQ;
  plan.queries_per_cta = plan.rows_per_cta / plan.heads_per_cta;
  plan.head_groups = shape.heads / plan.heads_per_cta;

  // Work items, with the number of kv tiles of their mask row (head 0) for
  // ordering and for choosing the splits.
  std::vector<std::pair<index_t, WorkItem>> weighted;
  index_t max_tiles = 0;
  for (index_t b = 0; b < shape.batch(); ++b) {
    plan.q_token_base.push_back(plan.q_tokens);
    plan.q_tokens = seqattn::detail::checked_add(plan.q_tokens, shape.q_len(b), "Cuda backend: total query tokens");
    for (index_t q = 0; q < shape.q_len(b); q += plan.queries_per_cta) {
      const index_t row = mask.row_base[static_cast<std::size_t>(b)] + q / kBlockQ;
      const index_t tiles =
          mask.row_offsets[static_cast<std::size_t>(row) + 1] - mask.row_offsets[static_cast<std::size_t>(row)];
      max_tiles = std::max(max_tiles, tiles);
      weighted.push_back({tiles, {static_cast<std::int32_t>(b), static_cast<std::int32_t>(q)}});
    }
  }
  longest_first(weighted, plan.items);
  seqattn::detail::require(static_cast<index_t>(plan.items.size()) <= INT32_MAX && plan.head_groups <= 65535,
                           "Cuda backend: the grid (", plan.items.size(), " work items x ", plan.head_groups,
                           " head groups) exceeds CUDA's grid limits");

  if (options.kv_splits > 0) {
    plan.kv_splits = std::min<index_t>(options.kv_splits, kMaxKvSplits);
  } else {
    // Up to four CTAs per SM, but at least kMinTilesPerSplit kv tiles a
    // split so that each CTA's pipeline runs long enough to hide its start.
    // Measured on an H100 (132 SMs), decode 32k, GQA 32/4: batch 1 is best at
    // 33 splits (132 CTAs), batch 8 at 16 (512 CTAs); 66 and 9 splits, the
    // former "two waves" rule, were 15 % and 12 % slower.
    const index_t ctas = static_cast<index_t>(plan.items.size()) * plan.head_groups;
    if (ctas > 0 && ctas < num_sms) {
      const index_t want = (4 * num_sms + ctas - 1) / ctas;
      plan.kv_splits = std::clamp<index_t>(std::min(want, max_tiles / kMinTilesPerSplit), 1, kMaxKvSplits);
    }
  }
  return plan;
}

struct KeyWorkItem {
  std::int32_t batch = 0;
  std::int32_t kv_block = 0;
  friend bool operator==(const KeyWorkItem&, const KeyWorkItem&) = default;
};

inline constexpr index_t kMaxBackwardHeadDim = 128;

struct BackwardLaunchPlan {
  index_t head_dim = 0;                // 64 or 128
  std::vector<WorkItem> query_items;   // grid.x of the row and query passes
  std::vector<KeyWorkItem> key_items;  // grid.x of the key pass
  std::vector<std::int64_t> q_token_base;
  index_t q_tokens = 0;

  // fp32 elements of each per-row workspace (D, LSE, sink terms): [q_tokens][heads].
  index_t workspace_rows(index_t heads) const { return q_tokens * heads; }
};

// `keys` is the device layout of the transposed BlockMask (block shape
// (kBlockKv, kBlockQ): rows are key blocks, two words of tile bits per key).
inline BackwardLaunchPlan plan_backward_launch(const AttentionShape& shape, const backends::DeviceMaskLayout& mask,
                                               const backends::DeviceMaskLayout& keys) {
  seqattn::detail::require(shape.dk <= kMaxBackwardHeadDim && shape.dv <= kMaxBackwardHeadDim,
                           "Cuda backend: the backward pass supports head dims up to ", kMaxBackwardHeadDim,
                           ", got dk ", shape.dk, ", dv ", shape.dv);
  seqattn::detail::require(keys.block.q == kBlockKv && keys.block.kv == kBlockQ && keys.words_per_row == 2 &&
                               keys.lengths.q == mask.lengths.kv && keys.lengths.kv == mask.lengths.q,
                           "Cuda backend: the key-side device mask is not the transpose of the forward one (block "
                           "shape (",
                           keys.block.q, ", ", keys.block.kv, "))");
  BackwardLaunchPlan plan;
  plan.head_dim = padded_head_dim(shape.dk, shape.dv);
  auto row_length = [](const backends::DeviceMaskLayout& m, index_t row) {
    return m.row_offsets[static_cast<std::size_t>(row) + 1] - m.row_offsets[static_cast<std::size_t>(row)];
  };
  std::vector<std::pair<index_t, WorkItem>> queries;
  std::vector<std::pair<index_t, KeyWorkItem>> key_blocks;
  for (index_t b = 0; b < shape.batch(); ++b) {
    plan.q_token_base.push_back(plan.q_tokens);
    plan.q_tokens = seqattn::detail::checked_add(plan.q_tokens, shape.q_len(b), "Cuda backend: total query tokens");
    for (index_t q = 0; q < shape.q_len(b); q += kBlockQ) {
      const index_t row = mask.row_base[static_cast<std::size_t>(b)] + q / kBlockQ;
      queries.push_back({row_length(mask, row), {static_cast<std::int32_t>(b), static_cast<std::int32_t>(q)}});
    }
    for (index_t kb = 0; kb * kBlockKv < shape.kv_len(b); ++kb) {
      const index_t row = keys.row_base[static_cast<std::size_t>(b)] + kb;
      key_blocks.push_back({row_length(keys, row), {static_cast<std::int32_t>(b), static_cast<std::int32_t>(kb)}});
    }
  }
  longest_first(queries, plan.query_items);
  longest_first(key_blocks, plan.key_items);
  seqattn::detail::require(static_cast<index_t>(plan.query_items.size()) <= INT32_MAX &&
                               static_cast<index_t>(plan.key_items.size()) <= INT32_MAX && shape.heads <= 65535,
                           "Cuda backend: the backward grid (", plan.query_items.size(), " query items, ",
                           plan.key_items.size(), " key items, ", shape.heads, " heads) exceeds CUDA's grid limits");
  return plan;
}

}  // namespace seqattn::cuda
