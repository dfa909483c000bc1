// Context-parallel sharding of the token axis, and masks seen through it.
//
// ShardLayout says which tokens of every sequence a rank holds. Self-attention
// only: q, k and v of a rank are the same tokens. The split reuses
// causal_load_balancing_permutation (descriptors/context_parallel.hpp) per
// sequence: rank r holds the tokens perm[r*L/P .. (r+1)*L/P) of a sequence of
// length L, in that order, so DualChunkSwap gives rank r chunks r and
// 2P-1-r, Striped gives stripes r, r+P, ..., and contiguous gives the plain
// split [r*L/P, (r+1)*L/P) (L need not divide by P there).
//
//   BSHD: every one of `batch` sequences has `seq_len` tokens; rank r holds
//         q/k/v [B, S_r, H, D].
//   THD:  packed segments of the given lengths (cu_seqlens differences, no
//         padding); rank r holds each segment's share back to back, in
//         segment order: q/k/v [T_r, H, D] with local_table(r) (the per-rank
//         split of cu_seqlens). THD reorders per segment, as TransformerEngine
//         does for DualChunkSwap, so each segment must divide by 2P (by P*stripe
//         for Striped).
//
// ShardedMask<M> evaluates a mask description given in global (whole-sequence)
// coordinates on the local tiles of one rank's queries against one rank's
// keys: local indices map to global positions, and a tile is classified by
// splitting it into the few rectangles on which both maps are contiguous runs
// and asking the inner description about each (exact for the contiguous and
// DualChunkSwap splits; for Striped with small stripes the rectangles are many
// and the answer falls back to the always-sound `partial`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/context_parallel.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::cp {

enum class Sharding : std::uint8_t { contiguous, dual_chunk_swap, striped };

// The most ranks a ShardLayout splits over: far above any context-parallel
// group, low enough that its per-rank bookkeeping (a token map per rank, a
// few words per rank and sequence) stays within 64-bit sizes.
inline constexpr int kMaxCpSize = 1 << 16;

// Local tokens [local, local + len) of one sequence are global positions
// [global, global + len).
struct Run {
  index_t local = 0;
  index_t global = 0;
  index_t len = 0;
};

// Local -> global positions of one side (the queries of a rank, the keys of a
// rank, or the keys of all ranks), per sequence.
struct TokenMap {
  std::vector<std::vector<index_t>> positions;  // [sequence][local token]
  std::vector<std::vector<Run>> runs;           // the same as contiguous runs, by local index
  std::vector<index_t> global_len;              // per sequence

  index_t batch() const { return static_cast<index_t>(positions.size()); }
  index_t len(index_t b) const { return static_cast<index_t>(positions[static_cast<std::size_t>(b)].size()); }

  void append(index_t b, std::span<const index_t> global) {
    auto& pos = positions[static_cast<std::size_t>(b)];
    auto& rs = runs[static_cast<std::size_t>(b)];
    for (const index_t g : global) {
      const auto local = static_cast<index_t>(pos.size());
      if (!rs.empty() && rs.back().global + rs.back().len == g) {
        ++rs.back().len;
      } else {
        rs.push_back({local, g, 1});
      }
      pos.push_back(g);
    }
  }
};

class ShardLayout {
 public:
  static ShardLayout bshd(index_t batch, index_t seq_len, int cp_size, Sharding sharding = Sharding::dual_chunk_swap,
                          int stripe = 1) {
    detail::require(batch >= 0 && seq_len >= 0, "ShardLayout::bshd: batch ", batch, " and seq_len ", seq_len,
                    " must be non-negative");
    detail::checked_size("ShardLayout::bshd: batch * seq_len", limits::kMaxTensorElements, batch, seq_len);
    check_ranks(cp_size, batch);
    auto lens =
        detail::allocating("ShardLayout::bshd: sequence lengths", static_cast<std::size_t>(batch) * sizeof(index_t),
                           [&] { return std::vector<index_t>(static_cast<std::size_t>(batch), seq_len); });
    return ShardLayout(Layout::bshd, std::move(lens), cp_size, sharding, stripe);
  }

