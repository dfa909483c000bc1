// Highway SIMD tile kernel for the flash-attention engine.
//
// Included once per Highway target: normally once (static dispatch, the
// target the including TU's flags select), or once per target from
// src/dispatch.cc through foreach_target.h. Hence the toggle guard below and
// the kernel living in seqattn::HWY_NAMESPACE.
//
// ============================================================================
// FlashKernel: tile shape, register budget, memory traffic, and why
// ============================================================================
// Tile: kBlockQ = 128 query rows x kBlockKv = 64 keys (the BlockMask block
// shape). Scores are computed transposed, St[key][row], with query ROWS ALONG
// VECTOR LANES (gemma.cpp's "NF x 8" idea): Q is transposed once per task
// into Qt[d][row] (pre-scaled) and every key element is broadcast against a
// column of Qt. Consequences:
//   - K is read in its natural [key][d] layout (no per-tile transpose); the
//     engine only copies rows that are not contiguous, or widens bf16.
//   - The online softmax is lane-wise: max, exp (Exp, ExpToBf16), sum and the rescale
//     factor are vertical ops over keys, with no horizontal reductions.
//   - P.V broadcasts P[row][key] against V rows with lanes along the head
//     dim: a second GEMM micro-kernel on V in its natural layout.
//
// QK^T register block: kQkRowVecs row-vectors x kQkKeys keys.
//   AVX3 (32 zmm): 4 x 6 = 24 accumulators + 4 Qt loads + 1 broadcast;
//     per d step 4 loads + 6 broadcasts for 24 FMAs.
//   16-register targets: 2 x 4. Few rows (<= 8, GQA-stacked decode), AVX3:
//     ScoresRowQuads, 2 vectors of 4 rows x 4 dims (see there); other 16-lane
//     targets: one half-width vector x 8 keys, so no lanes idle.
// P.V register block: kPvRows rows x kPvVecs head-dim vectors.
//   AVX3: 6 x 4 = 24 accumulators; per key 4 V loads + 6 broadcasts for 24
//     FMAs; the O block is loaded once per tile and rescaled by alpha then.
//   16-register targets: 4 x 2. Head-dim groups are the outer loop: one
//   group's V slice (16 KiB at AVX3) is read by every row block, in L1 for
//   decode; in prefill, with St's 32 KiB beside it, from L1 or L2.
// Traffic per 128 x 64 tile, d = 128, fp32: K and V tiles 32 KiB each (read
// once per q-tile, from L2/L3 in prefill), Qt 64 KiB and O 64 KiB (L2, the
// task's lifetime), St 32 KiB. 4.2 MFLOP per 64 KiB of K/V: 64 FLOP/byte,
// FMA-bound in prefill; decode (8 stacked rows) is 4 FLOP/byte, memory-bound.
//
// Measured on the build machine (2 vCPU AMD EPYC, family 25 model 17, AVX3,
// one 512-bit FMA per cycle per core: 117 GFLOP/s per core, measured with 12
// distinct FMA chains, thread CPU time), in-cache micro-benchmarks of one
// tile, d = 128:
//   QK^T 4 x 6 block:                 112 GFLOP/s (96% of peak)
//   P.V  6 x 4: 110 | 8 x 3: 113 | 4 x 4: 90 | 4 x 6: 89 | 8 x 2: 61 |
//        16 x 1: 51 GFLOP/s. Zen 4's zmm broadcasts cost an FP slot, so
//        blocks need <= 1 broadcast per 4 FMAs; 6 x 4 also divides the common
//        head dims 64/128/256 into whole 4-vector groups (8 x 3 does not).
//   online softmax: 1.7 us per 64 x 64 tile (8% of the tile).
//   8-row decode tile: QK^T zmm (8 of 16 lanes busy) 51 GFLOP/s useful,
//        ymm 85 GFLOP/s; whole 8 x 64 tile 2.9 us.
// Tile shape, causal prefill s = 4096, h = 8, 1 thread (CPU time; the VM was
// shared, so +-5%): 64 x 64: 462-484 ms, 64 x 128: 473 ms, 128 x 128: 445 ms,
// 128 x 64: 432-437 ms. Larger q-tiles halve K/V traffic per FLOP; 64-key
// tiles keep causal/window diagonal waste and St small.
// End to end with 128 x 64 (bench/attention.cpp, 2 threads, measured peak
// 234.6 GFLOP/s): causal d = 128, h = 8, fp32: 150 / 165 / 166 GFLOP/s at
// s = 1k / 4k / 16k, i.e. 64% / 70% / 71% of the FMA peak.
//
// Arrays of vectors are used for the accumulator blocks; they are fully
// unrolled (HWY_UNROLL) with constant indices so GCC keeps them in registers
// (without the pragma GCC 12 kept the 4-row-vector block in memory).
// That rules out sizeless (SVE/RVV) targets.
// ============================================================================

// Non-SIMD includes: normal include guard.
#ifndef SEQATTN_BACKENDS_HIGHWAY_INL_H_DEPS
#define SEQATTN_BACKENDS_HIGHWAY_INL_H_DEPS
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "seqattn/backends/tile_kernel.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/core/x86_transpose.hpp"

// Two TUs built for the same Highway target, one with AVX512_BF16 in its
// flags (-march=sapphirerapids, znver4) and one without, compile different
// bf16 kernel bodies (highway_bf16-inl.h uses VDPBF16PS only in the first).
// The kernels live in an inline namespace named for that, as backends::Highway
// does for the target, so the linker never merges the two bodies.
// src/dispatch.cc (SEQATTN_DISPATCH_BF16_DOT) compiles the instruction into
// its AVX3_DL body function by function and checks the CPU at run time: a
// third kind of body, so a third name.
#if defined(__AVX512BF16__)
#define SEQATTN_KERNEL_ISA isa_bf16
#elif defined(SEQATTN_DISPATCH_BF16_DOT)
#define SEQATTN_KERNEL_ISA isa_dispatch
#else
#define SEQATTN_KERNEL_ISA isa_base
#endif
#endif

#if defined(SEQATTN_BACKENDS_HIGHWAY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQATTN_BACKENDS_HIGHWAY_INL_H_
#undef SEQATTN_BACKENDS_HIGHWAY_INL_H_
#else
#define SEQATTN_BACKENDS_HIGHWAY_INL_H_
#endif

