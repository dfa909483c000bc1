// Plans: reuse across calls, executors and THD offsets; shape mismatches;
// the backend seam (concepts, supports()); the BlockMask's carried predicate;
// SoftmaxState merges.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_plan_test {

using namespace seqattn;
using namespace seqattn::testing;
using Catch::Matchers::Contains;

static_assert(AttentionBackend<backends::Highway>);
static_assert(AttentionBackend<backends::Scalar>);
static_assert(AttentionBackend<backends::Reference>);
static_assert(!AttentionBackend<int>);
static_assert(TileKernel<backends::ScalarKernel>);
static_assert(TileKernel<backends::Highway::Kernel>);
static_assert(ExecutionPolicy<execution::Serial>);
static_assert(ExecutionPolicy<execution::ThreadPool>);
static_assert(!ExecutionPolicy<variants::Softcap>);
static_assert(ScoreVariant<variants::Alibi>);
static_assert(!ScoreVariant<execution::Serial>);

namespace {

// A backend that is the Scalar engine under another name and refuses head
// dims over 96: what a new backend with limits (a GPU kernel) looks like to
// the planner. Counts its forward calls.
struct LimitedBackend : backends::CpuTiled<backends::ScalarKernel> {
  static inline int forward_calls = 0;
  static const char* name() { return "Limited"; }
  static Support supports(const AttentionShape& shape) {
    if (shape.dk > 96) return {detail::concat("head dim ", shape.dk, " is over 96")};
    return {};
  }
  template <class Backend, class T, class V, class Exec>
  static void forward(const AttentionPlan<Backend>& plan, const detail::AttentionProblem<T>& problem, const V& variant,
                      Exec& exec) {
    ++forward_calls;
    CpuTiled::forward(plan, problem, variant, exec);
  }
};
static_assert(AttentionBackend<LimitedBackend>);

struct Bshd {
  Tensor<float> q, k, v, out, lse;
  Bshd(std::mt19937& rng, index_t batch, index_t sq, index_t skv, index_t heads, index_t kv_heads, index_t d)
      : q(random_tensor<float>(detail::make_extents({batch, sq, heads, d}), rng)),
        k(random_tensor<float>(detail::make_extents({batch, skv, kv_heads, d}), rng)),
        v(random_tensor<float>(detail::make_extents({batch, skv, kv_heads, d}), rng)),
        out(detail::make_extents({batch, sq, heads, d}), 7.0f),
        lse(detail::make_extents({batch, heads, sq}), 7.0f) {}
  AttentionInputs<float> in() const { return {q.view(), k.view(), v.view()}; }
  void refill(std::mt19937& rng) {
    for (Tensor<float>* t : {&q, &k, &v}) {
      const Tensor<float> fresh = random_tensor<float>(t->shape(), rng);
      std::copy(fresh.values().begin(), fresh.values().end(), t->values().begin());
    }
  }
};

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE("a plan serves many calls with new data and any executor", "[attention][plan]", backends::Highway,
                   backends::Scalar) {
  std::mt19937 rng(101);
  // Decode-like (split KV, merged partials) and prefill-like shapes.
  for (const auto& [sq, skv] : {std::pair<index_t, index_t>{2, 700}, {130, 150}}) {
    Bshd x(rng, 2, sq, skv, 8, 2, 72);
    const auto mask = CausalMask{Alignment::bottom_right};
    const auto plan = plan_attention<TestType>(shape_of(x.in()), mask, {}, 2);
    CHECK(plan.workers() == 2);
    execution::ThreadPool pool(2);
    for (int call = 0; call < 3; ++call) {
      CAPTURE(sq, skv, call);
      x.refill(rng);
      Tensor<float> want(x.out.shape()), want_lse(x.lse.shape());
      attention_forward<backends::Reference>(x.in(), mask, want.view(), want_lse.view());
      attention_forward(plan, x.in(), x.out.view(), x.lse.view(), pool);
      CHECK(compare(x.out, want).relative() <= 1e-5);
      check_lse(x.lse, want_lse, 1e-5);
      // The same plan serially: the partition is fixed, so the result is too.
      Tensor<float> serial(x.out.shape()), serial_lse(x.lse.shape());
      attention_forward(plan, x.in(), serial.view(), serial_lse.view());
      CHECK(bitwise_equal(serial, x.out));
      CHECK(bitwise_equal(serial_lse, x.lse));
    }
  }
}

TEST_CASE("a THD plan serves calls whose segments move but keep their lengths", "[attention][plan][thd]") {
  std::mt19937 rng(103);
  const auto q = random_tensor<float>({40, 4, 64}, rng);
  const auto k = random_tensor<float>({50, 2, 64}, rng);
  const auto v = random_tensor<float>({50, 2, 64}, rng);
  const std::vector<std::int32_t> q_len{7, 0, 20}, kv_len{9, 4, 30};
  const std::vector<std::int32_t> q_off_a{0, 7, 7}, kv_off_a{0, 9, 13};
  const std::vector<std::int32_t> q_off_b{20, 0, 0}, kv_off_b{41, 0, 5};  // other places, same lengths
  const SegmentTable a{q_off_a, q_len, kv_off_a, kv_len}, b{q_off_b, q_len, kv_off_b, kv_len};
  const auto plan = plan_attention<backends::Highway>(
      shape_of(AttentionInputs<float>{q.view(), k.view(), v.view(), &a}), CausalMask{Alignment::bottom_right});
  for (const SegmentTable* table : {&a, &b}) {
    const AttentionInputs<float> in{q.view(), k.view(), v.view(), table};
    Tensor<float> out({40, 4, 64}, 7.0f), want({40, 4, 64}, 7.0f), lse({4, 40}, 7.0f), want_lse({4, 40}, 7.0f);
    attention_forward<backends::Reference>(in, CausalMask{Alignment::bottom_right}, want.view(), want_lse.view());
    attention_forward(plan, in, out.view(), lse.view());
    CHECK(compare(out, want).relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
  }
}

TEST_CASE("a plan refuses inputs of another shape, naming both", "[attention][plan][errors]") {
  std::mt19937 rng(107);
  Bshd x(rng, 1, 8, 10, 4, 2, 64);
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), CausalMask{});
  Bshd longer(rng, 1, 8, 12, 4, 2, 64);
  CHECK_THROWS_WITH(attention_forward(plan, longer.in(), longer.out.view(), longer.lse.view()),
                    Contains("attention_forward: the plan was made for BSHD, 1 sequence of (q 8, kv 10), 4 heads over "
                             "2 kv heads, dk 64, dv 64") &&
                        Contains("but the inputs are BSHD, 1 sequence of (q 8, kv 12)"));
  Bshd wider(rng, 1, 8, 10, 4, 2, 80);
  CHECK_THROWS_WITH(attention_forward(plan, wider.in(), wider.out.view(), wider.lse.view()),
                    Contains("dk 64, dv 64 but the inputs are") && Contains("dk 80, dv 80"));
  Bshd mqa(rng, 1, 8, 10, 4, 1, 64);
  CHECK_THROWS_WITH(attention_forward(plan, mqa.in(), mqa.out.view(), mqa.lse.view()),
                    Contains("4 heads over 1 kv heads"));
  // THD inputs of the same sizes are another layout.
  const std::vector<std::int32_t> zero{0}, eight{8}, ten{10};
  const SegmentTable table{zero, eight, zero, ten};
  const TensorView<const float> q3(x.q.data(), {8, 4, 64}), k3(x.k.data(), {10, 2, 64}), v3(x.v.data(), {10, 2, 64});
  Tensor<float> out3({8, 4, 64}), lse3({4, 8});
  CHECK_THROWS_WITH(attention_forward(plan, AttentionInputs<float>{q3, k3, v3, &table}, out3.view(), lse3.view()),
                    Contains("but the inputs are THD, 1 sequence of (q 8, kv 10)"));
  // Nothing was written by the refused calls.
  CHECK(longer.out(0, 0, 0, 0) == 7.0f);
}

