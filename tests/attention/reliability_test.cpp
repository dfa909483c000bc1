// Issue 21, the single-process engine under hostile input: a one-head
// BlockMask broadcast over more heads, null and overlapping gradients and
// outputs, paged inputs with missing data or a page size near INT64_MAX, a
// worker count whose task arithmetic would wrap, non-finite sink logits.
// Every case must end in seqattn::invalid_argument naming the argument,
// raised before anything is written, on every backend.
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

#if defined(SEQATTN_TEST_DISPATCH)
#include "seqattn/dispatch.hpp"
#define SEQATTN_RELIABILITY_BACKENDS backends::Highway, backends::Scalar, backends::Reference, backends::Dispatched
#else
#define SEQATTN_RELIABILITY_BACKENDS backends::Highway, backends::Scalar, backends::Reference
#endif

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_reliability_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// BSHD attention with its forward results and an upstream gradient.
struct BackwardCase {
  static constexpr index_t kBatch = 1, kSeq = 40, kHeads = 4, kKvHeads = 2, kDim = 16;
  Extents q_shape{kBatch, kSeq, kHeads, kDim}, kv_shape{kBatch, kSeq, kKvHeads, kDim}, lse_shape{kBatch, kHeads, kSeq};
  std::mt19937 rng{21};
  Tensor<float> q = random_tensor<float>(q_shape, rng), k = random_tensor<float>(kv_shape, rng),
                v = random_tensor<float>(kv_shape, rng), dout = random_tensor<float>(q_shape, rng);
  Tensor<float> out{q_shape}, lse{lse_shape};
  Tensor<float> dq{q_shape}, dk{kv_shape}, dv{kv_shape};

  AttentionInputs<float> in() const { return {q.view(), k.view(), v.view()}; }

  template <class Backend>
  AttentionPlan<Backend> plan() {
    PlanOptions options;
    options.backward = true;
    auto p = plan_attention<Backend>(shape_of(in()), CausalMask{}, options);
    attention_forward(p, in(), out.view(), lse.view());
    return p;
  }
};

// The same bytes as `t`, under another shape (a result aliasing an input).
TensorView<float> alias(const Tensor<float>& t, const Extents& shape) {
  return TensorView<float>(const_cast<float*>(t.data()), shape);
}

}  // namespace

// ---- 23: a prebuilt BlockMask of one head -----------------------------------

TEMPLATE_TEST_CASE("issue 21 #23: a one-head BlockMask of a head-dependent mask is not broadcast to more heads",
                   "[attention][plan][errors]", SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  const RaggedLengths lengths = RaggedLengths::uniform(1, 40, 40);
  const AttentionShape shape{Layout::bshd, lengths, 4, 2, 16, 16};
  // Built for one head, the PerHeadMask holds one mask: head 1 would read
  // past its span, and heads 1..3 would run on head 0's tiles.
  const std::vector<SlidingWindowMask> windows{SlidingWindowMask{5, 0}};
  const PerHeadMask<SlidingWindowMask> per_head{windows};
  const BlockMask one_head = build_block_mask(per_head, lengths, 1, Backend::block_shape());
  CHECK_THROWS_WITH(plan_attention<Backend>(shape, one_head),
                    ContainsSubstring("built for 1 head") && ContainsSubstring("the inputs have 4 heads"));

  // Head-invariant descriptions stored once serve any head count.
  CHECK_NOTHROW(plan_attention<Backend>(shape, build_block_mask(CausalMask{}, lengths, 1, Backend::block_shape())));
  CHECK_NOTHROW(plan_attention<Backend>(shape, build_block_mask(CausalMask{}, lengths, 4, Backend::block_shape())));
  CHECK_NOTHROW(
      plan_attention<Backend>(shape, build_block_mask(AnyMask(CausalMask{}), lengths, 1, Backend::block_shape())));
  // A head-dependent mask built for the inputs' heads is fine.
  const std::vector<SlidingWindowMask> four(4, SlidingWindowMask{5, 0});
  CHECK_NOTHROW(plan_attention<Backend>(
      shape, build_block_mask(PerHeadMask<SlidingWindowMask>{four}, lengths, 4, Backend::block_shape())));
}

