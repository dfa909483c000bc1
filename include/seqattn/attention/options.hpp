// Options of planning, and of the one-call convenience API.
#pragma once

#include <limits>
#include <span>

#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn {

// How plan_attention partitions the work.
struct PlanOptions {
  // Split each row of tiles over this many KV chunks whose partial results
  // are merged by LSE (flash-decoding). 0 picks from the shape and the
  // number of workers.
  index_t kv_splits = 0;
  // Store the bits of each distinct partial tile in the BlockMask built from
  // a description (see BlockMaskOptions); without them partial tiles are
  // masked through the description's element predicate.
  bool store_tile_bits = true;
  // Also plan the backward pass (attention_backward): the key-major task
  // list, from the BlockMask's transpose.
  bool backward = false;
};

// Options of the one-call attention_forward(inputs, mask, out, lse, options):
// they select the score variant and the plan that call makes.
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
  // See PlanOptions::kv_splits.
  index_t kv_splits = 0;
  // A BlockMask built beforehand for this mask, these lengths and the
  // backend's block shape (Backend::block_shape()), e.g. to reuse it across
  // layers. Null: the call builds one. (Reusing an AttentionPlan also saves
  // the work partition.)
  const BlockMask* block_mask = nullptr;
};

}  // namespace seqattn
