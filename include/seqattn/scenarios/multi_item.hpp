// Multi-item scoring (docs/semantics/multi-item-topk-kascade.md, part A; bare section ids below refer to it): score
// many candidate items against one query in a single packed forward pass.
//
//   tokens     query ‖ d ‖ item_1 ‖ d ‖ item_2 ‖ … ‖ d ‖ item_n ‖ d      (n+1 delimiters d)
//   positions  0..L-1 for the query; every later token sits at L + (distance to the last delimiter at or before it),
//              so each delimiter is at L and every item starts again at L+1 (A.2)
//   mask       query+d_1 rows are causal; an item row sees the prefix (query + d_1) and, causally, its own segment
//              (the item's tokens plus the delimiter after it) — never another item (A.3)
//   readout    item j is scored by the next-token distribution at its last token
//
// With the position reset each item's context is exactly the serial request `query ‖ d ‖ item`, and that is the
// oracle the tests hold us to. Two deliberate departures from sglang-jax PR #912:
//   - an EMPTY item is scored at the first delimiter (the state of `query ‖ d`), not at the delimiter that closes
//     the previous item — upstream's choice lets an empty item's score depend on its neighbour (A.11, A.13.2);
//   - the dense mask is built from the canonical predicate (v1), not the v2 JIT block numbering that lets every
//     item see item 1 (A.13.1, TV-A1 negative vector).
//
// Mask representations (A.4), both run by the attention engine: `segment` is the library's MultiItemMask over
// O(T) metadata (prefix_end per request, request-local seg_start per row); `dense` materializes the T x T 0/1
// matrix (to_dense) and reads it through DenseMask. `automatic` picks segment while the padded token count is at
// most the threshold (default 32768) and dense above it. Attention itself never sees a token position: the
// reset positions only enter through RoPE in the model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/dense.hpp"
#include "seqattn/masks/multi_item.hpp"
#include "seqattn/masks/representations.hpp"
#include "seqattn/scenarios/attend.hpp"
#include "seqattn/scenarios/reference.hpp"
#include "seqattn/scenarios/tiny_model.hpp"

namespace seqattn::scenarios::multi_item {

using token_t = std::int32_t;

enum class MaskMode : std::uint8_t { dense, segment, automatic };

inline const char* to_string(MaskMode m) {
  switch (m) {
    case MaskMode::dense:
      return "dense";
    case MaskMode::segment:
      return "segment";
    case MaskMode::automatic:
      return "auto";
  }
  return "?";
}

struct Options {
  token_t delimiter = 0;
  MaskMode mode = MaskMode::automatic;
  index_t segment_threshold = 32768;  // automatic: segment while padded tokens <= this
  index_t max_seq_len = 32768;        // a packed chunk longer than this is an error
  index_t max_items = 512;
  index_t chunk_size = 32;    // items per packed request; 0 packs all items into one
  index_t padded_tokens = 0;  // the token-padding bucket the mode decision sees; 0: the packed length
  bool apply_softmax = true;  // softmax over the labels, else exp(logprob)
};

// A.4: the representation a chunk of `padded_tokens` tokens gets.
inline MaskMode select_mask_mode(MaskMode requested, index_t padded_tokens, index_t segment_threshold,
                                 index_t max_seq_len) {
  seqattn::detail::require(padded_tokens <= max_seq_len, "multi_item: padded token count ", padded_tokens,
                           " exceeds max_seq_len ", max_seq_len);
  if (requested == MaskMode::automatic) {
    return padded_tokens <= segment_threshold ? MaskMode::segment : MaskMode::dense;
  }
  return requested;
}

// |query| + sum |item| + n + 1.
inline index_t packed_length(index_t query_len, std::span<const index_t> item_lengths) {
  index_t n = query_len + static_cast<index_t>(item_lengths.size()) + 1;
  for (index_t l : item_lengths) n += l;
  return n;
}

// Item ranges [begin, end) of each chunk of `chunk_size` items (0: one chunk).
inline std::vector<std::pair<index_t, index_t>> chunk_items(index_t num_items, index_t chunk_size) {
  seqattn::detail::require(num_items >= 0 && chunk_size >= 0, "chunk_items: num_items (", num_items,
                           ") and chunk_size (", chunk_size, ") must be non-negative");
  std::vector<std::pair<index_t, index_t>> chunks;
  const index_t step = chunk_size == 0 ? std::max<index_t>(num_items, 1) : chunk_size;
  for (index_t b = 0; b < num_items; b += step) chunks.emplace_back(b, std::min(num_items, b + step));
  return chunks;
}

// The A.3 predicate in request-local coordinates: the scenarios' own oracle,
// kept independent of the library's MultiItemMask that attention uses. A
// request that is not multi-item has prefix_end = 0 and seg_start = 0: causal.
inline bool multi_item_allowed(index_t prefix_end, index_t seg_start, index_t q, index_t k) {
  if (k > q) return false;
  if (q < prefix_end) return true;
  return k < prefix_end || k >= seg_start;
}

// RoPE positions with the delimiter reset (A.2): positions of the query are
// 0..L-1 (L = index of the first delimiter); token i >= L sits at L + (i - s(i)),
// s(i) the last delimiter at or before i.
inline std::vector<std::int32_t> reset_positions(std::span<const token_t> tokens, token_t delimiter) {
  std::vector<std::int32_t> pos(tokens.size());
  index_t first = -1, last = -1;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == delimiter) {
      if (first < 0) first = static_cast<index_t>(i);
      last = static_cast<index_t>(i);
    }
    pos[i] = static_cast<std::int32_t>(first < 0 ? static_cast<index_t>(i) : first + static_cast<index_t>(i) - last);
  }
  seqattn::detail::require(first >= 0, "reset_positions: tokens (", tokens.size(), " tokens) contain no delimiter ",
                           delimiter);
  return pos;
}

