// Vmapped sequence descriptors: a function vmapped over V examples sees
// segment ids (V, B, S), while the positions it was given stay (B, S) — the
// situation of TransformerEngine issue #2685. The extra dim broadcasts against
// the shared positions, and attention runs end to end in both layouts:
//   BSHD: a document mask over the ids (V*B rows of S tokens);
//   THD:  derived seqlens/offsets, packed into one SegmentTable over V*B*S tokens.
#include <cmath>
#include <cstdio>
#include <vector>

#include "seqattn/masks.hpp"
#include "seqattn/scenarios.hpp"

using namespace seqattn;
using namespace seqattn::scenarios;

int main() {
  const index_t vm = 2, batch = 2, s = 12, heads = 4, kv_heads = 2, dim = 16;
  // Two vmapped examples, each a batch of 2 rows of 12 tokens; 0 is padding.
  const Tensor<std::int32_t> ids(Extents{vm, batch, s}, std::vector<std::int32_t>{
                                                            1, 1, 1, 1, 2, 2, 2, 3, 3, 0, 0, 0,  // v0 b0
                                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  // v0 b1
                                                            1, 1, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0,  // v1 b0
                                                            1, 2, 3, 4, 4, 4, 5, 5, 5, 5, 5, 0,  // v1 b1
                                                        });
  Tensor<std::int32_t> pos(Extents{batch, s});  // TE's old default: arange, built once, not vmapped
  for (index_t b = 0; b < batch; ++b) {
    for (index_t t = 0; t < s; ++t) pos(b, t) = static_cast<std::int32_t>(t);
  }
  std::printf("segment_ids %s, segment_pos %s (broadcast over the vmapped dim)\n", ids.shape().to_string().c_str(),
              pos.shape().to_string().c_str());
  for (index_t v = 0; v < vm; ++v) {
    for (index_t b = 0; b < batch; ++b) {
      std::printf("  v%td b%td  ", v, b);
      for (index_t t = 0; t < s; ++t) std::printf("%d ", ids(v, b, t));
      std::printf("\n");
    }
  }

  // Descriptors, TE semantics: THD seqlens and offsets per (v, b) row, then packed.
  const SequenceDescriptor desc = SequenceDescriptor::from_segment_ids_and_pos(ids.view(), pos.view());
  const SeqlensAndOffsets thd = desc.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, 5);
  std::printf("\nTHD seqlens %s and offsets %s (max_segments_per_seq 5):\n", thd.seqlens.q.shape().to_string().c_str(),
              thd.offsets.q.shape().to_string().c_str());
  for (index_t r = 0; r < vm * batch; ++r) {
    std::printf("  row %td: seqlens", r);
    for (index_t m = 0; m < 5; ++m) std::printf(" %2d", thd.seqlens.q.data()[r * 5 + m]);
    std::printf("   offsets");
    for (index_t m = 0; m < 6; ++m) std::printf(" %2d", thd.offsets.q.data()[r * 6 + m]);
    std::printf("\n");
  }
  // A BSHD row holds one sequence: its ids are 1 for tokens and 0 for padding.
  Tensor<std::int32_t> ids01(ids.shape());
  for (index_t i = 0; i < ids.size(); ++i) ids01.data()[i] = ids.data()[i] != 0 ? 1 : 0;
  const SeqlensAndOffsets bshd = SequenceDescriptor::from_segment_ids_and_pos(ids01.view(), pos.view())
                                     .get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::bshd);
  std::printf("BSHD seqlens %s (ids != 0 as one right-padded sequence per row):",
              bshd.seqlens.q.shape().to_string().c_str());
  for (std::int32_t x : bshd.seqlens.q.values()) std::printf(" %d", x);
  std::printf("\n");
  const PackedSegments packed = pack_segments(thd);
  std::printf("packed: %td segments on %td flat tokens, cu_seqlens", packed.num_segments, packed.total_tokens.q);
  for (index_t i = 0; i <= packed.num_segments; ++i) std::printf(" %d", packed.cu_seqlens.q.data()[i]);
  std::printf("\n\nThe document mask of row v1 b1 (# = may attend):\n");
  const DocumentLayout layout = DocumentLayout::from_segment_ids(ids.view(), pos.view());
  std::printf("%s\n", to_ascii(document_mask(layout, CausalMask{}), MaskContext{3, 0, s, s}).c_str());

  // Attention in both layouts against TE's dense reference (same id != 0, pos_q >= pos_kv).
  SplitMix64 rng(3);
  const auto q = random_normal(Extents{vm, batch, s, heads, dim}, rng);
  const auto k = random_normal(Extents{vm, batch, s, kv_heads, dim}, rng);
  const auto v = random_normal(Extents{vm, batch, s, kv_heads, dim}, rng);
  const float scale = 0.25f;
  const AttentionOutput a = vmapped::attend_bshd(q.view(), k.view(), v.view(), ids.view(), pos.view(), scale);
  const AttentionOutput b = vmapped::attend_thd(q.view(), k.view(), v.view(), ids.view(), pos.view(), scale, 5);
  float err_bshd = 0.0f, err_thd = 0.0f;
  for (index_t r = 0; r < vm * batch; ++r) {
    const auto rows = [&](const Tensor<float>& x, index_t h) {
      return TensorView<const float>(x.data() + r * s * h * dim, Extents{s, h, dim});
    };
    const std::int32_t* id = ids.data() + r * s;
    const std::int32_t* p = pos.data() + (r % batch) * s;
    const auto want = reference_attention(
        rows(q, heads), rows(k, kv_heads), rows(v, kv_heads), scale,
        [&](index_t, index_t i, index_t j) { return id[i] != 0 && id[i] == id[j] && p[i] >= p[j]; });
    for (index_t i = 0; i < want.out.size(); ++i) {
      err_bshd = std::max(err_bshd, std::fabs(a.out.data()[r * want.out.size() + i] - want.out.data()[i]));
      err_thd = std::max(err_thd, std::fabs(b.out.data()[r * want.out.size() + i] - want.out.data()[i]));
    }
  }
  std::printf("Attention %s -> %s: max |error| vs TE's dense reference: BSHD %.1e, THD %.1e\n",
              q.shape().to_string().c_str(), a.out.shape().to_string().c_str(), err_bshd, err_thd);
  std::printf("Padding token (v0 b0 t11): output %.1f, LSE %f\n", a.out(0, 0, 11, 0, 0), a.lse(0, 0, 11, 0));
  return 0;
}