TEST_CASE("planning validates its request and asks the backend", "[attention][plan][errors]") {
  std::mt19937 rng(109);
  Bshd x(rng, 1, 8, 10, 4, 2, 128);
  const AttentionShape shape = shape_of(x.in());
  CHECK_THROWS_WITH(plan_attention<backends::Scalar>(shape, FullMask{}, {}, 0), Contains("workers must be at least 1"));
  CHECK_THROWS_WITH(plan_attention<backends::Scalar>(shape, FullMask{}, PlanOptions{-1}),
                    Contains("kv_splits must be >= 0"));
  CHECK_THROWS_WITH(
      plan_attention<LimitedBackend>(shape, FullMask{}),
      Contains("backend Limited cannot run BSHD, 1 sequence of (q 8, kv 10)") && Contains("head dim 128 is over 96"));
  // The mask is checked against the shape when the plan builds its BlockMask.
  const std::vector<CausalMask> two_masks(2);
  CHECK_THROWS_WITH(plan_attention<backends::Highway>(shape, PerHeadMask<CausalMask>{two_masks}),
                    Contains("PerHeadMask: 2 masks but attention has 4 heads"));
  // A prebuilt BlockMask must fit the shape and the backend's tiles.
  auto wrong_tiles = std::make_shared<const BlockMask>(build_block_mask(CausalMask{}, shape.lengths, 4, {32, 32}));
  CHECK_THROWS_WITH(plan_attention<backends::Highway>(shape, wrong_tiles),
                    Contains("has block shape (32, 32) but backend Highway tiles by"));
  CHECK_NOTHROW(plan_attention<backends::Reference>(shape, wrong_tiles));  // the reference does not tile
  CHECK_THROWS_WITH(plan_attention<backends::Highway>(shape, std::shared_ptr<const BlockMask>{}),
                    Contains("block_mask is null"));
}