// Request-local segment starts (A.5, v1 builder): rows up to and including the
// first delimiter get 0; rows in (d_i, d_{i+1}] get d_i + 1. Requires a
// non-empty query, at least two delimiters and a delimiter at the end.
inline std::vector<std::int32_t> segment_starts(std::span<const token_t> tokens, token_t delimiter) {
  std::vector<index_t> delims;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == delimiter) delims.push_back(static_cast<index_t>(i));
  }
  seqattn::detail::require(delims.size() >= 2, "segment_starts: tokens (", tokens.size(), " tokens) hold ",
                           delims.size(), " delimiters; a multi-item request needs at least 2");
  seqattn::detail::require(delims.front() > 0, "segment_starts: the query before the first delimiter is empty");
  seqattn::detail::require(delims.back() + 1 == static_cast<index_t>(tokens.size()), "segment_starts: tokens (",
                           tokens.size(), " tokens) do not end with the delimiter (last one at ", delims.back(), ")");
  std::vector<std::int32_t> seg(tokens.size(), 0);
  for (std::size_t p = 0; p + 1 < delims.size(); ++p) {
    for (index_t r = delims[p] + 1; r <= delims[p + 1]; ++r)
      seg[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(delims[p] + 1);
  }
  return seg;
}

// One packed request: `query ‖ d ‖ item_1 ‖ d ‖ … ‖ item_n ‖ d`.
struct PackedRequest {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> positions;       // A.2
  std::vector<std::int32_t> row_seg_starts;  // A.5, request-local; 0 for rows < prefix_end
  std::vector<index_t> delimiters;           // n + 1 token indices
  index_t query_len = 0;

  index_t size() const { return static_cast<index_t>(tokens.size()); }
  index_t num_items() const { return static_cast<index_t>(delimiters.size()) - 1; }
  index_t prefix_end() const { return query_len + 1; }
  index_t item_length(index_t j) const {
    return delimiters[static_cast<std::size_t>(j + 1)] - delimiters[static_cast<std::size_t>(j)] - 1;
  }

  // The row whose next-token distribution scores item j (0-based): its last
  // token, or the first delimiter (the state of `query ‖ d`) if it is empty.
  index_t score_row(index_t j) const {
    check_item(j);
    return item_length(j) == 0 ? query_len : delimiters[static_cast<std::size_t>(j + 1)] - 1;
  }
  // sglang-jax's rule (A.8): the row before the delimiter that closes item j.
  // For an empty item j >= 1 that row belongs to item j-1's segment.
  index_t upstream_score_row(index_t j) const {
    check_item(j);
    return delimiters[static_cast<std::size_t>(j + 1)] - 1;
  }

