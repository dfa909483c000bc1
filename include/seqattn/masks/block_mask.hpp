// BlockMask: the tile-level form of a mask that attention kernels consume.
//
// The (q, kv) grid of each sequence is cut into block_q x block_kv tiles (the
// last row/column of tiles may be short). For every (batch, head, q-block)
// "row" the BlockMask lists
//   - full kv-blocks, as increasing half-open ranges [begin, end): the kernel
//     runs them with no mask work at all;
//   - partial kv-blocks, as increasing indices: the kernel applies the mask
//     inside them, from the stored tile bits when present (Splash's dedup:
//     identical partial tiles share one bit pattern, so a causal mask with
//     block_q == block_kv stores a single tile whatever the length) or from
//     the description's element predicate;
// and never mentions empty kv-blocks, which the kernel skips.
//
// Memory is O(rows + full ranges + partial tiles): a causal or windowed mask
// has one full range and one or two partial tiles per row, not O(#tiles).
// Tile bits are little-endian within 64-bit words (bit c of word w of row r
// is kv column w*64 + c of tile row r), words_per_row = ceil(block_kv / 64).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// Per-sequence q and kv lengths of a (possibly ragged) batch.
struct RaggedLengths {
  std::vector<index_t> q;
  std::vector<index_t> kv;

  static RaggedLengths uniform(index_t batch, index_t q_len, index_t kv_len) {
    return {std::vector<index_t>(static_cast<std::size_t>(batch), q_len),
            std::vector<index_t>(static_cast<std::size_t>(batch), kv_len)};
  }
  index_t batch() const { return static_cast<index_t>(q.size()); }
};

struct BlockShape {
  index_t q = 128;
  index_t kv = 128;
};

struct BlockRange {
  std::int32_t begin = 0;
  std::int32_t end = 0;
  friend bool operator==(const BlockRange&, const BlockRange&) = default;
};

struct BlockMaskOptions {
  // Store the bit pattern of each distinct partial tile, so kernels need not
  // evaluate the mask predicate. Costs block_q * ceil(block_kv/64) words per
  // distinct partial tile.
  bool store_tile_bits = true;
};

class BlockMask {
 public:
  BlockMask() = default;

  index_t batch() const { return lengths_.batch(); }
  // 1 when the mask is head-invariant: then any head index reads head 0.
  index_t heads() const { return heads_; }
  BlockShape block_shape() const { return block_; }
  const RaggedLengths& lengths() const { return lengths_; }
  index_t q_len(index_t b) const { return lengths_.q[static_cast<std::size_t>(b)]; }
  index_t kv_len(index_t b) const { return lengths_.kv[static_cast<std::size_t>(b)]; }
  index_t num_q_blocks(index_t b) const { return ceil_div(q_len(b), block_.q); }
  index_t num_kv_blocks(index_t b) const { return ceil_div(kv_len(b), block_.kv); }

  // The tile (in sequence-local coordinates) of q-block qb and kv-block kb.
  Tile tile(index_t b, index_t qb, index_t kb) const {
    return {qb * block_.q, std::min((qb + 1) * block_.q, q_len(b)), kb * block_.kv,
            std::min((kb + 1) * block_.kv, kv_len(b))};
  }

  std::span<const BlockRange> full_ranges(index_t b, index_t h, index_t qb) const {
    const std::size_t r = row(b, h, qb);
    return std::span(full_ranges_).subspan(full_offsets_[r], full_offsets_[r + 1] - full_offsets_[r]);
  }
  std::span<const std::int32_t> partial_blocks(index_t b, index_t h, index_t qb) const {
    const std::size_t r = row(b, h, qb);
    return std::span(partial_blocks_).subspan(partial_offsets_[r], partial_offsets_[r + 1] - partial_offsets_[r]);
  }
  // Parallel to partial_blocks: the distinct tile each partial block uses.
  // Empty when tile bits were not stored.
  std::span<const std::int32_t> partial_tile_ids(index_t b, index_t h, index_t qb) const {
    if (partial_tile_ids_.empty()) return {};
    const std::size_t r = row(b, h, qb);
    return std::span(partial_tile_ids_).subspan(partial_offsets_[r], partial_offsets_[r + 1] - partial_offsets_[r]);
  }

  bool has_tile_bits() const { return !partial_tile_ids_.empty() || num_partial_tiles() == 0; }
  index_t words_per_row() const { return ceil_div(block_.kv, 64); }
  index_t num_distinct_partial_tiles() const {
    return static_cast<index_t>(tile_bits_.size()) / std::max<index_t>(1, block_.q * words_per_row());
  }
  // block_q rows of words_per_row() words each; rows and columns past the end
  // of a short edge tile are zero.
  std::span<const std::uint64_t> tile_bits(std::int32_t tile_id) const {
    const auto words = static_cast<std::size_t>(block_.q * words_per_row());
    return std::span(tile_bits_).subspan(static_cast<std::size_t>(tile_id) * words, words);
  }

  index_t num_full_tiles() const { return full_tiles_; }
  index_t num_partial_tiles() const { return static_cast<index_t>(partial_blocks_.size()); }
  // Number of tiles of the whole grid (every batch entry, every stored head).
  index_t num_tiles() const {
    index_t n = 0;
    for (index_t b = 0; b < batch(); ++b) n += num_q_blocks(b) * num_kv_blocks(b);
    return n * heads_;
  }

  // Low-level construction, used by the builders.
  struct Builder;

