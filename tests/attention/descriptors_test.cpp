// From a SequenceDescriptor to attention: segment ids and positions of a
// padded [B, T] batch give (a) packed THD segments for a varlen call with a
// causal mask and (b) a document mask for a BSHD call on the same tokens.
// The two must agree on every real token.
#include "seqattn/descriptors.hpp"

#include <cmath>
#include <random>
#include <vector>

#include "seqattn/masks/document.hpp"
#include "seqattn/masks/from_descriptor.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_descriptors_test {

using namespace seqattn;
using namespace seqattn::testing;

TEST_CASE("descriptor-packed THD segments agree with a document-masked BSHD call", "[attention][descriptors]") {
  constexpr index_t kRows = 2, kTokens = 96, kHeads = 8, kKvHeads = 2, kDim = 64;
  constexpr int kMaxSegments = 6;
  // Row 0: segments of 30, 1, 50 and 15 tokens; row 1: 40 tokens, 20 padding, 36 tokens.
  const std::vector<std::vector<index_t>> runs{{30, 1, 50, 15}, {40, -20, 36}};
  std::vector<std::int32_t> ids, pos;
  for (const auto& row : runs) {
    std::int32_t id = 0;
    for (index_t len : row) {
      const bool padding = len < 0;
      if (!padding) ++id;
      for (index_t i = 0; i < std::abs(len); ++i) {
        ids.push_back(padding ? 0 : id);
        pos.push_back(padding ? 0 : static_cast<std::int32_t>(i));
      }
    }
  }
  const TensorView<const std::int32_t> id_view(ids.data(), Extents{kRows, kTokens});
  const TensorView<const std::int32_t> pos_view(pos.data(), Extents{kRows, kTokens});
  const SequenceDescriptor descriptor = SequenceDescriptor::from_segment_ids_and_pos(id_view, pos_view);
  const PackedSegments packed =
      pack_segments(descriptor.get_seqlens_and_offsets(AttnMaskType::padding_causal, SeqLayout::thd, {}, kMaxSegments));
  const SegmentTable table = packed.table();
  REQUIRE(table.size() == 6);

  std::mt19937 rng(81);
  const auto q = random_tensor<float>({kRows, kTokens, kHeads, kDim}, rng);
  const auto k = random_tensor<float>({kRows, kTokens, kKvHeads, kDim}, rng);
  const auto v = random_tensor<float>({kRows, kTokens, kKvHeads, kDim}, rng);
  const auto flat = [](const Tensor<float>& t) {
    return t.view().reshape(detail::make_extents({t.extent(0) * t.extent(1), t.extent(2), t.extent(3)}));
  };

  Tensor<float> thd_out({kRows * kTokens, kHeads, kDim}, 7.0f);
  Tensor<float> thd_lse({kHeads, kRows * kTokens}, 7.0f);
  execution::ThreadPool pool(2);
  attention_forward(AttentionInputs<float>{flat(q), flat(k), flat(v), &table}, CausalMask{}, thd_out.view(),
                    thd_lse.view(), {}, pool);

  Tensor<float> bshd_out({kRows, kTokens, kHeads, kDim});
  Tensor<float> bshd_lse({kRows, kHeads, kTokens});
  const DocumentLayout layout = document_layout(descriptor);  // the mask views it: keep it alive
  const auto mask = document_mask(layout, CausalMask{});
  attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view()}, mask, bshd_out.view(), bshd_lse.view(), {},
                    pool);

  {
    Tensor<float> ref_out({kRows * kTokens, kHeads, kDim}, 7.0f), ref_lse({kHeads, kRows * kTokens}, 7.0f);
    attention_forward<backends::Reference>(AttentionInputs<float>{flat(q), flat(k), flat(v), &table}, CausalMask{},
                                           ref_out.view(), ref_lse.view());
    CHECK(compare(thd_out, ref_out).relative() <= 1e-5);
    Tensor<float> ref2({kRows, kTokens, kHeads, kDim}), ref2_lse({kRows, kHeads, kTokens});
    attention_forward<backends::Reference>(AttentionInputs<float>{q.view(), k.view(), v.view()}, mask, ref2.view(),
                                           ref2_lse.view());
    CHECK(compare(bshd_out, ref2).relative() <= 1e-5);
  }
  index_t compared = 0;
  double max_diff = 0.0;
  for (index_t b = 0; b < kRows; ++b) {
    for (index_t t = 0; t < kTokens; ++t) {
      const bool real = ids[static_cast<std::size_t>(b * kTokens + t)] != 0;
      for (index_t h = 0; h < kHeads; ++h) {
        const float lse_thd = thd_lse(h, b * kTokens + t), lse_bshd = bshd_lse(b, h, t);
        if (!real) {
          REQUIRE(lse_thd == 7.0f);  // THD leaves padding tokens alone
          REQUIRE(lse_bshd == -std::numeric_limits<float>::infinity());
          continue;
        }
        REQUIRE(std::abs(lse_thd - lse_bshd) <= 1e-5f * std::max(1.0f, std::abs(lse_bshd)));
        for (index_t e = 0; e < kDim; ++e) {
          max_diff =
              std::max(max_diff, static_cast<double>(std::abs(thd_out(b * kTokens + t, h, e) - bshd_out(b, t, h, e))));
        }
        ++compared;
      }
    }
  }
  CHECK(compared == (kTokens * kRows - 20) * kHeads);
  CHECK(max_diff <= 1e-5);
}

}  // namespace seqattn_test_attention_descriptors_test
