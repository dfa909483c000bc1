// PyTorch flex_attention's BlockMask arrays from a seqattn BlockMask.
//
// flex_attention (torch.nn.attention.flex_attention) reads, per (batch, head,
// q-block) row, the partial kv-blocks (kv_num_blocks / kv_indices) and the
// full ones (full_kv_num_blocks / full_kv_indices), and the same lists seen
// from the key side for its backward pass (q_num_blocks / q_indices,
// full_q_*). The rules create_block_mask follows, which this export
// reproduces exactly (docs/semantics/splash-and-flex.md, "Flex"):
//   - tiles are classified from content after padding the mask with `false`
//     up to a multiple of the block size, so a short edge tile is never full:
//     where seqattn says full (every element inside the sequence allowed),
//     flex says partial;
//   - a tile seqattn soundly lists as partial but whose bits are all set
//     (resp. clear) is full (resp. empty) for flex;
//   - each index row is a permutation of all block indices: the listed blocks
//     in increasing order, then every other block in increasing order (a
//     stable descending argsort of the 0/1 row);
//   - everything is int32, shaped [B, H, rows(, cols)].
// Cost: O(B x H x q-blocks x kv-blocks) for the index rows (their size) plus
// one popcount per distinct partial tile; per-element work only for a
// BlockMask built without tile bits, whose partial tiles are read from its
// predicate.
//
// The tile table (tile_ids + tile_bits) describes the mask element by element
// at O(tiles + distinct partial tiles) size: what a flex mask_mod can read to
// answer exactly for any seqattn mask.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/core/bits.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn {

struct FlexExportOptions {
  // create_block_mask's separate_full_blocks: when false every non-empty tile
  // is partial and the full_* arrays are left empty (None in Python).
  bool separate_full_blocks = true;
  // BlockMask.from_kv_blocks's compute_q_blocks: the key-side arrays.
  bool compute_q_blocks = true;
};

struct FlexBlockMaskArrays {
  index_t batch = 0, heads = 0, q_len = 0, kv_len = 0;
  BlockShape block;
  Tensor<std::int32_t> kv_num_blocks;       // [B, H, Qb]
  Tensor<std::int32_t> kv_indices;          // [B, H, Qb, Kb]
  Tensor<std::int32_t> full_kv_num_blocks;  // [B, H, Qb]      (empty when not separated)
  Tensor<std::int32_t> full_kv_indices;     // [B, H, Qb, Kb]
  Tensor<std::int32_t> q_num_blocks;        // [B, H, Kb]      (empty unless compute_q_blocks)
  Tensor<std::int32_t> q_indices;           // [B, H, Kb, Qb]
  Tensor<std::int32_t> full_q_num_blocks;   // [B, H, Kb]
  Tensor<std::int32_t> full_q_indices;      // [B, H, Kb, Qb]
};

// Every tile's content in a form a mask_mod can index: tile_ids[b, h, qb, kb]
// is kFlexEmptyTile, kFlexFullTile or an index into tile_bits, whose
// [n, block_q, block_kv] 0/1 bytes are the distinct partial tiles (zero
// outside a short edge tile). b and h range over the BlockMask's own batch
// and stored heads (1 for a head-invariant mask: broadcast).
inline constexpr std::int32_t kFlexEmptyTile = -1;
inline constexpr std::int32_t kFlexFullTile = -2;

struct FlexTileTable {
  Tensor<std::int32_t> tile_ids;   // [B', H', Qb, Kb]
  Tensor<std::uint8_t> tile_bits;  // [n, block_q, block_kv]
};

namespace detail::flex {

// The content of the BlockMask's partial tiles: exact classes (0 empty,
// 1 partial, 2 full: full only for an all-set full-size tile) and a dense id
// per distinct content.
class PartialTiles {
 public:
  explicit PartialTiles(const BlockMask& bm) : bm_(bm) {
    stored_ = bm.num_partial_tiles() == 0 || bm.has_tile_bits();
    if (stored_) cls_.assign(static_cast<std::size_t>(bm.num_distinct_partial_tiles()), -1);
  }

