// top_k's order (masks/topk.hpp) is jax.lax.top_k's: XLA's total order of
// floats (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN), values
// descending, equal values lower index first. The vectors marked "jax" were
// run through jax.lax.top_k (jax 0.10.2, CPU); the random checks compare with
// an oracle that ranks by IEEE comparison plus explicit sign and NaN rules,
// sharing no code with topk_order_key.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_masks_topk_order_test {

using namespace seqattn;

namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kNegNan = std::bit_cast<float>(std::uint32_t{0xffc00000u});
const float kInf = std::numeric_limits<float>::infinity();

std::vector<std::int32_t> topk(const std::vector<float>& row, index_t k) {
  const Tensor<std::int32_t> idx =
      top_k(TensorView<const float>(row.data(), Extents{static_cast<index_t>(row.size())}), k);
  return {idx.values().begin(), idx.values().end()};
}

// a ranks above b in XLA's total order (for canonical NaNs of either sign).
bool ranks_above(float a, float b) {
  const auto cls = [](float x) { return std::isnan(x) ? (std::signbit(x) ? 0 : 2) : 1; };
  if (cls(a) != cls(b)) return cls(a) > cls(b);
  if (cls(a) != 1) return false;  // same NaN
  if (a != b) return a > b;
  return !std::signbit(a) && std::signbit(b);  // +0.0 above -0.0
}

}  // namespace

TEST_CASE("top_k: +0.0 ranks above -0.0, as jax.lax.top_k", "[masks][topk]") {
  CHECK(topk({-0.0f, 0.0f}, 2) == std::vector<std::int32_t>{1, 0});  // jax: [1, 0]
  CHECK(topk({0.0f, -0.0f}, 2) == std::vector<std::int32_t>{0, 1});  // jax: [0, 1]
  CHECK(topk({-0.0f, -0.0f, 0.0f, -0.0f}, 1) == std::vector<std::int32_t>{2});
}

TEST_CASE("top_k: NaN ranks above +inf, -NaN below -inf, as jax.lax.top_k", "[masks][topk]") {
  CHECK(topk({1.0f, kNan, kInf, -kInf, 2.0f}, 5) == std::vector<std::int32_t>{1, 2, 4, 0, 3});  // jax
  CHECK(topk({kNan, 1.0f, kNan}, 3) == std::vector<std::int32_t>{0, 2, 1});                     // jax: NaNs tie
  CHECK(topk({1.0f, kNegNan, -kInf, kNan}, 4) == std::vector<std::int32_t>{3, 0, 2, 1});        // jax
}

TEST_CASE("top_k: ties lower index first, as jax.lax.top_k", "[masks][topk]") {
  CHECK(topk({1.0f, 2.0f, 1.0f, 1.0f}, 3) == std::vector<std::int32_t>{1, 0, 2});  // jax
}

TEST_CASE("top_k: random rows of zeros, infinities and NaNs against a stable sort in the total order",
          "[masks][topk]") {
  std::mt19937 rng(1717);
  const std::vector<float> palette{-0.0f, 0.0f, 1.0f, -1.0f, kNan, kNegNan, kInf, -kInf, 0.5f, -0.5f};
  for (int trial = 0; trial < 200; ++trial) {
    const index_t s = std::uniform_int_distribution<index_t>(1, 50)(rng);
    const index_t k = std::uniform_int_distribution<index_t>(0, s)(rng);
    std::vector<float> row(static_cast<std::size_t>(s));
    for (float& v : row) v = palette[std::uniform_int_distribution<std::size_t>(0, palette.size() - 1)(rng)];
    std::vector<std::int32_t> order(row.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return ranks_above(row[static_cast<std::size_t>(a)], row[static_cast<std::size_t>(b)]);
    });
    order.resize(static_cast<std::size_t>(k));
    INFO("trial " << trial << ", s " << s << ", k " << k);
    REQUIRE(topk(row, k) == order);
  }
}

TEST_CASE("topk_order_key: a total order consistent with < on ordinary floats", "[masks][topk]") {
  std::mt19937 rng(1718);
  std::normal_distribution<float> n(0.0f, 1e3f);
  for (int i = 0; i < 2000; ++i) {
    const float a = n(rng), b = i % 5 == 0 ? a : n(rng);
    REQUIRE((topk_order_key(a) < topk_order_key(b)) == (a < b));
  }
  CHECK(topk_order_key(-0.0f) < topk_order_key(0.0f));
  CHECK(topk_order_key(kInf) < topk_order_key(kNan));
  CHECK(topk_order_key(kNegNan) < topk_order_key(-kInf));
  CHECK(topk_order_key(-std::numeric_limits<float>::denorm_min()) < topk_order_key(-0.0f));
}

}  // namespace seqattn_test_masks_topk_order_test
