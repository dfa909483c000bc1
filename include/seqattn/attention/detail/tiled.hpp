// The tiled online-softmax engine shared by every tiled backend.
//
// The engine owns everything that is not arithmetic on a tile: validation
// results, the task list, the BlockMask walk (empty tiles are never visited,
// full tiles get no mask work, partial tiles are masked from stored bits or
// the element predicate), GQA addressing, storage conversion, split-KV
// partials and their LSE merge, and the final normalization. A backend's
// Kernel supplies the arithmetic on fp32 tiles (see backends/scalar.hpp for
// the contract, written out in plain C++):
//
//   scores(qt, rows_p, dk, k, k_stride, cols, st)   St[j][r] = sum_d K[j][d] Qt[d][r]
//   softcap(st, cols, rows_p, cap)                  St = cap * tanh(St)
//   online_softmax(st, cols, rows_p, m, l, alpha)   St -> P, running max/sum, rescale factors
//   accumulate_pv(pt, rows, cols, v, v_stride, dvp, alpha, o)   O = alpha * O + P V
//   to_f32(src, n, dst)                             storage -> fp32 for one contiguous row
//   padded_rows(rows), padded_dim(dv)               how far rows and head dims are padded
//   apply_column_bits(st, cols, rows_p, bits, bytes_per_key)  St[j][r] = -inf where bit r of key j is 0
//
// Tile layouts (fp32, in per-worker scratch):
//   Qt [dk][kBlockQ]      queries transposed: one vector holds one dim of many rows
//   St [kBlockKv][kBlockQ] scores transposed the same way, then probabilities
//   O  [kBlockQ][dvp]     unnormalized output rows, dvp = padded_dim(dv)
// Rows are padded to padded_rows(rows) <= kBlockQ with zero queries; their
// results are dropped.
//
// Tasks are (sequence, head or head group, q-block, kv-split). When the mask
// does not depend on the head and all queries of a sequence fit in
// kBlockQ / group rows (decode), the query heads that share a K/V head are
// stacked as rows of one tile, so K and V stream from memory once per group;
// when all heads fit and each group fills whole vectors, every K/V head goes
// into one task (rows ordered by K/V group), so a BSHD cache is read a whole
// token row at a time. With fewer such units than 4x the workers, each unit's
// tile list is split into kv_splits chunks (flash-decoding) whose (m, l, O)
// partials are merged by their running max before normalization.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"

namespace seqattn::detail {

// 64-byte aligned fp32 buffer (no hwy::AllocateAligned: it needs libhwy).
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(index_t n)
      : data_(static_cast<float*>(
            ::operator new (static_cast<std::size_t>(std::max<index_t>(n, 1)) * sizeof(float), std::align_val_t{64}))),
        size_(n) {
    std::fill_n(data_.get(), n, 0.0f);
  }
  float* get() const { return data_.get(); }
  index_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> data_;
  index_t size_ = 0;
};

inline index_t round_up(index_t n, index_t multiple) { return (n + multiple - 1) / multiple * multiple; }

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One kv-block of one row of tiles: full (tile_id == kFull), partial with
// stored bits (tile_id >= 0) or partial to be masked by the predicate.
struct TileRef {
  static constexpr std::int32_t kFull = -1;
  static constexpr std::int32_t kPredicate = -2;
  std::int32_t kv_block = 0;
  std::int32_t tile_id = kFull;
};

struct WorkUnit {
  index_t sequence = 0;
  index_t head0 = 0;        // first query head
  index_t group_heads = 1;  // query heads stacked per K/V head (1, or the GQA group)
  index_t kv_groups = 1;    // K/V heads whose groups are stacked one after another
  index_t q_block = 0;
  index_t q_begin = 0;  // sequence-local query range of this unit
  index_t q_end = 0;
  std::size_t tiles_begin = 0;  // into the flat TileRef list
  std::size_t tiles_end = 0;

