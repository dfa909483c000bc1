// The TPU backend: the planning half of seqattn's Pallas kernel
// (python/seqattn/pallas/). The kernel runs from Python under JAX; what it
// needs from C++ is its scalar-prefetch metadata, the BlockLayout whose
// contract python/seqattn/pallas/layout.py writes down (field by field, with
// the guarantees every builder gives). Tpu::plan builds it from any mask:
//
//   mask ──build_block_mask──► BlockMask ──build_device_mask_layout──► DeviceMaskLayout ──► TpuBlockLists
//                                  └── transposed() ──────────────────► (key-major, dK/dV) ──► TpuBlockLists
//
// so the TPU kernel walks the same per-row lists the Cuda backend uploads
// (backends/device_mask.hpp), reshaped to the kernel's padded grid:
//   - rows are (batch, mask head, block) of the *padded* arrays, so a ragged
//     batch's short sequences get rows with no entries;
//   - a tile the BlockMask calls full but that is cut by a sequence's end (its
//     box reaches past the sequence's or the array's last token) becomes a
//     partial tile whose bits are 0 outside: on the TPU a full tile runs with
//     no mask at all, over the whole block_q x block_kv box;
//   - a stored tile whose bits are all 0 (a description classifying
//     conservatively) is dropped, one with every bit of the box set is full;
//   - tile bits become int8 [block_q, block_kv] arrays, deduplicated by content.
//
// Sequences (TpuSequences): BSHD arrays [B, q_len] of equal padded lengths,
// each sequence b holding its first q_lens[b] / kv_lens[b] tokens (all of them
// when no lengths are given); or THD, one packed stream of q_len tokens where
// sequence b holds tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) (keys
// likewise), tokens past the last sequence are padding, and the layout has one
// batch row. Either way the mask is asked about sequence b in its own local
// coordinates, with MaskContext{b, head, its q length, its kv length}, exactly
// as the CPU engine asks about sequence b of a ragged batch.
//
// Paged K/V: Tpu::page_table checks a vLLM-style block table (pages of
// block_kv tokens, one kv block per page) and returns the int32 [B, pages]
// table the kernel's index maps read; its layout is the BSHD one with
// kv_len = pages * block_kv and each sequence's kv_lens.
//
// Tpu is not an AttentionBackend (no forward: the TPU run is the Pallas kernel,
// and nothing here touches a device). It is a stateless policy type like
// backends::Splash, named like the others so the Python bridge and a future
// plan_attention seam can take it as a template argument. Every argument is
// checked before anything is allocated; errors name the argument and its shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "seqattn/backends/device_mask.hpp"
#include "seqattn/core/bits.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::backends {

// Which tokens of the kernel's arrays belong to which sequence (see above).
struct TpuSequences {
  index_t batch = 1;
  index_t q_len = 0;   // query tokens per batch row of the arrays (THD: of the packed stream)
  index_t kv_len = 0;  // key tokens per batch row
  // BSHD: tokens of each sequence (<= q_len / kv_len); empty: every row is full.
  std::vector<index_t> q_lens, kv_lens;
  // THD (batch 1): [sequences + 1] offsets into the packed streams.
  std::vector<index_t> cu_seqlens_q, cu_seqlens_kv;

  static TpuSequences padded(index_t batch, index_t q_len, index_t kv_len) {
    return {batch, q_len, kv_len, {}, {}, {}, {}};
  }
  static TpuSequences ragged(index_t q_len, index_t kv_len, std::vector<index_t> q_lens, std::vector<index_t> kv_lens) {
    const auto batch = static_cast<index_t>(q_lens.size());
    return {batch, q_len, kv_len, std::move(q_lens), std::move(kv_lens), {}, {}};
  }
  static TpuSequences packed(index_t q_len, index_t kv_len, std::vector<index_t> cu_seqlens_q,
                             std::vector<index_t> cu_seqlens_kv) {
    return {1, q_len, kv_len, {}, {}, std::move(cu_seqlens_q), std::move(cu_seqlens_kv)};
  }
  bool is_packed() const { return !cu_seqlens_q.empty() || !cu_seqlens_kv.empty(); }
};