TEST_CASE("issue 21 #23: the one-call API refuses the broadcast too", "[attention][plan][errors]") {
  std::mt19937 rng(23);
  const auto q = random_tensor<float>({1, 40, 4, 16}, rng), k = random_tensor<float>({1, 40, 2, 16}, rng);
  Tensor<float> out({1, 40, 4, 16}), lse({1, 4, 40});
  const std::vector<SlidingWindowMask> windows{SlidingWindowMask{5, 0}};
  const PerHeadMask<SlidingWindowMask> per_head{windows};
  const BlockMask one_head =
      build_block_mask(per_head, RaggedLengths::uniform(1, 40, 40), 1, attention_block_shape<backends::Reference>());
  AttentionOptions options;
  options.block_mask = &one_head;
  CHECK_THROWS_WITH(attention_forward<backends::Reference>(AttentionInputs<float>{q.view(), k.view(), k.view()},
                                                           per_head, out.view(), lse.view(), options),
                    ContainsSubstring("built for 1 head"));
}

// ---- 24: gradients without data ---------------------------------------------

TEMPLATE_TEST_CASE("issue 21 #24: null dq, dk, dv or dout is rejected, not dereferenced",
                   "[attention][backward][errors]", SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  BackwardCase c;
  const auto plan = c.template plan<Backend>();
  const TensorView<float> null_q(nullptr, c.q_shape), null_kv(nullptr, c.kv_shape);
  auto backward = [&](TensorView<const float> dout, TensorView<float> dq, TensorView<float> dk, TensorView<float> dv) {
    attention_backward(plan, c.in(), c.out.view(), c.lse.view(), dout, dq, dk, dv);
  };
  SECTION("dq") {
    CHECK_THROWS_WITH(backward(c.dout.view(), null_q, c.dk.view(), c.dv.view()), ContainsSubstring("dq has no data"));
  }
  SECTION("dk") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), null_kv, c.dv.view()), ContainsSubstring("dk has no data"));
  }
  SECTION("dv") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), c.dk.view(), null_kv), ContainsSubstring("dv has no data"));
  }
  SECTION("dout") {
    CHECK_THROWS_WITH(backward(TensorView<const float>(nullptr, c.q_shape), c.dq.view(), c.dk.view(), c.dv.view()),
                      ContainsSubstring("dout has no data"));
  }
}

// ---- 33: results that share memory with inputs or with each other ----------

TEMPLATE_TEST_CASE("issue 21 #33: gradients that overlap an input or each other are rejected",
                   "[attention][backward][errors]", SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  BackwardCase c;
  const auto plan = c.template plan<Backend>();
  auto backward = [&](TensorView<const float> dout, TensorView<float> dq, TensorView<float> dk, TensorView<float> dv) {
    attention_backward(plan, c.in(), c.out.view(), c.lse.view(), dout, dq, dk, dv);
  };
  const Tensor<float> dk_before = c.dk;
  SECTION("dk over k") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), alias(c.k, c.kv_shape), c.dv.view()),
                      ContainsSubstring("dk (1, 40, 2, 16)") && ContainsSubstring("and k (1, 40, 2, 16)"));
  }
  SECTION("dv over v") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), c.dk.view(), alias(c.v, c.kv_shape)),
                      ContainsSubstring("dv (1, 40, 2, 16)") && ContainsSubstring("and v "));
  }
  SECTION("dq over dout") {
    CHECK_THROWS_WITH(backward(c.dout.view(), alias(c.dout, c.q_shape), c.dk.view(), c.dv.view()),
                      ContainsSubstring("dq ") && ContainsSubstring("and dout "));
  }
  SECTION("dq over q") {
    CHECK_THROWS_WITH(backward(c.dout.view(), alias(c.q, c.q_shape), c.dk.view(), c.dv.view()),
                      ContainsSubstring("dq ") && ContainsSubstring("and q "));
  }
  SECTION("dv over the forward output") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), c.dk.view(), alias(c.out, c.kv_shape)),
                      ContainsSubstring("dv ") && ContainsSubstring("and out "));
  }
  SECTION("dq over lse, in part") {
    Tensor<float> big(Extents{c.q.size() + c.lse.size()});
    const TensorView<const float> lse(big.data(), c.lse_shape);
    std::memcpy(big.data(), c.lse.data(), static_cast<std::size_t>(c.lse.size()) * sizeof(float));
    const TensorView<float> dq(big.data() + c.lse.size() / 2, c.q_shape);
    CHECK_THROWS_WITH(attention_backward(plan, c.in(), c.out.view(), lse, c.dout.view(), dq, c.dk.view(), c.dv.view()),
                      ContainsSubstring("dq ") && ContainsSubstring("and lse "));
  }
  SECTION("dq and dk in one buffer") {
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), alias(c.dq, c.kv_shape), c.dv.view()),
                      ContainsSubstring("dq ") && ContainsSubstring("dk "));
  }
  SECTION("dk and dv overlapping by one element") {
    Tensor<float> both(Extents{2 * c.dk.size() - 1});
    const TensorView<float> dk(both.data(), c.kv_shape), dv(both.data() + c.dk.size() - 1, c.kv_shape);
    CHECK_THROWS_WITH(backward(c.dout.view(), c.dq.view(), dk, dv),
                      ContainsSubstring("dk ") && ContainsSubstring("dv "));
  }
  SECTION("dq with a zero stride writes one row many times") {
    const TensorView<float> dq(c.dq.data(), c.q_shape, Strides{0, 0, c.q_shape[3], 1});
    CHECK_THROWS_WITH(backward(c.dout.view(), dq, c.dk.view(), c.dv.view()),
                      ContainsSubstring("dq ") && ContainsSubstring("overlap"));
  }
  // Nothing was written before the error.
  CHECK(std::memcmp(c.dk.data(), dk_before.data(), static_cast<std::size_t>(c.dk.size()) * sizeof(float)) == 0);
}

