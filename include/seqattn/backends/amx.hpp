// Intel AMX tile matmuls for the bf16 forward (backends/highway_bf16-inl.h, AmxTiles) and backward
// (attention/detail/tiled_backward.hpp, AmxKeyPass).
//
// AMX holds eight tile registers of up to 16 rows x 64 bytes; TDPBF16PS adds
// A[16 x 32 bf16] . B[16 pair-rows x 16 pairs] into C[16 x 16 fp32], B's rows
// holding bf16 PAIRS along the reduction (the layout Bf16DotKernel already
// packs: Qt2 for QK^T, Vp for P.V). Products of bf16 are exact in fp32; the
// sums round as on the vector unit, in another order.
//
//   QK^T:  C[key][query] = K[key][d] . Qt2[d/2][query]: A is K read in place
//          (rows `k_stride` bytes apart) or from a zero-padded copy; the
//          result lands in the engine's St[key][query] layout directly.
//   P.V:   C[query][e] = P[query][key] . Vp[key/2][e]: A is P rounded to bf16
//          and transposed into [query][key] rows; C is the task's O, loaded,
//          accumulated and stored back.
// Register blocks: 2 x 2 C tiles (tmm0-3), 2 A (tmm4-5), 2 B (tmm6-7); every
// tile 16 rows x 64 bytes, so one configuration serves both products. Each
// call loads the configuration and releases the tiles at its end: other code
// on the thread (oneDNN, PyTorch) may use AMX between our calls; a TileScope
// keeps them loaded over a task's calls instead.
// Shapes: QK^T's keys (its A rows) a multiple of 16, P.V's keys (its
// reduction) a multiple of 32 (callers pad with zero rows), dk a multiple
// of 32, queries and dvp multiples of 16; queries may also be fewer than 16
// (decode: a GQA group of 8), which narrows the tiles instead of padding
// them, so a group's products never touch the next group's rows.
//
// Linux hands AMX state to a process only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM); available() asks once, and is false where the CPU,
// the kernel or the compiler lacks it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "seqattn/core/tensor.hpp"
#include "seqattn/core/x86_transpose.hpp"

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SEQATTN_HAS_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define SEQATTN_HAS_AMX 0
#endif

namespace seqattn::amx {

// bf16 bits of a finite fp32 value, rounded to nearest even.
inline std::uint16_t round_to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One product of matmul_sum: A rows `a_stride` bytes apart, B pair-rows `b_stride` bytes apart, `steps` of 32
// along the reduction.
struct Term {
  const void* a = nullptr;
  std::size_t a_stride = 0;
  const void* b = nullptr;
  std::size_t b_stride = 0;
  index_t steps = 0;
};

#if SEQATTN_HAS_AMX

namespace detail {

#define SEQATTN_AMX_PACK_TARGET __attribute__((target("avx512f,avx512bw")))
// GCC 12's unmasked shifts pass _mm512_undefined_epi32() as the merge source,
// which -Wmaybe-uninitialized reports in target-attribute bodies; nothing
// reads those lanes.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The bf16 bits of 16 finite fp32 values, rounded to nearest even as round_to_bf16, in the high half of each word
// (the low half is garbage).
SEQATTN_AMX_PACK_TARGET inline __m512i rounded_bf16_words(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
}

SEQATTN_AMX_PACK_TARGET inline __mmask16 first_lanes(index_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << n) - 1u);
}

// Row-contiguous src (col_step 1): per row, 32 columns from two masked loads, their high halves gathered by one
// two-source 16-bit permute, one 64-byte store.
SEQATTN_AMX_PACK_TARGET inline void bf16_rows_along(const float* src, std::ptrdiff_t row_step, index_t rows,
                                                    index_t cols, index_t len, std::uint16_t* out) {
  alignas(64) std::uint16_t index[32];
  for (int i = 0; i < 32; ++i) index[i] = static_cast<std::uint16_t>(2 * i + 1);
  const __m512i high_halves = _mm512_load_si512(index);
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c0 = 0; c0 < len; c0 += 32) {
      const float* s = src + r * row_step + c0;
      const __m512i a = rounded_bf16_words(_mm512_maskz_loadu_ps(first_lanes(cols - c0), s));
      const __m512i b = rounded_bf16_words(_mm512_maskz_loadu_ps(first_lanes(cols - c0 - 16), s + 16));
      _mm512_storeu_si512(out + r * len + c0, _mm512_permutex2var_epi16(a, high_halves, b));
    }
  }
}