  // Packed segments of these lengths (e.g. the differences of cu_seqlens).
  static ShardLayout thd(std::span<const std::int32_t> seq_lens, int cp_size,
                         Sharding sharding = Sharding::dual_chunk_swap, int stripe = 1) {
    check_ranks(cp_size, static_cast<index_t>(seq_lens.size()));
    std::vector<index_t> lens;
    index_t total = 0;
    for (std::size_t i = 0; i < seq_lens.size(); ++i) {
      detail::require(seq_lens[i] >= 0, "ShardLayout::thd: segment ", i, " has negative length ", seq_lens[i]);
      lens.push_back(seq_lens[i]);
      total += seq_lens[i];
    }
    detail::require(total <= std::numeric_limits<std::int32_t>::max(), "ShardLayout::thd: ", total,
                    " tokens exceed the int32 offsets of a SegmentTable");
    return ShardLayout(Layout::thd, std::move(lens), cp_size, sharding, stripe);
  }

  // From cu_seqlens [0, l0, l0 + l1, ...] (non-decreasing, starting at 0).
  static ShardLayout thd_from_cu_seqlens(std::span<const std::int32_t> cu_seqlens, int cp_size,
                                         Sharding sharding = Sharding::dual_chunk_swap, int stripe = 1) {
    detail::require(!cu_seqlens.empty() && cu_seqlens[0] == 0,
                    "ShardLayout::thd_from_cu_seqlens: cu_seqlens must start with 0, got ", cu_seqlens.size(),
                    " entries");
    std::vector<std::int32_t> lens;
    for (std::size_t i = 1; i < cu_seqlens.size(); ++i) {
      detail::require(cu_seqlens[i] >= cu_seqlens[i - 1], "ShardLayout::thd_from_cu_seqlens: cu_seqlens decreases at ",
                      i, " (", cu_seqlens[i - 1], " -> ", cu_seqlens[i], ")");
      lens.push_back(cu_seqlens[i] - cu_seqlens[i - 1]);
    }
    return thd(lens, cp_size, sharding, stripe);
  }

  Layout layout() const { return layout_; }
  int cp_size() const { return cp_size_; }
  Sharding sharding() const { return sharding_; }
  int stripe() const { return stripe_; }
  index_t batch() const { return static_cast<index_t>(global_len_.size()); }
  index_t global_len(index_t b) const { return global_len_[static_cast<std::size_t>(b)]; }
  RaggedLengths global_lengths() const { return {global_len_, global_len_}; }
  index_t global_tokens() const { return global_offsets_.back(); }
  // THD: where segment b starts on the packed global token axis.
  index_t global_offset(index_t b) const { return global_offsets_[static_cast<std::size_t>(b)]; }

  // The queries (and keys) of rank r.
  const TokenMap& map(int rank) const { return maps_[checked_rank(rank)]; }
  index_t local_len(int rank, index_t b) const { return map(rank).len(b); }
  // Tokens on rank r's token axis: THD T_r; BSHD S_r (the same for every sequence).
  index_t local_tokens(int rank) const { return local_tokens_[checked_rank(rank)]; }
  // THD: offset of segment b on rank r's packed token axis.
  index_t local_offset(int rank, index_t b) const {
    return local_offsets_[checked_rank(rank)][static_cast<std::size_t>(b)];
  }
  RaggedLengths local_lengths(int rank) const {
    RaggedLengths l;
    for (index_t b = 0; b < batch(); ++b) {
      l.q.push_back(local_len(rank, b));
      l.kv.push_back(local_len(rank, b));
    }
    return l;
  }

