// attention_forward on a paged K/V cache (PagedAttentionInputs, declared in
// attention/inputs.hpp): the same plan and backends as contiguous inputs.
// A plan depends only on the shape (shape_of(paged) gives it), so one plan
// serves a paged and a contiguous call of the same lengths; the backend sees
// an AttentionProblem whose K/V rows are looked up through the block table.
//
// Included by the backends (backends/cpu_tiled.hpp, backends/reference.hpp,
// backends/cuda.cuh), so it is available wherever a backend is.
#pragma once

#include <type_traits>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/execution.hpp"

namespace seqattn {

template <class Backend, class T, ScoreVariant V, ExecutionPolicy Exec>
void attention_forward(const AttentionPlan<Backend>& plan, const PagedAttentionInputs<T>& inputs,
                       std::type_identity_t<TensorView<T>> out, TensorView<float> lse, const V& variant, Exec&& exec) {
  static_assert(detail::kBackendStores<Backend, T>,
                "storage must be float or seqattn::bfloat16 (or a type the backend declares in kStores)");
  const AttentionShape shape = shape_of(inputs);
  plan.require_shape(shape, "attention_forward (paged K/V)");
  detail::check_variant(variant, shape);
  const detail::AttentionProblem<T> problem = detail::make_paged_problem(inputs, shape, out, lse);
  Backend::forward(plan, problem, variant, exec);
}

template <class Backend, class T, ExecutionPolicy Exec>
void attention_forward(const AttentionPlan<Backend>& plan, const PagedAttentionInputs<T>& inputs,
                       std::type_identity_t<TensorView<T>> out, TensorView<float> lse, Exec&& exec) {
  attention_forward(plan, inputs, out, lse, variants::Default{}, exec);
}

template <class Backend, class T, ScoreVariant V = variants::Default>
void attention_forward(const AttentionPlan<Backend>& plan, const PagedAttentionInputs<T>& inputs,
                       std::type_identity_t<TensorView<T>> out, TensorView<float> lse, const V& variant = {}) {
  attention_forward(plan, inputs, out, lse, variant, execution::Serial{});
}

}  // namespace seqattn
