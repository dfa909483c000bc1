// Splash attention metadata: the MaskInfo arrays JAX's TPU Splash kernel reads
// (jax.experimental.pallas.ops.tpu.splash_attention), built from a seqattn
// BlockMask or any mask description, for the forward / dQ pass and the dK/dV
// pass. The rules (tile classes, partial-tile dedup order, prefetch indices,
// grid shrinking, head and q-sequence sharding, dtype shrinking) are written
// down in docs/semantics/splash-and-flex.md; section numbers below refer to it.
//
// Splash is not an AttentionBackend here: its kernel runs on TPUs only. This
// header is the host-side half: what `_process_mask` computes with a Python
// loop over every tile, computed from the BlockMask's rows in O(#tiles) with
// no per-element work (tile classes and dedup come from the BlockMask's stored
// tile bits). Splash has no batch dimension: one mask serves the whole batch,
// so a BlockMask of several sequences is read one batch entry at a time.
//
// Masks Splash lacks (document + window, multi-item, prefix-LM, top-k, any
// combination) go through the stored-tile path, exactly as a Splash NumpyMask
// of the same dense pattern would; Splash's own in-kernel kinds (causal,
// local, chunked causal) additionally get q_sequence and a SplashMaskFunction
// naming the Splash mask that computes them.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "seqattn/core/bits.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/structural.hpp"

namespace seqattn::backends {

// The integer type Splash stores a scalar-memory array in (§5).
enum class SmemDtype : std::uint8_t { int8, int16, int32 };

inline const char* to_string(SmemDtype d) {
  switch (d) {
    case SmemDtype::int8:
      return "int8";
    case SmemDtype::int16:
      return "int16";
    default:
      return "int32";
  }
}

// One of data_next / mask_next / block_mask: the values (always held as int32
// so callers need no variant) and the dtype Splash would store them in.
struct SplashIndexArray {
  Tensor<std::int32_t> values;  // [heads or head shards, rows, cols]
  SmemDtype dtype = SmemDtype::int32;
};

// A Splash mask that computes its partial tiles inside the kernel (its
// _ComputableMask kinds): CausalMask(offset), LocalMask((left, right), offset),
// ChunkedCausalMask(chunk_size). A side of -1 is None (unbounded).
struct SplashMaskFunction {
  enum class Kind : std::uint8_t { causal, local, chunked_causal };
  Kind kind = Kind::causal;
  index_t offset = 0;
  index_t left = -1;
  index_t right = -1;
  index_t chunk = 0;
  friend bool operator==(const SplashMaskFunction&, const SplashMaskFunction&) = default;
};

// Splash's MaskInfo (static-mask form; is_dynamic_mask is always None).
struct SplashMaskInfo {
  SplashIndexArray data_next;
  std::optional<SplashIndexArray> mask_next;  // none: no partial tile, or an in-kernel mask
  SplashIndexArray block_mask;                // 0 empty, 1 partial, 2 full
  // bool [n, block_q, block_kv] (dK/dV: [n, block_kv, block_q]) as 0/1 bytes;
  // none when there is no partial tile or the mask is computed in the kernel.
  std::optional<Tensor<std::uint8_t>> partial_mask_blocks;
  std::optional<Tensor<std::int32_t>> q_sequence;   // [q_len]: arange for an in-kernel mask
  std::optional<SplashMaskFunction> mask_function;  // set together with q_sequence
  index_t num_unique_masks = 0;                     // distinct head masks (by content)
};

struct SplashOptions {
  bool is_dkv = false;  // the dK/dV pass: q iterates inside kv (§4)
  index_t head_shards = 1;
  index_t q_seq_shards = 1;
  bool downcast_smem_data = true;
  bool shrink_grid = true;
  // The Splash mask that computes this mask in the kernel, when there is one.
  // Set by the description overload for CausalMask, SlidingWindowMask and
  // top-left ChunkedCausalMask; a BlockMask does not know its kind, so a
  // caller passing one sets it (or leaves the mask stored as tiles).
  std::optional<SplashMaskFunction> mask_function;
};

}  // namespace seqattn::backends

