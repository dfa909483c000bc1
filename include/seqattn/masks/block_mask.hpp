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
//
// Like PyTorch flex's BlockMask, a BlockMask built from a description carries
// that description's element predicate (a copy of the description, which is a
// small value or a view: whatever data the description refers to must outlive
// the BlockMask). Kernels use it for partial tiles without stored bits, and the
// reference backend answers every element from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "seqattn/core/bits.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

struct BlockShape {
  index_t q = 128;
  index_t kv = 128;
};

namespace detail {
// Block sizes in [1, limits::kMaxBlockSize].
inline void require_block_shape(const BlockShape& block) {
  if (block.q <= 0 || block.kv <= 0) {
    throw_invalid("BlockMask: block sizes must be positive, got block_q=", block.q, ", block_kv=", block.kv);
  }
  if (block.q > limits::kMaxBlockSize || block.kv > limits::kMaxBlockSize) {
    throw_invalid("BlockMask: block sizes must be at most ", limits::kMaxBlockSize,
                  " (limits::kMaxBlockSize), got block_q=", block.q, ", block_kv=", block.kv);
  }
}
}  // namespace detail

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
  // The head count a head-dependent description was built (and checked) for;
  // 0 when the tiles hold for any head count (a head-invariant description,
  // or a BlockMask assembled by hand). plan_attention refuses to spread a
  // one-head BlockMask over more heads unless this is 0.
  index_t description_heads() const { return description_heads_; }
  BlockShape block_shape() const { return block_; }
  const RaggedLengths& lengths() const { return lengths_; }
  index_t q_len(index_t b) const { return lengths_.q[checked_batch(b)]; }
  index_t kv_len(index_t b) const { return lengths_.kv[checked_batch(b)]; }
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
    detail::require(tile_id >= 0 && tile_id < num_distinct_partial_tiles(), "BlockMask::tile_bits: tile id ", tile_id,
                    " outside [0, ", num_distinct_partial_tiles(), ")");
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

  // Per-row counts, and the full kv-blocks expanded (Flex / FA4
  // full_kv_num_blocks / full_kv_indices form).
  index_t num_full_blocks(index_t b, index_t h, index_t qb) const {
    index_t n = 0;
    for (const BlockRange& r : full_ranges(b, h, qb)) n += r.end - r.begin;
    return n;
  }
  index_t num_partial_blocks(index_t b, index_t h, index_t qb) const {
    return static_cast<index_t>(partial_blocks(b, h, qb).size());
  }
  std::vector<std::int32_t> full_blocks(index_t b, index_t h, index_t qb) const {
    std::vector<std::int32_t> out;
    for (const BlockRange& r : full_ranges(b, h, qb)) {
      for (std::int32_t kb = r.begin; kb < r.end; ++kb) out.push_back(kb);
    }
    return out;
  }

  // The same tiles seen from the key side, for a backward pass (dK/dV):
  // the result is the BlockMask of the transposed mask, whose "q-blocks" are
  // this mask's kv-blocks (lengths and block shape swapped) and whose tile
  // bits are the transposed tiles, still deduplicated. Costs O(full tiles +
  // partial tiles + rows) time and O(ranges + partial tiles) memory.
  BlockMask transposed() const;

  // The element predicate of the description this BlockMask was built from;
  // empty for a BlockMask assembled by hand.
  using Predicate = std::function<bool(const MaskContext&, index_t, index_t)>;
  bool has_predicate() const { return static_cast<bool>(predicate_); }
  const Predicate& predicate() const { return predicate_; }
  void set_predicate(Predicate predicate) { predicate_ = std::move(predicate); }

  // May query q of sequence ctx.batch, head ctx.head attend to key kv
  // (sequence-local indices)? From the carried predicate when there is one,
  // else from the tiles: full -> yes, empty -> no, partial -> the stored bits.
  // Throws for a partial tile with neither bits nor a predicate.
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const;

  // Bytes of metadata held (O(rows + full ranges + partial tiles + distinct
  // tile bits), never O(q_len x kv_len)).
  std::size_t memory_bytes() const {
    return q_block_base_.size() * sizeof(index_t) + full_offsets_.size() * sizeof(std::size_t) +
           full_ranges_.size() * sizeof(BlockRange) + partial_offsets_.size() * sizeof(std::size_t) +
           (partial_blocks_.size() + partial_tile_ids_.size()) * sizeof(std::int32_t) +
           tile_bits_.size() * sizeof(std::uint64_t) + (lengths_.q.size() + lengths_.kv.size()) * sizeof(index_t);
  }

  // Low-level construction, used by the builders.
  struct Builder;

 private:
  static index_t ceil_div(index_t a, index_t b) { return detail::ceil_div_nonneg(a, b); }
  std::size_t checked_batch(index_t b) const {
    if (b < 0 || b >= batch()) detail::throw_invalid("BlockMask: sequence ", b, " outside [0, ", batch(), ")");
    return static_cast<std::size_t>(b);
  }
  // Index of row (b, h, qb); throws when any of them is out of range (one
  // check per row of tiles, never per element).
  std::size_t row(index_t b, index_t h, index_t qb) const {
    if (b < 0 || b >= batch() || h < 0 || (heads_ != 1 && h >= heads_) || qb < 0 || qb >= num_q_blocks(b)) {
      detail::throw_invalid("BlockMask: (batch ", b, ", head ", h, ", q-block ", qb, ") is outside the mask's ",
                            batch(), " sequences x ", heads_, " heads",
                            b >= 0 && b < batch() ? detail::concat(" x ", num_q_blocks(b), " q-blocks") : "");
    }
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
  index_t description_heads_ = 0;
  Predicate predicate_;
};

