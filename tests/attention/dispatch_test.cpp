// The compiled runtime-dispatch entry points (seqattn::dispatch). They live in
// a separate library, so this file only has tests when the build links it
// and defines SEQATTN_TEST_DISPATCH (see tests/CMakeLists.txt).
#if defined(SEQATTN_TEST_DISPATCH)
#include "seqattn/dispatch.hpp"

#include <random>
#include <vector>

#include "attention_test_support.hpp"

using namespace seqattn;
using namespace seqattn::testing;

TEST_CASE("dispatch: runtime-selected kernels match the reference", "[attention][dispatch]") {
  INFO("dispatched target " << dispatch::best_simd_target());
  std::mt19937 rng(51);
  const auto q = random_tensor<float>({2, 90, 8, 80}, rng);
  const auto k = random_tensor<float>({2, 140, 2, 80}, rng);
  const auto v = random_tensor<float>({2, 140, 2, 80}, rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  const TestPerHeadWindowMask mask{30};
  Tensor<float> want({2, 90, 8, 80}), out({2, 90, 8, 80});
  Tensor<float> want_lse({2, 8, 90}), lse({2, 8, 90});
  const std::vector<float> sinks{0, 1, 2, 3, 4, 5, 6, 7};
  AttentionOptions options;
  options.sinks = sinks;
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view(), options);
  const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(2, 90, 140), 8, dispatch::attention_block_shape());
  dispatch::attention_forward_f32(in, bm, out.view(), lse.view(), options);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);

  // bf16 on a pool.
  Tensor<bfloat16> qb(q.shape()), kb(k.shape()), vb(v.shape());
  for (index_t i = 0; i < q.size(); ++i) qb.data()[i] = bfloat16(q.data()[i]);
  for (index_t i = 0; i < k.size(); ++i) kb.data()[i] = bfloat16(k.data()[i]);
  for (index_t i = 0; i < v.size(); ++i) vb.data()[i] = bfloat16(v.data()[i]);
  const AttentionInputs<bfloat16> in_bf16{qb.view(), kb.view(), vb.view()};
  Tensor<bfloat16> want_bf16(out.shape()), out_bf16(out.shape());
  attention_forward<backends::Reference>(in_bf16, mask, want_bf16.view(), want_lse.view(), options);
  execution::ThreadPool pool(2);
  dispatch::attention_forward_bf16(in_bf16, bm, out_bf16.view(), lse.view(), options, &pool);
  CHECK(compare(out_bf16, want_bf16).nmse() <= 5e-4);

  // Without tile bits the BlockMask's carried predicate masks the partial tiles.
  BlockMask no_bits = build_block_mask(mask, RaggedLengths::uniform(2, 90, 140), 8, dispatch::attention_block_shape(),
                                       BlockMaskOptions{false});
  REQUIRE(no_bits.has_predicate());
  REQUIRE_FALSE(no_bits.has_tile_bits());
  Tensor<float> out_no_bits(out.shape(), 7.0f);
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view(), options);
  dispatch::attention_forward_f32(in, no_bits, out_no_bits.view(), lse.view(), options);
  CHECK(compare(out_no_bits, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);

  // With neither, partial tiles cannot be masked: refused before any work.
  no_bits.set_predicate({});
  CHECK_THROWS_WITH(dispatch::attention_forward_f32(in, no_bits, out.view(), lse.view()),
                    Catch::Matchers::Contains("must have tile bits or an element predicate"));
}
#endif  // SEQATTN_TEST_DISPATCH
