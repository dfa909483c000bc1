// Document (segment) masks (segment-run rules: docs/semantics/sequence-descriptors.md §7.3): packed sequences that
// attend only within their own segment, with any inner mask (causal, window, ...) applied per segment.
//
// Input is TE's segment ids (0 = padding, real ids >= 1) of shape (*E, B, T)
// for queries and for keys/values, and optionally segment positions whose
// trailing shape matches the ids and that are broadcast over the extra
// leading dims (TE PR #2692, docs/semantics/sequence-descriptors.md §3). MaskContext.batch is the flat index over
// (*E, B); ctx.q_len / ctx.kv_len are the token counts T_q / T_kv.
//
// Query token i may see key token j iff ids_q[i] == ids_kv[j] != 0 and the
// inner mask allows them in segment-local coordinates. The local coordinate of
// a token is its position (or, without positions, its offset in its segment),
// and the inner mask sees the segment as the first pos_end tokens of a
// document, so with positions 0..L-1 it sees q_len = L_q and kv_len = L_kv
// (bottom-right alignment then matches TE: pos_kv <= pos_q + L_kv - L_q).
// Positions must count up by one within each segment (what makes O(1)
// per-segment classes possible); other layouts (striped context-parallel
// shards) are rejected with the offending token named. Ids need not be
// increasing, but each non-zero id must form one contiguous run per row.
//
// Unlike Splash (segment ids AND-ed inside the kernel only), tile classes
// come from the segment runs, so cross-document tiles are skipped. The O(n)
// per-token run index lives in an owning DocumentLayout; the mask holds a
// non-owning DocumentLayoutView of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segment_runs.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/combinators.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/structural.hpp"

namespace seqattn {

// One maximal run of a segment on one side, in row-local token indices.
struct SegmentRun {
  std::int32_t id = 0;
  std::int32_t begin = 0;      // first token
  std::int32_t end = 0;        // one past the last token
  std::int32_t pos_begin = 0;  // local coordinate of the first token
  std::int32_t match = -1;     // q side: index (within the row) of the kv run with the same id, or -1
};

// Non-owning view of a DocumentLayout: small, copyable, no heap.
struct DocumentLayoutView {
  index_t batch = 0;                             // flat over (*E, B)
  index_t q_tokens = 0;                          // T_q
  index_t kv_tokens = 0;                         // T_kv
  std::span<const std::int32_t> q_run_offsets;   // batch + 1
  std::span<const SegmentRun> q_runs;            // runs of all rows, row by row
  std::span<const std::int32_t> kv_run_offsets;  // batch + 1
  std::span<const SegmentRun> kv_runs;
  std::span<const std::int32_t> q_run_of_token;   // batch * T_q: run index within the row, -1 for padding
  std::span<const std::int32_t> kv_run_of_token;  // batch * T_kv

  std::span<const SegmentRun> q_row(index_t b) const {
    return q_runs.subspan(static_cast<std::size_t>(q_run_offsets[static_cast<std::size_t>(b)]),
                          static_cast<std::size_t>(q_run_offsets[static_cast<std::size_t>(b) + 1] -
                                                   q_run_offsets[static_cast<std::size_t>(b)]));
  }
  std::span<const SegmentRun> kv_row(index_t b) const {
    return kv_runs.subspan(static_cast<std::size_t>(kv_run_offsets[static_cast<std::size_t>(b)]),
                           static_cast<std::size_t>(kv_run_offsets[static_cast<std::size_t>(b) + 1] -
                                                    kv_run_offsets[static_cast<std::size_t>(b)]));
  }
};

// Owning segment-run metadata, validated when built.
class DocumentLayout {
 public:
  // Self-attention: the same ids (and positions) for queries and keys.
  static DocumentLayout from_segment_ids(TensorView<const std::int32_t> ids,
                                         TensorView<const std::int32_t> positions = {}) {
    return from_segment_ids(ids, ids, positions, positions);
  }