  bool allowed(index_t q, index_t k) const {
    return multi_item_allowed(prefix_end(), row_seg_starts[static_cast<std::size_t>(q)], q, k);
  }

 private:
  void check_item(index_t j) const {
    seqattn::detail::require(j >= 0 && j < num_items(), "PackedRequest: item ", j, " outside [0, ", num_items(), ")");
  }
};

// Packs and validates one request (A.1): the query must be non-empty, the
// delimiter must occur in neither the query nor any item, at most max_items
// items and at most max_seq_len tokens. Empty items are allowed.
inline PackedRequest pack(std::span<const token_t> query, std::span<const std::vector<token_t>> items,
                          const Options& options) {
  const token_t d = options.delimiter;
  seqattn::detail::require(!query.empty(), "multi_item::pack: query is empty (shape (0,))");
  seqattn::detail::require(!items.empty(), "multi_item::pack: items is empty; a packed request scores at least one");
  seqattn::detail::require(static_cast<index_t>(items.size()) <= options.max_items, "multi_item::pack: ", items.size(),
                           " items exceed max_items ", options.max_items);
  for (std::size_t i = 0; i < query.size(); ++i) {
    seqattn::detail::require(query[i] != d, "multi_item::pack: query[", i, "] is the delimiter ", d,
                             " (delimiter_collision)");
  }
  PackedRequest r;
  r.query_len = static_cast<index_t>(query.size());
  r.tokens.assign(query.begin(), query.end());
  r.delimiters.push_back(r.size());
  r.tokens.push_back(d);
  for (std::size_t j = 0; j < items.size(); ++j) {
    for (std::size_t i = 0; i < items[j].size(); ++i) {
      seqattn::detail::require(items[j][i] != d, "multi_item::pack: items[", j, "][", i, "] is the delimiter ", d,
                               " (delimiter_collision)");
    }
    r.tokens.insert(r.tokens.end(), items[j].begin(), items[j].end());
    r.delimiters.push_back(r.size());
    r.tokens.push_back(d);
  }
  seqattn::detail::require(r.size() <= options.max_seq_len, "multi_item::pack: packed length ", r.size(),
                           " exceeds max_seq_len ", options.max_seq_len);
  r.positions = reset_positions(r.tokens, d);
  r.row_seg_starts = segment_starts(r.tokens, d);
  return r;
}

// ---------------------------------------------------------------------------
// Score readout (A.8, TV-A5). `label_logprobs[j]` is -inf for a label the
// model did not return.
inline std::vector<float> label_scores(std::span<const float> label_logprobs, bool apply_softmax) {
  std::vector<float> s(label_logprobs.size());
  if (!apply_softmax) {
    for (std::size_t j = 0; j < s.size(); ++j)
      s[j] = static_cast<float>(std::exp(static_cast<double>(label_logprobs[j])));
    return s;
  }
  double m = -std::numeric_limits<double>::infinity();
  for (float v : label_logprobs) m = std::max(m, static_cast<double>(v));
  if (m == -std::numeric_limits<double>::infinity()) return s;  // no label present: all 0
  double sum = 0.0;
  for (float v : label_logprobs) sum += std::exp(static_cast<double>(v) - m);
  for (std::size_t j = 0; j < s.size(); ++j) {
    s[j] = static_cast<float>(std::exp(static_cast<double>(label_logprobs[j]) - m) / sum);
  }
  return s;
}

// ---------------------------------------------------------------------------
// End to end with the tiny model.

struct ScoreResult {
  std::vector<std::vector<float>> scores;  // [item][label]
  std::vector<MaskMode> chunk_modes;       // the representation each chunk used
};

namespace detail {
inline void check_labels(std::span<const token_t> labels, const TinyModel& model) {
  for (std::size_t j = 0; j < labels.size(); ++j) {
    seqattn::detail::require(labels[j] >= 0 && labels[j] < model.config().vocab, "multi_item: labels[", j,
                             "] = ", labels[j], " outside the vocabulary [0, ", model.config().vocab, ")");
  }
}
inline std::vector<float> scores_from_row(const Tensor<float>& logp, index_t row, std::span<const token_t> labels,
                                          bool apply_softmax) {
  std::vector<float> v(labels.size());
  for (std::size_t j = 0; j < labels.size(); ++j) v[j] = logp(row, static_cast<index_t>(labels[j]));
  return label_scores(v, apply_softmax);
}
}  // namespace detail

