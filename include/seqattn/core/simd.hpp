// Which Highway target the current translation unit compiles for.
//
// Highway picks its static target from the compile flags, so two TUs of one
// program can disagree. Entry points that depend on it live in a
// target-named inline namespace so the linker cannot merge the AVX2 and the
// SCALAR body of one inline function (an ODR trap that silently picks either).
#pragma once

// clang-format off
#include "seqattn/core/hwy_config.hpp"  // before any Highway header
#include <hwy/highway.h>
// clang-format on

#define SEQATTN_STATIC_TARGET_IS_SCALAR (HWY_STATIC_TARGET == HWY_SCALAR || HWY_STATIC_TARGET == HWY_EMU128)

// The inline ABI namespace for entry points that depend on the static target
// (e.g. seqattn::abi_N_AVX2). It must differ from HWY_NAMESPACE itself.
#define SEQATTN_ABI_NAMESPACE HWY_CONCAT(abi_, HWY_NAMESPACE)

namespace seqattn {
inline namespace SEQATTN_ABI_NAMESPACE {

// Name of the Highway target the static-dispatch kernels of this TU use,
// e.g. "AVX2" or "AVX3". Tests and benchmarks print it.
inline const char* static_simd_target() { return hwy::TargetName(HWY_STATIC_TARGET); }

}  // namespace SEQATTN_ABI_NAMESPACE
}  // namespace seqattn
