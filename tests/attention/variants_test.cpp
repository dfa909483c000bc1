// Score variants: every built-in variant on the Scalar and Highway engines
// against the reference backend, across mask kinds, GQA and decode shapes;
// the reference itself against a naive dense oracle written from each
// variant's formula; tile hooks against element hooks; bad variants.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_variants_test {

using namespace seqattn;
using namespace seqattn::testing;
using Catch::Matchers::Contains;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Problem {
  index_t batch, sq, skv, heads, kv_heads, d;
  Tensor<float> q, k, v;
  Problem(std::mt19937& rng, index_t batch_, index_t sq_, index_t skv_, index_t heads_, index_t kv_heads_, index_t d_)
      : batch(batch_),
        sq(sq_),
        skv(skv_),
        heads(heads_),
        kv_heads(kv_heads_),
        d(d_),
        q(random_tensor<float>(detail::make_extents({batch, sq, heads, d}), rng)),
        k(random_tensor<float>(detail::make_extents({batch, skv, kv_heads, d}), rng)),
        v(random_tensor<float>(detail::make_extents({batch, skv, kv_heads, d}), rng)) {}
  AttentionInputs<float> in() const { return {q.view(), k.view(), v.view()}; }
  Extents out_shape() const { return detail::make_extents({batch, sq, heads, d}); }
  Extents lse_shape() const { return detail::make_extents({batch, heads, sq}); }
};

// Slopes of the ALiBi paper for `heads` heads: 2^(-8 (h + 1) / heads).
std::vector<float> alibi_slopes(index_t heads) {
  std::vector<float> s;
  for (index_t h = 0; h < heads; ++h)
    s.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads)));
  return s;
}

struct Fixture {
  std::vector<float> slopes, sinks;
  explicit Fixture(index_t heads) : slopes(alibi_slopes(heads)) {
    for (index_t h = 0; h < heads; ++h) sinks.push_back(0.5f * static_cast<float>(h % 3) - 0.25f);
  }
  static float bias(index_t b, index_t h, index_t q, index_t kv) {
    return 0.3f * std::sin(0.37f * static_cast<float>(q) - 0.11f * static_cast<float>(kv) + static_cast<float>(b + h));
  }
  // Excludes every fifth key (flex's score_mod may mask) and tilts by head.
  static float mod(float s, index_t, index_t h, index_t, index_t kv) {
    return kv % 5 == 3 ? -kInf : 0.9f * s + 0.05f * static_cast<float>(h);
  }
};

// Plans Backend and the reference for `mask`, runs both with `variant`.
template <class Backend, class M, class V>
void check_variant_on(const Problem& x, const M& mask, const V& variant, int workers) {
  Tensor<float> want(x.out_shape(), 7.0f), out(x.out_shape(), 7.0f);
  Tensor<float> want_lse(x.lse_shape(), 7.0f), lse(x.lse_shape(), 7.0f);
  const AttentionShape shape = shape_of(x.in());
  attention_forward(plan_attention<backends::Reference>(shape, mask), x.in(), want.view(), want_lse.view(), variant);
  execution::ThreadPool pool(workers);
  const auto plan = plan_attention<Backend>(shape, mask, {}, workers);
  attention_forward(plan, x.in(), out.view(), lse.view(), variant, pool);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);
}

template <class V>
void check_variant_across_masks(const V& variant, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const Problem prefill(rng, 2, 70, 90, 6, 2, 72);
  const Problem decode(rng, 1, 2, 300, 6, 1, 80);  // stacked GQA rows, split KV
  auto each = [&](const auto& mask) {
    for (const Problem* x : {&prefill, &decode}) {
      CAPTURE(x->sq, x->skv, x->heads);
      check_variant_on<backends::Highway>(*x, mask, variant, 2);
      check_variant_on<backends::Scalar>(*x, mask, variant, 3);
    }
  };
  each_mask_kind(each);
}

}  // namespace

TEST_CASE("variant: default and scale", "[attention][variants]") {
  SECTION("default") { check_variant_across_masks(variants::Default{}, 201); }
  SECTION("scale") { check_variant_across_masks(variants::Scale{0.2f}, 202); }
}

TEST_CASE("variant: softcap", "[attention][variants]") {
  check_variant_across_masks(variants::chain(variants::Scale{0.5f}, variants::Softcap{2.0f}), 203);
}

TEST_CASE("variant: sinks", "[attention][variants]") {
  const Fixture f(8);
  check_variant_across_masks(variants::Sinks{std::span(f.sinks).first(6)}, 204);
}

TEST_CASE("variant: ALiBi", "[attention][variants]") {
  const Fixture f(8);
  check_variant_across_masks(variants::Alibi{std::span(f.slopes).first(6)}, 205);
}