  // ids of shape (*E, B, T); positions empty or of shape (*E', B, T) with E'
  // a suffix of E (broadcast over the rest).
  static DocumentLayout from_segment_ids(TensorView<const std::int32_t> q_ids, TensorView<const std::int32_t> kv_ids,
                                         TensorView<const std::int32_t> q_positions,
                                         TensorView<const std::int32_t> kv_positions) {
    detail::require(q_ids.rank() >= 2, "DocumentLayout: q_segment_ids must have shape (*E, B, T), got ", q_ids.shape());
    detail::require(kv_ids.rank() >= 2, "DocumentLayout: kv_segment_ids must have shape (*E, B, T), got ",
                    kv_ids.shape());
    detail::require(q_ids.shape().drop_last(1) == kv_ids.shape().drop_last(1), "DocumentLayout: q_segment_ids ",
                    q_ids.shape(), " and kv_segment_ids ", kv_ids.shape(), " must agree in every dim but the last");
    DocumentLayout l;
    l.batch_ = q_ids.shape().drop_last(1).size();
    l.q_tokens_ = q_ids.extent(-1);
    l.kv_tokens_ = kv_ids.extent(-1);
    l.build_side(q_ids, q_positions, "q", l.q_offsets_, l.q_runs_, l.q_token_run_);
    l.build_side(kv_ids, kv_positions, "kv", l.kv_offsets_, l.kv_runs_, l.kv_token_run_);
    // Pair each q run with the kv run of the same id (at most one: runs are contiguous).
    std::unordered_map<std::int32_t, std::int32_t> kv_by_id;
    for (index_t b = 0; b < l.batch_; ++b) {
      kv_by_id.clear();
      const auto kb = static_cast<std::size_t>(l.kv_offsets_[static_cast<std::size_t>(b)]);
      for (std::size_t r = kb; r < static_cast<std::size_t>(l.kv_offsets_[static_cast<std::size_t>(b) + 1]); ++r) {
        kv_by_id[l.kv_runs_[r].id] = static_cast<std::int32_t>(r - kb);
      }
      for (std::size_t r = static_cast<std::size_t>(l.q_offsets_[static_cast<std::size_t>(b)]);
           r < static_cast<std::size_t>(l.q_offsets_[static_cast<std::size_t>(b) + 1]); ++r) {
        auto it = kv_by_id.find(l.q_runs_[r].id);
        l.q_runs_[r].match = it == kv_by_id.end() ? -1 : it->second;
      }
    }
    return l;
  }

  DocumentLayoutView view() const {
    return {batch_, q_tokens_, kv_tokens_, q_offsets_, q_runs_, kv_offsets_, kv_runs_, q_token_run_, kv_token_run_};
  }
  index_t batch() const { return batch_; }
  RaggedLengths lengths() const { return RaggedLengths::uniform(batch_, q_tokens_, kv_tokens_); }

  // The rows packed back to back as THD segments: run i of a row's queries
  // with run i of its keys, which must carry the same id (the same segments
  // in the same order on both sides); offsets on the flat token axis, row r
  // starting at r * T. `who` names the caller in errors.
  OwnedSegmentTable segment_table(const char* who) const {
    OwnedSegmentTable t;
    const DocumentLayoutView v = view();
    for (index_t b = 0; b < batch_; ++b) {
      const auto q = v.q_row(b), kv = v.kv_row(b);
      bool same = q.size() == kv.size();
      for (std::size_t i = 0; same && i < q.size(); ++i) same = q[i].id == kv[i].id;
      if (!same) {
        const auto ids = [](std::span<const SegmentRun> runs) {
          std::string out = "[";
          for (const SegmentRun& r : runs) out += (out.size() > 1 ? ", " : "") + std::to_string(r.id);
          return out + "]";
        };
        detail::throw_invalid(who, ": q and kv segment_ids must list the same segments in the same order, got ", ids(q),
                              " and ", ids(kv), " in row ", b);
      }
      // Offsets stay int32 (what kernels consume): the flat axis must fit.
      const index_t q_row = detail::checked_mul(b, q_tokens_, who), kv_row = detail::checked_mul(b, kv_tokens_, who);
      detail::require(q_row + q_tokens_ <= std::numeric_limits<std::int32_t>::max() &&
                          kv_row + kv_tokens_ <= std::numeric_limits<std::int32_t>::max(),
                      who, ": ", batch_, " rows of (q ", q_tokens_, ", kv ", kv_tokens_,
                      ") tokens exceed the int32 offsets of a segment table");
      for (std::size_t i = 0; i < q.size(); ++i) {
        t.push_back(static_cast<std::int32_t>(q_row + q[i].begin), q[i].end - q[i].begin,
                    static_cast<std::int32_t>(kv_row + kv[i].begin), kv[i].end - kv[i].begin);
      }
    }
    return t;
  }