TEST_CASE("a backend with limits runs what it supports through the same seam", "[attention][plan]") {
  std::mt19937 rng(113);
  Bshd x(rng, 2, 33, 47, 6, 3, 80);
  const TestRandomDenseMask mask{5, 0.4f};
  const auto plan = plan_attention<LimitedBackend>(shape_of(x.in()), mask, {}, 3);
  LimitedBackend::forward_calls = 0;
  execution::ThreadPool pool(3);
  attention_forward(plan, x.in(), x.out.view(), x.lse.view(), pool);
  CHECK(LimitedBackend::forward_calls == 1);
  Tensor<float> want(x.out.shape()), want_lse(x.lse.shape());
  attention_forward<backends::Reference>(x.in(), mask, want.view(), want_lse.view());
  CHECK(compare(x.out, want).relative() <= 1e-5);
  check_lse(x.lse, want_lse, 1e-5);
}

TEST_CASE("a plan reused across layers builds its BlockMask once", "[attention][plan]") {
  std::mt19937 rng(127);
  Bshd x(rng, 1, 200, 200, 4, 4, 64);
  std::vector<std::int32_t> ids(200);
  for (index_t i = 0; i < 200; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(1 + i / 37);
  const DocumentLayout layout = DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), {1, 200}));
  const auto mask = document_mask(layout, CausalMask{});
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), mask, {}, 2);
  const BlockMask* built = &plan.block_mask();
  execution::ThreadPool pool(2);
  for (int layer = 0; layer < 4; ++layer) {
    x.refill(rng);
    attention_forward(plan, x.in(), x.out.view(), x.lse.view(), pool);
    CHECK(&plan.block_mask() == built);
    Tensor<float> want(x.out.shape()), want_lse(x.lse.shape());
    attention_forward<backends::Reference>(x.in(), mask, want.view(), want_lse.view());
    CHECK(compare(x.out, want).relative() <= 1e-5);
  }
}