  // Shards a tensor of the global problem for rank r: BSHD [B, S, ...] ->
  // [B, S_r, ...]; THD [T, ...] -> [T_r, ...].
  template <class T>
  Tensor<std::remove_cv_t<T>> shard(TensorView<T> global, int rank) const {
    return gather_axis(global, rank, layout_ == Layout::bshd ? 1 : 0);
  }
  // Shards a per-token tensor whose token axis is `axis` (e.g. lse: BSHD
  // [B, H, S] axis 2, THD [H, T] axis 1).
  template <class T>
  Tensor<std::remove_cv_t<T>> shard_axis(TensorView<T> global, int rank, int axis) const {
    return gather_axis(global, rank, axis);
  }

  // The global token (BSHD: position in its sequence; THD: packed global
  // token) of rank r's local token `local` of sequence b.
  index_t global_token(int rank, index_t b, index_t local) const {
    const index_t pos = map(rank).positions[static_cast<std::size_t>(b)][static_cast<std::size_t>(local)];
    return layout_ == Layout::thd ? global_offset(b) + pos : pos;
  }

 private:
  // Checked before anything is allocated: the bookkeeping grows with
  // cp_size and with cp_size * sequences.
  static void check_ranks(int cp_size, index_t sequences) {
    detail::require(cp_size >= 1 && cp_size <= kMaxCpSize, "ShardLayout: cp_size must be >= 1 and at most ", kMaxCpSize,
                    " (cp::kMaxCpSize), got ", cp_size);
    detail::checked_size("ShardLayout: cp_size * sequences", limits::kMaxTensorElements, index_t{cp_size}, sequences);
  }

  ShardLayout(Layout layout, std::vector<index_t> lens, int cp_size, Sharding sharding, int stripe)
      : layout_(layout), cp_size_(cp_size), sharding_(sharding), stripe_(stripe), global_len_(std::move(lens)) {
    constexpr const char* kWho = "ShardLayout: ";
    check_ranks(cp_size, batch());
    detail::require(sharding == Sharding::striped || stripe == 1, kWho,
                    "stripe applies to Sharding::striped only, got ", stripe);
    detail::require(stripe >= 1, kWho, "stripe must be >= 1, got ", stripe);
    // Within the limits a machine may still lack the memory: per rank a
    // TokenMap and its per-sequence vectors, per token a position and a run.
    const index_t per_rank = static_cast<index_t>(sizeof(TokenMap) + 2 * sizeof(std::vector<index_t>)) +
                             batch() * static_cast<index_t>(2 * sizeof(std::vector<index_t>) + 3 * sizeof(index_t));
    index_t tokens = 0;
    for (const index_t len : global_len_) tokens = detail::checked_add(tokens, len, "ShardLayout: total tokens");
    const index_t bytes =
        detail::checked_add(detail::checked_mul(per_rank, cp_size, "ShardLayout: bookkeeping bytes"),
                            detail::checked_mul(tokens, static_cast<index_t>(2 * sizeof(index_t) + sizeof(Run)),
                                                "ShardLayout: token map bytes"),
                            "ShardLayout: bookkeeping bytes");
    detail::allocating("ShardLayout: per-rank token maps", static_cast<std::size_t>(bytes), [&] { build_maps(); });
  }