// Column-contiguous src (row_step 1): per 16 rows x 32 columns, 16 words of two columns' rounded halves (16 rows on
// the lanes), then one 16 x 16 word transpose into the rows' 64 bytes.
SEQATTN_AMX_PACK_TARGET inline void bf16_rows_across(const float* src, std::ptrdiff_t col_step, index_t rows,
                                                     index_t cols, index_t len, index_t rows_pad, std::uint16_t* out) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  auto* words = reinterpret_cast<std::uint32_t*>(out);
  const index_t row_words = len / 2;
  for (index_t r0 = 0; r0 < rows_pad; r0 += 16) {
    const __mmask16 m = first_lanes(rows - r0);
    for (index_t c0 = 0; c0 < len; c0 += 32) {
      __m512i w[16];
      for (int i = 0; i < 16; ++i) {
        const index_t c = c0 + 2 * i;
        const __m512i lo =
            c < cols ? rounded_bf16_words(_mm512_maskz_loadu_ps(m, src + c * col_step + r0)) : _mm512_setzero_si512();
        const __m512i hi = c + 1 < cols ? rounded_bf16_words(_mm512_maskz_loadu_ps(m, src + (c + 1) * col_step + r0))
                                        : _mm512_setzero_si512();
        w[i] = _mm512_or_si512(_mm512_srli_epi32(lo, 16), _mm512_and_si512(hi, high));
      }
      x86::transpose16_words(w, words + r0 * row_words + c0 / 2, row_words, rows_pad - r0);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef SEQATTN_AMX_PACK_TARGET

}  // namespace detail

#endif

#if SEQATTN_HAS_AMX

namespace detail {

struct TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

inline const TileConfig& config() {
  static const TileConfig c = [] {
    TileConfig t;
    for (int i = 0; i < 8; ++i) {
      t.bytes_per_row[i] = 64;
      t.rows[i] = 16;
    }
    return t;
  }();
  return c;
}

#define SEQATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

// C tiles 0..3 = (a, b) blocks (0,0) (0,1) (1,0) (1,1) at row i, column j of
// C; kA / kB: 1 or 2 tiles. C is loaded (or zeroed) and stored once for all
// the terms, whose products add into it in the terms' order.
template <int kA, int kB>
SEQATTN_AMX_TARGET inline void block(const Term* terms, int count, index_t i, index_t j, char* c, std::size_t c_stride,
                                     bool load_c) {
  char* const ct = c + i * c_stride + j * 4;
  const std::size_t c_row_next = 16 * c_stride, c_col_next = 64;
  if (load_c) {
    _tile_loadd(0, ct, c_stride);
    if constexpr (kB == 2) _tile_loadd(1, ct + c_col_next, c_stride);
    if constexpr (kA == 2) _tile_loadd(2, ct + c_row_next, c_stride);
    if constexpr (kA == 2 && kB == 2) _tile_loadd(3, ct + c_row_next + c_col_next, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (kB == 2) _tile_zero(1);
    if constexpr (kA == 2) _tile_zero(2);
    if constexpr (kA == 2 && kB == 2) _tile_zero(3);
  }
  for (int t = 0; t < count; ++t) {
    const Term& m = terms[t];
    const char* const a = static_cast<const char*>(m.a) + i * m.a_stride;
    const char* const b = static_cast<const char*>(m.b) + j * 4;
    const std::size_t a_next = 16 * m.a_stride, b_next = 64, b_step = 16 * m.b_stride;
    for (index_t s = 0; s < m.steps; ++s) {
      _tile_loadd(4, a + s * 64, m.a_stride);
      _tile_loadd(6, b + s * b_step, m.b_stride);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (kB == 2) {
        _tile_loadd(7, b + s * b_step + b_next, m.b_stride);
        _tile_dpbf16ps(1, 4, 7);
      }
      if constexpr (kA == 2) {
        _tile_loadd(5, a + s * 64 + a_next, m.a_stride);
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (kB == 2) _tile_dpbf16ps(3, 5, 7);
      }
    }
  }
  _tile_stored(0, ct, c_stride);
  if constexpr (kB == 2) _tile_stored(1, ct + c_col_next, c_stride);
  if constexpr (kA == 2) _tile_stored(2, ct + c_row_next, c_stride);
  if constexpr (kA == 2 && kB == 2) _tile_stored(3, ct + c_row_next + c_col_next, c_stride);
}

// One 16 x 16 C block narrowed to a_rows x b_cols (decode: a GQA group of 8
// query rows as P.V's A and C rows, or as QK^T's B and C columns).
inline TileConfig narrow_config(index_t a_rows, index_t b_cols) {
  TileConfig t = config();
  const auto m = static_cast<std::uint8_t>(a_rows);
  const auto n_bytes = static_cast<std::uint16_t>(4 * b_cols);
  for (int i = 0; i < 4; ++i) {  // C
    t.rows[i] = m;
    t.bytes_per_row[i] = n_bytes;
  }
  t.rows[4] = t.rows[5] = m;                          // A: 64 bytes a row
  t.bytes_per_row[6] = t.bytes_per_row[7] = n_bytes;  // B: 16 pair-rows
  return t;
}

// LDTILECFG / STTILECFG with the whole 64-byte configuration as the memory
// operand: GCC 12's _tile_loadconfig and _tile_storeconfig name only its
// first 8 bytes, so stores to a local configuration could be dropped before
// the load (a release build loaded a half-written one and faulted) and bytes
// read after a store could be taken from before it.
SEQATTN_AMX_TARGET inline void load_config(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" : : "m"(c)); }
SEQATTN_AMX_TARGET inline void store_config(TileConfig& c) { __asm__ volatile("sttilecfg %0" : "=m"(c)); }
SEQATTN_AMX_TARGET inline void release_tiles() { _tile_release(); }

}  // namespace detail

// The tiles of a run of matmuls on one thread (a task's tiles): a matmul
// given the scope loads its configuration only where the one the thread holds
// differs (read back with STTILECFG, so user code between our products, a
// ScoreMod or a mask predicate that runs oneDNN say, may load or release
// tiles of its own), and the scope releases the tiles when it ends. Without
// one, each matmul loads and releases. Measured on the 2-vCPU Emerald Rapids
// VM: LDTILECFG 80-110 ns, TILERELEASE 140 ns, STTILECFG 7 ns, against
// 2.2-2.3 us for each of a 128 x 64 tile's two products.
class TileScope {
 public:
  TileScope() = default;
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
  ~TileScope() {
    if (loaded_) detail::release_tiles();
  }
  void use(const detail::TileConfig& c) {
    detail::TileConfig held;
    detail::store_config(held);
    if (std::memcmp(&held, &c, sizeof(c)) != 0) detail::load_config(c);
    loaded_ = true;
  }

 private:
  bool loaded_ = false;
};

namespace detail {

SEQATTN_AMX_TARGET inline void matmul_sum(const Term* terms, int count, index_t a_rows, index_t b_cols, void* c,
                                          std::size_t c_stride, bool accumulate, TileScope* scope) {
  const TileConfig& tiles = a_rows < 16 || b_cols < 16
                                ? narrow_config(std::min<index_t>(a_rows, 16), std::min<index_t>(b_cols, 16))
                                : config();
  if (scope != nullptr) {
    scope->use(tiles);
  } else {
    load_config(tiles);
  }
  char* cp = static_cast<char*>(c);
  for (index_t i = 0; i < a_rows; i += 32) {
    const bool two_a = i + 16 < a_rows;
    for (index_t j = 0; j < b_cols; j += 32) {
      const bool two_b = j + 16 < b_cols;
      if (two_a && two_b) {
        block<2, 2>(terms, count, i, j, cp, c_stride, accumulate);
      } else if (two_a) {
        block<2, 1>(terms, count, i, j, cp, c_stride, accumulate);
      } else if (two_b) {
        block<1, 2>(terms, count, i, j, cp, c_stride, accumulate);
      } else {
        block<1, 1>(terms, count, i, j, cp, c_stride, accumulate);
      }
    }
  }
  if (scope == nullptr) _tile_release();
}

#undef SEQATTN_AMX_TARGET

}  // namespace detail

// C[a_rows][b_cols] (+)= A[a_rows][steps * 32 bf16] . B[steps * 16 pair-rows][b_cols pairs] (C fp32, overwritten
// unless `accumulate`); a_rows and b_cols multiples of 16, or below 16 (one narrowed tile: decode). A row i at a + i *
// a_stride bytes, B pair-row r at b + r * b_stride, C row i at c + i * c_stride. scope: see TileScope.
inline void matmul(const void* a, std::size_t a_stride, index_t a_rows, const void* b, std::size_t b_stride,
                   index_t b_cols, index_t steps, void* c, std::size_t c_stride, bool accumulate,
                   TileScope* scope = nullptr) {
  const Term term{a, a_stride, b, b_stride, steps};
  detail::matmul_sum(&term, 1, a_rows, b_cols, c, c_stride, accumulate, scope);
}

// C (+)= the sum of the terms' products A_t . B_t (each as matmul's A and B, with its own steps), added in the
// terms' order with C's tiles loaded and stored once: where each product's reduction is short (a backward dQ
// tile's 64 keys per kv-tile), loading and storing C for each took as many tile loads and stores as the
// product's own operand loads. The sums are matmul's, one term after the other, bit for bit (C's tiles hold
// fp32 between them either way).
inline void matmul_sum(const Term* terms, int count, index_t a_rows, index_t b_cols, void* c, std::size_t c_stride,
                       bool accumulate, TileScope* scope = nullptr) {
  detail::matmul_sum(terms, count, a_rows, b_cols, c, c_stride, accumulate, scope);
}

namespace detail {
// AVX-512F and BW (CPUID leaf 7 EBX bits 16 and 30) with the OS saving their
// state (XCR0 bits 1, 2, 5-7), for the packers: a virtual CPU may show AMX
// and hide AVX-512.
inline bool avx512_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (((b >> 16) & 1u) == 0 || ((b >> 30) & 1u) == 0) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || ((c >> 27) & 1u) == 0) return false;  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const std::uint64_t xcr0 = (std::uint64_t{hi} << 32) | lo;
    return (xcr0 & 0xE6u) == 0xE6u;
  }();
  return ok;
}
}  // namespace detail

