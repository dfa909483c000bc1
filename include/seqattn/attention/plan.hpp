// Planning, separate from running (FlashInfer's plan()/run()):
//
//   auto plan = seqattn::plan_attention<Backend>(shape, mask, options, workers);
//   seqattn::attention_forward(plan, inputs, out, lse, variant, exec);  // any number of times
//
// An AttentionPlan holds what depends only on the problem's shape and mask:
// the shape, the BlockMask (with the mask's element predicate) and the
// backend's work partition (for the CPU engine: tasks, tile lists, KV splits
// and scratch sizes). It is immutable after planning, so one plan serves many
// calls, layers and threads at once; a call whose inputs have another shape
// throws, naming both shapes.
//
// The backend seam: a backend is a type that satisfies AttentionBackend:
//
//   static const char* name();
//   static BlockShape block_shape();              tile shape of its BlockMask
//   static Support supports(const AttentionShape&);   can it run this shape?
//   using Work = ...;                              its planned state
//   static Work plan_work(shape, block_mask, options, workers);
//   template <class T, class Variant, class Exec>
//   static void forward(const AttentionPlan<B>&, const detail::AttentionProblem<T>&,
//                       const Variant&, Exec&);
//
// A backend that does not tile (the reference) declares
// `static constexpr bool kMaterializesScores = true;` and then accepts a
// prebuilt BlockMask of any block shape.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn {

// A backend's answer to "can you run this shape?": empty reason means yes.
struct Support {
  std::string reason;
  explicit operator bool() const { return reason.empty(); }
};

template <class Backend>
class AttentionPlan;

template <class B>
concept AttentionBackend = requires(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options,
                                    int workers) {
  { B::name() } -> std::convertible_to<const char*>;
  { B::block_shape() } -> std::same_as<BlockShape>;
  { B::supports(shape) } -> std::same_as<Support>;
  typename B::Work;
  { B::plan_work(shape, bm, options, workers) } -> std::same_as<typename B::Work>;
}
&&requires(const AttentionPlan<B>& plan, const detail::AttentionProblem<float>& p32,
           const detail::AttentionProblem<bfloat16>& p16, const variants::Default& v, execution::Serial& exec) {
  B::forward(plan, p32, v, exec);
  B::forward(plan, p16, v, exec);
};

template <class Backend>
class AttentionPlan {
 public:
  const AttentionShape& shape() const { return shape_; }
  const BlockMask& block_mask() const { return *block_mask_; }
  const typename Backend::Work& work() const { return work_; }
  const PlanOptions& options() const { return options_; }
  // The worker count the work was partitioned for (any executor may run it).
  int workers() const { return workers_; }

  // Throws unless `shape` is the shape this plan was made for.
  void require_shape(const AttentionShape& shape, const char* who) const {
    detail::require(shape == shape_, who, ": the plan was made for ", shape_, " but the inputs are ", shape);
  }

  AttentionPlan(AttentionShape shape, std::shared_ptr<const BlockMask> block_mask, PlanOptions options, int workers)
      : shape_(std::move(shape)),
        block_mask_(std::move(block_mask)),
        work_(Backend::plan_work(shape_, *block_mask_, options, workers)),
        options_(options),
        workers_(workers) {}

 private:
  AttentionShape shape_;
  std::shared_ptr<const BlockMask> block_mask_;
  typename Backend::Work work_;
  PlanOptions options_;
  int workers_ = 1;
};

