// DeepSeek-V3.2 sparse attention ("DSA") with its lightning indexer
// (docs/semantics/multi-item-topk-kascade.md, part B), as MaxText runs it in training/prefill.
//
//   score[i, j] = sum_h ReLU(q[i, h, :] . k[j, :]) * w[i, h]     for keys j the base mask A allows (B.2)
//   selected(i) = top-k of score[i, :] + 0.0 over allowed keys: descending score, equal scores lowest index
//                 first (jax.lax.top_k after MaxText's "score += A", so -0.0 and +0.0 tie; B.3); a row with
//                 <= k allowed keys keeps all of them (bypass), and when the whole key axis has <= k keys
//                 there is no selection at all: the mask is A (B.3 step 1)
//   attention   = softmax over the selected keys only (shared by every attention head)
//
// The indexer's key k[j] is one vector shared by all indexer heads (MQA style); w already carries the
// h^(-1/2) d^(-1/2) factor. Masks are consumed as predicates, never by adding M twice (B.4, B.8.2).
// Nothing forces an attention sink or the query itself into the set (TV-B4), matching MaxText.
//
// Two ways to turn top-k indices into a mask are kept so the bench can compare them: scatter (fill, then
// set k entries per row: O(t (s + k))) and MaxText's old broadcast-compare (O(t k s)). The exact-k
// threshold rule of PR #4437 is here too, for the tie vectors TV-B1..B3 (§B.7); select_topk uses it after an
// nth_element, which gives jax.lax.top_k's set in O(s) per row.
//
// Execution (sparse_attention): the selection becomes the library's TopKMask over the full K/V, so the engine
// skips every 64x64 tile no row of a q-block selected from; when selections are scattered enough that gathering
// each q-block's union of keys into its own segment visits a third fewer tiles, they run gathered instead
// (estimate_path). The indexer itself is O(t s h d) dense work: indexer_topk scores two rows at a time with a
// runtime-dispatched Highway kernel (scenarios/kernels.hpp; link seqattn::scenario_kernels) and reduces them at
// once, never holding the [t, s] scores; in fp32 on a CPU it costs about a third of dense attention at 8 heads x
// 64 dims vs 4 indexer heads x 32 dims (bench/scenarios.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/structural.hpp"
#include "seqattn/masks/topk.hpp"
#include "seqattn/scenarios/attend.hpp"
#include "seqattn/scenarios/kernels.hpp"
#include "seqattn/scenarios/reference.hpp"