// In seqattn::detail, not backends::detail: a `detail` inside backends would
// hide seqattn::detail from every backend header included after this one.
namespace seqattn::detail::splash {

using backends::SmemDtype;

// Tile classes and content of one head's (q-block x kv-block) grid, row-major.
struct Grid {
  std::vector<std::int8_t> cls;       // 0 empty, 1 partial, 2 full
  std::vector<std::int32_t> content;  // content id of a partial tile, else -1
  std::size_t hash = 0;
};

inline void fnv(std::size_t& h, std::uint64_t v) { h = (h ^ v) * 1099511628211ull; }

// Distinct partial-tile contents, keyed by the BlockMask's own dedup ids when it
// stored tile bits (ids that already mean "same content") and by bits computed
// from its predicate otherwise.
class TileContents {
 public:
  TileContents(const BlockMask& bm, index_t batch) : bm_(bm), batch_(batch) {
    const BlockShape s = bm.block_shape();
    words_ = bm.words_per_row();
    tile_words_ = s.q * words_;
    area_ = s.q * s.kv;
    stored_ = bm.num_partial_tiles() == 0 || bm.has_tile_bits();
    if (stored_) cls_.assign(static_cast<std::size_t>(bm.num_distinct_partial_tiles()), -1);
  }

  // Content id of partial tile i of row (h, qb).
  std::int32_t id(index_t h, index_t qb, std::size_t i, std::int32_t kb) {
    if (stored_) return bm_.partial_tile_ids(batch_, h, qb)[i];
    const Tile t = bm_.tile(batch_, qb, kb);
    const MaskContext ctx{batch_, h, bm_.q_len(batch_), bm_.kv_len(batch_)};
    scratch_.assign(static_cast<std::size_t>(tile_words_), 0);
    for (index_t r = 0; r < t.rows(); ++r) {
      for (index_t c = 0; c < t.cols(); ++c) {
        if (bm_.allowed(ctx, t.q_begin + r, t.kv_begin + c)) {
          scratch_[static_cast<std::size_t>(r * words_ + c / 64)] |= std::uint64_t{1} << (c % 64);
        }
      }
    }
    std::size_t hash = 1469598103934665603ull;
    for (std::uint64_t w : scratch_) fnv(hash, w);
    auto& candidates = by_hash_[hash];
    for (std::int32_t c : candidates) {
      if (std::equal(scratch_.begin(), scratch_.end(), bits(c).begin())) return c;
    }
    const auto c = static_cast<std::int32_t>(cls_.size());
    own_.insert(own_.end(), scratch_.begin(), scratch_.end());
    cls_.push_back(-1);
    candidates.push_back(c);
    return c;
  }

  std::span<const std::uint64_t> bits(std::int32_t c) const {
    if (stored_) return bm_.tile_bits(c);
    return std::span(own_).subspan(static_cast<std::size_t>(c) * static_cast<std::size_t>(tile_words_),
                                   static_cast<std::size_t>(tile_words_));
  }

  // Splash classifies from content: a BlockMask may soundly call a tile partial
  // that is in fact all-true or all-false (e.g. an `or` of two partial sides).
  std::int8_t tile_class(std::int32_t c) {
    std::int8_t& k = cls_[static_cast<std::size_t>(c)];
    if (k < 0) {
      index_t ones = 0;
      for (std::uint64_t w : bits(c)) ones += std::popcount(w);
      k = ones == 0 ? 0 : ones == area_ ? 2 : 1;
    }
    return k;
  }

