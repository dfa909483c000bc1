// Vocabulary of sequence descriptors: mask types, token layouts, windows and
// the (q, kv) pairs every descriptor field comes in.
//
// The mask-type codes equal TransformerEngine's AttnMaskType / NVTE_Mask_Type
// and the layout codes equal TE's QKVFormat, so values can cross the boundary
// to TE-shaped runtimes unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "seqattn/core/error.hpp"

namespace seqattn {

// The six TransformerEngine mask types, with TE's integer codes.
enum class AttnMaskType : std::uint8_t {
  no_mask = 0,
  padding = 1,
  causal = 2,
  padding_causal = 3,
  causal_bottom_right = 4,
  padding_causal_bottom_right = 5,
};

constexpr bool is_padding(AttnMaskType m) {
  return m == AttnMaskType::padding || m == AttnMaskType::padding_causal ||
         m == AttnMaskType::padding_causal_bottom_right;
}
constexpr bool is_causal(AttnMaskType m) { return m != AttnMaskType::no_mask && m != AttnMaskType::padding; }
constexpr bool is_bottom_right(AttnMaskType m) {
  return m == AttnMaskType::causal_bottom_right || m == AttnMaskType::padding_causal_bottom_right;
}

// TE's canonical spelling of each mask type.
constexpr std::string_view to_string(AttnMaskType m) {
  switch (m) {
    case AttnMaskType::no_mask:
      return "no_mask";
    case AttnMaskType::padding:
      return "padding";
    case AttnMaskType::causal:
      return "causal";
    case AttnMaskType::padding_causal:
      return "padding_causal";
    case AttnMaskType::causal_bottom_right:
      return "causal_bottom_right";
    case AttnMaskType::padding_causal_bottom_right:
      return "padding_causal_bottom_right";
  }
  return "?";
}

// Accepts every spelling TE's canonicalize_attn_mask_type accepts (e.g.
// "causal_padding", "bottom_right_padding_causal"); anything else throws.
inline AttnMaskType parse_attn_mask_type(std::string_view s) {
  struct Spelling {
    std::string_view name;
    AttnMaskType type;
  };
  static constexpr Spelling kSpellings[] = {
      {"no_mask", AttnMaskType::no_mask},
      {"padding", AttnMaskType::padding},
      {"causal", AttnMaskType::causal},
      {"causal_bottom_right", AttnMaskType::causal_bottom_right},
      {"bottom_right_causal", AttnMaskType::causal_bottom_right},
      {"padding_causal", AttnMaskType::padding_causal},
      {"causal_padding", AttnMaskType::padding_causal},
      {"padding_causal_bottom_right", AttnMaskType::padding_causal_bottom_right},
      {"causal_padding_bottom_right", AttnMaskType::padding_causal_bottom_right},
      {"bottom_right_causal_padding", AttnMaskType::padding_causal_bottom_right},
      {"bottom_right_padding_causal", AttnMaskType::padding_causal_bottom_right},
  };
  for (const Spelling& sp : kSpellings) {
    if (sp.name == s) return sp.type;
  }
  detail::throw_invalid("Unsupported attn_mask_type=\"", s,
                        "\"; expected one of no_mask, padding, causal, padding_causal, causal_bottom_right, "
                        "padding_causal_bottom_right (or TE's alternative spellings)");
}

// How tokens are laid out in a batch row (codes of TE's QKVFormat).
//   bshd: one sequence per row, right-padded; descriptors are per-row lengths.
//   thd:  several variable-length segments packed in each row of length S;
//         the flat (B*S) token axis is what attention kernels see.
enum class SeqLayout : std::uint8_t { bshd = 1, thd = 2 };

constexpr std::string_view to_string(SeqLayout l) { return l == SeqLayout::bshd ? "bshd" : "thd"; }

// Sliding window (left, right) in tokens; a negative side is unbounded.
// (-1, -1), TE's normalised "no window", is the default.
struct WindowSize {
  int left = -1;
  int right = -1;

  constexpr bool unbounded() const { return left < 0 && right < 0; }
  friend constexpr bool operator==(const WindowSize&, const WindowSize&) = default;
};

// How the segment ids of a THD row may be numbered
// (docs/semantics/sequence-descriptors.md §7.2).
//   reject (the default): 1, 2, 3, ... in order of appearance; anything else
//     throws, naming the row, token and id.
//   renumber: ids may skip numbers, as TE accepts them ([1, 1, 3, 3]): they
//     must still increase along the row and stay <= max_segments_per_seq.
//     Segment id s keeps slot s-1 of the per-row seqlens / offsets (TE's
//     seqlens are indexed by id too), the slots of missing ids stay empty
//     (0 / -1), and pack_segments drops them, so the packed segments are
//     renumbered 0, 1, 2, ... exactly as TE's packing does. Decreasing ids and
//     ids above max_segments_per_seq still throw: TE silently misaligns or
//     drops those.
enum class SegmentIdGaps : std::uint8_t { reject, renumber };

// Every descriptor field is a pair: one value for the queries, one for the
// keys/values (TE's (q, kv) tuples).
template <class T>
struct QkvPair {
  T q;
  T kv;
};

}  // namespace seqattn