 private:
  void build_side(TensorView<const std::int32_t> ids, TensorView<const std::int32_t> pos, const char* side,
                  std::vector<std::int32_t>& offsets, std::vector<SegmentRun>& runs,
                  std::vector<std::int32_t>& token_run) {
    const index_t t_len = ids.extent(-1);
    const index_t rows = batch_;
    index_t pos_rows = 0;
    if (pos.rank() > 0) {  // a default-constructed (rank-0) view means "no positions"
      detail::require(pos.rank() >= 2 && pos.rank() <= ids.rank(), "DocumentLayout: ", side,
                      "_segment_pos must have shape (*E', B, T) with no more dims than ", side, "_segment_ids ",
                      ids.shape(), ", got ", pos.shape());
      detail::require(ids.shape().last(pos.rank()) == pos.shape(), "DocumentLayout: ", side,
                      "_segment_pos trailing shape must match ", side, "_segment_ids; got ids ", ids.shape(), ", pos ",
                      pos.shape());
      pos_rows = pos.shape().drop_last(1).size();
    }
    // Strided or broadcast inputs are copied once; contiguous ones are read in place.
    Tensor<std::int32_t> ids_copy, pos_copy;
    const TensorView<const std::int32_t> flat_ids = to_rows(ids, rows, t_len, ids_copy);
    const TensorView<const std::int32_t> flat_pos =
        pos_rows > 0 ? to_rows(pos, pos_rows, t_len, pos_copy) : TensorView<const std::int32_t>{};
    offsets.assign(1, 0);
    token_run.assign(static_cast<std::size_t>(rows * t_len), -1);
    detail::SegmentRunParser parser;
    for (index_t b = 0; b < rows; ++b) {
      const detail::RowPtr<true> row_ids{flat_ids.data() + b * t_len, 1};
      const detail::RowPtr<true> row_pos{pos_rows > 0 ? flat_pos.data() + (b % pos_rows) * t_len : nullptr, 1};
      const DocumentRunRules rules{side, ids.shape(), b};
      const auto parsed = pos_rows > 0 ? parser.parse<detail::RunPositions::consecutive>(row_ids, row_pos, t_len, rules)
                                       : parser.parse<detail::RunPositions::none>(row_ids, row_pos, t_len, rules);
      std::int32_t* row_token_run = token_run.data() + b * t_len;
      for (std::size_t r = 0; r < parsed.size(); ++r) {
        const detail::ParsedRun& run = parsed[r];
        // Without positions a token's local coordinate is its offset in the run.
        runs.push_back(
            {run.id, static_cast<std::int32_t>(run.begin), static_cast<std::int32_t>(run.end), run.first_pos, -1});
        std::fill(row_token_run + run.begin, row_token_run + run.end, static_cast<std::int32_t>(r));
      }
      offsets.push_back(static_cast<std::int32_t>(runs.size()));
    }
  }

  // DocumentLayout's rules on top of the shared ones (core/segment_runs.hpp):
  // any id order, positions (when given) start each run at >= 0 and count up
  // by one; errors keep DocumentLayout's wording.
  struct DocumentRunRules {
    const char* side;
    const Extents& shape;
    index_t row;