  // Class and content id of partial tile i of row (b, h, qb).
  std::pair<std::int8_t, std::int32_t> of(index_t b, index_t h, index_t qb, std::size_t i, std::int32_t kb) {
    const BlockShape s = bm_.block_shape();
    if (stored_) {
      const std::int32_t id = bm_.partial_tile_ids(b, h, qb)[i];
      std::int8_t& k = cls_[static_cast<std::size_t>(id)];
      if (k < 0) {
        index_t ones = 0;
        for (std::uint64_t w : bm_.tile_bits(id)) ones += std::popcount(w);
        k = ones == 0 ? 0 : ones == s.q * s.kv ? 2 : 1;
      }
      return {k, id};
    }
    // No stored bits: the predicate, one tile at a time (not deduplicated).
    const Tile t = bm_.tile(b, qb, kb);
    const MaskContext ctx{b, h, bm_.q_len(b), bm_.kv_len(b)};
    const index_t words = bm_.words_per_row();
    std::vector<std::uint64_t> bits(static_cast<std::size_t>(s.q * words), 0);
    index_t ones = 0;
    for (index_t r = 0; r < t.rows(); ++r) {
      for (index_t c = 0; c < t.cols(); ++c) {
        if (bm_.allowed(ctx, t.q_begin + r, t.kv_begin + c)) {
          bits[static_cast<std::size_t>(r * words + c / 64)] |= std::uint64_t{1} << (c % 64);
          ++ones;
        }
      }
    }
    const auto id = static_cast<std::int32_t>(own_.size() / bits.size());
    own_.insert(own_.end(), bits.begin(), bits.end());
    return {static_cast<std::int8_t>(ones == 0 ? 0 : ones == s.q * s.kv ? 2 : 1), id};
  }

  std::span<const std::uint64_t> bits(std::int32_t id) const {
    if (stored_) return bm_.tile_bits(id);
    const auto words = static_cast<std::size_t>(bm_.block_shape().q * bm_.words_per_row());
    return std::span(own_).subspan(static_cast<std::size_t>(id) * words, words);
  }

 private:
  const BlockMask& bm_;
  bool stored_ = true;
  std::vector<std::int8_t> cls_;
  std::vector<std::uint64_t> own_;
};

// Class grid [Qb x Kb] of stored row (b, h), as flex classifies, with the
// content id of each partial tile (or -1).
inline void class_grid(const BlockMask& bm, index_t b, index_t h, PartialTiles& tiles, std::vector<std::int8_t>& cls,
                       std::vector<std::int32_t>* content) {
  const index_t nq = bm.num_q_blocks(b), nkv = bm.num_kv_blocks(b);
  const BlockShape s = bm.block_shape();
  // Only the last q-block row and kv-block column can be short.
  const bool short_q = bm.q_len(b) % s.q != 0, short_kv = bm.kv_len(b) % s.kv != 0;
  cls.assign(static_cast<std::size_t>(nq * nkv), 0);
  if (content) content->assign(cls.size(), -1);
  for (index_t qb = 0; qb < nq; ++qb) {
    std::int8_t* row = cls.data() + qb * nkv;
    const bool edge_row = short_q && qb == nq - 1;
    for (const BlockRange& r : bm.full_ranges(b, h, qb)) {
      std::fill(row + r.begin, row + r.end, static_cast<std::int8_t>(edge_row ? 1 : 2));
    }
    if (short_kv && nkv > 0 && row[nkv - 1] == 2) row[nkv - 1] = 1;
    const auto partial = bm.partial_blocks(b, h, qb);
    for (std::size_t i = 0; i < partial.size(); ++i) {
      const auto [k, id] = tiles.of(b, h, qb, i, partial[i]);
      row[partial[i]] = k;
      if (content && k != 0) (*content)[static_cast<std::size_t>(qb * nkv + partial[i])] = id;
    }
  }
  // A full-range tile on the short edge is partial with content -1: its
  // pattern is "every element inside the sequence" (flex_tile_table).
}

// Ordered form of a 0/1 row read with stride: listed indices ascending, then
// the others ascending. Returns the count.
template <class Listed>
std::int32_t ordered_row(index_t n, const Listed& listed, std::int32_t* out) {
  std::int32_t count = 0;
  for (index_t i = 0; i < n; ++i) {
    if (listed(i)) out[count++] = static_cast<std::int32_t>(i);
  }
  std::int32_t k = count;
  for (index_t i = 0; i < n; ++i) {
    if (!listed(i)) out[k++] = static_cast<std::int32_t>(i);
  }
  return count;
}

inline void require_flex_shape(const BlockMask& bm, index_t batch, index_t heads, const char* what) {
  using seqattn::detail::require;
  require(batch > 0 && heads > 0 && heads <= limits::kMaxHeads, what, ": B (", batch, ") and H (", heads,
          ") must be positive, H at most ", limits::kMaxHeads);
  require(bm.batch() == batch || bm.batch() == 1, what, ": the BlockMask has ", bm.batch(),
          " sequences, which neither equals B=", batch, " nor broadcasts (1)");
  require(bm.heads() == heads || bm.heads() == 1, what, ": the BlockMask stores ", bm.heads(),
          " heads, which neither equals H=", heads, " nor broadcasts (1)");
  for (index_t b = 1; b < bm.batch(); ++b) {
    require(bm.q_len(b) == bm.q_len(0) && bm.kv_len(b) == bm.kv_len(0), what,
            ": flex has one Q_LEN and KV_LEN for the whole batch, but sequence ", b, " has lengths (", bm.q_len(b),
            ", ", bm.kv_len(b), ") and sequence 0 (", bm.q_len(0), ", ", bm.kv_len(0), ")");
  }
}

}  // namespace detail::flex