 private:
  const BlockMask& bm_;
  index_t batch_;
  index_t words_ = 0, tile_words_ = 0, area_ = 0;
  bool stored_ = true;
  std::vector<std::int8_t> cls_;
  std::vector<std::uint64_t> own_, scratch_;
  std::unordered_map<std::size_t, std::vector<std::int32_t>> by_hash_;
};

inline Grid head_grid(const BlockMask& bm, index_t batch, index_t h, index_t nq, index_t nkv, TileContents& tiles) {
  Grid g;
  const auto cells = static_cast<std::size_t>(nq * nkv);
  g.cls.assign(cells, 0);
  g.content.assign(cells, -1);
  for (index_t qb = 0; qb < nq; ++qb) {
    std::int8_t* cls = g.cls.data() + qb * nkv;
    std::int32_t* content = g.content.data() + qb * nkv;
    for (const BlockRange& r : bm.full_ranges(batch, h, qb)) std::fill(cls + r.begin, cls + r.end, std::int8_t{2});
    const auto partial = bm.partial_blocks(batch, h, qb);
    for (std::size_t i = 0; i < partial.size(); ++i) {
      const std::int32_t c = tiles.id(h, qb, i, partial[i]);
      const std::int8_t k = tiles.tile_class(c);
      cls[partial[i]] = k;
      if (k == 1) content[partial[i]] = c;
    }
  }
  std::size_t hash = 1469598103934665603ull;
  for (std::size_t i = 0; i < cells; ++i) {
    fnv(hash, static_cast<std::uint64_t>(g.cls[i]));
    fnv(hash, static_cast<std::uint64_t>(static_cast<std::uint32_t>(g.content[i])));
  }
  g.hash = hash;
  return g;
}

inline SmemDtype smallest_dtype(std::span<const std::int32_t> values) {
  if (values.empty()) return SmemDtype::int32;  // Splash leaves an empty array as it is
  const std::int32_t top = *std::max_element(values.begin(), values.end());
  if (top <= std::numeric_limits<std::int8_t>::max()) return SmemDtype::int8;
  if (top <= std::numeric_limits<std::int16_t>::max()) return SmemDtype::int16;
  return SmemDtype::int32;
}

// Three arrays of the same [rows, q, kv] shape, stored flat.
struct Arrays {
  index_t rows = 0, nq = 0, nkv = 0;
  std::vector<std::int32_t> block_mask, data_next, mask_next;
  std::size_t at(index_t r, index_t q, index_t kv) const { return static_cast<std::size_t>((r * nq + q) * nkv + kv); }
};

}  // namespace seqattn::detail::splash

namespace seqattn::backends {

// The MaskInfo builder. Stateless: a namespace-like policy type, named like the
// CPU backends so a future TPU bridge can take it as a template argument.
struct Splash {
  static const char* name() { return "splash"; }

  // The Splash mask that computes `mask` in the kernel for this (q_len, kv_len),
  // when Splash has one (§6): causal and windows with any alignment (the
  // alignment becomes Splash's offset), chunked causal only top-left (Splash's
  // chunks have no offset). Looks through AnyMask.
  template <MaskDescription M>
  static std::optional<SplashMaskFunction> mask_function_of(const M& mask, index_t q_len, index_t kv_len) {
    using Kind = SplashMaskFunction::Kind;
    const MaskContext ctx{0, 0, q_len, kv_len};
    if constexpr (std::is_same_v<M, AnyMask>) {
      if (const auto* m = mask.template target<CausalMask>()) return mask_function_of(*m, q_len, kv_len);
      if (const auto* m = mask.template target<SlidingWindowMask>()) return mask_function_of(*m, q_len, kv_len);
      if (const auto* m = mask.template target<ChunkedCausalMask>()) return mask_function_of(*m, q_len, kv_len);
      return std::nullopt;
    } else if constexpr (std::is_same_v<M, CausalMask>) {
      return SplashMaskFunction{Kind::causal, seqattn::detail::diagonal_shift(mask.alignment, ctx), -1, -1, 0};
    } else if constexpr (std::is_same_v<M, SlidingWindowMask>) {
      return SplashMaskFunction{Kind::local, seqattn::detail::diagonal_shift(mask.alignment, ctx),
                                mask.left < 0 ? -1 : mask.left, mask.right < 0 ? -1 : mask.right, 0};
    } else if constexpr (std::is_same_v<M, ChunkedCausalMask>) {
      if (seqattn::detail::diagonal_shift(mask.alignment, ctx) != 0) return std::nullopt;
      return SplashMaskFunction{Kind::chunked_causal, 0, -1, -1, mask.chunk};
    } else {
      return std::nullopt;
    }
  }