  void build_maps() {
    constexpr const char* kWho = "ShardLayout: ";
    const Layout layout = layout_;
    const int cp_size = cp_size_;
    const Sharding sharding = sharding_;
    const int stripe = stripe_;
    const auto p = static_cast<std::size_t>(cp_size);
    maps_.resize(p);
    local_tokens_.assign(p, 0);
    local_offsets_.assign(p, {});
    for (auto& m : maps_) {
      m.positions.resize(global_len_.size());
      m.runs.resize(global_len_.size());
      m.global_len = global_len_;
    }
    global_offsets_.push_back(0);
    for (std::size_t b = 0; b < global_len_.size(); ++b) {
      const index_t len = global_len_[b];
      global_offsets_.push_back(global_offsets_.back() + len);
      std::vector<index_t> perm;
      if (sharding == Sharding::contiguous) {
        perm.resize(static_cast<std::size_t>(len));
        for (index_t i = 0; i < len; ++i) perm[static_cast<std::size_t>(i)] = i;
      } else {
        const index_t unit = sharding == Sharding::striped ? index_t{cp_size} * stripe : 2 * index_t{cp_size};
        detail::require(len % unit == 0, kWho, layout == Layout::thd ? "segment " : "sequence ", b, " has length ", len,
                        ", not divisible by ", unit,
                        sharding == Sharding::striped ? " (cp_size * stripe) for Striped sharding"
                                                      : " (2 * cp_size) for DualChunkSwap sharding");
        perm = causal_load_balancing_permutation(
            sharding == Sharding::striped ? ReorderStrategy::striped : ReorderStrategy::dual_chunk_swap, cp_size, len,
            sharding == Sharding::striped ? std::optional<int>(stripe) : std::nullopt);
      }
      for (int r = 0; r < cp_size; ++r) {
        // Contiguous splits [L*r/P, L*(r+1)/P); the balanced ones are even.
        const index_t begin = len * r / cp_size, end = len * (r + 1) / cp_size;
        const auto u = static_cast<std::size_t>(r);
        local_offsets_[u].push_back(local_tokens_[u]);
        maps_[u].append(static_cast<index_t>(b),
                        std::span<const index_t>(perm).subspan(static_cast<std::size_t>(begin),
                                                               static_cast<std::size_t>(end - begin)));
        if (layout == Layout::thd) {
          local_tokens_[u] += end - begin;
        } else if (b == 0) {
          local_tokens_[u] = end - begin;
        }
      }
    }
  }

  std::size_t checked_rank(int rank) const {
    detail::require(rank >= 0 && rank < cp_size_, "ShardLayout: rank ", rank, " outside [0, ", cp_size_, ")");
    return static_cast<std::size_t>(rank);
  }

  template <class T>
  Tensor<std::remove_cv_t<T>> gather_axis(TensorView<T> global, int rank, int axis) const {
    const int r = axis < 0 ? axis + global.rank() : axis;
    detail::require(r >= 0 && r < global.rank(), "ShardLayout::shard: axis ", axis, " out of range for shape ",
                    global.shape());
    const bool bshd = layout_ == Layout::bshd;
    detail::require(global.extent(r) == (bshd ? (batch() > 0 ? global_len(0) : global.extent(r)) : global_tokens()),
                    "ShardLayout::shard: axis ", axis, " of ", global.shape(), " must hold the ",
                    bshd ? "sequence length " : "packed tokens ",
                    bshd && batch() > 0 ? global_len(0) : global_tokens());
    Extents shape = global.shape();
    Extents out_shape;
    for (int d = 0; d < shape.rank(); ++d) out_shape.push_back(d == r ? local_tokens(rank) : shape[d]);
    Tensor<std::remove_cv_t<T>> out(out_shape);
    TensorView<std::remove_cv_t<T>> ov = out.view();
    // For each local token: copy the global slice at its global index.
    std::vector<index_t> src_of(static_cast<std::size_t>(local_tokens(rank)));
    if (bshd) {
      for (index_t i = 0; i < local_tokens(rank); ++i) src_of[static_cast<std::size_t>(i)] = global_token(rank, 0, i);
    } else {
      for (index_t b = 0; b < batch(); ++b) {
        for (index_t i = 0; i < local_len(rank, b); ++i) {
          src_of[static_cast<std::size_t>(local_offset(rank, b) + i)] = global_token(rank, b, i);
        }
      }
    }
    std::vector<index_t> idx(static_cast<std::size_t>(ov.rank()), 0);
    for (index_t flat = 0; flat < ov.size(); ++flat) {
      const index_t at = idx[static_cast<std::size_t>(r)];
      idx[static_cast<std::size_t>(r)] = src_of[static_cast<std::size_t>(at)];
      out.data()[flat] = global.at(idx);
      idx[static_cast<std::size_t>(r)] = at;
      for (int d = ov.rank() - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < ov.extent(d)) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
    return out;
  }

  Layout layout_;
  int cp_size_;
  Sharding sharding_;
  int stripe_;
  std::vector<index_t> global_len_;
  std::vector<index_t> global_offsets_;
  std::vector<TokenMap> maps_;
  std::vector<index_t> local_tokens_;
  std::vector<std::vector<index_t>> local_offsets_;
};

// Every rank's keys, concatenated per sequence in rank order: the key side
// of the all-gather algorithm.
inline TokenMap gathered_map(const ShardLayout& layout) {
  TokenMap m;
  m.positions.resize(static_cast<std::size_t>(layout.batch()));
  m.runs.resize(static_cast<std::size_t>(layout.batch()));
  m.global_len = layout.global_lengths().q;
  for (index_t b = 0; b < layout.batch(); ++b) {
    for (int r = 0; r < layout.cp_size(); ++r) m.append(b, layout.map(r).positions[static_cast<std::size_t>(b)]);
  }
  return m;
}

// A mask given in global coordinates, asked in local ones: rows through
// `q`, keys through `kv`. The maps are shared so that copies (the BlockMask
// keeps one for its element predicate) stay valid.
template <MaskDescription M>
struct ShardedMask {
  static constexpr bool head_invariant = is_head_invariant<M>();
  // More rectangles than this in one tile: answer `partial` without asking.
  static constexpr index_t kMaxRectangles = 64;

