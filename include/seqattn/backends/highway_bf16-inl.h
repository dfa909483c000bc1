// Native bf16 dot-product path of the Highway tile kernel (bf16 prefill).
//
// Included at the end of backends/highway-inl.h, so once per Highway target
// like FlashKernel (toggle guard below, code in seqattn::HWY_NAMESPACE). The
// engine reaches it through detail::Bf16DotTask<FlashKernel>, specialized at
// the end of this file; attention/detail/bf16_dot.hpp says how the path is
// chosen (SEQATTN_BF16_DOT, set_bf16_dot_path).
//
// ============================================================================
// Bf16DotKernel: layouts, arithmetic, tile shape, register budget, traffic
// ============================================================================
// AVX512_BF16's VDPBF16PS takes two vectors of bf16 PAIRS (one pair per 32-bit
// lane) and adds a.lo * b.lo + a.hi * b.hi to each fp32 lane: 32 bf16 MACs per
// zmm instruction, twice the 16 of an fp32 FMA. Products of two bf16 are exact
// in fp32, so only the two additions round (RNE; the instruction flushes
// denormal inputs and outputs to zero). The pair layout fits FlashKernel's
// "rows along lanes, broadcast the other operand" scheme with the pair
// dimension being the reduction dimension of each GEMM:
//   QK^T (reduce over d):  Qt2[d/2][row] uint32 = (Q[row][2i], Q[row][2i+1]),
//     packed once per task from the bf16 Q (exact: no scaling before the
//     pack); K is used IN PLACE, [key][d] bf16: K[j][2i..2i+1] is one 32-bit
//     broadcast. acc[row-vec][key] += dot2(Qt2 vector, broadcast K pair). The
//     softmax scale multiplies the accumulators at the store, so the scores
//     equal the widening path's up to fp32 rounding (order of the sums, and
//     the scale applied once instead of to each element of Q). Odd dk: the last
//     pair's high half is zero in Qt2 and the K element beyond the row is
//     never read (a 16-bit load).
//   P.V (reduce over keys): P (fp32 in St[key][row] after online_softmax) is
//     rounded to bf16, round to nearest even, and packed in place into
//     Pt2[key/2][row] (row jj of the pairs overwrites St row jj after rows 2jj
//     and 2jj + 1 were read); V is repacked per tile into Vp[key/2][dvp]
//     uint32 = (V[2jj][e], V[2jj+1][e]), zero beyond dv and for the missing
//     key of an odd tile. acc[row][d-vec] += dot2(broadcast P pair, Vp vector).
//     The row sums l stay those of the fp32 P (the softmax is unchanged), so
//     the only extra error of the path is P's rounding: each weight carries a
//     relative error <= 2^-8 (bf16's unit roundoff: 8 significant bits), so
//     |dO| <= 2^-8 * max|V| per output element, and for random data an NMSE
//     of about 2^-16 / 3 (tests/attention/bf16_dot_test.cpp).
// The instruction is compiled in where the target is AVX-512 and the compiler
// targets AVX512_BF16 (__AVX512BF16__: -march=sapphirerapids, cooperlake,
// znver4 ...), and in the AVX3_DL body of the runtime-dispatch TU
// (src/dispatch.cc defines SEQATTN_DISPATCH_BF16_DOT): there the functions
// below get the instruction through their target attribute only, and it runs
// only where CPUID reports AVX512_BF16 (AVX3_DL CPUs without it: Ice Lake,
// Tiger Lake). Every other target runs the same layouts with an emulated pair
// dot (widen each half with a shift or a mask, two fp32 FMAs, the same order
// of additions as the instruction): the widening path's FMAs plus the splits
// of the broadcast operand, never faster than widening, so it is never chosen
// automatically; it exists so the path's packing, tails and masking are
// tested on every target.
//
// Measured (bench/bf16_dot.cpp, one thread, in-cache 128 x 64 tile, d = 128)
// on the 2-vCPU Cascade Lake build machine (AVX3, no AVX512_BF16, shared and
// busy, so +-10%): fp32 FMA 133 GFLOP/s, emulated pair dot 136; QK^T widen
// 85 (82 with the K conversion), emulated pair dot 68 (73 with nothing to
// convert); P.V widen 84 (82), emulated 72 (67 with the P and V packing).
// On a 16-core Sapphire Rapids VM (AVX3_DL static target with AVX512_BF16,
// the bundle of scripts/build-cpu-bundle.sh, one thread): fp32 FMA 150
// GFLOP/s, VDPBF16PS 74 GFLOP/s counting 2 FLOP per bf16 MAC (both loops with
// 12 independent chains), i.e. half the fp32 FLOP rate although each
// instruction does twice the MACs of an FMA: a quarter of the FMA rate in
// instructions, or the 12 chains do not cover its latency; QK^T
// widen 117, pair dot 59 (80 counting the K conversion it saves); P.V widen
// 132, pair dot 81 (67 with the P and V packing). The probe timed 35 us
// (widen) against 56 us (pair dot) per tile and chose widen; causal 4k prefill,
// 2 threads: fp32 167, bf16 widen 164, bf16 pair dot 111, automatic 167
// GFLOP/s. The test binary passed there with the instruction (432 assertions).
//
// Register blocks: FlashKernel's (the same accumulator shapes, each
// accumulator now taking 2 MACs per instruction).
//   QK^T, AVX3: 4 row-vectors x 6 keys = 24 zmm accumulators + 4 Qt2 loads +
//     1 broadcast; per pair of dims 4 loads + 6 broadcasts for 24 VDPBF16PS
//     (768 MACs). 16-register targets: 2 x 4.
//   P.V, AVX3: 6 rows x 4 d-vectors = 24 accumulators; per pair of keys 4 Vp
//     loads + 6 broadcasts for 24 VDPBF16PS. 16-register targets: 4 x 2.
// Traffic per 128 x 64 tile, d = 128: K read in place, 16 KiB bf16 (the
//   widening path reads 16 KiB and writes + re-reads a 32 KiB fp32 copy); V
//   read once (16 KiB) and written as a 16 KiB pair tile; Qt2 32 KiB (half of
//   Qt), P read once as fp32 (32 KiB) and written as 16 KiB of pairs. The
//   loop bodies read half the bytes per MAC of the fp32 kernels.
// Score variants (softcap, ALiBi, biases, score_mod, sinks) and masks act on
// the fp32 scores and rows exactly as on the widening path: all supported.
// Decode (<= kBlockQ / 4 rows) has blocks of its own for 8-row groups
// (scores_decode, accumulate_pv_decode) and its own probe (decode_*): its
// arithmetic, not the memory, bounded bf16 decode on the widening path.
// Not taken (the task is left to the widening path, which handles them):
//   K with a head-dim stride other than 1 (K must be read in place as pairs),
//   several K/V groups per task whose rows are not whole vectors.
// ============================================================================

// Non-SIMD includes: normal include guard.
#ifndef SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_DEPS
#define SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_DEPS
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/bf16_dot.hpp"
#include "seqattn/attention/detail/tiled_forward.hpp"
#include "seqattn/backends/amx.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/tensor.hpp"
#endif

#if defined(SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_
#undef SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_
#else
#define SEQATTN_BACKENDS_HIGHWAY_BF16_INL_H_
#endif

#include <hwy/highway.h>

// Where VDPBF16PS is compiled in for this target's body: 0 nowhere; 1 the
// whole TU targets AVX512_BF16 (a CPU without it cannot run the binary); 2 the
// functions of this file only (their target attribute), used after a CPUID
// check.
#undef SEQATTN_BF16_DOT_INSTRUCTION
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && defined(__AVX512BF16__)
#define SEQATTN_BF16_DOT_INSTRUCTION 1
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL && defined(SEQATTN_DISPATCH_BF16_DOT) && \
    (HWY_COMPILER_GCC_ACTUAL || HWY_COMPILER_CLANG)
#define SEQATTN_BF16_DOT_INSTRUCTION 2
#else
#define SEQATTN_BF16_DOT_INSTRUCTION 0
#endif

HWY_BEFORE_NAMESPACE();
#if SEQATTN_BF16_DOT_INSTRUCTION == 2
// Replace the target attribute, not nest a second one: clang keeps only the
// outer attribute of nested pushes.
HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512bf16")
#endif
namespace seqattn::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