// One direction of the layout: query-major (rows are q blocks, entries kv
// blocks, tiles [block_q, block_kv]) or key-major (rows are kv blocks, entries
// q blocks, tiles [block_kv, block_q]). Field meanings: layout.py.
struct TpuBlockLists {
  std::vector<std::int32_t> start;  // [rows]
  std::vector<std::int32_t> count;  // [rows]
  std::vector<std::int32_t> block;  // [entries]  (q_kv / kv_q)
  std::vector<std::int32_t> tile;   // [entries]  -1 full, t >= 0 partial
  std::vector<std::int32_t> fetch;  // [entries]
  std::vector<std::int8_t> tiles;   // [num_tiles, tile_rows, tile_cols], 1 = attend
  index_t num_tiles = 1;
  index_t width = 1;  // max(1, max count)
};

struct TpuLayout {
  index_t batch = 1;
  index_t mask_heads = 1;  // 1 for a head-invariant mask, else the query heads
  index_t q_len = 0;
  index_t kv_len = 0;
  BlockShape block;
  TpuBlockLists queries;  // forward and dQ
  TpuBlockLists keys;     // dK / dV

  index_t num_q_blocks() const { return seqattn::detail::ceil_div_nonneg(q_len, block.q); }
  index_t num_kv_blocks() const { return seqattn::detail::ceil_div_nonneg(kv_len, block.kv); }
};

struct TpuPageTable {
  index_t batch = 0;
  index_t pages_per_seq = 0;
  std::vector<std::int32_t> pages;  // [batch, pages_per_seq]
};

}  // namespace seqattn::backends

// In seqattn::detail, not backends::detail: a `detail` inside backends would
// hide seqattn::detail from every backend header included after this one.
namespace seqattn::detail::tpu {

inline constexpr const char* kWho = "Tpu::plan";

// A THD stream of packed sequences as one mask over the whole stream: query q
// of sequence b sees key kv of the same sequence when `inner` allows them in
// sequence b's local coordinates; nothing crosses sequences, and tokens past
// the last sequence see nothing. Like DocumentMask, but the inner mask is told
// which sequence it is asked about (ctx.batch = b), so a mask holding data per
// sequence (top-k indices, prefixes) reads sequence b's. The offsets are views:
// the mask lives only while a plan is built from the caller's TpuSequences.
struct PackedSequencesMask {
  AnyMask inner;
  std::span<const index_t> cu_q;  // [sequences + 1]
  std::span<const index_t> cu_kv;

  bool invariant_over_heads() const { return inner.invariant_over_heads(); }

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const index_t b = sequence_of_query(q);
    if (b < 0 || kv < kv_begin(b) || kv >= kv_end(b)) return false;
    return inner.allowed(local(ctx, b), q - q_begin(b), kv - kv_begin(b));
  }