namespace seqattn::scenarios::dsa {

inline constexpr float kNotAllowed = -std::numeric_limits<float>::infinity();

namespace detail {
// A [rows, cols] 0/1 mask of zeros.
inline Tensor<std::uint8_t> zeros_u8(index_t rows, index_t cols) {
  return Tensor<std::uint8_t>(seqattn::detail::make_extents({rows, cols}), std::uint8_t{0});
}

// Calls row(i, scores) for every row i in order, scores[j] (j < s) being the
// index score of key j, or -inf where the base mask forbids it. Scores are
// produced two rows at a time into an O(s) buffer, so callers that reduce
// each row (top-k) never hold the [t, s] matrix.
template <MaskDescription Base, class Row>
void for_each_index_score_row(TensorView<const float> q, TensorView<const float> k, TensorView<const float> w,
                              const Base& base, Row&& row) {
  seqattn::detail::require(q.rank() == 3 && k.rank() == 2 && w.rank() == 2,
                           "dsa::index_scores: expected q [t, h, d], k [s, d], w [t, h]; got q ", q.shape(), ", k ",
                           k.shape(), ", w ", w.shape());
  const index_t t = q.extent(0), h = q.extent(1), d = q.extent(2), s = k.extent(0);
  seqattn::detail::require(k.extent(1) == d, "dsa::index_scores: k ", k.shape(), " must have head_dim ", d, " like q ",
                           q.shape());
  seqattn::detail::require(w.shape() == seqattn::detail::make_extents({t, h}), "dsa::index_scores: w must have shape ",
                           seqattn::detail::make_extents({t, h}), " (q ", q.shape(), "), got ", w.shape());
  // k is laid out once in zero-padded chunks of W keys, [s / W][d][W], for
  // the Highway micro-kernel that scores two rows at a time
  // (ScenarioKernels::index_rows, runtime-dispatched: scenarios/kernels.hpp).
  const dispatch::ScenarioKernels kernels = dispatch::scenario_kernels();
  const index_t width = kernels.chunk_width;
  const index_t sp = (s + width - 1) / width * width;
  std::vector<float> kt(static_cast<std::size_t>(d * sp), 0.0f);
  for (index_t j = 0; j < s; ++j) {
    for (index_t c = 0; c < d; ++c)
      kt[static_cast<std::size_t>((j / width) * width * d + c * width + j % width)] = k(j, c);
  }
  const MaskContext ctx{0, 0, t, s};
  std::vector<index_t> extent(static_cast<std::size_t>(t));  // row i's allowed keys lie in [0, extent[i])
  for (index_t i = 0; i < t; ++i) {
    index_t n = s;
    while (n > 0 && !base.allowed(ctx, i, n - 1)) --n;
    extent[static_cast<std::size_t>(i)] = n;
  }
  std::vector<float> qb(static_cast<std::size_t>(2 * h * d)), wb(static_cast<std::size_t>(2 * h));
  std::vector<float> out(static_cast<std::size_t>(2 * sp));
  for (index_t i0 = 0; i0 < t; i0 += 2) {
    const index_t rows = std::min<index_t>(2, t - i0);
    index_t n = 0;
    for (index_t r = 0; r < 2; ++r) {
      const index_t i = i0 + std::min<index_t>(r, rows - 1);  // a lone last row is scored twice
      n = std::max(n, extent[static_cast<std::size_t>(i)]);
      for (index_t hh = 0; hh < h; ++hh) {
        wb[static_cast<std::size_t>(r * h + hh)] = w(i, hh);
        for (index_t c = 0; c < d; ++c) qb[static_cast<std::size_t>((r * h + hh) * d + c)] = q(i, hh, c);
      }
    }
    kernels.index_rows(qb.data(), wb.data(), h, d, kt.data(), (n + width - 1) / width * width, out.data(),
                       out.data() + sp);
    for (index_t r = 0; r < rows; ++r) {
      const index_t i = i0 + r;
      float* scores = out.data() + r * sp;
      for (index_t j = 0; j < s; ++j) {
        if (j >= extent[static_cast<std::size_t>(i)] || !base.allowed(ctx, i, j)) scores[j] = kNotAllowed;
      }
      row(i, static_cast<const float*>(scores));
    }
  }
}

}  // namespace detail

// Index scores [t, s] from indexer queries q [t, h, d], keys k [s, d] and head
// weights w [t, h]; entries the base mask forbids are -inf. fp32 throughout.
template <MaskDescription Base = CausalMask>
Tensor<float> index_scores(TensorView<const float> q, TensorView<const float> k, TensorView<const float> w,
                           const Base& base = CausalMask{Alignment::bottom_right}) {
  const index_t s = k.rank() == 2 ? k.extent(0) : 0;
  Tensor<float> scores(seqattn::detail::make_extents({q.rank() == 3 ? q.extent(0) : 0, s}), kNotAllowed);
  detail::for_each_index_score_row(q, k, w, base,
                                   [&](index_t i, const float* row) { std::copy_n(row, s, scores.data() + i * s); });
  return scores;
}

// Per-row selection. indices [t, k]: the selected keys of each row in
// descending-score order (ties: lower index first), or, for a bypassed row,
// all its allowed keys in ascending order; -1 fills the unused slots.
struct TopK {
  index_t k = 0;
  index_t kv_len = 0;
  Tensor<std::int32_t> indices;  // [t, k]
  std::vector<index_t> counts;   // valid entries per row
  index_t bypassed_rows = 0;