// The BlockMask's arrays for flex_attention with batch B and H heads (the
// BlockMask's batch and heads must equal them or be 1, which broadcasts).
inline FlexBlockMaskArrays to_flex_block_mask(const BlockMask& bm, index_t B, index_t H,
                                              const FlexExportOptions& options = {}) {
  namespace df = detail::flex;
  df::require_flex_shape(bm, B, H, "to_flex_block_mask");
  FlexBlockMaskArrays out;
  out.batch = B;
  out.heads = H;
  out.q_len = bm.q_len(0);
  out.kv_len = bm.kv_len(0);
  out.block = bm.block_shape();
  const index_t nq = bm.num_q_blocks(0), nkv = bm.num_kv_blocks(0);
  using seqattn::detail::checked_size;
  const index_t kv_rows = checked_size("to_flex_block_mask: kv_num_blocks", limits::kMaxTensorElements, B, H, nq);
  const index_t q_rows = checked_size("to_flex_block_mask: q_num_blocks", limits::kMaxTensorElements, B, H, nkv);
  const index_t cells = checked_size("to_flex_block_mask: kv_indices", limits::kMaxTensorElements, B, H, nq, nkv);
  // Every array at once, so a request that cannot be served fails before any
  // is written; each is within the element limit, so the sum fits in 64 bits.
  const index_t lists = options.separate_full_blocks ? 2 : 1;
  const index_t elements = lists * (kv_rows + cells + (options.compute_q_blocks ? q_rows + cells : 0));
  const index_t grid_cells = nq * nkv;  // at most `cells`: B, H >= 1
  std::vector<std::int8_t> cls;
  seqattn::detail::allocating(
      "to_flex_block_mask: the flex arrays and one class grid",
      static_cast<std::size_t>(elements) * sizeof(std::int32_t) + static_cast<std::size_t>(grid_cells), [&] {
        cls.reserve(static_cast<std::size_t>(grid_cells));
        out.kv_num_blocks = Tensor<std::int32_t>(Extents{B, H, nq});
        out.kv_indices = Tensor<std::int32_t>(Extents{B, H, nq, nkv});
        if (options.separate_full_blocks) {
          out.full_kv_num_blocks = Tensor<std::int32_t>(Extents{B, H, nq});
          out.full_kv_indices = Tensor<std::int32_t>(Extents{B, H, nq, nkv});
        }
        if (options.compute_q_blocks) {
          out.q_num_blocks = Tensor<std::int32_t>(Extents{B, H, nkv});
          out.q_indices = Tensor<std::int32_t>(Extents{B, H, nkv, nq});
          if (options.separate_full_blocks) {
            out.full_q_num_blocks = Tensor<std::int32_t>(Extents{B, H, nkv});
            out.full_q_indices = Tensor<std::int32_t>(Extents{B, H, nkv, nq});
          }
        }
      });
  df::PartialTiles tiles(bm);
  // Which classes a list holds: partial lists take full tiles too when full
  // tiles are not separated.
  const std::int8_t full_into_partial = options.separate_full_blocks ? 1 : 2;
  auto is_partial = [&](std::int8_t c) { return c == 1 || c == full_into_partial; };
  // (b, h) slices of the output filled from stored row (b % bm.batch, h % bm.heads):
  // computed once, copied to the broadcast slices.
  for (index_t sb = 0; sb < bm.batch(); ++sb) {
    for (index_t sh = 0; sh < bm.heads(); ++sh) {
      df::class_grid(bm, sb, sh, tiles, cls, nullptr);
      const index_t b0 = sb, h0 = sh;
      const auto slice = [&](index_t b, index_t h) { return b * H + h; };
      const index_t s0 = slice(b0, h0);
      for (index_t qb = 0; qb < nq; ++qb) {
        const std::int8_t* row = cls.data() + qb * nkv;
        out.kv_num_blocks.data()[s0 * nq + qb] = df::ordered_row(
            nkv, [&](index_t k) { return is_partial(row[k]); }, out.kv_indices.data() + (s0 * nq + qb) * nkv);
        if (options.separate_full_blocks) {
          out.full_kv_num_blocks.data()[s0 * nq + qb] = df::ordered_row(
              nkv, [&](index_t k) { return row[k] == 2; }, out.full_kv_indices.data() + (s0 * nq + qb) * nkv);
        }
      }
      if (options.compute_q_blocks) {
        for (index_t kb = 0; kb < nkv; ++kb) {
          out.q_num_blocks.data()[s0 * nkv + kb] = df::ordered_row(
              nq, [&](index_t q) { return is_partial(cls[static_cast<std::size_t>(q * nkv + kb)]); },
              out.q_indices.data() + (s0 * nkv + kb) * nq);
          if (options.separate_full_blocks) {
            out.full_q_num_blocks.data()[s0 * nkv + kb] = df::ordered_row(
                nq, [&](index_t q) { return cls[static_cast<std::size_t>(q * nkv + kb)] == 2; },
                out.full_q_indices.data() + (s0 * nkv + kb) * nq);
          }
        }
      }
      // Broadcast copies.
      for (index_t b = sb; b < B; b += bm.batch()) {
        for (index_t h = sh; h < H; h += bm.heads()) {
          const index_t s = slice(b, h);
          if (s == s0) continue;
          auto copy = [&](Tensor<std::int32_t>& t, index_t per_slice) {
            if (t.empty()) return;
            std::copy_n(t.data() + s0 * per_slice, per_slice, t.data() + s * per_slice);
          };
          copy(out.kv_num_blocks, nq);
          copy(out.kv_indices, nq * nkv);
          copy(out.full_kv_num_blocks, nq);
          copy(out.full_kv_indices, nq * nkv);
          copy(out.q_num_blocks, nkv);
          copy(out.q_indices, nkv * nq);
          copy(out.full_q_num_blocks, nkv);
          copy(out.full_q_indices, nkv * nq);
        }
      }
    }
  }
  return out;
}