  // From the sequences meeting the tile's rows: O(those sequences + log n).
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    bool any = false, all = true;
    index_t covered = 0;
    for (index_t b = sequence_of_query(t.q_begin); b >= 0 && b < sequences() && q_begin(b) < t.q_end; ++b) {
      const index_t r0 = std::max(q_begin(b), t.q_begin), r1 = std::min(q_end(b), t.q_end);
      if (r0 >= r1) continue;
      covered += r1 - r0;
      const index_t c0 = std::max(kv_begin(b), t.kv_begin), c1 = std::min(kv_end(b), t.kv_end);
      if (c0 >= c1) {
        all = false;
      } else {
        if (c0 != t.kv_begin || c1 != t.kv_end) all = false;
        const TileClass c =
            inner.classify(local(ctx, b), Tile{r0 - q_begin(b), r1 - q_begin(b), c0 - kv_begin(b), c1 - kv_begin(b)});
        any = any || c != TileClass::empty;
        all = all && c == TileClass::full;
      }
      if (any && !all) return TileClass::partial;
    }
    if (covered < t.rows()) all = false;
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }

  // Keys of the sequences the q block's rows belong to, narrowed by the inner
  // mask's span; a range of keys every row sees only when one sequence holds
  // the whole block (so the builder lists full tiles without classifying them).
  KvSpan kv_span(const MaskContext& ctx, index_t row_begin, index_t row_end) const {
    KvSpan s{ctx.kv_len, 0, 0, 0};
    index_t covered = 0, seen = 0;
    for (index_t b = sequence_of_query(row_begin); b >= 0 && b < sequences() && q_begin(b) < row_end; ++b) {
      const index_t r0 = std::max(q_begin(b), row_begin), r1 = std::min(q_end(b), row_end);
      if (r0 >= r1) continue;
      covered += r1 - r0;
      ++seen;
      if (kv_begin(b) >= kv_end(b)) continue;
      const KvSpan in = inner.kv_span(local(ctx, b), r0 - q_begin(b), r1 - q_begin(b));
      const auto to_stream = [&](index_t v) { return std::clamp(kv_begin(b) + v, kv_begin(b), kv_end(b)); };
      const index_t any_begin = to_stream(in.any_begin), any_end = to_stream(in.any_end);
      if (any_begin < any_end) {
        s.any_begin = std::min(s.any_begin, any_begin);
        s.any_end = std::max(s.any_end, any_end);
      }
      s.all_begin = to_stream(in.all_begin);
      s.all_end = std::max(s.all_begin, to_stream(in.all_end));
    }
    if (s.any_begin >= s.any_end) return {};
    if (seen != 1 || covered != row_end - row_begin) s.all_begin = s.all_end = 0;
    return s;
  }

  // Row q's keys in [begin, end) as the inner mask writes them (an interval at
  // a time where it can), shifted to the stream's columns.
  void row_bits(const MaskContext& ctx, index_t q, index_t begin, index_t end, std::uint64_t* words) const {
    const index_t b = sequence_of_query(q);
    if (b < 0) return;
    const index_t c0 = std::max(kv_begin(b), begin), c1 = std::min(kv_end(b), end);
    if (c0 >= c1) return;
    // Most rows fit a 1024-key stack buffer; longer tiles take the heap.
    std::uint64_t small[16] = {};
    std::vector<std::uint64_t> large;
    const index_t n_words = ceil_div_nonneg(c1 - c0, 64);
    std::uint64_t* local_bits = small;
    if (n_words > 16) {
      large.assign(static_cast<std::size_t>(n_words), 0);
      local_bits = large.data();
    }
    fill_row_bits(inner, local(ctx, b), q - q_begin(b), c0 - kv_begin(b), c1 - kv_begin(b), local_bits);
    // Word by word: bits past c1 - c0 are clear, so a spill into the word
    // after the last one the row owns is always zero and is skipped.
    const index_t shift = (c0 - begin) % 64, first = (c0 - begin) / 64, last = ceil_div_nonneg(end - begin, 64) - 1;
    for (index_t w = 0; w < n_words; ++w) {
      const std::uint64_t v = local_bits[w];
      if (v == 0) continue;
      words[first + w] |= v << shift;
      if (shift != 0 && first + w + 1 <= last) words[first + w + 1] |= v >> (64 - shift);
    }
  }

 private:
  index_t sequences() const { return static_cast<index_t>(cu_q.size()) - 1; }
  index_t q_begin(index_t b) const { return cu_q[static_cast<std::size_t>(b)]; }
  index_t q_end(index_t b) const { return cu_q[static_cast<std::size_t>(b) + 1]; }
  index_t kv_begin(index_t b) const { return cu_kv[static_cast<std::size_t>(b)]; }
  index_t kv_end(index_t b) const { return cu_kv[static_cast<std::size_t>(b) + 1]; }
  MaskContext local(const MaskContext& ctx, index_t b) const {
    return {b, ctx.head, q_end(b) - q_begin(b), kv_end(b) - kv_begin(b)};
  }
  // The sequence holding query token q; -1 past the last one. Empty sequences
  // share their offset with the next one, and upper_bound steps over them.
  index_t sequence_of_query(index_t q) const {
    if (q < 0 || q >= cu_q.back()) return -1;
    return static_cast<index_t>(std::upper_bound(cu_q.begin(), cu_q.end(), q) - cu_q.begin()) - 1;
  }
};

