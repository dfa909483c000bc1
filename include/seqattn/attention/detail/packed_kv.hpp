// K/V packed once per K/V head for prefill: the forward's `pack_band` step.
//
// Prefill reads each K/V tile once per query tile that sees it (causal 16k:
// 64 times on average). Where one head's K/V rows are not contiguous (BSHD: a
// head's row, then the other heads' rows of that token), every such read
// gathers short rows out of wide token rows, and the hardware prefetchers
// fetch the neighbouring heads' lines with them, so one head's tasks keep
// every head's K/V in the last-level cache instead of their own. And the bf16
// pair arithmetic rearranges each V tile into key pairs (pack_v) once per
// visit.
//
// order_tasks already runs the tasks of one (sequence, K/V head) together,
// one band after the other. Where it did, the forward copies each band's K
// rows into a contiguous buffer and its V into the layout the kernel reads
// (contiguous rows, or the bf16 pair words that pack_v would build per tile)
// right before the band's tasks, which then read those: one copy of one
// head's K/V per call (in the last-level cache when its tasks start), no
// tensor-sized allocation, the workers splitting the copy between them.
//
// Measured on a 2-vCPU AMD EPYC (Zen 5) VM, 2026-11-27, bench/attention.cpp,
// causal, d = 128, 8 heads, BSHD, 2 threads, three alternations with the
// build before: bf16 16k 836-880 -> 695-727 ms (head-major K/V: 711-720 ms
// before), bf16 4k 46-49 -> 46-49 ms, fp32 16k 1369-1402 -> 1252-1354 ms,
// fp32 4k 84.5-86.1 -> 82.2-85.1 ms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/aligned_buffer.hpp"
#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/detail/tiled_work.hpp"
#include "seqattn/core/checked.hpp"

namespace seqattn::detail {

// The tasks order[begin, end) of one (sequence, K/V head).
struct KvBand {
  index_t sequence = 0;
  index_t kv_head = 0;
  index_t begin = 0;
  index_t end = 0;
};

// Query tiles of many rows (prefill) that read a K/V tile, on average over
// the batch's K/V tiles: how often a packed copy is read for the one time it
// is written. Tasks of few rows (decode) count nothing: they read a tile once
// and at memory speed, whatever the layout.
template <class Kernel, class T>
double kv_tile_reuse(const AttentionProblem<T>& p, const TiledWork& w) {
  double visits = 0, kv_tiles = 0;
  for (const WorkUnit& u : w.units) {
    if (u.rows() > Kernel::kBlockQ / 4) visits += static_cast<double>(u.num_tiles() * u.kv_groups);
  }
  for (const SequenceGeometry& s : p.sequences) {
    kv_tiles += static_cast<double>((s.kv_len + Kernel::kBlockKv - 1) / Kernel::kBlockKv * p.kv_heads);
  }
  return kv_tiles > 0 ? visits / kv_tiles : 0.0;
}

// A band's copy pays for itself where its tiles are read many times
// (prefill); decode reads each tile once. Measured (bench/attention.cpp,
// fp32, d = 128, 8 heads, 2 threads, the VM above): causal 1k (each K/V tile
// read by 4.5 query tiles on average) 6.2-6.5 ms unpacked, 6.2-7.8 ms packed;
// a 1k window over 16k (8.7) within the noise either way; causal 4k (16.5)
// and 16k (64.5) faster packed. One copy and one more parallel_for per band
// are what a short band cannot win back.
inline constexpr double kMinPackedReuse = 8.0;

// The copy of one band is at most this large: a band that does not fit the
// last-level cache gains less from being contiguous, and the copy is memory
// the caller did not ask for (at this size: 64k keys of fp32 K and V at d = 128).
inline constexpr index_t kMaxPackedBandBytes = index_t{64} << 20;

// The bands of `w`'s task order, where packing them pays: K/V whose copy
// changes their layout (not already contiguous rows per head, or V into pair
// words: `v_pairs`), unpaged (a paged cache's pages are shared by K and V,
// and the pair words leave V in place), one K/V head per unit, tasks in one
// run per (sequence, K/V head), K/V tiles read kMinPackedReuse times on
// average, and a band's copy within `max_band_bytes`. Else empty.
template <class Kernel, class T>
std::vector<KvBand> kv_bands(const AttentionProblem<T>& p, const TiledWork& w, bool v_pairs,
                             index_t max_band_bytes = kMaxPackedBandBytes) {
  std::vector<KvBand> bands;
  const bool k_rows = p.k_strides.dim == 1 && p.k_strides.token == p.dk;
  const bool v_rows = p.v_strides.dim == 1 && p.v_strides.token == p.dv;
  index_t longest = 0;
  for (const SequenceGeometry& s : p.sequences) longest = std::max(longest, s.kv_len);
  // Pair words take dvp (>= dv) elements' room per key.
  const double band_bytes = static_cast<double>(longest) * static_cast<double>(p.dk + (v_pairs ? w.dvp : p.dv)) *
                            static_cast<double>(sizeof(T));
  if (p.paging.page_size > 0 || (k_rows && v_rows && !v_pairs) || band_bytes > static_cast<double>(max_band_bytes) ||
      kv_tile_reuse<Kernel>(p, w) < kMinPackedReuse) {
    return bands;
  }
  for (const WorkUnit& u : w.units) {
    if (u.kv_groups != 1) return bands;
  }
  for (index_t i = 0; i < w.num_tasks(); ++i) {
    const WorkUnit& u = w.unit_of(w.order[static_cast<std::size_t>(i)]);
    if (bands.empty() || bands.back().sequence != u.sequence || bands.back().kv_head != u.kv_head) {
      bands.push_back({u.sequence, u.kv_head, i, i});
    }
    bands.back().end = i + 1;
  }
  // A (sequence, K/V head) in two runs: the order is not banded.
  std::vector<KvBand> sorted = bands;
  std::sort(sorted.begin(), sorted.end(), [](const KvBand& a, const KvBand& b) {
    return a.sequence != b.sequence ? a.sequence < b.sequence : a.kv_head < b.kv_head;
  });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].sequence == sorted[i - 1].sequence && sorted[i].kv_head == sorted[i - 1].kv_head) return {};
  }
  return bands;
}

