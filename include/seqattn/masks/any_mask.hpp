// AnyMask: a type-erased mask description.
//
// Every description in masks/ is a distinct value type, so a mask chosen at
// run time (from a config file, from Python, composed by a user) cannot name
// its type at compile time. AnyMask holds any MaskDescription behind one
// virtual wrapper and is itself a MaskDescription: it composes with `&`, `|`,
// `~`, nests inside DocumentMask / PerHeadMask, and feeds every builder and
// the attention engine.
//
//   seqattn::AnyMask m = seqattn::CausalMask{};
//   m = seqattn::AnyMask(m & ~seqattn::SlidingWindowMask{128, 0});
//   auto layout = std::make_shared<const seqattn::DocumentLayout>(seqattn::DocumentLayout::from_segment_ids(ids));
//   seqattn::AnyMask doc(seqattn::document_mask(*layout, m), layout);  // keeps the layout alive
//
// Answers are exactly those of the wrapped description: allowed and classify
// are forwarded, and so are the optional hooks, as far as a type that cannot
// change its interface at run time can carry them:
//   - kv_span is always offered: forwarded when the description has one,
//     else the always-sound "any key, no key for sure" span, which makes the
//     BlockMask builder visit every tile exactly as it would for the
//     description itself;
//   - row_bits is always offered and writes what the builders would write
//     for the description (its interval, its own row_bits, or its predicate),
//     so tile bits stay word-at-a-time for interval masks;
//   - check is forwarded;
//   - row_intervals is always offered: the description's rows as interval
//     sets when it has them, else an inexact set, on which every caller falls
//     back to what it does without the hook; so and / or / not / document of
//     AnyMasks classify row by row and write tile bits an interval at a time
//     (planning a document mask of ids that change every call stays cheap);
//   - row_interval / first_row_reaching are not offered (AnyMask cannot
//     promise interval rows for every description); an `and` of two interval
//     masks keeps its O(1) classes when composed before erasure;
//   - head and shift invariance are run-time properties (invariant_over_heads(),
//     invariant_over_shifts());
//     build_block_mask below stores one head for invariant masks, as it does
//     for invariant descriptions.
//
// Cost: one virtual call per question, a shared_ptr copy per copy. Data a
// description views (DocumentLayout, TopKLayout, spans) can be owned by the
// AnyMask through the `owner` argument.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/combinators.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/document.hpp"
#include "seqattn/masks/structural.hpp"

namespace seqattn {

namespace detail {

// The parts a composed description is made of, for the run-time questions
// below: and / or (two), not (one), document (its inner mask).
template <class M>
inline constexpr bool kTwoParts = false;
template <class A, class B>
inline constexpr bool kTwoParts<AndMask<A, B>> = true;
template <class A, class B>
inline constexpr bool kTwoParts<OrMask<A, B>> = true;
template <class M>
inline constexpr bool kNegation = false;
template <class A>
inline constexpr bool kNegation<NotMask<A>> = true;
template <class M>
inline constexpr bool kDocument = false;
template <class Inner>
inline constexpr bool kDocument<DocumentMask<Inner>> = true;

// Whether `leaf` holds for every description that and / or / not (and, with
// `into_documents`, document; else a document answers false) compose `m` of.
template <class M, class Leaf>
bool every_part(const M& m, const Leaf& leaf, bool into_documents) {
  if constexpr (kTwoParts<M>) {
    return every_part(m.a, leaf, into_documents) && every_part(m.b, leaf, into_documents);
  } else if constexpr (kNegation<M>) {
    return every_part(m.a, leaf, into_documents);
  } else if constexpr (kDocument<M>) {
    return into_documents && every_part(m.inner, leaf, into_documents);
  } else {
    return leaf(m);
  }
}

// is_head_invariant<M>(), but looking through the combinators (and document
// masks) at run time, so that AndMask<AnyMask, AnyMask> of two invariant
// AnyMasks is invariant (its compile-time answer must be false).
template <class M>
bool runtime_head_invariant(const M& m) {
  return every_part(
      m,
      [](const auto& part) {
        using P = std::remove_cvref_t<decltype(part)>;
        if constexpr (requires { part.invariant_over_heads(); }) {
          return part.invariant_over_heads();  // AnyMask
        } else {
          return is_head_invariant<P>();
        }
      },
      true);
}

// Whether m depends on kv - q (and kv_len - q_len) alone: the description's
// `shift_invariant`, looking through and / or / not and AnyMask at run time
// (a document mask is not: it knows where its segments start).
template <class M>
bool runtime_shift_invariant(const M& m) {
  return every_part(
      m,
      [](const auto& part) {
        using P = std::remove_cvref_t<decltype(part)>;
        if constexpr (requires { part.invariant_over_shifts(); }) {
          return part.invariant_over_shifts();  // AnyMask
        } else if constexpr (requires { P::shift_invariant; }) {
          return P::shift_invariant;
        } else {
          return false;
        }
      },
      false);
}

}  // namespace detail

class AnyMask {
 public:
  // A default AnyMask allows everything (FullMask), so containers of masks
  // and "no mask" arguments need no special case.
  AnyMask() : AnyMask(FullMask{}) {}