// The distinct tile contents of one direction, in the order first referenced.
class TileTable {
 public:
  TileTable(BlockShape block, index_t words_per_row) : block_(block), words_(words_per_row) {}

  std::int32_t id_of(std::span<const std::uint64_t> bits) {
    std::uint64_t h = 1469598103934665603ull;
    for (const std::uint64_t w : bits) h = (h ^ w) * 1099511628211ull;
    auto& candidates = by_hash_[h];
    for (const std::int32_t id : candidates) {
      const auto stored = std::span(bits_).subspan(static_cast<std::size_t>(id) * bits.size(), bits.size());
      if (std::equal(stored.begin(), stored.end(), bits.begin(), bits.end())) return id;
    }
    const auto id = static_cast<std::int32_t>(count());
    bits_.insert(bits_.end(), bits.begin(), bits.end());
    candidates.push_back(id);
    return id;
  }
  index_t count() const { return static_cast<index_t>(bits_.size()) / (block_.q * words_); }

  // [max(1, count), block.q, block.kv] int8; a layout with no partial tile
  // still hands the kernel one (zero) tile to fetch.
  std::vector<std::int8_t> expand(const char* what) const {
    const index_t tiles = std::max<index_t>(1, count());
    const index_t n = checked_size(what, limits::kMaxTensorElements, tiles, block_.q, block_.kv);
    auto out = allocating(what, static_cast<std::size_t>(n),
                          [&] { return std::vector<std::int8_t>(static_cast<std::size_t>(n), 0); });
    for (index_t t = 0; t < count(); ++t) {
      for (index_t r = 0; r < block_.q; ++r) {
        const std::uint64_t* row = bits_.data() + (t * block_.q + r) * words_;
        for (index_t c = 0; c < block_.kv; ++c) {
          out[static_cast<std::size_t>((t * block_.q + r) * block_.kv + c)] = test_bit(row, c) ? 1 : 0;
        }
      }
    }
    return out;
  }

 private:
  BlockShape block_;
  index_t words_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> by_hash_;
  std::vector<std::uint64_t> bits_;
};

// What an entry of the DeviceMaskLayout becomes on the TPU.
inline constexpr std::int32_t kDropped = -3;  // empty after all: listed nowhere
inline constexpr std::int32_t kUnseen = std::numeric_limits<std::int32_t>::min();