TEST_CASE("the BlockMask carries its description's predicate", "[attention][plan][masks]") {
  const TestPerHeadWindowMask mask{4};
  const RaggedLengths lengths{{70, 9}, {90, 15}};
  const BlockMask bm = build_block_mask(mask, lengths, 3, {16, 32});
  const BlockMask bm_no_bits = build_block_mask(mask, lengths, 3, {16, 32}, BlockMaskOptions{false});
  BlockMask bits_only = bm;
  bits_only.set_predicate({});
  const BlockMask t = bm.transposed();
  REQUIRE(bm.has_predicate());
  REQUIRE(t.has_predicate());
  index_t mismatches = 0;
  for (index_t b = 0; b < 2; ++b) {
    for (index_t h = 0; h < 3; ++h) {
      const MaskContext ctx{b, h, lengths.q[static_cast<std::size_t>(b)], lengths.kv[static_cast<std::size_t>(b)]};
      const MaskContext tctx{b, h, ctx.kv_len, ctx.q_len};
      for (index_t q = 0; q < ctx.q_len; ++q) {
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          const bool want = mask.allowed(ctx, q, kv);
          mismatches += bm.allowed(ctx, q, kv) != want;
          mismatches += bm_no_bits.allowed(ctx, q, kv) != want;
          mismatches += bits_only.allowed(ctx, q, kv) != want;  // answered from the tiles
          mismatches += t.allowed(tctx, kv, q) != want;
        }
      }
    }
  }
  CHECK(mismatches == 0);
  BlockMask nothing = bm_no_bits;
  nothing.set_predicate({});
  index_t q = 0;
  while (nothing.partial_blocks(0, 0, q / 16).empty()) ++q;
  const index_t kv = nothing.partial_blocks(0, 0, q / 16)[0] * 32;
  CHECK_THROWS_WITH(nothing.allowed(MaskContext{0, 0, 70, 90}, q, kv),
                    Contains("has neither tile bits nor an element predicate"));
}

// The forward's task order (tiled_work.hpp, order_tasks): every task once;
// where each (sequence, K/V head) band has at least `workers` times its
// longest task's work, the bands side by side in unit order and longest
// first within each (rows times tiles of the task's split), else longest
// first over all tasks.
TEST_CASE("forward tasks run per K/V head of a sequence, longest first within it", "[attention][plan]") {
  using Kernel = backends::Scalar::Kernel;
  const auto check = [](const auto& mask, RaggedLengths lengths, index_t heads, index_t kv_heads, int workers,
                        bool want_bands) {
    const PlanningCase planned = planning_case(mask, std::move(lengths), heads, kv_heads);
    const AttentionShape& shape = planned.shape;
    const detail::TiledWork w = detail::plan_tiled_work<Kernel>(shape, planned.bm, PlanOptions{}, workers);
    CAPTURE(shape, w.splits, workers);
    std::vector<int> seen(static_cast<std::size_t>(w.num_tasks()), 0);
    for (const index_t t : w.order) ++seen[static_cast<std::size_t>(t)];
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    const auto band = [&](index_t t) {
      const detail::WorkUnit& u = w.unit_of(t);
      return std::pair{u.sequence, u.head0 / shape.group()};
    };
    const auto cost = [&](index_t t) {
      const detail::WorkUnit& u = w.unit_of(t);
      const index_t s = t % w.splits, n = u.num_tiles();
      return (n * (s + 1) / w.splits - n * s / w.splits) * u.rows();
    };
    std::map<std::pair<index_t, index_t>, std::pair<index_t, index_t>> work_and_longest;
    for (index_t t = 0; t < w.num_tasks(); ++t) {
      auto& [work, longest] = work_and_longest[band(t)];
      work += cost(t);
      longest = std::max(longest, cost(t));
    }
    const bool bands = std::all_of(work_and_longest.begin(), work_and_longest.end(),
                                   [&](const auto& b) { return b.second.first >= workers * b.second.second; });
    CHECK(bands == want_bands);
    for (std::size_t i = 1; i < w.order.size(); ++i) {
      const index_t a = w.order[i - 1], b = w.order[i];
      CAPTURE(i, a, b);
      if (bands) {
        CHECK(band(a) <= band(b));  // units are collected per sequence, then head
        if (band(a) == band(b)) CHECK(cost(a) >= cost(b));
      } else {
        CHECK(cost(a) >= cost(b));
      }
    }
  };
  check(CausalMask{}, RaggedLengths{{700, 300, 0, 900}, {700, 300, 0, 900}}, 4, 2, 2, true);
  check(SlidingWindowMask{100, 0}, RaggedLengths::uniform(2, 500, 500), 6, 3, 3, true);
  check(CausalMask{Alignment::bottom_right}, RaggedLengths::uniform(3, 1, 2000), 8, 2, 4, true);  // split over KV
  check(CausalMask{}, RaggedLengths::uniform(1, 900, 900), 8, 8, 64, false);  // too few tasks per band for 64
}