TEMPLATE_TEST_CASE("issue 21 #33: forward outputs that overlap an input are rejected", "[attention][errors]",
                   SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  BackwardCase c;
  const auto plan = plan_attention<Backend>(shape_of(c.in()), CausalMask{});
  SECTION("out over q") {
    CHECK_THROWS_WITH(attention_forward(plan, c.in(), alias(c.q, c.q_shape), c.lse.view()),
                      ContainsSubstring("out (1, 40, 4, 16)") && ContainsSubstring("and q (1, 40, 4, 16)"));
  }
  SECTION("lse over k") {
    CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), alias(c.k, c.lse_shape)),
                      ContainsSubstring("lse ") && ContainsSubstring("and k "));
  }
  SECTION("out and lse in one buffer") {
    CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), alias(c.out, c.lse_shape)),
                      ContainsSubstring("out ") && ContainsSubstring("lse "));
  }
}

TEST_CASE("issue 21 #33: interleaved results in one buffer are accepted and exact", "[attention][backward]") {
  // q, k and v, and dq, dk and dv, each packed as [B, S, 3, H, D] (a fused
  // projection's layout): the views interleave without sharing an element.
  constexpr index_t kB = 2, kS = 33, kH = 2, kD = 16;
  std::mt19937 rng(33);
  const auto qkv = random_tensor<float>({kB, kS, 3, kH, kD}, rng);
  const auto dout = random_tensor<float>({kB, kS, kH, kD}, rng);
  const Extents shape{kB, kS, kH, kD};
  const Strides packed{kS * 3 * kH * kD, 3 * kH * kD, kD, 1};
  auto part = [&](float* base, index_t i) { return TensorView<float>(base + i * kH * kD, shape, packed); };
  const AttentionInputs<float> in{part(const_cast<float*>(qkv.data()), 0), part(const_cast<float*>(qkv.data()), 1),
                                  part(const_cast<float*>(qkv.data()), 2)};
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, options);
  Tensor<float> out(shape), lse({kB, kH, kS});
  attention_forward(plan, in, out.view(), lse.view());

  Tensor<float> dq(shape), dk(shape), dv(shape);
  attention_backward(plan, in, out.view(), lse.view(), dout.view(), dq.view(), dk.view(), dv.view());
  Tensor<float> dqkv({kB, kS, 3, kH, kD});
  attention_backward(plan, in, out.view(), lse.view(), dout.view(), part(dqkv.data(), 0), part(dqkv.data(), 1),
                     part(dqkv.data(), 2));
  for (index_t b = 0; b < kB; ++b) {
    for (index_t s = 0; s < kS; ++s) {
      for (index_t h = 0; h < kH; ++h) {
        for (index_t d = 0; d < kD; ++d) {
          REQUIRE(dqkv(b, s, 0, h, d) == dq(b, s, h, d));
          REQUIRE(dqkv(b, s, 1, h, d) == dk(b, s, h, d));
          REQUIRE(dqkv(b, s, 2, h, d) == dv(b, s, h, d));
        }
      }
    }
  }
}

// ---- 25, 26: paged inputs ----------------------------------------------------