inline bool BlockMask::allowed(const MaskContext& ctx, index_t q, index_t kv) const {
  if (predicate_) return predicate_(ctx, q, kv);
  const index_t qb = q / block_.q, kb = kv / block_.kv;
  for (const BlockRange r : full_ranges(ctx.batch, ctx.head, qb)) {
    if (kb >= r.begin && kb < r.end) return true;
  }
  const auto partial = partial_blocks(ctx.batch, ctx.head, qb);
  const auto it = std::find(partial.begin(), partial.end(), static_cast<std::int32_t>(kb));
  if (it == partial.end()) return false;
  const auto ids = partial_tile_ids(ctx.batch, ctx.head, qb);
  detail::require(!ids.empty(), "BlockMask::allowed: tile (q-block ", qb, ", kv-block ", kb, ") of sequence ",
                  ctx.batch, " is partial, and the BlockMask has neither tile bits nor an element predicate");
  const auto bits = tile_bits(ids[static_cast<std::size_t>(it - partial.begin())]);
  const index_t row = q - qb * block_.q, col = kv - kb * block_.kv;
  return detail::test_bit(bits.data() + row * words_per_row(), col);
}

// Appends rows in (batch, head, q-block) order: per row, full and partial
// kv-blocks in increasing order, then end_row(). finish() refuses rows that do
// not fit the lengths (see check_rows), so a BlockMask assembled by hand is as
// safe to hand to a kernel or an export as a built one.
struct BlockMask::Builder {
  BlockMask m;
  std::unordered_map<std::size_t, std::vector<std::int32_t>> tiles_by_hash;
  std::vector<std::uint64_t> scratch;

  Builder(RaggedLengths lengths, index_t heads, BlockShape block) {
    detail::require_block_shape(block);
    detail::require(heads > 0, "BlockMask: heads must be positive, got ", heads);
    detail::require(heads <= limits::kMaxHeads, "BlockMask: heads must be at most ", limits::kMaxHeads,
                    " (limits::kMaxHeads), got ", heads);
    detail::require(lengths.q.size() == lengths.kv.size(), "BlockMask: ", lengths.q.size(), " q lengths but ",
                    lengths.kv.size(), " kv lengths");
    m.lengths_ = std::move(lengths);
    m.heads_ = heads;
    m.block_ = block;
    index_t base = 0;
    for (index_t b = 0; b < m.batch(); ++b) {
      detail::require(m.q_len(b) >= 0 && m.kv_len(b) >= 0, "BlockMask: negative length for batch entry ", b);
      // Block ids are int32 (BlockRange, partial_blocks).
      if (m.num_q_blocks(b) > limits::kMaxBlocksPerAxis || m.num_kv_blocks(b) > limits::kMaxBlocksPerAxis) {
        detail::throw_invalid("BlockMask: sequence ", b, " of lengths (q ", m.q_len(b), ", kv ", m.kv_len(b),
                              ") has more than ", limits::kMaxBlocksPerAxis, " (limits::kMaxBlocksPerAxis) blocks of (",
                              block.q, ", ", block.kv, ") along an axis");
      }
      m.q_block_base_.push_back(base);
      // Rows of the whole mask (all sequences and heads) index vectors.
      base = detail::checked_add(base, m.num_q_blocks(b), "BlockMask: q-blocks of the batch");
    }
    detail::checked_size("BlockMask: rows (q-blocks x heads)", limits::kMaxTensorElements, base, heads);
  }