TEST_CASE("row bands: disjoint aligned rows, each band's keys cover its rows' allowed keys", "[attention][plan]") {
  using detail::TileSpan;
  constexpr index_t kAlign = detail::kRowSpanAlign;
  // Area of one band per tile (the hull of every allowed pair, rows widened
  // to whole groups) against the bands', summed over the tiles checked.
  index_t hull_area = 0, band_area = 0;
  const auto check_tile = [&](std::span<const TileSpan> bands, index_t block_q, index_t block_kv, const auto& allowed) {
    index_t first_row = block_q, last_row = -1, first_key = block_kv, last_key = -1;
    for (index_t r = 0; r < block_q; ++r) {
      for (index_t c = 0; c < block_kv; ++c) {
        if (!allowed(r, c)) continue;
        first_row = std::min(first_row, r);
        last_row = r;
        first_key = std::min(first_key, c);
        last_key = std::max(last_key, c);
        const auto in = std::count_if(bands.begin(), bands.end(), [&](const TileSpan& b) {
          return b.row_begin <= r && r < b.row_end && b.col_begin <= c && c < b.col_end;
        });
        CAPTURE(r, c);
        CHECK(in == 1);
      }
    }
    for (std::size_t i = 0; i < bands.size(); ++i) {
      const TileSpan& b = bands[i];
      CAPTURE(i, b.row_begin, b.row_end, b.col_begin, b.col_end);
      CHECK(b.row_begin % kAlign == 0);
      CHECK((b.row_end % kAlign == 0 || b.row_end == block_q));
      CHECK(b.row_begin < b.row_end);
      CHECK(b.row_end <= block_q);
      CHECK(b.col_begin % 2 == 0);
      CHECK(0 <= b.col_begin);
      CHECK(b.col_begin < b.col_end);
      CHECK(b.col_end <= block_kv);
      if (i > 0) CHECK(bands[i - 1].row_end <= b.row_begin);
      // A band's first and last groups allow some key (no empty rows at its edges).
      for (const index_t r0 : {index_t{b.row_begin}, (b.row_end - 1) / kAlign * kAlign}) {
        bool any = false;
        for (index_t r = r0; r < std::min(r0 + kAlign, block_q); ++r) {
          for (index_t c = 0; c < block_kv; ++c) any = any || allowed(r, c);
        }
        CHECK(any);
      }
      band_area += (b.row_end - b.row_begin) * (b.col_end - b.col_begin);
    }
    if (last_row >= 0) {
      hull_area += (std::min(block_q, (last_row / kAlign + 1) * kAlign) - first_row / kAlign * kAlign) *
                   (last_key + 1 - first_key);
    } else {
      CHECK(bands.empty());
    }
  };

  SECTION("hand-made tiles") {
    std::vector<TileSpan> out;
    const auto bands_of = [&](std::vector<TileSpan> groups, index_t block_q) {
      out.clear();
      detail::choose_row_bands(groups, block_q, out);
      return out;
    };
    // A causal diagonal through a 128 x 64 tile's first 64 rows: rows 0-15
    // see keys 0-15 and so on; rows 64-127 see all 64 keys.
    std::vector<TileSpan> diagonal;
    for (index_t g = 0; g < 8; ++g)
      diagonal.push_back({0, 0, 0, static_cast<std::int32_t>(std::min<index_t>(64, 16 * (g + 1)))});
    const std::vector<TileSpan> d = bands_of(diagonal, 128);
    check_tile(d, 128, 64, [](index_t r, index_t c) { return c <= r; });
    CHECK(d.size() > 1);
    CHECK(d.back().row_end == 128);
    CHECK(d.back().col_end == 64);
    // Nothing allowed: no band; a group in the middle allowing nothing can be in a band or not.
    CHECK(bands_of(std::vector<TileSpan>(8, TileSpan{0, 0, 64, 0}), 128).empty());
    std::vector<TileSpan> gap(8, TileSpan{0, 0, 64, 0});
    gap[0] = {0, 0, 3, 9};
    gap[7] = {0, 0, 40, 64};
    const std::vector<TileSpan> g = bands_of(gap, 128);
    check_tile(g, 128, 64, [](index_t r, index_t c) { return (r < 16 && 3 <= c && c < 9) || (r >= 112 && c >= 40); });
    REQUIRE(g.size() == 2);
    CHECK(g[0].col_begin == 2);  // rounded down to even
    CHECK(g[1].row_end == 128);
  }

  SECTION("the least row_band_cost over every split, random groups") {
    std::mt19937 rng(1207);
    std::vector<TileSpan> out;
    for (int trial = 0; trial < 300; ++trial) {
      const index_t n = std::uniform_int_distribution<index_t>(1, 8)(rng);
      std::vector<TileSpan> groups(static_cast<std::size_t>(n));
      for (TileSpan& grp : groups) {
        const int lo = std::uniform_int_distribution<int>(0, 63)(rng);
        const int hi = std::uniform_int_distribution<int>(lo + 1, 64)(rng);
        grp = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? TileSpan{0, 0, 64, 0} : TileSpan{0, 0, lo, hi};
      }
      const auto allows = [&](index_t i) {
        return groups[static_cast<std::size_t>(i)].col_begin < groups[static_cast<std::size_t>(i)].col_end;
      };
      // Every way to cut the groups into runs (a bit per boundary), each run
      // trimmed of the groups at its ends that allow nothing.
      double least = std::numeric_limits<double>::infinity();
      for (std::uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
        double cost = 0;
        for (index_t a = 0; a < n;) {
          index_t b = a + 1;
          while (b < n && !((cuts >> (b - 1)) & 1u)) ++b;
          index_t first = a, last = b - 1;
          while (first <= last && !allows(first)) ++first;
          while (last >= first && !allows(last)) --last;
          if (first <= last) {
            index_t lo = 64, hi = 0;
            for (index_t i = first; i <= last; ++i) {
              if (!allows(i)) continue;
              lo = std::min<index_t>(lo, groups[static_cast<std::size_t>(i)].col_begin);
              hi = std::max<index_t>(hi, groups[static_cast<std::size_t>(i)].col_end);
            }
            cost += detail::row_band_cost(last - first + 1, hi - lo / 2 * 2);
          }
          a = b;
        }
        least = std::min(least, cost);
      }
      out.clear();
      detail::choose_row_bands(groups, n * kAlign, out);
      double chosen = 0;
      for (const TileSpan& b : out)
        chosen += detail::row_band_cost((b.row_end - b.row_begin) / kAlign, b.col_end - b.col_begin);
      CAPTURE(trial, n);
      CHECK(std::abs(chosen - least) <= 1e-9 * least);
      check_tile(out, n * kAlign, 64, [&](index_t r, index_t c) {
        const TileSpan& grp = groups[static_cast<std::size_t>(r / kAlign)];
        return grp.col_begin <= c && c < grp.col_end;
      });
    }
  }

  SECTION("every partial tile of planned masks, both kernels' tile shapes") {
    std::mt19937 rng(1201);
    std::vector<std::int32_t> ids;
    for (std::int32_t doc = 1; ids.size() < 1500; ++doc) {
      ids.insert(ids.end(), static_cast<std::size_t>(std::uniform_int_distribution<int>(1, 300)(rng)), doc);
    }
    ids.resize(1500);
    const DocumentLayout layout =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), {1, 1500}));
    const RaggedLengths lengths = RaggedLengths::uniform(1, 1500, 1500);
    const auto check_mask = [&]<class Backend>(const auto& mask, Backend) {
      using Kernel = typename Backend::Kernel;
      const BlockMask bm = build_block_mask(mask, lengths, 1, Backend::block_shape());
      AttentionShape shape;
      shape.lengths = lengths;
      shape.heads = shape.kv_heads = 1;
      shape.dk = shape.dv = 16;
      const detail::TiledWork w = detail::plan_tiled_work<Kernel>(shape, bm, PlanOptions{}, 2);
      REQUIRE(bm.num_distinct_partial_tiles() > 0);
      REQUIRE(w.span_begin.size() == static_cast<std::size_t>(bm.num_distinct_partial_tiles() + 1));
      for (index_t id = 0; id < bm.num_distinct_partial_tiles(); ++id) {
        const auto bits = bm.tile_bits(static_cast<std::int32_t>(id));
        const auto bands = w.row_bands(static_cast<std::int32_t>(id));
        CAPTURE(id);
        check_tile(bands, Kernel::kBlockQ, Kernel::kBlockKv,
                   [&](index_t r, index_t c) { return detail::test_bit(bits.data() + r * bm.words_per_row(), c); });
      }
    };
    check_mask(document_mask(layout, CausalMask{}), backends::Highway{});
    check_mask(SlidingWindowMask{200, 0}, backends::Highway{});
    check_mask(CausalMask{}, backends::Highway{});
    check_mask(document_mask(layout, CausalMask{}), backends::Scalar{});
    check_mask(SlidingWindowMask{200, 0}, backends::Scalar{});
    check_mask(CausalMask{}, backends::Scalar{});
    // The bands compute fewer pairs than one span per tile would.
    CHECK(band_area < hull_area);
  }
}