// One direction of the TPU layout from a DeviceMaskLayout whose rows are
// dl.block.q-blocks of the padded extent `row_len` and whose columns are
// dl.block.kv-blocks; sequence b's rows and columns past dl.lengths are padding.
inline backends::TpuBlockLists block_lists(const backends::DeviceMaskLayout& dl, index_t row_len,
                                           const char* tiles_what) {
  const BlockShape block = dl.block;
  const index_t words = dl.words_per_row;
  const index_t padded_rows = ceil_div_nonneg(row_len, block.q);
  const index_t batch = dl.lengths.batch();
  const index_t full_words = block.kv / 64;
  const std::uint64_t last_word = block.kv % 64 == 0 ? 0 : (std::uint64_t{1} << (block.kv % 64)) - 1;

  TileTable table(block, words);
  std::vector<std::int32_t> of_stored(static_cast<std::size_t>(dl.num_tiles()), kUnseen);
  std::map<std::pair<index_t, index_t>, std::int32_t> of_rectangle;
  std::vector<std::uint64_t> scratch(static_cast<std::size_t>(block.q * words));

  // A stored tile's bits are 0 outside its box, so "every bit of the whole
  // block set" can only happen for an unclipped tile: then it is full.
  const auto stored = [&](std::int32_t id) {
    std::int32_t& out = of_stored[static_cast<std::size_t>(id)];
    if (out != kUnseen) return out;
    const auto bits =
        std::span(dl.tile_bits)
            .subspan(static_cast<std::size_t>(id * block.q * words), static_cast<std::size_t>(block.q * words));
    bool none = true, every = true;
    for (index_t r = 0; r < block.q; ++r) {
      for (index_t w = 0; w < words; ++w) {
        const std::uint64_t v = bits[static_cast<std::size_t>(r * words + w)];
        none = none && v == 0;
        every = every && v == (w < full_words ? ~std::uint64_t{0} : last_word);
      }
    }
    out = none ? kDropped : every ? std::int32_t{-1} : table.id_of(bits);
    return out;
  };
  // A full tile cut to rows x cols by a sequence's end: those elements only.
  const auto clipped = [&](index_t rows, index_t cols) {
    const auto [it, fresh] = of_rectangle.try_emplace({rows, cols}, kUnseen);
    if (!fresh) return it->second;
    std::fill(scratch.begin(), scratch.end(), 0);
    for (index_t r = 0; r < rows; ++r) set_bit_range(scratch.data() + r * words, 0, cols);
    it->second = table.id_of(scratch);
    return it->second;
  };

  backends::TpuBlockLists out;
  const index_t rows = checked_size(kWho, limits::kMaxTensorElements, batch, dl.mask_heads, padded_rows);
  allocating("Tpu::plan: start and count of every row", static_cast<std::size_t>(rows) * 2 * sizeof(std::int32_t), [&] {
    out.start.reserve(static_cast<std::size_t>(rows));
    out.count.reserve(static_cast<std::size_t>(rows));
  });
  out.block.reserve(dl.entries.size());
  out.tile.reserve(dl.entries.size());
  for (index_t b = 0; b < batch; ++b) {
    const index_t len_r = dl.lengths.q[static_cast<std::size_t>(b)];
    const index_t len_c = dl.lengths.kv[static_cast<std::size_t>(b)];
    const index_t own_rows = ceil_div_nonneg(len_r, block.q);
    for (index_t h = 0; h < dl.mask_heads; ++h) {
      for (index_t rb = 0; rb < padded_rows; ++rb) {
        out.start.push_back(static_cast<std::int32_t>(out.block.size()));
        if (rb < own_rows) {
          const auto r = static_cast<std::size_t>(dl.row_base[static_cast<std::size_t>(b)] + h * own_rows + rb);
          for (auto e = dl.row_offsets[r]; e < dl.row_offsets[r + 1]; ++e) {
            const backends::KvTileEntry entry = dl.entries[static_cast<std::size_t>(e)];
            std::int32_t tile = -1;
            if (entry.tile >= 0) {
              tile = stored(entry.tile);
            } else {
              const index_t box_rows = std::min(block.q, len_r - rb * block.q);
              const index_t box_cols = std::min(block.kv, len_c - index_t{entry.kv_block} * block.kv);
              if (box_rows < block.q || box_cols < block.kv) tile = clipped(box_rows, box_cols);
            }
            if (tile == kDropped) continue;
            out.block.push_back(entry.kv_block);
            out.tile.push_back(tile);
          }
        }
        out.count.push_back(static_cast<std::int32_t>(out.block.size()) - out.start.back());
        // An empty row repeats the last entry listed before it: its grid
        // steps keep the previous block index, so they fetch nothing.
        if (out.count.back() == 0) out.start.back() = std::max(out.start.back() - 1, std::int32_t{0});
        out.width = std::max<index_t>(out.width, out.count.back());
      }
    }
  }
  // The kernel reads entry start + min(j, max(count - 1, 0)) of every row, an
  // empty one included: one full dummy entry when nothing is listed anywhere
  // (every start is then 0).
  if (out.block.empty()) {
    out.block.push_back(0);
    out.tile.push_back(-1);
  }
  // A full entry fetches the partial tile last fetched, so it moves no new tile.
  out.fetch.reserve(out.tile.size());
  std::int32_t fetched = 0;
  for (const std::int32_t t : out.tile) {
    if (t >= 0) fetched = t;
    out.fetch.push_back(fetched);
  }
  out.num_tiles = std::max<index_t>(1, table.count());
  out.tiles = table.expand(tiles_what);
  return out;
}

