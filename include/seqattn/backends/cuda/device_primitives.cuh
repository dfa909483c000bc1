// Building blocks shared by the Cuda backend's kernels (forward, decode,
// backward): the storage type's tensor-core form, PTX wrappers (cp.async,
// ldmatrix, mma.sync m16n8k16), the swizzled shared-memory tile layout, the
// tile loader, the non-finite scans and the select-accumulate of the NaN
// policy, and the application of a row's 64-bit mask word to a fragment.
//
// Fragment conventions (PTX ISA, mma.m16n8k16): a thread holds, of a 16 x 8
// C tile, rows lane / 4 and lane / 4 + 8 at columns 2 (lane % 4) + {0, 1};
// an A fragment of 16 x 16 is two such C tiles side by side, so a score tile
// computed by one MMA feeds the next as its A operand without a shuffle.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <type_traits>

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/float16.hpp"

namespace seqattn::cuda::detail {

inline constexpr int kRows = 128;  // score rows per CTA (kBlockQ)
inline constexpr int kKeys = 64;   // keys per step (kBlockKv)
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// ---- Storage type -> tensor-core type.
template <class T>
struct MmaType;
template <>
struct MmaType<bfloat16> {
  using type = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void store2(bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
  static __device__ __forceinline__ float to_float(const bfloat16& x) {
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&x));
  }
  // P as the MMA sees it (rounded to the storage type).
  static __device__ __forceinline__ float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
  static constexpr uint32_t kExponents = 0x7F807F80u;  // exponent bits of both halves of a word
};
template <>
struct MmaType<float16> {
  using type = __half;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void store2(float16* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
  static __device__ __forceinline__ float to_float(const float16& x) {
    return __half2float(*reinterpret_cast<const __half*>(&x));
  }
  static __device__ __forceinline__ float round(float x) { return __half2float(__float2half_rn(x)); }
  static constexpr uint32_t kExponents = 0x7C007C00u;
};

// ---- PTX wrappers.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte asynchronous copy; src_bytes 0 writes zeros (rows past an end).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of (row, col) in a [rows][D] shared tile whose 16-byte
// chunks are XOR-swizzled by the row (D >= 64: at least 8 chunks per row).
template <int D>
__device__ __forceinline__ int swizzle(int row, int col) {
  return row * D + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}
// The swizzled [rows][D] tile as a layout type (the kernels built on
// mma.sync); wgmma.cuh's WgmmaTile is the other. kRowElems: elements between
// rows r and r + 1 at a fixed column.
template <int D>
struct RowSwizzle {
  static constexpr int kRowElems = D;
  static __device__ __forceinline__ int offset(int row, int col) { return swizzle<D>(row, col); }
};
// The same layout seen by ldmatrix: the physical chunk of logical chunk c in
// row r is c ^ (r & 7), so for a thread whose row is fixed mod 8 the byte
// address of chunk 2j + h is (row base + 16 * (h ^ (r & 7))) ^ (32 j) when
// the row base is aligned to the row size. The kernels precompute the part
// in parentheses per thread; each ldmatrix then costs one XOR with a
// constant instead of re-deriving the swizzle.
template <int D>
__device__ __forceinline__ uint32_t frag_offset(int row, int half) {
  return static_cast<uint32_t>(row * D * 2 + 16 * ((half ^ row) & 7));
}

// load_kv_tile: kTileRows rows of one head of a [token, head, dim] tensor
// (tokens key0 + row: keys of K or V, or queries of Q and dO in the
// backward) into a swizzled stage with kThreads threads. Each thread keeps one 16-byte
// column chunk, so its shared address and global pointer advance by a fixed
// step per pass: no swizzle or address math per copy. Rows past kv_len and
// chunks past `cols` are zero-filled.
template <int D, int kThreads, class T, int kTileRows = kKeys, class Layout = RowSwizzle<D>>
__device__ __forceinline__ void load_kv_tile(T* stage, const T* row0_ptr, long long token_stride, int key0, int kv_len,
                                             int cols, const T* any_valid, const int* pages = nullptr,
                                             int page_size = 0, long long page_stride = 0) {
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;
  static_assert(kRowsPerPass % 8 == 0 && kTileRows % kRowsPerPass == 0, "the swizzle repeats every 8 rows");
  const int chunk = threadIdx.x % kChunks, row = threadIdx.x / kChunks;
  T* dst = stage + Layout::offset(row, chunk * 8);
  const bool col_ok = chunk * 8 < cols;
  if (pages == nullptr) {
    const T* src = row0_ptr + (key0 + row) * token_stride + chunk * 8;
#pragma unroll
    for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
      const bool ok = col_ok && key0 + row + pass * kRowsPerPass < kv_len;
      cp_async_16(dst + pass * kRowsPerPass * Layout::kRowElems,
                  ok ? src + pass * kRowsPerPass * token_stride : any_valid, ok ? 16 : 0);
    }
  } else {
    // One table lookup per row: a tile touches one or a few pages.
#pragma unroll
    for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
      const int key = key0 + row + pass * kRowsPerPass;
      const bool ok = col_ok && key < kv_len;
      const T* src = any_valid;
      if (ok) src = row0_ptr + pages[key / page_size] * page_stride + (key % page_size) * token_stride + chunk * 8;
      cp_async_16(dst + pass * kRowsPerPass * Layout::kRowElems, src, ok ? 16 : 0);
    }
  }
}