// CPUID (leaf 7: AMX-TILE EDX bit 24, AMX-BF16 EDX bit 22) and the kernel's
// permission for this process, asked once.
inline bool available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (((d >> 24) & 1u) == 0 || ((d >> 22) & 1u) == 0) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

// St[key][query] = K[key][:dk] . Qt2: `keys` K rows (a multiple of 16) at k + j * k_stride bytes, Qt2 with rows
// (d pairs) of `qt2_stride` bytes, `queries` (a multiple of 16, or below 16) lanes; St rows st_stride bytes apart.
// Unscaled.
inline void key_query_scores(const std::uint16_t* k, std::size_t k_stride, index_t keys, const std::uint32_t* qt2,
                             std::size_t qt2_stride, index_t queries, index_t dk, float* st, std::size_t st_stride,
                             TileScope* scope = nullptr) {
  matmul(k, k_stride, keys, qt2, qt2_stride, queries, dk / 32, st, st_stride, false, scope);
}

// O[query][e] += P[query][key] . Vp[key/2][e]: P bf16 rows of pq_stride bytes, `keys` a multiple of 32 (zero
// beyond the tile's keys), Vp pair-rows of vp_stride bytes, dvp a multiple of 16; O rows o_stride bytes apart.
inline void accumulate_pv(const std::uint16_t* pq, std::size_t pq_stride, index_t queries, index_t keys,
                          const std::uint32_t* vp, std::size_t vp_stride, index_t dvp, float* o, std::size_t o_stride,
                          TileScope* scope = nullptr) {
  matmul(pq, pq_stride, queries, vp, vp_stride, dvp, keys / 32, o, o_stride, true, scope);
}

