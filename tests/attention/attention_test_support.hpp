// Helpers shared by the attention tests: random inputs, test-local mask
// descriptions, and comparisons against the reference backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/combinators.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/structural.hpp"

#include "support/catch.hpp"
#include "support/engine_instances.hpp"  // the common engine configurations, compiled once

namespace seqattn::testing {

// Sets the bf16 arithmetic (set_bf16_dot_path) for one scope and restores the previous one.
class Bf16PathScope {
 public:
  explicit Bf16PathScope(Bf16DotPath path) : saved_(bf16_dot_path()) { set_bf16_dot_path(path); }
  ~Bf16PathScope() { set_bf16_dot_path(saved_); }
  Bf16PathScope(const Bf16PathScope&) = delete;
  Bf16PathScope& operator=(const Bf16PathScope&) = delete;

 private:
  Bf16DotPath saved_;
};

template <class T>
Tensor<T> random_tensor(const Extents& shape, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  Tensor<T> t(shape);
  for (auto& x : t.values()) x = from_float<T>(dist(rng));
  return t;
}

// --- Test-local mask descriptions ------------------------------------------

// Sliding window, top-left aligned: q - left <= kv <= q + right.
struct TestWindowMask {
  static constexpr bool head_invariant = true;
  index_t left = 8;
  index_t right = 0;
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return kv >= q - left && kv <= q + right; }
  TileClass classify(const MaskContext&, const Tile& t) const {
    if (t.rows() <= 0 || t.cols() <= 0) return TileClass::empty;
    if (t.kv_end - 1 < t.q_begin - left || t.kv_begin > t.q_end - 1 + right) return TileClass::empty;
    if (t.kv_begin >= t.q_end - 1 - left && t.kv_end - 1 <= t.q_begin + right) return TileClass::full;
    return TileClass::partial;
  }
};

// A different window per head: not head-invariant, so the BlockMask has one
// row of tiles per head.
struct TestPerHeadWindowMask {
  index_t base = 5;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    return kv <= q && kv >= q - (base + 7 * ctx.head);
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const {
    return TestWindowMask{base + 7 * ctx.head, 0}.classify(ctx, t);
  }
};

