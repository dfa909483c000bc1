// Segment ids as an operand of a planned call (attention/segment_ids.hpp): a
// plan of the static mask, run with each call's ids, against the reference
// backend on the document mask of the same ids (shift-invariant masks) or on
// "mask and same segment" (any mask: the operand's own meaning); forward,
// backward, bf16, GQA, decode and split-KV shapes, padding, ids that do not
// increase, NaN in a hidden segment, determinism and errors.
#include "seqattn/attention/segment_ids.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_segment_ids_test {

using namespace seqattn;
using namespace seqattn::testing;
using Catch::Matchers::Contains;

namespace {

// Packed documents of random lengths, with padding gaps (id 0) when asked,
// ids 1, 2, ... in order or shuffled.
Tensor<std::int32_t> packed_ids(std::mt19937& rng, index_t batch, index_t len, index_t max_doc, bool gaps,
                                bool shuffled) {
  Tensor<std::int32_t> ids(detail::make_extents({batch, len}), 0);
  for (index_t b = 0; b < batch; ++b) {
    std::vector<std::int32_t> order(static_cast<std::size_t>(len) + 1);
    std::iota(order.begin(), order.end(), 1);
    if (shuffled) std::shuffle(order.begin(), order.end(), rng);
    std::size_t next = 0;
    for (index_t t = 0; t < len;) {
      const index_t n = std::min(len - t, 1 + static_cast<index_t>(rng() % static_cast<unsigned>(max_doc)));
      const bool pad = gaps && rng() % 4 == 0;
      const std::int32_t id = pad ? 0 : order[next++];
      for (index_t j = 0; j < n; ++j) ids.data()[b * len + t + j] = id;
      t += n;
    }
  }
  return ids;
}

struct Call {
  Extents q_shape, kv_shape, out_shape, lse_shape;
  Tensor<float> q, k, v, dout;
  Call(std::mt19937& rng, index_t batch, index_t sq, index_t skv, index_t heads, index_t kv_heads, index_t d)
      : q_shape(detail::make_extents({batch, sq, heads, d})),
        kv_shape(detail::make_extents({batch, skv, kv_heads, d})),
        out_shape(q_shape),
        lse_shape(detail::make_extents({batch, heads, sq})),
        q(random_tensor<float>(q_shape, rng)),
        k(random_tensor<float>(kv_shape, rng)),
        v(random_tensor<float>(kv_shape, rng)),
        dout(random_tensor<float>(out_shape, rng)) {}
  AttentionInputs<float> in(const SegmentIds* ids = nullptr) const {
    return {q.view(), k.view(), v.view(), nullptr, ids};
  }
};

struct Result {
  Tensor<float> out, lse, dq, dk, dv;
};

// The operand route: a plan of `mask` alone (made once), run with `ids`.
template <class M>
Result with_operand(const Call& x, const M& mask, const SegmentIds& ids, int workers, bool backward) {
  PlanOptions options;
  options.backward = backward;
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), AnyMask(mask), options, workers);
  Result r{Tensor<float>(x.out_shape, 7.0f), Tensor<float>(x.lse_shape, 7.0f), {}, {}, {}};
  execution::ThreadPool pool(workers);
  attention_forward(plan, x.in(&ids), r.out.view(), r.lse.view(), variants::Default{}, pool);
  if (backward) {
    r.dq = Tensor<float>(x.q_shape, 7.0f);
    r.dk = Tensor<float>(x.kv_shape, 7.0f);
    r.dv = Tensor<float>(x.kv_shape, 7.0f);
    attention_backward(plan, x.in(&ids), r.out.view(), r.lse.view(), x.dout.view(), r.dq.view(), r.dk.view(),
                       r.dv.view(), pool);
  }
  return r;
}

