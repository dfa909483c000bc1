// Test support for descriptors: small tensor builders and a brute-force
// oracle that follows docs/semantics/sequence-descriptors.md literally (dense
// allow mask per row, row_ids / col_ids, TE's P; TE's packing), independent of
// the library's O(T) path. Section numbers (§) below refer to that file.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "seqattn/descriptors.hpp"

namespace seqattn::testing {

// Every AttnMaskType the descriptors accept, for tests that sweep them.
inline constexpr AttnMaskType kAllMaskTypes[] = {AttnMaskType::no_mask,
                                                 AttnMaskType::padding,
                                                 AttnMaskType::causal,
                                                 AttnMaskType::padding_causal,
                                                 AttnMaskType::causal_bottom_right,
                                                 AttnMaskType::padding_causal_bottom_right};

inline Tensor<std::int32_t> make(const Extents& shape, std::initializer_list<int> values) {
  return Tensor<std::int32_t>(shape, std::vector<std::int32_t>(values.begin(), values.end()));
}
inline Tensor<std::int32_t> make(const Extents& shape, const std::vector<int>& values) {
  return Tensor<std::int32_t>(shape, std::vector<std::int32_t>(values.begin(), values.end()));
}
inline std::vector<int> values(const Tensor<std::int32_t>& t) { return {t.values().begin(), t.values().end()}; }
inline std::vector<int> values(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// §2.6 run_length_fill: length of the maximal run of equal consecutive ids, 0 on padding.
inline std::vector<int> run_length_fill(const std::vector<int>& ids) {
  std::vector<int> rl(ids.size(), 0);
  std::size_t b = 0;
  while (b < ids.size()) {
    std::size_t e = b;
    while (e < ids.size() && ids[e] == ids[b]) ++e;
    for (std::size_t t = b; t < e; ++t) rl[t] = ids[b] == 0 ? 0 : static_cast<int>(e - b);
    b = e;
  }
  return rl;
}

// §4.1 TYPE term.
inline bool type_allows(AttnMaskType mask, int pos_q, int pos_kv, int rl_q, int rl_kv) {
  if (!is_causal(mask)) return true;
  if (is_bottom_right(mask)) return rl_q - pos_q <= rl_kv - pos_kv;
  return pos_q >= pos_kv;
}

// §4.1 SWA term (negative = unbounded; bottom-right uses the left side only).
inline bool window_allows(AttnMaskType mask, WindowSize w, int pos_q, int pos_kv, int rl_q, int rl_kv) {
  if (is_bottom_right(mask)) return w.left < 0 || rl_q - pos_q + w.left >= rl_kv - pos_kv;
  return (w.left < 0 || pos_q - w.left <= pos_kv) && (w.right < 0 || pos_kv <= pos_q + w.right);
}

struct Row {
  std::vector<int> ids, pos;
};

// Dense allow mask of one row, [Tq][Tkv]: SEG and TYPE, plus SWA when asked.
inline std::vector<std::vector<char>> dense_mask(const Row& q, const Row& kv, AttnMaskType mask,
                                                 const WindowSize* window) {
  const std::vector<int> rl_q = run_length_fill(q.ids), rl_kv = run_length_fill(kv.ids);
  std::vector<std::vector<char>> a(q.ids.size(), std::vector<char>(kv.ids.size(), 0));
  for (std::size_t i = 0; i < q.ids.size(); ++i) {
    for (std::size_t j = 0; j < kv.ids.size(); ++j) {
      bool ok = q.ids[i] != 0 && q.ids[i] == kv.ids[j] && type_allows(mask, q.pos[i], kv.pos[j], rl_q[i], rl_kv[j]);
      if (window) ok = ok && window_allows(mask, *window, q.pos[i], kv.pos[j], rl_q[i], rl_kv[j]);
      a[i][j] = ok;
    }
  }
  return a;
}

// §2.4 P, exactly as TE computes it: bincount by id (bin 0 and ids > M
// dropped), boundaries where the id changes to non-zero, first M+1 kept.
struct PResult {
  std::vector<int> seqlens, offsets;
};
inline PResult apply_p(const std::vector<int>& ids, int m) {
  PResult p{std::vector<int>(static_cast<std::size_t>(m), 0), std::vector<int>(static_cast<std::size_t>(m) + 1, -1)};
  std::size_t n_off = 0;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] >= 1 && ids[t] <= m) ++p.seqlens[static_cast<std::size_t>(ids[t] - 1)];
    const bool boundary = ids[t] != 0 && (t == 0 || ids[t] != ids[t - 1]);
    if (boundary && n_off < p.offsets.size()) p.offsets[n_off++] = static_cast<int>(t);
  }
  return p;
}

// The slow path by its definition (O(T^2)): row_ids / col_ids from the dense
// mask without SWA, then P.
struct RowOracle {
  PResult q, kv;
  std::vector<int> row_ids, col_ids;
};
inline RowOracle slow_path_row(const Row& q, const Row& kv, AttnMaskType mask, int m) {
  const auto a = dense_mask(q, kv, mask, nullptr);
  RowOracle o;
  o.row_ids.assign(q.ids.size(), 0);
  o.col_ids.assign(kv.ids.size(), 0);
  for (std::size_t i = 0; i < q.ids.size(); ++i) {
    for (std::size_t j = 0; j < kv.ids.size(); ++j) {
      if (a[i][j]) {
        o.row_ids[i] = q.ids[i];
        o.col_ids[j] = kv.ids[j];
      }
    }
  }
  o.q = apply_p(o.row_ids, m);
  o.kv = apply_p(o.col_ids, m);
  return o;
}

