// Per-row kernels that turn segment ids and positions into seqlens and
// offsets. Linear in the tokens of a row: one pass gathers each segment's run
// and min/max position, a second pass runs only over segments that the mask
// trims partially (never in self-attention).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "seqattn/core/error.hpp"
#include "seqattn/core/segment_runs.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/descriptors/detail/rows.hpp"
#include "seqattn/descriptors/types.hpp"

namespace seqattn::detail {

// The runs of one side of one row. The descriptor rules on top of the shared
// parser (core/segment_runs.hpp): ids number the runs 1, 2, 3, ... in order
// of appearance (or, with SegmentIdGaps::renumber, increase along the row)
// and stay <= max_segments_per_seq; segment id s owns output slot s-1.
struct SegmentRuns {
  SegmentRunParser parser;
  std::span<const ParsedRun> runs;  // in token order, ids increasing
  int count = 0;

  // A row has at most min(max_segments, tokens) runs: room for them all
  // up front keeps the parse free of reallocation.
  void reserve(int max_segments, index_t len) { parser.reserve(std::min<index_t>(max_segments, len)); }
};

// "q_segment_ids of shape (1, 4), row 0" for the errors of one row.
struct RowWhere {
  const RowSource* src;
  index_t row;
  std::string operator()() const { return src->where(row); }
};

// TE's preconditions (docs/semantics/sequence-descriptors.md §7.2), on top
// of the shared rules R1-R5.
struct DescriptorRunRules : StandardRunRules<RowWhere> {
  int max_segments = 1;
  SegmentIdGaps gaps = SegmentIdGaps::reject;
  std::int32_t previous = 0;  // id of the row's previous run (0 at the row start)