inline void check_lengths(const char* name, std::span<const index_t> lens, index_t batch, index_t padded,
                          const char* padded_name) {
  require(static_cast<index_t>(lens.size()) == batch, kWho, ": ", name, " must have one length per sequence (", batch,
          "), got ", lens.size());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    require(lens[b] >= 0 && lens[b] <= padded, kWho, ": ", name, "[", b, "] = ", lens[b], " must lie in [0, ",
            padded_name, " = ", padded, "]");
  }
}

inline void check_offsets(const char* name, std::span<const index_t> cu, index_t padded, const char* padded_name) {
  require(cu.size() >= 2, kWho, ": ", name, " must hold [sequences + 1] offsets starting at 0, got ", cu.size(),
          " values");
  require(cu[0] == 0, kWho, ": ", name, " must start at 0, got ", name, "[0] = ", cu[0]);
  for (std::size_t i = 1; i < cu.size(); ++i) {
    require(cu[i] >= cu[i - 1], kWho, ": ", name, " must be non-decreasing, got ", name, "[", i - 1, "] = ", cu[i - 1],
            " > ", name, "[", i, "] = ", cu[i]);
  }
  require(cu.back() <= padded, kWho, ": ", name, " ends at ", cu.back(), ", past ", padded_name, " = ", padded,
          " tokens");
}

}  // namespace seqattn::detail::tpu

namespace seqattn::backends {

struct Tpu {
  static const char* name() { return "Tpu"; }

  // The query- and key-major layouts of `mask` over `seqs`, with `heads` query
  // heads (the layout stores one head when the mask is head-invariant).
  static TpuLayout plan(const AnyMask& mask, const TpuSequences& seqs, index_t heads, BlockShape block) {
    namespace dt = seqattn::detail::tpu;
    check(seqs, heads, block);
    TpuLayout out;
    out.batch = seqs.batch;
    out.q_len = seqs.q_len;
    out.kv_len = seqs.kv_len;
    out.block = block;
    BlockMask bm;
    if (seqs.is_packed()) {
      RaggedLengths per_sequence;
      for (std::size_t b = 0; b + 1 < seqs.cu_seqlens_q.size(); ++b) {
        per_sequence.q.push_back(seqs.cu_seqlens_q[b + 1] - seqs.cu_seqlens_q[b]);
        per_sequence.kv.push_back(seqs.cu_seqlens_kv[b + 1] - seqs.cu_seqlens_kv[b]);
      }
      // The stream's mask checks nothing itself: the inner mask is checked here
      // against the sequences it will be asked about.
      seqattn::detail::check_mask(mask, per_sequence, heads);
      const AnyMask stream(dt::PackedSequencesMask{mask, seqs.cu_seqlens_q, seqs.cu_seqlens_kv});
      bm = build_block_mask(stream, RaggedLengths::uniform(1, seqs.q_len, seqs.kv_len), heads, block);
    } else {
      RaggedLengths lengths = RaggedLengths::uniform(seqs.batch, seqs.q_len, seqs.kv_len);
      if (!seqs.q_lens.empty()) lengths = RaggedLengths{seqs.q_lens, seqs.kv_lens};
      bm = build_block_mask(mask, std::move(lengths), heads, block);
    }
    // Entries are indexed in int32 on the TPU (scalar prefetch), and both the
    // lists and the transpose cost O(listed tiles): refuse before building them.
    const index_t listed = bm.num_full_tiles() + bm.num_partial_tiles();
    seqattn::detail::require(listed <= std::numeric_limits<std::int32_t>::max(), dt::kWho, ": the mask lists ", listed,
                             " non-empty (", block.q, ", ", block.kv,
                             ") tiles, more than the 2^31 - 1 entries int32 indices reach; use larger blocks");
    out.mask_heads = bm.heads();
    out.queries = dt::block_lists(build_device_mask_layout(bm, dt::kWho), seqs.q_len, "Tpu::plan: q_tiles");
    out.keys = dt::block_lists(build_device_mask_layout(bm.transposed(), dt::kWho), seqs.kv_len, "Tpu::plan: kv_tiles");
    return out;
  }

