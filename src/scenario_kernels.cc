// The scenarios' SIMD kernels (scenarios/scenario_kernels-inl.h), compiled
// once per Highway target by foreach_target.h; scenario_kernels() hands out the
// best target's for the running CPU (scenarios/kernels.hpp).
//
// Targets: Highway's default set above the baseline of this TU's flags (no
// -march: SSSE3, SSE4, AVX2, AVX3 and the portable fallback on x86). AVX3_DL
// would add nothing these kernels use.
#include <cstdint>

#include "seqattn/core/hwy_config.hpp"  // before any Highway header
#include "seqattn/scenarios/kernels.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scenario_kernels.cc"
#include <hwy/foreach_target.h>  // must precede highway.h
#include <hwy/highway.h>

#include "seqattn/scenarios/scenario_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqattn {
namespace HWY_NAMESPACE {

dispatch::ScenarioKernels ScenarioKernelsOfThisTarget() {
  dispatch::ScenarioKernels k;
  k.target = hwy::TargetName(HWY_TARGET);
  k.target_bit = HWY_TARGET;
  k.chunk_width = ScenarioSimd::chunk_width();
  k.index_rows = &ScenarioSimd::index_rows;
  k.pool_scores = &ScenarioSimd::pool_scores;
  k.pool_softmax = &ScenarioSimd::pool_softmax;
  return k;
}

}  // namespace HWY_NAMESPACE
}  // namespace seqattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqattn {
HWY_EXPORT(ScenarioKernelsOfThisTarget);

namespace dispatch {
ScenarioKernels scenario_kernels() { return HWY_DYNAMIC_DISPATCH(ScenarioKernelsOfThisTarget)(); }

std::int64_t scenario_kernel_targets() { return HWY_TARGETS; }
}  // namespace dispatch
}  // namespace seqattn
#endif  // HWY_ONCE