TEST_CASE("issue 21 #25: paged THD cu_seqlens_q with a shape but no data is rejected", "[attention][paged][errors]") {
  std::vector<float> q(2 * 4, 0.5f), pages(2 * 4 * 4, 0.25f);
  const std::vector<std::int32_t> table{0, 1}, lens{3, 2};
  const PagedAttentionInputs<float> in{TensorView<const float>(q.data(), Extents{2, 1, 4}),
                                       {TensorView<const float>(pages.data(), Extents{2, 4, 1, 4}),
                                        TensorView<const float>(pages.data(), Extents{2, 4, 1, 4}),
                                        TensorView<const std::int32_t>(table.data(), Extents{2, 1}),
                                        TensorView<const std::int32_t>(lens.data(), Extents{2})},
                                       TensorView<const std::int32_t>(nullptr, Extents{3})};
  CHECK_THROWS_WITH(shape_of(in), ContainsSubstring("cu_seqlens_q has no data"));
}

TEST_CASE("issue 21 #26: a page size near INT64_MAX still validates the block table", "[attention][paged][errors]") {
  // One key head of dim 1, so that the page extent can be huge and the view's
  // size still fit in 64 bits.
  constexpr index_t kPageSize = std::numeric_limits<index_t>::max() - 2;
  std::vector<float> q{0.5f}, pages(8, 0.25f);
  std::vector<std::int32_t> table{7};
  const std::vector<std::int32_t> lens{5};
  auto inputs = [&] {
    return PagedAttentionInputs<float>{TensorView<const float>(q.data(), Extents{1, 1, 1, 1}),
                                       {TensorView<const float>(pages.data(), Extents{1, kPageSize, 1, 1}),
                                        TensorView<const float>(pages.data(), Extents{1, kPageSize, 1, 1}),
                                        TensorView<const std::int32_t>(table.data(), Extents{1, 1}),
                                        TensorView<const std::int32_t>(lens.data(), Extents{1})}};
  };
  CHECK_THROWS_WITH(shape_of(inputs()), ContainsSubstring("block_table[0][0] = 7 is not a page"));
  table[0] = 0;  // one page holds all 5 keys
  const AttentionShape shape = shape_of(inputs());
  CHECK(shape.kv_len(0) == 5);
}

// ---- 29: worker counts -------------------------------------------------------

TEMPLATE_TEST_CASE("issue 21 #29: plan_attention bounds workers by limits::kMaxThreads", "[attention][plan][errors]",
                   SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  const AttentionShape shape{Layout::bshd, RaggedLengths::uniform(2, 1, 300), 8, 2, 64, 64};
  CHECK_THROWS_WITH(plan_attention<Backend>(shape, CausalMask{}, {}, std::numeric_limits<int>::max()),
                    ContainsSubstring("workers must be at most 4096 (limits::kMaxThreads), got 2147483647"));
  CHECK_THROWS_WITH(plan_attention<Backend>(shape, CausalMask{}, {}, limits::kMaxThreads + 1),
                    ContainsSubstring("limits::kMaxThreads"));
  CHECK_NOTHROW(plan_attention<Backend>(shape, CausalMask{}, {}, limits::kMaxThreads));
}

// ---- 32: sink logits ---------------------------------------------------------

TEMPLATE_TEST_CASE("issue 21 #32: non-finite sink logits are rejected like scale and softcap", "[attention][errors]",
                   SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  // A plain loop, not GENERATE: Catch2 v2's GENERATE of these constants read
  // back garbage (a finite 5e-24) in optimized builds.
  for (const float bad : {kNaN, kInf, -kInf}) {
    CAPTURE(bad);
    BackwardCase c;
    const std::vector<float> sinks{0.0f, bad, 1.0f, 2.0f};
    const auto plan = c.template plan<Backend>();
    const auto message = ContainsSubstring("sink logit of head 1 must be finite");
    CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), c.lse.view(), variants::Sinks{sinks}), message);
    CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), c.lse.view(),
                                        variants::Standard{kNaN, {}, variants::Sinks{sinks}}),
                      message);
    CHECK_THROWS_WITH(attention_backward(plan, c.in(), c.out.view(), c.lse.view(), c.dout.view(),
                                         AttentionGrads<float>{c.dq.view(), c.dk.view(), c.dv.view()},
                                         variants::Sinks{sinks}, execution::Serial{}),
                      message);
    AttentionOptions options;
    options.sinks = sinks;
    CHECK_THROWS_WITH(attention_forward<Backend>(c.in(), CausalMask{}, c.out.view(), c.lse.view(), options), message);
  }
}