// The reference backend on `mask` (a complete description, ids included).
template <class M>
Result reference(const Call& x, const M& mask, bool backward) {
  PlanOptions options;
  options.backward = backward;
  const auto plan = plan_attention<backends::Reference>(shape_of(x.in()), AnyMask(mask), options, 1);
  Result r{Tensor<float>(x.out_shape, 7.0f), Tensor<float>(x.lse_shape, 7.0f), {}, {}, {}};
  attention_forward(plan, x.in(), r.out.view(), r.lse.view(), variants::Default{}, execution::Serial{});
  if (backward) {
    r.dq = Tensor<float>(x.q_shape, 7.0f);
    r.dk = Tensor<float>(x.kv_shape, 7.0f);
    r.dv = Tensor<float>(x.kv_shape, 7.0f);
    attention_backward(plan, x.in(), r.out.view(), r.lse.view(), x.dout.view(), r.dq.view(), r.dk.view(), r.dv.view(),
                       execution::Serial{});
  }
  return r;
}

void check_close(const Result& got, const Result& want, bool backward) {
  CHECK(compare(got.out, want.out).relative() <= 1e-5);
  check_lse(got.lse, want.lse, 1e-5);
  if (!backward) return;
  CHECK(compare(got.dq, want.dq).relative() <= 2e-4);
  CHECK(compare(got.dk, want.dk).relative() <= 2e-4);
  CHECK(compare(got.dv, want.dv).relative() <= 2e-4);
}

Tensor<bfloat16> to_bf16(const Tensor<float>& t) {
  Tensor<bfloat16> r(t.shape());
  for (index_t i = 0; i < t.size(); ++i) r.data()[i] = from_float<bfloat16>(t.data()[i]);
  return r;
}

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

// "mask, and the query's segment is the key's" (the operand's meaning) as a
// plain predicate, for masks that are not shift-invariant and for
// cross-attention ids.
template <class M>
struct SameSegmentAnd {
  M mask;
  std::shared_ptr<const SegmentIds> ids;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return mask.allowed(ctx, q, kv) &&
           ids->q_keys(ctx.batch)[static_cast<std::size_t>(q)] == ids->kv_keys(ctx.batch)[static_cast<std::size_t>(kv)];
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

}  // namespace

TEST_CASE("segment ids refine a static plan exactly as the document mask of those ids", "[segment_ids]") {
  std::mt19937 rng(2311);
  const std::vector<AnyMask> masks = {
      AnyMask(FullMask{}),
      AnyMask(CausalMask{}),
      AnyMask(CausalMask{Alignment::bottom_right}),
      AnyMask(SlidingWindowMask{20, 3}),
      AnyMask(SlidingWindowMask{7, 0, Alignment::bottom_right}),
      AnyMask(CausalMask{} & ~SlidingWindowMask{4, 0}),
  };
  struct Shape {
    index_t batch, len, heads, kv_heads, d, max_doc;
  };
  const std::vector<Shape> shapes = {{2, 37, 4, 2, 72, 9}, {1, 257, 3, 3, 80, 70},  {3, 100, 4, 1, 16, 30},
                                     {1, 1, 2, 1, 8, 1},   {2, 130, 2, 2, 24, 200}, {1, 300, 8, 2, 32, 40}};
  int cases = 0;
  for (const Shape& s : shapes) {
    for (const bool gaps : {false, true}) {
      const Call x(rng, s.batch, s.len, s.len, s.heads, s.kv_heads, s.d);
      const Tensor<std::int32_t> raw = packed_ids(rng, s.batch, s.len, s.max_doc, gaps, /*shuffled=*/gaps);
      const SegmentIds ids = SegmentIds::from_segment_ids(raw.view());
      for (const AnyMask& mask : masks) {
        INFO("shape " << s.batch << "x" << s.len << " heads " << s.heads << "/" << s.kv_heads << " d " << s.d
                      << " gaps " << gaps << " case " << cases);
        REQUIRE(ids.same_as_document_mask(mask, shape_of(x.in())));
        const Result want = reference(x, AnyMask(document_mask(ids.layout(), mask)), true);
        const Result got = with_operand(x, mask, ids, 2, true);
        check_close(got, want, true);
        ++cases;
      }
    }
  }
  CHECK(cases == 72);
}