#include <hwy/highway.h>
// clang-format off
#include <hwy/contrib/math/math-inl.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqattn::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

inline namespace SEQATTN_KERNEL_ISA {

struct FlashKernel {
  using D = hn::CappedTag<float, 16>;
  using V = hn::Vec<D>;

  static constexpr index_t kLanes = static_cast<index_t>(HWY_MIN(16, HWY_LANES(float)));
  static constexpr index_t kBlockQ = 128;
  static constexpr index_t kBlockKv = 64;
  static constexpr index_t kRowAlign = HWY_MAX(kLanes, 4);
#if HWY_TARGET <= HWY_AVX3 || HWY_ARCH_ARM
  static constexpr int kQkRowVecs = 4;
  static constexpr int kQkKeys = 6;
  static constexpr int kNarrowKeys = 8;
  static constexpr int kPvRows = 6;
  static constexpr int kPvVecs = 4;
#else
  static constexpr int kQkRowVecs = 2;
  static constexpr int kQkKeys = 4;
  static constexpr int kNarrowKeys = 4;
  static constexpr int kPvRows = 4;
  static constexpr int kPvVecs = 2;
#endif
  static_assert(kBlockQ % kRowAlign == 0 && kPvRows <= 8);

  static index_t padded_dim(index_t dv) { return (dv + kLanes - 1) / kLanes * kLanes; }

  // Calls f(std::integral_constant<int, c>{}) with c = min(n, kMax), 1 <= n:
  // the run-time size of a block at a tile's edge as the compile-time size
  // the register-blocked loops below are instantiated for.
  template <int kMax, class F>
  static HWY_INLINE void WithBlockSize(index_t n, F&& f) {
    static_assert(1 <= kMax && kMax <= 8);
    using std::integral_constant;
    switch (std::min<index_t>(n, kMax)) {
      case 1:
        f(integral_constant<int, 1>{});
        break;
      case 2:
        f(integral_constant<int, HWY_MIN(2, kMax)>{});
        break;
      case 3:
        f(integral_constant<int, HWY_MIN(3, kMax)>{});
        break;
      case 4:
        f(integral_constant<int, HWY_MIN(4, kMax)>{});
        break;
      case 5:
        f(integral_constant<int, HWY_MIN(5, kMax)>{});
        break;
      case 6:
        f(integral_constant<int, HWY_MIN(6, kMax)>{});
        break;
      case 7:
        f(integral_constant<int, HWY_MIN(7, kMax)>{});
        break;
      default:
        f(integral_constant<int, kMax>{});
        break;
    }
  }

  static void to_f32(const float* src, index_t n, float* dst) { std::copy_n(src, n, dst); }

  // bf16 -> f32 is a 16-bit shift; done on integer lanes so it works on
  // every target (SCALAR cannot Repartition f32 to bf16).
  static void to_f32(const bfloat16* src, index_t n, float* dst) {
    const D d;
    const hn::Rebind<std::uint32_t, D> du32;
    const hn::Rebind<std::uint16_t, D> du16;
    const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
    const auto N = static_cast<index_t>(hn::Lanes(d));
    index_t i = 0;
    for (; i + N <= n; i += N) {
      const auto wide = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, bits + i)));
      hn::StoreU(hn::BitCast(d, wide), d, dst + i);
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }

  // ---- St[j][r] = sum_d K[j][d] * Qt[d][r] ---------------------------------
  // One register block: kVecs row-vectors x kKeys keys of accumulators.
  template <class DT, int kVecs, int kKeys>
  static HWY_INLINE void ScoresBlock(const float* HWY_RESTRICT qt, index_t dk, const float* const* krow, int keys,
                                     float* HWY_RESTRICT st) {
    const DT d;
    using VT = hn::Vec<DT>;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    VT acc[kVecs][kKeys];
    const float* kp[kKeys];
    HWY_UNROLL(16)
    for (int j = 0; j < kKeys; ++j) kp[j] = krow[j];
    HWY_UNROLL(8)
    for (int v = 0; v < kVecs; ++v) {
      HWY_UNROLL(16)
      for (int j = 0; j < kKeys; ++j) acc[v][j] = hn::Zero(d);
    }
    for (index_t dd = 0; dd < dk; ++dd) {
      VT q[kVecs];
      HWY_UNROLL(8)
      for (int v = 0; v < kVecs; ++v) q[v] = hn::Load(d, qt + dd * kBlockQ + v * N);
      HWY_UNROLL(16)
      for (int j = 0; j < kKeys; ++j) {
        const VT b = hn::Set(d, kp[j][dd]);
        HWY_UNROLL(8)
        for (int v = 0; v < kVecs; ++v) acc[v][j] = hn::MulAdd(q[v], b, acc[v][j]);
      }
    }
    HWY_UNROLL(16)
    for (int j = 0; j < keys; ++j) {
      HWY_UNROLL(8)
      for (int v = 0; v < kVecs; ++v) hn::Store(acc[v][j], d, st + j * kBlockQ + v * N);
    }
  }

  template <class DT, int kMaxVecs, int kKeys>
  static HWY_INLINE void ScoresWith(const float* HWY_RESTRICT qt, index_t rows_p, index_t dk,
                                    const float* HWY_RESTRICT k, index_t k_stride, index_t cols, float* HWY_RESTRICT st,
                                    const RowsAhead& ahead) {
    const auto N = static_cast<index_t>(hn::Lanes(DT()));
    const index_t row_vecs = (rows_p + N - 1) / N;
    AheadStream stream(ahead, (cols + kKeys - 1) / kKeys);
    for (index_t v0 = 0; v0 < row_vecs; v0 += kMaxVecs) {
      const index_t vecs = std::min<index_t>(kMaxVecs, row_vecs - v0);
      for (index_t j0 = 0; j0 < cols; j0 += kKeys) {
        if (v0 == 0) stream.step();
        const int keys = static_cast<int>(std::min<index_t>(kKeys, cols - j0));
        // Short key groups repeat the last key; only `keys` results are stored.
        const float* krow[kKeys];
        for (int j = 0; j < kKeys; ++j) krow[j] = k + (j0 + std::min(j, keys - 1)) * k_stride;
        const float* q = qt + v0 * N;
        float* s = st + j0 * kBlockQ + v0 * N;
        // 64 keys are 10 groups of 6 and 4 more: a 4-key block for those
        // instead of 6 keys' work (11% of QK^T time at d = 128, Cascade Lake).
        WithBlockSize<kMaxVecs>(vecs, [&](auto v) {
          if (keys <= kKeys / 2 + 1 && keys < kKeys) {
            ScoresBlock<DT, decltype(v)::value, HWY_MAX(1, kKeys / 2 + 1)>(q, dk, krow, keys, s);
          } else {
            ScoresBlock<DT, decltype(v)::value, kKeys>(q, dk, krow, keys, s);
          }
        });
      }
    }
  }