inline namespace SEQATTN_KERNEL_ISA {  // see highway-inl.h

struct Bf16DotKernel {
  using K = FlashKernel;
  using D = K::D;
  using V = K::V;
  using DU = hn::RebindToUnsigned<D>;
  using VU = hn::Vec<DU>;
  static constexpr index_t kBq = K::kBlockQ;
  static constexpr index_t kBkv = K::kBlockKv;

  // Whether this target's body has the instruction (see the header comment).
  static constexpr bool kNative = SEQATTN_BF16_DOT_INSTRUCTION != 0;

  // Whether this CPU can run it (the binary's flags vouch for it, or CPUID).
  static bool instruction_available() {
#if SEQATTN_BF16_DOT_INSTRUCTION == 2
    return detail::cpu_has_avx512_bf16();
#else
    return kNative;
#endif
  }

  static HWY_INLINE std::uint32_t pair_bits(const std::uint16_t* p) {
    // One 32-bit load on little-endian targets; correct on any byte order.
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 16);
  }
  static HWY_INLINE std::uint32_t load_u32(const void* p) {
    std::uint32_t x;
    std::memcpy(&x, p, sizeof(x));
    return x;
  }
  static HWY_INLINE void store_u32(void* p, std::uint32_t x) { std::memcpy(p, &x, sizeof(x)); }
  static HWY_INLINE const std::uint16_t* bits_of(const bfloat16* p) {
    return reinterpret_cast<const std::uint16_t*>(p);
  }

  // acc + a.lo * b.lo + a.hi * b.hi per 32-bit lane; kHw: the instruction.
  template <bool kHw>
  static HWY_INLINE V PairDot(V acc, VU a, VU b) {
#if SEQATTN_BF16_DOT_INSTRUCTION != 0
    if constexpr (kHw) return V{_mm512_dpbf16_ps(acc.raw, (__m512bh)a.raw, (__m512bh)b.raw)};
#endif
    const D d;
    const DU du;
    const VU hi = hn::Set(du, 0xFFFF0000u);
    const V a_lo = hn::BitCast(d, hn::ShiftLeft<16>(a)), a_hi = hn::BitCast(d, hn::And(a, hi));
    const V b_lo = hn::BitCast(d, hn::ShiftLeft<16>(b)), b_hi = hn::BitCast(d, hn::And(b, hi));
    // Same order as VDPBF16PS: the odd (high) product first.
    return hn::MulAdd(a_lo, b_lo, hn::MulAdd(a_hi, b_hi, acc));
  }

  // ---- Packing ---------------------------------------------------------------

  // out[i * stride + j] = (R_j[2i], R_j[2i+1]) for i < ceil(d / 2), j < n
  // (the high half zero past an odd d); zero for j in [n, n_pad). row(j):
  // R_j's d bf16, contiguous. Q into Qt2 (pack_query) and, in the bf16
  // backward's key passes, K and V as pairs along d. AVX3: per 16 rows x 16
  // pairs, 16 masked 16-bit loads (a row's 32 bf16 are its 16 pair words in
  // order) and one x86::transpose16_words, which also zeroes j in [n_pad,
  // n_pad rounded up to 16): stride must leave room for them.
  template <class Row>
  static void pairs_along_d(const Row& row, index_t n, index_t n_pad, index_t d, std::uint32_t* out, index_t stride) {
    const index_t pairs = (d + 1) / 2;
#if HWY_TARGET <= HWY_AVX3
    for (index_t j0 = 0; j0 < n_pad; j0 += 16) {
      const std::uint16_t* src[16];
      for (int q = 0; q < 16; ++q) src[q] = j0 + q < n ? bits_of(row(j0 + q)) : nullptr;
      for (index_t i0 = 0; i0 < pairs; i0 += 16) {
        const index_t elems = std::min<index_t>(32, d - 2 * i0);
        const auto m = static_cast<__mmask32>(elems == 32 ? ~0u : (1u << elems) - 1u);
        __m512i r[16];
        for (int q = 0; q < 16; ++q) {
          r[q] = src[q] != nullptr ? _mm512_maskz_loadu_epi16(m, src[q] + 2 * i0) : _mm512_setzero_si512();
        }
        x86::transpose16_words(r, out + i0 * stride + j0, stride, std::min<index_t>(16, pairs - i0));
      }
    }
#else
    for (index_t j = 0; j < n; ++j) {
      const std::uint16_t* src = bits_of(row(j));
      for (index_t i = 0; i < pairs; ++i) {
        const std::uint32_t lo = src[2 * i];
        const std::uint32_t hi = 2 * i + 1 < d ? src[2 * i + 1] : 0u;
        out[i * stride + j] = lo | (hi << 16);
      }
    }
    for (index_t i = 0; i < pairs; ++i) std::fill(out + i * stride + n, out + i * stride + n_pad, 0u);
#endif
  }

  // Qt2[i][r] = (Q[r][2i], Q[r][2i+1]) for the task's rows, zero for padded
  // rows and for the missing half of an odd dk. Once per task: pairs_along_d
  // where Q's head dim is contiguous (on AVX3, its transposes replaced an
  // element loop that took 5 % of bf16 prefill, Zen 5, 4k), else element by
  // element.
  static void pack_query(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq,
                         const detail::TaskRows& t, const index_t* row_q, const index_t* row_head, float* qt2) {
    const index_t pairs = (p.dk + 1) / 2;
    const index_t ds = p.q_strides.dim;
    if (ds == 1) {
      static_assert(kBq % 16 == 0);
      pairs_along_d([&](index_t r) { return p.q_row(seq, row_q[r], row_head[r]); }, t.rows, t.rows_p, p.dk,
                    reinterpret_cast<std::uint32_t*>(qt2), kBq);
      return;
    }
    for (index_t r = 0; r < t.rows_p; ++r) {
      if (r >= t.rows) {
        for (index_t i = 0; i < pairs; ++i) store_u32(qt2 + i * kBq + r, 0u);
        continue;
      }
      const std::uint16_t* src = bits_of(p.q_row(seq, row_q[r], row_head[r]));
      for (index_t i = 0; i < pairs; ++i) {
        const std::uint32_t lo = src[2 * i * ds];
        const std::uint32_t hi = 2 * i + 1 < p.dk ? src[(2 * i + 1) * ds] : 0u;
        store_u32(qt2 + i * kBq + r, lo | (hi << 16));
      }
    }
  }

  // Vp[jj][e] = (V[2jj][e], V[2jj+1][e]) for jj < ceil(cols / 2), e < dvp;
  // zero for e >= dv and for key `cols` of an odd tile. row(j): V row j
  // (bf16), its elements `dim_stride` apart. Once per tile.
  template <class Row>
  static void pack_v(const Row& row, index_t dim_stride, index_t cols, index_t dv, index_t dvp, float* vp) {
    const DU du;
    const hn::Rebind<std::uint16_t, D> du16;
    const auto N = static_cast<index_t>(hn::Lanes(du));
    auto* out = reinterpret_cast<std::uint32_t*>(vp);
    for (index_t jj = 0; 2 * jj < cols; ++jj) {
      const std::uint16_t* r0 = bits_of(row(2 * jj));
      const std::uint16_t* r1 = 2 * jj + 1 < cols ? bits_of(row(2 * jj + 1)) : nullptr;
      std::uint32_t* dst = out + jj * dvp;
      index_t e = 0;
      if (dim_stride == 1) {
        for (; e + N <= dv; e += N) {
          const VU lo = hn::PromoteTo(du, hn::LoadU(du16, r0 + e));
          const VU hi = r1 ? hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, r1 + e))) : hn::Zero(du);
          hn::Store(hn::Or(lo, hi), du, dst + e);
        }
      }
      for (; e < dv; ++e) {
        const std::uint32_t lo = r0[e * dim_stride];
        const std::uint32_t hi = r1 ? r1[e * dim_stride] : 0u;
        store_u32(dst + e, lo | (hi << 16));
      }
      for (; e < dvp; ++e) store_u32(dst + e, 0u);
    }
  }

  // x rounded to bf16, nearest even, in the high half of each 32-bit lane
  // (the low half is garbage). A NaN stays NaN (quieted: adding the rounding
  // bias could carry a payload in the low bits into the exponent, or leave
  // no mantissa bit in the high half). The forward's P is never NaN; the
  // backward's P and dS are where the reference's are.
  static HWY_INLINE VU RoundedBf16(V x) {
    const DU du;
    const VU bits = hn::BitCast(du, x);
    const VU rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u))));
    return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), hn::Or(bits, hn::Set(du, 0x00400000u)), rounded);
  }

  // St (fp32 P, [key][row]) -> Pt2[key/2][row] bf16 pairs, in place,
  // rounded by RoundedBf16. rows_v: rows to pack, a multiple of the vector
  // length.
  static void pack_p(float* st, index_t cols, index_t rows_v) {
    const D d;
    const DU du;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const VU hi = hn::Set(du, 0xFFFF0000u);
    auto* out = reinterpret_cast<std::uint32_t*>(st);
    for (index_t jj = 0; 2 * jj < cols; ++jj) {
      const float* s0 = st + 2 * jj * kBq;
      const bool has1 = 2 * jj + 1 < cols;
      for (index_t r = 0; r < rows_v; r += N) {
        const VU x0 = RoundedBf16(hn::Load(d, s0 + r));
        const VU x1 = has1 ? RoundedBf16(hn::Load(d, s0 + kBq + r)) : hn::Zero(du);
        hn::Store(hn::Or(hn::ShiftRight<16>(x0), hn::And(x1, hi)), du, out + jj * kBq + r);
      }
    }
  }

  // S (fp32 [row][col], rows kBq apart) -> out[jj][row] = (S[row][2jj],
  // S[row][2jj + 1]) bf16 pairs along the columns, rounded to nearest even
  // as pack_p; zero for column `cols` of an odd count. rows_p: rows to write,
  // whole vectors. The backward's dS^T operand of dQ += dS K: one pass instead
  // of a scalar transpose of the fp32 tile and pack_p on it. AVX3: per 16
  // rows x 32 columns, the pair words of each row from one two-source word
  // permute, then x86::transpose16_words.
  static void pack_transposed_pairs(const float* HWY_RESTRICT s, index_t rows_p, index_t cols,
                                    float* HWY_RESTRICT out) {
    auto* dst = reinterpret_cast<std::uint32_t*>(out);
    const index_t pairs = (cols + 1) / 2;
#if HWY_TARGET <= HWY_AVX3
    static_assert(K::kLanes == 16);
// GCC 12's unmasked forms of these intrinsics pass _mm512_undefined_epi32()
// as the merge source, which -Wmaybe-uninitialized reports once inlined into
// the dispatch TU's target-attribute bodies; nothing reads those lanes.
#if HWY_COMPILER_GCC_ACTUAL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
    const auto rounded = [](__m512 x) { return RoundedBf16(V{x}).raw; };
    // Word i of the result: the high halves of lanes 2i and 2i + 1 of the pair (a0, a1).
    alignas(64) std::uint16_t index[32];
    for (int i = 0; i < 16; ++i) {
      index[2 * i] = static_cast<std::uint16_t>(4 * i + 1);
      index[2 * i + 1] = static_cast<std::uint16_t>(4 * i + 3);
    }
    const __m512i halves = _mm512_load_si512(index);
    for (index_t c0 = 0; c0 < cols; c0 += 32) {
      const index_t left = cols - c0;
      const __mmask16 m0 = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
      const __mmask16 m1 = left >= 32   ? __mmask16(0xFFFF)
                           : left <= 16 ? __mmask16(0)
                                        : __mmask16((1u << (left - 16)) - 1u);
      const index_t words = std::min<index_t>(16, pairs - c0 / 2);
      for (index_t r0 = 0; r0 < rows_p; r0 += 16) {
        __m512i r[16];
        for (int q = 0; q < 16; ++q) {
          const float* row = s + (r0 + q) * kBq + c0;
          const __m512i a0 = rounded(_mm512_maskz_loadu_ps(m0, row));
          const __m512i a1 = rounded(_mm512_maskz_loadu_ps(m1, row + 16));
          r[q] = _mm512_permutex2var_epi16(a0, halves, a1);
        }
        x86::transpose16_words(r, dst + (c0 / 2) * kBq + r0, kBq, words);
      }
    }
#if HWY_COMPILER_GCC_ACTUAL
#pragma GCC diagnostic pop
#endif
#else
    const auto round_bits = [](float x) { return std::uint32_t{bfloat16(x).bits}; };  // RoundedBf16's high half
    for (index_t jj = 0; jj < pairs; ++jj) {
      for (index_t r = 0; r < rows_p; ++r) {
        const float* row = s + r * kBq;
        const std::uint32_t hi = 2 * jj + 1 < cols ? round_bits(row[2 * jj + 1]) : 0u;
        dst[jj * kBq + r] = round_bits(row[2 * jj]) | (hi << 16);
      }
    }
#endif
  }

  // ---- St[j][r] = scale * sum_i dot2(Qt2[i][r], K[j][2i..2i+1]) ---------------
  template <bool kHw, int kVecs, int kKeys>
  static HWY_INLINE void ScoresBlock(const float* HWY_RESTRICT qt2, index_t dk, const std::uint16_t* const* krow,
                                     int keys, float scale, float* HWY_RESTRICT st) {
    const D d;
    const DU du;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const auto* q2 = reinterpret_cast<const std::uint32_t*>(qt2);
    V acc[kVecs][kKeys];
    const std::uint16_t* kp[kKeys];
    HWY_UNROLL(16)
    for (int j = 0; j < kKeys; ++j) kp[j] = krow[j];
    HWY_UNROLL(8)
    for (int v = 0; v < kVecs; ++v) {
      HWY_UNROLL(16)
      for (int j = 0; j < kKeys; ++j) acc[v][j] = hn::Zero(d);
    }
    const index_t pairs = dk / 2;
    for (index_t i = 0; i < pairs; ++i) {
      VU q[kVecs];
      HWY_UNROLL(8)
      for (int v = 0; v < kVecs; ++v) q[v] = hn::Load(du, q2 + i * kBq + v * N);
      HWY_UNROLL(16)
      for (int j = 0; j < kKeys; ++j) {
        const VU b = hn::Set(du, pair_bits(kp[j] + 2 * i));
        HWY_UNROLL(8)
        for (int v = 0; v < kVecs; ++v) acc[v][j] = PairDot<kHw>(acc[v][j], q[v], b);
      }
    }
    if (dk & 1) {  // last dim alone: Qt2's high half is zero, K[j][dk] is not read
      VU q[kVecs];
      HWY_UNROLL(8)
      for (int v = 0; v < kVecs; ++v) q[v] = hn::Load(du, q2 + pairs * kBq + v * N);
      HWY_UNROLL(16)
      for (int j = 0; j < kKeys; ++j) {
        const VU b = hn::Set(du, static_cast<std::uint32_t>(kp[j][dk - 1]));
        HWY_UNROLL(8)
        for (int v = 0; v < kVecs; ++v) acc[v][j] = PairDot<kHw>(acc[v][j], q[v], b);
      }
    }
    const V vscale = hn::Set(d, scale);
    HWY_UNROLL(16)
    for (int j = 0; j < keys; ++j) {
      HWY_UNROLL(8)
      for (int v = 0; v < kVecs; ++v) hn::Store(hn::Mul(acc[v][j], vscale), d, st + j * kBq + v * N);
    }
  }

  // krows[j]: K row j (bf16 bits, unit stride), j < cols. rows_p: rows to
  // compute, whole vectors of Qt2 (padding rows are zero there).
  template <bool kHw>
  static void scores(const float* HWY_RESTRICT qt2, index_t rows_p, index_t dk, const std::uint16_t* const* krows,
                     index_t cols, float scale, float* HWY_RESTRICT st) {
    constexpr int kMaxVecs = K::kQkRowVecs, kKeys = K::kQkKeys;
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    const index_t row_vecs = (rows_p + N - 1) / N;
    for (index_t v0 = 0; v0 < row_vecs; v0 += kMaxVecs) {
      const index_t vecs = std::min<index_t>(kMaxVecs, row_vecs - v0);
      for (index_t j0 = 0; j0 < cols; j0 += kKeys) {
        const int keys = static_cast<int>(std::min<index_t>(kKeys, cols - j0));
        // Short key groups repeat the last key; only `keys` results are stored.
        const std::uint16_t* krow[kKeys];
        for (int j = 0; j < kKeys; ++j) krow[j] = krows[j0 + std::min(j, keys - 1)];
        const float* q = qt2 + v0 * N;
        float* s = st + j0 * kBq + v0 * N;
        K::WithBlockSize<kMaxVecs>(
            vecs, [&](auto v) { ScoresBlock<kHw, decltype(v)::value, kKeys>(q, dk, krow, keys, scale, s); });
      }
    }
  }

  // ---- O[r][e] = alpha[r] * O[r][e] + sum_jj dot2(Pt2[jj][r], Vp[jj][e]) -------
  // kSelect: a V half whose P half is zero (or a bf16 denormal, which
  // VDPBF16PS flushes to zero) is zeroed before the pair dot, so 0 * NaN never
  // reaches O (NaN policy, attention/softmax_state.hpp). Taken only for tiles
  // with both a zero weight and a non-finite V element (accumulate_pv).
  template <bool kHw, int kRows, int kVecs, bool kSelect>
  static HWY_INLINE void PvBlock(const float* HWY_RESTRICT pt2, index_t pairs, const float* HWY_RESTRICT vp,
                                 const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o, index_t dvp) {
    const DU du;
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    const auto* v2 = reinterpret_cast<const std::uint32_t*>(vp);
    V acc[kRows][kVecs];
    ScaledRows<kRows, kVecs>(alpha, o, dvp, acc);
    for (index_t jj = 0; jj < pairs; ++jj) {
      VU vv[kVecs];
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) vv[e] = hn::Load(du, v2 + jj * dvp + e * N);
      AddPairDots<kHw, kRows, kVecs, kSelect>(pt2 + jj * kBq, vv, acc);
    }
    StoreRows<kRows, kVecs>(acc, o, dvp);
  }

  // The steps PvBlock and DecodePvBlock share, on kRows rows of kVecs vectors
  // of O from `o` (rows dvp apart). acc = alpha[r] * O.
  template <int kRows, int kVecs>
  static HWY_INLINE void ScaledRows(const float* HWY_RESTRICT alpha, const float* HWY_RESTRICT o, index_t dvp,
                                    V (&acc)[kRows][kVecs]) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    HWY_UNROLL(8)
    for (int r = 0; r < kRows; ++r) {
      const V a = hn::Set(d, alpha[r]);
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) acc[r][e] = hn::Mul(a, hn::Load(d, o + r * dvp + e * N));
    }
  }
  // acc[r][e] += dot2(the bf16 pair p[r], vv[e]): one pair of keys (V rows
  // paired in vv) into every row; kSelect as PvBlock says.
  template <bool kHw, int kRows, int kVecs, bool kSelect>
  static HWY_INLINE void AddPairDots(const float* HWY_RESTRICT p, const VU (&vv)[kVecs], V (&acc)[kRows][kVecs]) {
    const DU du;
    HWY_UNROLL(8)
    for (int r = 0; r < kRows; ++r) {
      const std::uint32_t pair = load_u32(p + r);
      const VU pr = hn::Set(du, pair);
      if constexpr (kSelect) {
        const VU keep = hn::Set(du, ((pair & 0x7F80u) ? 0xFFFFu : 0u) | ((pair & 0x7F800000u) ? 0xFFFF0000u : 0u));
        HWY_UNROLL(8)
        for (int e = 0; e < kVecs; ++e) acc[r][e] = PairDot<kHw>(acc[r][e], pr, hn::And(vv[e], keep));
      } else {
        HWY_UNROLL(8)
        for (int e = 0; e < kVecs; ++e) acc[r][e] = PairDot<kHw>(acc[r][e], pr, vv[e]);
      }
    }
  }
  template <int kRows, int kVecs>
  static HWY_INLINE void StoreRows(const V (&acc)[kRows][kVecs], float* HWY_RESTRICT o, index_t dvp) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    HWY_UNROLL(8)
    for (int r = 0; r < kRows; ++r) {
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) hn::Store(acc[r][e], d, o + r * dvp + e * N);
    }
  }

  // Whether a bf16 half of the pair words[i * stride + c], i < n, c < width,
  // has the exponent bits `exponent` (in bf16's 0x7F80): 0 finds zero (and
  // denormal, flushed by VDPBF16PS) weights, 0x7F80 infinities and NaN.
  static bool AnyHalfWithExponent(const float* HWY_RESTRICT words, index_t n, index_t width, index_t stride,
                                  std::uint32_t exponent) {
    const DU du;
    const auto N = static_cast<index_t>(hn::Lanes(du));
    const VU lo = hn::Set(du, 0x7F80u), hi = hn::Set(du, 0x7F800000u);
    const VU want_lo = hn::Set(du, exponent & 0x7F80u), want_hi = hn::Set(du, (exponent << 16) & 0x7F800000u);
    const auto* w = reinterpret_cast<const std::uint32_t*>(words);
    VU found = hn::Zero(du);
    for (index_t i = 0; i < n; ++i) {
      index_t c = 0;
      for (; c + N <= width; c += N) {
        const VU x = hn::LoadU(du, w + i * stride + c);
        found = hn::Or(found, hn::VecFromMask(du, hn::Eq(hn::And(x, lo), want_lo)));
        found = hn::Or(found, hn::VecFromMask(du, hn::Eq(hn::And(x, hi), want_hi)));
      }
      for (; c < width; ++c) {
        const std::uint32_t x = w[i * stride + c];
        if ((x & 0x7F80u) == (exponent & 0x7F80u) || (x & 0x7F800000u) == ((exponent << 16) & 0x7F800000u)) {
          return true;
        }
      }
    }
    return !hn::AllFalse(du, hn::MaskFromVec(found));
  }

  template <bool kHw, bool kSelect>
  static void AccumulatePv(const float* HWY_RESTRICT pt2, index_t rows, index_t pairs, const float* HWY_RESTRICT vp,
                           index_t dvp, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o) {
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    const index_t all_vecs = dvp / N;
    for (index_t e0 = 0; e0 < all_vecs; e0 += K::kPvVecs) {
      K::WithBlockSize<K::kPvVecs>(all_vecs - e0, [&](auto vecs) {
        for (index_t r0 = 0; r0 < rows; r0 += K::kPvRows) {
          K::WithBlockSize<K::kPvRows>(rows - r0, [&](auto block_rows) {
            PvBlock<kHw, decltype(block_rows)::value, decltype(vecs)::value, kSelect>(
                pt2 + r0, pairs, vp + e0 * N, alpha + r0, o + r0 * dvp + e0 * N, dvp);
          });
        }
      });
    }
  }

  // rows: real rows (r < rows of O are updated); pairs = ceil(cols / 2). The
  // loop order of FlashKernel::accumulate_pv, and its NaN policy: the select
  // blocks only where a weight is zero and V holds a non-finite value.
  template <bool kHw>
  static void accumulate_pv(const float* HWY_RESTRICT pt2, index_t rows, index_t pairs, const float* HWY_RESTRICT vp,
                            index_t dvp, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o) {
    if (AnyHalfWithExponent(pt2, pairs, rows, kBq, 0u) && AnyHalfWithExponent(vp, pairs, dvp, dvp, 0x7F80u)) {
      AccumulatePv<kHw, true>(pt2, rows, pairs, vp, dvp, alpha, o);
    } else {
      AccumulatePv<kHw, false>(pt2, rows, pairs, vp, dvp, alpha, o);
    }
  }

  // Whether every bf16 half of the pair words vp[jj][e], jj < pairs, e < dvp,
  // is finite: for a V copy made once and read by many tiles (the forward's
  // band copies, attention/detail/packed_kv.hpp), which then take
  // accumulate_pv_unguarded.
  static bool pairs_finite(const float* HWY_RESTRICT vp, index_t pairs, index_t dvp) {
    return !AnyHalfWithExponent(vp, pairs, dvp, dvp, 0x7F80u);
  }

  // accumulate_pv where every value of Vp is known finite (the backward
  // checks its inputs once per call, the forward's band copies theirs once
  // per copy) or no weight is below the smallest normal float (the online
  // softmax saw none, so none is zero after rounding to bf16): no tile
  // needs the select blocks, so neither scan runs.
  template <bool kHw>
  static void accumulate_pv_unguarded(const float* HWY_RESTRICT pt2, index_t rows, index_t pairs,
                                      const float* HWY_RESTRICT vp, index_t dvp, const float* HWY_RESTRICT alpha,
                                      float* HWY_RESTRICT o) {
    AccumulatePv<kHw, false>(pt2, rows, pairs, vp, dvp, alpha, o);
  }