TEST_CASE("segment ids: any mask means mask and same segment, with cross-attention ids, decode and split KV",
          "[segment_ids]") {
  std::mt19937 rng(77);
  SECTION("masks that know where a sequence starts are not the document mask") {
    const Call x(rng, 2, 150, 150, 4, 2, 40);
    const Tensor<std::int32_t> raw = packed_ids(rng, 2, 150, 40, true, false);
    auto ids = std::make_shared<const SegmentIds>(SegmentIds::from_segment_ids(raw.view()));
    const AnyMask prefix(PrefixLMMask{.prefix = 50});
    const AnyMask chunked(ChunkedCausalMask{24});
    for (const AnyMask& mask : {prefix, chunked}) {
      CHECK_FALSE(ids->same_as_document_mask(mask, shape_of(x.in())));
      check_close(with_operand(x, mask, *ids, 2, true), reference(x, SameSegmentAnd<AnyMask>{mask, ids}, true), true);
    }
  }
  SECTION("query and key ids of different lengths (decode rows, stacked GQA heads, split KV)") {
    for (const index_t sq : {index_t{1}, index_t{3}, index_t{70}}) {
      const index_t skv = 333;
      const Call x(rng, 2, sq, skv, 8, 2, 64);
      const Tensor<std::int32_t> kv_raw = packed_ids(rng, 2, skv, 60, true, false);
      Tensor<std::int32_t> q_raw(detail::make_extents({2, sq}), 0);
      for (index_t b = 0; b < 2; ++b) {  // the queries belong to the last documents of the keys
        for (index_t t = 0; t < sq; ++t) q_raw.data()[b * sq + t] = kv_raw.data()[b * skv + skv - sq + t];
      }
      auto ids = std::make_shared<const SegmentIds>(SegmentIds::from_segment_ids(q_raw.view(), kv_raw.view()));
      const AnyMask mask(CausalMask{Alignment::bottom_right});
      CHECK_FALSE(ids->same_as_document_mask(mask, shape_of(x.in())));
      INFO("q_len " << sq);
      check_close(with_operand(x, mask, *ids, 2, true), reference(x, SameSegmentAnd<AnyMask>{mask, ids}, true), true);
    }
  }
}

