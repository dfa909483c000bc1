// The Highway SIMD backend, statically dispatched: the kernel compiled for the
// target this translation unit's flags select (AVX3 with -march=native on an
// AVX-512 machine, AVX2 with the project's default flags, SCALAR/EMU128 with
// none). For a binary that picks its target at run time, link seqattn::dispatch
// (seqattn/dispatch.hpp) instead.
#pragma once

#include <hwy/highway.h>

#include "seqattn/backends/cpu_tiled.hpp"
#include "seqattn/backends/highway-inl.h"

namespace seqattn::backends {
// Target-named inline namespace: TUs built with different flags get different
// `Highway` types, so the linker cannot merge an AVX2 body into a SCALAR TU.
inline namespace HWY_CONCAT(abi_, HWY_NAMESPACE) {

  // Policy type: the Highway SIMD backend for this TU's static target.
  struct Highway : CpuTiled<::seqattn::HWY_NAMESPACE::FlashKernel> {
    static const char* name() { return "Highway"; }
    static const char* target() { return hwy::TargetName(HWY_STATIC_TARGET); }
  };

}  // namespace )
}  // namespace seqattn::backends