  void add_full(std::int32_t kb) {
    require_block_id(kb, "add_full");
    ++m.full_tiles_;
    if (m.full_ranges_.size() > m.full_offsets_.back() && m.full_ranges_.back().end == kb) {
      ++m.full_ranges_.back().end;
    } else {
      m.full_ranges_.push_back({kb, kb + 1});
    }
  }

  // `bits` (block_q * words_per_row words) may be empty when bits are not stored.
  void add_partial(std::int32_t kb, std::span<const std::uint64_t> bits) {
    require_block_id(kb, "add_partial");
    const auto tile_words = static_cast<std::size_t>(m.block_.q * m.words_per_row());
    detail::require(bits.empty() || bits.size() == tile_words,
                    "BlockMask::Builder::add_partial: the tile bits of kv-block ", kb, " hold ", bits.size(),
                    " words, but a (", m.block_.q, ", ", m.block_.kv, ") tile has ", tile_words,
                    " words (block_q rows of ceil(block_kv / 64) words)");
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

  // Full kv-blocks [begin, end) in one step (no-op when empty).
  void add_full_range(std::int32_t begin, std::int32_t end) {
    if (end <= begin) return;
    require_block_id(begin, "add_full_range");
    m.full_tiles_ += end - begin;
    if (m.full_ranges_.size() > m.full_offsets_.back() && m.full_ranges_.back().end == begin) {
      m.full_ranges_.back().end = end;
    } else {
      m.full_ranges_.push_back({begin, end});
    }
  }

  void end_row() {
    m.full_offsets_.push_back(m.full_ranges_.size());
    m.partial_offsets_.push_back(m.partial_blocks_.size());
  }

  // See BlockMask::description_heads().
  void description_heads(index_t heads) { m.description_heads_ = heads; }

  // Checks the rows against the lengths before handing the mask out: kernels,
  // transposed() and the Splash / flex exports index each sequence's tile
  // grid with these block ids unchecked. O(rows + ranges + partial tiles),
  // plus a row's last word of each partial tile (every word on a short edge).
  BlockMask finish() {
    check_rows();
    return std::move(m);
  }

 private:
  // Only what keeps the builder's own int32 arithmetic defined; finish()
  // checks each id against its sequence's grid.
  static void require_block_id(std::int32_t kb, const char* what) {
    detail::require(kb >= 0 && kb < limits::kMaxBlocksPerAxis, "BlockMask::Builder::", what, ": kv-block ", kb,
                    " is outside [0, ", limits::kMaxBlocksPerAxis, ") (limits::kMaxBlocksPerAxis)");
  }

  void check_rows() const {
    using detail::throw_invalid;
    const char* const what = "BlockMask::Builder::finish: ";
    index_t rows = 0;
    for (index_t b = 0; b < m.batch(); ++b) rows += m.num_q_blocks(b) * m.heads_;
    const auto ended = static_cast<index_t>(m.full_offsets_.size()) - 1;
    if (ended != rows) {
      throw_invalid(what, "the mask has ", rows, " rows ((sequence, head, q-block) triples of ", m.batch(),
                    " sequences and ", m.heads_, " heads), but end_row() ended ", ended);
    }
    if (m.full_offsets_.back() != m.full_ranges_.size() || m.partial_offsets_.back() != m.partial_blocks_.size()) {
      throw_invalid(what, "blocks were added after the last end_row(), so they belong to no row");
    }
    const bool bits = !m.partial_tile_ids_.empty();
    if (bits && m.partial_tile_ids_.size() != m.partial_blocks_.size()) {
      throw_invalid(what, m.partial_tile_ids_.size(), " of the ", m.partial_blocks_.size(),
                    " partial blocks have tile bits; give tile bits for every partial block or for none");
    }
    for (index_t b = 0; b < m.batch(); ++b) {
      const index_t nq = m.num_q_blocks(b), nkv = m.num_kv_blocks(b);
      for (index_t h = 0; h < m.heads_; ++h) {
        for (index_t qb = 0; qb < nq; ++qb) {
          // Messages are built only on failure: this loop runs for every mask built.
          const auto row = [&] { return detail::concat("row (sequence ", b, ", head ", h, ", q-block ", qb, ")"); };
          const auto grid = [&] {
            return detail::concat("[0, ", nkv, "), the kv-blocks of sequence ", b, " (kv_len ", m.kv_len(b),
                                  ", block_kv ", m.block_.kv, ")");
          };
          const auto full = m.full_ranges(b, h, qb);
          for (std::size_t i = 0; i < full.size(); ++i) {
            const BlockRange r = full[i];
            if (r.begin >= r.end || r.end > nkv) {
              throw_invalid(what, "full kv-blocks [", r.begin, ", ", r.end, ") of ", row(),
                            " are not a non-empty range inside ", grid());
            }
            if (i > 0 && full[i - 1].end > r.begin) {
              throw_invalid(what, "the full kv-block ranges of ", row(), " are not increasing and disjoint: [", r.begin,
                            ", ", r.end, ") follows [", full[i - 1].begin, ", ", full[i - 1].end, ")");
            }
          }
          const auto partial = m.partial_blocks(b, h, qb);
          const auto ids = m.partial_tile_ids(b, h, qb);
          std::size_t next_full = 0;  // the first full range that does not end at or before partial[i]
          for (std::size_t i = 0; i < partial.size(); ++i) {
            const std::int32_t kb = partial[i];
            if (kb >= nkv) throw_invalid(what, "partial kv-block ", kb, " of ", row(), " is outside ", grid());
            if (i > 0 && partial[i - 1] >= kb) {
              throw_invalid(what, "the partial kv-blocks of ", row(), " are not increasing: ", kb, " follows ",
                            partial[i - 1]);
            }
            while (next_full < full.size() && full[next_full].end <= kb) ++next_full;
            if (next_full < full.size() && full[next_full].begin <= kb) {
              throw_invalid(what, "kv-block ", kb, " of ", row(), " is both full and partial");
            }
            if (bits) check_edge_bits(m.tile(b, qb, kb), m.tile_bits(ids[i]), kb, row);
          }
        }
      }
    }
  }

  // A tile's bits past its rows and columns must be clear: past a short edge
  // tile they would claim queries and keys the sequence does not have, and
  // past block_kv in a row's last word they make a whole all-set tile count
  // as partial where allowed() calls it full (the exports popcount the words;
  // the builders store them clear).
  template <class Row>
  void check_edge_bits(const Tile& t, std::span<const std::uint64_t> bits, std::int32_t kb, const Row& row) const {
    if (t.rows() == m.block_.q && t.cols() == m.block_.kv && m.block_.kv % 64 == 0) return;
    const index_t words = m.words_per_row();
    for (index_t r = 0; r < m.block_.q; ++r) {
      // Words wholly inside the tile's columns cannot hold a stray bit.
      for (index_t w = r < t.rows() ? t.cols() / 64 : 0; w < words; ++w) {
        const index_t inside = r < t.rows() ? std::clamp<index_t>(t.cols() - w * 64, 0, 64) : 0;
        const std::uint64_t kept = inside == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << inside) - 1;
        if ((bits[static_cast<std::size_t>(r * words + w)] & ~kept) != 0) {
          detail::throw_invalid(
              "BlockMask::Builder::finish: the tile bits of partial kv-block ", kb, " of ", row(),
              " set bits outside the tile, which holds ", t.rows(), " x ", t.cols(), " of the (", m.block_.q, ", ",
              m.block_.kv,
              ") elements; bits past its last row or column (or past block_kv in a row's last word) must be clear");
        }
      }
    }
  }
};