  // MaskInfo of a description for a (q_len, kv_len) mask with `heads` heads.
  // Builds the BlockMask (tile bits stored) and fills options.mask_function
  // when the caller did not and Splash computes this kind in the kernel.
  template <MaskDescription M>
  static SplashMaskInfo mask_info(const M& mask, index_t q_len, index_t kv_len, index_t heads, BlockShape block,
                                  SplashOptions options = {}) {
    seqattn::detail::require(q_len > 0 && kv_len > 0, "Splash::mask_info: q_len (", q_len, ") and kv_len (", kv_len,
                             ") must be positive");
    require_divisible(q_len, kv_len, block);
    const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(1, q_len, kv_len), heads, block);
    if (!options.mask_function) options.mask_function = mask_function_of(mask, q_len, kv_len);
    return mask_info(bm, heads, options, 0);
  }

  // MaskInfo of batch entry `batch` of a BlockMask, for `heads` heads (the
  // BlockMask stores one head for head-invariant masks, or exactly `heads`).
  static SplashMaskInfo mask_info(const BlockMask& bm, index_t heads, const SplashOptions& options = {},
                                  index_t batch = 0) {
    namespace ds = detail::splash;
    using seqattn::detail::require;
    require(batch >= 0 && batch < bm.batch(), "Splash::mask_info: batch ", batch, " outside the BlockMask's ",
            bm.batch(), " sequences");
    require(heads > 0 && heads <= limits::kMaxHeads, "Splash::mask_info: heads must be in [1, ", limits::kMaxHeads,
            "], got ", heads);
    require(bm.heads() == 1 || bm.heads() == heads, "Splash::mask_info: the BlockMask stores ", bm.heads(),
            " heads but heads=", heads);
    const index_t q_len = bm.q_len(batch), kv_len = bm.kv_len(batch);
    const BlockShape block = bm.block_shape();
    require(q_len > 0 && kv_len > 0, "Splash::mask_info: sequence ", batch, " has lengths (q ", q_len, ", kv ", kv_len,
            "); Splash needs both positive");
    require_divisible(q_len, kv_len, block);
    require(options.head_shards > 0 && heads % options.head_shards == 0,
            "Splash::mask_info: head_shards=", options.head_shards, " must be positive and divide heads=", heads);
    require(options.q_seq_shards > 0 && q_len % options.q_seq_shards == 0,
            "Splash::mask_info: q_seq_shards=", options.q_seq_shards, " must be positive and divide q_len=", q_len);
    require((q_len / options.q_seq_shards) % block.q == 0, "Splash::mask_info: block_q=", block.q,
            " must divide the q_len of one of q_seq_shards=", options.q_seq_shards, " shards (", q_len, " / ",
            options.q_seq_shards, " = ", q_len / options.q_seq_shards, ")");
    const index_t nq = q_len / block.q, nkv = kv_len / block.kv;
    const index_t head_shards = options.head_shards, q_shards = options.q_seq_shards;
    const index_t heads_per_shard = heads / head_shards, q_blocks_per_shard = nq / q_shards;

    // Each head's class grid holds one int8 class and one int32 content id per tile.
    const index_t grid_cells = seqattn::detail::checked_size(
        "Splash::mask_info: class grid of one head (q-blocks x kv-blocks)", limits::kMaxTensorElements, nq, nkv);
    const auto grid_bytes = static_cast<std::size_t>(grid_cells) * (sizeof(std::int8_t) + sizeof(std::int32_t));

    // §1 unique masks by content, in order of first head; §2 tile classes.
    ds::TileContents tiles(bm, batch);
    std::vector<ds::Grid> unique;
    std::vector<index_t> mask_of_head(static_cast<std::size_t>(heads), 0);
    for (index_t h = 0; h < bm.heads(); ++h) {
      ds::Grid g = seqattn::detail::allocating("Splash::mask_info: class grid of one head", grid_bytes,
                                               [&] { return ds::head_grid(bm, batch, h, nq, nkv, tiles); });
      index_t id = -1;
      for (std::size_t u = 0; u < unique.size() && id < 0; ++u) {
        if (unique[u].hash == g.hash && unique[u].cls == g.cls && unique[u].content == g.content) {
          id = static_cast<index_t>(u);
        }
      }
      if (id < 0) {
        id = static_cast<index_t>(unique.size());
        unique.push_back(std::move(g));
      }
      mask_of_head[static_cast<std::size_t>(h)] = id;
    }
    if (bm.heads() == 1) std::fill(mask_of_head.begin(), mask_of_head.end(), 0);

    // §3 partial tiles numbered by first appearance: mask by mask, row-major;
    // the grids' content ids become those numbers.
    std::unordered_map<std::int32_t, std::int32_t> number;
    std::vector<std::int32_t> numbered_contents;
    for (ds::Grid& g : unique) {
      for (std::int32_t& c : g.content) {
        if (c < 0) continue;
        auto [it, fresh] = number.try_emplace(c, static_cast<std::int32_t>(numbered_contents.size()));
        if (fresh) numbered_contents.push_back(c);
        c = it->second;
      }
    }
    const bool has_partials = !numbered_contents.empty();

    // §4 one row of metadata per head shard when each shard sees one mask.
    index_t most_masks_in_a_shard = 0;
    for (index_t s = 0; s < head_shards; ++s) {
      std::vector<index_t> ids(mask_of_head.begin() + s * heads_per_shard,
                               mask_of_head.begin() + (s + 1) * heads_per_shard);
      std::sort(ids.begin(), ids.end());
      most_masks_in_a_shard = std::max<index_t>(
          most_masks_in_a_shard, static_cast<index_t>(std::unique(ids.begin(), ids.end()) - ids.begin()));
    }
    const bool per_shard = most_masks_in_a_shard == 1;
    ds::Arrays a;
    a.rows = per_shard ? head_shards : heads;
    a.nq = nq;
    a.nkv = nkv;
    const auto cells = static_cast<std::size_t>(seqattn::detail::checked_size(
        "Splash::mask_info: MaskInfo arrays", limits::kMaxTensorElements, a.rows, nq, nkv));
    seqattn::detail::allocating("Splash::mask_info: MaskInfo arrays",
                                cells * sizeof(std::int32_t) * (has_partials ? 3 : 2), [&] {
                                  a.block_mask.assign(cells, 0);
                                  a.data_next.assign(cells, 0);
                                  if (has_partials) a.mask_next.assign(cells, 0);
                                });
    auto grid_of_row = [&](index_t r) -> const ds::Grid& {
      return unique[static_cast<std::size_t>(
          mask_of_head[static_cast<std::size_t>(per_shard ? r * heads_per_shard : r)])];
    };
    for (index_t r = 0; r < a.rows; ++r) {
      const ds::Grid& g = grid_of_row(r);
      std::copy(g.cls.begin(), g.cls.end(), a.block_mask.begin() + static_cast<std::ptrdiff_t>(a.at(r, 0, 0)));
    }

    // §4 prefetch indices, slice by slice (head shard x q shard).
    for (index_t s = 0; s < head_shards; ++s) {
      const index_t r0 = per_shard ? s : s * heads_per_shard;
      const index_t r1 = per_shard ? s + 1 : (s + 1) * heads_per_shard;
      for (index_t t = 0; t < q_shards; ++t) {
        fill_next(a, grid_of_row, r0, r1, t * q_blocks_per_shard, (t + 1) * q_blocks_per_shard, options.is_dkv,
                  has_partials);
      }
    }

    SplashMaskInfo info;
    info.num_unique_masks = static_cast<index_t>(unique.size());
    Extents shape{a.rows, nq, nkv};
    if (options.shrink_grid && unique.size() == 1) {
      shape = shrink(a, q_shards, q_blocks_per_shard, options.is_dkv, has_partials);
    }
    auto finish = [&](std::vector<std::int32_t>& v) {
      SplashIndexArray out;
      out.dtype = options.downcast_smem_data ? ds::smallest_dtype(v) : SmemDtype::int32;
      out.values = Tensor<std::int32_t>(shape, std::move(v));
      return out;
    };
    info.data_next = finish(a.data_next);
    info.block_mask = finish(a.block_mask);

    if (options.mask_function) {
      // §6 Splash evaluates the mask in the kernel: no stored tiles.
      require(unique.size() == 1, "Splash::mask_info: options.mask_function is set but the mask has ", unique.size(),
              " distinct head masks; Splash computes a mask in the kernel only when all heads share it");
      info.mask_function = options.mask_function;
      Tensor<std::int32_t> seq(Extents{q_len});
      for (index_t i = 0; i < q_len; ++i) seq.data()[i] = static_cast<std::int32_t>(i);
      info.q_sequence = std::move(seq);
      return info;
    }
    if (has_partials) {
      info.mask_next = finish(a.mask_next);
      const index_t n = static_cast<index_t>(numbered_contents.size());
      const index_t rows = options.is_dkv ? block.kv : block.q, cols = options.is_dkv ? block.q : block.kv;
      const index_t block_bytes = seqattn::detail::checked_size("Splash::mask_info: partial_mask_blocks",
                                                                limits::kMaxTensorElements, n, rows, cols);
      auto blocks = seqattn::detail::allocating("Splash::mask_info: partial_mask_blocks",
                                                static_cast<std::size_t>(block_bytes), [&] {
                                                  return Tensor<std::uint8_t>(Extents{n, rows, cols}, 0);
                                                });
      const index_t words = bm.words_per_row();
      for (index_t p = 0; p < n; ++p) {
        const auto bits = tiles.bits(numbered_contents[static_cast<std::size_t>(p)]);
        std::uint8_t* out = blocks.data() + p * rows * cols;
        for (index_t i = 0; i < block.q; ++i) {
          for (index_t j = 0; j < block.kv; ++j) {
            const auto bit = static_cast<std::uint8_t>(seqattn::detail::test_bit(bits.data() + i * words, j));
            out[options.is_dkv ? j * cols + i : i * cols + j] = bit;
          }
        }
      }
      info.partial_mask_blocks = std::move(blocks);
    }
    return info;
  }

