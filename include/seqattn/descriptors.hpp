// Sequence descriptors: segment ids and positions -> seqlens and offsets with
// TransformerEngine's reference semantics, packing into cu_seqlens and a
// SegmentTable for the attention engine, and context-parallel reordering.
#pragma once

#include "seqattn/descriptors/context_parallel.hpp"
#include "seqattn/descriptors/derive.hpp"
#include "seqattn/descriptors/packing.hpp"
#include "seqattn/descriptors/sequence_descriptor.hpp"
#include "seqattn/descriptors/types.hpp"
