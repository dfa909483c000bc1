// The BlockMask as the accelerator backends read it: flat arrays that the
// Cuda backend uploads once into a plan and that the Tpu backend
// (backends/tpu.hpp) reshapes into its Pallas kernel's scalar-prefetch
// metadata. Host-only code with no CUDA headers, so it is tested on any machine.
//
//   row_offsets [rows + 1]   entries of row r are entries[row_offsets[r] .. row_offsets[r + 1])
//   entries     [n]          (kv_block, tile): tile -1 = full (no mask work), else the
//                            index of the distinct partial tile whose bits apply
//   tile_bits   [tiles * block_q * words_per_row]   Splash-style deduplicated tile bits
//   row_base    [batch]      row of (sequence b, head 0, q-block 0)
//
// Rows follow the BlockMask's (batch, head, q-block) order; a head-invariant
// mask stores one head. Within a row the entries are in increasing kv-block
// order, full and partial interleaved, so a kernel (or one KV split of it)
// walks a contiguous slice. Empty tiles appear nowhere: they cost nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::backends {

struct KvTileEntry {
  std::int32_t kv_block = 0;
  std::int32_t tile = -1;  // -1: full tile
  friend bool operator==(const KvTileEntry&, const KvTileEntry&) = default;
};
static_assert(sizeof(KvTileEntry) == 8, "entries are read as int2 on the device");

struct DeviceMaskLayout {
  RaggedLengths lengths;  // the sequences the mask was built for
  BlockShape block;
  index_t words_per_row = 1;
  index_t mask_heads = 1;
  std::vector<std::int32_t> row_offsets;
  std::vector<KvTileEntry> entries;
  std::vector<std::uint64_t> tile_bits;
  std::vector<std::int64_t> row_base;

  index_t rows() const { return static_cast<index_t>(row_offsets.size()) - 1; }
  index_t num_tiles() const { return static_cast<index_t>(tile_bits.size()) / (block.q * words_per_row); }
  std::size_t bytes() const {
    return row_offsets.size() * sizeof(std::int32_t) + entries.size() * sizeof(KvTileEntry) +
           tile_bits.size() * sizeof(std::uint64_t) + row_base.size() * sizeof(std::int64_t);
  }
};

// Flattens `bm`. Its partial tiles must carry bits (PlanOptions::store_tile_bits,
// the default): a device kernel cannot call the description's predicate.
// `who` (the backend) starts every error message.
inline DeviceMaskLayout build_device_mask_layout(const BlockMask& bm, const char* who = "build_device_mask_layout") {
  seqattn::detail::require(bm.has_tile_bits(), who, ": the BlockMask has partial tiles without stored bits (",
                           bm.num_partial_tiles(),
                           " partial tiles); plan with PlanOptions::store_tile_bits = true or build the BlockMask with "
                           "BlockMaskOptions{.store_tile_bits = true}");
  DeviceMaskLayout out;
  out.lengths = bm.lengths();
  out.block = bm.block_shape();
  out.words_per_row = bm.words_per_row();
  out.mask_heads = bm.heads();
  const index_t tiles = bm.num_distinct_partial_tiles();
  out.tile_bits.reserve(static_cast<std::size_t>(tiles * out.block.q * out.words_per_row));
  for (index_t t = 0; t < tiles; ++t) {
    const auto bits = bm.tile_bits(static_cast<std::int32_t>(t));
    out.tile_bits.insert(out.tile_bits.end(), bits.begin(), bits.end());
  }
  out.row_offsets.push_back(0);
  out.entries.reserve(static_cast<std::size_t>(bm.num_full_tiles() + bm.num_partial_tiles()));
  for (index_t b = 0; b < bm.batch(); ++b) {
    out.row_base.push_back(static_cast<std::int64_t>(out.rows()));
    for (index_t h = 0; h < bm.heads(); ++h) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        const auto ranges = bm.full_ranges(b, h, qb);
        const auto partial = bm.partial_blocks(b, h, qb);
        const auto ids = bm.partial_tile_ids(b, h, qb);
        std::size_t r = 0, p = 0;
        std::int32_t next_full = ranges.empty() ? 0 : ranges[0].begin;
        // Merge the (sorted, disjoint) full ranges with the sorted partial blocks.
        while (r < ranges.size() || p < partial.size()) {
          const bool take_full = r < ranges.size() && (p >= partial.size() || next_full < partial[p]);
          if (take_full) {
            out.entries.push_back({next_full, -1});
            if (++next_full >= ranges[r].end && ++r < ranges.size()) next_full = ranges[r].begin;
          } else {
            out.entries.push_back({partial[p], ids.empty() ? -1 : ids[p]});
            ++p;
          }
        }
        seqattn::detail::require(out.entries.size() <= static_cast<std::size_t>(INT32_MAX), who,
                                 ": the BlockMask has more than 2^31 non-empty tiles");
        out.row_offsets.push_back(static_cast<std::int32_t>(out.entries.size()));
      }
    }
  }
  return out;
}

}  // namespace seqattn::backends