// The library's description of one packed request (MultiItemLayout owns the
// O(T) segment metadata the mask reads).
inline MultiItemLayout layout_of(const PackedRequest& r) {
  MultiItemLayout layout;
  layout.add_packed(r.tokens, r.tokens[static_cast<std::size_t>(r.query_len)]);
  return layout;
}

// Attention of one packed request through the engine. segment: the
// MultiItemMask over O(T) metadata (tile classes from the item runs); dense:
// the T x T 0/1 matrix materialized first (to_dense) and read back through
// DenseMask, whose tile classes need a scan of every element.
template <class Exec = execution::Serial>
AttentionOutput attend_packed(const Projections& p, float scale, const PackedRequest& r, MaskMode mode,
                              Exec&& exec = Exec{}) {
  const MultiItemLayout layout = layout_of(r);
  const MultiItemMask mask = multi_item_mask(layout);
  if (mode == MaskMode::dense) {
    const Tensor<std::uint8_t> dense = to_dense(mask, layout.lengths());
    const DenseMask<std::uint8_t> dm{dense.view()};
    return attend(p.q.view(), p.k.view(), p.v.view(), scale, dm, std::forward<Exec>(exec));
  }
  return attend(p.q.view(), p.k.view(), p.v.view(), scale, mask, std::forward<Exec>(exec));
}

// Scores every item against the query: chunks, packs, picks the mask
// representation per chunk, runs the model and reads each item's row.
template <class Exec = execution::Serial>
ScoreResult score_items(const TinyModel& model, std::span<const token_t> query,
                        std::span<const std::vector<token_t>> items, std::span<const token_t> labels,
                        const Options& options, Exec&& exec = Exec{}) {
  detail::check_labels(labels, model);
  seqattn::detail::require(options.delimiter >= 0 && options.delimiter < model.config().vocab, "multi_item: delimiter ",
                           options.delimiter, " outside the vocabulary [0, ", model.config().vocab, ")");
  ScoreResult result;
  for (auto [begin, end] : chunk_items(static_cast<index_t>(items.size()), options.chunk_size)) {
    const PackedRequest r =
        pack(query, items.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin)), options);
    const index_t padded = options.padded_tokens > 0 ? std::max(options.padded_tokens, r.size()) : r.size();
    const MaskMode mode = select_mask_mode(options.mode, padded, options.segment_threshold, options.max_seq_len);
    result.chunk_modes.push_back(mode);
    const Projections p = model.project(r.tokens, r.positions);
    const AttentionOutput a = attend_packed(p, model.softmax_scale(), r, mode, exec);
    std::vector<index_t> rows;
    for (index_t j = 0; j < r.num_items(); ++j) rows.push_back(r.score_row(j));
    const Tensor<float> logp = model.logprobs(r.tokens, a.out, rows);
    for (index_t j = 0; j < r.num_items(); ++j) {
      result.scores.push_back(detail::scores_from_row(logp, j, labels, options.apply_softmax));
    }
  }
  return result;
}

// The serial request `query ‖ d ‖ item`, plain causal attention and positions
// 0..len-1, scored at its last token: what each packed item must reproduce.
inline std::vector<float> score_serial(const TinyModel& model, std::span<const token_t> query,
                                       std::span<const token_t> item, std::span<const token_t> labels,
                                       const Options& options) {
  detail::check_labels(labels, model);
  std::vector<token_t> tokens(query.begin(), query.end());
  tokens.push_back(options.delimiter);
  tokens.insert(tokens.end(), item.begin(), item.end());
  std::vector<std::int32_t> pos(tokens.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(i);
  const Projections p = model.project(tokens, pos);
  const auto causal = [](index_t, index_t q, index_t k) { return k <= q; };
  const AttentionOutput a = reference_attention(p.q.view(), p.k.view(), p.v.view(), model.softmax_scale(), causal);
  const index_t last = static_cast<index_t>(tokens.size()) - 1;
  const Tensor<float> logp = model.logprobs(tokens, a.out, std::span(&last, 1));
  return detail::scores_from_row(logp, 0, labels, options.apply_softmax);
}

}  // namespace seqattn::scenarios::multi_item