// ---- NaN policy (attention/softmax_state.hpp; README, "NaN and infinity").
// NaN scores need no test in the loop: ex2 of NaN is NaN, so the row sum l
// (and the P.V MMA) turn NaN while fmaxf drops the NaN from the max; the
// epilogues turn a NaN l into a NaN row and LSE. What needs care is
// 0 * NaN: the P.V MMA multiplies every weight, also the zero weights of
// masked keys, with V. So each thread scans the V chunks it copied into a
// stage (8 16-byte words per thread and tile at D = 128, beside two tile
// GEMMs), the CTA ORs the flags in the barrier it already had, and a tile
// whose V holds a non-finite element takes select_accumulate instead of the MMA.

// Whether a word of two 16-bit storage values holds an infinity or NaN.
template <class T>
__device__ __forceinline__ bool non_finite2(uint32_t w) {
  constexpr uint32_t kExp = MmaType<T>::kExponents;
  return __vcmpeq2(w & kExp, kExp) != 0u;
}

// Whether the chunks this thread copied into a stage of kTileRows rows
// (load_kv_tile's chunks) hold a non-finite value.
template <int D, int kThreads, class T, int kTileRows = kKeys, class Layout = RowSwizzle<D>>
__device__ __forceinline__ bool own_chunks_non_finite(const T* stage) {
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;
  const int chunk = threadIdx.x % kChunks, row = threadIdx.x / kChunks;
  const T* src = stage + Layout::offset(row, chunk * 8);
  bool bad = false;
#pragma unroll
  for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) {
    const uint4 w = *reinterpret_cast<const uint4*>(src + pass * kRowsPerPass * Layout::kRowElems);
    bad |= non_finite2<T>(w.x) | non_finite2<T>(w.y) | non_finite2<T>(w.z) | non_finite2<T>(w.w);
  }
  return bad;
}

// O += W B for one m16 slice without the MMA, where a weight of 0 skips the
// row of B (a select, not 0 * B): O += P V in the forward, dQ += dS K,
// dV += P^T dO and dK += dS^T Q in the backward. s: the slice's weights as C
// fragments over kN * 8 columns, which are rows key_begin + ... of the stage;
// o: the slice's output fragments. Each weight comes from the quad lane that
// holds it; weights are rounded to the storage type as the MMA would.
template <class T, int D, int kN, class Layout = RowSwizzle<D>>
__device__ __forceinline__ void select_accumulate(const float (&s)[kN][4], float (&o)[D / 8][4], const T* v_stage,
                                                  int key_begin, int lane) {
  using Mma = MmaType<T>;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
    for (int kc = 0; kc < 8; ++kc) {
      const int from = (lane & ~3) | (kc / 2);
      const float p0 = Mma::round(__shfl_sync(0xffffffffu, s[nt][kc % 2], from));      // row lane / 4
      const float p1 = Mma::round(__shfl_sync(0xffffffffu, s[nt][2 + kc % 2], from));  // row lane / 4 + 8
      const int key = key_begin + nt * 8 + kc;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const int col = nd * 8 + 2 * (lane % 4);
        const float v0 = Mma::to_float(v_stage[Layout::offset(key, col)]);
        const float v1 = Mma::to_float(v_stage[Layout::offset(key, col + 1)]);
        if (p0 != 0.0f) {
          o[nd][0] = fmaf(p0, v0, o[nd][0]);
          o[nd][1] = fmaf(p0, v1, o[nd][1]);
        }
        if (p1 != 0.0f) {
          o[nd][2] = fmaf(p1, v0, o[nd][2]);
          o[nd][3] = fmaf(p1, v1, o[nd][3]);
        }
      }
    }
  }
}

// apply_row_bits: -inf where a row's mask word excludes a score. s holds
// C fragments of kN * 8 columns starting at column col0 of the word; words
// [i] is the word of the thread's row lane / 4 + 8 i (bit c: column c).
// Each word is shifted once so that every test is a constant bit of it.
template <int kN>
__device__ __forceinline__ void apply_row_bits(float (&s)[kN][4], const unsigned long long (&words)[2], int col0,
                                               int lane) {
  uint32_t lo[2], hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const unsigned long long bits = words[i] >> (col0 + (lane % 4) * 2);
    lo[i] = static_cast<uint32_t>(bits);
    hi[i] = static_cast<uint32_t>(bits >> 32);
  }
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int bit = nt * 8 + (c % 2);
      const uint32_t word = bit < 32 ? lo[c / 2] : hi[c / 2];
      if (!((word >> (bit % 32)) & 1u)) s[nt][c] = -INFINITY;
    }
  }
}

// The low n of 64 bits (n in [0, 64]).
__device__ __forceinline__ unsigned long long low_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

}  // namespace seqattn::cuda::detail
