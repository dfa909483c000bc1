// SegmentTable: where each packed (THD) segment lives on the flat token axis.
//
// This is the hand-off between descriptors and kernels: segment i reads its
// queries from tokens [q_offsets[i], q_offsets[i] + q_lens[i]) and its keys
// and values from [kv_offsets[i], kv_offsets[i] + kv_lens[i]). Offsets are
// explicit (not a cumsum of lengths) because packed rows may hold padding
// between and after segments.
#pragma once

#include <cstdint>
#include <span>

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
};

}  // namespace seqattn
