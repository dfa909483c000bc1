// Which arithmetic bf16 prefill uses on the CPU, and the engine's hook for it.
//
// bf16 Q/K/V can be computed three ways (backends/highway_bf16-inl.h):
//   widen   K and V tiles are widened to fp32 (stage_rows/to_f32) and multiplied
//           with fp32 FMAs: the path every backend has;
//   native  bf16 pair dot products with fp32 accumulation (AVX512_BF16's
//           VDPBF16PS: 32 bf16 MACs per instruction against 16 fp32 FMAs),
//           K read in place, V and P packed into bf16 pairs. P is rounded to
//           bf16 (round to nearest even) before P.V; the row sums l stay fp32;
//   amx     the same pair layouts through Intel AMX tile matmuls
//           (backends/amx.hpp): K in place, P rounded as for native and
//           transposed into rows, V packed into pairs.
//
// SEQATTN_BF16_DOT picks the default at compile time:
//   0  widen always;
//   1  native always: where the target lacks the instruction an emulation
//      (two fp32 FMAs per pair: 15-20 % slower than widening on one
//      Cascade Lake tile) runs instead, so the
//      path's arithmetic can be tested on any CPU;
//   2  automatic (default): the fastest of widen, native (where the
//      instruction is compiled in and the CPU has it) and AMX (where the CPU
//      and the OS allow it, backends/amx.hpp) by a one-time probe on this CPU
//      (Bf16DotKernel::probed), among those a task can use;
//   3  AMX tiles wherever a task can use them, else as automatic.
// set_bf16_dot_path() changes it at run time (tests force both paths).
//
// Bf16DotTask<Kernel> is what run_task (tiled_forward.hpp) asks a backend:
// which arithmetic a bf16 task gets, and the pair arithmetic's type, which
// the engine's one task loop then runs. The primary template widens every
// task; backends/highway_bf16-inl.h specializes it for FlashKernel.
#pragma once

#include <atomic>
#include <cstdint>
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

#ifndef SEQATTN_BF16_DOT
#define SEQATTN_BF16_DOT 2
#endif
static_assert(SEQATTN_BF16_DOT >= 0 && SEQATTN_BF16_DOT <= 3,
              "SEQATTN_BF16_DOT must be 0 (widen), 1 (native), 2 (automatic) or 3 (AMX)");

namespace seqattn {

enum class Bf16DotPath : int { widen = 0, native = 1, automatic = 2, amx = 3 };

namespace detail {

inline std::atomic<int>& bf16_dot_path_setting() {
  static std::atomic<int> path{SEQATTN_BF16_DOT};
  return path;
}

// Tasks the native path has run (all threads, all calls): lets tests see
// which path a call took. One relaxed increment per task (a task is >= one
// 128 x 64 tile, microseconds of work).
inline std::atomic<std::uint64_t>& bf16_native_task_count() {
  static std::atomic<std::uint64_t> count{0};
  return count;
}
inline std::atomic<std::uint64_t>& bf16_amx_task_count() {  // the same for AMX tiles
  static std::atomic<std::uint64_t> count{0};
  return count;
}

// CPUID: AVX512_BF16 (leaf 7, sub-leaf 1, EAX bit 5). The AVX-512 state the
// instruction needs is the OS's to enable, which Highway checked before it
// chose an AVX3 target, the only targets that ask.
inline bool cpu_has_avx512_bf16() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;  // no leaf 7 or no sub-leaf 1
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return ((a >> 5) & 1u) != 0;
  }();
  return has;
#else
  return false;
#endif
}

// The tile arithmetic of one bf16 task: widened to fp32, bf16 pairs with
// the instruction or with its emulation, or AMX tiles.
enum class Bf16Tiles { widen, pairs, emulated_pairs, amx };

template <class Kernel>
struct Bf16DotTask {
  // Whether the kernel has pair arithmetic (PairTiles<kHw>, with the
  // instruction when kHardwarePairs), and which arithmetic a task gets. The
  // primary template has none: every task widens.
  static constexpr bool kPairs = false;
  static constexpr bool kHardwarePairs = false;
  template <class Call>
  static Bf16Tiles choose(const Call&, index_t) {
    return Bf16Tiles::widen;
  }
  // The arithmetic of the bf16 backward's matmuls (tiled_backward.hpp).
  static Bf16Tiles backward_tiles() { return Bf16Tiles::widen; }
};

}  // namespace detail

inline void set_bf16_dot_path(Bf16DotPath path) {
  const int v = static_cast<int>(path);
  detail::require(v >= 0 && v <= 3, "set_bf16_dot_path: path must be widen, native, automatic or amx, got ", v);
  detail::bf16_dot_path_setting().store(v, std::memory_order_relaxed);
}

inline Bf16DotPath bf16_dot_path() {
  return static_cast<Bf16DotPath>(detail::bf16_dot_path_setting().load(std::memory_order_relaxed));
}

inline std::uint64_t bf16_native_tasks() { return detail::bf16_native_task_count().load(std::memory_order_relaxed); }
inline std::uint64_t bf16_amx_tasks() { return detail::bf16_amx_task_count().load(std::memory_order_relaxed); }

}  // namespace seqattn