// The tile table of a BlockMask (see FlexTileTable): lengths must be uniform.
inline FlexTileTable flex_tile_table(const BlockMask& bm) {
  namespace df = detail::flex;
  df::require_flex_shape(bm, bm.batch(), bm.heads(), "flex_tile_table");
  const index_t nq = bm.num_q_blocks(0), nkv = bm.num_kv_blocks(0);
  const BlockShape s = bm.block_shape();
  FlexTileTable table;
  const index_t cells = seqattn::detail::checked_size("flex_tile_table: tile_ids", limits::kMaxTensorElements,
                                                      bm.batch(), bm.heads(), nq, nkv);
  const index_t grid_cells = nq * nkv;
  std::vector<std::int8_t> cls;
  std::vector<std::int32_t> content;
  seqattn::detail::allocating(
      "flex_tile_table: tile_ids and one class grid",
      static_cast<std::size_t>(cells + grid_cells) * sizeof(std::int32_t) + static_cast<std::size_t>(grid_cells), [&] {
        table.tile_ids = Tensor<std::int32_t>(Extents{bm.batch(), bm.heads(), nq, nkv}, kFlexEmptyTile);
        cls.reserve(static_cast<std::size_t>(grid_cells));
        content.reserve(static_cast<std::size_t>(grid_cells));
      });
  df::PartialTiles tiles(bm);
  std::vector<std::int32_t> number;  // content id -> row of tile_bits
  std::vector<std::uint8_t> bytes;
  const index_t words = bm.words_per_row();
  auto add_tile = [&](std::span<const std::uint64_t> bits) {
    const std::size_t at = bytes.size();
    bytes.resize(at + static_cast<std::size_t>(s.q * s.kv), 0);
    for (index_t r = 0; r < s.q; ++r) {
      for (index_t c = 0; c < s.kv; ++c) {
        bytes[at + static_cast<std::size_t>(r * s.kv + c)] =
            static_cast<std::uint8_t>(detail::test_bit(bits.data() + r * words, c));
      }
    }
    return static_cast<std::int32_t>(at / static_cast<std::size_t>(s.q * s.kv));
  };
  // Full tiles on a short edge: their bits are "every element inside".
  std::int32_t edge_ids[2][2] = {{-1, -1}, {-1, -1}};
  for (index_t b = 0; b < bm.batch(); ++b) {
    for (index_t h = 0; h < bm.heads(); ++h) {
      df::class_grid(bm, b, h, tiles, cls, &content);
      std::int32_t* ids = table.tile_ids.data() + (b * bm.heads() + h) * nq * nkv;
      for (index_t qb = 0; qb < nq; ++qb) {
        for (index_t kb = 0; kb < nkv; ++kb) {
          const auto i = static_cast<std::size_t>(qb * nkv + kb);
          if (cls[i] == 2) {
            ids[i] = kFlexFullTile;
          } else if (cls[i] == 1 && content[i] >= 0) {
            const auto c = static_cast<std::size_t>(content[i]);
            if (number.size() <= c) number.resize(c + 1, -1);
            if (number[c] < 0) number[c] = add_tile(tiles.bits(content[i]));
            ids[i] = number[c];
          } else if (cls[i] == 1) {
            // A full BlockMask tile demoted to partial on the short edge.
            const Tile t = bm.tile(b, qb, kb);
            const int rq = t.rows() < s.q ? 1 : 0, ck = t.cols() < s.kv ? 1 : 0;
            if (edge_ids[rq][ck] < 0) {
              std::vector<std::uint64_t> bits(static_cast<std::size_t>(s.q * words), 0);
              for (index_t r = 0; r < t.rows(); ++r)
                seqattn::detail::set_bit_range(bits.data() + r * words, 0, t.cols());
              edge_ids[rq][ck] = add_tile(bits);
            }
            ids[i] = edge_ids[rq][ck];
          }
        }
      }
    }
  }
  const auto n = static_cast<index_t>(bytes.size() / static_cast<std::size_t>(s.q * s.kv));
  table.tile_bits = Tensor<std::uint8_t>(Extents{n, s.q, s.kv}, std::move(bytes));
  return table;
}

}  // namespace seqattn
