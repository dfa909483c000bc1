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
    for (std::size_t i = 0; i < q_lens.size(); ++i) {
      detail::require(q_lens[i] >= 0 && q_offsets[i] >= 0 && q_offsets[i] + q_lens[i] <= q_tokens,
                      "SegmentTable: segment ", i, " covers query tokens [", q_offsets[i], ", ",
                      q_offsets[i] + q_lens[i], ") outside [0, ", q_tokens, ")");
      detail::require(kv_lens[i] >= 0 && kv_offsets[i] >= 0 && kv_offsets[i] + kv_lens[i] <= kv_tokens,
                      "SegmentTable: segment ", i, " covers key/value tokens [", kv_offsets[i], ", ",
                      kv_offsets[i] + kv_lens[i], ") outside [0, ", kv_tokens, ")");
    }
  }
};

}  // namespace seqattn
