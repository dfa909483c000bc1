// Random mask cases of every kind for the accelerator backends' host tests
// (tests/cuda/*.cpp): each case is a mask, the lengths it was built for and a
// head count. Lengths like to sit on and around the 64/128-token tile edges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/masks.hpp"

namespace seqattn_test_random_masks {

using namespace seqattn;

inline index_t pick(std::mt19937& rng, index_t lo, index_t hi) {
  return std::uniform_int_distribution<index_t>(lo, hi)(rng);
}

// Ragged lengths that like to sit on and around the tile edges (and 0).
inline index_t pick_len(std::mt19937& rng, index_t max_len) {
  static constexpr index_t kEdges[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257};
  if (pick(rng, 0, 2) == 0) {
    const index_t e = kEdges[pick(rng, 0, static_cast<index_t>(std::size(kEdges)) - 1)];
    if (e <= max_len) return e;
  }
  return pick(rng, 0, max_len);
}

inline Alignment pick_alignment(std::mt19937& rng) {
  return pick(rng, 0, 1) ? Alignment::top_left : Alignment::bottom_right;
}

struct MaskCase {
  std::string name;
  AnyMask mask;
  RaggedLengths lengths;
  index_t heads = 1;
};

inline RaggedLengths ragged(std::mt19937& rng, index_t batch, index_t max_len, bool square) {
  RaggedLengths l;
  for (index_t b = 0; b < batch; ++b) {
    l.q.push_back(pick_len(rng, max_len));
    l.kv.push_back(square ? l.q.back() : pick_len(rng, max_len));
  }
  return l;
}

inline AnyMask random_structural(std::mt19937& rng) {
  switch (pick(rng, 0, 4)) {
    case 0:
      return CausalMask{pick_alignment(rng)};
    case 1:
      return SlidingWindowMask{pick(rng, -1, 200), pick(rng, -1, 90), pick_alignment(rng)};
    case 2:
      return ChunkedCausalMask{pick(rng, 1, 200), pick_alignment(rng)};
    case 3:
      return PrefixLMMask{pick(rng, 0, 300), {}, pick_alignment(rng)};
    default:
      return FullMask{};
  }
}

// Every mask kind of masks/: structural, document, multi-item, top-k,
// combinators, and head-varying ones (per-head, mask_mod on the head).
inline MaskCase random_mask_case(std::mt19937& rng, index_t max_len) {
  MaskCase c;
  c.heads = pick(rng, 1, 8);
  const index_t batch = pick(rng, 1, 4);
  const int kind = static_cast<int>(pick(rng, 0, 11));
  switch (kind) {
    case 0:
      c.name = "full";
      c.mask = FullMask{};
      c.lengths = ragged(rng, batch, max_len, false);
      break;
    case 1:
      c.name = "causal";
      c.mask = CausalMask{pick_alignment(rng)};
      c.lengths = ragged(rng, batch, max_len, false);
      break;
    case 2:
      c.name = "sliding window";
      c.mask = SlidingWindowMask{pick(rng, -1, 200), pick(rng, -1, 90), pick_alignment(rng)};
      c.lengths = ragged(rng, batch, max_len, false);
      break;
    case 3:
      c.name = "chunked causal";
      c.mask = ChunkedCausalMask{pick(rng, 1, 200), pick_alignment(rng)};
      c.lengths = ragged(rng, batch, max_len, false);
      break;
    case 4: {
      c.name = "prefix-lm";
      c.lengths = ragged(rng, batch, max_len, false);
      if (pick(rng, 0, 1)) {
        c.mask = PrefixLMMask{pick(rng, 0, 300), {}, pick_alignment(rng)};
      } else {
        auto prefixes = std::make_shared<std::vector<std::int32_t>>();
        for (index_t b = 0; b < batch; ++b) prefixes->push_back(static_cast<std::int32_t>(pick(rng, 0, 300)));
        c.mask = AnyMask(PrefixLMMask{0, *prefixes, pick_alignment(rng)}, prefixes);
      }
      break;
    }
    case 5: {
      // Documents with padding (id 0) between and after them.
      c.name = "document";
      const index_t tokens = pick_len(rng, max_len);
      auto ids = std::make_shared<std::vector<std::int32_t>>();
      for (index_t b = 0; b < batch; ++b) {
        std::int32_t id = 1;
        index_t t = 0;
        while (t < tokens) {
          const index_t len = pick(rng, 1, 150);
          const std::int32_t v = pick(rng, 0, 4) == 0 ? 0 : id++;
          for (index_t i = 0; i < len && t < tokens; ++i, ++t) ids->push_back(v);
        }
      }
      auto layout = std::make_shared<const DocumentLayout>(
          DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids->data(), Extents{batch, tokens})));
      auto owner = std::make_shared<std::pair<decltype(ids), decltype(layout)>>(ids, layout);
      c.lengths = layout->lengths();
      switch (pick(rng, 0, 2)) {
        case 0:
          c.mask = AnyMask(document_mask(*layout), owner);
          break;
        case 1:
          c.mask = AnyMask(document_mask(*layout, CausalMask{}), owner);
          break;
        default:
          c.name += " & window";
          c.mask = AnyMask(document_mask(*layout, CausalMask{}) & SlidingWindowMask{pick(rng, 0, 150), 0}, owner);
          break;
      }
      break;
    }
    case 6: {
      c.name = "multi-item";
      auto layout = std::make_shared<MultiItemLayout>();
      for (index_t b = 0; b < batch; ++b) {
        if (pick(rng, 0, 3) == 0) {
          layout->add_causal(pick_len(rng, max_len));
        } else {
          std::vector<index_t> items(static_cast<std::size_t>(pick(rng, 1, 6)));
          for (auto& n : items) n = pick(rng, 0, max_len / 6);
          layout->add_items(pick(rng, 1, max_len / 3 + 1), items);
        }
      }
      c.lengths = layout->lengths();
      c.mask = AnyMask(multi_item_mask(*layout), layout);
      break;
    }
    case 7: {
      c.name = "top-k";
      const index_t t = pick_len(rng, max_len), s = pick_len(rng, max_len);
      const index_t k = pick(rng, 1, 48);
      auto idx = std::make_shared<std::vector<std::int32_t>>();
      std::vector<std::int32_t> keys(static_cast<std::size_t>(s));
      for (index_t r = 0; r < batch * t; ++r) {
        std::iota(keys.begin(), keys.end(), 0);
        // Local picks (near the diagonal) make some tiles full-ish, far ones scatter.
        std::shuffle(keys.begin(), keys.end(), rng);
        for (index_t j = 0; j < k; ++j) {
          idx->push_back(j < s && pick(rng, 0, 7) != 0 ? keys[static_cast<std::size_t>(j)] : -1);
        }
      }
      auto layout = std::make_shared<const TopKLayout>(
          TopKLayout::from_indices(TensorView<const std::int32_t>(idx->data(), Extents{batch, t, k}), s));
      c.lengths = layout->lengths();
      if (pick(rng, 0, 1)) {
        c.mask = AnyMask(topk_mask(*layout), layout);
      } else {
        c.name += " | causal";
        c.mask = AnyMask(topk_mask(*layout) | CausalMask{Alignment::bottom_right}, layout);
      }
      break;
    }
    case 8: {
      c.lengths = ragged(rng, batch, max_len, false);
      const Alignment a = pick_alignment(rng);
      switch (pick(rng, 0, 3)) {
        case 0:
          c.name = "causal & window";
          c.mask = CausalMask{a} & SlidingWindowMask{pick(rng, 0, 200), pick(rng, -1, 50), a};
          break;
        case 1:
          // Two full ranges per row with partial tiles between and around them.
          c.name = "causal | ~window";
          c.mask = CausalMask{a} | ~SlidingWindowMask{pick(rng, 0, 200), pick(rng, 0, 200), a};
          break;
        case 2:
          c.name = "~causal";
          c.mask = ~CausalMask{a};
          break;
        default:
          c.name = "window | chunked";
          c.mask = SlidingWindowMask{pick(rng, 0, 100), 0, a} | ChunkedCausalMask{pick(rng, 1, 300), a};
          break;
      }
      break;
    }
    case 9: {
      // Head-varying: one description per head, of different kinds.
      c.name = "per-head";
      c.lengths = ragged(rng, batch, max_len, false);
      auto masks = std::make_shared<std::vector<AnyMask>>();
      for (index_t h = 0; h < c.heads; ++h) masks->push_back(random_structural(rng));
      if (pick(rng, 0, 2) == 0) {
        c.name += " & causal";
        c.mask = AnyMask(PerHeadMask<AnyMask>{*masks} & CausalMask{Alignment::bottom_right}, masks);
      } else {
        c.mask = AnyMask(PerHeadMask<AnyMask>{*masks}, masks);
      }
      break;
    }
    case 10: {
      // Head-varying predicate (tiles are classified by scanning it).
      c.name = "mask_mod(head)";
      c.lengths = ragged(rng, batch, max_len, pick(rng, 0, 1) == 0);
      c.mask = mask_mod([](index_t b, index_t h, index_t q, index_t kv) {
        return kv <= q + 48 * h && (q / 29 + kv / 70 + h + b) % 3 != 0;
      });
      break;
    }
    default: {
      // Head-invariant mask_mod: mostly full or empty tiles with scattered holes.
      c.name = "mask_mod(stripes)";
      c.lengths = ragged(rng, batch, max_len, false);
      c.mask =
          mask_mod([](index_t, index_t, index_t q, index_t kv) { return (q / 100 + kv / 90) % 2 == 0 || q == kv; });
      break;
    }
  }
  return c;
}

}  // namespace seqattn_test_random_masks
