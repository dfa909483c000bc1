// A consumer of the installed or embedded package: includes the umbrella
// header and runs the pipeline end to end (segment ids -> descriptors ->
// packed segments -> masked attention), comparing the default backend with
// the reference. It is built with no SIMD flags, so Highway's portable
// target must compile and agree too. Exit code 0 = success.
#include <cmath>
#include <cstdio>
#include <vector>

#include "seqattn/seqattn.hpp"

int main() {
  using namespace seqattn;
  // Two rows of 8 tokens: documents of 3 and 4 tokens, then one of 6.
  const std::vector<std::int32_t> ids = {1, 1, 1, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1, 0, 0};
  const std::vector<std::int32_t> pos = {0, 1, 2, 0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5, 0, 0};
  const auto descriptor = SequenceDescriptor::from_segment_ids_and_pos(Int32View(ids.data(), Extents{2, 8}),
                                                                       Int32View(pos.data(), Extents{2, 8}));
  const PackedSegments packed =
      pack_segments(descriptor.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, 2));
  const SegmentTable table = packed.table();
  if (table.size() != 3) return 1;

  const index_t tokens = 16, heads = 4, kv_heads = 2, dim = 24;
  std::vector<float> q(static_cast<std::size_t>(tokens * heads * dim));
  std::vector<float> kv(static_cast<std::size_t>(tokens * kv_heads * dim));
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.11f * static_cast<float>(i));
  const AttentionInputs<float> in{TensorView<const float>(q.data(), Extents{tokens, heads, dim}),
                                  TensorView<const float>(kv.data(), Extents{tokens, kv_heads, dim}),
                                  TensorView<const float>(kv.data(), Extents{tokens, kv_heads, dim}), &table};
  Tensor<float> out(Extents{tokens, heads, dim}), expected(Extents{tokens, heads, dim});
  Tensor<float> lse(Extents{heads, tokens}), expected_lse(Extents{heads, tokens});
  attention_forward(in, CausalMask{}, out.view(), lse.view());
  attention_forward<backends::Reference>(in, CausalMask{}, expected.view(), expected_lse.view());
  auto close = [&](const Tensor<float>& got) {
    for (index_t i = 0; i < got.size(); ++i) {
      if (std::abs(got.data()[i] - expected.data()[i]) > 1e-5f * (1.0f + std::abs(expected.data()[i]))) return false;
    }
    return true;
  };
  if (!close(out)) return 2;

  // Plan once, run with a score variant on a pool, as the README shows.
  execution::ThreadPool pool(2);
  const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, {}, pool.workers());
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  const auto variant = variants::chain(variants::Alibi{slopes}, variants::Softcap{5.0f});
  attention_forward(plan, in, out.view(), lse.view(), variant, pool);
  attention_forward(plan_attention<backends::Reference>(shape_of(in), CausalMask{}), in, expected.view(),
                    expected_lse.view(), variant);
  if (!close(out)) return 3;
  std::printf("seqattn %d.%d.%d consumer OK: %td segments, Highway target %s\n", kVersionMajor, kVersionMinor,
              kVersionPatch, table.size(), static_simd_target());
  return 0;
}
