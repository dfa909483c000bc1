// SegmentTable: where each packed (THD) segment lives on the flat token axis.
//
// This is the hand-off between descriptors and kernels: segment i reads its
// queries from tokens [q_offsets[i], q_offsets[i] + q_lens[i]) and its keys
// and values from [kv_offsets[i], kv_offsets[i] + kv_lens[i]). Offsets are
// explicit (not a cumsum of lengths) because packed rows may hold padding
// between and after segments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn {

// Non-owning view of per-segment offsets and lengths (int32, as kernels and
// cuDNN consume them).
struct SegmentTable {
  std::span<const std::int32_t> q_offsets;
  std::span<const std::int32_t> q_lens;
  std::span<const std::int32_t> kv_offsets;
  std::span<const std::int32_t> kv_lens;

  index_t size() const { return static_cast<index_t>(q_lens.size()); }

  // Throws unless the four spans agree in length and every segment lies
  // within [0, q_tokens) x [0, kv_tokens) with non-negative length.
  void validate(index_t q_tokens, index_t kv_tokens) const {
    detail::require(
        q_offsets.size() == q_lens.size() && kv_offsets.size() == q_lens.size() && kv_lens.size() == q_lens.size(),
        "SegmentTable: q_offsets, q_lens, kv_offsets and kv_lens must have one entry per segment, got ",
        q_offsets.size(), ", ", q_lens.size(), ", ", kv_offsets.size(), " and ", kv_lens.size());
    // In 64 bits: offset + length of two int32 values cannot wrap, and the
    // message parts are only computed when a check fails.
    for (std::size_t i = 0; i < q_lens.size(); ++i) {
      if (q_lens[i] < 0 || kv_lens[i] < 0) {
        detail::throw_invalid("SegmentTable: segment ", i, " has a negative length (q_lens[", i, "] = ", q_lens[i],
                              ", kv_lens[", i, "] = ", kv_lens[i], ")");
      }
      const index_t q_begin = q_offsets[i], q_end = q_begin + index_t{q_lens[i]};
      if (q_lens[i] < 0 || q_begin < 0 || q_end > q_tokens) {
        detail::throw_invalid("SegmentTable: segment ", i, " covers query tokens [", q_begin, ", ", q_end,
                              ") outside [0, ", q_tokens, ")");
      }
      const index_t kv_begin = kv_offsets[i], kv_end = kv_begin + index_t{kv_lens[i]};
      if (kv_lens[i] < 0 || kv_begin < 0 || kv_end > kv_tokens) {
        detail::throw_invalid("SegmentTable: segment ", i, " covers key/value tokens [", kv_begin, ", ", kv_end,
                              ") outside [0, ", kv_tokens, ")");
      }
    }
  }

  // Throws unless no key token belongs to two segments: the backward pass
  // writes each segment's dK and dV rows from that segment's queries alone.
  // (Query rows may never be shared: attention_geometry checks that. Key rows
  // may be shared in the forward pass, by segments that read one prefix.)
  void require_disjoint_keys(const char* who) const { require_disjoint_ranges(kv_offsets, kv_lens, who, "key/value"); }

 private:
  // Empty segments cover nothing. Ascending offsets (the usual packing) are
  // checked in one pass; any other order is sorted first.
  static void require_disjoint_ranges(std::span<const std::int32_t> offsets, std::span<const std::int32_t> lens,
                                      const char* who, const char* tokens) {
    auto fail = [&](std::size_t a, std::size_t b) {
      detail::throw_invalid(who, ": segments ", a, " and ", b, " share ", tokens, " tokens ([", offsets[a], ", ",
                            index_t{offsets[a]} + lens[a], ") and [", offsets[b], ", ", index_t{offsets[b]} + lens[b],
                            ")); every ", tokens, " token must belong to at most one segment here");
    };
    std::size_t last = lens.size();  // the previous non-empty segment
    bool ascending = true;
    for (std::size_t i = 0; i < lens.size() && ascending; ++i) {
      if (lens[i] == 0) continue;
      if (last != lens.size()) {
        if (offsets[i] < offsets[last]) {
          ascending = false;
          break;
        }
        if (offsets[i] < index_t{offsets[last]} + lens[last]) fail(last, i);
      }
      last = i;
    }
    if (ascending) return;
    std::vector<std::tuple<index_t, index_t, std::size_t>> ranges;  // begin, end, segment
    for (std::size_t i = 0; i < lens.size(); ++i) {
      if (lens[i] != 0) ranges.emplace_back(offsets[i], index_t{offsets[i]} + lens[i], i);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t r = 1; r < ranges.size(); ++r) {
      if (std::get<0>(ranges[r]) < std::get<1>(ranges[r - 1])) {
        fail(std::min(std::get<2>(ranges[r - 1]), std::get<2>(ranges[r])),
             std::max(std::get<2>(ranges[r - 1]), std::get<2>(ranges[r])));
      }
    }
  }
};

// A SegmentTable with storage of its own (tables parsed from segment ids,
// tables a plan keeps for the calls it serves).
struct OwnedSegmentTable {
  std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;

  void push_back(std::int32_t q_offset, std::int32_t q_len, std::int32_t kv_offset, std::int32_t kv_len) {
    q_offsets.push_back(q_offset);
    q_lens.push_back(q_len);
    kv_offsets.push_back(kv_offset);
    kv_lens.push_back(kv_len);
  }
  SegmentTable view() const { return {q_offsets, q_lens, kv_offsets, kv_lens}; }
};

}  // namespace seqattn
