// CpuTiled<Kernel>: the AttentionBackend of the CPU tiled engine. Planning
// partitions the BlockMask's tiles into tasks (attention/detail/tiled_work.hpp,
// and tiled_backward.hpp when the plan is for training too); forward and
// backward run them on an execution policy (attention/detail/tiled_forward.hpp,
// tiled_backward.hpp) with the Kernel's arithmetic. Scalar and Highway are this template with
// their kernels.
#pragma once

#include <optional>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled_backward.hpp"
#include "seqattn/attention/detail/tiled_forward.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/run.hpp"
#include "seqattn/backends/tile_kernel.hpp"

namespace seqattn::backends {

template <TileKernel K>
struct CpuTiled {
  using Kernel = K;
  struct Work {
    detail::TiledWork forward;
    std::optional<detail::TiledBackwardWork> backward;  // with PlanOptions::backward
  };

  static constexpr BlockShape block_shape() { return {Kernel::kBlockQ, Kernel::kBlockKv}; }
  // Calls may carry segment ids (attention/segment_ids.hpp): the plan's work
  // is refined per call (attention/detail/segment_tiles.hpp).
  static constexpr bool kSegmentIds = true;
  // Any shape, mask and variant: the engine has no size limits of its own.
  static Support supports(const AttentionShape&) { return {}; }
  static Work plan_work(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options, int workers) {
    Work w{detail::plan_tiled_work<Kernel>(shape, bm, options, workers), std::nullopt};
    if (options.backward) w.backward = detail::plan_tiled_backward<Kernel>(shape, bm);
    return w;
  }
  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& problem, const V& variant,
                      Exec& exec) {
    detail::run_tiled_forward<Kernel>(plan.work().forward, plan.block_mask(), problem, variant, exec);
  }
  template <class Backend, class T, class V, class Exec>
  static void backward(const AttentionPlan<Backend>& plan, const detail::BackwardProblem<T>& problem, const V& variant,
                       Exec& exec) {
    detail::require(plan.work().backward.has_value(),
                    "attention_backward: the plan was made without PlanOptions::backward = true");
    detail::run_tiled_backward<Kernel>(*plan.work().backward, plan.block_mask(), problem, variant, exec);
  }
};

}  // namespace seqattn::backends