  // The [B, pages] page table the kernel reads from a block table [B, pages]
  // (sequence b's key j lives in page block_table[b][j / page_size]) whose
  // pages hold one kv block each. Entries past a sequence's last page are not
  // read by any listed block; they become page 0, so that even a stray fetch
  // stays inside the cache.
  static TpuPageTable page_table(TensorView<const std::int32_t> block_table, TensorView<const std::int32_t> kv_lens,
                                 index_t num_pages, index_t page_size, index_t block_kv) {
    using seqattn::detail::require;
    constexpr const char* kWho = "Tpu::page_table";
    require(block_table.rank() == 2 && !block_table.shape().any_negative(), kWho,
            ": block_table must have shape [batch, pages_per_seq], got ", block_table.shape());
    require(block_table.data() != nullptr || block_table.size() == 0, kWho, ": block_table has no data");
    const index_t batch = block_table.extent(0), pages = block_table.extent(1);
    require(kv_lens.rank() == 1 && kv_lens.extent(0) == batch, kWho, ": kv_lens must have shape [", batch,
            "] (one length per row of block_table ", block_table.shape(), "), got ", kv_lens.shape());
    require(kv_lens.data() != nullptr || batch == 0, kWho, ": kv_lens has no data");
    require(block_kv > 0 && page_size == block_kv, kWho,
            ": page_size must equal block_kv (one kv block per page), got ", "page_size ", page_size, " and block_kv ",
            block_kv);
    require(num_pages > 0, kWho, ": num_pages must be positive, got ", num_pages);
    require(pages > 0, kWho, ": block_table must have at least one page per sequence, got shape ", block_table.shape());
    for (index_t b = 0; b < batch; ++b) {
      const index_t len = kv_lens.data()[b * kv_lens.stride(0)];
      const index_t needed = seqattn::detail::ceil_div_nonneg(std::max<index_t>(len, 0), page_size);
      require(len >= 0 && needed <= pages, kWho, ": kv_lens[", b, "] = ", len, " must lie in [0, ", pages * page_size,
              "] (block_table ", block_table.shape(), " holds ", pages, " pages of ", page_size, " tokens)");
      for (index_t i = 0; i < needed; ++i) {
        const index_t page = block_table.data()[b * block_table.stride(0) + i * block_table.stride(1)];
        require(page >= 0 && page < num_pages, kWho, ": block_table[", b, "][", i, "] = ", page,
                " is not a page of the cache (num_pages ", num_pages, "); kv_lens[", b, "] = ", len, " reads ", needed,
                " pages");
      }
    }
    const index_t n = seqattn::detail::checked_size(kWho, limits::kMaxTensorElements, batch, pages);
    TpuPageTable out{batch, pages, std::vector<std::int32_t>(static_cast<std::size_t>(n), 0)};
    for (index_t b = 0; b < batch; ++b) {
      const index_t needed = seqattn::detail::ceil_div_nonneg(kv_lens.data()[b * kv_lens.stride(0)], page_size);
      for (index_t i = 0; i < needed; ++i) {
        out.pages[static_cast<std::size_t>(b * pages + i)] =
            block_table.data()[b * block_table.stride(0) + i * block_table.stride(1)];
      }
    }
    return out;
  }

