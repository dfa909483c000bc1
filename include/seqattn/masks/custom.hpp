// Custom masks in one line: a predicate (batch, head, q, kv) -> bool, as
// PyTorch flex_attention's mask_mod, becomes a mask description that every
// representation and the attention engine accept.
//
//   auto mask = seqattn::mask_mod([](auto b, auto h, auto q, auto kv) { return (q - kv) % 3 == 0; });
//   auto tiled = seqattn::mask_mod(f, [](const seqattn::MaskContext& ctx, const seqattn::Tile& t) {
//     return ...;  // TileClass of the tile, see below
//   });
//
// The predicate sees the flat batch index and head of MaskContext and
// sequence-local q and kv (0 <= q < q_len, 0 <= kv < kv_len; the lengths are
// not passed: capture them when the mask needs them, e.g. for bottom-right
// alignment). It is called many times, from several threads at once during
// attention, and is copied into every BlockMask and plan built from the mask:
// capture views (spans, pointers) of data that outlives them, not owning
// containers, and keep it free of side effects.
//
// Tile classes. Without a classifier a tile is classified by scanning it with
// the predicate: a partial tile stops at the first element that disagrees
// with the first, but a full or an empty tile costs one call per element, so
// building a BlockMask calls the predicate up to q_len x kv_len times per
// sequence and head (as flex's create_block_mask evaluates every element),
// plus one call per element of each partial tile for its bits. A classifier
// `(const MaskContext&, const Tile&) -> TileClass` replaces the scan and is
// trusted: it must be sound (`full` only if every element of the tile is
// allowed, `empty` only if none is; `partial` is always safe). An unsound
// answer makes kernels skip allowed keys or attend masked ones, so it is
// checked against a scan
//   - on every call when `verify` is set: the default in builds without
//     NDEBUG (Debug), or explicitly with `.verified()` in any build;
//   - for a whole grid of tiles by check_tile_classes(mask, lengths, heads,
//     block), meant for a user's tests (it checks any description);
// and a lie then throws seqattn::invalid_argument naming the sequence, head,
// tile, the claimed class and an element that contradicts it.
//
// mask_mod descriptions compose with every other description: a & b, a | b, ~a.
#pragma once

#include <algorithm>
#include <concepts>
#include <optional>
#include <type_traits>
#include <utility>

#include "seqattn/core/error.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// The classifier of a mask_mod built without one: tiles are scanned.
struct ScanTiles {};

template <class F>
concept MaskModFunction = std::copy_constructible<F> && requires(const F& f, index_t i) {
  { f(i, i, i, i) } -> std::convertible_to<bool>;
};

template <class C>
concept TileClassifier = std::copy_constructible<C> && requires(const C& c, const MaskContext& ctx, const Tile& t) {
  { c(ctx, t) } -> std::convertible_to<TileClass>;
};

namespace detail {

// Lambdas that capture are copy-constructible but not copy-assignable, and
// MaskDescription asks for std::copyable: assignment re-constructs in place.
template <class F>
class AssignableFn {
 public:
  explicit AssignableFn(F f) : f_(std::move(f)) {}
  AssignableFn(const AssignableFn&) = default;
  AssignableFn(AssignableFn&&) = default;
  AssignableFn& operator=(const AssignableFn& other) {
    if (this != &other) f_.emplace(*other.f_);
    return *this;
  }
  AssignableFn& operator=(AssignableFn&& other) noexcept(std::is_nothrow_move_constructible_v<F>) {
    if (this != &other) f_.emplace(std::move(*other.f_));
    return *this;
  }
  ~AssignableFn() = default;
  const F& get() const { return *f_; }