  // Rows are ordered (K/V group, query, head within the group).
  index_t group_rows() const { return (q_end - q_begin) * group_heads; }
  index_t rows() const { return group_rows() * kv_groups; }
  index_t q_of(index_t r) const { return q_begin + r % group_rows() / group_heads; }
  index_t head_of(index_t r) const { return head0 + r / group_rows() * group_heads + r % group_heads; }
  index_t num_tiles() const { return static_cast<index_t>(tiles_end - tiles_begin); }
};

// Writes one finished row: out = O / l, lse = log(l) + m, with the sink folded in.
template <class T>
void finalize_row(const AttentionProblem<T>& p, const SequenceGeometry& s, index_t q, index_t head, float m, float l,
                  const float* o) {
  float lse = kNegInf;
  float inv = 0.0f;
  if (!p.sinks.empty()) {
    const float sink = p.sinks[static_cast<std::size_t>(head)];
    const float top = std::max(m, sink);
    const float rescale = l > 0.0f ? std::exp(m - top) : 0.0f;
    const float total = l * rescale + std::exp(sink - top);
    lse = top + std::log(total);
    inv = rescale / total;
  } else if (l > 0.0f) {
    lse = m + std::log(l);
    inv = 1.0f / l;
  }
  T* dst = p.out + s.out_base + q * p.out_strides.token + head * p.out_strides.head;
  for (index_t e = 0; e < p.dv; ++e) dst[e * p.out_strides.dim] = from_float<T>(o[e] * inv);
  if (p.lse) p.lse[s.lse_base + q * p.lse_strides.token + head * p.lse_strides.head] = lse;
}

