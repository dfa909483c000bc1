// Shared by fuzz_any_mask and fuzz_export: a random AnyMask tree over every
// mask kind (structural, document, top-k, multi-item, dense, mask_mod,
// per-head, prefix-LM with per-sequence prefixes), composed with &, |, ~,
// nested inside DocumentMask and PerHeadMask, copied, assigned and sometimes
// moved from. Data a leaf views is owned by the AnyMask (its `owner`), so the
// tree outlives the factory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <memory>
#include <utility>
#include <vector>

#include "fuzz_common.hpp"

namespace seqattn::fuzz {

inline Alignment fuzz_alignment(FuzzedDataProvider& fdp) {
  return fdp.ConsumeBool() ? Alignment::bottom_right : Alignment::top_left;
}

inline SlidingWindowMask fuzz_window(FuzzedDataProvider& fdp, int reach = 40) {
  SlidingWindowMask w;
  w.left = fdp.ConsumeIntegralInRange<int>(-2, reach);
  w.right = fdp.ConsumeIntegralInRange<int>(-2, reach);
  w.alignment = fuzz_alignment(fdp);
  return w;
}

// Lengths of a problem: uniform (what flex, Splash and the data-driven leaves
// need) or ragged, capped so that batch * heads * q * kv stays small.
inline RaggedLengths fuzz_lengths(FuzzedDataProvider& fdp, index_t batch, index_t heads, index_t max_len,
                                  index_t max_cells) {
  RaggedLengths l;
  const bool ragged = fdp.ConsumeIntegralInRange<int>(0, 3) == 0;
  for (index_t b = 0; b < batch; ++b) {
    if (b > 0 && !ragged) {
      l.q.push_back(l.q[0]);
      l.kv.push_back(l.kv[0]);
      continue;
    }
    l.q.push_back(fdp.ConsumeIntegralInRange<index_t>(0, max_len));
    l.kv.push_back(fdp.ConsumeBool() ? l.q.back() : fdp.ConsumeIntegralInRange<index_t>(0, max_len));
  }
  for (;;) {
    index_t cells = 0;
    for (std::size_t b = 0; b < l.q.size(); ++b) cells += l.q[b] * l.kv[b] * heads;
    if (cells <= max_cells) return l;
    for (std::size_t b = 0; b < l.q.size(); ++b) {
      if (l.q[b] >= l.kv[b]) {
        l.q[b] /= 2;
      } else {
        l.kv[b] /= 2;
      }
    }
  }
}

// Builds AnyMask trees for a batch of `lengths` with `heads` heads. The
// data-driven leaves take their shape from sequence 0, so on ragged lengths
// their check() rejects the tree (a documented seqattn::invalid_argument).
class MaskFactory {
 public:
  MaskFactory(FuzzedDataProvider& fdp, RaggedLengths lengths, index_t heads, bool use_moved_from = true)
      : fdp_(fdp), lengths_(std::move(lengths)), heads_(heads), use_moved_from_(use_moved_from) {}

  // Whether some node was used after being moved from (an AnyMask in its
  // moved-from state must throw seqattn::invalid_argument, never crash).
  bool used_moved_from() const { return moved_from_; }

  AnyMask make(int depth = 0) {
    ++nodes_;
    const bool leaf = depth >= 3 || nodes_ > 12 || fdp_.ConsumeIntegralInRange<int>(0, 2) == 0;
    AnyMask m = leaf ? make_leaf(depth) : make_node(depth);
    return handle(std::move(m));
  }

 private:
  index_t batch() const { return lengths_.batch(); }
  // Sequence 0's lengths, clamped: hostile lengths (negative, huge) still get
  // small data-driven leaves, which check() then rejects.
  index_t q_len() const { return batch() > 0 ? std::clamp<index_t>(lengths_.q[0], 0, 256) : 0; }
  index_t kv_len() const { return batch() > 0 ? std::clamp<index_t>(lengths_.kv[0], 0, 256) : 0; }

