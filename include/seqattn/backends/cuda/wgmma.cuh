// sm_90a building blocks of the Cuda backend's Hopper forward kernel
// (wgmma_forward_kernel.cuh): the shared-memory tile layout that wgmma reads,
// its matrix descriptors, and the warpgroup MMA instructions with their
// fences. The instructions are compiled only for the sm_90a target
// (SEQATTN_CUDA_SM90A below); the host side of the backend chooses the kernel.
//
// Layout (WgmmaTile): a [rows][D] tile of 16-bit values is stored as D / 64
// column blocks, each [rows][64] with 128-byte rows whose 16-byte chunks are
// XOR-swizzled by row % 8 — the canonical "128-byte swizzle" layout of the
// PTX ISA (8-row x 128-byte atoms, 1024 bytes each). At D = 64 it is the
// mma.sync kernels' own swizzle. The same tile serves as
//   - a K-major operand (Q as A, K as B of S = Q K^T): rows are M or N, the
//     64 columns of a block are K; one k16 step is 32 bytes into the row,
//     the next block of 64 dims is the next column block;
//   - an MN-major operand (V as B of O += P V, transposed): rows are K
//     (keys), columns N (dims); LBO steps to the next 64 dims, SBO to the
//     next 8 keys.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "seqattn/backends/cuda/device_primitives.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SEQATTN_CUDA_SM90A 1
#endif

namespace seqattn::cuda::detail {

// Element offset of (row, col) in a [kTileRows][D] tile in wgmma's 128-byte
// swizzled layout. kRowElems: elements between rows r and r + 1 of one
// column block (load_kv_tile and the non-finite scan step rows by it).
template <int D, int kTileRows>
struct WgmmaTile {
  static constexpr int kRowElems = 64;
  static constexpr int kBlockElems = kTileRows * 64;  // one column block
  static __device__ __forceinline__ int offset(int row, int col) {
    return (col >> 6) * kBlockElems + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
  }
};

// A shared-memory matrix descriptor for the 128-byte swizzle (PTX ISA,
// "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (all >> 4), swizzle mode 1 in bits 62-63. Atoms start 1024-byte
// aligned, so the base offset field stays 0.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) | static_cast<uint64_t>(lbo_bytes >> 4) << 16 |
         static_cast<uint64_t>(sbo_bytes >> 4) << 32 | uint64_t{1} << 62;
}

#if defined(SEQATTN_CUDA_SM90A)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) and
// read next by wgmma (the async proxy): each writing thread fences before
// the barrier that publishes the tile.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses to accumulator registers across
// the asynchronous MMA that owns them.
template <int N>
__device__ __forceinline__ void fence_fragments(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[i][c])::"memory");
}

#define SEQATTN_WGMMA_SS_N64(TY)                                                                                    \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                 \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),    \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                  \
      : "l"(a), "l"(b), "r"(scale_d)                                                                                \
      : "memory")
#define SEQATTN_WGMMA_RS_N64(TY)                                                                                    \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                   \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),    \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)                                                  \
      : "memory")
#define SEQATTN_WGMMA_RS_N128(TY)                                                                                      \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                                         \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "    \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, "    \
      "%66, %67}, %68, p, 1, 1, 1;\n}\n"                                                                               \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),       \
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),     \
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),                \
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),                \
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),                \
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)                                                     \
      : "memory")

// S (64 x 64, f32) {+}= A B^T, A: 64 x 16 and B: 64 x 16 K-major tiles in
// shared memory (descriptors a, b); scale_d 0 overwrites S.
template <class T>
__device__ __forceinline__ void wgmma_scores(float (&d)[8][4], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    SEQATTN_WGMMA_SS_N64("bf16");
  } else {
    SEQATTN_WGMMA_SS_N64("f16");
  }
}
// O (64 x D, f32) += P V: P as A fragments in registers (mma.sync's
// m16n8k16 A layout per warp), V a 16 x D MN-major tile in shared memory.
template <class T, int D>
__device__ __forceinline__ void wgmma_accumulate(float (&d)[D / 8][4], const uint32_t (&a)[4], uint64_t b) {
  static_assert(D == 64 || D == 128, "wgmma_accumulate: D = 64 or 128");
  if constexpr (D == 64) {
    if constexpr (std::is_same_v<T, bfloat16>) {
      SEQATTN_WGMMA_RS_N64("bf16");
    } else {
      SEQATTN_WGMMA_RS_N64("f16");
    }
  } else {
    if constexpr (std::is_same_v<T, bfloat16>) {
      SEQATTN_WGMMA_RS_N128("bf16");
    } else {
      SEQATTN_WGMMA_RS_N128("f16");
    }
  }
}
#undef SEQATTN_WGMMA_SS_N64
#undef SEQATTN_WGMMA_RS_N64
#undef SEQATTN_WGMMA_RS_N128
#endif  // SEQATTN_CUDA_SM90A

}  // namespace seqattn::cuda::detail
