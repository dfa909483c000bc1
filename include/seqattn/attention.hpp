// Attention: tiled online-softmax ("flash") forward pass on a chosen backend.
//
// Plan once, run many times:
//
//   auto plan = seqattn::plan_attention<Backend>(seqattn::shape_of(inputs), mask, {}, pool.workers());
//   seqattn::attention_forward(plan, inputs, out, lse, variant, pool);
//
// computes softmax(mask(variant(scale * q k^T)) [+ sink]) v and the
// log-sum-exp of every (batch, head, query) row, for BSHD or packed THD
// inputs (AttentionInputs), any MaskDescription, GQA/MQA, fp32 or bf16
// storage (fp32 accumulation). See attention/inputs.hpp for the shapes,
// attention/plan.hpp for plans and the backend seam, attention/run.hpp for
// running them on contiguous or paged K/V (PagedAttentionInputs), attention/variants.hpp
// for score variants (scale, softcap, sinks, ALiBi, bias, score_mod).
//
// Or in one call, planning each time:
//
//   seqattn::attention_forward<Backend>(inputs, mask, out, lse, options, exec);
//
// Backends are policy types (AttentionBackend):
//   backends::Highway    SIMD kernel for this TU's static Highway target (default)
//   backends::Scalar     the same tiling in portable C++
//   backends::Reference  materialized scores, exact softmax: the test oracle
// Execution policies: execution::Serial (default), execution::ThreadPool,
// execution::OpenMP (with -fopenmp). Work is split over batch x head x q-tile;
// with few such tasks (decode) each row of tiles is also split over KV chunks
// whose partial results are merged by their LSE (SoftmaxState).
//
// The mask is consumed through its BlockMask at the backend's tile shape
// (Backend::block_shape()): empty tiles are skipped, full tiles run without
// mask work, partial tiles are masked from the stored tile bits (or the
// element predicate the BlockMask carries when it has no bits).
#pragma once

#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/attention/softmax_state.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/highway.hpp"
#include "seqattn/backends/reference.hpp"
#include "seqattn/backends/scalar.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// One call: plans (or takes options.block_mask) and runs with the variant
// options describe (variants::Standard: scale, softcap, sinks).
template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M, ExecutionPolicy Exec>
void attention_forward(const AttentionInputs<T>& inputs, const M& mask, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const AttentionOptions& options, Exec&& exec) {
  const AttentionShape shape = shape_of(inputs);
  const PlanOptions plan_options{options.kv_splits};
  const int workers = std::max(1, static_cast<int>(exec.workers()));
  const variants::Standard variant{options.scale, {options.softcap}, {options.sinks}};
  detail::check_variant(variant, shape);  // before planning allocates anything
  if (options.block_mask) {
    // Borrowed for the call: the caller keeps it alive.
    const std::shared_ptr<const BlockMask> borrowed(std::shared_ptr<void>{}, options.block_mask);
    attention_forward(plan_attention<Backend>(shape, borrowed, plan_options, workers), inputs, out, lse, variant, exec);
  } else {
    attention_forward(plan_attention<Backend>(shape, mask, plan_options, workers), inputs, out, lse, variant, exec);
  }
}

template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M>
void attention_forward(const AttentionInputs<T>& inputs, const M& mask, std::type_identity_t<TensorView<T>> out,
                       TensorView<float> lse, const AttentionOptions& options = {}) {
  attention_forward<Backend>(inputs, mask, out, lse, options, execution::Serial{});
}

// The BlockMask the one-call attention_forward<Backend> builds for these
// inputs; build it once and pass it as options.block_mask to reuse it (or,
// better, reuse an AttentionPlan).
template <AttentionBackend Backend = backends::Highway, class T, MaskDescription M>
BlockMask make_attention_block_mask(const AttentionInputs<T>& in, const M& mask,
                                    BlockMaskOptions options = BlockMaskOptions{}) {
  const AttentionShape shape = shape_of(in);
  return build_block_mask(mask, shape.lengths, shape.heads, Backend::block_shape(), options);
}

template <AttentionBackend Backend>
constexpr BlockShape attention_block_shape() {
  return Backend::block_shape();
}

}  // namespace seqattn
