// CpuTiled<Kernel>: the AttentionBackend of the CPU tiled engine. Planning
// partitions the BlockMask's tiles into tasks (attention/detail/tiled_work.hpp);
// forward runs them on an execution policy (attention/detail/tiled_forward.hpp)
// with the Kernel's arithmetic. Scalar and Highway are this template with
// their kernels.
#pragma once

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled_forward.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/backends/tile_kernel.hpp"

namespace seqattn::backends {

template <TileKernel K>
struct CpuTiled {
  using Kernel = K;
  using Work = detail::TiledWork;

  static constexpr BlockShape block_shape() { return {Kernel::kBlockQ, Kernel::kBlockKv}; }
  // Any shape, mask and variant: the engine has no size limits of its own.
  static Support supports(const AttentionShape&) { return {}; }
  static Work plan_work(const AttentionShape& shape, const BlockMask& bm, const PlanOptions& options, int workers) {
    return detail::plan_tiled_work<Kernel>(shape, bm, options, workers);
  }
  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& problem, const V& variant,
                      Exec& exec) {
    detail::run_tiled_forward<Kernel>(plan.work(), plan.block_mask(), problem, variant, exec);
  }
};

}  // namespace seqattn::backends