  index_t rows() const { return indices.extent(0); }
};

// Throws unless every entry of indices [t, k] is -1 (unused) or a key in [0, kv_len).
inline void validate_indices(TensorView<const std::int32_t> indices, index_t kv_len) {
  seqattn::detail::require(indices.rank() == 2, "dsa: top-k indices must have shape [t, k], got ", indices.shape());
  for (index_t i = 0; i < indices.extent(0); ++i) {
    for (index_t r = 0; r < indices.extent(1); ++r) {
      const std::int32_t j = indices(i, r);
      seqattn::detail::require(j >= -1 && j < kv_len, "dsa: top-k indices ", indices.shape(), " entry [", i, ", ", r,
                               "] = ", j, " is outside [0, ", kv_len, ") (kv_len ", kv_len, "; -1 marks unused)");
    }
  }
}

// Order of each ranked row's indices: by_score is jax.lax.top_k's on score + 0.0
// (descending score, ties by lower index, -0.0 == +0.0); by_index is ascending key order, the same set,
// and skips a sort of k entries per row (what masks and gathers need).
enum class TopKOrder : std::uint8_t { by_score, by_index };

namespace detail {

// Scratch for select_row, sized once per call.
struct TopKScratch {
  std::vector<std::int32_t> keys;
  std::vector<std::uint64_t> keyed;
};

// The rank of an allowed key's score, as an integer key. MaxText ranks
// score + A with A = 0.0 on allowed keys (docs/semantics, B.3), and adding 0.0
// turns -0.0 into +0.0: the two zeros tie (lower index first) instead of +0.0
// ranking above -0.0 as jax.lax.top_k does on raw scores. Otherwise the order is
// top_k's (seqattn::topk_order_key): NaN keeps its sign, so NaN ranks above
// +inf and -NaN below -inf. The addition is kept rather than a test for zero
// so that any other bits change exactly as MaxText's do (a signalling NaN turns quiet).
inline std::int32_t score_order_key(float score) { return seqattn::topk_order_key(score + 0.0f); }

// One row of select_topk: writes the row's selection to out[0, count) and
// returns count; `bypassed` says whether the row had <= k allowed keys.
// Scores rank by score_order_key, compared as integer keys.
inline index_t select_row(const float* row, index_t s, index_t k, TopKOrder order_by, std::int32_t* out, bool& bypassed,
                          TopKScratch& scratch) {
  scratch.keys.resize(static_cast<std::size_t>(s));
  index_t n = 0;
  for (index_t j = 0; j < s; ++j) {
    if (row[j] != kNotAllowed) scratch.keys[static_cast<std::size_t>(n++)] = score_order_key(row[j]);
  }
  bypassed = n <= k;
  if (bypassed) {  // every allowed key is selected, in ascending order; no ranking needed
    index_t c = 0;
    for (index_t j = 0; j < s; ++j) {
      if (row[j] != kNotAllowed) out[c++] = static_cast<std::int32_t>(j);
    }
    return n;
  }
  std::nth_element(scratch.keys.begin(), scratch.keys.begin() + (k - 1), scratch.keys.begin() + n, std::greater<>());
  const std::int32_t thr = scratch.keys[static_cast<std::size_t>(k - 1)];
  const auto key = [row](index_t j) { return score_order_key(row[j]); };
  index_t above = 0;
  for (index_t j = 0; j < s; ++j) above += row[j] != kNotAllowed && key(j) > thr;
  index_t ties = k - above, c = 0;
  for (index_t j = 0; j < s && c < k; ++j) {
    if (row[j] == kNotAllowed) continue;
    const std::int32_t kj = key(j);
    if (kj > thr || (kj == thr && ties-- > 0)) out[c++] = static_cast<std::int32_t>(j);
  }
  if (order_by == TopKOrder::by_score) {
    // One 64-bit key per entry, (~order(score) << 32) | index: an integer sort
    // ranks by descending score, then ascending index.
    scratch.keyed.resize(static_cast<std::size_t>(k));
    for (index_t r = 0; r < k; ++r) {
      const auto ordered = std::bit_cast<std::uint32_t>(key(out[r])) ^ 0x80000000u;  // int32 order as uint32
      scratch.keyed[static_cast<std::size_t>(r)] = (std::uint64_t{~ordered} << 32) | static_cast<std::uint32_t>(out[r]);
    }
    std::sort(scratch.keyed.begin(), scratch.keyed.end());
    for (index_t r = 0; r < k; ++r) {
      out[r] = static_cast<std::int32_t>(scratch.keyed[static_cast<std::size_t>(r)] & 0xffffffffu);
    }
  }
  return k;
}

inline TopK empty_topk(index_t t, index_t s, index_t k) {
  return TopK{k, s, Tensor<std::int32_t>(seqattn::detail::make_extents({t, k}), -1),
              std::vector<index_t>(static_cast<std::size_t>(t), 0), 0};
}

}  // namespace detail

// Exact top-k of every row of scores [t, s] among the entries that are not
// -inf (the base mask's allowed keys). The k-th largest score is found with
// nth_element, then the row is taken with PR #4437's exact-k rule: every key
// above it, then the lowest-index keys equal to it, which is exactly
// jax.lax.top_k's set on score + 0.0, MaxText's (TV-B1..B3; score_order_key).
inline TopK select_topk(TensorView<const float> scores, index_t k, TopKOrder order_by = TopKOrder::by_score) {
  seqattn::detail::require(scores.rank() == 2, "dsa::select_topk: scores must have shape [t, s], got ", scores.shape());
  seqattn::detail::require(k > 0, "dsa::select_topk: k must be positive, got ", k);
  const index_t t = scores.extent(0), s = scores.extent(1);
  TopK r = detail::empty_topk(t, s, k);
  detail::TopKScratch scratch;
  std::vector<float> copy(static_cast<std::size_t>(scores.is_contiguous() ? 0 : s));
  for (index_t i = 0; i < t; ++i) {
    const float* row = scores.data() + i * s;
    if (!scores.is_contiguous()) {
      for (index_t j = 0; j < s; ++j) copy[static_cast<std::size_t>(j)] = scores(i, j);
      row = copy.data();
    }
    bool bypassed = false;
    r.counts[static_cast<std::size_t>(i)] =
        detail::select_row(row, s, k, order_by, r.indices.data() + i * k, bypassed, scratch);
    r.bypassed_rows += bypassed;
  }
  return r;
}

// index_scores + select_topk fused: each row pair is scored into an O(s)
// buffer and reduced at once, so the [t, s] score matrix is never allocated
// (at 4K tokens it was 64 MB of page faults per call, as costly as the scoring).
template <MaskDescription Base = CausalMask>
TopK indexer_topk(TensorView<const float> q, TensorView<const float> k, TensorView<const float> w, index_t top_k,
                  TopKOrder order_by = TopKOrder::by_index, const Base& base = CausalMask{Alignment::bottom_right}) {
  seqattn::detail::require(top_k > 0, "dsa::indexer_topk: k must be positive, got ", top_k);
  const index_t t = q.rank() == 3 ? q.extent(0) : 0, s = k.rank() == 2 ? k.extent(0) : 0;
  TopK r = detail::empty_topk(t, s, top_k);
  detail::TopKScratch scratch;
  detail::for_each_index_score_row(q, k, w, base, [&](index_t i, const float* row) {
    bool bypassed = false;
    r.counts[static_cast<std::size_t>(i)] =
        detail::select_row(row, s, top_k, order_by, r.indices.data() + i * top_k, bypassed, scratch);
    r.bypassed_rows += bypassed;
  });
  return r;
}

// 0/1 mask [t, s]: fill with 0, then scatter 1 at each selected index.
inline Tensor<std::uint8_t> mask_by_scatter(TensorView<const std::int32_t> indices, index_t kv_len) {
  validate_indices(indices, kv_len);
  const index_t t = indices.extent(0), k = indices.extent(1);
  Tensor<std::uint8_t> mask = detail::zeros_u8(t, kv_len);
  for (index_t i = 0; i < t; ++i) {
    std::uint8_t* row = mask.data() + i * kv_len;
    for (index_t r = 0; r < k; ++r) {
      const std::int32_t j = indices(i, r);
      if (j >= 0) row[j] = 1;
    }
  }
  return mask;
}

// 0/1 mask [t, s] the way MaxText built it before PR #4437: key j is selected
// iff any of the row's k indices equals j.
inline Tensor<std::uint8_t> mask_by_broadcast_compare(TensorView<const std::int32_t> indices, index_t kv_len) {
  validate_indices(indices, kv_len);
  const index_t t = indices.extent(0), k = indices.extent(1);
  Tensor<std::uint8_t> mask = detail::zeros_u8(t, kv_len);
  const bool contiguous = indices.is_contiguous();
  for (index_t i = 0; i < t; ++i) {
    std::uint8_t* row = mask.data() + i * kv_len;
    const std::int32_t* idx = contiguous ? indices.data() + i * k : nullptr;
    for (index_t j = 0; j < kv_len; ++j) {
      std::uint8_t any = 0;
      for (index_t r = 0; r < k; ++r) any |= static_cast<std::uint8_t>((contiguous ? idx[r] : indices(i, r)) == j);
      row[j] = any;
    }
  }
  return mask;
}

// PR #4437's exact-k threshold rule for one row: keep the first k entries
// strictly above thr (by index), then the first k - #kept entries equal to thr.
inline std::vector<std::uint8_t> threshold_select_exact_k(std::span<const float> row, float thr, index_t k) {
  std::vector<std::uint8_t> sel(row.size(), 0);
  index_t kept = 0;
  for (std::size_t j = 0; j < row.size() && kept < k; ++j) {
    if (row[j] > thr) {
      sel[j] = 1;
      ++kept;
    }
  }
  for (std::size_t j = 0; j < row.size() && kept < k; ++j) {
    if (row[j] == thr) {
      sel[j] = 1;
      ++kept;
    }
  }
  return sel;
}

// The raw threshold rule (indexer_mask_exact_topk: false): every entry >= thr;
// may select more than k under ties.
inline std::vector<std::uint8_t> threshold_select_raw(std::span<const float> row, float thr) {
  std::vector<std::uint8_t> sel(row.size(), 0);
  for (std::size_t j = 0; j < row.size(); ++j) sel[j] = row[j] >= thr ? 1 : 0;
  return sel;
}

// The selection as the library's top-k mask description (shared by all
// heads). Every selected key is allowed by the base mask already, so no AND
// is needed; indices from elsewhere can be combined as `topk_mask(l) & base`.
inline TopKLayout topk_layout(const TopK& t) {
  return TopKLayout::from_indices(t.indices.view().reshape(seqattn::detail::make_extents({1, t.rows(), t.k})),
                                  t.kv_len);
}

// Running a token-level selection on a block engine. Scattered keys leave few
// 64x64 tiles empty, so masking the full K/V would touch nearly every causal
// tile. Instead the rows are taken in blocks of block_q queries, the union of
// the keys a block selected is copied (ascending) into its own K/V segment,
// and each row attends, inside that segment, to exactly its own keys. The
// work is then proportional to the union sizes: close to k + block_q per
// block when neighbouring queries agree (recent keys, attention sinks), and
// no better than dense when they do not.
struct GatheredSelection {
  Tensor<float> k, v;                                                // [sum of union sizes, Hkv, D]
  std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;  // one segment per block of rows
  std::vector<index_t> row_begin;                                    // [t + 1]: row i's entries of cols
  std::vector<std::int32_t> cols;  // row i's keys as positions inside its block's segment, ascending