namespace detail {

template <class Backend>
void check_plan_request(const AttentionShape& shape, const PlanOptions& options, int workers) {
  constexpr const char* kWho = "plan_attention: ";
  require(workers >= 1, kWho, "workers must be at least 1, got ", workers);
  // The task arithmetic (tasks per worker) is sized for at most this many.
  require(workers <= limits::kMaxThreads, kWho, "workers must be at most ", limits::kMaxThreads,
          " (limits::kMaxThreads), got ", workers);
  require(options.kv_splits >= 0, kWho, "kv_splits must be >= 0 (0 = automatic), got ", options.kv_splits);
  require(options.kv_splits <= limits::kMaxKvSplits, kWho, "kv_splits must be at most ", limits::kMaxKvSplits,
          " (limits::kMaxKvSplits), got ", options.kv_splits);
  check_shape_limits(shape, "plan_attention");
  require(shape.heads > 0 && shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0 && shape.dk > 0 && shape.dv > 0,
          kWho, "heads must be a positive multiple of kv heads and head dims positive, got ", shape);
  const Support support = Backend::supports(shape);
  require(static_cast<bool>(support), kWho, "backend ", Backend::name(), " cannot run ", shape, ": ", support.reason);
}

// Checks that a caller-built BlockMask fits the shape and the backend's tiles.
template <class Backend>
void require_matching_block_mask(const BlockMask& bm, const AttentionShape& shape) {
  constexpr const char* kWho = "plan_attention: the BlockMask ";
  if constexpr (!requires { Backend::kMaterializesScores; }) {
    const BlockShape block = Backend::block_shape();
    require(bm.block_shape().q == block.q && bm.block_shape().kv == block.kv, kWho, "has block shape (",
            bm.block_shape().q, ", ", bm.block_shape().kv, ") but backend ", Backend::name(), " tiles by (", block.q,
            ", ", block.kv, ")");
  }
  require(bm.batch() == shape.batch(), kWho, "covers ", bm.batch(), " sequences but the inputs have ", shape.batch());
  for (index_t b = 0; b < shape.batch(); ++b) {
    require(bm.q_len(b) == shape.q_len(b) && bm.kv_len(b) == shape.kv_len(b), kWho, "has lengths (q ", bm.q_len(b),
            ", kv ", bm.kv_len(b), ") for sequence ", b, " but the inputs have (q ", shape.q_len(b), ", kv ",
            shape.kv_len(b), ")");
  }
  require(bm.heads() == 1 || bm.heads() == shape.heads, kWho, "has ", bm.heads(), " heads but the inputs have ",
          shape.heads);
  // One stored head serves every head only when the description did not
  // depend on the head: a head-dependent one built for 1 head has head 0's
  // tiles, and its predicate was checked for 1 head (a PerHeadMask of one
  // mask would be read past its end). Rebuilding for the inputs' heads is
  // what the caller means; a silent broadcast would be wrong.
  require(bm.heads() != 1 || bm.description_heads() == 0 || bm.description_heads() == shape.heads, kWho,
          "was built for ", bm.description_heads(), bm.description_heads() == 1 ? " head" : " heads",
          " from a mask description that depends on the head, but the inputs have ", shape.heads,
          " heads: build it with build_block_mask(mask, lengths, ", shape.heads, ", ...)");
}

}  // namespace detail

// Plans attention of `shape` under `mask` (any MaskDescription): builds its
// BlockMask at the backend's tile shape (validating the mask against the
// shape) and partitions the work for `workers` workers.
template <AttentionBackend Backend, MaskDescription M>
AttentionPlan<Backend> plan_attention(const AttentionShape& shape, const M& mask, PlanOptions options = {},
                                      int workers = 1) {
  detail::check_plan_request<Backend>(shape, options, workers);
  auto bm = std::make_shared<const BlockMask>(
      build_block_mask(mask, shape.lengths, shape.heads, Backend::block_shape(), {options.store_tile_bits}));
  return AttentionPlan<Backend>(shape, std::move(bm), options, workers);
}

// Plans with a BlockMask built beforehand (shared: the plan keeps it alive).
template <AttentionBackend Backend>
AttentionPlan<Backend> plan_attention(const AttentionShape& shape, std::shared_ptr<const BlockMask> block_mask,
                                      PlanOptions options = {}, int workers = 1) {
  detail::check_plan_request<Backend>(shape, options, workers);
  detail::require(block_mask != nullptr, "plan_attention: block_mask is null");
  detail::require_matching_block_mask<Backend>(*block_mask, shape);
  return AttentionPlan<Backend>(shape, std::move(block_mask), options, workers);
}

template <AttentionBackend Backend>
AttentionPlan<Backend> plan_attention(const AttentionShape& shape, BlockMask block_mask, PlanOptions options = {},
                                      int workers = 1) {
  return plan_attention<Backend>(shape, std::make_shared<const BlockMask>(std::move(block_mask)), options, workers);
}

// The same from the inputs of a call (their shape).
template <AttentionBackend Backend, class T, class MaskOrBlockMask>
AttentionPlan<Backend> plan_attention(const AttentionInputs<T>& inputs, MaskOrBlockMask&& mask,
                                      PlanOptions options = {}, int workers = 1) {
  return plan_attention<Backend>(shape_of(inputs), std::forward<MaskOrBlockMask>(mask), options, workers);
}

}  // namespace seqattn