  M inner;
  std::shared_ptr<const TokenMap> q;
  std::shared_ptr<const TokenMap> kv;

  MaskContext global_context(const MaskContext& ctx) const {
    const auto b = static_cast<std::size_t>(ctx.batch);
    return {ctx.batch, ctx.head, q->global_len[b], kv->global_len[b]};
  }

  bool allowed(const MaskContext& ctx, index_t qi, index_t ki) const {
    const auto b = static_cast<std::size_t>(ctx.batch);
    return inner.allowed(global_context(ctx), q->positions[b][static_cast<std::size_t>(qi)],
                         kv->positions[b][static_cast<std::size_t>(ki)]);
  }

  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    const auto b = static_cast<std::size_t>(ctx.batch);
    const auto qr = overlapping(q->runs[b], t.q_begin, t.q_end);
    const auto kr = overlapping(kv->runs[b], t.kv_begin, t.kv_end);
    if (static_cast<index_t>(qr.size()) * static_cast<index_t>(kr.size()) > kMaxRectangles) return TileClass::partial;
    const MaskContext g = global_context(ctx);
    bool any = false, all = true;
    for (const Run& a : qr) {
      const index_t qb = std::max(t.q_begin, a.local), qe = std::min(t.q_end, a.local + a.len);
      for (const Run& c : kr) {
        const index_t kb = std::max(t.kv_begin, c.local), ke = std::min(t.kv_end, c.local + c.len);
        const TileClass cls = inner.classify(g, Tile{a.global + (qb - a.local), a.global + (qe - a.local),
                                                     c.global + (kb - c.local), c.global + (ke - c.local)});
        any = any || cls != TileClass::empty;
        all = all && cls == TileClass::full;
        if (any && !all) return TileClass::partial;
      }
    }
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }

 private:
  // The runs that meet local tokens [begin, end) (runs are sorted by local).
  static std::span<const Run> overlapping(const std::vector<Run>& runs, index_t begin, index_t end) {
    auto first =
        std::upper_bound(runs.begin(), runs.end(), begin, [](index_t x, const Run& r) { return x < r.local + r.len; });
    auto last = std::lower_bound(first, runs.end(), end, [](const Run& r, index_t x) { return r.local < x; });
    return {first, last};
  }
};

}  // namespace seqattn::cp