#if HWY_TARGET <= HWY_AVX3
  // ---- Decode: 8 rows per K/V group (a GQA group of 8, or up to 8 rows) --------
  // In the generic blocks above 8 rows fill half a vector; here the QK^T
  // takes FlashKernel::ScoresRowQuads' layout on pair words: a 128-bit block
  // holds one row's 4 consecutive pairs (block b of Qd[i][h] is Q[4h + b]'s
  // pairs 4i .. 4i + 3, built by FlashKernel::QuadQd from Qt2), so one
  // 128-bit broadcast of K[j][8i .. 8i + 7] (a load-port broadcast) feeds two
  // VDPBF16PS: 8 rows x 8 dims. The 4 partial sums of a row are added once
  // per key (FlashKernel::StoreQuadSums).
  //   QK^T block: kQuadKeys = 8 keys x 2 = 16 accumulators + 2 Qd vectors +
  //     1 broadcast; per 8 dims 2 Qd loads + 8 broadcasts for 16 VDPBF16PS.
  //     The 64-bit broadcasts of the layout before (a lane pair per row, 4
  //     dims a broadcast) took one load per VDPBF16PS, and 16 key pointers
  //     that did not fit the general registers.
  //   P.V block: 8 rows x kDecodePvVecs = 3 d-vectors = 24 accumulators + 3
  //     V pair vectors + 1 broadcast. V is paired on the fly, no Vp copy:
  //     per pair of keys and 16 dims, the two bf16 rows are zero-extended
  //     (one shifted up 16 bits) and ORed: 2 loads + 4 ALU ops feed 8
  //     VDPBF16PS (8 rows). P is packed into pairs in place (8 lanes).
  // Traffic per 64-key tile and K/V group, d = 128: K 16 KiB and V 16 KiB
  //   read once from memory (the only DRAM traffic of decode); Qd 2 KiB, St
  //   and Pt2 2 KiB, O 4 KiB, all in L1. 64 VDPBF16PS per key and group
  //   (QK^T 32, P.V 32), against 128 FMAs plus the widening of 512 bytes
  //   on the fp32 path.
  // Measured (bench/bf16_dot.cpp's BM_Probe, 4 in-cache tiles of 8 rows x 64
  //   keys, d = 128, one thread, 2026-11-26, the 2-vCPU Intel Xeon VM with AMX
  //   of the README, AVX3_DL with AVX512_BF16, with the QK^T layout before):
  //   pair dot 14.1-14.4 us, widen 13.2 us, AMX 4.5 us. VDPBF16PS runs at half
  //   the fp32 FMA's FLOP rate there (bench/bf16_dot.cpp: 106 against 211
  //   GFLOP/s), so the probe keeps decode on AMX on that CPU (on widening
  //   without AMX); the pair path is for CPUs whose pair dot is fast (Zen
  //   4/5), and the tests force it everywhere.
  static constexpr int kDecodePvVecs = 3;
  static constexpr index_t kDecodeMaxDk = K::kPairMaxDk;  // stack buffer of Qd

  static bool decode_rows(index_t rows_padded) { return rows_padded == K::kLanes / 2; }

  // St[j][r] = scale * (Q[r] . K[j]) for 8 rows; qt2: Qt2 + the group's first row.
  template <bool kHw>
  static HWY_NOINLINE void scores_decode(const float* HWY_RESTRICT qt2, index_t dk, const std::uint16_t* const* krows,
                                         index_t cols, float scale, float* HWY_RESTRICT st, const RowsAhead& ahead) {
    static_assert(K::kLanes == 16, "4 x 4 blocks of 16 32-bit lanes");
    constexpr int kKeys = K::kQuadKeys;
    const DU du;
    const hn::Rebind<std::uint16_t, hn::Half<D>> d16;  // 8 bf16: one 128-bit block
    const index_t octs = dk / 8, rest = dk % 8;
    HWY_ALIGN float qd[kDecodeMaxDk / 4 * 32 + 32];
    K::QuadQd(qt2, (dk + 1) / 2, qd);
    AheadStream stream(ahead, (cols + kKeys - 1) / kKeys);
    for (index_t j0 = 0; j0 < cols; j0 += kKeys) {
      stream.step();  // once per key group, outside the dims loop: its accumulators stay in registers
      const int keys = static_cast<int>(std::min<index_t>(kKeys, cols - j0));
      const std::uint16_t* kp[kKeys];
      HWY_UNROLL(8)
      for (int j = 0; j < kKeys; ++j) kp[j] = krows[j0 + std::min(j, keys - 1)];
      V acc[kKeys][2];
      HWY_UNROLL(8)
      for (int j = 0; j < kKeys; ++j) acc[j][0] = acc[j][1] = hn::Zero(D());
      for (index_t i = 0; i < octs; ++i) {
        const VU q0 = hn::Load(du, reinterpret_cast<const std::uint32_t*>(qd) + 32 * i);
        const VU q1 = hn::Load(du, reinterpret_cast<const std::uint32_t*>(qd) + 32 * i + 16);
        HWY_UNROLL(8)
        for (int j = 0; j < kKeys; ++j) {
          const VU b = hn::BitCast(du, hn::LoadDup128(hn::Repartition<std::uint16_t, D>(), kp[j] + 8 * i));
          acc[j][0] = PairDot<kHw>(acc[j][0], q0, b);
          acc[j][1] = PairDot<kHw>(acc[j][1], q1, b);
        }
      }
      if (rest != 0) {  // the last 1-7 dims: K beyond dk is not read (zero), Qd is zero there
        const VU q0 = hn::Load(du, reinterpret_cast<const std::uint32_t*>(qd) + 32 * octs);
        const VU q1 = hn::Load(du, reinterpret_cast<const std::uint32_t*>(qd) + 32 * octs + 16);
        const auto m = hn::FirstN(d16, static_cast<std::size_t>(rest));
        HWY_UNROLL(8)
        for (int j = 0; j < kKeys; ++j) {
          HWY_ALIGN std::uint16_t tail[8];
          hn::Store(hn::MaskedLoad(m, d16, kp[j] + 8 * octs), d16, tail);
          const VU b = hn::BitCast(du, hn::LoadDup128(hn::Repartition<std::uint16_t, D>(), tail));
          acc[j][0] = PairDot<kHw>(acc[j][0], q0, b);
          acc[j][1] = PairDot<kHw>(acc[j][1], q1, b);
        }
      }
      K::StoreQuadSums(acc, keys, scale, st + j0 * kBq);
    }
  }

  // pack_p for the 8 rows of one group (half vectors: the next group's lanes untouched).
  static void pack_p_decode(float* st, index_t cols) {
    const hn::Half<DU> du;
    const auto bias = hn::Set(du, 0x7FFFu), one = hn::Set(du, 1u), hi = hn::Set(du, 0xFFFF0000u);
    auto round = [&](hn::Vec<hn::Half<DU>> x) {
      return hn::Add(x, hn::Add(bias, hn::And(hn::ShiftRight<16>(x), one)));
    };
    auto* words = reinterpret_cast<std::uint32_t*>(st);
    for (index_t jj = 0; 2 * jj < cols; ++jj) {
      const std::uint32_t* s0 = words + 2 * jj * kBq;
      const auto x0 = round(hn::Load(du, s0));
      const auto x1 = 2 * jj + 1 < cols ? round(hn::Load(du, s0 + kBq)) : hn::Zero(du);
      hn::Store(hn::Or(hn::ShiftRight<16>(x0), hn::And(x1, hi)), du, words + jj * kBq);
    }
  }

  // V rows j < cols (bf16 bits, dims < dv): whether one holds an infinity or NaN.
  static bool AnyNonFiniteRows(const std::uint16_t* const* vrows, index_t cols, index_t dv) {
    const hn::Rebind<std::uint16_t, D> d16;
    const auto N = static_cast<index_t>(hn::Lanes(d16));
    const auto exp = hn::Set(d16, std::uint16_t{0x7F80});
    auto found = hn::Zero(d16);
    for (index_t j = 0; j < cols; ++j) {
      for (index_t e = 0; e < dv; e += N) {
        const auto x = hn::MaskedLoad(hn::FirstN(d16, static_cast<std::size_t>(dv - e)), d16, vrows[j] + e);
        found = hn::Or(found, hn::VecFromMask(d16, hn::Eq(hn::And(x, exp), exp)));
      }
    }
    return !hn::AllFalse(d16, hn::MaskFromVec(found));
  }

  // (V[j0][e..e+15], V[j1][e..e+15]) as 16 bf16 pairs; dims outside `m`
  // (FirstN(dv - e)) read as 0; j1 == nullptr: the missing key of an odd tile, 0.
  using Mask16 = hn::Mask<hn::Rebind<std::uint16_t, D>>;
  static HWY_INLINE VU PairRows(const std::uint16_t* r0, const std::uint16_t* r1, index_t e, Mask16 m) {
    const DU du;
    const hn::Rebind<std::uint16_t, D> d16;
    const VU lo = hn::PromoteTo(du, hn::MaskedLoad(m, d16, r0 + e));
    if (r1 == nullptr) return lo;
    return hn::Or(lo, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::MaskedLoad(m, d16, r1 + e))));
  }

  // stream: null, or the rows ahead, stepped once per two pairs of keys
  // (once per pair cost 4-10 % where K and V sit in the last-level cache:
  // GQA 8/1 over 32k keys, bf16, Zen 5).
  template <bool kHw, int kVecs, bool kSelect>
  static HWY_INLINE void DecodePvBlock(const float* HWY_RESTRICT pt2, const std::uint16_t* const* vrows, index_t cols,
                                       index_t e0, index_t dv, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                                       index_t dvp, AheadStream* stream) {
    constexpr int kRows = static_cast<int>(K::kLanes / 2);
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    V acc[kRows][kVecs];
    ScaledRows<kRows, kVecs>(alpha, o + e0, dvp, acc);
    const index_t pairs = (cols + 1) / 2;
    Mask16 dims[kVecs];  // once per block, not per key pair
    HWY_UNROLL(4)
    for (int e = 0; e < kVecs; ++e) {
      dims[e] = hn::FirstN(hn::Rebind<std::uint16_t, D>(), static_cast<std::size_t>(dv - (e0 + e * N)));
    }
    for (index_t jj = 0; jj < pairs; ++jj) {
      if (stream != nullptr && jj % 2 == 0) stream->step();
      const std::uint16_t* r0 = vrows[2 * jj];
      const std::uint16_t* r1 = 2 * jj + 1 < cols ? vrows[2 * jj + 1] : nullptr;
      VU vv[kVecs];
      HWY_UNROLL(4)
      for (int e = 0; e < kVecs; ++e) vv[e] = PairRows(r0, r1, e0 + e * N, dims[e]);
      AddPairDots<kHw, kRows, kVecs, kSelect>(pt2 + jj * kBq, vv, acc);
    }
    StoreRows<kRows, kVecs>(acc, o + e0, dvp);
  }

  // O[r][e] = alpha[r] O[r][e] + sum_jj dot2(Pt2[jj][r], (V[2jj][e], V[2jj+1][e])), r < 8, e < dvp;
  // V read in place (vrows[j], j < cols); dims in [dv, dvp) add 0. rows: the
  // real rows (the NaN policy's zero-weight scan), which runs only where the
  // softmax saw a tiny weight (`tiny_weight`; an odd tile's missing last key
  // has a zero weight and a zero V). `ahead`'s rows are requested over every
  // block of dims.
  template <bool kHw>
  static void accumulate_pv_decode(const float* HWY_RESTRICT pt2, index_t rows, const std::uint16_t* const* vrows,
                                   index_t cols, index_t dv, index_t dvp, const float* HWY_RESTRICT alpha,
                                   float* HWY_RESTRICT o, bool tiny_weight, const RowsAhead& ahead) {
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    const index_t pairs = (cols + 1) / 2;
    const bool select =
        tiny_weight && AnyHalfWithExponent(pt2, pairs, rows, kBq, 0u) && AnyNonFiniteRows(vrows, cols, dv);
    AheadStream stream(ahead, (dvp / N + kDecodePvVecs - 1) / kDecodePvVecs * ((pairs + 1) / 2));
    AheadStream* const requests = ahead.empty() ? nullptr : &stream;
    for (index_t e0 = 0; e0 < dvp; e0 += kDecodePvVecs * N) {
      K::WithBlockSize<kDecodePvVecs>((dvp - e0) / N, [&](auto vecs) {
        if (select) {
          DecodePvBlock<kHw, decltype(vecs)::value, true>(pt2, vrows, cols, e0, dv, alpha, o, dvp, requests);
        } else {
          DecodePvBlock<kHw, decltype(vecs)::value, false>(pt2, vrows, cols, e0, dv, alpha, o, dvp, requests);
        }
      });
    }
  }