 private:
  static void require_divisible(index_t q_len, index_t kv_len, BlockShape block) {
    seqattn::detail::require_block_shape(block);
    seqattn::detail::require(q_len % block.q == 0 && kv_len % block.kv == 0, "Splash::mask_info: block shape (",
                             block.q, ", ", block.kv, ") must divide the mask shape (", q_len, ", ", kv_len,
                             "); Splash has no short edge tiles, so pad the sequences to a multiple");
  }

  // data_next / mask_next of rows [r0, r1) and q-blocks [q0, q1): each cell
  // names the next non-empty (resp. partial) cell at or after it in the order
  // the kernel visits the slice, wrapping to the slice's first one; a slice
  // without any keeps zeros (§4).
  template <class GridOf>
  static void fill_next(detail::splash::Arrays& a, const GridOf& grid_of_row, index_t r0, index_t r1, index_t q0,
                        index_t q1, bool is_dkv, bool has_partials) {
    const index_t nr = r1 - r0, nq = q1 - q0, nkv = a.nkv;
    const index_t total = nr * nq * nkv;
    // Position p in visiting order -> (row, q, kv): fwd visits (row, q, kv),
    // dK/dV visits (kv, row, q).
    auto coords = [&](index_t p, index_t& r, index_t& q, index_t& kv) {
      if (is_dkv) {
        kv = p / (nr * nq);
        r = r0 + (p / nq) % nr;
        q = q0 + p % nq;
      } else {
        r = r0 + p / (nq * nkv);
        q = q0 + (p / nkv) % nq;
        kv = p % nkv;
      }
    };
    auto cls = [&](index_t r, index_t q, index_t kv) { return a.block_mask[a.at(r, q, kv)]; };
    index_t first_data = -1, first_mask = -1;
    for (index_t p = 0; p < total && (first_data < 0 || (has_partials && first_mask < 0)); ++p) {
      index_t r, q, kv;
      coords(p, r, q, kv);
      const std::int32_t c = cls(r, q, kv);
      if (c != 0 && first_data < 0) first_data = p;
      if (c == 1 && first_mask < 0) first_mask = p;
    }
    if (first_data < 0) return;
    auto data_value = [&](index_t p) {
      index_t r, q, kv;
      coords(p, r, q, kv);
      return static_cast<std::int32_t>(is_dkv ? q - q0 : kv);  // dK/dV indices are local to the q shard
    };
    auto mask_value = [&](index_t p) {
      index_t r, q, kv;
      coords(p, r, q, kv);
      return grid_of_row(r).content[static_cast<std::size_t>(q * nkv + kv)];
    };
    std::int32_t next_data = data_value(first_data);
    std::int32_t next_mask = first_mask >= 0 ? mask_value(first_mask) : 0;
    for (index_t p = total - 1; p >= 0; --p) {
      index_t r, q, kv;
      coords(p, r, q, kv);
      const std::size_t at = a.at(r, q, kv);
      const std::int32_t c = a.block_mask[at];
      if (c != 0) next_data = is_dkv ? static_cast<std::int32_t>(q - q0) : static_cast<std::int32_t>(kv);
      if (c == 1) next_mask = grid_of_row(r).content[static_cast<std::size_t>(q * nkv + kv)];
      a.data_next[at] = next_data;
      if (has_partials && first_mask >= 0) a.mask_next[at] = next_mask;
    }
  }