#if HWY_TARGET <= HWY_AVX3
  // ---- Decode: 8 rows ----------------------------------------------------------
  // With 8 rows (a GQA group of 8, or fewer rows padded to 8) ScoresWith
  // fills half a vector and issues one broadcast per K element. Until
  // 2026-11-26 ScoresRowPairs did better with lanes of (row, d parity): one
  // 64-bit broadcast brought K[j][2i..2i+1] for all 16 lanes (measured then:
  // 1.5-2.0 against 2.4-2.6 us per 8 x 64 tile on a Cascade Lake VM; GQA 32/4
  // fp32 decode over 32k keys on a Sapphire Rapids VM 9.2 / 14.1 against
  // 16.3 / 16.8 ms). ScoresRowQuads below replaces it, and on bf16 pair words
  // Bf16DotKernel::scores_decode (which had kept the pair layout until
  // 2026-11-27).
  static constexpr index_t kPairMaxDk = 512;  // stack buffers of rearranged Q

  // ---- Decode: 8 rows as 2 vectors of 4 rows x 4 dims -------------------------
  // The pairs' idea taken one step further: a 128-bit block holds one
  // row's 4 consecutive dims (block b of Qd[i][h] is Q[4h + b][4i..4i+3]),
  // so one 128-bit broadcast of K[j][4i..4i+3] (a load-port broadcast, no
  // shuffle) feeds two FMAs: 8 rows x 4 dims. Per K element: 1/4 broadcast
  // and 1/2 FMA, against 1/2 and 1/2 for the pairs (whose broadcasts were as
  // many as the FMAs: the two load ports, not the FMA ports, bounded it).
  // Register block: kQuadKeys = 8 keys x 2 = 16 accumulators + 2 Qd vectors
  // + 1 broadcast. Per 4 dims: 2 Qd loads + 8 broadcasts for 16 FMAs. Qd is
  // Qt's 8 rows transposed into 4 x 4 blocks once per call (one two-table
  // permute per vector: dk / 2 of them, under 3% of the call at dk = 128).
  // The 4 partial sums of a row are added once per key at the end: per two
  // keys 4 unpacks, 2 shuffles, 3 adds and one permute into St's [key][row]
  // layout.
  // Measured in cache (8 rows x 64 keys, d = 128, one thread of the 2-vCPU
  // Intel Xeon VM with AMX and AVX512_BF16 of the README, AVX3_DL,
  // 2026-11-26; FMA bound 0.79 us): 0.84-0.92 us against 0.96-1.04 us with
  // the pairs. Traffic per 64-key tile: the K tile once (32 KiB fp32, from
  // memory in decode), Qd 4 KiB and St 2 KiB in L1.
  static constexpr int kQuadKeys = 8;

  // The steps ScoresRowQuads and Bf16DotKernel::scores_decode share.
  // qd[32 i .. 32 i + 31] = the two Qd vectors of units 4i .. 4i + 3 (dims of
  // Qt, or pair words of Qt2: 32-bit words [unit][row], kBlockQ apart), zero
  // for units >= `units`; lane 4b + l of the two halves: word 4i + l of rows b
  // and 4 + b, from X = (words 4i, 4i + 1) and Y = (4i + 2, 4i + 3), 8 rows each.
  static void QuadQd(const float* HWY_RESTRICT words, index_t units, float* HWY_RESTRICT qd) {
    const D d;
    const hn::Half<D> dh;
    const __m512i rows03 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i rows47 = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
    for (index_t i = 0; i < (units + 3) / 4; ++i) {
      auto unit = [&](index_t l) {
        return 4 * i + l < units ? hn::Load(dh, words + (4 * i + l) * kBlockQ) : hn::Zero(dh);
      };
      const V x = hn::Combine(d, unit(1), unit(0)), y = hn::Combine(d, unit(3), unit(2));
      hn::Store(V{_mm512_permutex2var_ps(x.raw, rows03, y.raw)}, d, qd + 32 * i);
      hn::Store(V{_mm512_permutex2var_ps(x.raw, rows47, y.raw)}, d, qd + 32 * i + 16);
    }
  }
  // St[j][r] = scale * (sum of the 4 lanes of row r's block) for keys j <
  // keys of a key group (st: its first key's St row): acc[j][h] holds rows
  // 4h .. 4h + 3 in its four blocks.
  static HWY_INLINE void StoreQuadSums(const V (&acc)[kQuadKeys][2], int keys, float scale, float* HWY_RESTRICT st) {
    const D d;
    const hn::Half<D> dh;
    const hn::RebindToSigned<D> di;
    // Lane t of the stored pair of keys (j: t < 8, j + 1: t >= 8, row t % 8) from the reduced lanes.
    static constexpr std::int32_t kUnpermute[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    const auto idx = hn::IndicesFromVec(d, hn::LoadU(di, kUnpermute));
    const V vscale = hn::Set(d, scale);
    for (int j = 0; j < keys; j += 2) {
      // Block b: (key j, row b), (j, 4 + b), (j + 1, b), (j + 1, 4 + b), each the sum of its 4 lanes.
      const V s1 = hn::Add(hn::InterleaveLower(d, acc[j][0], acc[j][1]), hn::InterleaveUpper(d, acc[j][0], acc[j][1]));
      const V s2 = hn::Add(hn::InterleaveLower(d, acc[j + 1][0], acc[j + 1][1]),
                           hn::InterleaveUpper(d, acc[j + 1][0], acc[j + 1][1]));
      const V sums = hn::Add(V{_mm512_shuffle_ps(s1.raw, s2.raw, _MM_SHUFFLE(1, 0, 1, 0))},
                             V{_mm512_shuffle_ps(s1.raw, s2.raw, _MM_SHUFFLE(3, 2, 3, 2))});
      const V both = hn::Mul(hn::TableLookupLanes(sums, idx), vscale);
      hn::Store(hn::LowerHalf(dh, both), dh, st + j * kBlockQ);
      if (j + 1 < keys) hn::Store(hn::UpperHalf(dh, both), dh, st + (j + 1) * kBlockQ);
    }
  }

  static void ScoresRowQuads(const float* HWY_RESTRICT qt, index_t dk, const float* HWY_RESTRICT k, index_t k_stride,
                             index_t cols, float* HWY_RESTRICT st, const RowsAhead& ahead) {
    static_assert(kLanes == 16, "4 x 4 blocks of 16 fp32 lanes");
    const D d;
    const index_t quads = dk / 4, rest = dk % 4;
    HWY_ALIGN float qd[kPairMaxDk / 4 * 32 + 32];
    QuadQd(qt, dk, qd);
    AheadStream stream(ahead, (cols + kQuadKeys - 1) / kQuadKeys);
    for (index_t j0 = 0; j0 < cols; j0 += kQuadKeys) {
      stream.step();  // once per key group, outside the dims loop: its accumulators stay in registers
      const int keys = static_cast<int>(std::min<index_t>(kQuadKeys, cols - j0));
      const float* kp[kQuadKeys];
      HWY_UNROLL(8)
      for (int j = 0; j < kQuadKeys; ++j) kp[j] = k + (j0 + std::min(j, keys - 1)) * k_stride;
      V acc[kQuadKeys][2];
      HWY_UNROLL(8)
      for (int j = 0; j < kQuadKeys; ++j) acc[j][0] = acc[j][1] = hn::Zero(d);
      for (index_t i = 0; i < quads; ++i) {
        const V q0 = hn::Load(d, qd + 32 * i), q1 = hn::Load(d, qd + 32 * i + 16);
        HWY_UNROLL(8)
        for (int j = 0; j < kQuadKeys; ++j) {
          const V b = hn::LoadDup128(d, kp[j] + 4 * i);
          acc[j][0] = hn::MulAdd(q0, b, acc[j][0]);
          acc[j][1] = hn::MulAdd(q1, b, acc[j][1]);
        }
      }
      if (rest != 0) {  // the last 1-3 dims: K beyond dk is not read (zero), Qd is zero there
        const V q0 = hn::Load(d, qd + 32 * quads), q1 = hn::Load(d, qd + 32 * quads + 16);
        HWY_UNROLL(8)
        for (int j = 0; j < kQuadKeys; ++j) {
          HWY_ALIGN float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          std::copy_n(kp[j] + 4 * quads, rest, tail);
          const V b = hn::LoadDup128(d, tail);
          acc[j][0] = hn::MulAdd(q0, b, acc[j][0]);
          acc[j][1] = hn::MulAdd(q1, b, acc[j][1]);
        }
      }
      StoreQuadSums(acc, keys, 1.0f, st + j0 * kBlockQ);
    }
  }
#endif

  // `ahead`: the rows the engine asks for while this tile computes
  // (tiled_forward.hpp, kv_rows_ahead): into L1 for decode, L2 for prefill.
  static void scores(const float* HWY_RESTRICT qt, index_t rows_p, index_t dk, const float* HWY_RESTRICT k,
                     index_t k_stride, index_t cols, float* HWY_RESTRICT st, const RowsAhead& ahead = {}) {
#if HWY_TARGET <= HWY_AVX3
    if (rows_p == kLanes / 2 && dk <= kPairMaxDk) {
      ScoresRowQuads(qt, dk, k, k_stride, cols, st, ahead);
      return;
    }
#endif
    if constexpr (kLanes >= 16) {
      // Few rows (decode with GQA stacking): half-width vectors waste no lanes
      // and two of them issue per cycle where one full-width one does.
      if (rows_p <= kLanes / 2) {
        ScoresWith<hn::CappedTag<float, HWY_MAX(1, kLanes / 2)>, 1, kNarrowKeys>(qt, rows_p, dk, k, k_stride, cols, st,
                                                                                 ahead);
        return;
      }
    }
    ScoresWith<D, kQkRowVecs, kQkKeys>(qt, rows_p, dk, k, k_stride, cols, st, ahead);
  }

  // Rows are padded to whole vectors; at most half a vector for few rows.
  static index_t padded_rows(index_t rows) {
    const index_t align = (kLanes >= 16 && rows <= kLanes / 2) ? kLanes / 2 : kRowAlign;
    return (rows + align - 1) / align * align;
  }

  static void softcap(float* HWY_RESTRICT st, index_t cols, index_t rows_p, float cap) {
    const hn::CappedTag<float, kRowAlign> d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const auto vcap = hn::Set(d, cap);
    for (index_t j = 0; j < cols; ++j) {
      for (index_t r = 0; r < rows_p; r += N) {
        // Unaligned: a decode K/V group's rows may start half a vector in (GQA 32/4: rows 8, 16, 24).
        float* p = st + j * kBlockQ + r;
        const auto x = hn::LoadU(d, p);
        if (r + N <= rows_p) {
          hn::StoreU(hn::Mul(vcap, hn::Tanh(d, x)), d, p);
        } else {
          hn::BlendedStore(hn::Mul(vcap, hn::Tanh(d, x)), hn::FirstN(d, static_cast<std::size_t>(rows_p - r)), d, p);
        }
      }
    }
  }

  // St[j][r] = -inf where bit r of key j's row bits is clear: one mask load
  // per vector of rows (LoadMaskBits reads whole bytes, so only for lane
  // counts that are multiples of 8; smaller vectors take the scalar loop).
  static void apply_column_bits(float* HWY_RESTRICT st, index_t cols, index_t rows_p,
                                const std::uint8_t* HWY_RESTRICT bits, index_t bytes_per_key) {
    if constexpr (kLanes % 8 == 0) {
      const D d;
      const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
      for (index_t j = 0; j < cols; ++j) {
        const std::uint8_t* key = bits + j * bytes_per_key;
        index_t r = 0;
        for (; r + kLanes <= rows_p; r += kLanes) {
          float* p = st + j * kBlockQ + r;
          hn::Store(hn::IfThenElse(hn::LoadMaskBits(d, key + r / 8), hn::Load(d, p), neg_inf), d, p);
        }
        for (; r < rows_p; ++r) {
          if (!((key[r / 8] >> (r % 8)) & 1u)) st[j * kBlockQ + r] = -std::numeric_limits<float>::infinity();
        }
      }
    } else {
      for (index_t j = 0; j < cols; ++j) {
        const std::uint8_t* key = bits + j * bytes_per_key;
        for (index_t r = 0; r < rows_p; ++r) {
          if (!((key[r / 8] >> (r % 8)) & 1u)) st[j * kBlockQ + r] = -std::numeric_limits<float>::infinity();
        }
      }
    }
  }

#if HWY_TARGET <= HWY_AVX3
  // y * 2^k (k integral) in one VSCALEFPS, for Exp and ExpToBf16.
  template <class VT>
  static HWY_INLINE VT ScaleByPow2(VT y, VT k) {
// GCC 12 passes _mm512_undefined_ps() as the merge source (see core/x86_transpose.hpp).
#if HWY_COMPILER_GCC_ACTUAL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
    if constexpr (sizeof(VT) == 64) {
      return VT{_mm512_scalef_ps(y.raw, k.raw)};
    } else if constexpr (sizeof(VT) == 32) {
      return VT{_mm256_scalef_ps(y.raw, k.raw)};
    } else {
      return VT{_mm_scalef_ps(y.raw, k.raw)};
    }
#if HWY_COMPILER_GCC_ACTUAL
#pragma GCC diagnostic pop
#endif
  }
#endif

  // e^x as hn::Exp computes it (the same two-part reduction by ln 2 and
  // degree-5 polynomial, 1 ulp), with AVX-512's VSCALEFPS multiplying by
  // 2^k in one instruction where hn::Exp converts k to an integer and builds
  // two powers of two (8 instructions of its 25). Below -104 the result is
  // 0 as in hn::Exp; x86 MAX returns its second operand for a NaN first
  // one, so NaN, too, gives 0, as hn::Exp does (the softmax's NaN policy
  // relies on it, see SoftmaxRows). Measured on a 2-vCPU AMD EPYC Zen 5 VM:
  // the online softmax is 15 % of bf16 causal prefill at 4k. Other targets:
  // hn::Exp.
  template <class DT>
  static HWY_INLINE hn::Vec<DT> Exp(DT d, hn::Vec<DT> x) {
#if HWY_TARGET <= HWY_AVX3
    using VT = hn::Vec<DT>;
    const VT clamped = hn::Max(x, hn::Set(d, -127.0f));
    const VT k = hn::Round(hn::Mul(clamped, hn::Set(d, 1.442695040888963407359924681f)));
    VT r = hn::MulAdd(k, hn::Set(d, -0.693145751953125f), clamped);
    r = hn::MulAdd(k, hn::Set(d, -1.428606765330187045e-6f), r);
    const VT r2 = hn::Mul(r, r), r4 = hn::Mul(r2, r2);  // Estrin's scheme, as hn::Exp evaluates it
    const VT low = hn::MulAdd(hn::Set(d, 0.166666671633720397949219f), r, hn::Set(d, 0.5f));
    const VT mid = hn::MulAdd(hn::Set(d, 0.00833336077630519866943359f), r, hn::Set(d, 0.0416664853692054748535156f));
    const VT high =
        hn::MulAdd(hn::Set(d, 0.000198527617612853646278381f), r, hn::Set(d, 0.00139304355252534151077271f));
    const VT poly = hn::MulAdd(r4, high, hn::MulAdd(r2, mid, low));
    const VT y = hn::Add(hn::MulAdd(poly, r2, r), hn::Set(d, 1.0f));
    return hn::IfThenElseZero(hn::Ge(clamped, hn::Set(d, -104.0f)), ScaleByPow2(y, k));
#else
    return hn::Exp(d, x);
#endif
  }

  // e^x for weights that are rounded to bf16 next (the bf16 pair and AMX
  // arithmetic, highway_bf16-inl.h): 2^t, t = x log2(e), as 2^round(t) times
  // a quartic in the rest (minimax on [-1/2, 1/2], 2.7e-6 relative, against
  // the 2^-9 of the rounding to bf16 after it; the row sums, and so the lse,
  // keep 1e-5): 9 instructions where Exp takes 17. (A cubic's 7.5e-5 moved
  // the lse by more than 1e-5.) -inf and NaN give 0, as Exp: the clamp at -127 gives
  // 2^-183, which VSCALEFPS rounds to 0, and keeps t - round(t) finite.
  // (Unclamped, -inf makes VSCALEFPS scale a NaN by 2^-inf; the Zen 5 VM
  // returned 0 for that, so a build without the clamp passed the tests there.) Other targets: Exp. Measured
  // (perf, bf16 causal 4k, 2 threads, the 2-vCPU Zen 5 VM, 2026-11-27): the
  // softmax went from 7.7 % to 5.6 % of samples, QK^T's being 26 %.
  template <class DT>
  static HWY_INLINE hn::Vec<DT> ExpToBf16(DT d, hn::Vec<DT> x) {
#if HWY_TARGET <= HWY_AVX3
    using VT = hn::Vec<DT>;
    const VT t = hn::Mul(hn::Max(x, hn::Set(d, -127.0f)), hn::Set(d, 1.442695040888963407359924681f));
    const VT k = hn::Round(t);
    const VT f = hn::Sub(t, k);
    const VT c3 = hn::MulAdd(hn::Set(d, 0.00957010034f), f, hn::Set(d, 0.0559178591f));
    const VT c2 = hn::MulAdd(c3, f, hn::Set(d, 0.240247443f));
    const VT y = hn::MulAdd(hn::MulAdd(c2, f, hn::Set(d, 0.693121791f)), f, hn::Set(d, 0.999999285f));
    return ScaleByPow2(y, k);
#else
    return Exp(d, x);
#endif
  }

  // Lane-wise online softmax over the keys of the tile (see ScalarKernel).
  // NaN policy (attention/softmax_state.hpp): x86 max instructions drop a
  // NaN operand and Exp(NaN) is 0, so neither the max nor the sum sees a
  // NaN score. What does: the sum of the exponents s - ref, which is NaN
  // exactly when some s is NaN or s = ref = +inf (exp(inf - inf) under IEEE),
  // or when m_old was NaN; -inf terms keep it -inf. A row it flags gets
  // m = l = alpha = NaN, as ScalarKernel: one Add per score.
  // kToBf16: the weights' exponentials by ExpToBf16.
  // Returns whether some weight is below the smallest normal float (one Min
  // per score; no weight is NaN): online_softmax's answer.
  template <class DT, bool kToBf16 = false>
  static HWY_INLINE bool SoftmaxRows(float* HWY_RESTRICT st, index_t cols, index_t r, float* HWY_RESTRICT m,
                                     float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
    const auto exp = [](DT dt, hn::Vec<DT> x) {
      if constexpr (kToBf16) {
        return ExpToBf16(dt, x);
      } else {
        return Exp(dt, x);
      }
    };
    const DT d;
    using VT = hn::Vec<DT>;
    const VT neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    VT mx0 = neg_inf, mx1 = neg_inf;
    index_t j = 0;
    for (; j + 2 <= cols; j += 2) {
      mx0 = hn::Max(mx0, hn::Load(d, st + j * kBlockQ + r));
      mx1 = hn::Max(mx1, hn::Load(d, st + (j + 1) * kBlockQ + r));
    }
    if (j < cols) mx0 = hn::Max(mx0, hn::Load(d, st + j * kBlockQ + r));
    const VT m_old = hn::Load(d, m + r);
    const VT m_new = hn::Max(m_old, hn::Max(mx0, mx1));
    const VT ref = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
    const VT old_exponent = hn::Sub(m_old, ref);
    const VT a = Exp(d, old_exponent);
    VT sum0 = hn::Zero(d), sum1 = hn::Zero(d), exponents0 = old_exponent, exponents1 = hn::Zero(d);
    VT least0 = hn::Set(d, 1.0f), least1 = least0;
    for (j = 0; j + 2 <= cols; j += 2) {
      float* p0 = st + j * kBlockQ + r;
      float* p1 = p0 + kBlockQ;
      const VT x0 = hn::Sub(hn::Load(d, p0), ref);
      const VT x1 = hn::Sub(hn::Load(d, p1), ref);
      const VT e0 = exp(d, x0);
      const VT e1 = exp(d, x1);
      hn::Store(e0, d, p0);
      hn::Store(e1, d, p1);
      sum0 = hn::Add(sum0, e0);
      sum1 = hn::Add(sum1, e1);
      least0 = hn::Min(least0, e0);
      least1 = hn::Min(least1, e1);
      exponents0 = hn::Add(exponents0, x0);
      exponents1 = hn::Add(exponents1, x1);
    }
    if (j < cols) {
      float* p0 = st + j * kBlockQ + r;
      const VT x0 = hn::Sub(hn::Load(d, p0), ref);
      const VT e0 = exp(d, x0);
      hn::Store(e0, d, p0);
      sum0 = hn::Add(sum0, e0);
      least0 = hn::Min(least0, e0);
      exponents0 = hn::Add(exponents0, x0);
    }
    const VT l_new = hn::MulAdd(hn::Load(d, l + r), a, hn::Add(sum0, sum1));
    const auto nan_row = hn::Or(hn::IsNaN(hn::Add(exponents0, exponents1)), hn::IsNaN(l_new));
    const VT nan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());
    hn::Store(hn::IfThenElse(nan_row, nan, l_new), d, l + r);
    hn::Store(hn::IfThenElse(nan_row, nan, m_new), d, m + r);
    hn::Store(hn::IfThenElse(nan_row, nan, a), d, alpha + r);
    const VT smallest_normal = hn::Set(d, std::numeric_limits<float>::min());
    return !hn::AllFalse(d, hn::Lt(hn::Min(least0, least1), smallest_normal));
  }

  template <bool kToBf16>
  static HWY_INLINE bool OnlineSoftmax(float* HWY_RESTRICT st, index_t cols, index_t rows_p, float* HWY_RESTRICT m,
                                       float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
    if constexpr (kLanes >= 16) {
      if (rows_p <= kLanes / 2) {
        return SoftmaxRows<hn::CappedTag<float, HWY_MAX(1, kLanes / 2)>, kToBf16>(st, cols, 0, m, l, alpha);
      }
    }
    bool tiny = false;
    for (index_t r = 0; r < rows_p; r += kLanes) tiny |= SoftmaxRows<D, kToBf16>(st, cols, r, m, l, alpha);
    return tiny;
  }

  static bool online_softmax(float* HWY_RESTRICT st, index_t cols, index_t rows_p, float* HWY_RESTRICT m,
                             float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
    return OnlineSoftmax<false>(st, cols, rows_p, m, l, alpha);
  }

  // online_softmax for weights that are rounded to bf16 next (ExpToBf16);
  // the rescale factors alpha keep Exp's precision. A weight of at least the
  // smallest normal float rounds to a nonzero bf16, so the answer holds for
  // the rounded weights too.
  static bool online_softmax_to_bf16(float* HWY_RESTRICT st, index_t cols, index_t rows_p, float* HWY_RESTRICT m,
                                     float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
    return OnlineSoftmax<true>(st, cols, rows_p, m, l, alpha);
  }

  // ---- Backward: P = exp(S - lse), dS = P * (dP - delta) (see ScalarKernel) ---
  // lse/delta per lane (lanes) or per column (columns); lanes are rows_p,
  // a multiple of the row alignment, so whole vectors are read and written.
  // NaN policy as ScalarKernel: P = 0 and dS = 0 where S is -inf (masked),
  // whatever lse and dP hold; a NaN S - lse gives NaN (Exp would give 0).
  template <class DT>
  static HWY_INLINE void SoftmaxBackwardVec(const DT d, float* HWY_RESTRICT s, float* HWY_RESTRICT dp, hn::Vec<DT> lse,
                                            hn::Vec<DT> delta) {
    const auto score = hn::LoadU(d, s);
    const auto x = hn::Sub(score, lse);
    const auto zero = hn::Zero(d);
    const auto masked = hn::Eq(score, hn::Set(d, -std::numeric_limits<float>::infinity()));
    const auto p = hn::IfThenElse(masked, zero, hn::IfThenElse(hn::IsNaN(x), x, Exp(d, x)));
    hn::StoreU(p, d, s);
    hn::StoreU(hn::IfThenElse(hn::Eq(p, zero), zero, hn::Mul(p, hn::Sub(hn::LoadU(d, dp), delta))), d, dp);
  }

  static void softmax_backward_lanes(float* HWY_RESTRICT s, float* HWY_RESTRICT dp, index_t cols, index_t rows_p,
                                     const float* HWY_RESTRICT lse, const float* HWY_RESTRICT delta) {
    const hn::CappedTag<float, kRowAlign> d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    for (index_t j = 0; j < cols; ++j) {
      index_t r = 0;
      for (; r + N <= rows_p; r += N) {
        SoftmaxBackwardVec(d, s + j * kBlockQ + r, dp + j * kBlockQ + r, hn::LoadU(d, lse + r),
                           hn::LoadU(d, delta + r));
      }
      for (; r < rows_p; ++r) {
        const hn::CappedTag<float, 1> d1;
        SoftmaxBackwardVec(d1, s + j * kBlockQ + r, dp + j * kBlockQ + r, hn::Set(d1, lse[r]), hn::Set(d1, delta[r]));
      }
    }
  }

  static void softmax_backward_columns(float* HWY_RESTRICT s, float* HWY_RESTRICT dp, index_t cols, index_t rows_p,
                                       const float* HWY_RESTRICT lse, const float* HWY_RESTRICT delta) {
    const hn::CappedTag<float, kRowAlign> d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    for (index_t j = 0; j < cols; ++j) {
      const auto lse_j = hn::Set(d, lse[j]), delta_j = hn::Set(d, delta[j]);
      index_t r = 0;
      for (; r + N <= rows_p; r += N) SoftmaxBackwardVec(d, s + j * kBlockQ + r, dp + j * kBlockQ + r, lse_j, delta_j);
      for (; r < rows_p; ++r) {
        const hn::CappedTag<float, 1> d1;
        SoftmaxBackwardVec(d1, s + j * kBlockQ + r, dp + j * kBlockQ + r, hn::Set(d1, lse[j]), hn::Set(d1, delta[j]));
      }
    }
  }

  // ---- dst[d * kBlockQ + r] = rows[r][d] * scale, r < n, d < width ----------
  // Lanes [n, n_p) of those dst rows are zero (n_p: the padded row count).
  // Q into Qt once per forward task, K and V into Kt and Vt once per kv-tile
  // of the backward's key pass, and dS into dS^T (queries on the lanes) once
  // per visit. AVX3: 16 x 16 blocks through x86::transpose16_words (16 masked loads, 64
  // shuffles and up to 16 stores per block, against 256 scalar loads and
  // strided stores), which may also zero lanes [n_p, n_p rounded up to 16):
  // padding, which no kernel reads; other targets element by element.
  static void transpose_rows(const float* const* HWY_RESTRICT rows, index_t n, index_t n_p, index_t width, float scale,
                             float* HWY_RESTRICT dst) {
#if HWY_TARGET <= HWY_AVX3
    static_assert(kLanes == 16 && kBlockQ % 16 == 0);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (index_t r0 = 0; r0 < n_p; r0 += 16) {
      for (index_t d0 = 0; d0 < width; d0 += 16) {
        const index_t cols = std::min<index_t>(16, width - d0);
        const __mmask16 m = static_cast<__mmask16>((1u << cols) - 1u);
        __m512i r[16];
        for (int q = 0; q < 16; ++q) {
          r[q] = r0 + q < n ? _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, rows[r0 + q] + d0), vscale))
                            : _mm512_setzero_si512();
        }
        x86::transpose16_words(r, reinterpret_cast<std::uint32_t*>(dst) + d0 * kBlockQ + r0, kBlockQ, cols);
      }
    }
