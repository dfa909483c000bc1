// Document masks from a SequenceDescriptor (descriptors/): the descriptor's
// segment ids and positions become a DocumentLayout, so one description of
// the packed batch drives both the seqlens/offsets and the mask.
#pragma once

#include "seqattn/core/error.hpp"
#include "seqattn/descriptors/sequence_descriptor.hpp"
#include "seqattn/masks/document.hpp"

namespace seqattn {

// Requires a descriptor built with from_segment_ids_and_pos; positions must
// count up by one within each segment (see DocumentLayout).
inline DocumentLayout document_layout(const SequenceDescriptor& descriptor) {
  detail::require(descriptor.source() == SequenceDescriptor::Source::segment_ids_and_pos,
                  "document_layout: the SequenceDescriptor must be built with from_segment_ids_and_pos; "
                  "seqlens alone do not say which tokens share a document");
  const auto& ids = descriptor.segment_ids();
  const auto& pos = descriptor.segment_pos();
  return DocumentLayout::from_segment_ids(ids.q.view(), ids.kv.view(), pos.q.view(), pos.kv.view());
}

}  // namespace seqattn