// True if every non-zero id of `ids` occupies one contiguous run.
inline bool runs_contiguous(const std::vector<int>& ids) {
  std::vector<int> seen;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] == 0 || (t > 0 && ids[t] == ids[t - 1])) continue;
    if (std::find(seen.begin(), seen.end(), ids[t]) != seen.end()) return false;
    seen.push_back(ids[t]);
  }
  return true;
}

// Row `r` of a (..., T) tensor whose leading shape is broadcast (right
// aligned) against the output batch shape `batch`.
inline Row broadcast_row(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& pos, const Extents& batch,
                         index_t r) {
  // Multi-index of r over batch, then drop leading coordinates.
  std::vector<index_t> idx(static_cast<std::size_t>(batch.rank()));
  for (int d = batch.rank() - 1; d >= 0; --d) {
    idx[static_cast<std::size_t>(d)] = r % batch[d];
    r /= batch[d];
  }
  const auto flat_row = [&](const Tensor<std::int32_t>& t) {
    const int lead = t.rank() - 1;
    index_t f = 0;
    for (int d = 0; d < lead; ++d) f = f * t.extent(d) + idx[static_cast<std::size_t>(batch.rank() - lead + d)];
    return f;
  };
  const index_t len = ids.extent(-1);
  Row row;
  const index_t fi = flat_row(ids), fp = flat_row(pos);
  row.ids.assign(ids.data() + fi * len, ids.data() + (fi + 1) * len);
  row.pos.assign(pos.data() + fp * len, pos.data() + (fp + 1) * len);
  return row;
}

// TE's packing (§2.8) of per-row P results, independent of pack_segments.
struct OraclePacked {
  std::vector<int> seqlens, offsets, cu_seqlens;
};
inline OraclePacked te_pack(const std::vector<PResult>& rows, int m, index_t seq_len) {
  OraclePacked p;
  const auto n_rows = static_cast<int>(rows.size());
  std::vector<int> lens, offs;
  for (int r = 0; r < n_rows; ++r) {
    for (int v : rows[static_cast<std::size_t>(r)].seqlens) lens.push_back(v);
    for (int v : rows[static_cast<std::size_t>(r)].offsets)
      offs.push_back(v >= 0 ? v + r * static_cast<int>(seq_len) : -1);
  }
  for (int v : lens) {
    if (v > 0) p.seqlens.push_back(v);
  }
  p.seqlens.resize(lens.size(), 0);
  for (int v : offs) {
    if (v >= 0) p.offsets.push_back(v);
  }
  p.offsets.resize(offs.size(), n_rows * static_cast<int>(seq_len));
  p.cu_seqlens.push_back(0);
  for (int v : p.seqlens) p.cu_seqlens.push_back(p.cu_seqlens.back() + std::max(v, 0));
  (void)m;
  return p;
}

// §4.2: the mask a kernel applies given packed segments, on the flat token
// axes: local indices a (query) and c (key) inside each segment, causal and
// window bounds shifted by Lkv - Lq under bottom-right alignment.
inline std::vector<std::vector<char>> kernel_mask(const SegmentTable& t, index_t q_tokens, index_t kv_tokens,
                                                  AttnMaskType mask, WindowSize w) {
  std::vector<std::vector<char>> out(static_cast<std::size_t>(q_tokens),
                                     std::vector<char>(static_cast<std::size_t>(kv_tokens), 0));
  for (index_t s = 0; s < t.size(); ++s) {
    const auto si = static_cast<std::size_t>(s);
    const int lq = t.q_lens[si], lkv = t.kv_lens[si];
    const int shift = is_bottom_right(mask) ? lkv - lq : 0;
    for (int a = 0; a < lq; ++a) {
      for (int c = 0; c < lkv; ++c) {
        bool ok = !is_causal(mask) || c <= a + shift;
        if (w.left >= 0) ok = ok && c >= a + shift - w.left;
        if (w.right >= 0) ok = ok && c <= a + shift + w.right;
        out[static_cast<std::size_t>(t.q_offsets[si] + a)][static_cast<std::size_t>(t.kv_offsets[si] + c)] = ok;
      }
    }
  }
  return out;
}

// ---- random batches ----

// One row of ids: up to `max_segments` segments 1, 2, ... of random lengths
// with random padding before, between and after them.
inline std::vector<int> random_ids(std::mt19937& rng, index_t len, int max_segments) {
  std::vector<int> ids(static_cast<std::size_t>(len), 0);
  std::uniform_int_distribution<int> coin(0, 3), seg_len(1, 7), gap(0, 2);
  const int want = std::uniform_int_distribution<int>(0, max_segments)(rng);
  index_t t = coin(rng) == 0 ? gap(rng) : 0;
  for (int s = 1; s <= want && t < len; ++s) {
    const index_t l = std::min<index_t>(seg_len(rng), len - t);
    for (index_t k = 0; k < l; ++k) ids[static_cast<std::size_t>(t + k)] = s;
    t += l;
    if (coin(rng) == 0) t += gap(rng);
  }
  return ids;
}

// Positions 0, 1, ... restarting at every segment (TE's test generators).
inline std::vector<int> arange_per_segment(const std::vector<int>& ids) {
  std::vector<int> pos(ids.size(), 0);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] != 0 && t > 0 && ids[t] == ids[t - 1]) pos[t] = pos[t - 1] + 1;
  }
  return pos;
}

inline Extents random_extras(std::mt19937& rng) {
  Extents e;
  const int rank = std::uniform_int_distribution<int>(0, 2)(rng);
  for (int d = 0; d < rank; ++d) e.push_back(std::uniform_int_distribution<int>(1, 3)(rng));
  return e;
}

}  // namespace seqattn::testing