 private:
  static index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }
  std::size_t row(index_t b, index_t h, index_t qb) const {
    const index_t head = heads_ == 1 ? 0 : h;
    return static_cast<std::size_t>((q_block_base_[static_cast<std::size_t>(b)] * heads_) + head * num_q_blocks(b) +
                                    qb);
  }

  RaggedLengths lengths_;
  index_t heads_ = 1;
  BlockShape block_;
  std::vector<index_t> q_block_base_;  // per batch entry: q-blocks of all earlier entries
  std::vector<std::size_t> full_offsets_{0};
  std::vector<BlockRange> full_ranges_;
  std::vector<std::size_t> partial_offsets_{0};
  std::vector<std::int32_t> partial_blocks_;
  std::vector<std::int32_t> partial_tile_ids_;
  std::vector<std::uint64_t> tile_bits_;
  index_t full_tiles_ = 0;
};

// Appends rows in (batch, head, q-block) order.
struct BlockMask::Builder {
  BlockMask m;
  std::unordered_map<std::size_t, std::vector<std::int32_t>> tiles_by_hash;
  std::vector<std::uint64_t> scratch;

  Builder(RaggedLengths lengths, index_t heads, BlockShape block) {
    detail::require(block.q > 0 && block.kv > 0, "BlockMask: block sizes must be positive, got block_q=", block.q,
                    ", block_kv=", block.kv);
    detail::require(heads > 0, "BlockMask: heads must be positive, got ", heads);
    detail::require(lengths.q.size() == lengths.kv.size(), "BlockMask: ", lengths.q.size(), " q lengths but ",
                    lengths.kv.size(), " kv lengths");
    m.lengths_ = std::move(lengths);
    m.heads_ = heads;
    m.block_ = block;
    index_t base = 0;
    for (index_t b = 0; b < m.batch(); ++b) {
      detail::require(m.q_len(b) >= 0 && m.kv_len(b) >= 0, "BlockMask: negative length for batch entry ", b);
      m.q_block_base_.push_back(base);
      base += m.num_q_blocks(b);
    }
  }

  void add_full(std::int32_t kb) {
    ++m.full_tiles_;
    if (m.full_ranges_.size() > m.full_offsets_.back() && m.full_ranges_.back().end == kb) {
      ++m.full_ranges_.back().end;
    } else {
      m.full_ranges_.push_back({kb, kb + 1});
    }
  }

  // `bits` (block_q * words_per_row words) may be empty when bits are not stored.
  void add_partial(std::int32_t kb, std::span<const std::uint64_t> bits) {
    m.partial_blocks_.push_back(kb);
    if (bits.empty()) return;
    std::size_t h = 1469598103934665603ull;
    for (std::uint64_t w : bits) h = (h ^ w) * 1099511628211ull;
    auto& candidates = tiles_by_hash[h];
    for (std::int32_t id : candidates) {
      auto stored = m.tile_bits(id);
      if (std::equal(stored.begin(), stored.end(), bits.begin(), bits.end())) {
        m.partial_tile_ids_.push_back(id);
        return;
      }
    }
    const auto id = static_cast<std::int32_t>(m.num_distinct_partial_tiles());
    m.tile_bits_.insert(m.tile_bits_.end(), bits.begin(), bits.end());
    candidates.push_back(id);
    m.partial_tile_ids_.push_back(id);
  }

  void end_row() {
    m.full_offsets_.push_back(m.full_ranges_.size());
    m.partial_offsets_.push_back(m.partial_blocks_.size());
  }

  BlockMask finish() { return std::move(m); }
};

namespace detail {

// Bit pattern of one tile from the element predicate.
template <MaskDescription M>
void fill_tile_bits(const M& mask, const MaskContext& ctx, const Tile& tile, index_t words_per_row,
                    std::vector<std::uint64_t>& bits, index_t block_q) {
  bits.assign(static_cast<std::size_t>(block_q * words_per_row), 0);
  for (index_t q = tile.q_begin; q < tile.q_end; ++q) {
    std::uint64_t* row = bits.data() + (q - tile.q_begin) * words_per_row;
    for (index_t kv = tile.kv_begin; kv < tile.kv_end; ++kv) {
      if (mask.allowed(ctx, q, kv)) {
        const index_t c = kv - tile.kv_begin;
        row[c / 64] |= std::uint64_t{1} << (c % 64);
      }
    }
  }
}

}  // namespace detail

// Builds the BlockMask of any description by classifying every tile
// (O(#tiles) classify calls: O(1) each for structural masks) and, for partial
// tiles, evaluating the predicate once to store deduplicated tile bits.
template <MaskDescription M>
BlockMask build_block_mask(const M& mask, RaggedLengths lengths, index_t heads, BlockShape block = {},
                           BlockMaskOptions options = {}) {
  const index_t stored_heads = is_head_invariant<M>() ? 1 : heads;
  BlockMask::Builder builder(std::move(lengths), stored_heads, block);
  const BlockMask& m = builder.m;
  std::vector<std::uint64_t> bits;
  for (index_t b = 0; b < m.batch(); ++b) {
    for (index_t h = 0; h < stored_heads; ++h) {
      const MaskContext ctx{b, h, m.q_len(b), m.kv_len(b)};
      for (index_t qb = 0; qb < m.num_q_blocks(b); ++qb) {
        for (index_t kb = 0; kb < m.num_kv_blocks(b); ++kb) {
          const Tile tile = m.tile(b, qb, kb);
          switch (mask.classify(ctx, tile)) {
            case TileClass::empty:
              break;
            case TileClass::full:
              builder.add_full(static_cast<std::int32_t>(kb));
              break;
            case TileClass::partial:
              if (options.store_tile_bits) {
                detail::fill_tile_bits(mask, ctx, tile, m.words_per_row(), bits, block.q);
                builder.add_partial(static_cast<std::int32_t>(kb), bits);
              } else {
                builder.add_partial(static_cast<std::int32_t>(kb), {});
              }
              break;
          }
        }
        builder.end_row();
      }
    }
  }
  return builder.finish();
}

}  // namespace seqattn
