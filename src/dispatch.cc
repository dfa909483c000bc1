// Compiled once per Highway target by foreach_target.h; the best target for
// the running CPU is chosen at the first call.
//
// Targets: every one Highway attains above the baseline of this TU's flags,
// AVX3_DL included (Highway 1.0.3 builds it only on request), whose body also
// carries the AVX512_BF16 pair-dot path (backends/highway_bf16-inl.h), run
// where CPUID reports the instruction.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#define SEQATTN_DISPATCH_BF16_DOT

#include "seqattn/dispatch.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

bool Bf16DotInstructionOfThisBody() { return Bf16DotKernel::kNative && Bf16DotKernel::instruction_available(); }

// The Highway backend of this target.
struct DispatchedHighway : backends::CpuTiled<FlashKernel> {
  static const char* name() { return "Highway (dispatched)"; }
};

// The work planned by this target, behind the opaque dispatch::PlannedWork.
struct TargetWork final : dispatch::PlannedWork {
  explicit TargetWork(DispatchedHighway::Work w) : work(std::move(w)) {}
  DispatchedHighway::Work work;
};

std::shared_ptr<const dispatch::PlannedWork> PlanWork(const AttentionShape& shape, const BlockMask& mask,
                                                      const PlanOptions& options, int workers) {
  return std::make_shared<const TargetWork>(DispatchedHighway::plan_work(shape, mask, options, workers));
}

const DispatchedHighway::Work& WorkOf(const dispatch::PlannedWork& planned) {
  const auto* mine = dynamic_cast<const TargetWork*>(&planned);
  detail::require(mine != nullptr, "backends::Dispatched: the plan was made for another SIMD target than ",
                  hwy::TargetName(HWY_TARGET), ", the one chosen now");
  return mine->work;
}

template <class F>
void OnPool(execution::ThreadPool* pool, F&& run) {
  if (pool) {
    run(*pool);
  } else {
    execution::Serial serial;
    run(serial);
  }
}

template <class T>
void Forward(const dispatch::PlannedWork& planned, const BlockMask& mask, const detail::AttentionProblem<T>& problem,
             const variants::Standard& variant, execution::ThreadPool* pool) {
  const DispatchedHighway::Work& work = WorkOf(planned);
  OnPool(pool, [&](auto& exec) { detail::run_tiled_forward<FlashKernel>(work.forward, mask, problem, variant, exec); });
}

template <class T>
void Backward(const dispatch::PlannedWork& planned, const BlockMask& mask, const detail::BackwardProblem<T>& problem,
              const variants::Standard& variant, execution::ThreadPool* pool) {
  const DispatchedHighway::Work& work = WorkOf(planned);
  detail::require(work.backward.has_value(),
                  "attention_backward: the plan was made without PlanOptions::backward = true");
  OnPool(pool,
         [&](auto& exec) { detail::run_tiled_backward<FlashKernel>(*work.backward, mask, problem, variant, exec); });
}

void ForwardF32(const dispatch::PlannedWork& w, const BlockMask& m, const detail::AttentionProblem<float>& p,
                const variants::Standard& v, execution::ThreadPool* pool) {
  Forward(w, m, p, v, pool);
}
void ForwardBF16(const dispatch::PlannedWork& w, const BlockMask& m, const detail::AttentionProblem<bfloat16>& p,
                 const variants::Standard& v, execution::ThreadPool* pool) {
  Forward(w, m, p, v, pool);
}
void BackwardF32(const dispatch::PlannedWork& w, const BlockMask& m, const detail::BackwardProblem<float>& p,
                 const variants::Standard& v, execution::ThreadPool* pool) {
  Backward(w, m, p, v, pool);
}
void BackwardBF16(const dispatch::PlannedWork& w, const BlockMask& m, const detail::BackwardProblem<bfloat16>& p,
                  const variants::Standard& v, execution::ThreadPool* pool) {
  Backward(w, m, p, v, pool);
}

}  // namespace HWY_NAMESPACE
}  // namespace seqattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqattn {
HWY_EXPORT(TargetNameOfThisBody);
HWY_EXPORT(Bf16DotInstructionOfThisBody);
HWY_EXPORT(PlanWork);
HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardBF16);
HWY_EXPORT(BackwardF32);
HWY_EXPORT(BackwardBF16);

namespace dispatch {
const char* best_simd_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisBody)(); }