template <class Kernel, class T, MaskDescription M, class Exec>
void run_tiled_attention(const AttentionProblem<T>& p, const M& mask, const BlockMask& bm, Exec& exec) {
  constexpr index_t kBq = Kernel::kBlockQ;
  constexpr index_t kBkv = Kernel::kBlockKv;
  const index_t dvp = Kernel::padded_dim(p.dv);
  const int workers = std::max(1, exec.workers());

  // ---- Work units and their tile lists (head-invariant masks share rows).
  const bool stack_heads = bm.heads() == 1 && p.group > 1 && p.max_q_len() * p.group <= kBq;
  // Decode from a BSHD cache: every K/V head of a token tile in one task, so
  // the 2 KiB token rows stream contiguously instead of in 512 B slices.
  // Needs each group's rows to fill whole vectors (no padding between groups).
  index_t kv_groups_per_unit = 1;
  if (stack_heads && p.kv_heads > 1 && p.max_q_len() * p.heads <= kBq) {
    bool aligned = true;
    for (const auto& s : p.sequences) {
      const index_t gr = s.q_len * p.group;
      aligned = aligned && (gr == 0 || Kernel::padded_rows(gr) == gr);
    }
    if (aligned) kv_groups_per_unit = p.kv_heads;
  }
  std::vector<WorkUnit> units;
  std::vector<TileRef> tiles;
  const bool bits = bm.has_tile_bits();
  for (index_t b = 0; b < p.batch(); ++b) {
    const auto& s = p.sequences[static_cast<std::size_t>(b)];
    if (s.q_len == 0) continue;
    const index_t group_heads = stack_heads ? p.group : 1;
    for (index_t h0 = 0; h0 < p.heads; h0 += group_heads * kv_groups_per_unit) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        WorkUnit u{
            b, h0, group_heads, kv_groups_per_unit, qb, qb * kBq, std::min(s.q_len, (qb + 1) * kBq), tiles.size(), 0};
        for (const BlockRange r : bm.full_ranges(b, h0, qb)) {
          for (std::int32_t kb = r.begin; kb < r.end; ++kb) tiles.push_back({kb, TileRef::kFull});
        }
        const auto partial = bm.partial_blocks(b, h0, qb);
        const auto ids = bm.partial_tile_ids(b, h0, qb);
        for (std::size_t i = 0; i < partial.size(); ++i) {
          tiles.push_back({partial[i], bits ? ids[i] : TileRef::kPredicate});
        }
        u.tiles_end = tiles.size();
        units.push_back(u);
      }
    }
  }
  if (units.empty()) return;

  // ---- KV splits: enough tasks to keep every worker busy (flash-decoding).
  index_t splits = p.kv_splits;
  if (splits == 0) {
    splits = 1;
    const auto n_units = static_cast<index_t>(units.size());
    if (workers > 1 && n_units < 4 * workers) {
      index_t max_tiles = 0;
      for (const auto& u : units) max_tiles = std::max(max_tiles, u.num_tiles());
      splits = std::clamp<index_t>((4 * workers + n_units - 1) / n_units, 1, std::max<index_t>(1, max_tiles / 2));
    }
  }
  const index_t n_tasks = static_cast<index_t>(units.size()) * splits;
  // Longest tasks first: with dynamic claiming this balances causal rows.
  std::vector<index_t> order(static_cast<std::size_t>(n_tasks));
  for (index_t t = 0; t < n_tasks; ++t) order[static_cast<std::size_t>(t)] = t;
  auto task_tiles = [&](index_t t) {
    const auto& u = units[static_cast<std::size_t>(t / splits)];
    const index_t s = t % splits, n = u.num_tiles();
    return n * (s + 1) / splits - n * s / splits;
  };
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
    return task_tiles(a) * units[static_cast<std::size_t>(a / splits)].rows() >
           task_tiles(b) * units[static_cast<std::size_t>(b / splits)].rows();
  });

  // ---- Scratch, sized before the parallel region and indexed by worker.
  struct Scratch {
    AlignedFloats qt, kbuf, vbuf, st, o, m, l, alpha;
  };
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    scratch.push_back({AlignedFloats(p.dk * kBq), AlignedFloats(kBkv * p.dk), AlignedFloats(kBkv * dvp),
                       AlignedFloats(kBkv * kBq), AlignedFloats(kBq * dvp), AlignedFloats(kBq), AlignedFloats(kBq),
                       AlignedFloats(kBq)});
  }
  // Partial tiles' bits transposed to one bit per row for each key, the
  // layout of St: the kernel masks a vector of rows with one mask load. Used
  // when rows are one q-tile of one head (not for stacked GQA rows).
  const index_t column_tile_bytes = kBkv * (kBq / 8);
  std::vector<std::uint8_t> column_bits;
  if (!stack_heads && bits && kBq % 8 == 0 && bm.num_distinct_partial_tiles() > 0) {
    const index_t distinct = bm.num_distinct_partial_tiles(), wpr = bm.words_per_row();
    column_bits.assign(static_cast<std::size_t>(distinct * column_tile_bytes), 0);
    for (index_t id = 0; id < distinct; ++id) {
      const auto rows_bits = bm.tile_bits(static_cast<std::int32_t>(id));
      std::uint8_t* dst = column_bits.data() + id * column_tile_bytes;
      for (index_t r = 0; r < kBq; ++r) {
        for (index_t c = 0; c < kBkv; ++c) {
          if ((rows_bits[static_cast<std::size_t>(r * wpr + c / 64)] >> (c % 64)) & 1u) {
            dst[c * (kBq / 8) + r / 8] |= static_cast<std::uint8_t>(1u << (r % 8));
          }
        }
      }
    }
  }

  const index_t partial_row = dvp + 2;  // O row, then m and l
  AlignedFloats partials(splits > 1 ? n_tasks * kBq * partial_row : 0);

  // fp32 K/V tiles whose rows are already contiguous are used in place when
  // the tile has many rows. Otherwise they are copied into a dense tile
  // first: rows interleaved with other heads (BSHD, token stride Hkv * D) at a
  // 4 KiB stride all map to the same few L1 sets, and with few rows (decode)
  // the broadcast-driven QK^T loop reading straight from DRAM is latency-
  // bound: copy-then-compute streamed 32k x 4 heads of K/V in 13.3 ms against
  // 19.4 ms in place (one thread). In prefill the copy is under 1% of a tile.
  const bool k_contiguous = std::is_same_v<T, float> && p.k_strides.dim == 1 && p.k_strides.token == p.dk;
  const bool v_contiguous =
      std::is_same_v<T, float> && p.v_strides.dim == 1 && dvp == p.dv && p.v_strides.token == p.dv;
  const float q_scale = p.softcap > 0.0f ? p.scale / p.softcap : p.scale;

  auto run_task = [&](index_t order_index, int worker) {
    const index_t task = order[static_cast<std::size_t>(order_index)];
    const WorkUnit& u = units[static_cast<std::size_t>(task / splits)];
    const index_t split = task % splits;
    const auto& seq = p.sequences[static_cast<std::size_t>(u.sequence)];
    Scratch& sc = scratch[static_cast<std::size_t>(worker)];
    const index_t rows = u.rows();
    const index_t group_rows = u.group_rows();
    // With several K/V groups each group's rows are already whole vectors.
    const index_t rows_p = u.kv_groups == 1 ? Kernel::padded_rows(rows) : rows;
    const index_t group_rows_p = u.kv_groups == 1 ? rows_p : group_rows;
    const bool k_direct = k_contiguous && rows > kBq / 4;
    const bool v_direct = v_contiguous && rows > kBq / 4;
    auto row_q = [&](index_t r) { return u.q_of(r); };
    auto row_head = [&](index_t r) { return u.head_of(r); };

    // Q tile, transposed and pre-scaled; padded rows are zero.
    float* qt = sc.qt.get();
    for (index_t r = 0; r < rows_p; ++r) {
      if (r >= rows) {
        for (index_t d = 0; d < p.dk; ++d) qt[d * kBq + r] = 0.0f;
        continue;
      }
      const T* src = p.q + seq.q_base + row_q(r) * p.q_strides.token + row_head(r) * p.q_strides.head;
      for (index_t d = 0; d < p.dk; ++d) qt[d * kBq + r] = to_float(src[d * p.q_strides.dim]) * q_scale;
    }
    float* m = sc.m.get();
    float* l = sc.l.get();
    float* o = sc.o.get();
    std::fill_n(m, kBq, kNegInf);
    std::fill_n(l, kBq, 0.0f);
    std::fill_n(o, rows_p * dvp, 0.0f);

    const index_t n = u.num_tiles();
    const index_t t_begin = n * split / splits, t_end = n * (split + 1) / splits;
    for (index_t t = t_begin; t < t_end; ++t) {
      const TileRef ref = tiles[u.tiles_begin + static_cast<std::size_t>(t)];
      const index_t kv0 = static_cast<index_t>(ref.kv_block) * kBkv;
      const index_t cols = std::min(kBkv, seq.kv_len - kv0);
      for (index_t g = 0; g < u.kv_groups; ++g) {
        const index_t kv_head = u.head0 / p.group + g;
        const index_t r0 = g * group_rows, r1 = r0 + group_rows;
        const T* k_src = p.k + seq.k_base + kv0 * p.k_strides.token + kv_head * p.k_strides.head;
        const float* k_rows;
        index_t k_stride;
        if constexpr (std::is_same_v<T, float>) {
          if (k_direct) {
            k_rows = k_src;
            k_stride = p.k_strides.token;
          }
        }
        if (!k_direct) {
          float* kb = sc.kbuf.get();
          for (index_t j = 0; j < cols; ++j) {
            const T* row = k_src + j * p.k_strides.token;
            if (p.k_strides.dim == 1) {
              Kernel::to_f32(row, p.dk, kb + j * p.dk);
            } else {
              for (index_t d = 0; d < p.dk; ++d) kb[j * p.dk + d] = to_float(row[d * p.k_strides.dim]);
            }
          }
          k_rows = kb;
          k_stride = p.dk;
        }

        float* st = sc.st.get() + r0;
        Kernel::scores(qt + r0, group_rows_p, p.dk, k_rows, k_stride, cols, st);
        if (p.softcap > 0.0f) Kernel::softcap(st, cols, group_rows_p, p.softcap);

        if (ref.tile_id >= 0 && !column_bits.empty()) {
          Kernel::apply_column_bits(st, cols, group_rows_p,
                                    column_bits.data() + static_cast<std::size_t>(ref.tile_id) * column_tile_bytes,
                                    kBq / 8);
        } else if (ref.tile_id >= 0) {
          const auto tile_bits = bm.tile_bits(ref.tile_id);
          const index_t wpr = bm.words_per_row();
          for (index_t r = r0; r < r1; ++r) {
            const std::uint64_t* row_bits = tile_bits.data() + (row_q(r) - u.q_block * kBq) * wpr;
            for (index_t j = 0; j < cols; ++j) {
              if (!((row_bits[j / 64] >> (j % 64)) & 1u)) st[j * kBq + r - r0] = kNegInf;
            }
          }
        } else if (ref.tile_id == TileRef::kPredicate) {
          for (index_t r = r0; r < r1; ++r) {
            const MaskContext ctx{u.sequence, row_head(r), seq.q_len, seq.kv_len};
            const index_t q = row_q(r);
            for (index_t j = 0; j < cols; ++j) {
              if (!mask.allowed(ctx, q, kv0 + j)) st[j * kBq + r - r0] = kNegInf;
            }
          }
        }

        float* alpha = sc.alpha.get() + r0;
        Kernel::online_softmax(st, cols, group_rows_p, m + r0, l + r0, alpha);

        const T* v_src = p.v + seq.v_base + kv0 * p.v_strides.token + kv_head * p.v_strides.head;
        const float* v_rows;
        index_t v_stride;
        if constexpr (std::is_same_v<T, float>) {
          if (v_direct) {
            v_rows = v_src;
            v_stride = p.v_strides.token;
          }
        }
        if (!v_direct) {
          float* vb = sc.vbuf.get();
          for (index_t j = 0; j < cols; ++j) {
            const T* row = v_src + j * p.v_strides.token;
            float* dst = vb + j * dvp;
            if (p.v_strides.dim == 1) {
              Kernel::to_f32(row, p.dv, dst);
            } else {
              for (index_t e = 0; e < p.dv; ++e) dst[e] = to_float(row[e * p.v_strides.dim]);
            }
            std::fill(dst + p.dv, dst + dvp, 0.0f);
          }
          v_rows = vb;
          v_stride = dvp;
        }
        Kernel::accumulate_pv(st, group_rows, cols, v_rows, v_stride, dvp, alpha, o + r0 * dvp);
      }
    }

    if (splits == 1) {
      for (index_t r = 0; r < rows; ++r) finalize_row(p, seq, row_q(r), row_head(r), m[r], l[r], o + r * dvp);
    } else {
      float* part = partials.get() + task * kBq * partial_row;
      for (index_t r = 0; r < rows; ++r) {
        std::copy_n(o + r * dvp, dvp, part + r * partial_row);
        part[r * partial_row + dvp] = m[r];
        part[r * partial_row + dvp + 1] = l[r];
      }
    }
  };
  exec.parallel_for(n_tasks, run_task);
  if (splits == 1) return;

  // ---- Merge the splits of each unit by their running max (LSE merge).
  exec.parallel_for(static_cast<index_t>(units.size()), [&](index_t unit_index, int worker) {
    const WorkUnit& u = units[static_cast<std::size_t>(unit_index)];
    const auto& seq = p.sequences[static_cast<std::size_t>(u.sequence)];
    float* acc = scratch[static_cast<std::size_t>(worker)].o.get();
    for (index_t r = 0; r < u.rows(); ++r) {
      float top = kNegInf;
      for (index_t s = 0; s < splits; ++s) {
        const float* part = partials.get() + ((unit_index * splits + s) * kBq + r) * partial_row;
        if (part[dvp + 1] > 0.0f) top = std::max(top, part[dvp]);
      }
      float l = 0.0f;
      std::fill_n(acc, dvp, 0.0f);
      for (index_t s = 0; s < splits; ++s) {
        const float* part = partials.get() + ((unit_index * splits + s) * kBq + r) * partial_row;
        if (!(part[dvp + 1] > 0.0f)) continue;
        const float w = std::exp(part[dvp] - top);
        l += part[dvp + 1] * w;
        for (index_t e = 0; e < p.dv; ++e) acc[e] += part[e] * w;
      }
      finalize_row(p, seq, u.q_of(r), u.head_of(r), top, l, acc);
    }
  });
}

}  // namespace seqattn::detail
