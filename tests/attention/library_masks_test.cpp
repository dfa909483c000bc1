// The engine against the reference with every mask description of
// seqattn/masks (structural, document, multi-item, top-k, dense, combinators,
// per-head), consumed through their BlockMasks.
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_library_masks_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

constexpr index_t kBatch = 2, kLen = 150, kHeads = 4, kKvHeads = 2, kDim = 80;

template <class T>
struct Inputs {
  Tensor<T> q, k, v;
  explicit Inputs(std::mt19937& rng, index_t len = kLen)
      : q(random_tensor<T>(detail::make_extents({kBatch, len, kHeads, kDim}), rng)),
        k(random_tensor<T>(detail::make_extents({kBatch, len, kKvHeads, kDim}), rng)),
        v(random_tensor<T>(detail::make_extents({kBatch, len, kKvHeads, kDim}), rng)) {}
  AttentionInputs<T> in() const { return {q.view(), k.view(), v.view()}; }
};

// Highway on 2 workers and Scalar on 3 against the reference.
template <class M>
void check_mask(const Inputs<float>& x, const M& mask) {
  const index_t len = x.q.extent(1);
  const Extents out_shape = detail::make_extents({kBatch, len, kHeads, kDim});
  const Extents lse_shape = detail::make_extents({kBatch, kHeads, len});
  Tensor<float> want(out_shape), out(out_shape);
  Tensor<float> want_lse(lse_shape), lse(lse_shape);
  attention_forward<backends::Reference>(x.in(), mask, want.view(), want_lse.view());
  execution::ThreadPool two(2), three(3);
  attention_forward<backends::Highway>(x.in(), mask, out.view(), lse.view(), {}, two);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);
  attention_forward<backends::Scalar>(x.in(), mask, out.view(), lse.view(), {}, three);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);
}

}  // namespace

TEST_CASE("library masks: structural kinds", "[attention][masks]") {
  std::mt19937 rng(61);
  const Inputs<float> x(rng);
  SECTION("sliding window") {
    check_mask(x, SlidingWindowMask{40, 0});
    check_mask(x, SlidingWindowMask{10, 25, Alignment::bottom_right});
  }
  SECTION("chunked causal") { check_mask(x, ChunkedCausalMask{48}); }
  SECTION("prefix-LM") {
    const std::vector<std::int32_t> prefixes{70, 3};
    check_mask(x, PrefixLMMask{.prefix_lengths = prefixes});
  }
  SECTION("combinators") {
    check_mask(x, ChunkedCausalMask{64} | SlidingWindowMask{20, 0});
    check_mask(x, CausalMask{} & ~SlidingWindowMask{5, 0});  // a band cut out, rows 0..5 see nothing
  }
  SECTION("per-head masks") {
    const std::vector<SlidingWindowMask> per_head{{3, 0}, {kUnbounded, 0}, {30, 30}, {0, 0}};
    check_mask(x, PerHeadMask<SlidingWindowMask>{per_head});
  }
}

TEST_CASE("library masks: data-driven kinds", "[attention][masks]") {
  std::mt19937 rng(67);
  const Inputs<float> x(rng);
  SECTION("documents (segment ids with padding), causal inside each") {
    std::vector<std::int32_t> ids;
    for (index_t b = 0; b < kBatch; ++b) {
      std::int32_t id = 1;
      index_t left = 0;
      for (index_t t = 0; t < kLen; ++t) {
        if (left == 0) {
          left = std::uniform_int_distribution<index_t>(1, 60)(rng);
          ++id;
        }
        --left;
        ids.push_back(t >= kLen - 7 && b == 1 ? 0 : id);  // trailing padding on row 1
      }
    }
    const DocumentLayout layout =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{kBatch, kLen}));
    check_mask(x, document_mask(layout, CausalMask{}));
    check_mask(x, document_mask(layout));
  }
  SECTION("top-k of random scores, AND causal") {
    std::vector<float> scores(static_cast<std::size_t>(kBatch * kLen * kLen));
    std::normal_distribution<float> dist;
    for (float& s : scores) s = dist(rng);
    const Tensor<std::int32_t> idx = top_k(TensorView<const float>(scores.data(), Extents{kBatch, kLen, kLen}), 24);
    const TopKLayout layout = TopKLayout::from_indices(idx.view(), kLen);
    check_mask(x, topk_mask(layout) & CausalMask{});
  }
  SECTION("dense and bit-packed masks") {
    const TestRandomDenseMask random{5, 0.35f};
    const RaggedLengths lengths = RaggedLengths::uniform(kBatch, kLen, kLen);
    const Tensor<std::uint8_t> dense = to_dense(random, lengths, kHeads);
    check_mask(x, DenseMask<std::uint8_t>{dense.view()});
    const PackedMask packed = pack_bits(random, lengths, kHeads);
    check_mask(x, DenseBitsMask{packed.view()});
  }
}

TEST_CASE("library masks: multi-item requests in a packed THD batch", "[attention][masks][thd]") {
  std::mt19937 rng(71);
  MultiItemLayout layout;
  layout.add_items(20, std::vector<index_t>{7, 0, 30, 12});
  layout.add_items(5, std::vector<index_t>{40});
  layout.add_items(9, std::vector<index_t>{1, 2, 3});
  const RaggedLengths lengths = layout.lengths();
  std::vector<std::int32_t> offsets, lens;
  index_t tokens = 0;
  for (index_t b = 0; b < lengths.batch(); ++b) {
    offsets.push_back(static_cast<std::int32_t>(tokens));
    lens.push_back(static_cast<std::int32_t>(lengths.q[static_cast<std::size_t>(b)]));
    tokens += lengths.q[static_cast<std::size_t>(b)];
  }
  const SegmentTable table{offsets, lens, offsets, lens};
  const auto q = random_tensor<float>(detail::make_extents({tokens, 8, 64}), rng);
  const auto k = random_tensor<float>(detail::make_extents({tokens, 1, 64}), rng);
  const auto v = random_tensor<float>(detail::make_extents({tokens, 1, 64}), rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view(), &table};
  const MultiItemMask mask = multi_item_mask(layout);
  Tensor<float> want(detail::make_extents({tokens, 8, 64})), out(want.shape());
  Tensor<float> want_lse(detail::make_extents({8, tokens})), lse(want_lse.shape());
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view());
  execution::ThreadPool pool(2);
  attention_forward(in, mask, out.view(), lse.view(), {}, pool);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);
}

}  // namespace seqattn_test_attention_library_masks_test
