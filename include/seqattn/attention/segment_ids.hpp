// Segment ids as an operand of a planned call, beside q, k and v (Splash's
// SegmentIds): the plan holds the static mask's metadata, made once; the ids
// of each call refine its tile classes for that call.
//
//   auto plan = plan_attention<B>(shape, CausalMask{}, options, workers);       // once
//   SegmentIds ids = SegmentIds::from_segment_ids(batch_ids);                   // per call, O(tokens)
//   attention_forward(plan, AttentionInputs<T>{q, k, v, nullptr, &ids}, out, lse, variant, exec);
//
// Meaning: query i sees key j iff the static mask allows (i, j) in the
// sequence's coordinates and ids_q[i] == ids_kv[j] != 0 (rules of
// core/segment_runs.hpp: 0 is padding, each id one run per row). BSHD only
// (THD sequences are already the segments of their SegmentTable).
//
// That is the document mask of the same ids exactly when the static mask
// depends on kv - q alone (full, causal, sliding window and and / or / not of
// them: `shift_invariant`) and every query run sits where its key run does
// in local coordinates (self-attention with one set of ids and positions
// always does): `same_as_document_mask` tells, and the Python and JAX
// routes take this operand only then (else they plan the document mask).
//
// Refinement (attention/detail/segment_tiles.hpp), per call in O(tiles the
// plan lists + tokens): a listed tile whose query and key segment ranges do
// not meet is dropped; a tile whose rows and keys all lie in one segment
// keeps the plan's class; any other is masked in the kernel by comparing the
// two per-token keys below (one int compare per element, boundary tiles only).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/attention/inputs.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/document.hpp"

namespace seqattn {

class SegmentIds {
 public:
  // Parses ids (and positions) of shape (B, T) as DocumentLayout does (its
  // rules and messages); the key side defaults to the query side.
  static SegmentIds from_segment_ids(TensorView<const std::int32_t> q_ids, TensorView<const std::int32_t> kv_ids = {},
                                     TensorView<const std::int32_t> q_positions = {},
                                     TensorView<const std::int32_t> kv_positions = {}) {
    const bool own_kv = kv_ids.data() != nullptr;
    const bool own_kv_pos = kv_positions.data() != nullptr;
    return SegmentIds(std::make_shared<const DocumentLayout>(DocumentLayout::from_segment_ids(
        q_ids, own_kv ? kv_ids : q_ids, q_positions, own_kv_pos ? kv_positions : q_positions)));
  }

  explicit SegmentIds(std::shared_ptr<const DocumentLayout> layout) : layout_(std::move(layout)) {
    detail::require(layout_ != nullptr, "SegmentIds: the layout is null");
    const DocumentLayoutView v = layout_->view();
    q_keys_.resize(static_cast<std::size_t>(v.batch * v.q_tokens));
    kv_keys_.resize(static_cast<std::size_t>(v.batch * v.kv_tokens));
    for (index_t b = 0; b < v.batch; ++b) {
      const auto q_runs = v.q_row(b);
      for (index_t t = 0; t < v.q_tokens; ++t) {
        const std::size_t i = static_cast<std::size_t>(b * v.q_tokens + t);
        const std::int32_t r = v.q_run_of_token[i];
        q_keys_[i] = r < 0 ? kNoQueryRun : q_runs[static_cast<std::size_t>(r)].match;
      }
      for (index_t t = 0; t < v.kv_tokens; ++t) {
        const std::size_t i = static_cast<std::size_t>(b * v.kv_tokens + t);
        const std::int32_t r = v.kv_run_of_token[i];
        kv_keys_[i] = r < 0 ? kNoKeyRun : r;
      }
    }
  }

  const DocumentLayout& layout() const { return *layout_; }
  std::shared_ptr<const DocumentLayout> shared_layout() const { return layout_; }
  index_t batch() const { return layout_->batch(); }
  index_t q_tokens() const { return layout_->view().q_tokens; }
  index_t kv_tokens() const { return layout_->view().kv_tokens; }

  // Per token of sequence b: the index of the key run a query's segment
  // matches (kNoQueryRun for padding or an id no key has), and the key's own
  // run index (kNoKeyRun for padding). Query i sees key j's segment iff the
  // two are equal; the two "none" values never are.
  std::span<const std::int32_t> q_keys(index_t b) const {
    return std::span<const std::int32_t>(q_keys_).subspan(static_cast<std::size_t>(b * q_tokens()),
                                                          static_cast<std::size_t>(q_tokens()));
  }
  std::span<const std::int32_t> kv_keys(index_t b) const {
    return std::span<const std::int32_t>(kv_keys_).subspan(static_cast<std::size_t>(b * kv_tokens()),
                                                           static_cast<std::size_t>(kv_tokens()));
  }
  static constexpr std::int32_t kNoQueryRun = -1;
  static constexpr std::int32_t kNoKeyRun = -2;

  // Throws unless these ids are one row per sequence of `shape`, one id per token.
  void require_fits(const AttentionShape& shape, const char* who) const {
    detail::require(shape.layout == Layout::bshd, who,
                    ": segment ids are an operand of BSHD calls (THD sequences are the segments of their "
                    "SegmentTable), got a THD shape ",
                    shape);
    detail::require(batch() == shape.batch(), who, ": the segment ids have ", batch(),
                    " rows but the inputs have batch ", shape.batch());
    for (index_t b = 0; b < shape.batch(); ++b) {
      detail::require(q_tokens() == shape.q_len(b) && kv_tokens() == shape.kv_len(b), who, ": the segment ids have (q ",
                      q_tokens(), ", kv ", kv_tokens(), ") tokens per row but sequence ", b, " of the inputs has (q ",
                      shape.q_len(b), ", kv ", shape.kv_len(b), ")");
    }
  }

  // Whether `mask` and these ids (the operand's meaning, above) allow exactly
  // what document_mask(layout(), mask) allows for `shape`: the mask depends
  // on kv - q alone, and each matched pair of runs has one length and one
  // offset between token index and position on both sides, in sequences
  // whose query and key lengths are equal (so bottom-right alignment shifts
  // by zero in the sequence and in each segment).
  template <class M>
  bool same_as_document_mask(const M& mask, const AttentionShape& shape) const {
    if (!detail::runtime_shift_invariant(mask)) return false;
    const DocumentLayoutView v = layout_->view();
    for (index_t b = 0; b < v.batch; ++b) {
      if (shape.q_len(b) != shape.kv_len(b)) return false;
      const auto kv_runs = v.kv_row(b);
      for (const SegmentRun& qr : v.q_row(b)) {
        if (qr.match < 0) continue;
        const SegmentRun& kr = kv_runs[static_cast<std::size_t>(qr.match)];
        if (qr.end - qr.begin != kr.end - kr.begin || qr.begin - qr.pos_begin != kr.begin - kr.pos_begin) return false;
      }
    }
    return true;
  }

 private:
  std::shared_ptr<const DocumentLayout> layout_;
  std::vector<std::int32_t> q_keys_, kv_keys_;
};

}  // namespace seqattn