// One band's K rows ([token][dk]) and V, as rows ([token][dv]) or, for the
// bf16 pair arithmetic, as pack_v's pair words ([token / 2][dvp], the key
// pairs of the whole sequence, zero past its last key), and the problem that
// reads them: `problem` is the caller's with K (and V as rows) of the band's
// (sequence, K/V head) at the buffers'. Valid for that band's tasks only.
//
// The next band's copy is not made while a band's last tasks run (two
// buffers, the copy's chunks handed out after the band's tasks): measured
// there (fp32 and bf16 causal 16k, 2 threads) it was 9-12 % slower than
// copying between the bands, its reads competing with the tasks' for the
// last-level cache.
template <class T>
struct BandKv {
  static constexpr index_t kChunk = 256;  // keys per pack_chunk; even: pairs never straddle chunks

  bool v_pairs = false;
  index_t dvp = 0;
  AlignedBuffer<T> k_rows, v_rows;
  AlignedBuffer<std::uint32_t> pair_words;  // 64-byte aligned: the kernel's vector loads
  // Per chunk of kChunk keys of the running band: whether all of its pair
  // words are finite (pack_pairs scans the words it has just written). A
  // tile whose V is finite skips the scans that the NaN policy needs only
  // beside a non-finite value (Bf16DotKernel::accumulate_pv): once per copy
  // instead of once per tile that reads it. The scan of P for zero weights
  // was 3-8 % of a 128 x 64 tile's P.V (bench/bf16_dot.cpp, BM_TilePV/1/0
  // against BM_TilePV/2/0: 4.52-4.66 against 4.30-4.38 us, one thread of
  // the 2-vCPU Zen 5 VM, 2026-11-27; that P has no zero, so V was not scanned).
  std::vector<std::uint8_t> chunk_v_finite;
  AttentionProblem<T> problem;

