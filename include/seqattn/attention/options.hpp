// The vocabulary of attention calls: inputs, options, and how outputs are laid out.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn {

// Q, K and V of one attention call, as strided views (nothing is copied).
//
//   BSHD (segments == nullptr): q [B, Sq, Hq, Dk], k [B, Skv, Hkv, Dk], v [B, Skv, Hkv, Dv]
//   THD  (segments != nullptr): q [Tq, Hq, Dk],    k [Tkv, Hkv, Dk],    v [Tkv, Hkv, Dv]
//
// In THD form every segment of the table is an independent sequence (varlen):
// its queries are tokens [q_offsets[i], q_offsets[i] + q_lens[i]) and its keys
// [kv_offsets[i], kv_offsets[i] + kv_lens[i]); masks see sequence-local
// coordinates with MaskContext::batch = i. Query tokens no segment covers are
// not written.
//
// Hq must be a multiple of Hkv: query head h reads key/value head h / (Hq / Hkv)
// (GQA; MQA when Hkv == 1). K and V are never copied per head.
template <class T>
struct AttentionInputs {
  TensorView<const T> q;
  TensorView<const T> k;
  TensorView<const T> v;
  const SegmentTable* segments = nullptr;
};

struct AttentionOptions {
  // Multiplies q.k; NaN (the default) means 1 / sqrt(Dk).
  float scale = std::numeric_limits<float>::quiet_NaN();
  // Logit soft-cap: scores become softcap * tanh(score / softcap) before the
  // mask and the softmax. 0 disables it.
  float softcap = 0.0f;
  // Attention sinks: one logit per query head that joins every row's softmax
  // denominator without contributing a value (gpt-oss style). Empty: none.
  // The returned LSE includes the sink.
  std::span<const float> sinks;
  // Split each row of tiles over this many KV chunks whose partial results are
  // merged by LSE (flash-decoding). 0 picks from the shape and worker count.
  index_t kv_splits = 0;
  // A BlockMask built beforehand for this mask, these lengths and the
  // backend's block shape (attention_block_shape<Backend>()), e.g. to reuse
  // it across layers. Null: the engine builds one per call.
  const BlockMask* block_mask = nullptr;
};

// Outputs:
//   out: BSHD [B, Sq, Hq, Dv]; THD [Tq, Hq, Dv]   (storage type of the inputs)
//   lse: BSHD [B, Hq, Sq];     THD [Hq, Tq]        (fp32, natural log)
// lse may be an empty view (no data) when it is not wanted. A row that no key
// may attend to gets out = 0 and lse = -inf (lse = sink when sinks are given).

}  // namespace seqattn