#else

class TileScope {
 public:
  TileScope() = default;
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};
inline bool available() { return false; }
inline void matmul(const void*, std::size_t, index_t, const void*, std::size_t, index_t, index_t, void*, std::size_t,
                   bool, TileScope* = nullptr) {}
inline void matmul_sum(const Term*, int, index_t, index_t, void*, std::size_t, bool, TileScope* = nullptr) {}
inline void key_query_scores(const std::uint16_t*, std::size_t, index_t, const std::uint32_t*, std::size_t, index_t,
                             index_t, float*, std::size_t, TileScope* = nullptr) {}
inline void accumulate_pv(const std::uint16_t*, std::size_t, index_t, index_t, const std::uint32_t*, std::size_t,
                          index_t, float*, std::size_t, TileScope* = nullptr) {}

#endif

// out[r * len + c] = bf16(src[r * row_step + c * col_step]) for r < rows, c < cols; zero for c in [cols, len)
// and for rows [rows, rows_pad): an A operand (rows of bf16, zero-padded to whole tiles) from fp32 P or dS,
// read row- or column-wise. Finite values, rounded to nearest even. Where AMX and AVX-512 run and len is a multiple
// of 32, with unit row or column step, 16-lane vectors; else element by element.
inline void bf16_rows(const float* src, std::ptrdiff_t row_step, std::ptrdiff_t col_step, index_t rows, index_t cols,
                      index_t len, index_t rows_pad, std::uint16_t* out) {
#if SEQATTN_HAS_AMX
  if (len % 32 == 0 && (col_step == 1 || row_step == 1) && available() && detail::avx512_usable()) {
    if (col_step == 1) {
      detail::bf16_rows_along(src, row_step, rows, cols, len, out);
      std::fill(out + rows * len, out + rows_pad * len, std::uint16_t{0});
    } else {
      detail::bf16_rows_across(src, col_step, rows, cols, len, rows_pad, out);
    }
    return;
  }
#endif
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c = 0; c < cols; ++c) out[r * len + c] = round_to_bf16(src[r * row_step + c * col_step]);
    std::fill(out + r * len + cols, out + (r + 1) * len, std::uint16_t{0});
  }
  std::fill(out + rows * len, out + rows_pad * len, std::uint16_t{0});
}

}  // namespace seqattn::amx