  SegmentTable table() const { return {q_offsets, q_lens, kv_offsets, kv_lens}; }
  index_t gathered_keys() const { return k.extent(0); }
};

// The per-row selection inside the gathered segments, as a mask description.
struct GatheredSelectionMask {
  static constexpr bool head_invariant = true;
  const GatheredSelection* g = nullptr;

  std::span<const std::int32_t> row(const MaskContext& ctx, index_t q) const {
    const auto r = static_cast<std::size_t>(g->q_offsets[static_cast<std::size_t>(ctx.batch)] + q);
    return std::span(g->cols).subspan(static_cast<std::size_t>(g->row_begin[r]),
                                      static_cast<std::size_t>(g->row_begin[r + 1] - g->row_begin[r]));
  }
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const auto r = row(ctx, q);
    return std::binary_search(r.begin(), r.end(), static_cast<std::int32_t>(kv));
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    bool any = false, all = true;
    for (index_t q = t.q_begin; q < t.q_end; ++q) {
      const auto r = row(ctx, q);
      const auto lo = std::lower_bound(r.begin(), r.end(), static_cast<std::int32_t>(t.kv_begin));
      const index_t n = std::lower_bound(lo, r.end(), static_cast<std::int32_t>(t.kv_end)) - lo;
      any = any || n > 0;
      all = all && n == t.cols();
    }
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end, std::uint64_t* words) const {
    const auto r = row(ctx, q);
    for (auto it = std::lower_bound(r.begin(), r.end(), static_cast<std::int32_t>(kv_begin));
         it != r.end() && *it < kv_end; ++it) {
      const index_t c = *it - kv_begin;
      words[c / 64] |= std::uint64_t{1} << (c % 64);
    }
  }
};