 private:
  std::optional<F> f_;
};

inline const char* tile_class_name(TileClass c) {
  return c == TileClass::full ? "full" : c == TileClass::partial ? "partial" : "empty";
}

// The first element of the tile that contradicts `claimed`, if any: a masked
// element of a `full` tile or an allowed element of an `empty` one.
template <MaskDescription M>
bool find_contradiction(const M& mask, const MaskContext& ctx, const Tile& t, TileClass claimed, index_t& q_out,
                        index_t& kv_out) {
  if (claimed == TileClass::partial) return false;
  const bool want = claimed == TileClass::full;
  for (index_t q = t.q_begin; q < t.q_end; ++q) {
    for (index_t kv = t.kv_begin; kv < t.kv_end; ++kv) {
      if (static_cast<bool>(mask.allowed(ctx, q, kv)) != want) {
        q_out = q;
        kv_out = kv;
        return true;
      }
    }
  }
  return false;
}

template <MaskDescription M>
void require_sound_class(const M& mask, const MaskContext& ctx, const Tile& t, TileClass claimed, const char* who) {
  index_t q = 0, kv = 0;
  if (!find_contradiction(mask, ctx, t, claimed, q, kv)) return;
  throw_invalid(who, ": tile (q [", t.q_begin, ", ", t.q_end, "), kv [", t.kv_begin, ", ", t.kv_end, ")) of sequence ",
                ctx.batch, ", head ", ctx.head, " (lengths q ", ctx.q_len, ", kv ", ctx.kv_len, ") is classified ",
                tile_class_name(claimed), " but element (q ", q, ", kv ", kv, ") is ",
                claimed == TileClass::full ? "masked" : "allowed",
                "; a classifier may answer full only if every element is allowed, empty only if none is "
                "(partial is always sound)");
}

}  // namespace detail

template <MaskModFunction F, class C = ScanTiles>
requires std::same_as<C, ScanTiles> || TileClassifier<C>
struct MaskMod {
  static constexpr bool has_classifier = !std::same_as<C, ScanTiles>;

  detail::AssignableFn<F> mod;
  detail::AssignableFn<C> classifier;
  // Check every classifier answer against a scan (see the top of the file).
#ifdef NDEBUG
  bool verify = false;
#else
  bool verify = true;
#endif

  MaskMod(F f, C c) : mod(std::move(f)), classifier(std::move(c)) {}

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return static_cast<bool>(mod.get()(ctx.batch, ctx.head, q, kv));
  }

  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    if constexpr (has_classifier) {
      const auto claimed = static_cast<TileClass>(classifier.get()(ctx, t));
      if (verify) detail::require_sound_class(*this, ctx, t, claimed, "mask_mod classifier");
      return claimed;
    } else {
      // The first element says what the rest must be for the tile to be
      // full or empty; the first one that differs makes it partial.
      const bool first = allowed(ctx, t.q_begin, t.kv_begin);
      for (index_t q = t.q_begin; q < t.q_end; ++q) {
        for (index_t kv = q == t.q_begin ? t.kv_begin + 1 : t.kv_begin; kv < t.kv_end; ++kv) {
          if (allowed(ctx, q, kv) != first) return TileClass::partial;
        }
      }
      return first ? TileClass::full : TileClass::empty;
    }
  }

  // This description with every classifier answer checked, in any build.
  MaskMod verified() const {
    MaskMod m = *this;
    m.verify = true;
    return m;
  }
};

// A mask from a predicate (batch, head, q, kv) -> bool; tiles are scanned.
template <MaskModFunction F>
MaskMod<F> mask_mod(F f) {
  return MaskMod<F>(std::move(f), ScanTiles{});
}

// The same with a trusted tile classifier (const MaskContext&, const Tile&) -> TileClass.
template <MaskModFunction F, TileClassifier C>
MaskMod<F, C> mask_mod(F f, C classify) {
  return MaskMod<F, C>(std::move(f), std::move(classify));
}

// Classifies every tile of a block x block grid over each sequence and head
// (once per sequence for head-invariant masks) and throws
// seqattn::invalid_argument at the first unsound class (see require_sound_class).
// Costs one predicate call per element of each full or empty tile: a check
// for tests, not for the hot path.
template <MaskDescription M>
void check_tile_classes(const M& mask, const RaggedLengths& lengths, index_t heads, BlockShape block = {}) {
  detail::require_block_shape(block);
  detail::check_mask(mask, lengths, heads);
  const index_t stored_heads = is_head_invariant<M>() ? 1 : heads;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const index_t q_len = lengths.q[static_cast<std::size_t>(b)], kv_len = lengths.kv[static_cast<std::size_t>(b)];
    for (index_t h = 0; h < stored_heads; ++h) {
      const MaskContext ctx{b, h, q_len, kv_len};
      for (index_t q0 = 0; q0 < q_len; q0 += block.q) {
        for (index_t kv0 = 0; kv0 < kv_len; kv0 += block.kv) {
          const Tile t{q0, std::min(q_len, q0 + block.q), kv0, std::min(kv_len, kv0 + block.kv)};
          detail::require_sound_class(mask, ctx, t, mask.classify(ctx, t), "check_tile_classes");
        }
      }
    }
  }
}

}  // namespace seqattn
