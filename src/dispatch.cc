// Compiled once per Highway target by foreach_target.h; the best target for
// the running CPU is chosen at the first call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "dispatch.cc"
#include <hwy/foreach_target.h>  // must precede highway.h
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace seqattn {
namespace HWY_NAMESPACE {

const char* TargetNameOfThisBody() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace seqattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "seqattn/dispatch.hpp"

namespace seqattn {
HWY_EXPORT(TargetNameOfThisBody);

namespace dispatch {
const char* best_simd_target() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisBody)(); }
}  // namespace dispatch
}  // namespace seqattn
#endif  // HWY_ONCE
