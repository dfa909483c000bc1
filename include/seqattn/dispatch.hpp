// Runtime-dispatched entry points (link seqattn::dispatch, built with
// SEQATTN_BUILD_DISPATCH=ON). The header-only API picks its SIMD target from
// the caller's compile flags; these functions instead pick the best target
// the running CPU supports, so one binary runs fast on any x86-64 machine.
#pragma once

#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::dispatch {

// Name of the Highway target chosen for this CPU, e.g. "AVX3_ZEN4" or "AVX2".
const char* best_simd_target();

// The tile shape of the dispatched kernel: build the BlockMask with it.
BlockShape attention_block_shape();

// seqattn::attention_forward on the Highway backend of the best target, with
// the mask given as its BlockMask (built with tile bits, the default, at
// attention_block_shape()). `pool` null runs on the calling thread.
void attention_forward_f32(const AttentionInputs<float>& inputs, const BlockMask& mask, TensorView<float> out,
                           TensorView<float> lse, const AttentionOptions& options = {},
                           execution::ThreadPool* pool = nullptr);
void attention_forward_bf16(const AttentionInputs<bfloat16>& inputs, const BlockMask& mask, TensorView<bfloat16> out,
                            TensorView<float> lse, const AttentionOptions& options = {},
                            execution::ThreadPool* pool = nullptr);

}  // namespace seqattn::dispatch