inline BlockMask BlockMask::transposed() const {
  Builder t(RaggedLengths{lengths_.kv, lengths_.q}, heads_, BlockShape{block_.kv, block_.q});
  const bool bits = !partial_tile_ids_.empty();
  if (bits) {
    const index_t wpr = words_per_row();
    const index_t twpr = t.m.words_per_row();
    const index_t distinct = num_distinct_partial_tiles();
    t.m.tile_bits_.assign(static_cast<std::size_t>(distinct * block_.kv * twpr), 0);
    for (index_t id = 0; id < distinct; ++id) {
      const std::uint64_t* src = tile_bits_.data() + id * block_.q * wpr;
      std::uint64_t* dst = t.m.tile_bits_.data() + id * block_.kv * twpr;
      for (index_t r = 0; r < block_.q; ++r) {
        for (index_t c = 0; c < block_.kv; ++c) {
          if (detail::test_bit(src + r * wpr, c)) dst[c * twpr + r / 64] |= std::uint64_t{1} << (r % 64);
        }
      }
    }
  }
  std::vector<std::vector<BlockRange>> full;
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> partial;
  for (index_t b = 0; b < batch(); ++b) {
    for (index_t h = 0; h < heads_; ++h) {
      const auto nkv = static_cast<std::size_t>(num_kv_blocks(b));
      full.assign(nkv, {});
      partial.assign(nkv, {});
      for (index_t qb = 0; qb < num_q_blocks(b); ++qb) {
        const auto q32 = static_cast<std::int32_t>(qb);
        for (const BlockRange& r : full_ranges(b, h, qb)) {
          for (std::int32_t kb = r.begin; kb < r.end; ++kb) {
            auto& v = full[static_cast<std::size_t>(kb)];
            if (!v.empty() && v.back().end == q32) {
              ++v.back().end;
            } else {
              v.push_back({q32, q32 + 1});
            }
          }
        }
        const auto blocks = partial_blocks(b, h, qb);
        const auto ids = partial_tile_ids(b, h, qb);
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          partial[static_cast<std::size_t>(blocks[i])].push_back({q32, bits ? ids[i] : -1});
        }
      }
      for (std::size_t kb = 0; kb < nkv; ++kb) {
        for (const BlockRange& r : full[kb]) t.add_full_range(r.begin, r.end);
        for (auto [qb, id] : partial[kb]) {
          t.m.partial_blocks_.push_back(qb);
          if (bits) t.m.partial_tile_ids_.push_back(id);
        }
        t.end_row();
      }
    }
  }
  t.m.description_heads_ = description_heads_;
  if (predicate_) {
    t.m.predicate_ = [p = predicate_](const MaskContext& ctx, index_t q, index_t kv) {
      return p(MaskContext{ctx.batch, ctx.head, ctx.kv_len, ctx.q_len}, kv, q);
    };
  }
  return t.finish();
}