    void on_run_start(std::int32_t v, index_t t, std::int32_t p, index_t) const {
      (void)v;
      detail::require(p >= 0, "DocumentLayout: ", side, "_segment_pos[", row, ", ", t, "] = ", p, " is negative");
    }
    [[noreturn]] void negative_id(index_t t, std::int32_t v) const {
      detail::throw_invalid("DocumentLayout: ", side, "_segment_ids[", row, ", ", t, "] = ", v,
                            " is negative (0 is padding, segments are >= 1)");
    }
    [[noreturn]] void repeated_id(index_t t, std::int32_t v, const detail::ParsedRun& earlier) const {
      detail::throw_invalid("DocumentLayout: ", side, "_segment_ids row ", row, " of shape ", shape, ": segment ", v,
                            " is not one contiguous run (tokens ", earlier.begin, " and ", t, ")");
    }
    [[noreturn]] void positions_not_consecutive(index_t t, std::int32_t v, std::int32_t p, std::int32_t prev) const {
      detail::throw_invalid("DocumentLayout: ", side, "_segment_pos row ", row, ": positions within segment ", v,
                            " must count up by one, got ", p, " at token ", t, " after ", prev);
    }
  };

  static TensorView<const std::int32_t> to_rows(TensorView<const std::int32_t> v, index_t rows, index_t t_len,
                                                Tensor<std::int32_t>& copy) {
    if (v.is_contiguous()) return v.reshape(Extents{rows, t_len});
    copy = to_tensor(v);
    return std::as_const(copy).view().reshape(Extents{rows, t_len});
  }

  index_t batch_ = 0;
  index_t q_tokens_ = 0;
  index_t kv_tokens_ = 0;
  std::vector<std::int32_t> q_offsets_, kv_offsets_;
  std::vector<SegmentRun> q_runs_, kv_runs_;
  std::vector<std::int32_t> q_token_run_, kv_token_run_;
};

// Document mask with an inner mask applied inside each segment.
template <MaskDescription Inner = FullMask>
struct DocumentMask {
  static constexpr bool head_invariant = is_head_invariant<Inner>();
  DocumentLayoutView layout;
  Inner inner = {};

  // The inner context of q run `qr` against kv run `kr`.
  static MaskContext inner_context(const MaskContext& ctx, const SegmentRun& qr, const SegmentRun& kr) {
    // In 64 bits: a run may start near INT32_MAX.
    return {ctx.batch, ctx.head, index_t{qr.pos_begin} + (qr.end - qr.begin),
            index_t{kr.pos_begin} + (kr.end - kr.begin)};
  }

  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    const std::int32_t rq = layout.q_run_of_token[static_cast<std::size_t>(ctx.batch * layout.q_tokens + q)];
    const std::int32_t rk = layout.kv_run_of_token[static_cast<std::size_t>(ctx.batch * layout.kv_tokens + kv)];
    if (rq < 0 || rk < 0) return false;
    const SegmentRun& qr = layout.q_row(ctx.batch)[static_cast<std::size_t>(rq)];
    if (qr.match != rk) return false;
    const SegmentRun& kr = layout.kv_row(ctx.batch)[static_cast<std::size_t>(rk)];
    return inner.allowed(inner_context(ctx, qr, kr), qr.pos_begin + (q - qr.begin), kr.pos_begin + (kv - kr.begin));
  }

  // Row q sees one interval when the inner mask's rows are intervals.
  KvInterval row_interval(const MaskContext& ctx, index_t q) const requires HasRowInterval<Inner> {
    const std::int32_t rq = layout.q_run_of_token[static_cast<std::size_t>(ctx.batch * layout.q_tokens + q)];
    if (rq < 0) return {};
    const SegmentRun& qr = layout.q_row(ctx.batch)[static_cast<std::size_t>(rq)];
    if (qr.match < 0) return {};
    const SegmentRun& kr = layout.kv_row(ctx.batch)[static_cast<std::size_t>(qr.match)];
    const KvInterval local = inner.row_interval(inner_context(ctx, qr, kr), qr.pos_begin + (q - qr.begin));
    const index_t b = std::max<index_t>(kr.begin, kr.begin + local.begin - kr.pos_begin);
    const index_t e = std::min<index_t>(kr.end, kr.begin + local.end - kr.pos_begin);
    return b < e ? KvInterval{b, e} : KvInterval{};
  }

