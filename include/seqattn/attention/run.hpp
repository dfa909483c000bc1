// Running a plan: attention_forward and attention_backward on inputs of the
// shape the plan was made for, on any backend (CPU or Cuda). This header has
// no Highway dependency, so device code (nvcc) can include it; the one-call
// API that plans as well lives in seqattn/attention.hpp.
#pragma once

#include <span>
#include <type_traits>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/execution.hpp"

namespace seqattn {

namespace detail {
// Storage types a backend computes on: float and bfloat16, or what the
// backend lists in `template <class T> static constexpr bool kStores`.
template <class Backend, class T>
inline constexpr bool kBackendStores = [] {
  if constexpr (requires { Backend::template kStores<T>; }) {
    return Backend::template kStores<T>;
  } else {
    return std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;
  }
}();
}  // namespace detail

// What attention_forward runs on: contiguous inputs (AttentionInputs) or
// queries over a paged K/V cache (PagedAttentionInputs). A plan depends only
// on the shape (shape_of gives it for both), so one plan serves a paged and
// a contiguous call of the same lengths; the backend sees an AttentionProblem
// whose K/V rows are, for a paged cache, looked up through the block table.
namespace detail {
template <class In>
inline constexpr bool kForwardInputs = false;
template <class T>
inline constexpr bool kForwardInputs<AttentionInputs<T>> = true;
template <class T>
inline constexpr bool kForwardInputs<PagedAttentionInputs<T>> = true;

template <class T>
AttentionProblem<T> forward_problem(const AttentionInputs<T>& in, const AttentionShape& shape, TensorView<T> out,
                                    TensorView<float> lse) {
  return make_attention_problem(in, shape, out, lse);
}
template <class T>
AttentionProblem<T> forward_problem(const PagedAttentionInputs<T>& in, const AttentionShape& shape, TensorView<T> out,
                                    TensorView<float> lse) {
  return make_paged_problem(in, shape, out, lse);
}

// Whether a backend runs calls with segment ids (AttentionInputs::segment_ids):
// it declares `static constexpr bool kSegmentIds = true`.
template <class Backend>
inline constexpr bool kTakesSegmentIds = [] {
  if constexpr (requires { Backend::kSegmentIds; }) {
    return Backend::kSegmentIds;
  } else {
    return false;
  }
}();

template <class Backend, class In>
void require_segment_ids_support(const In& inputs, const char* who) {
  if constexpr (requires { inputs.segment_ids; }) {
    require(inputs.segment_ids == nullptr || kTakesSegmentIds<Backend>, who, ": backend ", Backend::name(),
            " takes no segment ids operand; give the ids as a document mask when planning instead");
  }
}
}  // namespace detail

// Runs a plan on inputs of the shape it was made for.
template <class Backend, template <class> class In, class T, ScoreVariant V, ExecutionPolicy Exec>
requires detail::kForwardInputs<In<T>>
void attention_forward(const AttentionPlan<Backend>& plan, const In<T>& inputs, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const V& variant, Exec&& exec) {
  static_assert(detail::kBackendStores<Backend, T>,
                "storage must be float or seqattn::bfloat16 (or a type the backend declares in kStores)");
  constexpr bool kPaged = std::is_same_v<In<T>, PagedAttentionInputs<T>>;
  const AttentionShape shape = shape_of(inputs);
  plan.require_shape(shape, kPaged ? "attention_forward (paged K/V)" : "attention_forward");
  detail::require_segment_ids_support<Backend>(inputs, "attention_forward");
  detail::check_variant(variant, shape);
  const detail::AttentionProblem<T> problem = detail::forward_problem(inputs, shape, out, lse);
  Backend::forward(plan, problem, variant, exec);
}

template <class Backend, template <class> class In, class T, ExecutionPolicy Exec>
requires detail::kForwardInputs<In<T>>
void attention_forward(const AttentionPlan<Backend>& plan, const In<T>& inputs, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, Exec&& exec) {
  attention_forward(plan, inputs, out, lse, variants::Default{}, exec);
}

template <class Backend, template <class> class In, class T, ScoreVariant V = variants::Default>
requires detail::kForwardInputs<In<T>>
void attention_forward(const AttentionPlan<Backend>& plan, const In<T>& inputs, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const V& variant = {}) {
  attention_forward(plan, inputs, out, lse, variant, execution::Serial{});
}

// ---- Backward -----------------------------------------------------------------

// Gradients of q, k and v (each the shape of its input), and optionally of
// the variant's sink logits (one per query head).
template <class T>
struct AttentionGrads {
  TensorView<T> dq;
  TensorView<T> dk;
  TensorView<T> dv;
  std::span<float> dsinks = {};
};

template <class B>
concept BackwardBackend = AttentionBackend<B> &&
    requires(const AttentionPlan<B>& plan, const detail::BackwardProblem<float>& p, const variants::Default& v,
             execution::Serial& exec) {
  B::backward(plan, p, v, exec);
};

// The gradients of attention_forward(plan, inputs, out, lse, variant) given
// dout, the gradient of out (lse is not differentiated). The plan must be
// made with PlanOptions::backward = true; out and lse are what the forward
// pass returned. dk and dv rows no query sees become 0; THD tokens no
// segment covers are not written. Deterministic: the same inputs give
// bitwise-identical gradients for any executor and worker count.
template <class Backend, class T, ScoreVariant V, ExecutionPolicy Exec>
void attention_backward(const AttentionPlan<Backend>& plan, const AttentionInputs<T>& inputs,
                        std::type_identity_t<TensorView<const T>> out, TensorView<const float> lse,
                        std::type_identity_t<TensorView<const T>> dout, const AttentionGrads<T>& grads,
                        const V& variant, Exec&& exec) {
  static_assert(BackwardBackend<Backend>, "this backend has no backward pass");
  static_assert(!HasScoreHook<V> || HasScoreGradHook<V>,
                "this score variant has a score hook but no score_grad: its gradient is unknown");
  const AttentionShape shape = shape_of(inputs);
  plan.require_shape(shape, "attention_backward");
  detail::require_segment_ids_support<Backend>(inputs, "attention_backward");
  detail::check_variant(variant, shape);
  const detail::BackwardProblem<T> problem =
      detail::make_backward_problem(inputs, shape, out, lse, dout, grads.dq, grads.dk, grads.dv, grads.dsinks);
  Backend::backward(plan, problem, variant, exec);
}

template <class Backend, class T, ExecutionPolicy Exec>
void attention_backward(const AttentionPlan<Backend>& plan, const AttentionInputs<T>& inputs,
                        std::type_identity_t<TensorView<const T>> out, TensorView<const float> lse,
                        std::type_identity_t<TensorView<const T>> dout, std::type_identity_t<TensorView<T>> dq,
                        std::type_identity_t<TensorView<T>> dk, std::type_identity_t<TensorView<T>> dv, Exec&& exec) {
  attention_backward(plan, inputs, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variants::Default{}, exec);
}

template <class Backend, class T>
void attention_backward(const AttentionPlan<Backend>& plan, const AttentionInputs<T>& inputs,
                        std::type_identity_t<TensorView<const T>> out, TensorView<const float> lse,
                        std::type_identity_t<TensorView<const T>> dout, std::type_identity_t<TensorView<T>> dq,
                        std::type_identity_t<TensorView<T>> dk, std::type_identity_t<TensorView<T>> dv) {
  attention_backward(plan, inputs, out, lse, dout, AttentionGrads<T>{dq, dk, dv}, variants::Default{},
                     execution::Serial{});
}

}  // namespace seqattn