namespace detail {

// Sets bits [begin, end) of a little-endian word array.
inline void set_bit_range(std::uint64_t* words, index_t begin, index_t end) {
  while (begin < end) {
    const index_t w = begin / 64;
    const index_t lo = begin % 64;
    const index_t hi = std::min<index_t>(64, lo + (end - begin));
    const std::uint64_t ones = hi - lo == 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (hi - lo)) - 1) << lo;
    words[w] |= ones;
    begin += hi - lo;
  }
}

// ORs row q's allowed keys in [kv_begin, kv_end) into `words` (bit c is key
// kv_begin + c): one interval for interval masks, the description's own
// row_bits when it has one, the element predicate otherwise.
template <MaskDescription M>
void fill_row_bits(const M& mask, const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                   std::uint64_t* words) {
  if constexpr (HasRowInterval<M>) {
    const KvInterval iv = mask.row_interval(ctx, q);
    const index_t b = std::max(iv.begin, kv_begin);
    const index_t e = std::min(iv.end, kv_end);
    if (b < e) set_bit_range(words, b - kv_begin, e - kv_begin);
  } else if constexpr (HasRowBits<M>) {
    mask.row_bits(ctx, q, kv_begin, kv_end, words);
  } else {
    for (index_t kv = kv_begin; kv < kv_end; ++kv) {
      if (mask.allowed(ctx, q, kv)) {
        const index_t c = kv - kv_begin;
        words[c / 64] |= std::uint64_t{1} << (c % 64);
      }
    }
  }
}

// Bit pattern of one tile from the element predicate.
template <MaskDescription M>
void fill_tile_bits(const M& mask, const MaskContext& ctx, const Tile& tile, index_t words_per_row,
                    std::vector<std::uint64_t>& bits, index_t block_q) {
  bits.assign(static_cast<std::size_t>(block_q * words_per_row), 0);
  for (index_t q = tile.q_begin; q < tile.q_end; ++q) {
    fill_row_bits(mask, ctx, q, tile.kv_begin, tile.kv_end, bits.data() + (q - tile.q_begin) * words_per_row);
  }
}