  // Row q's keys as a set of intervals when the inner mask's rows are sets of
  // intervals but not one interval (an AnyMask or a combination), so tile
  // bits are written an interval at a time, never key by key, and the set is
  // inexact exactly when the inner one is.
  KvIntervalSet row_intervals(const MaskContext& ctx, index_t q) const
      requires(RowSetMask<Inner> && !HasRowInterval<Inner>) {
    const std::int32_t rq = layout.q_run_of_token[static_cast<std::size_t>(ctx.batch * layout.q_tokens + q)];
    if (rq < 0) return {};
    const SegmentRun& qr = layout.q_row(ctx.batch)[static_cast<std::size_t>(rq)];
    if (qr.match < 0) return {};
    const SegmentRun& kr = layout.kv_row(ctx.batch)[static_cast<std::size_t>(qr.match)];
    const KvIntervalSet local = detail::row_set(inner, inner_context(ctx, qr, kr), qr.pos_begin + (q - qr.begin));
    if (!local.exact) return local;
    KvIntervalSet global;
    for (int i = 0; i < local.size; ++i) {
      global.push({std::max<index_t>(kr.begin, kr.begin + local[i].begin - kr.pos_begin),
                   std::min<index_t>(kr.end, kr.begin + local[i].end - kr.pos_begin)});
    }
    return global;
  }
  void row_bits(const MaskContext& ctx, index_t q, index_t kv_begin, index_t kv_end, std::uint64_t* words) const
      requires(RowSetMask<Inner> && !HasRowInterval<Inner>) {
    detail::row_set_bits(*this, ctx, q, kv_begin, kv_end, words);
  }