#else
  static bool decode_rows(index_t) { return false; }
#endif

  // ---- Choosing the path -------------------------------------------------------

  // One in-cache tile (kBlockQ rows x kBlockKv keys, d = 128) through each
  // path's per-tile work: widen = K and V to fp32 + FlashKernel::scores +
  // accumulate_pv; native = scores on K in place + pack P + pack V + pair P.V;
  // amx = AmxTiles' steps (K in place). The softmax, common to all, is left
  // out. Buffers are allocated here, once; the timed loops allocate nothing.
  struct ProbeTile {
    static constexpr index_t kD = 128;
    std::vector<bfloat16> k, v;
    detail::AlignedFloats qt, qt2, kbuf, vbuf, st, o, alpha;
    std::vector<const std::uint16_t*> krows;
    ProbeTile()
        : k(static_cast<std::size_t>(kBkv * kD)),
          v(k.size()),
          qt(kD * kBq),
          qt2(kD * kBq),
          kbuf(kBkv * kD),
          vbuf(kBkv * kD),
          st(kBkv * kBq),
          o(kBq * kD),
          alpha(kBq),
          krows(static_cast<std::size_t>(kBkv)) {
      // Small values, alpha = 1/2: nothing overflows or turns denormal over
      // many repetitions (denormals would slow the fp32 path only).
      for (std::size_t i = 0; i < k.size(); ++i) {
        k[i] = bfloat16(0.01f * static_cast<float>(static_cast<int>(i % 17) - 8));
        v[i] = bfloat16(0.02f * static_cast<float>(static_cast<int>(i % 13) - 6));
      }
      for (index_t i = 0; i < kD * kBq; ++i) qt.get()[i] = 0.01f * static_cast<float>(i % 11);
      for (index_t i = 0; i < kD * kBq; ++i) store_u32(qt2.get() + i, 0x3C003C00u);  // (2^-7, 2^-7)
      std::fill_n(alpha.get(), kBq, 0.5f);
      for (index_t j = 0; j < kBkv; ++j) krows[static_cast<std::size_t>(j)] = bits_of(k.data() + j * kD);
    }
    // The head dim through a volatile, so the compiler does not fold the
    // kernels' tail loops for this one constant shape (GCC then warns about
    // their iteration counts).
    static index_t opaque(index_t x) {
      volatile index_t v = x;
      return v;
    }
    void widen() {
      const index_t kd = opaque(kD);
      for (index_t j = 0; j < kBkv; ++j) K::to_f32(k.data() + j * kd, kd, kbuf.get() + j * kd);
      K::scores(qt.get(), kBq, kd, kbuf.get(), kd, kBkv, st.get());
      for (index_t j = 0; j < kBkv; ++j) K::to_f32(v.data() + j * kd, kd, vbuf.get() + j * kd);
      K::accumulate_pv(st.get(), kBq, kBkv, vbuf.get(), kd, kd, alpha.get(), o.get());
    }
    template <bool kHw>
    void native() {
      const index_t kd = opaque(kD);
      Bf16DotKernel::scores<kHw>(qt2.get(), kBq, kd, krows.data(), kBkv, 1.0f, st.get());
      pack_p(st.get(), kBkv, kBq);
      pack_v([&](index_t j) { return v.data() + j * kd; }, 1, kBkv, kd, kd, vbuf.get());
      Bf16DotKernel::accumulate_pv<kHw>(st.get(), kBq, kBkv / 2, vbuf.get(), kd, alpha.get(), o.get());
    }
    // The same per-tile work for a decode tile: kDecodeRows query rows (a
    // GQA group of 8), 64 keys.
    static constexpr index_t kDecodeRows = 8;
    void widen_decode() {
      const index_t kd = opaque(kD);
      for (index_t j = 0; j < kBkv; ++j) K::to_f32(k.data() + j * kd, kd, kbuf.get() + j * kd);
      K::scores(qt.get(), K::padded_rows(kDecodeRows), kd, kbuf.get(), kd, kBkv, st.get());
      for (index_t j = 0; j < kBkv; ++j) K::to_f32(v.data() + j * kd, kd, vbuf.get() + j * kd);
      K::accumulate_pv(st.get(), kDecodeRows, kBkv, vbuf.get(), kd, kd, alpha.get(), o.get());
    }
#if HWY_TARGET <= HWY_AVX3
    template <bool kHw>
    void native_decode() {
      const index_t kd = opaque(kD);
      scores_decode<kHw>(qt2.get(), kd, krows.data(), kBkv, 1.0f, st.get(), {});
      pack_p_decode(st.get(), kBkv);
      const std::uint16_t* vrows[kBkv];
      for (index_t j = 0; j < kBkv; ++j) vrows[j] = bits_of(v.data() + j * kd);
      accumulate_pv_decode<kHw>(st.get(), kDecodeRows, vrows, kBkv, kd, kd, alpha.get(), o.get(), true, {});
    }
#endif
    void amx_decode() {
      amx::TileScope scope;  // as a task holds its tiles
      const index_t kd = opaque(kD), rows16 = amx_rows(kDecodeRows);
      amx::key_query_scores(krows[0], static_cast<std::size_t>(kd) * 2, kBkv,
                            reinterpret_cast<const std::uint32_t*>(qt2.get()), kBq * sizeof(float), rows16, kd,
                            st.get(), kBq * sizeof(float), &scope);
      scale_rows(st.get(), kBkv, kDecodeRows, 1.0f);
      auto* pq = reinterpret_cast<std::uint16_t*>(kbuf.get());
      amx::bf16_rows(st.get(), 1, kBq, kDecodeRows, kBkv, kBkv, rows16, pq);
      pack_v([&](index_t j) { return v.data() + j * kd; }, 1, kBkv, kd, kd, vbuf.get());
      scale_o(o.get(), kDecodeRows, kd, alpha.get());
      amx::accumulate_pv(pq, kBkv * 2, rows16, kBkv, reinterpret_cast<const std::uint32_t*>(vbuf.get()),
                         static_cast<std::size_t>(kd) * sizeof(float), kd, o.get(),
                         static_cast<std::size_t>(kd) * sizeof(float), &scope);
    }
    void amx() {
      amx::TileScope scope;  // as a task holds its tiles
      const index_t kd = opaque(kD);
      amx::key_query_scores(krows[0], static_cast<std::size_t>(kd) * 2, kBkv,
                            reinterpret_cast<const std::uint32_t*>(qt2.get()), kBq * sizeof(float), kBq, kd, st.get(),
                            kBq * sizeof(float), &scope);
      scale_rows(st.get(), kBkv, kBq, 1.0f);
      auto* pq = reinterpret_cast<std::uint16_t*>(kbuf.get());
      amx::bf16_rows(st.get(), 1, kBq, kBq, kBkv, kBkv, kBq, pq);
      pack_v([&](index_t j) { return v.data() + j * kd; }, 1, kBkv, kd, kd, vbuf.get());
      scale_o(o.get(), kBq, kd, alpha.get());
      amx::accumulate_pv(pq, kBkv * 2, kBq, kBkv, reinterpret_cast<const std::uint32_t*>(vbuf.get()),
                         static_cast<std::size_t>(kd) * sizeof(float), kd, o.get(),
                         static_cast<std::size_t>(kd) * sizeof(float), &scope);
    }
  };

  template <class F>
  static double best_seconds(F&& f, int reps) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  }

  // Seconds per tile of each path this CPU can run (1e30 for the others),
  // best of 2 rounds x 3 tiles, alternating (a tile is 4.2 MFLOP, 25-50 us
  // on one core with the vector unit: the probe takes 0.5-1.5 ms).
  // decode_*: the same for a decode tile (8 rows), 4 tiles per timing.
  struct ProbeSeconds {
    double widen = 1e30, pairs = 1e30, amx = 1e30;
    double decode_widen = 1e30, decode_pairs = 1e30, decode_amx = 1e30;
  };
  static ProbeSeconds probe_seconds() {
    ProbeTile tile;
    ProbeSeconds s;
    const bool pairs = kNative && instruction_available(), with_amx = amx::available();
    [[maybe_unused]] constexpr bool kDecodePairs = kNative && HWY_TARGET <= HWY_AVX3;
    const auto four = [](auto&& f) {
      for (int i = 0; i < 4; ++i) f();
    };
    tile.widen();
    tile.widen_decode();
    if constexpr (kNative) {
      if (pairs) tile.template native<true>();
    }
#if HWY_TARGET <= HWY_AVX3
    if constexpr (kDecodePairs) {
      if (pairs) tile.template native_decode<true>();
    }
#endif
    if (with_amx) {
      tile.amx();
      tile.amx_decode();
    }
    for (int round = 0; round < 2; ++round) {
      s.widen = std::min(s.widen, best_seconds([&] { tile.widen(); }, 3));
      s.decode_widen = std::min(s.decode_widen, best_seconds([&] { four([&] { tile.widen_decode(); }); }, 3));
      if constexpr (kNative) {
        if (pairs) s.pairs = std::min(s.pairs, best_seconds([&] { tile.template native<true>(); }, 3));
      }
#if HWY_TARGET <= HWY_AVX3
      if constexpr (kDecodePairs) {
        if (pairs) {
          s.decode_pairs =
              std::min(s.decode_pairs, best_seconds([&] { four([&] { tile.template native_decode<true>(); }); }, 3));
        }
      }
#endif
      if (with_amx) {
        s.amx = std::min(s.amx, best_seconds([&] { tile.amx(); }, 3));
        s.decode_amx = std::min(s.decode_amx, best_seconds([&] { four([&] { tile.amx_decode(); }); }, 3));
      }
    }
    return s;
  }

  // A one-time runtime probe rather than a per-target constant: the target
  // says whether an instruction exists, not how fast it is. VDPBF16PS issues
  // at one or two per cycle depending on the core (and AMD Zen 4 splits zmm
  // ops), AMX trades vector work for packing, and the paths also change
  // memory traffic, so which path wins is a property of the CPU, measured
  // once per process (function-local static: thread-safe, at the first bf16
  // call on a path-eligible task).
  static const ProbeSeconds& probed() {
    static const ProbeSeconds s = probe_seconds();
    return s;
  }

  // The backward has no probe of its own: its five products per tile are
  // the forward's two kinds (scores and P.V-like accumulations) on the same
  // layouts, so the forward's probe picks its arithmetic too. AMX or the
  // pair dot where forced or where the probe found it the fastest; widen
  // otherwise. Pairs without the instruction (the emulation) only when forced.
  static detail::Bf16Tiles backward_tiles() {
    using detail::Bf16Tiles;
    const Bf16DotPath path = bf16_dot_path();
    const bool hw_pairs = kNative && instruction_available();
    const auto pairs = [&] { return hw_pairs ? Bf16Tiles::pairs : Bf16Tiles::emulated_pairs; };
    if (path == Bf16DotPath::widen) return Bf16Tiles::widen;
    if (path == Bf16DotPath::native) return pairs();
    if (path == Bf16DotPath::amx && amx::available()) return Bf16Tiles::amx;
    if (!hw_pairs && !amx::available()) return Bf16Tiles::widen;  // nothing to probe
    const ProbeSeconds& s = probed();
    if (amx::available() && s.amx < s.widen && s.amx <= s.pairs) return Bf16Tiles::amx;
    if (hw_pairs && s.pairs < s.widen) return Bf16Tiles::pairs;
    return Bf16Tiles::widen;
  }

  // ---- Which arithmetic runs a task (asked by the engine's run_task) ----------
  // Widen for tasks with few rows (decode: memory-bound) or K rows not
  // contiguous along the head dim; pairs and AMX where the task's rows fit
  // their blocks (whole vectors / 16-row blocks per stacked K/V group; AMX
  // also needs dk a multiple of 32, at least 64). The path setting
  // (bf16_dot.hpp) forces one; automatic takes the fastest the probe timed
  // among those the task can use.
  template <class T, class Var>
  static detail::Bf16Tiles choose_tiles(const detail::TiledCall<K, T, Var>& c, index_t task) {
    using detail::Bf16Tiles;
    if constexpr (!std::is_same_v<T, bfloat16>) {
      return Bf16Tiles::widen;
    } else {
      const detail::WorkUnit& u = c.w.unit_of(task);
      const auto N = static_cast<index_t>(hn::Lanes(D()));
      if (c.p.k_strides.dim != 1) return Bf16Tiles::widen;
      // Decode (few rows): the decode probe's times; 8-row groups take the
      // decode pair blocks, and AMX pads each group to 16 rows.
      const bool decode = u.rows() <= kBq / 4;
      const bool pairs_fit = u.kv_groups == 1 || u.group_rows() % N == 0 || decode_rows(u.group_rows());
      const bool amx_fits = amx::available() && c.p.dk % 32 == 0 && c.p.dk >= 64 &&
                            (u.kv_groups == 1 || u.group_rows() % 16 == 0 || (decode && u.group_rows() < 16));
      const Bf16DotPath path = bf16_dot_path();
      const auto pairs = [&] {
        detail::bf16_native_task_count().fetch_add(1, std::memory_order_relaxed);
        // The emulation runs where SEQATTN_BF16_DOT=1 or set_bf16_dot_path forces pairs without the instruction.
        return kNative && instruction_available() ? Bf16Tiles::pairs : Bf16Tiles::emulated_pairs;
      };
      const auto with_amx = [] {
        detail::bf16_amx_task_count().fetch_add(1, std::memory_order_relaxed);
        return Bf16Tiles::amx;
      };
      if (path == Bf16DotPath::widen) return Bf16Tiles::widen;
      if (path == Bf16DotPath::native) return pairs_fit ? pairs() : Bf16Tiles::widen;
      if (path == Bf16DotPath::amx && amx_fits) return with_amx();
      if constexpr (!kNative) {
        if (!amx::available()) return Bf16Tiles::widen;  // nothing to probe
      }
      const ProbeSeconds& s = probed();
      const double widen_s = decode ? s.decode_widen : s.widen;
      const double amx_s = amx_fits ? (decode ? s.decode_amx : s.amx) : 1e30;
      const double pairs_s = pairs_fit ? (decode ? s.decode_pairs : s.pairs) : 1e30;
      if (amx_s < widen_s && amx_s <= pairs_s) return with_amx();
      if (pairs_s < widen_s) return pairs();
      return Bf16Tiles::widen;
    }
  }

  // pack_v of a tile's V rows of one K/V head, their pointers taken one
  // block-table lookup per page (for_kv_rows).
  static void pack_tile_v(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq,
                          index_t kv_head, const ScoreTile& tile, index_t dvp, float* vp) {
    const bfloat16* rows[kBkv];
    p.for_kv_rows(seq, true, tile.kv_begin, tile.cols, kv_head,
                  [&rows](index_t j, const bfloat16* row) { rows[j] = row; });
    pack_v([&rows](index_t j) { return rows[j]; }, p.v_strides.dim, tile.cols, p.dv, dvp, vp);
  }

  // The tile arithmetic of run_task_steps (attention/detail/tiled_forward.hpp)
  // on bf16 pairs: Qt2 (ceil(dk / 2) x kBlockQ pairs, in the Qt buffer), K
  // read in place row by row (a paged cache's rows may lie in several pages),
  // P and V packed into pairs. kHw: the instruction, else its emulation.
  template <bool kHw>
  struct PairDotTiles {
    // The running band's V pair words (attention/detail/packed_kv.hpp), or null.
    const detail::BandKv<bfloat16>* band = nullptr;

    // P is rounded to bf16 before P.V: its exponentials need no more precision.
    static bool online_softmax(float* st, index_t cols, index_t rows_p, float* m, float* l, float* alpha) {
      return K::online_softmax_to_bf16(st, cols, rows_p, m, l, alpha);
    }
    void load_query(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq,
                    const detail::TaskRows& t, float, detail::TileScratch<K>& sc) const {
      pack_query(p, seq, t, sc.row_q.data(), sc.row_head.data(), sc.qt.get());
    }
    // `ahead`: requested by the decode blocks (RowsAhead); the prefill
    // kernels have no requests in their loops, so the engine hands none.
    static constexpr bool kDecodeRowsAhead = true, kPrefillRowsAhead = false;
    void scores(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq, index_t kv_head,
                index_t r0, float q_scale, const ScoreTile& tile, detail::TileScratch<K>& sc,
                [[maybe_unused]] const RowsAhead& ahead) const {
      const std::uint16_t* krows[kBkv];
      p.for_kv_rows(seq, false, tile.kv_begin, tile.cols, kv_head,
                    [&krows](index_t j, const bfloat16* row) { krows[j] = bits_of(row); });
#if HWY_TARGET <= HWY_AVX3
      if (decode_rows(tile.rows_padded) && p.dk <= kDecodeMaxDk) {
        scores_decode<kHw>(sc.qt.get() + r0, p.dk, krows, tile.cols, q_scale, tile.scores, ahead);
        return;
      }
#endif
      Bf16DotKernel::scores<kHw>(sc.qt.get() + r0, tile.rows_padded, p.dk, krows, tile.cols, q_scale, tile.scores);
    }
    // tiny_weight: online_softmax's answer (false: no weight is zero).
    void accumulate(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq, index_t kv_head,
                    index_t dvp, const ScoreTile& tile, const float* alpha, float* o, detail::TileScratch<K>& sc,
                    [[maybe_unused]] const RowsAhead& ahead, bool tiny_weight) const {
#if HWY_TARGET <= HWY_AVX3
      if (decode_rows(tile.rows_padded) && p.dk <= kDecodeMaxDk && p.v_strides.dim == 1) {
        const std::uint16_t* vrows[kBkv];
        p.for_kv_rows(seq, true, tile.kv_begin, tile.cols, kv_head,
                      [&vrows](index_t j, const bfloat16* row) { vrows[j] = bits_of(row); });
        pack_p_decode(tile.scores, tile.cols);
        accumulate_pv_decode<kHw>(tile.scores, tile.rows, vrows, tile.cols, p.dv, dvp, alpha, o, tiny_weight, ahead);
        return;
      }
#endif
      pack_p(tile.scores, tile.cols, tile.rows_padded);
      // The band's pairs where the tile's first key begins one; a tile whose
      // odd last key pairs with the next key's V gives that key a zero weight
      // (pack_p), and accumulate_pv skips zero weights where V is not finite.
      // A band copy knows whether its V is finite; a tile's own copy, and a
      // band chunk with a non-finite value, are scanned by accumulate_pv
      // where the tile has a zero weight: where the softmax saw no tiny
      // weight, only an odd tile's missing key can have one.
      const float* vp = sc.vbuf.get();
      bool finite = false;
      const index_t pairs = (tile.cols + 1) / 2;
      if (band != nullptr && band->v_pairs && tile.kv_begin % 2 == 0) {
        vp = band->pairs_from(tile.kv_begin);
        finite = band->v_pairs_finite(tile.kv_begin, tile.kv_begin + 2 * pairs);
      } else {
        pack_tile_v(p, seq, kv_head, tile, dvp, sc.vbuf.get());
      }
      if (finite || (!tiny_weight && tile.cols % 2 == 0)) {
        accumulate_pv_unguarded<kHw>(tile.scores, tile.rows, pairs, vp, dvp, alpha, o);
      } else {
        Bf16DotKernel::accumulate_pv<kHw>(tile.scores, tile.rows, pairs, vp, dvp, alpha, o);
      }
    }
  };

  // ---- AMX tiles (backends/amx.hpp) ---------------------------------------------
  // The same steps on Intel AMX: QK^T as K . Qt2 straight into St[key][row]
  // (K in place run by run where its runs are whole 16-key tiles, else a
  // zero-padded copy in kbuf: amx_scores), scaled after; P rounded to bf16 (nearest even)
  // and transposed into Pq[row][key] (kbuf, free again after the scores;
  // amx::bf16_rows, 16 x 16 word transposes), V packed into pairs (vbuf,
  // pack_v), O scaled by alpha, then O += Pq . Vp.
  // NaN policy: a tile with a zero (or bf16-denormal, flushed by the unit)
  // weight and a non-finite V value runs FlashKernel::accumulate_pv on the
  // fp32 P and a widened V instead, which skips zero weights; only a tile
  // whose softmax saw a tiny weight is scanned for them.
  // Conditions (choose_tiles): dk a multiple of 32 and >= 64, whole 16-row
  // blocks per K/V group.
  static constexpr index_t kAmxKeys = 32;
  // Rows of the AMX blocks: whole 16-row tiles, or fewer rows in one narrowed
  // tile (decode: a group of 8 rows never touches the next group's).
  static index_t amx_rows(index_t rows) { return rows < 16 ? rows : (rows + 15) / 16 * 16; }
  static index_t amx_keys(index_t cols) { return (cols + kAmxKeys - 1) / kAmxKeys * kAmxKeys; }

  // st may start at a decode group's row 8 (half a vector in): unaligned
  // vectors, and the rows past the last whole vector one by one.
  static void scale_rows(float* st, index_t cols, index_t rows_p, float scale) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const V s = hn::Set(d, scale);
    for (index_t j = 0; j < cols; ++j) {
      float* row = st + j * kBq;
      index_t r = 0;
      for (; r + N <= rows_p; r += N) hn::StoreU(hn::Mul(hn::LoadU(d, row + r), s), d, row + r);
#if HWY_TARGET <= HWY_AVX3
      {
        const hn::Half<D> dh;
        if (r + N / 2 <= rows_p) {
          hn::StoreU(hn::Mul(hn::LoadU(dh, row + r), hn::LowerHalf(dh, s)), dh, row + r);
          r += N / 2;
        }
      }
#endif
      for (; r < rows_p; ++r) row[r] *= scale;
    }
  }

  // O[r] *= alpha[r], but for rows whose running max held (alpha exactly 1:
  // x * 1 == x, NaN included): most rows of a long causal or windowed row
  // range past its first tiles, where this pass cost as much as half of an
  // AMX product.
  static void scale_o(float* o, index_t rows, index_t dvp, const float* alpha) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    for (index_t r = 0; r < rows; ++r) {
      if (alpha[r] == 1.0f) continue;
      const V a = hn::Set(d, alpha[r]);
      for (index_t e = 0; e < dvp; e += N) hn::Store(hn::Mul(hn::Load(d, o + r * dvp + e), a), d, o + r * dvp + e);
    }
  }

  // QK^T of a tile on AMX into St[key][row] (unscaled): K . Qt2, K read in
  // place one product per run of evenly strided rows (the whole tile when
  // contiguous, a page at a time in a paged cache) where each run is whole
  // 16-key A tiles and the rows do not overlap; else K copied (dk bf16 per
  // row, one block-table lookup per page) into `buf` with zero rows up to
  // whole 32-key steps, one product. V's rows, too, come one lookup per
  // page (pack_tile_v). Until 2026-11-28 every paged tile was
  // copied with a lookup per row: decode over 32k keys in pages of 16 took
  // 1.27x (GQA 32/4) and 1.31x (8/1) the time of contiguous K/V, now 1.04-1.07x
  // and 1.14-1.16x (minimum of 16-30 calls alternating in one process, 2
  // threads of the Xeon VM with AMX of the README).
  static void amx_scores(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq,
                         index_t kv_head, const ScoreTile& tile, const std::uint32_t* qt2, index_t rows16,
                         std::uint16_t* buf, amx::TileScope* scope) {
    constexpr std::size_t kStBytes = kBq * sizeof(float);
    struct Run {
      index_t first = 0, keys = 0;
      const bfloat16* k = nullptr;
    };
    Run runs[kBkv / 16];  // whole 16-key tiles: at most this many runs
    int count = 0;
    bool in_place = p.k_strides.token >= p.dk;
    p.for_kv_runs(seq, false, tile.kv_begin, tile.cols, kv_head, [&](index_t j, index_t run, const bfloat16* k) {
      in_place = in_place && run % 16 == 0;
      if (in_place) runs[count++] = {j, run, k};
    });
    if (in_place) {
      const auto token_bytes = static_cast<std::size_t>(p.k_strides.token) * sizeof(std::uint16_t);
      for (int r = 0; r < count; ++r) {
        amx::key_query_scores(bits_of(runs[r].k), token_bytes, runs[r].keys, qt2, kStBytes, rows16, p.dk,
                              tile.scores + runs[r].first * kBq, kStBytes, scope);
      }
      return;
    }
    const index_t keys = amx_keys(tile.cols);
    const auto row_bytes = static_cast<std::size_t>(p.dk) * sizeof(std::uint16_t);
    p.for_kv_rows(seq, false, tile.kv_begin, tile.cols, kv_head,
                  [&](index_t j, const bfloat16* k) { std::memcpy(buf + j * p.dk, bits_of(k), row_bytes); });
    std::fill(buf + tile.cols * p.dk, buf + keys * p.dk, std::uint16_t{0});
    amx::key_query_scores(buf, row_bytes, keys, qt2, kStBytes, rows16, p.dk, tile.scores, kStBytes, scope);
  }

  struct AmxTiles {
    // The task's tiles: loaded at its first product, released when the task
    // (the engine's run_task_steps, which holds this object) ends.
    mutable amx::TileScope scope;
    // P is rounded to bf16 before P.V (but for the fp32 P.V of a tile with a
    // zero weight beside a non-finite V, below, where the 3e-6 of the
    // exponentials stays under bf16's own error): no more precision needed.
    static bool online_softmax(float* st, index_t cols, index_t rows_p, float* m, float* l, float* alpha) {
      return K::online_softmax_to_bf16(st, cols, rows_p, m, l, alpha);
    }
    void load_query(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq,
                    const detail::TaskRows& t, float, detail::TileScratch<K>& sc) const {
      pack_query(p, seq, t, sc.row_q.data(), sc.row_head.data(), sc.qt.get());
    }
    // The tile loads of AMX cannot interleave requests for rows ahead, and
    // requests from the vector passes beside them (scaling the scores,
    // rescaling O) measured slower in prefill and in-cache decode
    // (2026-11-28, the Xeon VM of the README: bf16 causal 16k 882 -> 976 ms,
    // decode GQA 32/4 over 4k keys 0.52 -> 0.57 ms, minimum of three
    // alternations each), and so did requests spread over pack_v in paged
    // decode, whose random page order the hardware prefetchers cannot
    // follow (pages of 16, 32k keys, 2 threads: GQA 8/1 0.96 -> 1.06 ms
    // into L1, 1.10 into L2; 32/4 5.02 -> 6.07 and 5.99 ms): the engine
    // hands none.
    static constexpr bool kDecodeRowsAhead = false, kPrefillRowsAhead = false;
    void scores(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq, index_t kv_head,
                index_t r0, float q_scale, const ScoreTile& tile, detail::TileScratch<K>& sc, const RowsAhead&) const {
      amx_scores(p, seq, kv_head, tile, reinterpret_cast<const std::uint32_t*>(sc.qt.get() + r0),
                 amx_rows(tile.rows_padded), reinterpret_cast<std::uint16_t*>(sc.kbuf.get()), &scope);
      scale_rows(tile.scores, tile.cols, tile.rows_padded, q_scale);
    }
    // The scans run only where the softmax saw a tiny weight: a weight of at
    // least the smallest normal float rounds to a nonzero, normal bf16, and
    // the keys past the tile's (an odd tile's last pair, the padding to 32)
    // meet zero V rows, which pack_v and the fill below write.
    void accumulate(const detail::AttentionProblem<bfloat16>& p, const detail::SequenceGeometry& seq, index_t kv_head,
                    index_t dvp, const ScoreTile& tile, const float* alpha, float* o, detail::TileScratch<K>& sc,
                    const RowsAhead&, bool tiny_weight) const {
      const index_t keys = amx_keys(tile.cols), rows16 = amx_rows(tile.rows_padded);
      auto* pq = reinterpret_cast<std::uint16_t*>(sc.kbuf.get());
      amx::bf16_rows(tile.scores, 1, kBq, tile.rows_padded, tile.cols, keys, rows16, pq);  // Pq[row][key]
      pack_tile_v(p, seq, kv_head, tile, dvp, sc.vbuf.get());
      const index_t pairs = (tile.cols + 1) / 2;
      std::fill(sc.vbuf.get() + pairs * dvp, sc.vbuf.get() + keys / 2 * dvp, 0.0f);
      if (tiny_weight && AnyHalfWithExponent(reinterpret_cast<const float*>(pq), tile.rows, pairs, keys / 2, 0u) &&
          AnyHalfWithExponent(sc.vbuf.get(), pairs, dvp, dvp, 0x7F80u)) {
        const detail::RowsView v =
            detail::load_kv_tile<K>(p, seq, true, tile.kv_begin, kv_head, tile.cols, p.dv, dvp, false, sc.vbuf.get());
        K::accumulate_pv(tile.scores, tile.rows, tile.cols, v.rows, v.stride, dvp, alpha, o);
        return;
      }
      scale_o(o, tile.rows_padded, dvp, alpha);
      amx::accumulate_pv(pq, static_cast<std::size_t>(keys) * 2, rows16, keys,
                         reinterpret_cast<const std::uint32_t*>(sc.vbuf.get()), dvp * sizeof(float), dvp, o,
                         dvp * sizeof(float), &scope);
    }
  };
};

}  // namespace SEQATTN_KERNEL_ISA
}  // namespace seqattn::HWY_NAMESPACE

// What the engine asks this target's kernel (attention/detail/bf16_dot.hpp).
namespace seqattn::detail {
template <>
struct Bf16DotTask<::seqattn::HWY_NAMESPACE::FlashKernel> {
  using Kernel = ::seqattn::HWY_NAMESPACE::Bf16DotKernel;
  static constexpr bool kPairs = true;
  static constexpr bool kHardwarePairs = Kernel::kNative;
  template <bool kHw>
  using PairTiles = Kernel::PairDotTiles<kHw>;
  using AmxTiles = Kernel::AmxTiles;
  template <class Call>
  static Bf16Tiles choose(const Call& c, index_t task) {
    return Kernel::choose_tiles(c, task);
  }
  // The pair arithmetic's operations, for the backward's pair key pass.
  using PairKernel = Kernel;
  static Bf16Tiles backward_tiles() { return Kernel::backward_tiles(); }
};
}  // namespace seqattn::detail
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
