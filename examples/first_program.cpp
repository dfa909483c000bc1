// A first program, as README.md walks through it: your own buffers wrapped in
// TensorViews, segment ids turned into cu_seqlens and a SegmentTable, packed
// (THD) causal attention over three documents, and a picture of the mask.
// The CTest entry examples.first_program runs it and checks its output.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "seqattn/seqattn.hpp"

int main() {
  using namespace seqattn;

  // One row of 32 tokens: documents of 7, 19 and 4 tokens, then 2 padding
  // tokens (segment id 0). Positions restart at 0 in every document.
  std::vector<std::int32_t> ids, pos;
  std::int32_t doc = 1;
  for (const std::int32_t len : {7, 19, 4}) {
    for (std::int32_t i = 0; i < len; ++i) ids.push_back(doc), pos.push_back(i);
    ++doc;
  }
  ids.resize(32, 0);
  pos.resize(32, 0);

  // Existing buffers become views; Extents take a size_t without a cast.
  const Int32View id_view(ids, {1, ids.size()});
  const Int32View pos_view(pos, {1, pos.size()});

  // Descriptors with TransformerEngine's semantics. max_segments_per_seq = 4
  // reserves 4 slots per row so that shapes stay static under jit: the unused
  // slot has length 0 and cu_seqlens repeats its last value (0 7 26 30 30).
  const auto desc = SequenceDescriptor::from_segment_ids_and_pos(id_view, pos_view);
  const PackedSegments packed =
      pack_segments(desc.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, 4));
  std::printf("cu_seqlens:");
  for (const std::int32_t c : packed.cu_seqlens.q.values()) std::printf(" %d", c);
  std::printf("\n");
  const SegmentTable table = packed.table();  // the 3 real segments

  // THD inputs: q [tokens, heads, dim], k/v [tokens, kv_heads, dim] (GQA 4/2).
  const index_t tokens = 32, heads = 4, kv_heads = 2, dim = 64;
  std::vector<float> q(static_cast<std::size_t>(tokens * heads * dim));
  std::vector<float> k(static_cast<std::size_t>(tokens * kv_heads * dim)), v(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.01f * static_cast<float>(i));
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = std::cos(0.02f * static_cast<float>(i)), v[i] = 0.001f * static_cast<float>(i);
  const AttentionInputs<float> in{TensorView<const float>(q, {tokens, heads, dim}),
                                  TensorView<const float>(k, {tokens, kv_heads, dim}),
                                  TensorView<const float>(v, {tokens, kv_heads, dim}), &table};

  // Outputs: out has q's shape; LSE is [heads, tokens] for THD ([batch, heads,
  // seq] for BSHD). Padding tokens belong to no segment: left as they were.
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(heads * tokens));
  attention_forward(in, CausalMask{}, TensorView<float>(out, {tokens, heads, dim}),
                    TensorView<float>(lse, {heads, tokens}));
  std::printf(
      "lse[head 0, token 7] = %.4f (token 7 starts document 2: it sees one key, so its LSE is that scaled score)\n",
      lse[7]);

  // Pictures of a mask description need a MaskContext: which sequence, which
  // head, and its lengths on the query and key sides.
  const MaskContext ctx{/*batch=*/0, /*head=*/0, /*q_len=*/19, /*kv_len=*/19};
  std::printf("document 2, causal:\n%s", to_ascii(CausalMask{}, ctx).c_str());
  return 0;
}