  // From the runs meeting the tile: O(runs in the tile + log runs).
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    const auto runs = layout.q_row(ctx.batch);
    const auto kv_runs = layout.kv_row(ctx.batch);
    bool any = false;
    bool all = true;
    index_t covered = 0;
    for (const SegmentRun* it = first_run(runs, t.q_begin); it != runs.data() + runs.size() && it->begin < t.q_end;
         ++it) {
      const SegmentRun& qr = *it;
      const index_t r0 = std::max<index_t>(qr.begin, t.q_begin);
      const index_t r1 = std::min<index_t>(qr.end, t.q_end);
      covered += r1 - r0;
      if (qr.match < 0) {
        all = false;
      } else {
        const SegmentRun& kr = kv_runs[static_cast<std::size_t>(qr.match)];
        const index_t c0 = std::max<index_t>(kr.begin, t.kv_begin);
        const index_t c1 = std::min<index_t>(kr.end, t.kv_end);
        if (c0 >= c1) {
          all = false;
        } else {
          if (c0 != t.kv_begin || c1 != t.kv_end) all = false;
          const Tile local{qr.pos_begin + (r0 - qr.begin), qr.pos_begin + (r1 - qr.begin),
                           kr.pos_begin + (c0 - kr.begin), kr.pos_begin + (c1 - kr.begin)};
          const TileClass c = inner.classify(inner_context(ctx, qr, kr), local);
          if (c != TileClass::empty) any = true;
          if (c != TileClass::full) all = false;
        }
      }
      if (any && !all) return TileClass::partial;
    }
    if (covered < t.rows()) all = false;
    if (!any) return TileClass::empty;
    return all ? TileClass::full : TileClass::partial;
  }

  // Keys of the segments the q-block's rows belong to (narrowed by the inner
  // mask's span when it has one); all-keys only when one segment covers the block.
  KvSpan kv_span(const MaskContext& ctx, index_t q_begin, index_t q_end) const {
    KvSpan s{ctx.kv_len, 0, 0, 0};
    const auto runs = layout.q_row(ctx.batch);
    const auto kv_runs = layout.kv_row(ctx.batch);
    index_t covered = 0;
    index_t seen = 0;
    for (const SegmentRun* it = first_run(runs, q_begin); it != runs.data() + runs.size() && it->begin < q_end; ++it) {
      const SegmentRun& qr = *it;
      const index_t r0 = std::max<index_t>(qr.begin, q_begin);
      const index_t r1 = std::min<index_t>(qr.end, q_end);
      covered += r1 - r0;
      ++seen;
      if (qr.match < 0) continue;
      const SegmentRun& kr = kv_runs[static_cast<std::size_t>(qr.match)];
      // Without an inner span: any key of the segment, and no claim about all keys.
      KvSpan local{kr.pos_begin, index_t{kr.pos_begin} + (kr.end - kr.begin), 0, 0};
      if constexpr (HasKvSpan<Inner>) {
        local =
            inner.kv_span(inner_context(ctx, qr, kr), qr.pos_begin + (r0 - qr.begin), qr.pos_begin + (r1 - qr.begin));
      }
      auto to_global = [&](index_t v) { return std::clamp<index_t>(kr.begin + v - kr.pos_begin, kr.begin, kr.end); };
      const index_t ab = to_global(local.any_begin), ae = to_global(local.any_end);
      if (ab < ae) {
        s.any_begin = std::min(s.any_begin, ab);
        s.any_end = std::max(s.any_end, ae);
      }
      s.all_begin = to_global(local.all_begin);
      s.all_end = std::max(s.all_begin, to_global(local.all_end));
    }
    if (s.any_begin >= s.any_end) return {};
    if (seen != 1 || covered != q_end - q_begin) s.all_begin = s.all_end = 0;
    return s;
  }

  void check(const RaggedLengths& lengths, index_t heads) const {
    detail::require_fixed_lengths(
        lengths, "DocumentMask", layout.batch,
        [&] { return detail::concat("the layout has ", layout.batch, " rows (flat over the extra and batch dims)"); },
        [&](index_t) { return std::make_pair(layout.q_tokens, layout.kv_tokens); },
        [&](index_t) {
          return detail::concat("the segment ids have T_q=", layout.q_tokens, ", T_kv=", layout.kv_tokens);
        });
    if constexpr (HasCheck<Inner>) inner.check(inner_lengths(lengths), heads);
  }

 private:
  // The lengths the inner mask is checked for: the batch's, or larger where
  // positions take a segment's local coordinates past them (a chunk of a long
  // sequence at positions 1000..1005 of 6 tokens). The inner mask is asked
  // about local coordinates up to pos_begin + run length, so a mask that reads
  // stored data must cover them; a structural one accepts any lengths.
  RaggedLengths inner_lengths(const RaggedLengths& lengths) const {
    RaggedLengths inner_lens = lengths;
    for (index_t b = 0; b < lengths.batch(); ++b) {
      auto& q = inner_lens.q[static_cast<std::size_t>(b)];
      auto& kv = inner_lens.kv[static_cast<std::size_t>(b)];
      for (const SegmentRun& r : layout.q_row(b)) q = std::max<index_t>(q, index_t{r.pos_begin} + (r.end - r.begin));
      for (const SegmentRun& r : layout.kv_row(b)) kv = std::max<index_t>(kv, index_t{r.pos_begin} + (r.end - r.begin));
    }
    return inner_lens;
  }

  static const SegmentRun* first_run(std::span<const SegmentRun> runs, index_t q) {
    return std::partition_point(runs.data(), runs.data() + runs.size(),
                                [q](const SegmentRun& r) { return r.end <= q; });
  }
};

template <MaskDescription Inner = FullMask>
DocumentMask<Inner> document_mask(const DocumentLayout& layout, Inner inner = {}) {
  return {layout.view(), inner};
}

// The mask views the layout, so the layout must outlive it: a temporary
// layout (e.g. document_mask(document_layout(descriptor))) would dangle.
template <MaskDescription Inner = FullMask>
DocumentMask<Inner> document_mask(DocumentLayout&& layout, Inner inner = {}) = delete;

}  // namespace seqattn