 private:
  static void check(const TpuSequences& seqs, index_t heads, BlockShape block) {
    namespace dt = seqattn::detail::tpu;
    using seqattn::detail::require;
    require(heads >= 1 && heads <= limits::kMaxHeads, dt::kWho, ": heads must lie in [1, ", limits::kMaxHeads,
            "], got ", heads);
    require(block.q >= 1 && block.kv >= 1 && block.q <= limits::kMaxBlockSize && block.kv <= limits::kMaxBlockSize,
            dt::kWho, ": block_q and block_kv must lie in [1, ", limits::kMaxBlockSize, "], got block_q ", block.q,
            " and block_kv ", block.kv);
    require(block.q * block.kv <= limits::kMaxTileBits, dt::kWho, ": a (", block.q, ", ", block.kv,
            ") tile exceeds the limit of ", limits::kMaxTileBits, " elements per stored tile");
    require(seqs.q_len >= 1 && seqs.kv_len >= 1, dt::kWho, ": q_len and kv_len must be positive, got q_len ",
            seqs.q_len, " and kv_len ", seqs.kv_len);
    require(seqs.batch >= 1 && seqs.batch <= limits::kMaxTensorElements, dt::kWho, ": batch must be positive, got ",
            seqs.batch);
    // Block indices are int32 in the kernel's lists, and every padded block
    // gets a row: the padded lengths are bounded here, not only the sequences.
    for (const auto& [name, len, b, block_name] : {std::tuple{"q_len", seqs.q_len, block.q, "block_q"},
                                                   std::tuple{"kv_len", seqs.kv_len, block.kv, "block_kv"}}) {
      const index_t blocks = seqattn::detail::ceil_div_nonneg(len, b);
      require(blocks <= limits::kMaxBlocksPerAxis, dt::kWho, ": ", name, " = ", len, " is ", blocks, " blocks of ",
              block_name, " = ", b, ", more than the ", limits::kMaxBlocksPerAxis, " int32 block indices reach");
      seqattn::detail::checked_size("Tpu::plan: rows of the layout (batch x heads x blocks)",
                                    limits::kMaxTensorElements, seqs.batch, heads, blocks);
    }
    if (seqs.is_packed()) {
      require(seqs.batch == 1, dt::kWho, ": packed (THD) sequences are one stream: batch must be 1, got ", seqs.batch);
      require(seqs.q_lens.empty() && seqs.kv_lens.empty(), dt::kWho,
              ": give either cu_seqlens (THD) or q_lens / kv_lens (BSHD), not both");
      dt::check_offsets("cu_seqlens_q", seqs.cu_seqlens_q, seqs.q_len, "q_len");
      dt::check_offsets("cu_seqlens_kv", seqs.cu_seqlens_kv, seqs.kv_len, "kv_len");
      require(seqs.cu_seqlens_q.size() == seqs.cu_seqlens_kv.size(), dt::kWho,
              ": cu_seqlens_q and cu_seqlens_kv must describe the same sequences, got shapes (",
              seqs.cu_seqlens_q.size(), ") and (", seqs.cu_seqlens_kv.size(), ")");
    } else if (!seqs.q_lens.empty() || !seqs.kv_lens.empty()) {
      dt::check_lengths("q_lens", seqs.q_lens, seqs.batch, seqs.q_len, "q_len");
      dt::check_lengths("kv_lens", seqs.kv_lens, seqs.batch, seqs.kv_len, "kv_len");
    }
  }
};

}  // namespace seqattn::backends
