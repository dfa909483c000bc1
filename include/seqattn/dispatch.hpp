// Runtime-dispatched entry points (link seqattn::dispatch, built with
// SEQATTN_BUILD_DISPATCH=ON). The header-only API picks its SIMD target from
// the caller's compile flags; these functions instead pick the best target
// the running CPU supports, so one binary runs fast on any x86-64 machine.
#pragma once

namespace seqattn::dispatch {

// Name of the Highway target chosen for this CPU, e.g. "AVX3_ZEN4" or "AVX2".
const char* best_simd_target();

}  // namespace seqattn::dispatch