TEST_CASE("variant: ALiBi with GQA-stacked decode rows", "[attention][variants]") {
  const Fixture f(8);
  std::mt19937 rng(206);
  const Problem decode(rng, 1, 2, 300, 8, 1, 80);
  check_variant_on<backends::Highway>(decode, CausalMask{Alignment::bottom_right}, variants::Alibi{f.slopes}, 2);
  check_variant_on<backends::Scalar>(decode, FullMask{}, variants::Alibi{f.slopes}, 1);
}

TEST_CASE("variant: additive bias", "[attention][variants]") {
  check_variant_across_masks(variants::Bias{&Fixture::bias}, 207);
}

TEST_CASE("variant: score_mod", "[attention][variants]") {
  check_variant_across_masks(variants::ScoreMod{&Fixture::mod}, 208);
}

TEST_CASE("variant: a chain of scale, ALiBi, softcap and sinks", "[attention][variants]") {
  const Fixture f(8);
  const auto six_slopes = std::span(f.slopes).first(6), six_sinks = std::span(f.sinks).first(6);
  check_variant_across_masks(variants::chain(variants::Scale{0.3f}, variants::Alibi{six_slopes},
                                             variants::Softcap{4.0f}, variants::Sinks{six_sinks}),
                             209);
}

// ---- The reference's variant hooks against a naive oracle written from the formulas.

namespace {

using Logit = std::function<double(double scaled, index_t b, index_t h, index_t q, index_t kv)>;

// Dense attention in double: logits = logit(scale * q.k), masked, softmax
// with an optional sink per head. Returns out and lse.
template <class M>
std::pair<Tensor<float>, Tensor<float>> naive(const Problem& x, const M& mask, double scale, const Logit& logit,
                                              const std::vector<float>& sinks) {
  Tensor<float> out(x.out_shape()), lse(x.lse_shape());
  const index_t group = x.heads / x.kv_heads;
  for (index_t b = 0; b < x.batch; ++b) {
    for (index_t h = 0; h < x.heads; ++h) {
      const MaskContext ctx{b, h, x.sq, x.skv};
      for (index_t i = 0; i < x.sq; ++i) {
        std::vector<double> z(static_cast<std::size_t>(x.skv), -INFINITY);
        double top = sinks.empty() ? -INFINITY : sinks[static_cast<std::size_t>(h)];
        for (index_t j = 0; j < x.skv; ++j) {
          if (!mask.allowed(ctx, i, j)) continue;
          double dot = 0;
          for (index_t e = 0; e < x.d; ++e) dot += double{x.q(b, i, h, e)} * x.k(b, j, h / group, e);
          z[static_cast<std::size_t>(j)] = logit(scale * dot, b, h, i, j);
          top = std::max(top, z[static_cast<std::size_t>(j)]);
        }
        double sum = sinks.empty() || std::isinf(top) ? 0.0 : std::exp(sinks[static_cast<std::size_t>(h)] - top);
        std::vector<double> o(static_cast<std::size_t>(x.d), 0.0);
        for (index_t j = 0; j < x.skv && !std::isinf(top); ++j) {
          if (std::isinf(z[static_cast<std::size_t>(j)])) continue;
          const double w = std::exp(z[static_cast<std::size_t>(j)] - top);
          sum += w;
          for (index_t e = 0; e < x.d; ++e) o[static_cast<std::size_t>(e)] += w * x.v(b, j, h / group, e);
        }
        for (index_t e = 0; e < x.d; ++e) {
          out(b, i, h, e) = sum > 0 ? static_cast<float>(o[static_cast<std::size_t>(e)] / sum) : 0.0f;
        }
        lse(b, h, i) = sum > 0 ? static_cast<float>(top + std::log(sum)) : -kInf;
      }
    }
  }
  return {std::move(out), std::move(lse)};
}

template <class M, class V>
void check_reference_against_naive(const Problem& x, const M& mask, const V& variant, double scale, const Logit& logit,
                                   const std::vector<float>& sinks = {}) {
  const auto [want, want_lse] = naive(x, mask, scale, logit, sinks);
  Tensor<float> out(x.out_shape()), lse(x.lse_shape());
  attention_forward(plan_attention<backends::Reference>(shape_of(x.in()), mask), x.in(), out.view(), lse.view(),
                    variant);
  CHECK(compare(out, want).relative() <= 1e-5);
  check_lse(lse, want_lse, 1e-5);
}

}  // namespace

