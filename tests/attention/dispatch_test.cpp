// The compiled runtime-dispatch entry points (seqattn::dispatch). They live in
// a separate library, so this file only has tests when the build links it
// and defines SEQATTN_TEST_DISPATCH (see tests/CMakeLists.txt).
#if defined(SEQATTN_TEST_DISPATCH)
#include "seqattn/dispatch.hpp"

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_dispatch_test {

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

// The full header-only API on the dispatched backend: plan from any mask
// description, forward with the compiled variants on Serial and a pool, backward.
TEST_CASE("dispatch: backends::Dispatched works with plan_attention, forward and backward", "[attention][dispatch]") {
  static_assert(AttentionBackend<backends::Dispatched>);
  static_assert(BackwardBackend<backends::Dispatched>);
  std::mt19937 rng(52);
  const auto q = random_tensor<float>({1, 150, 6, 72}, rng);
  const auto k = random_tensor<float>({1, 150, 2, 72}, rng);
  const auto v = random_tensor<float>({1, 150, 2, 72}, rng);
  const auto dout = random_tensor<float>({1, 150, 6, 72}, rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  const auto mask = CausalMask{} & ~SlidingWindowMask{0, 0};  // causal without the diagonal: row 0 sees nothing
  PlanOptions options;
  options.backward = true;
  const std::vector<float> sink_logits{0.5f, -1, 0, 1, 2, -2};
  const variants::Standard variant{0.1f, {20.0f}, {sink_logits}};

  auto run = [&]<class Backend>(auto& exec, int workers) {
    const auto plan = plan_attention<Backend>(shape_of(in), mask, options, workers);
    Tensor<float> out({1, 150, 6, 72}), lse({1, 6, 150}), dq({1, 150, 6, 72}), dk({1, 150, 2, 72}), dv({1, 150, 2, 72});
    attention_forward(plan, in, out.view(), lse.view(), variant, exec);
    std::vector<float> dsinks(6);
    attention_backward(plan, in, out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view(), dsinks},
                       variant, exec);
    return std::tuple{std::move(out), std::move(lse), std::move(dq), std::move(dk), std::move(dv)};
  };
  execution::Serial serial;
  const auto [want_out, want_lse, want_dq, want_dk, want_dv] = run.operator()<backends::Reference>(serial, 1);
  execution::ThreadPool pool(2);
  for (int use_pool : {0, 1}) {
    const auto [out, lse, dq, dk, dv] = use_pool ? run.operator()<backends::Dispatched>(pool, pool.workers())
                                                 : run.operator()<backends::Dispatched>(serial, 1);
    CHECK(compare(out, want_out).relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
    CHECK(compare(dq, want_dq).relative() <= 2e-4);
    CHECK(compare(dk, want_dk).relative() <= 2e-4);
    CHECK(compare(dv, want_dv).relative() <= 2e-4);
  }

  // The one-call forward plans with the dispatched backend too.
  Tensor<float> out({1, 150, 6, 72}), lse({1, 6, 150});
  AttentionOptions one_call;
  one_call.scale = 0.1f;
  one_call.softcap = 20.0f;
  one_call.sinks = sink_logits;
  attention_forward<backends::Dispatched>(in, mask, out.view(), lse.view(), one_call, pool);
  CHECK(compare(out, want_out).relative() <= 1e-5);
}
// Every compiled target this CPU runs, through the whole engine: the CPU's
// best is what the other tests see; the rest are selected one at a time.
TEST_CASE("dispatch: every available target runs forward and backward", "[attention][dispatch]") {
  const std::vector<std::string> targets = dispatch::available_simd_targets();
  REQUIRE_FALSE(targets.empty());
  CHECK(targets.front() == dispatch::best_simd_target());
  std::mt19937 rng(53);
  const auto q = random_tensor<float>({1, 203, 4, 80}, rng);
  const auto k = random_tensor<float>({1, 203, 2, 80}, rng);
  const auto v = random_tensor<float>({1, 203, 2, 80}, rng);
  const auto dout = random_tensor<float>({1, 203, 4, 80}, rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  const TestDocumentMask mask{{37, 0, 5, 90, 0, 71}};
  PlanOptions options;
  options.backward = true;
  const variants::Standard variant{0.2f, {15.0f}, {}};
  auto run = [&]<class Backend>() {
    execution::ThreadPool pool(2);
    const auto plan = plan_attention<Backend>(shape_of(in), mask, options, pool.workers());
    Tensor<float> out(q.shape()), lse({1, 4, 203}), dq(q.shape()), dk(k.shape()), dv(v.shape());
    attention_forward(plan, in, out.view(), lse.view(), variant, pool);
    attention_backward(plan, in, out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()}, variant, pool);
    return std::tuple{std::move(out), std::move(lse), std::move(dq), std::move(dk), std::move(dv)};
  };
  const auto [want_out, want_lse, want_dq, want_dk, want_dv] = run.operator()<backends::Reference>();
  for (const std::string& target : targets) {
    INFO("target " << target);
    dispatch::use_simd_target_for_test(target);
    CHECK(dispatch::best_simd_target() == target);
    const auto [out, lse, dq, dk, dv] = run.operator()<backends::Dispatched>();
    CHECK(compare(out, want_out).relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
    CHECK(compare(dq, want_dq).relative() <= 2e-4);
    CHECK(compare(dk, want_dk).relative() <= 2e-4);
    CHECK(compare(dv, want_dv).relative() <= 2e-4);
  }
  dispatch::use_simd_target_for_test("");
  CHECK(dispatch::best_simd_target() == targets.front());
  CHECK_THROWS_WITH(dispatch::use_simd_target_for_test("NEON"),
                    Catch::Matchers::Contains("'NEON' is not one of the targets compiled in"));
}

}  // namespace seqattn_test_attention_dispatch_test
#endif  // SEQATTN_TEST_DISPATCH
