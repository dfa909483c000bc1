// The Highway SIMD backend, statically dispatched: the kernel compiled for the
// target this translation unit's flags select (AVX3 with -march=native on an
// AVX-512 machine, AVX2 with the project's default flags, SCALAR/EMU128 with
// none). For a binary that picks its target at run time, link seqattn::dispatch
// (seqattn/dispatch.hpp) instead.
#pragma once

// clang-format off
#include "seqattn/core/hwy_config.hpp"  // before any Highway header
#include <hwy/highway.h>
// clang-format on

// A TU compiled without SIMD flags gets Highway's portable target, correct but
// several times slower; say so at compile time, with the fix.
#if (HWY_STATIC_TARGET == HWY_SCALAR || HWY_STATIC_TARGET == HWY_EMU128) && !defined(SEQATTN_ALLOW_SCALAR)
#pragma GCC warning                                                                                                \
    "seqattn: backends::Highway is compiled for Highway's portable SCALAR/EMU128 target (no SIMD flags): correct " \
    "but slow. Compile with -march=native (or -march=x86-64-v3 for portable AVX2 binaries), or link "              \
    "seqattn::dispatch and use backends::Dispatched; define SEQATTN_ALLOW_SCALAR to silence this warning."
#endif

#include "seqattn/backends/cpu_tiled.hpp"
#include "seqattn/backends/highway-inl.h"

namespace seqattn::backends {
// Target-named inline namespace: TUs built with different flags get different
// `Highway` types, so the linker cannot merge an AVX2 body into a SCALAR TU.
// With the kernels' ISA tag too (highway-inl.h): a TU with AVX512_BF16 and one
// without get different Highway types at the same target.
inline namespace HWY_CONCAT(HWY_CONCAT(abi_, HWY_NAMESPACE), HWY_CONCAT(_, SEQATTN_KERNEL_ISA)) {

  // Policy type: the Highway SIMD backend for this TU's static target.
  struct Highway : CpuTiled<::seqattn::HWY_NAMESPACE::FlashKernel> {
    static const char* name() { return "Highway"; }
    static const char* target() { return hwy::TargetName(HWY_STATIC_TARGET); }
  };

}  // namespace )
}  // namespace seqattn::backends