  // §5 grid shrinking (one distinct mask): per q shard, keep only the
  // non-empty kv columns of each q row (fwd) or the non-empty q rows of each
  // kv column, stacked at the bottom (dK/dV); pad to the longest with zeros;
  // then pad the shards to a common extent, block_mask with zeros and the
  // prefetch arrays by repeating their last entry. Returns the new shape.
  static Extents shrink(detail::splash::Arrays& a, index_t q_shards, index_t q_blocks_per_shard, bool is_dkv,
                        bool has_partials) {
    using seqattn::detail::require;
    const index_t rows = a.rows, nkv = a.nkv;
    struct Shard {
      index_t extent = 0;
      std::vector<std::int32_t> bm, dn, mn;  // [rows, extent, nkv] (dkv) or [rows, qbps, extent] (fwd)
    };
    std::vector<Shard> shards(static_cast<std::size_t>(q_shards));
    index_t widest = 0;
    std::vector<index_t> keep;
    for (index_t t = 0; t < q_shards; ++t) {
      Shard& sh = shards[static_cast<std::size_t>(t)];
      const index_t q0 = t * q_blocks_per_shard;
      // The kept cells of each line (q row for fwd, kv column for dK/dV) of head row 0.
      std::vector<std::vector<index_t>> kept(static_cast<std::size_t>(is_dkv ? nkv : q_blocks_per_shard));
      for (index_t q = 0; q < q_blocks_per_shard; ++q) {
        for (index_t kv = 0; kv < nkv; ++kv) {
          if (a.block_mask[a.at(0, q0 + q, kv)] == 0) continue;
          if (is_dkv) {
            kept[static_cast<std::size_t>(kv)].push_back(q);
          } else {
            kept[static_cast<std::size_t>(q)].push_back(kv);
          }
        }
      }
      for (const auto& line : kept) sh.extent = std::max<index_t>(sh.extent, static_cast<index_t>(line.size()));
      require(sh.extent > 0, "Splash::mask_info: q shard ", t, " of ", q_shards,
              " has no non-empty tile, so its shrunk grid would be empty (Splash rejects this too); "
              "use shrink_grid = false");
      const index_t lines = is_dkv ? nkv : q_blocks_per_shard;
      const auto n = static_cast<std::size_t>(rows * lines * sh.extent);
      sh.bm.assign(n, 0);
      sh.dn.assign(n, 0);
      if (has_partials) sh.mn.assign(n, 0);
      for (index_t r = 0; r < rows; ++r) {
        for (index_t line = 0; line < lines; ++line) {
          const auto& cells = kept[static_cast<std::size_t>(line)];
          const index_t pad = sh.extent - static_cast<index_t>(cells.size());
          for (std::size_t i = 0; i < cells.size(); ++i) {
            std::size_t src, dst;
            if (is_dkv) {
              src = a.at(r, q0 + cells[i], line);
              dst = static_cast<std::size_t>((r * sh.extent + pad + static_cast<index_t>(i)) * nkv + line);
            } else {
              src = a.at(r, q0 + line, cells[i]);
              dst = static_cast<std::size_t>((r * q_blocks_per_shard + line) * sh.extent + static_cast<index_t>(i));
            }
            sh.bm[dst] = a.block_mask[src];
            sh.dn[dst] = a.data_next[src];
            if (has_partials) sh.mn[dst] = a.mask_next[src];
          }
        }
      }
      widest = std::max(widest, sh.extent);
    }
    if (q_shards == 1) widest = shards[0].extent;
    // Concatenate the shards along the q axis, padding each to `widest`.
    const index_t out_q = is_dkv ? q_shards * widest : a.nq;
    const index_t out_kv = is_dkv ? nkv : widest;
    const auto n = static_cast<std::size_t>(rows * out_q * out_kv);
    std::vector<std::int32_t> bm(n, 0), dn(n, 0), mn(has_partials ? n : 0, 0);
    for (index_t t = 0; t < q_shards; ++t) {
      const Shard& sh = shards[static_cast<std::size_t>(t)];
      for (index_t r = 0; r < rows; ++r) {
        if (is_dkv) {
          for (index_t i = 0; i < widest; ++i) {
            const index_t src_i = std::min(i, sh.extent - 1);  // edge padding repeats the last row
            for (index_t kv = 0; kv < nkv; ++kv) {
              const auto src = static_cast<std::size_t>((r * sh.extent + src_i) * nkv + kv);
              const auto dst = static_cast<std::size_t>((r * out_q + t * widest + i) * nkv + kv);
              bm[dst] = i < sh.extent ? sh.bm[src] : 0;
              dn[dst] = sh.dn[src];
              if (has_partials) mn[dst] = sh.mn[src];
            }
          }
        } else {
          for (index_t q = 0; q < q_blocks_per_shard; ++q) {
            for (index_t i = 0; i < widest; ++i) {
              const index_t src_i = std::min(i, sh.extent - 1);  // edge padding repeats the last column
              const auto src = static_cast<std::size_t>((r * q_blocks_per_shard + q) * sh.extent + src_i);
              const auto dst = static_cast<std::size_t>((r * out_q + t * q_blocks_per_shard + q) * out_kv + i);
              bm[dst] = i < sh.extent ? sh.bm[src] : 0;
              dn[dst] = sh.dn[src];
              if (has_partials) mn[dst] = sh.mn[src];
            }
          }
        }
      }
    }
    a.block_mask = std::move(bm);
    a.data_next = std::move(dn);
    a.mask_next = std::move(mn);
    return Extents{rows, out_q, out_kv};
  }
};

}  // namespace seqattn::backends
