// A 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the
// Highway AVX3 kernels (Q, K, V and dS into lane-major tiles) and by the AMX
// operand packers (backends/amx.hpp), which run wherever the CPU has AMX
// whatever the build's static target: hence a target attribute rather than
// the TU's flags. Callers must run on a CPU with AVX-512F.
#pragma once

#include <cstdint>

#include "seqattn/core/tensor.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SEQATTN_HAS_X86_TRANSPOSE 1
#include <immintrin.h>
#else
#define SEQATTN_HAS_X86_TRANSPOSE 0
#endif

#if SEQATTN_HAS_X86_TRANSPOSE

namespace seqattn::x86 {

// GCC 12's unmasked forms of these intrinsics pass _mm512_undefined_epi32()
// as the merge source, which -Wmaybe-uninitialized reports once inlined into
// target-attribute bodies; nothing reads those lanes.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Rows c < `store` of the transpose of the 16 x 16 matrix of 32-bit words
// r[row] (lane = column), to dst + c * stride: two rounds of unpacks (32-
// then 64-bit) leave block L of r[4g + k] holding word 4L + k of rows
// 4g .. 4g + 3, and two rounds of 128-bit block shuffles gather each
// column's four blocks. 64 shuffles and up to 16 stores; r is clobbered.
__attribute__((target("avx512f"), always_inline)) inline void transpose16_words(__m512i (&r)[16], std::uint32_t* dst,
                                                                                index_t stride, index_t store) {
  __m512i t[16];
  for (int g = 0; g < 4; ++g) {
    t[4 * g + 0] = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
    t[4 * g + 1] = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
    t[4 * g + 2] = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
    t[4 * g + 3] = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
  }
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i a = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), b = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);
    const __m512i c = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88),
                  e = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
    const __m512i column[4] = {_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(b, e, 0x88),
                               _mm512_shuffle_i32x4(a, c, 0xDD), _mm512_shuffle_i32x4(b, e, 0xDD)};
    for (int l = 0; l < 4; ++l) {
      if (4 * l + k < store) _mm512_storeu_si512(dst + (4 * l + k) * stride, column[l]);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace seqattn::x86

#endif  // SEQATTN_HAS_X86_TRANSPOSE
