// The tiled backends against the reference backend: every mask kind, head
// dims 64..256, GQA groups, ragged THD batches, 1/2/3 workers, sizes that are
// not multiples of the tile or the vector width.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_forward_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

struct Shape {
  index_t batch = 1, q_len = 1, kv_len = 1, heads = 1, kv_heads = 1, dk = 64, dv = 64;
};

// Runs `Backend` on `workers` workers and the reference on one, both on the
// same BSHD inputs, and checks out and lse.
template <class Backend, class T, class M>
void check_bshd(const Shape& s, const M& mask, AttentionOptions options, int workers, std::mt19937& rng) {
  CAPTURE(s.batch, s.q_len, s.kv_len, s.heads, s.kv_heads, s.dk, s.dv, workers, options.softcap, options.kv_splits);
  const auto q = random_tensor<T>({s.batch, s.q_len, s.heads, s.dk}, rng);
  const auto k = random_tensor<T>({s.batch, s.kv_len, s.kv_heads, s.dk}, rng);
  const auto v = random_tensor<T>({s.batch, s.kv_len, s.kv_heads, s.dv}, rng);
  const AttentionInputs<T> in{q.view(), k.view(), v.view()};
  const Extents out_shape = detail::make_extents({s.batch, s.q_len, s.heads, s.dv});
  const Extents lse_shape = detail::make_extents({s.batch, s.heads, s.q_len});
  check_against_reference<Backend>(in, mask, options, workers, out_shape, lse_shape);
}

template <class Backend, class M>
void check_mask_across_shapes(const M& mask, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const index_t head_dims[] = {64, 72, 80, 96, 128, 256};
  const index_t groups[] = {1, 4, 8};
  int i = 0;
  for (index_t d : head_dims) {
    const index_t group = groups[i % 3];
    const index_t kv_heads = group == 8 ? 1 : 2;
    // Keep the reference's work modest: lengths shrink as d grows.
    const index_t max_len = d >= 128 ? 90 : 150;
    Shape s;
    s.batch = 1 + i % 2;
    s.q_len = std::uniform_int_distribution<index_t>(1, max_len)(rng);
    s.kv_len = std::uniform_int_distribution<index_t>(1, max_len + 40)(rng);
    s.heads = group * kv_heads;
    s.kv_heads = kv_heads;
    s.dk = d;
    s.dv = d;
    check_bshd<Backend, float>(s, mask, {}, 1 + i % 3, rng);
    ++i;
  }
}

}  // namespace

TEMPLATE_TEST_CASE("tiled attention matches the reference for every mask kind", "[attention]", backends::Highway,
                   backends::Scalar) {
  SECTION("full") { check_mask_across_shapes<TestType>(FullMask{}, 1); }
  SECTION("causal, top-left") { check_mask_across_shapes<TestType>(CausalMask{Alignment::top_left}, 2); }
  SECTION("causal, bottom-right") { check_mask_across_shapes<TestType>(CausalMask{Alignment::bottom_right}, 3); }
  SECTION("sliding window") { check_mask_across_shapes<TestType>(TestWindowMask{21, 3}, 4); }
  SECTION("per-head window") { check_mask_across_shapes<TestType>(TestPerHeadWindowMask{3}, 5); }
  SECTION("random dense predicate") { check_mask_across_shapes<TestType>(TestRandomDenseMask{11, 0.3f}, 6); }
  SECTION("documents") { check_mask_across_shapes<TestType>(TestDocumentMask{}, 7); }
  SECTION("rows with no allowed key") { check_mask_across_shapes<TestType>(TestBlankRowsMask{}, 8); }
}

TEST_CASE("several q-tiles and kv-tiles per sequence, uneven tails", "[attention]") {
  std::mt19937 rng(17);
  check_bshd<backends::Highway, float>({1, 300, 333, 2, 1, 64, 64}, CausalMask{Alignment::bottom_right}, {}, 3, rng);
  check_bshd<backends::Highway, float>({1, 300, 333, 2, 2, 64, 64}, TestWindowMask{70, 9}, {}, 2, rng);
  check_bshd<backends::Scalar, float>({1, 257, 129, 2, 2, 72, 72}, CausalMask{}, {}, 2, rng);
}

TEST_CASE("attention handles different q/k and v head dims, soft-cap, sinks and scale", "[attention]") {
  std::mt19937 rng(21);
  Shape s{2, 77, 130, 4, 2, 72, 40};
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  AttentionOptions options;
  options.scale = 0.3f;
  options.softcap = 5.0f;
  options.sinks = sinks;
  check_bshd<backends::Highway, float>(s, CausalMask{}, options, 2, rng);
  check_bshd<backends::Scalar, float>(s, TestBlankRowsMask{}, options, 1, rng);
  check_bshd<backends::Highway, float>(s, TestRandomDenseMask{3, 0.1f}, options, 3, rng);
}

