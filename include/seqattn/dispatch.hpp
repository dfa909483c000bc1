// Runtime dispatch (link seqattn::dispatch, built with SEQATTN_BUILD_DISPATCH=ON).
//
// The header-only API picks its SIMD target from the caller's compile flags;
// the compiled library instead builds the Highway kernels once per target and
// runs the best one the CPU supports, so one binary (a wheel, a plugin) runs
// fast on any x86-64 machine whatever flags its TUs were compiled with.
//
// backends::Dispatched is an ordinary backend policy: everything of the
// header-only API works with it: plan_attention with any mask description,
// attention_forward / attention_backward on a plan, the one-call forward.
//
//   auto plan = seqattn::plan_attention<seqattn::backends::Dispatched>(shape, mask, options, pool.workers());
//   seqattn::attention_forward(plan, inputs, out, lse, variant, pool);
//
// What the compiled library cannot be is generic: it runs the variants it was
// compiled with (Default, Scale, Softcap, Sinks, Standard: scale, softcap and
// sinks together) on Serial or ThreadPool. Any other variant or execution
// policy is a compile-time error naming the alternative (backends::Highway in
// a TU built with SIMD flags).
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::dispatch {

// Name of the Highway target chosen for this CPU, e.g. "AVX3_DL" or "AVX2".
const char* best_simd_target();

// Whether that target runs bf16 prefill on AVX512_BF16's VDPBF16PS where the
// one-time probe finds it faster (attention/detail/bf16_dot.hpp): true on an
// AVX3_DL CPU with AVX512_BF16 (Sapphire Rapids, Zen 4/5).
bool bf16_dot_instruction();

// The targets compiled into the library that this CPU can run, best first.
std::vector<std::string> available_simd_targets();

// Tests: run `name` (one of available_simd_targets()) from now on, as if it
// were the CPU's best, so one process checks every target's kernels; an empty
// name restores the CPU's own choice. Not for concurrent use with attention
// calls; a plan made before the switch refuses to run after it.
void use_simd_target_for_test(std::string_view name);

// The tile shape of the dispatched kernel (the same on every target).
BlockShape attention_block_shape();

// The planned work of the target chosen at planning time; opaque. A plan
// remembers its target: running it elsewhere (another process's choice) is an
// error, not a silent mismatch.
struct PlannedWork {
  virtual ~PlannedWork() = default;
};

std::shared_ptr<const PlannedWork> plan_work(const AttentionShape& shape, const BlockMask& mask,
                                             const PlanOptions& options, int workers);

// `pool` null runs on the calling thread.
void forward(const PlannedWork& work, const BlockMask& mask, const detail::AttentionProblem<float>& problem,
             const variants::Standard& variant, execution::ThreadPool* pool);
void forward(const PlannedWork& work, const BlockMask& mask, const detail::AttentionProblem<bfloat16>& problem,
             const variants::Standard& variant, execution::ThreadPool* pool);
void backward(const PlannedWork& work, const BlockMask& mask, const detail::BackwardProblem<float>& problem,
              const variants::Standard& variant, execution::ThreadPool* pool);
void backward(const PlannedWork& work, const BlockMask& mask, const detail::BackwardProblem<bfloat16>& problem,
              const variants::Standard& variant, execution::ThreadPool* pool);

// The first API of the library, kept: a forward pass from a prebuilt
// BlockMask (tile bits or an element predicate, at attention_block_shape()).
void attention_forward_f32(const AttentionInputs<float>& inputs, const BlockMask& mask, TensorView<float> out,
                           TensorView<float> lse, const AttentionOptions& options = {},
                           execution::ThreadPool* pool = nullptr);
void attention_forward_bf16(const AttentionInputs<bfloat16>& inputs, const BlockMask& mask, TensorView<bfloat16> out,
                            TensorView<float> lse, const AttentionOptions& options = {},
                            execution::ThreadPool* pool = nullptr);

namespace detail {

template <class V>
inline constexpr bool kCompiledVariant =
    std::same_as<V, variants::Default> || std::same_as<V, variants::Scale> || std::same_as<V, variants::Softcap> ||
    std::same_as<V, variants::Sinks> || std::same_as<V, variants::Standard>;

template <class V>
variants::Standard to_standard(const V& v) {
  static_assert(kCompiledVariant<V>,
                "backends::Dispatched runs the variants compiled into seqattn::dispatch only: Default, Scale, "
                "Softcap, Sinks and Standard. For another score variant use backends::Highway in a translation unit "
                "built with SIMD flags.");
  if constexpr (std::same_as<V, variants::Standard>) {
    return v;
  } else if constexpr (std::same_as<V, variants::Scale>) {
    return variants::Standard{v.value, {}, {}};
  } else if constexpr (std::same_as<V, variants::Softcap>) {
    return variants::Standard{std::numeric_limits<float>::quiet_NaN(), v, {}};
  } else if constexpr (std::same_as<V, variants::Sinks>) {
    return variants::Standard{std::numeric_limits<float>::quiet_NaN(), {}, v};
  } else {
    return variants::Standard{};
  }
}

template <class Exec>
execution::ThreadPool* pool_of(Exec& exec) {
  using E = std::remove_cvref_t<Exec>;
  static_assert(std::same_as<E, execution::Serial> || std::same_as<E, execution::ThreadPool>,
                "backends::Dispatched runs on execution::Serial or execution::ThreadPool (the policies compiled into "
                "seqattn::dispatch)");
  if constexpr (std::same_as<E, execution::ThreadPool>) {
    return &exec;
  } else {
    return nullptr;
  }
}

}  // namespace detail
}  // namespace seqattn::dispatch

namespace seqattn::backends {

// The Highway backend of the best target for the running CPU.
struct Dispatched {
  using Work = std::shared_ptr<const dispatch::PlannedWork>;

  static const char* name() { return "Dispatched"; }
  static BlockShape block_shape() { return dispatch::attention_block_shape(); }
  static Support supports(const AttentionShape&) { return {}; }
  static constexpr bool kSegmentIds = true;  // the CPU engine's (backends/cpu_tiled.hpp), per target
  static Work plan_work(const AttentionShape& shape, const BlockMask& mask, const PlanOptions& options, int workers) {
    return dispatch::plan_work(shape, mask, options, workers);
  }
  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const seqattn::detail::AttentionProblem<T>& problem,
                      const V& variant, Exec& exec) {
    dispatch::forward(*plan.work(), plan.block_mask(), problem, dispatch::detail::to_standard(variant),
                      dispatch::detail::pool_of(exec));
  }
  template <class Backend, class T, class V, class Exec>
  static void backward(const AttentionPlan<Backend>& plan, const seqattn::detail::BackwardProblem<T>& problem,
                       const V& variant, Exec& exec) {
    dispatch::backward(*plan.work(), plan.block_mask(), problem, dispatch::detail::to_standard(variant),
                       dispatch::detail::pool_of(exec));
  }
};

}  // namespace seqattn::backends