// Pseudo-random dense predicate (about `density` of the pairs allowed),
// depending on batch and head: the worst case for block skipping.
struct TestRandomDenseMask {
  std::uint32_t seed = 1;
  float density = 0.5f;
  bool allowed(const MaskContext& ctx, index_t q, index_t kv) const {
    std::uint64_t h = seed;
    for (index_t x : {ctx.batch, ctx.head, q, kv}) h = (h ^ static_cast<std::uint64_t>(x)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return static_cast<float>(h % 1000) < density * 1000.0f;
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

// Documents packed into one sequence: causal within a document, nothing
// across. `doc_len` gives each document's length, cycled; q and kv share ids.
struct TestDocumentMask {
  static constexpr bool head_invariant = true;
  std::vector<index_t> doc_len{37, 5, 90, 1, 64};
  index_t doc_of(index_t pos) const {
    index_t start = 0;
    for (std::size_t i = 0;; i = (i + 1) % doc_len.size()) {
      if (pos < start + doc_len[i]) return start;
      start += doc_len[i];
    }
  }
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return kv <= q && doc_of(q) == doc_of(kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

// Causal, except that every third query row may attend to nothing.
struct TestBlankRowsMask {
  static constexpr bool head_invariant = true;
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return q % 3 != 1 && kv <= q; }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

// Calls each(mask) in one SECTION per mask kind the engine sweeps test:
// structural kinds and their combinations, head-dependent, data-driven,
// documents and rows that see nothing.
template <class Each>
void each_mask_kind(Each&& each) {
  SECTION("full") { each(FullMask{}); }
  SECTION("causal, top-left") { each(CausalMask{}); }
  SECTION("causal, bottom-right") { each(CausalMask{Alignment::bottom_right}); }
  SECTION("sliding window") { each(SlidingWindowMask{20, 3, Alignment::bottom_right}); }
  SECTION("chunked causal") { each(ChunkedCausalMask{24}); }
  SECTION("causal and not a window") { each(CausalMask{} & ~SlidingWindowMask{4, 0}); }
  SECTION("per-head window") { each(TestPerHeadWindowMask{6}); }
  SECTION("random dense predicate") { each(TestRandomDenseMask{17, 0.35f}); }
  SECTION("documents") { each(TestDocumentMask{}); }
  SECTION("rows with no allowed key") { each(TestBlankRowsMask{}); }
}

// --- Comparisons ------------------------------------------------------------

struct ErrorStats {
  double max_abs_diff = 0;
  double max_abs_ref = 0;
  double sq_diff = 0;
  double sq_ref = 0;
  double relative() const { return max_abs_ref > 0 ? max_abs_diff / max_abs_ref : max_abs_diff; }
  double nmse() const { return sq_ref > 0 ? sq_diff / sq_ref : sq_diff; }
};

template <class T>
ErrorStats compare(const Tensor<T>& got, const Tensor<T>& want) {
  REQUIRE(got.shape() == want.shape());
  ErrorStats s;
  index_t not_finite = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = to_float(got.data()[i]), w = to_float(want.data()[i]);
    if (!std::isfinite(g)) ++not_finite;
    s.max_abs_diff = std::max(s.max_abs_diff, std::abs(g - w));
    s.max_abs_ref = std::max(s.max_abs_ref, std::abs(w));
    s.sq_diff += (g - w) * (g - w);
    s.sq_ref += w * w;
  }
  CHECK(not_finite == 0);
  return s;
}

// LSE agrees to `tol` relative to max(1, |lse|); -inf only where the reference has -inf.
inline void check_lse(const Tensor<float>& got, const Tensor<float>& want, double tol) {
  REQUIRE(got.shape() == want.shape());
  index_t bad = 0, first_bad = -1;
  for (index_t i = 0; i < got.size(); ++i) {
    const float g = got.data()[i], w = want.data()[i];
    const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= tol * std::max(1.0, std::abs(static_cast<double>(w)));
    if (!ok && bad++ == 0) first_bad = i;
  }
  INFO("first mismatching lse index " << first_bad);
  CHECK(bad == 0);
}

// Runs `Backend` on `workers` workers and the reference backend serially on
// the same inputs, then checks out and lse against the reference: fp32
// relative error <= 1e-5 (lse 1e-5), bf16 NMSE <= 5e-4 (lse 1e-2). Both
// outputs start filled with 7 so rows a backend must not write stay visible.
// Returns the backend's out and lse for further checks.
template <class Backend, class T, class M>
std::pair<Tensor<T>, Tensor<float>> check_against_reference(const AttentionInputs<T>& in, const M& mask,
                                                            const AttentionOptions& options, int workers,
                                                            const Extents& out_shape, const Extents& lse_shape) {
  Tensor<T> out(out_shape, from_float<T>(7.0f)), want = out;
  Tensor<float> lse(lse_shape, 7.0f), want_lse = lse;
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view(), options);
  execution::ThreadPool pool(workers);
  attention_forward<Backend>(in, mask, out.view(), lse.view(), options, pool);
  const ErrorStats err = compare(out, want);
  if constexpr (std::is_same_v<T, float>) {
    CHECK(err.relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
  } else {
    CHECK(err.nmse() <= 5e-4);
    check_lse(lse, want_lse, 1e-2);
  }
  return {std::move(out), std::move(lse)};
}

// A shape for planning tests that run nothing: `heads` over `kv_heads`,
// head dims 16, and the mask's BlockMask on the Scalar backend's blocks.
struct PlanningCase {
  AttentionShape shape;
  BlockMask bm;
};
template <class M>
PlanningCase planning_case(const M& mask, RaggedLengths lengths, index_t heads, index_t kv_heads) {
  AttentionShape shape;
  shape.lengths = std::move(lengths);
  shape.heads = heads;
  shape.kv_heads = kv_heads;
  shape.dk = shape.dv = 16;
  BlockMask bm = build_block_mask(mask, shape.lengths, heads, backends::Scalar::block_shape());
  return {std::move(shape), std::move(bm)};
}

}  // namespace seqattn::testing