TEST_CASE("segment ids: bf16, determinism, NaN in a hidden segment, rows of padding", "[segment_ids]") {
  std::mt19937 rng(5);
  const Call x(rng, 2, 200, 200, 4, 2, 72);
  const Tensor<std::int32_t> raw = packed_ids(rng, 2, 200, 50, true, false);
  const SegmentIds ids = SegmentIds::from_segment_ids(raw.view());
  const AnyMask causal(CausalMask{});

  SECTION("bf16 forward against the reference") {
    const Tensor<bfloat16> q = to_bf16(x.q), k = to_bf16(x.k), v = to_bf16(x.v);
    const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), causal, {}, 2);
    Tensor<bfloat16> out(x.out_shape, from_float<bfloat16>(7.0f)), want = out;
    Tensor<float> lse(x.lse_shape, 7.0f), want_lse = lse;
    execution::ThreadPool pool(2);
    attention_forward(plan, AttentionInputs<bfloat16>{q.view(), k.view(), v.view(), nullptr, &ids}, out.view(),
                      lse.view(), variants::Standard{}, pool);
    const auto ref_plan =
        plan_attention<backends::Reference>(shape_of(x.in()), AnyMask(document_mask(ids.layout(), causal)), {}, 1);
    attention_forward(ref_plan, AttentionInputs<bfloat16>{q.view(), k.view(), v.view()}, want.view(), want_lse.view(),
                      variants::Standard{}, execution::Serial{});
    CHECK(compare(out, want).nmse() <= 5e-4);
    check_lse(lse, want_lse, 1e-2);
  }
  SECTION("the backward is bitwise identical on 1 and 2 workers") {
    const Result one = with_operand(x, causal, ids, 1, true);
    const Result two = with_operand(x, causal, ids, 2, true);
    CHECK(bitwise_equal(one.dq, two.dq));
    CHECK(bitwise_equal(one.dk, two.dk));
    CHECK(bitwise_equal(one.dv, two.dv));
  }
  SECTION("NaN in K and V of one document reaches no other document") {
    Call y = x;
    const index_t b = 1, len = 200;
    index_t t0 = 0;
    while (raw.data()[b * len + t0] == 0) ++t0;
    const std::int32_t doc = raw.data()[b * len + t0];
    for (index_t t = t0; t < len && raw.data()[b * len + t] == doc; ++t) {
      for (index_t e = 0; e < 2 * 72; ++e) {
        y.k.data()[(b * len + t) * 2 * 72 + e] = std::numeric_limits<float>::quiet_NaN();
        y.v.data()[(b * len + t) * 2 * 72 + e] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    const Result got = with_operand(y, causal, ids, 2, false);
    index_t nan_rows = 0;
    for (index_t bb = 0; bb < 2; ++bb) {
      for (index_t t = 0; t < len; ++t) {
        const bool same_doc = bb == b && raw.data()[bb * len + t] == doc;
        for (index_t h = 0; h < 4; ++h) {
          const float o = got.out.data()[((bb * len + t) * 4 + h) * 72];
          if (same_doc) {
            nan_rows += std::isnan(o) ? 1 : 0;
          } else {
            CHECK(std::isfinite(o));
          }
        }
      }
    }
    CHECK(nan_rows > 0);
  }
  SECTION("padding rows get 0 and -inf, their keys no gradient") {
    const Result got = with_operand(x, causal, ids, 2, true);
    index_t padding = 0;
    for (index_t bb = 0; bb < 2; ++bb) {
      for (index_t t = 0; t < 200; ++t) {
        if (raw.data()[bb * 200 + t] != 0) continue;
        ++padding;
        for (index_t h = 0; h < 4; ++h) {
          CHECK(got.lse.data()[(bb * 4 + h) * 200 + t] == -std::numeric_limits<float>::infinity());
          CHECK(got.out.data()[((bb * 200 + t) * 4 + h) * 72] == 0.0f);
        }
        for (index_t e = 0; e < 2 * 72; ++e) CHECK(got.dk.data()[(bb * 200 + t) * 2 * 72 + e] == 0.0f);
      }
    }
    CHECK(padding > 0);
  }
}

TEST_CASE("segment ids: errors name the argument and the shapes", "[segment_ids][errors]") {
  std::mt19937 rng(9);
  const Call x(rng, 2, 40, 40, 2, 2, 16);
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), CausalMask{}, {}, 1);
  Tensor<float> out(x.out_shape), lse(x.lse_shape);
  SECTION("rows") {
    const Tensor<std::int32_t> raw(detail::make_extents({3, 40}), 1);
    const SegmentIds ids = SegmentIds::from_segment_ids(raw.view());
    CHECK_THROWS_WITH(attention_forward(plan, x.in(&ids), out.view(), lse.view()),
                      Contains("attention_forward: the segment ids have 3 rows but the inputs have batch 2"));
  }
  SECTION("tokens") {
    const Tensor<std::int32_t> raw(detail::make_extents({2, 41}), 1);
    const SegmentIds ids = SegmentIds::from_segment_ids(raw.view());
    CHECK_THROWS_WITH(attention_forward(plan, x.in(&ids), out.view(), lse.view()),
                      Contains("(q 41, kv 41) tokens per row but sequence 0 of the inputs has (q 40, kv 40)"));
  }
  SECTION("a backend without the operand") {
    const Tensor<std::int32_t> raw(detail::make_extents({2, 40}), 1);
    const SegmentIds ids = SegmentIds::from_segment_ids(raw.view());
    const auto ref = plan_attention<backends::Reference>(shape_of(x.in()), CausalMask{}, {}, 1);
    CHECK_THROWS_WITH(attention_forward(ref, x.in(&ids), out.view(), lse.view()),
                      Contains("backend Reference takes no segment ids operand"));
  }
  SECTION("bad ids: the parser's message") {
    Tensor<std::int32_t> raw(detail::make_extents({2, 40}), 1);
    raw.data()[5] = -3;
    CHECK_THROWS_WITH(SegmentIds::from_segment_ids(raw.view()), Contains("-3"));
  }
}

}  // namespace seqattn_test_attention_segment_ids_test
