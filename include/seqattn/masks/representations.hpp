// Every representation, built from any description:
//
//   to_dense         uint8 (B, H, Q, KV), 1 = allowed (rows/cols past a ragged
//                    sequence's lengths are 0)
//   to_additive      float, same shape: 0 allowed, mask_value elsewhere
//                    (default kDefaultMaskValue, MaxText's -0.7 x float max)
//   pack_bits        FlashInfer's bit-packed custom mask (see dense.hpp)
//   segment_metadata O(n) sglang-jax segment mode: per-sequence prefix_end and
//                    per-token request-local row segment start
//   block_segment_metadata  the same rows laid out [num_q_blocks, block_q] per
//                    sequence, so a kernel loads one contiguous block (the
//                    fix sglang-jax's TPU lowering needed: no gather)
//   BlockMask        block_mask.hpp; top-k scatter: topk.hpp
//
// The segment predicate (what a kernel computes from the metadata) is
//   q < prefix_end ? kv <= q : kv < prefix_end || seg_start(q) <= kv <= q
// which is causal-document attention when prefix_end = 0 and the
// multi-item rule of docs/semantics/multi-item-topk-kascade.md §A.3 otherwise.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "seqattn/core/bits.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/dense.hpp"
#include "seqattn/masks/document.hpp"
#include "seqattn/masks/multi_item.hpp"
#include "seqattn/masks/structural.hpp"

namespace seqattn {

namespace detail {
inline index_t max_of(const std::vector<index_t>& v) {
  index_t m = 0;
  for (index_t x : v) m = std::max(m, x);
  return m;
}

// No sequence is longer than a tensor may be (limits::kMaxTensorElements).
// Checked first: a result can be empty for a huge length (no keys), and
// sizing row scratch or walking rows by such a length would not end.
inline void check_representation_lengths(const RaggedLengths& lengths, const char* who) {
  const auto check = [&](const std::vector<index_t>& side, const char* name) {
    for (std::size_t b = 0; b < side.size(); ++b) {
      detail::require(side[b] <= limits::kMaxTensorElements, who, ": ", name, " of sequence ", b, " is ", side[b],
                      ", more than the limit of ", limits::kMaxTensorElements, " (limits::kMaxTensorElements)");
    }
  };
  check(lengths.q, "q_len");
  check(lengths.kv, "kv_len");
}

inline bool empty_sequence(const RaggedLengths& lengths, index_t b) {
  const auto u = static_cast<std::size_t>(b);
  return lengths.q[u] == 0 || lengths.kv[u] == 0;
}
}  // namespace detail

template <MaskDescription M>
Tensor<std::uint8_t> to_dense(const M& mask, const RaggedLengths& lengths, index_t heads = 1) {
  detail::check_representation_lengths(lengths, "to_dense");
  detail::check_mask(mask, lengths, heads);
  const index_t qm = detail::max_of(lengths.q), km = detail::max_of(lengths.kv);
  Tensor<std::uint8_t> out(Extents{lengths.batch(), heads, qm, km}, 0);
  if (out.size() == 0) return out;
  std::vector<std::uint64_t> words(static_cast<std::size_t>((km + 63) / 64));
  for (index_t b = 0; b < lengths.batch(); ++b) {
    if (detail::empty_sequence(lengths, b)) continue;
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      for (index_t q = 0; q < ctx.q_len; ++q) {
        std::fill(words.begin(), words.end(), 0);
        detail::fill_row_bits(mask, ctx, q, 0, ctx.kv_len, words.data());
        std::uint8_t* row = &out(b, h, q, index_t{0});
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) row[kv] = detail::test_bit(words.data(), kv);
      }
    }
  }
  return out;
}

template <MaskDescription M>
Tensor<float> to_additive(const M& mask, const RaggedLengths& lengths, index_t heads = 1,
                          float mask_value = kDefaultMaskValue) {
  const Tensor<std::uint8_t> dense = to_dense(mask, lengths, heads);
  Tensor<float> out(dense.shape());
  for (index_t i = 0; i < dense.size(); ++i) out.data()[i] = dense.data()[i] ? 0.0f : mask_value;
  return out;
}