TEST_CASE("the reference applies each variant as its formula says", "[attention][variants][reference]") {
  std::mt19937 rng(211);
  const Problem x(rng, 2, 21, 34, 4, 2, 16);
  const Fixture f(4);
  const double scale = 1.0 / 4.0;
  const auto mask = CausalMask{Alignment::bottom_right};
  const auto& slopes = f.slopes;
  check_reference_against_naive(x, mask, variants::Default{}, scale, [](double s, auto...) { return s; });
  check_reference_against_naive(x, mask, variants::Scale{0.7f}, 0.7, [](double s, auto...) { return s; });
  check_reference_against_naive(x, mask, variants::Softcap{1.5f}, scale,
                                [](double s, auto...) { return 1.5 * std::tanh(s / 1.5); });
  // ALiBi, FlashAttention-2's convention: -slope * |q + kv_len - q_len - kv|.
  check_reference_against_naive(
      x, mask, variants::Alibi{slopes}, scale, [&](double s, index_t, index_t h, index_t q, index_t kv) {
        return s - slopes[static_cast<std::size_t>(h)] * static_cast<double>(std::abs(q + (34 - 21) - kv));
      });
  check_reference_against_naive(
      x, mask, variants::Bias{&Fixture::bias}, scale,
      [](double s, index_t b, index_t h, index_t q, index_t kv) { return s + Fixture::bias(b, h, q, kv); });
  check_reference_against_naive(x, TestBlankRowsMask{}, variants::ScoreMod{&Fixture::mod}, scale,
                                [](double s, index_t b, index_t h, index_t q, index_t kv) {
                                  return kv % 5 == 3 ? -INFINITY
                                                     : 0.9 * s + 0.05 * static_cast<double>(h) + 0 * (b + q);
                                });
  check_reference_against_naive(
      x, TestBlankRowsMask{}, variants::Sinks{f.sinks}, scale, [](double s, auto...) { return s; }, f.sinks);
}

TEMPLATE_TEST_CASE("a variant's tile hook agrees with its element hook", "[attention][variants]",
                   backends::ScalarKernel, backends::Highway::Kernel) {
  using Kernel = TestType;
  std::mt19937 rng(223);
  std::normal_distribution<float> dist(0.0f, 5.0f);
  const index_t rows = 37, rows_p = Kernel::padded_rows(rows), cols = 53;
  // Aligned like the engine's scratch: the SIMD kernels load whole vectors.
  const index_t size = Kernel::kBlockKv * Kernel::kBlockQ;
  detail::AlignedFloats tile(size), expected(size);
  for (index_t i = 0; i < size; ++i) tile.get()[i] = expected.get()[i] = dist(rng);
  std::vector<index_t> row_q(static_cast<std::size_t>(Kernel::kBlockQ)), row_head(row_q.size());
  for (index_t r = 0; r < rows; ++r) {
    row_q[static_cast<std::size_t>(r)] = 3 + r;
    row_head[static_cast<std::size_t>(r)] = r % 2;
  }
  const ScoreTile by_tile{tile.get(), Kernel::kBlockQ, rows, rows_p, cols, row_q.data(), row_head.data(), 0, 64, 40,
                          200};
  const ScoreTile by_element{
      expected.get(), Kernel::kBlockQ, rows, rows_p, cols, row_q.data(), row_head.data(), 0, 64, 40, 200};
  const variants::Softcap softcap{3.5f};
  softcap.transform_scores<Kernel>(by_tile);
  detail::transform_scores_per_element(softcap, by_element);
  index_t bad = 0;
  for (index_t j = 0; j < cols; ++j) {
    for (index_t r = 0; r < rows; ++r) {
      const float got = by_tile.at(r, j), want = by_element.at(r, j);
      bad += !(std::abs(got - want) <= 2e-6f * std::max(1.0f, std::abs(want)));
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("variants refuse shapes they cannot serve", "[attention][variants][errors]") {
  std::mt19937 rng(227);
  const Problem x(rng, 1, 8, 10, 4, 2, 64);
  Tensor<float> out(x.out_shape()), lse(x.lse_shape());
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), CausalMask{});
  const std::vector<float> three(3, 0.1f);
  CHECK_THROWS_WITH(attention_forward(plan, x.in(), out.view(), lse.view(), variants::Alibi{three}),
                    Contains("ALiBi needs one slope per query head (4), got 3"));
  CHECK_THROWS_WITH(attention_forward(plan, x.in(), out.view(), lse.view(), variants::Sinks{three}),
                    Contains("sinks must hold one logit per query head (4), got 3"));
  CHECK_THROWS_WITH(attention_forward(plan, x.in(), out.view(), lse.view(), variants::Softcap{-2.0f}),
                    Contains("softcap must be finite and >= 0"));
  CHECK_THROWS_WITH(attention_forward(plan, x.in(), out.view(), lse.view(), variants::Scale{kInf}),
                    Contains("scale must be finite"));
  CHECK_THROWS_WITH(attention_forward(plan, x.in(), out.view(), lse.view(),
                                      variants::chain(variants::Softcap{1.0f}, variants::Alibi{three})),
                    Contains("one slope per query head"));
}

}  // namespace seqattn_test_attention_variants_test