  // Copies, assignments and (rarely) a use after move.
  AnyMask handle(AnyMask m) {
    switch (fdp_.ConsumeIntegralInRange<int>(0, 31)) {
      case 0: {
        AnyMask copy = m;  // NOLINT(performance-unnecessary-copy-initialization)
        return copy;
      }
      case 1: {
        AnyMask assigned;
        assigned = m;
        AnyMask moved = std::move(m);
        (void)moved;
        return assigned;
      }
      case 2: {
        if (!use_moved_from_) return m;
        AnyMask moved = std::move(m);
        moved_from_ = true;
        return m;  // NOLINT(bugprone-use-after-move): the moved-from state is what this tests
      }
      case 3: {
        AnyMask other = CausalMask{};
        other = std::move(m);
        return other;
      }
      default:
        return m;
    }
  }

  AnyMask make_node(int depth) {
    switch (fdp_.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
        return AnyMask(make(depth + 1) & make(depth + 1));
      case 1:
        return AnyMask(make(depth + 1) | make(depth + 1));
      case 2:
        return AnyMask(~make(depth + 1));
      case 3: {
        // A composition typed before erasure (keeps interval rows inside).
        const CausalMask c{fuzz_alignment(fdp_)};
        return AnyMask((c & ~fuzz_window(fdp_)) | make(depth + 1));
      }
      default: {
        // One mask per head (sometimes a wrong count: rejected by check()).
        auto masks = std::make_shared<std::vector<AnyMask>>();
        const index_t n = fdp_.ConsumeIntegralInRange<int>(0, 15) == 0 ? heads_ + 1 : heads_;
        for (index_t h = 0; h < n; ++h) masks->push_back(make(depth + 1));
        return AnyMask(PerHeadMask<AnyMask>{*masks}, masks);
      }
    }
  }

  AnyMask make_leaf(int depth) {
    switch (fdp_.ConsumeIntegralInRange<int>(0, 13)) {
      case 0:
        return FullMask{};
      case 1:
      case 2:
        return CausalMask{fuzz_alignment(fdp_)};
      case 3:
        return fuzz_window(fdp_);
      case 4: {
        ChunkedCausalMask m;
        m.chunk = fdp_.ConsumeIntegralInRange<int>(0, 50);  // 0 is rejected by check()
        m.alignment = fuzz_alignment(fdp_);
        return m;
      }
      case 5: {
        PrefixLMMask m;
        m.prefix = fdp_.ConsumeIntegralInRange<int>(-1, 110);
        m.alignment = fuzz_alignment(fdp_);
        return m;
      }
      case 6: {
        // One prefix per sequence (or a wrong count: rejected by check()).
        auto prefixes = std::make_shared<std::vector<std::int32_t>>();
        const index_t n = fdp_.ConsumeIntegralInRange<int>(0, 15) == 0 ? batch() + 1 : batch();
        for (index_t b = 0; b < n; ++b) prefixes->push_back(fdp_.ConsumeIntegralInRange<std::int32_t>(-1, 110));
        PrefixLMMask m;
        m.prefix_lengths = *prefixes;
        m.alignment = fuzz_alignment(fdp_);
        return AnyMask(m, prefixes);
      }
      case 7:
        return document(depth);
      case 8:
        return topk();
      case 9:
        return multi_item();
      case 10:
        return dense();
      case 11: {
        const index_t a = fdp_.ConsumeIntegralInRange<int>(1, 7), c = fdp_.ConsumeIntegralInRange<int>(1, 7);
        const index_t mod = fdp_.ConsumeIntegralInRange<int>(1, 5);
        return mask_mod(
            [a, c, mod](index_t b, index_t h, index_t q, index_t kv) { return (a * q + c * kv + b + h) % mod == 0; });
      }
      case 12: {
        // A predicate with a trusted, exact classifier (a band |q - kv| <= w).
        const index_t w = fdp_.ConsumeIntegralInRange<int>(0, 20);
        auto band = [w](index_t, index_t, index_t q, index_t kv) { return q - kv <= w && kv - q <= w; };
        auto classify = [w](const MaskContext&, const Tile& t) {
          if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
          // Farthest and nearest |q - kv| over the tile.
          const index_t far = std::max(t.q_end - 1 - t.kv_begin, t.kv_end - 1 - t.q_begin);
          const index_t near_lo = t.q_begin - (t.kv_end - 1), near_hi = t.kv_begin - (t.q_end - 1);
          const index_t nearest = std::max<index_t>({near_lo, near_hi, 0});
          if (far <= w) return TileClass::full;
          if (nearest > w) return TileClass::empty;
          return TileClass::partial;
        };
        return mask_mod(band, classify);
      }
      default:
        return CausalMask{} & fuzz_window(fdp_);
    }
  }