// FlashInfer segment_packbits (bitorder "little"), one segment per
// (sequence, stored head); a head-invariant mask is packed once per sequence.
template <MaskDescription M>
PackedMask pack_bits(const M& mask, const RaggedLengths& lengths, index_t heads = 1) {
  detail::check_representation_lengths(lengths, "pack_bits");
  detail::check_mask(mask, lengths, heads);
  PackedMask p;
  p.lengths = lengths;
  p.heads = is_head_invariant<M>() ? 1 : heads;
  const index_t segments =
      detail::checked_size("pack_bits: segments (batch x heads)", limits::kMaxTensorElements, lengths.batch(), p.heads);
  index_t total_bytes = 0;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const auto u = static_cast<std::size_t>(b);
    const index_t bits = detail::checked_size("pack_bits: q_len x kv_len x heads", 8 * limits::kMaxTensorElements,
                                              lengths.q[u], lengths.kv[u], p.heads);
    total_bytes = detail::checked_add(total_bytes, (bits + 7) / 8, "pack_bits: total bytes");
  }
  detail::require(total_bytes <= limits::kMaxTensorElements, "pack_bits: ", total_bytes,
                  " bytes of bits exceed the limit of ", limits::kMaxTensorElements, " (limits::kMaxTensorElements)");
  p.bits.reserve(static_cast<std::size_t>(total_bytes));
  p.indptr.reserve(static_cast<std::size_t>(segments) + 1);
  std::vector<std::uint64_t> words;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    if (detail::empty_sequence(lengths, b)) {
      p.indptr.insert(p.indptr.end(), static_cast<std::size_t>(p.heads), static_cast<index_t>(p.bits.size()));
      continue;
    }
    for (index_t h = 0; h < p.heads; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      const auto base = p.bits.size();
      p.bits.resize(base + static_cast<std::size_t>((ctx.q_len * ctx.kv_len + 7) / 8), 0);
      words.assign(static_cast<std::size_t>((ctx.kv_len + 63) / 64), 0);
      for (index_t q = 0; q < ctx.q_len; ++q) {
        std::fill(words.begin(), words.end(), 0);
        detail::fill_row_bits(mask, ctx, q, 0, ctx.kv_len, words.data());
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          if (detail::test_bit(words.data(), kv)) {
            const index_t i = q * ctx.kv_len + kv;
            p.bits[base + static_cast<std::size_t>(i / 8)] |= static_cast<std::uint8_t>(1u << (i % 8));
          }
        }
      }
      p.indptr.push_back(static_cast<index_t>(p.bits.size()));
    }
  }
  return p;
}

// ---- Segment metadata (sglang-jax segment mode) -----------------------------

struct SegmentMetadataView {
  std::span<const index_t> token_offsets;       // batch + 1
  std::span<const std::int32_t> prefix_end;     // batch
  std::span<const std::int32_t> row_seg_start;  // total tokens, request-local
};

struct SegmentMetadata {
  std::vector<index_t> token_offsets{0};
  std::vector<std::int32_t> prefix_end;
  std::vector<std::int32_t> row_seg_start;
  SegmentMetadataView view() const { return {token_offsets, prefix_end, row_seg_start}; }
};

inline SegmentMetadata segment_metadata(const MultiItemLayout& layout) {
  const auto t = layout.token_offsets();
  const auto pe = layout.prefix_end();
  const auto rs = layout.row_seg_start();
  return {{t.begin(), t.end()}, {pe.begin(), pe.end()}, {rs.begin(), rs.end()}};
}

// Causal document masks as segment metadata (self-attention: q and kv ids
// must agree). Padding rows get seg_start = q + 1, so they see nothing.
inline SegmentMetadata segment_metadata(const DocumentLayout& layout) {
  const DocumentLayoutView v = layout.view();
  detail::require(v.q_tokens == v.kv_tokens, "segment_metadata: needs self-attention ids, got T_q=", v.q_tokens,
                  " and T_kv=", v.kv_tokens);
  SegmentMetadata m;
  for (index_t b = 0; b < v.batch; ++b) {
    const auto runs = v.q_row(b);
    const auto kv_runs = v.kv_row(b);
    detail::require(runs.size() == kv_runs.size(), "segment_metadata: row ", b, " has ", runs.size(),
                    " query segments but ", kv_runs.size(), " key segments (needs self-attention ids)");
    for (std::size_t r = 0; r < runs.size(); ++r) {
      detail::require(runs[r].id == kv_runs[r].id && runs[r].begin == kv_runs[r].begin &&
                          runs[r].end == kv_runs[r].end && runs[r].pos_begin == 0 && kv_runs[r].pos_begin == 0,
                      "segment_metadata: row ", b, " segment ", runs[r].id,
                      " differs between queries and keys or does not start at position 0");
    }
    m.prefix_end.push_back(0);
    for (index_t q = 0; q < v.q_tokens; ++q) {
      const std::int32_t r = v.q_run_of_token[static_cast<std::size_t>(b * v.q_tokens + q)];
      m.row_seg_start.push_back(r < 0 ? static_cast<std::int32_t>(q + 1) : runs[static_cast<std::size_t>(r)].begin);
    }
    m.token_offsets.push_back(m.token_offsets.back() + v.q_tokens);
  }
  return m;
}