#else
    transpose_rows_by_element<kBlockQ>(rows, n, n_p, width, scale, dst);
#endif
  }

  // ---- O[r][e] = alpha[r] * O[r][e] + sum_j Pt[j][r] * V[j][e] --------------
  // kSelect: a zero weight Pt[j][r] leaves O[r] as it is instead of adding
  // 0 * V[j] (NaN policy, attention/softmax_state.hpp: 0 * NaN must not reach
  // O). Only tiles that have both a zero weight and a non-finite V element
  // take it (accumulate_pv); a tile whose softmax saw no tiny weight skips
  // the scans too (accumulate_pv_unguarded).
  // stream: null, or the rows ahead, stepped once per key.
  template <int kRows, int kVecs, bool kSelect>
  static HWY_INLINE void PvBlock(const float* HWY_RESTRICT pt, index_t cols, const float* HWY_RESTRICT v,
                                 index_t v_stride, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o, index_t dvp,
                                 AheadStream* stream) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    V acc[kRows][kVecs];
    HWY_UNROLL(8)
    for (int r = 0; r < kRows; ++r) {
      const V a = hn::Set(d, alpha[r]);
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) acc[r][e] = hn::Mul(a, hn::Load(d, o + r * dvp + e * N));
    }
    for (index_t j = 0; j < cols; ++j) {
      if (stream != nullptr) stream->step();
      V vv[kVecs];
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) vv[e] = hn::LoadU(d, v + j * v_stride + e * N);
      const float* p = pt + j * kBlockQ;
      HWY_UNROLL(8)
      for (int r = 0; r < kRows; ++r) {
        const V pr = hn::Set(d, p[r]);
        if constexpr (kSelect) {
          // Not Ne: x86 Ne is ordered, false for a NaN weight, which must count.
          const auto weighted = hn::Not(hn::Eq(pr, hn::Zero(d)));
          HWY_UNROLL(8)
          for (int e = 0; e < kVecs; ++e)
            acc[r][e] = hn::IfThenElse(weighted, hn::MulAdd(pr, vv[e], acc[r][e]), acc[r][e]);
        } else {
          HWY_UNROLL(8)
          for (int e = 0; e < kVecs; ++e) acc[r][e] = hn::MulAdd(pr, vv[e], acc[r][e]);
        }
      }
    }
    HWY_UNROLL(8)
    for (int r = 0; r < kRows; ++r) {
      HWY_UNROLL(8)
      for (int e = 0; e < kVecs; ++e) hn::Store(acc[r][e], d, o + r * dvp + e * N);
    }
  }

  // Whether some weight Pt[j][r], r < rows, j < cols, is zero (a NaN weight
  // is not). A load, compare and OR per vector of weights, against a
  // broadcast and dvp / lanes FMAs per weight in P.V: about 2% of its
  // instructions at dv = 128 (rows below a vector are compared one by one).
  static bool HasZeroWeight(const float* HWY_RESTRICT pt, index_t rows, index_t cols) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const V zero = hn::Zero(d);
    V zeros = zero;  // all-ones lanes where some weight was 0
    for (index_t j = 0; j < cols; ++j) {
      const float* p = pt + j * kBlockQ;
      index_t r = 0;
      for (; r + N <= rows; r += N) zeros = hn::Or(zeros, hn::VecFromMask(d, hn::Eq(hn::LoadU(d, p + r), zero)));
#if HWY_TARGET <= HWY_AVX3
      {  // decode: a group of 8 rows in one half vector
        const hn::Half<D> dh;
        if (r + N / 2 <= rows) {
          const auto half = hn::VecFromMask(dh, hn::Eq(hn::LoadU(dh, p + r), hn::Zero(dh)));
          zeros = hn::Or(zeros, hn::Combine(d, hn::Zero(dh), half));
          r += N / 2;
        }
      }
#endif
      for (; r < rows; ++r) {
        if (p[r] == 0.0f) return true;
      }
    }
    return !hn::AllFalse(d, hn::MaskFromVec(zeros));
  }

  // Whether every element of V rows j < cols, dims < dvp, is finite.
  static bool AllFinite(const float* HWY_RESTRICT v, index_t v_stride, index_t cols, index_t dvp) {
    const D d;
    const auto N = static_cast<index_t>(hn::Lanes(d));
    const V zero = hn::Zero(d);
    V bad = zero;
    for (index_t j = 0; j < cols; ++j) {
      for (index_t e = 0; e < dvp; e += N) {
        bad = hn::Or(bad, hn::VecFromMask(d, hn::Not(hn::IsFinite(hn::LoadU(d, v + j * v_stride + e)))));
      }
    }
    return hn::AllFalse(d, hn::MaskFromVec(bad));
  }

  // `ahead`'s rows are requested over every block's keys.
  template <bool kSelect, int kRowsMax, int kVecsMax>
  static void AccumulatePvBlocks(const float* HWY_RESTRICT pt, index_t rows, index_t cols, const float* HWY_RESTRICT v,
                                 index_t v_stride, index_t dvp, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                                 const RowsAhead& ahead) {
    const auto N = static_cast<index_t>(hn::Lanes(D()));
    const index_t all_vecs = dvp / N;
    const index_t blocks = (all_vecs + kVecsMax - 1) / kVecsMax * ((rows + kRowsMax - 1) / kRowsMax);
    AheadStream stream(ahead, blocks * cols);
    AheadStream* const requests = ahead.empty() ? nullptr : &stream;
    for (index_t e0 = 0; e0 < all_vecs; e0 += kVecsMax) {
      WithBlockSize<kVecsMax>(all_vecs - e0, [&](auto vecs) {
        for (index_t r0 = 0; r0 < rows; r0 += kRowsMax) {
          WithBlockSize<kRowsMax>(rows - r0, [&](auto block_rows) {
            PvBlock<decltype(block_rows)::value, decltype(vecs)::value, kSelect>(
                pt + r0, cols, v + e0 * N, v_stride, alpha + r0, o + r0 * dvp + e0 * N, dvp, requests);
          });
        }
      });
    }
  }

  // Decode (at most 8 rows) keeps the 6 + 2 row blocks x 4 vectors: an 8-row x
  // 3-vector block (24 accumulators, V loaded once per key) ran an in-cache
  // 8 x 64 tile at 0.91 us against 1.33-1.41 us (d = 128, the VM of
  // ScoresRowQuads), but GQA 32/4 fp32 decode over DRAM measured 2-10 %
  // slower with it (three passes over each V tile's rows instead of two).
  template <bool kSelect>
  static void AccumulatePv(const float* HWY_RESTRICT pt, index_t rows, index_t cols, const float* HWY_RESTRICT v,
                           index_t v_stride, index_t dvp, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                           const RowsAhead& ahead) {
    AccumulatePvBlocks<kSelect, kPvRows, kPvVecs>(pt, rows, cols, v, v_stride, dvp, alpha, o, ahead);
  }

  // Head-dim groups outermost: every row block reads one group's slice of
  // the V tile (64 keys x kPvVecs vectors, 16 KiB at AVX3) before the next
  // slice, instead of the whole V tile per row block. The V scan runs only
  // for tiles with a zero weight (partial tiles, underflow): there it reads
  // the V tile once more, 1 / rows of the tile's P.V loads.
  static void accumulate_pv(const float* HWY_RESTRICT pt, index_t rows, index_t cols, const float* HWY_RESTRICT v,
                            index_t v_stride, index_t dvp, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                            const RowsAhead& ahead = {}) {
    if (HasZeroWeight(pt, rows, cols) && !AllFinite(v, v_stride, cols, dvp)) {
      AccumulatePv<true>(pt, rows, cols, v, v_stride, dvp, alpha, o, ahead);
    } else {
      AccumulatePv<false>(pt, rows, cols, v, v_stride, dvp, alpha, o, ahead);
    }
  }

  // accumulate_pv where the caller knows that no weight is below the smallest
  // normal float (the online softmax said so: none is zero, nor read as zero
  // where denormals are), or that V is finite: no scan. Measured on the 2-vCPU
  // Zen 5 VM, 2026-11-27: one 128 x 64 prefill tile's P.V 8.64-9.02 us with
  // the scan, 8.46-8.54 without (bench/bf16_dot.cpp, BM_TilePV/0/0 and /3/0);
  // decode scans 8 rows of P per key, a larger share: GQA 32/4 over 4k keys
  // in cache (bench/attention.cpp, BM_DecodeGqa8InCache, 2 threads) 0.44 ->
  // 0.39 ms, medians of three alternations.
  static void accumulate_pv_unguarded(const float* HWY_RESTRICT pt, index_t rows, index_t cols,
                                      const float* HWY_RESTRICT v, index_t v_stride, index_t dvp,
                                      const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o,
                                      const RowsAhead& ahead = {}) {
    AccumulatePv<false>(pt, rows, cols, v, v_stride, dvp, alpha, o, ahead);
  }
};

}  // namespace SEQATTN_KERNEL_ISA
}  // namespace seqattn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// The native bf16 dot-product path beside FlashKernel (same target, own toggle guard).
#include "seqattn/backends/highway_bf16-inl.h"

#endif  // toggle guard