TEST_CASE("rows no key may attend to give zero output and -inf lse (or the sink)", "[attention]") {
  std::mt19937 rng(5);
  const auto q = random_tensor<float>({1, 9, 2, 64}, rng);
  const auto k = random_tensor<float>({1, 9, 2, 64}, rng);
  const auto v = random_tensor<float>({1, 9, 2, 64}, rng);
  Tensor<float> out({1, 9, 2, 64}, 7.0f);
  Tensor<float> lse({1, 2, 9}, 7.0f);
  attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view()}, TestBlankRowsMask{}, out.view(), lse.view());
  for (index_t i = 0; i < 9; ++i) {
    for (index_t h = 0; h < 2; ++h) {
      if (i % 3 == 1) {
        CHECK(lse(0, h, i) == -std::numeric_limits<float>::infinity());
        for (index_t e = 0; e < 64; ++e) REQUIRE(out(0, i, h, e) == 0.0f);
      } else {
        CHECK(std::isfinite(lse(0, h, i)));
      }
    }
  }
  const std::vector<float> sinks{1.5f, -0.5f};
  AttentionOptions options;
  options.sinks = sinks;
  attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view()}, TestBlankRowsMask{}, out.view(), lse.view(),
                    options);
  CHECK(lse(0, 0, 1) == 1.5f);
  CHECK(lse(0, 1, 4) == -0.5f);
  CHECK(out(0, 1, 0, 3) == 0.0f);
}

TEST_CASE("bf16 storage stays within NMSE 5e-4 of the reference", "[attention][bf16]") {
  std::mt19937 rng(9);
  check_bshd<backends::Highway, bfloat16>({2, 70, 150, 8, 1, 128, 128}, CausalMask{}, {}, 2, rng);
  check_bshd<backends::Highway, bfloat16>({1, 33, 65, 4, 4, 80, 80}, TestWindowMask{17, 0}, {}, 1, rng);
  check_bshd<backends::Scalar, bfloat16>({1, 50, 50, 4, 1, 72, 72}, TestDocumentMask{{7, 20, 3}}, {}, 3, rng);
}

TEST_CASE("decode: few queries over a long KV, split across workers and merged by LSE", "[attention][decode]") {
  std::mt19937 rng(13);
  for (const index_t q_len : {1, 3}) {
    for (const int workers : {1, 2, 3}) {
      // GQA 8 with a head-invariant mask: the 8 query heads share K/V rows.
      check_bshd<backends::Highway, float>({1, q_len, 8, 8, 1, 128, 128}, FullMask{}, {}, workers, rng);
      Shape s{2, q_len, 1000 + 37 * workers, 8, 1, 128, 128};
      check_bshd<backends::Highway, float>(s, CausalMask{Alignment::bottom_right}, {}, workers, rng);
      // A head-dependent mask: heads are not stacked.
      check_bshd<backends::Scalar, float>({1, q_len, 700, 4, 2, 64, 64}, TestPerHeadWindowMask{100}, {}, workers, rng);
    }
  }
  // Several K/V heads of a BSHD cache in one task (GQA 8 x 2 or 3 K/V heads).
  {
    const std::vector<float> sinks(24, 0.25f);
    AttentionOptions options;
    options.sinks = sinks;
    options.softcap = 7.0f;
    for (const int workers : {1, 2, 3}) {
      check_bshd<backends::Highway, float>({2, 1, 650, 16, 2, 128, 128}, CausalMask{Alignment::bottom_right}, {},
                                           workers, rng);
      check_bshd<backends::Highway, float>({1, 2, 300, 24, 3, 64, 64}, TestBlankRowsMask{}, options, workers, rng);
      check_bshd<backends::Scalar, float>({1, 3, 200, 24, 3, 80, 80}, TestWindowMask{50, 0}, {}, workers, rng);
      check_bshd<backends::Highway, bfloat16>({1, 1, 500, 16, 2, 96, 96}, FullMask{}, {}, workers, rng);
    }
  }
  // Forced split counts, including more splits than tiles, on one worker.
  for (const index_t splits : {2, 5, 40}) {
    AttentionOptions options;
    options.kv_splits = splits;
    const std::vector<float> sinks{0.1f, 0.2f, 0.3f, 0.4f};
    options.sinks = sinks;
    check_bshd<backends::Highway, float>({1, 2, 900, 4, 1, 96, 96}, CausalMask{Alignment::bottom_right}, options, 1,
                                         rng);
    options.sinks = {};
    check_bshd<backends::Highway, bfloat16>({1, 1, 777, 4, 4, 64, 64}, TestBlankRowsMask{}, options, 2, rng);
  }
}

}  // namespace seqattn_test_attention_forward_test
