// Compiled once per Highway target by foreach_target.h; the best target for
// the running CPU is chosen at the first call.
#include "seqattn/dispatch.hpp"

#include "seqattn/attention/detail/block_mask_predicate.hpp"
#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled.hpp"
#include "seqattn/backends/execution.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch.cc"
#include <hwy/foreach_target.h>  // must precede highway.h
#include <hwy/highway.h>

#include "seqattn/backends/highway-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqattn {
namespace HWY_NAMESPACE {

const char* TargetNameOfThisBody() { return hwy::TargetName(HWY_TARGET); }

template <class T>
void ForwardWithBlockMask(const AttentionInputs<T>& inputs, const BlockMask& mask, TensorView<T> out,
                          TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  const detail::AttentionProblem<T> problem = detail::make_attention_problem(inputs, out, lse, options);
  detail::require_matching_block_mask(mask, problem, {FlashKernel::kBlockQ, FlashKernel::kBlockKv});
  detail::require(mask.has_tile_bits(), "dispatch::attention_forward: the BlockMask must be built with tile bits");
  const detail::BlockMaskPredicate predicate{&mask};
  if (pool) {
    detail::run_tiled_attention<FlashKernel>(problem, predicate, mask, *pool);
  } else {
    execution::Serial serial;
    detail::run_tiled_attention<FlashKernel>(problem, predicate, mask, serial);
  }
}

void ForwardF32(const AttentionInputs<float>& inputs, const BlockMask& mask, TensorView<float> out,
                TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  ForwardWithBlockMask(inputs, mask, out, lse, options, pool);
}

void ForwardBF16(const AttentionInputs<bfloat16>& inputs, const BlockMask& mask, TensorView<bfloat16> out,
                 TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  ForwardWithBlockMask(inputs, mask, out, lse, options, pool);
}

}  // namespace HWY_NAMESPACE
}  // namespace seqattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqattn {
HWY_EXPORT(TargetNameOfThisBody);
HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardBF16);

namespace dispatch {
const char* best_simd_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisBody)(); }

BlockShape attention_block_shape() {
  return {HWY_STATIC_DISPATCH(FlashKernel)::kBlockQ, HWY_STATIC_DISPATCH(FlashKernel)::kBlockKv};
}

void attention_forward_f32(const AttentionInputs<float>& inputs, const BlockMask& mask, TensorView<float> out,
                           TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(ForwardF32)(inputs, mask, out, lse, options, pool);
}

void attention_forward_bf16(const AttentionInputs<bfloat16>& inputs, const BlockMask& mask, TensorView<bfloat16> out,
                            TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(ForwardBF16)(inputs, mask, out, lse, options, pool);
}
}  // namespace dispatch
}  // namespace seqattn
#endif  // HWY_ONCE