inline GatheredSelection gather_selection(const TopK& sel, TensorView<const float> k, TensorView<const float> v,
                                          index_t block_q = 64) {
  scenarios::detail::require_qkv(k, k, v, "dsa::gather_selection");
  seqattn::detail::require(k.extent(0) == sel.kv_len && k.is_contiguous() && v.is_contiguous(),
                           "dsa::gather_selection: k ", k.shape(), " and v ", v.shape(),
                           " must be contiguous with the selection's kv_len ", sel.kv_len);
  seqattn::detail::require(block_q > 0, "dsa::gather_selection: block_q must be positive, got ", block_q);
  validate_indices(sel.indices.view(), sel.kv_len);
  const index_t t = sel.rows(), hkv = k.extent(1), d = k.extent(2), dv = v.extent(2);
  GatheredSelection g;
  g.row_begin.assign(1, 0);
  // A block's union comes from a per-key slot table (no sort of k * block_q
  // entries); slot[j] is key j's position in the block's segment, or -1.
  std::vector<std::vector<std::int32_t>> unions;
  std::vector<std::int32_t> slot(static_cast<std::size_t>(sel.kv_len), -1);
  index_t total = 0;
  for (index_t b0 = 0; b0 < t; b0 += block_q) {
    const index_t b1 = std::min(t, b0 + block_q);
    index_t hi = 0;
    for (index_t i = b0; i < b1; ++i) {
      const std::int32_t* idx = sel.indices.data() + i * sel.k;
      for (index_t r = 0; r < sel.counts[static_cast<std::size_t>(i)]; ++r) {
        slot[static_cast<std::size_t>(idx[r])] = 0;
        hi = std::max<index_t>(hi, idx[r] + 1);
      }
    }
    std::vector<std::int32_t> u;
    for (index_t j = 0; j < hi; ++j) {
      if (slot[static_cast<std::size_t>(j)] < 0) continue;
      slot[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(u.size());
      u.push_back(static_cast<std::int32_t>(j));
    }
    for (index_t i = b0; i < b1; ++i) {
      const auto first = g.cols.size();
      const std::int32_t* idx = sel.indices.data() + i * sel.k;
      for (index_t r = 0; r < sel.counts[static_cast<std::size_t>(i)]; ++r) {
        g.cols.push_back(slot[static_cast<std::size_t>(idx[r])]);
      }
      std::sort(g.cols.begin() + static_cast<std::ptrdiff_t>(first), g.cols.end());
      g.row_begin.push_back(static_cast<index_t>(g.cols.size()));
    }
    for (std::int32_t j : u) slot[static_cast<std::size_t>(j)] = -1;
    g.q_offsets.push_back(static_cast<std::int32_t>(b0));
    g.q_lens.push_back(static_cast<std::int32_t>(b1 - b0));
    g.kv_offsets.push_back(static_cast<std::int32_t>(total));
    g.kv_lens.push_back(static_cast<std::int32_t>(u.size()));
    total += static_cast<index_t>(u.size());
    unions.push_back(std::move(u));
  }
  g.k = Tensor<float>(seqattn::detail::make_extents({total, hkv, d}));
  g.v = Tensor<float>(seqattn::detail::make_extents({total, hkv, dv}));
  index_t row = 0;
  for (const auto& un : unions) {
    for (std::int32_t j : un) {
      std::copy_n(k.data() + j * hkv * d, hkv * d, g.k.data() + row * hkv * d);
      std::copy_n(v.data() + j * hkv * dv, hkv * dv, g.v.data() + row * hkv * dv);
      ++row;
    }
  }
  return g;
}

// Which execution a selection should get. Per block of 64 queries, the
// full-K/V path visits every 64-key tile holding any selected key; the
// gathered path visits ceil(|union| / 64) tiles but first copies the union.
// Clustered selections (recent keys, a few sinks) touch few tiles in place;
// scattered ones fill most tiles with a handful of keys each, and gathering
// packs them densely.
enum class Path : std::uint8_t { full, gathered };

struct PathEstimate {
  index_t full_tiles = 0;      // key tiles the full-K/V path visits
  index_t gathered_tiles = 0;  // key tiles of the gathered segments
  Path choice = Path::full;
};

inline PathEstimate estimate_path(const TopK& sel, index_t block = 64) {
  PathEstimate e;
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(sel.kv_len), 0);
  std::vector<std::uint8_t> tile_seen(static_cast<std::size_t>((sel.kv_len + block - 1) / block), 0);
  for (index_t b0 = 0; b0 < sel.rows(); b0 += block) {
    index_t keys = 0, tiles = 0;
    for (index_t i = b0; i < std::min(sel.rows(), b0 + block); ++i) {
      const std::int32_t* idx = sel.indices.data() + i * sel.k;
      for (index_t r = 0; r < sel.counts[static_cast<std::size_t>(i)]; ++r) {
        auto& s = seen[static_cast<std::size_t>(idx[r])];
        keys += s == 0;
        s = 1;
        auto& ts = tile_seen[static_cast<std::size_t>(idx[r] / block)];
        tiles += ts == 0;
        ts = 1;
      }
    }
    std::fill(seen.begin(), seen.end(), 0);
    std::fill(tile_seen.begin(), tile_seen.end(), 0);
    e.full_tiles += tiles;
    e.gathered_tiles += (keys + block - 1) / block;
  }
  // Gathering pays a copy of every union key and a second mask build: worth it
  // only when it saves at least a third of the tiles (measured with bench/scenarios).
  e.choice = 3 * e.gathered_tiles < 2 * e.full_tiles ? Path::gathered : Path::full;
  return e;
}