  BandKv(const AttentionProblem<T>& p, index_t dvp_, bool pairs) : v_pairs(pairs), dvp(dvp_), problem(p) {
    index_t longest = 0;
    for (const SequenceGeometry& s : p.sequences) longest = std::max(longest, s.kv_len);
    k_rows = AlignedBuffer<T>(
        checked_size("attention_forward: a K/V head's packed K", limits::kMaxTensorElements, longest, p.dk),
        typename AlignedBuffer<T>::Uninitialized{});
    const index_t v_size = checked_size("attention_forward: a K/V head's packed V", limits::kMaxTensorElements,
                                        pairs ? (longest + 1) / 2 : longest, pairs ? dvp : p.dv);
    if (pairs) {
      pair_words = AlignedBuffer<std::uint32_t>(v_size, AlignedBuffer<std::uint32_t>::Uninitialized{});
      chunk_v_finite.assign(static_cast<std::size_t>((longest + kChunk - 1) / kChunk), 0);
    } else {
      v_rows = AlignedBuffer<T>(v_size, typename AlignedBuffer<T>::Uninitialized{});
      problem.v = v_rows.get();
      problem.v_strides = {p.dv, 0, 1};
    }
    problem.k = k_rows.get();
    problem.k_strides = {p.dk, 0, 1};
    for (SequenceGeometry& seq : problem.sequences) {
      seq.k_base = 0;
      if (!pairs) seq.v_base = 0;
    }
  }

  // V pair words of keys (2i, 2i + 1) from key `kv_begin` (even) on.
  const float* pairs_from(index_t kv_begin) const {
    return reinterpret_cast<const float*>(pair_words.get() + kv_begin / 2 * dvp);
  }

  // Whether the pair words of keys [begin, end) (begin even) are all finite.
  bool v_pairs_finite(index_t begin, index_t end) const {
    for (index_t c = begin / kChunk; c * kChunk < end; ++c) {
      if (chunk_v_finite[static_cast<std::size_t>(c)] == 0) return false;
    }
    return true;
  }

  // Copies band `b`'s K and V from `given` (the caller's problem), in chunks
  // of kChunk keys split among `exec`'s workers. pack_pairs(row, dim_stride,
  // keys, dv, dvp, dst): writes V's pair words (the kernel's pack_v) and
  // returns whether they are all finite (band_pair_packer; called only where
  // v_pairs).
  template <class Exec, class PackPairs>
  void pack(const AttentionProblem<T>& given, const KvBand& b, Exec& exec, const PackPairs& pack_pairs) {
    const index_t chunks = (given.sequence(b.sequence).kv_len + kChunk - 1) / kChunk;
    exec.parallel_for(chunks, [&](index_t c, int) { pack_chunk(given, b, c, pack_pairs); });
  }

 private:
  template <class PackPairs>
  void pack_chunk(const AttentionProblem<T>& given, const KvBand& b, index_t c, const PackPairs& pack_pairs) {
    const SequenceGeometry& s = given.sequence(b.sequence);
    const index_t begin = c * kChunk, end = std::min(s.kv_len, begin + kChunk);
    for (index_t j = begin; j < end; ++j) {
      copy_row(given.k_row(s, j, b.kv_head), given.dk, given.k_strides.dim, k_rows.get() + j * given.dk);
    }
    if (v_pairs) {  // an odd last chunk's last pair gets a zero key from pack_v
      const auto row = [&](index_t j) { return given.v_row(s, begin + j, b.kv_head); };
      const bool finite = pack_pairs(row, given.v_strides.dim, end - begin, given.dv, dvp,
                                     reinterpret_cast<float*>(pair_words.get() + begin / 2 * dvp));
      chunk_v_finite[static_cast<std::size_t>(c)] = finite ? 1 : 0;
      return;
    }
    for (index_t j = begin; j < end; ++j) {
      copy_row(given.v_row(s, j, b.kv_head), given.dv, given.v_strides.dim, v_rows.get() + j * given.dv);
    }
  }

  static void copy_row(const T* src, index_t n, index_t stride, T* dst) {
    if (stride == 1) {
      std::copy_n(src, n, dst);
    } else {
      for (index_t e = 0; e < n; ++e) dst[e] = src[e * stride];
    }
  }
};

}  // namespace seqattn::detail