  // Segment ids over (batch, len): runs of mostly increasing ids with padding.
  std::vector<std::int32_t> ids(index_t len) {
    std::vector<std::int32_t> out(static_cast<std::size_t>(batch() * len), 0);
    for (index_t b = 0; b < batch(); ++b) {
      index_t t = 0;
      std::int32_t next = 1;
      while (t < len) {
        const index_t run = fdp_.ConsumeIntegralInRange<int>(1, 30);
        const int kind = fdp_.ConsumeIntegralInRange<int>(0, 7);
        const std::int32_t id = kind == 0 ? 0 : kind == 1 ? fdp_.ConsumeIntegralInRange<std::int32_t>(0, 3) : next++;
        for (index_t k = 0; k < run && t < len; ++k, ++t) out[static_cast<std::size_t>(b * len + t)] = id;
      }
    }
    return out;
  }

  AnyMask document(int depth) {
    const bool self = q_len() == kv_len() && fdp_.ConsumeBool();
    const std::vector<std::int32_t> q_ids = ids(q_len());
    const std::vector<std::int32_t> kv_ids = self ? q_ids : ids(kv_len());
    AnyMask inner = fdp_.ConsumeBool() ? AnyMask(CausalMask{fuzz_alignment(fdp_)}) : make(depth + 1);
    const TensorView<const std::int32_t> qi(q_ids.data(), Extents{batch(), q_len()});
    const TensorView<const std::int32_t> ki(kv_ids.data(), Extents{batch(), kv_len()});
    auto layout = std::make_shared<const DocumentLayout>(self ? DocumentLayout::from_segment_ids(qi)
                                                              : DocumentLayout::from_segment_ids(qi, ki, {}, {}));
    return AnyMask(document_mask(*layout, std::move(inner)), layout);
  }

  AnyMask topk() {
    const index_t k = fdp_.ConsumeIntegralInRange<int>(1, 6);
    std::vector<std::int32_t> idx(static_cast<std::size_t>(batch() * q_len() * k));
    for (auto& v : idx) {
      const int kind = fdp_.ConsumeIntegralInRange<int>(0, 15);
      if (kind == 0 || kv_len() == 0) {
        v = -1;
      } else if (kind == 1) {
        v = static_cast<std::int32_t>(kv_len());  // out of range: rejected
      } else {
        v = fdp_.ConsumeIntegralInRange<std::int32_t>(0, static_cast<std::int32_t>(kv_len()) - 1);
      }
    }
    auto layout = std::make_shared<const TopKLayout>(
        TopKLayout::from_indices(TensorView<const std::int32_t>(idx.data(), Extents{batch(), q_len(), k}), kv_len()));
    return AnyMask(topk_mask(*layout), layout);
  }

  AnyMask multi_item() {
    auto layout = std::make_shared<MultiItemLayout>();
    for (index_t b = 0; b < batch(); ++b) {
      if (fdp_.ConsumeBool()) {
        layout->add_causal(q_len());
      } else {
        // Packed tokens of q_len entries ending on the delimiter 1.
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(q_len()));
        for (auto& tok : tokens) tok = fdp_.ConsumeIntegralInRange<int>(0, 4) == 0 ? 1 : 0;
        if (!tokens.empty()) tokens.back() = 1;
        layout->add_packed(tokens, 1);
      }
    }
    return AnyMask(multi_item_mask(*layout), std::shared_ptr<const MultiItemLayout>(layout));
  }