TEST_CASE("SoftmaxState merges partial rows exactly, in any split", "[attention][softmax_state]") {
  std::mt19937 rng(131);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  const index_t n = 57, dv = 5;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> s(n), v(n * dv);
    for (auto& x : s) x = logit(rng);
    for (auto& x : v) x = logit(rng);
    for (index_t j = 0; j < n; ++j) {
      if (rng() % 4 == 0) s[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();  // masked
    }
    // Exact in double.
    double top = -INFINITY, sum = 0;
    for (float x : s) top = std::max<double>(top, x);
    std::vector<double> o(dv, 0.0);
    for (index_t j = 0; j < n; ++j) {
      if (std::isinf(s[static_cast<std::size_t>(j)])) continue;
      const double w = std::exp(s[static_cast<std::size_t>(j)] - top);
      sum += w;
      for (index_t e = 0; e < dv; ++e) o[static_cast<std::size_t>(e)] += w * v[static_cast<std::size_t>(j * dv + e)];
    }
    // Random chunks, each its own partial, merged left to right.
    SoftmaxState acc;
    std::vector<float> acc_o(dv, 0.0f);
    for (index_t begin = 0; begin < n;) {
      const index_t end = std::min<index_t>(n, begin + 1 + static_cast<index_t>(rng() % 12));
      SoftmaxState part;
      for (index_t j = begin; j < end; ++j) part.max = std::max(part.max, s[static_cast<std::size_t>(j)]);
      std::vector<float> part_o(dv, 0.0f);
      for (index_t j = begin; j < end && part.max != SoftmaxState::kNegInf; ++j) {
        const float w = std::exp(s[static_cast<std::size_t>(j)] - part.max);
        part.sum += w;
        for (index_t e = 0; e < dv; ++e)
          part_o[static_cast<std::size_t>(e)] += w * v[static_cast<std::size_t>(j * dv + e)];
      }
      merge_partial_rows(acc, acc_o.data(), part, part_o.data(), dv);
      begin = end;
    }
    CHECK(std::abs(acc.lse() - (top + std::log(sum))) <= 1e-5 * std::max(1.0, std::abs(top)));
    for (index_t e = 0; e < dv; ++e) {
      CHECK(std::abs(acc_o[static_cast<std::size_t>(e)] * acc.normalizer() - o[static_cast<std::size_t>(e)] / sum) <=
            1e-5);
    }
  }
  // Identities: an empty state, from_lse, a sink.
  SoftmaxState empty;
  CHECK(empty.lse() == -std::numeric_limits<float>::infinity());
  CHECK(empty.normalizer() == 0.0f);
  SoftmaxState a{2.0f, 3.0f};
  const auto w = a.merge(empty);
  CHECK((w.self == 1.0f && w.other == 0.0f && a.max == 2.0f && a.sum == 3.0f));
  CHECK(SoftmaxState::from_lse(1.25f).lse() == 1.25f);
  CHECK(SoftmaxState::from_lse(-std::numeric_limits<float>::infinity()).empty());
  SoftmaxState only_sink;
  CHECK(only_sink.absorb_sink(0.5f) == 0.0f);
  CHECK(only_sink.lse() == 0.5f);
  SoftmaxState with_sink{0.0f, 1.0f};
  const float rescale = with_sink.absorb_sink(0.0f);
  CHECK(rescale == 1.0f);
  CHECK(std::abs(with_sink.lse() - std::log(2.0f)) <= 1e-7);
}

}  // namespace seqattn_test_attention_plan_test
