// A gallery of every mask kind: each is printed as an ASCII picture (element
// mask, then its 4x4-tile BlockMask: '#' full, '+' partial, '.' skipped) and
// written as SVG pictures for documentation.
//
//   seqattn_example_mask_gallery [output_dir]   (default: mask_gallery)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "seqattn/masks.hpp"

using namespace seqattn;

namespace {

std::string out_dir;

template <class M>
void show(const std::string& name, const M& mask, const RaggedLengths& lengths, index_t head = 0) {
  const MaskContext ctx{0, head, lengths.q[0], lengths.kv[0]};
  const BlockMask bm = build_block_mask(mask, lengths, head + 1, {4, 4});
  std::printf("== %s (%td x %td)\n%s-- 4x4 tiles: %td full, %td partial (%td distinct), %td skipped\n%s\n",
              name.c_str(), ctx.q_len, ctx.kv_len, to_ascii(mask, ctx).c_str(), bm.num_full_tiles(),
              bm.num_partial_tiles(), bm.num_distinct_partial_tiles(),
              bm.num_tiles() - bm.num_full_tiles() - bm.num_partial_tiles(), to_ascii(bm, 0, head).c_str());
  write_text_file(out_dir + "/" + name + ".svg", to_svg(mask, ctx, name, 128, 8));
  write_text_file(out_dir + "/" + name + ".blocks.svg", to_svg(bm, 0, head, name + " (4x4 tiles)", 16));
}

}  // namespace

int main(int argc, char** argv) {
  out_dir = argc > 1 ? argv[1] : "mask_gallery";
  std::filesystem::create_directories(out_dir);
  const RaggedLengths square = RaggedLengths::uniform(1, 24, 24);
  const RaggedLengths wide = RaggedLengths::uniform(1, 16, 24);

  show("full", FullMask{}, square);
  show("causal_top_left", CausalMask{Alignment::top_left}, wide);
  show("causal_bottom_right", CausalMask{Alignment::bottom_right}, wide);
  show("sliding_window_6_0", SlidingWindowMask{6, 0}, square);
  show("sliding_window_3_3", SlidingWindowMask{3, 3}, square);
  show("chunked_causal_8", ChunkedCausalMask{8}, square);
  show("prefix_lm_10", PrefixLMMask{.prefix = 10}, square);

  // Four packed documents with padding between two of them.
  const std::vector<std::int32_t> ids{1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4};
  const DocumentLayout docs =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, 24}));
  show("documents", document_mask(docs), docs.lengths());
  show("documents_causal", document_mask(docs, CausalMask{}), docs.lengths());
  show("documents_window_3_0", document_mask(docs, SlidingWindowMask{3, 0}), docs.lengths());

  // Multi-item scoring: a 5-token query and items of 4, 0, 6 and 3 tokens.
  MultiItemLayout items;
  const std::vector<index_t> item_lengths{4, 0, 6, 3};
  items.add_items(5, item_lengths);
  show("multi_item", multi_item_mask(items), items.lengths());

  // Top-3 of a random score matrix, then AND causal (DSA indexer style).
  std::vector<float> scores(24 * 24);
  std::uint32_t state = 12345;
  for (float& s : scores) s = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8);
  const Tensor<std::int32_t> top = top_k(TensorView<const float>(scores.data(), Extents{1, 24, 24}), 3);
  const TopKLayout topk = TopKLayout::from_indices(top.view(), 24);
  show("topk_3", topk_mask(topk), square);
  show("topk_3_and_causal", topk_mask(topk) & CausalMask{}, square);

  // An explicit dense mask (a checkerboard of 3x3 blocks) and its packed bits.
  Tensor<std::uint8_t> dense(Extents{24, 24});
  for (index_t q = 0; q < 24; ++q) {
    for (index_t kv = 0; kv < 24; ++kv) dense(q, kv) = static_cast<std::uint8_t>((q / 3 + kv / 3) % 2);
  }
  show("dense", DenseMask<std::uint8_t>{dense.view()}, square);
  const PackedMask packed = pack_bits(DenseMask<std::uint8_t>{dense.view()}, square);
  show("dense_bits", DenseBitsMask{packed.view()}, square);

  // Combinators and per-head masks.
  show("causal_and_not_window_2_0", CausalMask{} & ~SlidingWindowMask{2, 0}, square);
  show("window_or_prefix", SlidingWindowMask{2, 2} | PrefixLMMask{.prefix = 4}, square);
  const std::vector<SlidingWindowMask> heads{SlidingWindowMask{1, 0}, SlidingWindowMask{8, 0}};
  show("per_head_1_of_2", PerHeadMask<SlidingWindowMask>{heads}, square, 1);

  // Any predicate (batch, head, q, kv) -> bool, as flex_attention's mask_mod:
  // here causal attention to every third key plus the last four.
  show("mask_mod_dilated_causal",
       mask_mod([](index_t, index_t, index_t q, index_t kv) { return kv <= q && (kv % 3 == 0 || q - kv < 4); }),
       square);

  std::printf("SVG pictures written to %s/\n", out_dir.c_str());
  return 0;
}