  // Wraps `mask`. `owner` is kept alive as long as any copy of this AnyMask:
  // pass the owning object of whatever `mask` views.
  // The AnyMask test comes first: checking MaskDescription<AnyMask> needs
  // AnyMask's copy constructor, and clang would recurse into this one.
  template <class M>
  requires(!std::is_same_v<std::remove_cvref_t<M>, AnyMask> && MaskDescription<M>) AnyMask(  // NOLINT
      M mask, std::shared_ptr<const void> owner = {})
      : impl_(std::make_shared<const Model<M>>(std::move(mask), std::move(owner))) {}

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const { return impl().allowed(ctx, q, kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return impl().classify(ctx, t); }
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const {
    return impl().kv_span(ctx, q_begin, q_end);
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end, std::uint64_t* words) const {
    impl().row_bits(ctx, q, kv_begin, kv_end, words);
  }
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const { return impl().row_intervals(ctx, q); }
  void check(const RaggedLengths& lengths, index_t heads) const { impl().check(lengths, heads); }

  // Whether the wrapped description answers alike for every head: its
  // head_invariant, looking through and / or / not / document of AnyMasks.
  bool invariant_over_heads() const { return impl().invariant_over_heads(); }
  // Whether it depends on kv - q alone (detail::runtime_shift_invariant).
  bool invariant_over_shifts() const { return impl().invariant_over_shifts(); }
  // Whether the wrapped description has the optional hooks (for tests and tools).
  bool has_kv_span() const { return impl().has_kv_span(); }
  bool has_interval_rows() const { return impl().has_interval_rows(); }
  const std::type_info& target_type() const { return impl().type(); }
  // The wrapped description when it is an M, else null (like std::function::target).
  template <class M>
  const M* target() const {
    const Concept& wrapped = impl();
    return wrapped.type() == typeid(M) ? &static_cast<const Model<M>&>(wrapped).mask : nullptr;
  }

 private:
  struct Concept {
    Concept() = default;
    Concept(const Concept&) = delete;
    Concept& operator=(const Concept&) = delete;
    virtual ~Concept() = default;
    virtual bool allowed(const MaskContext& ctx, index_t q, index_t kv) const = 0;
    virtual TileClass classify(const MaskContext& ctx, const Tile& t) const = 0;
    virtual KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const = 0;
    virtual void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                          std::uint64_t* words) const = 0;
    virtual KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const = 0;
    virtual void check(const RaggedLengths& lengths, index_t heads) const = 0;
    virtual bool invariant_over_heads() const = 0;
    virtual bool invariant_over_shifts() const = 0;
    virtual bool has_kv_span() const = 0;
    virtual bool has_interval_rows() const = 0;
    virtual const std::type_info& type() const = 0;
  };

  template <class M>
  struct Model final : Concept {
    M mask;
    std::shared_ptr<const void> owner;

    Model(M m, std::shared_ptr<const void> o) : mask(std::move(m)), owner(std::move(o)) {}

    bool allowed(const MaskContext& ctx, index_t q, index_t kv) const override { return mask.allowed(ctx, q, kv); }
    TileClass classify(const MaskContext& ctx, const Tile& t) const override { return mask.classify(ctx, t); }
    KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const override {
      if constexpr (HasKvSpan<M>) {
        return mask.kv_span(ctx, q_begin, q_end);
      } else {
        // Sound for any mask: no key is excluded and none is promised.
        return q_end > q_begin ? KvSpan{0, ctx.kv_len, 0, 0} : KvSpan{};
      }
    }
    void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end,
                  std::uint64_t* words) const override {
      detail::fill_row_bits(mask, ctx, q, kv_begin, kv_end, words);
    }
    KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const override {
      if constexpr (RowSetMask<M>) {
        return detail::row_set(mask, ctx, q);
      } else {
        return KvIntervalSet::inexact();
      }
    }
    void check(const RaggedLengths& lengths, index_t heads) const override {
      if constexpr (HasCheck<M>) mask.check(lengths, heads);
    }
    bool invariant_over_heads() const override { return detail::runtime_head_invariant(mask); }
    bool invariant_over_shifts() const override { return detail::runtime_shift_invariant(mask); }
    bool has_kv_span() const override { return HasKvSpan<M>; }
    bool has_interval_rows() const override { return IntervalRowMask<M>; }
    const std::type_info& type() const override { return typeid(M); }
  };

  // Null only in a moved-from AnyMask (moving steals the shared model, so that
  // a move costs no allocation); every question to it throws instead of
  // dereferencing null, and copies and assignments of it stay defined.
  const Concept& impl() const {
    if (!impl_) {
      detail::throw_invalid(
          "AnyMask: this is a moved-from AnyMask, which holds no mask; assign a mask to it "
          "before using it");
    }
    return *impl_;
  }

  std::shared_ptr<const Concept> impl_;
};

// The BlockMask of an AnyMask: like the generic builder, but a mask whose
// wrapped description is head-invariant is built once for all heads (one
// stored head), which the generic builder can only decide at compile time.
// Preferred over the template for AnyMask arguments, including inside
// plan_attention and make_attention_block_mask.
inline BlockMask build_block_mask(const AnyMask& mask, RaggedLengths lengths, index_t heads, BlockShape block = {},
                                  BlockMaskOptions options = {}) {
  if (!mask.invariant_over_heads()) return build_block_mask<AnyMask>(mask, std::move(lengths), heads, block, options);
  detail::check_mask(mask, lengths, heads);  // with the real head count: a description may check it
  return build_block_mask<AnyMask>(mask, std::move(lengths), 1, block, options);
}

}  // namespace seqattn
