// Sequence descriptors in five steps: pack two short documents and one
// longer one into a batch of two rows, derive per-row seqlens and offsets
// from segment ids and positions, pack them for the attention kernel, and
// reorder a row for context-parallel load balancing.
#include "seqattn/descriptors.hpp"

#include <cstdint>
#include <cstdio>
#include <vector>

using namespace seqattn;

namespace {
void print(const char* name, std::span<const std::int32_t> values) {
  std::printf("  %-14s [", name);
  for (std::size_t i = 0; i < values.size(); ++i) std::printf(i ? ", %d" : "%d", values[i]);
  std::printf("]\n");
}
}  // namespace

int main() {
  // Row 0 holds documents 1 (3 tokens) and 2 (2 tokens), then padding (id 0);
  // row 1 holds one document of 6 tokens. Positions restart in each document.
  const std::vector<std::int32_t> ids = {1, 1, 1, 2, 2, 0, 0, 0,  //
                                         1, 1, 1, 1, 1, 1, 0, 0};
  const std::vector<std::int32_t> pos = {0, 1, 2, 0, 1, 0, 0, 0,  //
                                         0, 1, 2, 3, 4, 5, 0, 0};
  const Int32View id_view(ids.data(), Extents{2, 8});
  const Int32View pos_view(pos.data(), Extents{2, 8});

  // 1. Describe the batch (self-attention: q and kv share ids and positions).
  const auto descriptor = SequenceDescriptor::from_segment_ids_and_pos(id_view, pos_view);

  // 2. Per-row seqlens and offsets, at most 2 segments per row.
  const SeqlensAndOffsets per_row = descriptor.get_seqlens_and_offsets(
      parse_attn_mask_type("padding_causal"), SeqLayout::thd, WindowSize{}, /*max_segments_per_seq=*/2);
  std::printf("per row (THD, padding_causal):\n");
  print("seqlens", per_row.seqlens.q.values());
  print("offsets", per_row.offsets.q.values());

  // 3. Packed on the flat (B*S) token axis, as a fused kernel consumes them.
  const PackedSegments packed = pack_segments(per_row);
  std::printf("packed (%td segments over %td tokens):\n", packed.num_segments, packed.total_tokens.q);
  print("cu_seqlens", packed.cu_seqlens.q.values());
  print("offsets", packed.offsets.q.values());
  const SegmentTable table = packed.table();  // what the attention engine reads
  for (index_t s = 0; s < table.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    std::printf("  segment %td: queries [%d, %d)\n", s, table.q_offsets[i], table.q_offsets[i] + table.q_lens[i]);
  }

  // 4. Bad input is an error, not a wrong answer: three documents exceed the 2 slots.
  const std::vector<std::int32_t> too_many = {1, 2, 3, 0};
  try {
    derive_seqlens_and_offsets(Int32View(too_many.data(), Extents{1, 4}), Int32View(pos.data(), Extents{4}),
                               AttnMaskType::padding, SeqLayout::thd, {}, 2);
  } catch (const seqattn::invalid_argument& e) {
    std::printf("error, as expected:\n  %s\n", e.what());
  }

  // 5. Context parallelism over 2 ranks: reorder the token axis (ids, positions,
  //    q, k and v alike) so each rank gets a balanced share of causal work.
  const Tensor<std::int32_t> reordered =
      reorder_causal_load_balancing(id_view, ReorderStrategy::dual_chunk_swap, /*cp_size=*/2, /*seq_dim=*/-1);
  std::printf("DualChunkSwap over 2 ranks:\n");
  print("ids", reordered.values());
  return 0;
}