namespace detail {
inline bool segment_rule(index_t prefix_end, index_t seg_start, index_t q, index_t kv) {
  if (kv > q) return false;
  return q < prefix_end || kv < prefix_end || kv >= seg_start;
}
}  // namespace detail

// What a kernel computes from flat segment metadata (one load per row).
struct SegmentMetadataMask {
  static constexpr bool head_invariant = true;
  SegmentMetadataView meta;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const auto b = static_cast<std::size_t>(ctx.batch);
    return detail::segment_rule(meta.prefix_end[b],
                                meta.row_seg_start[static_cast<std::size_t>(meta.token_offsets[b] + q)], q, kv);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

// Row segment starts laid out per q-block: sequence b's block j occupies
// rows [(q_block_offsets[b] + j) * block_q, ... + block_q) of row_seg_start.
// Rows past the end of a sequence hold 0 and must be discarded by kernels.
struct BlockSegmentMetadataView {
  index_t block_q = 0;
  std::span<const index_t> q_block_offsets;     // batch + 1
  std::span<const std::int32_t> prefix_end;     // batch
  std::span<const std::int32_t> row_seg_start;  // [total q-blocks, block_q]
};

struct BlockSegmentMetadata {
  index_t block_q = 0;
  std::vector<index_t> q_block_offsets{0};
  std::vector<std::int32_t> prefix_end;
  std::vector<std::int32_t> row_seg_start;

  BlockSegmentMetadataView view() const { return {block_q, q_block_offsets, prefix_end, row_seg_start}; }
  // The contiguous block_q values a kernel loads for (sequence b, q-block j).
  std::span<const std::int32_t> block(index_t b, index_t j) const {
    return std::span(row_seg_start)
        .subspan(static_cast<std::size_t>((q_block_offsets[static_cast<std::size_t>(b)] + j) * block_q),
                 static_cast<std::size_t>(block_q));
  }
};

inline BlockSegmentMetadata block_segment_metadata(const SegmentMetadata& flat, index_t block_q) {
  detail::require(block_q > 0, "block_segment_metadata: block_q must be positive, got ", block_q);
  detail::require(block_q <= limits::kMaxBlockSize, "block_segment_metadata: block_q must be at most ",
                  limits::kMaxBlockSize, " (limits::kMaxBlockSize), got ", block_q);
  index_t total = 0;
  for (std::size_t b = 0; b + 1 < flat.token_offsets.size(); ++b) {
    const index_t len = flat.token_offsets[b + 1] - flat.token_offsets[b];
    detail::require(len >= 0 && flat.token_offsets[b] >= 0 &&
                        flat.token_offsets[b + 1] <= static_cast<index_t>(flat.row_seg_start.size()),
                    "block_segment_metadata: token_offsets[", b, "..", b + 1, "] = [", flat.token_offsets[b], ", ",
                    flat.token_offsets[b + 1], ") outside the ", flat.row_seg_start.size(), " rows of row_seg_start");
    total = detail::checked_add(
        total,
        detail::checked_mul(detail::ceil_div_nonneg(len, block_q), block_q, "block_segment_metadata: padded rows"),
        "block_segment_metadata: padded rows");
  }
  detail::require(total <= limits::kMaxTensorElements, "block_segment_metadata: ", total,
                  " padded rows exceed the limit of ", limits::kMaxTensorElements, " (limits::kMaxTensorElements)");
  BlockSegmentMetadata m;
  m.block_q = block_q;
  m.prefix_end = flat.prefix_end;
  for (std::size_t b = 0; b + 1 < flat.token_offsets.size(); ++b) {
    const index_t len = flat.token_offsets[b + 1] - flat.token_offsets[b];
    const index_t blocks = (len + block_q - 1) / block_q;
    const auto base = m.row_seg_start.size();
    m.row_seg_start.resize(base + static_cast<std::size_t>(blocks * block_q), 0);
    std::copy_n(flat.row_seg_start.begin() + flat.token_offsets[b], len,
                m.row_seg_start.begin() + static_cast<std::ptrdiff_t>(base));
    m.q_block_offsets.push_back(m.q_block_offsets.back() + blocks);
  }
  return m;
}

// What a kernel computes from the block layout: row q of q-block j reads
// entry q % block_q of its block.
struct BlockSegmentMetadataMask {
  static constexpr bool head_invariant = true;
  BlockSegmentMetadataView meta;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const auto b = static_cast<std::size_t>(ctx.batch);
    const index_t row = (meta.q_block_offsets[b] + q / meta.block_q) * meta.block_q + q % meta.block_q;
    return detail::segment_rule(meta.prefix_end[b], meta.row_seg_start[static_cast<std::size_t>(row)], q, kv);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

}  // namespace seqattn