bool bf16_dot_instruction() { return HWY_DYNAMIC_DISPATCH(Bf16DotInstructionOfThisBody)(); }

namespace {
// The compiled targets this CPU runs, read once, before use_simd_target_for_test
// can have mocked hwy::SupportedTargets().
std::int64_t runnable_targets() {
  static const std::int64_t runnable = HWY_TARGETS & hwy::SupportedTargets();
  return runnable;
}
}  // namespace

std::vector<std::string> available_simd_targets() {
  std::vector<std::string> names;
  // Highway's target bits: a lower bit is a better target.
  for (std::int64_t rest = runnable_targets(); rest != 0; rest &= rest - 1) {
    names.emplace_back(hwy::TargetName(rest & -rest));
  }
  return names;
}

void use_simd_target_for_test(std::string_view name) {
  std::int64_t chosen = 0;
  if (!name.empty()) {
    for (std::int64_t rest = runnable_targets(); rest != 0; rest &= rest - 1) {
      if (name == hwy::TargetName(rest & -rest)) chosen = rest & -rest;
    }
    seqattn::detail::require(chosen != 0, "dispatch::use_simd_target_for_test: '", name,
                             "' is not one of the targets compiled in that this CPU runs");
  } else {
    runnable_targets();  // read before any mock
  }
  hwy::SetSupportedTargetsForTest(chosen);  // 0: no mock
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

BlockShape attention_block_shape() {
  return {HWY_STATIC_DISPATCH(FlashKernel)::kBlockQ, HWY_STATIC_DISPATCH(FlashKernel)::kBlockKv};
}

std::shared_ptr<const PlannedWork> plan_work(const AttentionShape& shape, const BlockMask& mask,
                                             const PlanOptions& options, int workers) {
  return HWY_DYNAMIC_DISPATCH(PlanWork)(shape, mask, options, workers);
}

void forward(const PlannedWork& work, const BlockMask& mask, const seqattn::detail::AttentionProblem<float>& problem,
             const variants::Standard& variant, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(ForwardF32)(work, mask, problem, variant, pool);
}
void forward(const PlannedWork& work, const BlockMask& mask, const seqattn::detail::AttentionProblem<bfloat16>& problem,
             const variants::Standard& variant, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(ForwardBF16)(work, mask, problem, variant, pool);
}
void backward(const PlannedWork& work, const BlockMask& mask, const seqattn::detail::BackwardProblem<float>& problem,
              const variants::Standard& variant, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(BackwardF32)(work, mask, problem, variant, pool);
}
void backward(const PlannedWork& work, const BlockMask& mask, const seqattn::detail::BackwardProblem<bfloat16>& problem,
              const variants::Standard& variant, execution::ThreadPool* pool) {
  HWY_DYNAMIC_DISPATCH(BackwardBF16)(work, mask, problem, variant, pool);
}

namespace {
template <class T>
void forward_with_block_mask(const AttentionInputs<T>& inputs, const BlockMask& mask, TensorView<T> out,
                             TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  seqattn::detail::require(mask.has_tile_bits() || mask.has_predicate(),
                           "dispatch::attention_forward: the BlockMask must have tile bits or an element predicate");
  const std::shared_ptr<const BlockMask> borrowed(std::shared_ptr<void>{}, &mask);
  const int workers = pool ? pool->workers() : 1;
  const AttentionShape shape = shape_of(inputs);
  const variants::Standard variant{options.scale, {options.softcap}, {options.sinks}};
  seqattn::detail::check_variant(variant, shape);  // before planning allocates anything
  const auto plan = plan_attention<backends::Dispatched>(shape, borrowed, PlanOptions{options.kv_splits}, workers);
  const auto problem = seqattn::detail::make_attention_problem(inputs, plan.shape(), out, lse);
  forward(*plan.work(), plan.block_mask(), problem, variant, pool);
}
}  // namespace

void attention_forward_f32(const AttentionInputs<float>& inputs, const BlockMask& mask, TensorView<float> out,
                           TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  forward_with_block_mask(inputs, mask, out, lse, options, pool);
}

void attention_forward_bf16(const AttentionInputs<bfloat16>& inputs, const BlockMask& mask, TensorView<bfloat16> out,
                            TensorView<float> lse, const AttentionOptions& options, execution::ThreadPool* pool) {
  forward_with_block_mask(inputs, mask, out, lse, options, pool);
}
}  // namespace dispatch
}  // namespace seqattn
#endif  // HWY_ONCE