struct Result {
  AttentionOutput attention;
  TopK topk;                   // empty (k == 0) when the whole key axis was bypassed
  PathEstimate path;           // how the selection was executed
  GatheredSelection gathered;  // the K/V segments attention read, on the gathered path
  bool bypassed = false;
};

// DSA end to end for one sequence: main-attention q [t, H, D], k and v
// [s, Hkv, D]; indexer q [t, h, d], k [s, d], w [t, h]; causal (bottom-right).
// The selection runs either as the library's TopKMask over the full K/V or
// gathered per 64-query block (gather_selection), whichever visits fewer
// tiles (estimate_path; `path` forces one). Both give the same result.
template <class Exec = execution::Serial>
Result sparse_attention(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v, float scale,
                        TensorView<const float> index_q, TensorView<const float> index_k,
                        TensorView<const float> index_w, index_t top_k, Exec&& exec = Exec{},
                        std::optional<Path> path = std::nullopt) {
  scenarios::detail::require_qkv(q, k, v, "dsa::sparse_attention");
  seqattn::detail::require(index_q.rank() == 3 && index_q.extent(0) == q.extent(0) && index_k.rank() == 2 &&
                               index_k.extent(0) == k.extent(0),
                           "dsa::sparse_attention: indexer q ", index_q.shape(), " and k ", index_k.shape(),
                           " must cover the same tokens as q ", q.shape(), " and k ", k.shape());
  const CausalMask causal{Alignment::bottom_right};
  Result r;
  if (k.extent(0) <= top_k) {  // B.3 step 1: no selection, the mask is A
    r.bypassed = true;
    r.attention = attend(q, k, v, scale, causal, exec);
    return r;
  }
  r.topk = indexer_topk(index_q, index_k, index_w, top_k, TopKOrder::by_index, causal);
  r.path = estimate_path(r.topk);
  if (path) r.path.choice = *path;
  if (r.path.choice == Path::gathered) {
    r.gathered = gather_selection(r.topk, k, v);
    r.attention = attend_thd(q, r.gathered.k.view(), r.gathered.v.view(), r.gathered.table(), scale,
                             GatheredSelectionMask{&r.gathered}, exec);
  } else {
    const TopKLayout layout = topk_layout(r.topk);
    r.attention = attend(q, k, v, scale, topk_mask(layout), exec);
  }
  return r;
}

}  // namespace seqattn::scenarios::dsa
