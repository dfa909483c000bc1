// Compiled once per Highway target by foreach_target.h; the best target for
// the running CPU is chosen at the first call.
#include "seqattn/dispatch.hpp"

#include <memory>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/backends/cpu_tiled.hpp"
#include "seqattn/core/execution.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch.cc"
#include <hwy/foreach_target.h>  // must precede highway.h
#include <hwy/highway.h>

#include "seqattn/backends/highway-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqattn {
namespace HWY_NAMESPACE {

const char* TargetNameOfThisBody() { return hwy::TargetName(HWY_TARGET); }

// The Highway backend of this target.
struct DispatchedHighway : backends::CpuTiled<FlashKernel> {
  static const char* name() { return "Highway (dispatched)"; }
};

template <class T>
void ForwardWithBlockMask(const AttentionInputs<T>& inputs, const BlockMask& mask, TensorView<T> out,
                          TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  detail::require(mask.has_tile_bits() || mask.has_predicate(),
                  "dispatch::attention_forward: the BlockMask must have tile bits or an element predicate");
  const AttentionShape shape = shape_of(inputs);
  const int workers = pool ? pool->workers() : 1;
  const std::shared_ptr<const BlockMask> borrowed(std::shared_ptr<void>{}, &mask);
  const auto plan = plan_attention<DispatchedHighway>(shape, borrowed, PlanOptions{options.kv_splits}, workers);
  const variants::Standard variant{options.scale, {options.softcap}, {options.sinks}};
  detail::check_variant(variant, shape);
  const detail::AttentionProblem<T> problem = detail::make_attention_problem(inputs, shape, out, lse);
  if (pool) {
    DispatchedHighway::forward(plan, problem, variant, *pool);
  } else {
    execution::Serial serial;
    DispatchedHighway::forward(plan, problem, variant, serial);
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