  // Called per run: the check stays inline, the wording out of line.
  void on_run_start(std::int32_t v, index_t t, std::int32_t, index_t before) {
    const bool numbered = gaps == SegmentIdGaps::reject ? v == static_cast<std::int32_t>(before) + 1 : v > previous;
    if (numbered && v <= max_segments) [[likely]] {
      previous = v;
      return;
    }
    bad_run_start(v, t, before);
  }
  [[noreturn, gnu::cold, gnu::noinline]] void bad_run_start(std::int32_t v, index_t t, index_t before) const {
    const auto count = static_cast<std::int32_t>(before);
    const std::string at = concat(where(), ", token ", t, ": ");
    if (gaps == SegmentIdGaps::reject && v != count + 1) {
      throw_invalid(at, "segment id ", v, " follows ", count == 0 ? "the row start" : "segment ",
                    count == 0 ? std::string() : std::to_string(count), "; expected id ", count + 1,
                    ": ids must number the segments of a row 1, 2, 3, ... in order of appearance",
                    v > count + 1 && v <= max_segments
                        ? " (ids with gaps, as TE accepts them: pass SegmentIdGaps::renumber)"
                        : "");
    }
    if (gaps == SegmentIdGaps::renumber && v <= previous) {
      throw_invalid(at, "segment id ", v, " follows segment id ", previous,
                    ": with SegmentIdGaps::renumber ids may skip numbers but must increase along the row "
                    "(TE pairs decreasing ids with the wrong offsets)");
    }
    throw_invalid(at, "segment id ", v, " exceeds max_segments_per_seq=", max_segments,
                  " (TE would silently drop its tokens)");
  }
};

// Pass 1: validates the ids of a row and records each segment's run and, if
// WithPositions, its position range (self-attention needs no positions).
template <bool WithPositions, bool Unit>
void scan_runs(RowPtr<Unit> ids, RowPtr<Unit> pos, index_t len, SegmentRuns& runs, const RowSource& ids_src,
               index_t src_row, int max_segments, SegmentIdGaps gaps) {
  DescriptorRunRules rules{{RowWhere{&ids_src, src_row}}, max_segments, gaps};
  runs.reserve(max_segments, len);  // allocates on the first row only
  constexpr RunPositions kPositions = WithPositions ? RunPositions::range : RunPositions::none;
  runs.runs = runs.parser.parse<kPositions>(ids, pos, len, rules);
  runs.count = static_cast<int>(runs.runs.size());
}

// The active tokens of a run: those whose position lies in [lo, hi]. Returns
// (first, count); first = -1 when none.
struct ActiveRange {
  index_t first = -1;
  index_t count = 0;
};

template <bool Unit>
ActiveRange active_range(RowPtr<Unit> pos, const ParsedRun& run, std::int64_t lo, std::int64_t hi,
                         const RowSource& pos_src, index_t src_row, AttnMaskType mask) {
  const index_t b = run.begin, e = run.end;
  if (lo <= run.min_pos && run.max_pos <= hi) return {b, e - b};  // whole run attends
  if (lo > run.max_pos || hi < run.min_pos) return {};            // nothing attends
  // Trimming is usually a prefix or suffix: find the first and last active
  // token by short scans, then count (vectorizable) in between.
  // Past the early returns lo <= max_pos and hi >= min_pos, so both fit int32.
  const auto lo32 = static_cast<std::int32_t>(std::max<std::int64_t>(lo, std::numeric_limits<std::int32_t>::min()));
  const auto hi32 = static_cast<std::int32_t>(std::min<std::int64_t>(hi, std::numeric_limits<std::int32_t>::max()));
  const auto active = [&](index_t t) { return pos[t] >= lo32 && pos[t] <= hi32; };
  index_t first = b, last = e - 1;
  while (first < e && !active(first)) ++first;
  if (first == e) return {};
  while (last > first && !active(last)) --last;
  index_t count = 0;
  for (index_t t = first; t <= last; ++t) count += active(t);
  // The kernel sees a segment as one token range, so the attending tokens
  // must be one: positions that are not monotone inside a segment could
  // leave holes, which TE turns into misaligned offsets.
  if (count != last - first + 1) {
    throw_invalid(pos_src.where(src_row), ": under mask ", to_string(mask), " the tokens of segment ", run.id,
                  " that attend anything are not contiguous (", count, " active tokens between tokens ", first, " and ",
                  last, "); positions must be monotone within a segment");
  }
  return {first, count};
}

inline constexpr std::int64_t kNoLimitLow = std::numeric_limits<std::int64_t>::min();
inline constexpr std::int64_t kNoLimitHigh = std::numeric_limits<std::int64_t>::max();

// Reference (mask-defined) semantics (docs/semantics/sequence-descriptors.md §2.6) for one row of q and kv:
// a token is active iff some token of the other side with the same id is
// allowed by the mask; seqlens count active tokens, offsets are the first
// active token. Slot k describes segment id k+1 on both outputs.
struct ThdRowOutput {
  std::int32_t* q_seqlens;   // [M]
  std::int32_t* kv_seqlens;  // [M]
  std::int32_t* q_offsets;   // [M+1]
  std::int32_t* kv_offsets;  // [M+1]
};

template <bool QUnit, bool KvUnit>
void thd_row(RowPtr<QUnit> q_ids, RowPtr<QUnit> q_pos, RowPtr<KvUnit> kv_ids, RowPtr<KvUnit> kv_pos,
             const RowSource (&src)[4], index_t out_row, AttnMaskType mask, int max_segments, SegmentIdGaps gaps,
             bool self_attention, SegmentRuns& q_runs, SegmentRuns& kv_runs, const ThdRowOutput& out) {
  const index_t q_row = source_row(src[0], out_row), kv_row = source_row(src[1], out_row);
  std::fill(out.q_seqlens, out.q_seqlens + max_segments, 0);
  std::fill(out.kv_seqlens, out.kv_seqlens + max_segments, 0);
  std::fill(out.q_offsets, out.q_offsets + max_segments + 1, -1);
  std::fill(out.kv_offsets, out.kv_offsets + max_segments + 1, -1);
  if (self_attention) {
    scan_runs<false>(q_ids, q_pos, src[0].len, q_runs, src[0], q_row, max_segments, gaps);
    // Identical q and kv: under every mask type each token attends at least
    // itself, so every segment is active whole, positions do not matter and
    // one scan of the ids suffices.
    for (const ParsedRun& run : q_runs.runs) {
      const auto slot = static_cast<std::size_t>(run.id - 1);
      out.q_seqlens[slot] = out.kv_seqlens[slot] = static_cast<std::int32_t>(run.length());
      out.q_offsets[slot] = out.kv_offsets[slot] = static_cast<std::int32_t>(run.begin);
    }
    return;
  }
  scan_runs<true>(q_ids, q_pos, src[0].len, q_runs, src[0], q_row, max_segments, gaps);
  scan_runs<true>(kv_ids, kv_pos, src[1].len, kv_runs, src[1], kv_row, max_segments, gaps);
  const bool causal = is_causal(mask), bottom_right = is_bottom_right(mask);
  // Segments present on both sides, joined by id (ids increase on both).
  std::size_t qn = 0, kn = 0;
  while (qn < q_runs.runs.size() && kn < kv_runs.runs.size()) {
    const ParsedRun& qr = q_runs.runs[qn];
    const ParsedRun& kr = kv_runs.runs[kn];
    if (qr.id != kr.id) {
      (qr.id < kr.id ? qn : kn) += 1;
      continue;
    }
    ++qn, ++kn;
    // q token i attends iff pos_q[i] >= q_lo; kv token j is attended iff pos_kv[j] <= kv_hi.
    std::int64_t q_lo = kNoLimitLow, kv_hi = kNoLimitHigh;
    if (causal) {
      // Top-left: pos_q >= pos_kv. Bottom-right: rl_q - pos_q <= rl_kv - pos_kv.
      const std::int64_t shift = bottom_right ? qr.length() - kr.length() : 0;
      q_lo = shift + kr.min_pos;
      kv_hi = qr.max_pos - shift;
    }
    const ActiveRange q = active_range(q_pos, qr, q_lo, kNoLimitHigh, src[2], source_row(src[2], out_row), mask);
    const ActiveRange kv = active_range(kv_pos, kr, kNoLimitLow, kv_hi, src[3], source_row(src[3], out_row), mask);
    const auto slot = static_cast<std::size_t>(qr.id - 1);
    out.q_seqlens[slot] = static_cast<std::int32_t>(q.count);
    out.kv_seqlens[slot] = static_cast<std::int32_t>(kv.count);
    out.q_offsets[slot] = static_cast<std::int32_t>(q.first);
    out.kv_offsets[slot] = static_cast<std::int32_t>(kv.first);
  }
}

// BSHD: one right-padded sequence per row. Returns the number of non-padding
// tokens after checking they form the prefix [0, len) with a single id.
template <bool Unit>
std::int32_t bshd_row_length(RowPtr<Unit> ids, const RowSource& src, index_t src_row) {
  index_t t = 0;
  const std::int32_t id = src.len > 0 ? ids[0] : 0;
  if (id < 0) throw_invalid(src.where(src_row), ", token 0: negative segment id ", id, " (0 is padding)");
  // Both loops skip whole blocks branch-free (vectorizable) where they can.
  const auto block_all = [&](index_t from, std::int32_t value) {
    std::int32_t differs = 0;
    for (index_t k = 0; k < kScanBlock; ++k) differs |= ids[from + k] ^ value;
    return differs == 0;
  };
  if (id > 0) {
    if constexpr (Unit) {
      while (t + kScanBlock <= src.len && block_all(t, id)) t += kScanBlock;
    }
    while (t < src.len && ids[t] == id) ++t;
  }
  const index_t length = t;
  if constexpr (Unit) {
    while (t + kScanBlock <= src.len && block_all(t, 0)) t += kScanBlock;
  }
  for (; t < src.len; ++t) {
    const std::int32_t v = ids[t];
    if (v == 0) continue;
    if (v < 0) throw_invalid(src.where(src_row), ", token ", t, ": negative segment id ", v, " (0 is padding)");
    if (id != 0 && v != id) {
      throw_invalid(src.where(src_row), ", token ", t, ": segment id ", v, " differs from the row's id ", id,
                    "; a BSHD row holds one sequence (use SeqLayout::thd for packed segments)");
    }
    throw_invalid(src.where(src_row), ", token ", t, ": segment id ", v, " after padding at token ", length,
                  "; BSHD rows must be right-padded (non-padding tokens first)");
  }
  return static_cast<std::int32_t>(length);
}

}  // namespace seqattn::detail