// Hides a description's optional hooks, leaving only allowed and classify:
// the reference the hook-using builders are tested against.
template <MaskDescription M>
struct PlainMask {
  static constexpr bool head_invariant = is_head_invariant<M>();
  M mask;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const { return mask.allowed(ctx, q, kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return mask.classify(ctx, t); }
  void check(const RaggedLengths& lengths, index_t heads) const { detail::check_mask(mask, lengths, heads); }
};

// Range of kv-blocks [begin, end) whose tiles lie inside keys [kv_begin, kv_end).
inline std::pair<index_t, index_t> blocks_inside(index_t kv_begin, index_t kv_end, index_t block, index_t kv_len) {
  const index_t first = (kv_begin + block - 1) / block;
  index_t last = kv_end / block;  // blocks before `last` end at or before kv_end
  if (kv_end >= kv_len) last = (kv_len + block - 1) / block;
  return {first, std::max(first, last)};
}

}  // namespace detail

// Builds the BlockMask of any description. Per (batch, head, q-block) row:
// when the description offers kv_span, kv-blocks outside its `any` range are
// never visited and those inside its `all` range are listed as one full range
// without a look, so structural masks cost O(q-blocks + partial tiles);
// otherwise every tile is classified (O(1) each for structural masks, a scan
// for data-driven ones). Partial tiles get deduplicated tile bits, written a
// word at a time for interval masks.
template <MaskDescription M>
BlockMask build_block_mask(const M& mask, RaggedLengths lengths, index_t heads, BlockShape block = {},
                           BlockMaskOptions options = {}) {
  detail::require_block_shape(block);
  detail::check_mask(mask, lengths, heads);
  // Tile bits are block_q rows of words_per_row words per distinct partial tile.
  detail::require(!options.store_tile_bits || block.q * block.kv <= limits::kMaxTileBits,
                  "build_block_mask: tiles of (", block.q, ", ", block.kv, ") exceed the limit of ",
                  limits::kMaxTileBits,
                  " bits per stored tile (limits::kMaxTileBits); use smaller blocks or "
                  "store_tile_bits = false");
  const index_t stored_heads = is_head_invariant<M>() ? 1 : heads;
  BlockMask::Builder builder(std::move(lengths), stored_heads, block);
  const BlockMask& m = builder.m;
  std::vector<std::uint64_t> bits;
  auto visit = [&](const MaskContext& ctx, index_t qb, index_t kb) {
    const Tile tile = m.tile(ctx.batch, qb, kb);
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
  };
  for (index_t b = 0; b < m.batch(); ++b) {
    for (index_t h = 0; h < stored_heads; ++h) {
      const MaskContext ctx{b, h, m.q_len(b), m.kv_len(b)};
      const index_t nkv = m.num_kv_blocks(b);
      for (index_t qb = 0; qb < m.num_q_blocks(b); ++qb) {
        if constexpr (HasKvSpan<M>) {
          const Tile row = m.tile(b, qb, 0);
          const KvSpan span = mask.kv_span(ctx, row.q_begin, row.q_end);
          index_t kb_begin = 0, kb_end = 0;
          if (span.any_begin < span.any_end) {
            kb_begin = std::clamp<index_t>(span.any_begin / block.kv, 0, nkv);
            kb_end = std::clamp<index_t>((span.any_end + block.kv - 1) / block.kv, kb_begin, nkv);
          }
          auto [full_begin, full_end] = detail::blocks_inside(span.all_begin, span.all_end, block.kv, ctx.kv_len);
          if (span.all_begin >= span.all_end) full_begin = full_end = kb_end;
          full_begin = std::clamp(full_begin, kb_begin, kb_end);
          full_end = std::clamp(full_end, full_begin, kb_end);
          for (index_t kb = kb_begin; kb < full_begin; ++kb) visit(ctx, qb, kb);
          builder.add_full_range(static_cast<std::int32_t>(full_begin), static_cast<std::int32_t>(full_end));
          for (index_t kb = full_end; kb < kb_end; ++kb) visit(ctx, qb, kb);
        } else {
          for (index_t kb = 0; kb < nkv; ++kb) visit(ctx, qb, kb);
        }
        builder.end_row();
      }
    }
  }
  builder.m.set_predicate([mask](const MaskContext& ctx, index_t q, index_t kv) { return mask.allowed(ctx, q, kv); });
  bool invariant = is_head_invariant<M>();
  if constexpr (requires { mask.invariant_over_heads(); }) invariant = invariant || mask.invariant_over_heads();
  builder.description_heads(invariant ? 0 : heads);
  return builder.finish();
}

}  // namespace seqattn
