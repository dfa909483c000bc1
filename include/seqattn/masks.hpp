// Masks: one description, every representation.
//
// Descriptions (value types, no heap, no virtual calls):
//   structural.hpp   FullMask, CausalMask, SlidingWindowMask, ChunkedCausalMask, PrefixLMMask
//   document.hpp     DocumentLayout (segment runs) + DocumentMask<Inner>
//   multi_item.hpp   MultiItemLayout + MultiItemMask (shared prefix + items)
//   topk.hpp         TopKLayout + TopKMask, top_k, topk_scatter_mask
//   dense.hpp        DenseMask<T>, PackedMask + DenseBitsMask
//   combinators.hpp  AndMask / OrMask / NotMask (a & b, a | b, ~a), PerHeadMask
//   any_mask.hpp     AnyMask: any description behind one type (run-time composition, bindings)
//   custom.hpp       mask_mod(f[, classify]): a predicate lambda as a description; check_tile_classes
//   from_descriptor.hpp  document_layout(SequenceDescriptor)
// Representations:
//   block_mask.hpp       BlockMask (+ transposed), build_block_mask
//   representations.hpp  to_dense, to_additive, pack_bits, segment metadata (flat and block-contiguous)
//   render.hpp           to_ascii, to_svg
#pragma once

#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/combinators.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/custom.hpp"
#include "seqattn/masks/dense.hpp"
#include "seqattn/masks/document.hpp"
#include "seqattn/masks/flex_export.hpp"
#include "seqattn/masks/from_descriptor.hpp"
#include "seqattn/masks/multi_item.hpp"
#include "seqattn/masks/render.hpp"
#include "seqattn/masks/representations.hpp"
#include "seqattn/masks/structural.hpp"
#include "seqattn/masks/topk.hpp"