TEST_CASE("issue 21 #32: a custom variant's sinks are checked too", "[attention][errors]") {
  struct NaNSinkOnHead2 {
    float sink(index_t head) const { return head == 2 ? kNaN : 0.0f; }
  };
  BackwardCase c;
  const auto plan = c.plan<backends::Highway>();
  CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), c.lse.view(), NaNSinkOnHead2{}),
                    ContainsSubstring("sink logit of head 2 must be finite, got nan"));
  CHECK_THROWS_WITH(attention_forward(plan, c.in(), c.out.view(), c.lse.view(),
                                      variants::chain(variants::Scale{0.5f}, NaNSinkOnHead2{})),
                    ContainsSubstring("head 2"));
}

// ---- The overlap test itself ---------------------------------------------------

TEST_CASE("require_disjoint: views conflict only when an element shares a byte", "[attention][errors]") {
  using detail::footprint;
  std::vector<float> buf(4 * 6 * 8);
  float* p = buf.data();
  auto disjoint = [](const detail::MemoryFootprint& a, const detail::MemoryFootprint& b) {
    try {
      detail::require_disjoint("test", a, b);
      return true;
    } catch (const invalid_argument&) {
      return false;
    }
  };
  const TensorView<float> whole(p, Extents{4, 6, 8});
  CHECK_FALSE(disjoint(footprint("a", whole), footprint("b", whole)));
  // Halves of one buffer, and the same halves off by one element.
  CHECK(disjoint(footprint("a", TensorView<float>(p, Extents{96})),
                 footprint("b", TensorView<float>(p + 96, Extents{96}))));
  CHECK_FALSE(disjoint(footprint("a", TensorView<float>(p, Extents{97})),
                       footprint("b", TensorView<float>(p + 96, Extents{96}))));
  // Even and odd elements interleave without sharing one; shifted by two they do.
  const Strides two{2};
  CHECK(disjoint(footprint("a", TensorView<float>(p, Extents{96}, two)),
                 footprint("b", TensorView<float>(p + 1, Extents{96}, two))));
  CHECK_FALSE(disjoint(footprint("a", TensorView<float>(p, Extents{96}, two)),
                       footprint("b", TensorView<float>(p + 2, Extents{95}, two))));
  // Columns 0..3 and 4..7 of every row; and columns 0..4 against 4..7.
  const Strides rows{8, 1};
  CHECK(disjoint(footprint("a", TensorView<float>(p, Extents{24, 4}, rows)),
                 footprint("b", TensorView<float>(p + 4, Extents{24, 4}, rows))));
  CHECK_FALSE(disjoint(footprint("a", TensorView<float>(p, Extents{24, 5}, rows)),
                       footprint("b", TensorView<float>(p + 4, Extents{24, 4}, rows))));
  // A transposed view of the same bytes, and a reversed one (negative stride).
  CHECK_FALSE(disjoint(footprint("a", TensorView<float>(p, Extents{8, 24}, Strides{1, 8})), footprint("b", whole)));
  CHECK_FALSE(disjoint(footprint("a", TensorView<float>(p + 191, Extents{10}, Strides{-1})),
                       footprint("b", TensorView<float>(p + 185, Extents{1}))));
  CHECK(disjoint(footprint("a", TensorView<float>(p + 191, Extents{10}, Strides{-1})),
                 footprint("b", TensorView<float>(p + 181, Extents{1}))));
  // Bytes, not elements: a float and the byte view inside it.
  const auto* bytes = reinterpret_cast<const unsigned char*>(p + 10);
  CHECK_FALSE(disjoint(footprint("a", TensorView<const unsigned char>(bytes + 3, Extents{1})),
                       footprint("b", TensorView<float>(p + 10, Extents{1}))));
  // Empty views and views without data cover nothing.
  CHECK(disjoint(footprint("a", TensorView<float>(p, Extents{0, 8})), footprint("b", whole)));
  CHECK(disjoint(footprint("a", TensorView<float>(nullptr, Extents{0})), footprint("b", whole)));
  // Written views are checked against each other and for repeated elements.
  const std::vector<float> other(8);
  CHECK_THROWS_WITH(detail::require_disjoint("call",
                                             {footprint("x", TensorView<float>(p, Extents{8})),
                                              footprint("y", TensorView<float>(p + 7, Extents{8}))},
                                             {footprint("in", std::span<const float>(other))}),
                    ContainsSubstring("call: x (8,) and y (8,) overlap in memory"));
  CHECK_THROWS_WITH(
      detail::require_disjoint("call", {footprint("x", TensorView<float>(p, Extents{4, 8}, Strides{0, 1}))}, {}),
      ContainsSubstring("x (4, 8) with strides (0, 1) has elements that overlap"));
  CHECK_NOTHROW(detail::require_disjoint("call", {footprint("x", TensorView<float>(p, Extents{8}))},
                                         {footprint("in", std::span<const float>(other))}));
}

