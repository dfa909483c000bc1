// seqattn: packed and ragged attention for C++20.
//
// The umbrella header. Data flows one way:
//   descriptors (segment ids, positions -> seqlens, offsets, cu_seqlens)
//   -> masks (one description -> dense, bits, metadata, BlockMask)
//   -> attention (tiled online softmax on a chosen backend).
#pragma once

#include "seqattn/attention.hpp"
#include "seqattn/core.hpp"
#include "seqattn/core/simd.hpp"
#include "seqattn/descriptors.hpp"
#include "seqattn/masks.hpp"
#include "seqattn/scenarios.hpp"