  AnyMask dense() {
    const bool per_head = fdp_.ConsumeBool();
    const index_t h = per_head ? heads_ : 1;
    auto values =
        std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(batch() * h * q_len() * kv_len()));
    const int density = fdp_.ConsumeIntegralInRange<int>(0, 4);
    for (auto& v : *values) v = fdp_.ConsumeIntegralInRange<int>(0, 4) < density ? 1 : 0;
    const TensorView<const std::uint8_t> view(values->data(), Extents{batch(), h, q_len(), kv_len()});
    return AnyMask(DenseMask<std::uint8_t>{view}, values);
  }

  FuzzedDataProvider& fdp_;
  RaggedLengths lengths_;
  index_t heads_;
  bool use_moved_from_;
  int nodes_ = 0;
  bool moved_from_ = false;
};

// Class of every tile of a (block.q x block.kv) grid against a scan, kv_span
// soundness, row_bits against allowed, head invariance, for a mask that
// passed check().
template <class M>
void check_classes(const M& mask, const RaggedLengths& lengths, index_t heads, BlockShape block,
                   bool invariant_over_heads) {
  std::vector<std::uint64_t> words;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const index_t q_len = lengths.q[static_cast<std::size_t>(b)], kv_len = lengths.kv[static_cast<std::size_t>(b)];
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, q_len, kv_len};
      for (index_t q0 = 0; q0 < q_len; q0 += block.q) {
        const index_t q1 = std::min(q_len, q0 + block.q);
        const KvSpan span = mask.kv_span(ctx, q0, q1);
        for (index_t kv0 = 0; kv0 < kv_len; kv0 += block.kv) {
          const Tile t{q0, q1, kv0, std::min(kv_len, kv0 + block.kv)};
          const TileClass got = mask.classify(ctx, t), brute = detail::classify_by_scan(mask, ctx, t);
          FUZZ_CHECK(got == TileClass::partial || got == brute,
                     "b=%lld h=%lld tile q[%lld,%lld) kv[%lld,%lld): classify says %d, scan says %d", (long long)b,
                     (long long)h, (long long)t.q_begin, (long long)t.q_end, (long long)t.kv_begin, (long long)t.kv_end,
                     int(got), int(brute));
        }
        for (index_t q = q0; q < q1; ++q) {
          const index_t kv_begin = 0, kv_end = kv_len;
          words.assign(static_cast<std::size_t>((kv_end - kv_begin + 63) / 64 + 1), 0);
          mask.row_bits(ctx, q, kv_begin, kv_end, words.data());
          for (index_t kv = 0; kv < kv_len; ++kv) {
            const bool want = mask.allowed(ctx, q, kv);
            const bool bit = (words[static_cast<std::size_t>(kv / 64)] >> (kv % 64)) & 1u;
            FUZZ_CHECK(bit == want, "row_bits b=%lld h=%lld q=%lld kv=%lld is %d, allowed says %d", (long long)b,
                       (long long)h, (long long)q, (long long)kv, int(bit), int(want));
            if (want) {
              FUZZ_CHECK(kv >= span.any_begin && kv < span.any_end,
                         "kv_span b=%lld h=%lld q[%lld,%lld): allowed key %lld outside any [%lld, %lld)", (long long)b,
                         (long long)h, (long long)q0, (long long)q1, (long long)kv, (long long)span.any_begin,
                         (long long)span.any_end);
            } else {
              FUZZ_CHECK(!(kv >= span.all_begin && kv < span.all_end),
                         "kv_span b=%lld h=%lld q[%lld,%lld): masked key %lld inside all [%lld, %lld)", (long long)b,
                         (long long)h, (long long)q0, (long long)q1, (long long)kv, (long long)span.all_begin,
                         (long long)span.all_end);
            }
            if (invariant_over_heads && h > 0) {
              FUZZ_CHECK(mask.allowed(MaskContext{b, 0, q_len, kv_len}, q, kv) == want,
                         "invariant_over_heads() but head %lld differs from head 0 at b=%lld q=%lld kv=%lld",
                         (long long)h, (long long)b, (long long)q, (long long)kv);
            }
          }
          // Bits past kv_end stay clear.
          for (index_t c = kv_end - kv_begin; c < static_cast<index_t>(words.size()) * 64; ++c) {
            FUZZ_CHECK(!((words[static_cast<std::size_t>(c / 64)] >> (c % 64)) & 1u),
                       "row_bits set bit %lld past the end", (long long)c);
          }
        }
      }
    }
  }
}

}  // namespace seqattn::fuzz