// ---- fuzz_plan: THD segments that share tokens ------------------------------

// Two segments over one packed buffer of 24 tokens, 2 heads, dim 8. Segment
// ranges are given per test; the kv ranges of the second may overlap the first.
struct SharedTokensCase {
  static constexpr index_t kTokens = 24, kHeads = 2, kDim = 8;
  Extents shape{kTokens, kHeads, kDim}, lse_shape{kHeads, kTokens};
  std::mt19937 rng{29};
  Tensor<float> q = random_tensor<float>(shape, rng), k = random_tensor<float>(shape, rng),
                v = random_tensor<float>(shape, rng), dout = random_tensor<float>(shape, rng);
  Tensor<float> out{shape}, lse{lse_shape}, dq{shape}, dk{shape}, dv{shape};
  std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;
  SegmentTable table() const { return {q_offsets, q_lens, kv_offsets, kv_lens}; }
};

TEMPLATE_TEST_CASE("issue 21 (fuzz_plan): segments sharing query rows, or key rows in backward, are rejected",
                   "[attention][backward][errors]", SEQATTN_RELIABILITY_BACKENDS) {
  using Backend = TestType;
  SharedTokensCase c;
  PlanOptions options;
  options.backward = true;
  SECTION("query rows shared by two segments: both would write the same outputs") {
    c.q_offsets = {0, 8}, c.q_lens = {12, 12}, c.kv_offsets = {0, 12}, c.kv_lens = {12, 12};
    const SegmentTable t = c.table();
    const AttentionInputs<float> in{c.q.view(), c.k.view(), c.v.view(), &t};
    auto plan = plan_attention<Backend>(shape_of(in), CausalMask{}, options);
    CHECK_THROWS_WITH(attention_forward(plan, in, c.out.view(), c.lse.view()),
                      ContainsSubstring("segments overlap on the query axis: tokens [0, 12) and [8, 20)"));
  }
  SECTION("key rows shared by two segments: the forward pass reads them, the backward pass refuses") {
    // Listed out of order, so the sorting path finds the overlap.
    c.q_offsets = {12, 0}, c.q_lens = {12, 12}, c.kv_offsets = {4, 0}, c.kv_lens = {20, 12};
    const SegmentTable t = c.table();
    const AttentionInputs<float> in{c.q.view(), c.k.view(), c.v.view(), &t};
    auto plan = plan_attention<Backend>(shape_of(in), CausalMask{}, options);
    CHECK_NOTHROW(attention_forward(plan, in, c.out.view(), c.lse.view()));
    const std::vector<float> dk_before(c.dk.data(), c.dk.data() + c.dk.size());
    CHECK_THROWS_WITH(
        attention_backward(plan, in, c.out.view(), c.lse.view(), c.dout.view(), c.dq.view(), c.dk.view(), c.dv.view()),
        ContainsSubstring("attention_backward: segments 0 and 1 share key/value tokens"));
    CHECK(std::memcmp(dk_before.data(), c.dk.data(), dk_before.size() * sizeof(float)) == 0);
  }
  SECTION("empty segments and adjacent ranges share nothing") {
    c.q_offsets = {0, 12, 12}, c.q_lens = {12, 0, 12}, c.kv_offsets = {0, 5, 12}, c.kv_lens = {12, 0, 12};
    const SegmentTable t = c.table();
    const AttentionInputs<float> in{c.q.view(), c.k.view(), c.v.view(), &t};
    auto plan = plan_attention<Backend>(shape_of(in), CausalMask{}, options);
    attention_forward(plan, in, c.out.view(), c.lse.view());
    CHECK_NOTHROW(
        attention_backward(plan, in, c.out.view(), c.lse.view(), c.dout.view(), c.dq.view(), c.dk.view(), c.dv.view()));
  }
}

}  // namespace seqattn_test_attention_reliability_test
