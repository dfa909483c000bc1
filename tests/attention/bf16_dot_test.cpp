// The bf16 pair-dot path of the Highway backend (backends/highway_bf16-inl.h)
// forced on, against the fp32 reference, and against the widening path.
//
// On a CPU without AVX512_BF16 (or a build without -mavx512bf16) the forced
// native path runs the emulated pair dot: the same layouts, packing, tails and
// P rounding, so this file tests the path on every target; the instruction
// itself is tested where the binary is built for it (scripts/
// build-cpu-bundle.sh) and run on such a CPU, and through the runtime-dispatch
// library (backends::Dispatched, whose AVX3_DL body has it) on any CPU with it.
//
// Tolerances. The reference runs in fp32 on the exact fp32 values of the bf16
// inputs and writes fp32. The native path computes q.k exactly up to fp32
// summation order (bf16 x bf16 products are exact in fp32; the scale is
// applied after the dot), so its only rounding beyond the widening path's is
// P's: each weight is rounded to bf16 with relative error <= u = 2^-8, which
// moves an output element by at most u * max|V| (the weights sum to l).
// Writing the output as bf16 adds at most u * |o|. Hence, per element,
//   |o - ref| <= u * |ref| + u * max|V| (+ 1e-5 * max|V| for fp32 order),
// and for random data the errors are unbiased: NMSE about 2 * u^2 / 3
// (1e-5) at most; measured 4-5e-6 (the widening path: 2-3e-6, output
// rounding alone); we require <= 2e-5. Native against widen: both round the output, so
// one bf16 ulp (2u |o|) plus P's u * max|V|.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "seqattn/backends/amx.hpp"
#include "seqattn/backends/highway.hpp"
#include "seqattn/masks.hpp"
#if defined(SEQATTN_TEST_DISPATCH)
#include <string_view>

#include "seqattn/dispatch.hpp"
#endif

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_bf16_dot_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

constexpr double kU = 1.0 / 256.0;  // bf16 unit roundoff, 2^-8

// Which input, if any, is stored with a head-dim stride other than 1
// (storage [B, S, D, H], seen as BSHD).
enum class DimStrided { none, k, q };

// bf16 inputs and their exact fp32 copies.
struct Case {
  index_t batch, sq, skv, heads, kv_heads, d;
  Tensor<bfloat16> q, k, v;
  Tensor<float> qf, kf, vf;
  DimStrided strided = DimStrided::none;
  Case(std::mt19937& rng, index_t batch_, index_t sq_, index_t skv_, index_t heads_, index_t kv_heads_, index_t d_,
       DimStrided strided_ = DimStrided::none)
      : batch(batch_),
        sq(sq_),
        skv(skv_),
        heads(heads_),
        kv_heads(kv_heads_),
        d(d_),
        q(random_tensor<bfloat16>(strided_ == DimStrided::q ? detail::make_extents({batch, sq, d, heads})
                                                            : detail::make_extents({batch, sq, heads, d}),
                                  rng)),
        k(random_tensor<bfloat16>(strided_ == DimStrided::k ? detail::make_extents({batch, skv, d, kv_heads})
                                                            : detail::make_extents({batch, skv, kv_heads, d}),
                                  rng)),
        v(random_tensor<bfloat16>(detail::make_extents({batch, skv, kv_heads, d}), rng)),
        qf(widen(q)),
        kf(widen(k)),
        vf(widen(v)),
        strided(strided_) {}
  static Tensor<float> widen(const Tensor<bfloat16>& t) {
    Tensor<float> f(t.shape());
    for (index_t i = 0; i < t.size(); ++i) f.data()[i] = to_float(t.data()[i]);
    return f;
  }
  // Q or K as BSHD: in place, or (`which` strided) over [B, S, D, H] storage.
  template <class T>
  TensorView<const T> view(const Tensor<T>& t, DimStrided which, index_t len, index_t h) const {
    if (strided != which) return TensorView<const T>(t.data(), t.shape());
    const index_t sd = h, sh = 1, ss = d * h, sb = len * ss;
    return TensorView<const T>(t.data(), detail::make_extents({batch, len, h, d}),
                               detail::make_extents({sb, ss, sh, sd}));
  }
  AttentionInputs<bfloat16> in() const {
    return {view(q, DimStrided::q, sq, heads), view(k, DimStrided::k, skv, kv_heads),
            TensorView<const bfloat16>(v.data(), v.shape())};
  }
  AttentionInputs<float> in_f32() const {
    return {view(qf, DimStrided::q, sq, heads), view(kf, DimStrided::k, skv, kv_heads),
            TensorView<const float>(vf.data(), vf.shape())};
  }
  Extents out_shape() const { return detail::make_extents({batch, sq, heads, d}); }
  Extents lse_shape() const { return detail::make_extents({batch, heads, sq}); }
  double max_abs_v() const {
    double m = 0;
    for (index_t i = 0; i < vf.size(); ++i) m = std::max(m, std::abs(static_cast<double>(vf.data()[i])));
    return m;
  }
};

struct Run {
  Tensor<bfloat16> out;
  Tensor<float> lse;
  std::uint64_t native_tasks = 0, amx_tasks = 0;
};

template <class Backend = backends::Highway, class M, class Var>
Run run_highway(const Case& x, const M& mask, const Var& variant, Bf16DotPath path, int workers, index_t kv_splits) {
  const Bf16PathScope scope(path);
  Run r{Tensor<bfloat16>(x.out_shape(), from_float<bfloat16>(7.0f)), Tensor<float>(x.lse_shape(), 7.0f)};
  execution::ThreadPool pool(workers);
  const auto plan = plan_attention<Backend>(shape_of(x.in()), mask, PlanOptions{kv_splits}, workers);
  const std::uint64_t before = bf16_native_tasks(), amx_before = bf16_amx_tasks();
  attention_forward(plan, x.in(), r.out.view(), r.lse.view(), variant, pool);
  r.native_tasks = bf16_native_tasks() - before;
  r.amx_tasks = bf16_amx_tasks() - amx_before;
  return r;
}

template <class M, class Var>
std::pair<Tensor<float>, Tensor<float>> run_reference(const Case& x, const M& mask, const Var& variant) {
  Tensor<float> out(x.out_shape(), 7.0f), lse(x.lse_shape(), 7.0f);
  attention_forward(plan_attention<backends::Reference>(shape_of(x.in_f32()), mask), x.in_f32(), out.view(), lse.view(),
                    variant);
  return {std::move(out), std::move(lse)};
}

// Element bound of the header comment; returns the NMSE.
double check_elements(const Tensor<bfloat16>& got, const Tensor<float>& want, double rel, double abs_tol) {
  REQUIRE(got.shape() == want.shape());
  index_t bad = 0, first_bad = -1;
  double sq_diff = 0, sq_ref = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = to_float(got.data()[i]), w = want.data()[i];
    const double diff = std::abs(g - w);
    if (!(diff <= rel * std::abs(w) + abs_tol) && bad++ == 0) first_bad = i;
    sq_diff += diff * diff;
    sq_ref += w * w;
  }
  INFO("first element out of bound: " << first_bad << " of " << got.size());
  CHECK(bad == 0);
  return sq_ref > 0 ? sq_diff / sq_ref : sq_diff;
}

// Forced native, forced AMX and forced widen against the reference and each
// other. expect_native: whether the native path should have taken any task;
// AMX takes such tasks where the CPU has it, dk is a multiple of 32 (>= 64)
// and stacked groups fill 16-row blocks. Where the CPU has no AMX, forcing it
// runs the automatic choice, checked against the reference all the same (the
// AMX arithmetic itself is then untested: the test prints no AMX tasks).
template <class Backend = backends::Highway, class M, class Var>
void check_case(const Case& x, const M& mask, const Var& variant, bool expect_native, int workers = 2,
                index_t kv_splits = 0) {
  const auto [want, want_lse] = run_reference(x, mask, variant);
  const Run native = run_highway<Backend>(x, mask, variant, Bf16DotPath::native, workers, kv_splits);
  const Run widen = run_highway<Backend>(x, mask, variant, Bf16DotPath::widen, workers, kv_splits);
  const Run tiles = run_highway<Backend>(x, mask, variant, Bf16DotPath::amx, workers, kv_splits);
  const double vmax = x.max_abs_v();
  INFO("sq " << x.sq << " skv " << x.skv << " heads " << x.heads << "/" << x.kv_heads << " d " << x.d);
  CHECK(widen.native_tasks == 0);
  CHECK(widen.amx_tasks == 0);
  CHECK(native.amx_tasks == 0);
  // Stacked K/V groups need whole 16-row blocks per group (vectors suffice for
  // pairs), or, in decode (at most 32 rows a task), groups under 16 rows (one
  // narrowed AMX tile each).
  const index_t group_rows = x.sq * (x.heads / x.kv_heads);
  const bool decode = x.sq * x.heads <= 32 || (x.heads == x.kv_heads && x.sq <= 32);
  const bool groups_fit = x.heads == x.kv_heads || group_rows % 16 == 0 || (decode && group_rows < 16);
  if (amx::available() && expect_native && x.d % 32 == 0 && x.d >= 64 && groups_fit) {
    CHECK(tiles.amx_tasks > 0);
  } else if (!amx::available()) {
    CHECK(tiles.amx_tasks == 0);
  }
  const double nmse_amx = check_elements(tiles.out, want, kU, kU * vmax + 1e-5 * vmax);
  INFO("NMSE amx " << nmse_amx << " (" << tiles.amx_tasks << " AMX tasks)");
  CHECK(nmse_amx <= 2e-5);
  check_lse(tiles.lse, want_lse, 1e-5);
  if (expect_native) {
    CHECK(native.native_tasks > 0);
  } else {
    CHECK(native.native_tasks == 0);
  }
  const double nmse_native = check_elements(native.out, want, kU, kU * vmax + 1e-5 * vmax);
  const double nmse_widen = check_elements(widen.out, want, kU, 1e-5 * vmax);
  INFO("NMSE native " << nmse_native << ", widen " << nmse_widen);
  CHECK(nmse_native <= 2e-5);
  // Native against widen: one bf16 ulp of the output plus P's rounding.
  const Tensor<float> widen_f32 = Case::widen(widen.out);
  check_elements(native.out, widen_f32, 2 * kU, kU * vmax + 1e-5 * vmax);
  // The scores are the same up to fp32 order: the LSE agrees closely.
  check_lse(native.lse, want_lse, 1e-5);
  check_lse(native.lse, widen.lse, 1e-5);
}

}  // namespace

TEST_CASE("bf16 dot path: randomized prefill shapes and masks against the fp32 reference", "[bf16_dot]") {
  std::mt19937 rng(1301);
  const index_t dims[] = {64, 72, 80, 128, 33};
  const index_t lens[] = {45, 70, 127, 130, 200, 257};
  const std::pair<index_t, index_t> groups[] = {{4, 4}, {6, 2}, {8, 1}};
  for (int trial = 0; trial < 10; ++trial) {
    const index_t d = dims[trial % 5];
    const index_t sq = lens[rng() % 6];
    const index_t skv = trial % 3 == 0 ? lens[rng() % 6] : sq;
    const auto [heads, kv_heads] = groups[rng() % 3];
    const index_t batch = 1 + trial % 2;
    const Case x(rng, batch, sq, skv, heads, kv_heads, d);
    DYNAMIC_SECTION("trial " << trial << ": B " << batch << " sq " << sq << " skv " << skv << " d " << d << " heads "
                             << heads << "/" << kv_heads) {
      check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
      check_case(x, FullMask{}, variants::Default{}, true);
    }
  }
}

TEST_CASE("bf16 dot path: documents with empty segments, rows that see nothing", "[bf16_dot]") {
  std::mt19937 rng(1302);
  const Case x(rng, 1, 203, 203, 4, 2, 80);
  SECTION("documents, some of length 0") {
    check_case(x, TestDocumentMask{{37, 0, 5, 90, 0, 1, 64}}, variants::Default{}, true);
  }
  SECTION("every third row fully masked") { check_case(x, TestBlankRowsMask{}, variants::Default{}, true); }
  SECTION("sliding window") {
    check_case(x, SlidingWindowMask{20, 3, Alignment::bottom_right}, variants::Default{}, true);
  }
  SECTION("random dense predicate") { check_case(x, TestRandomDenseMask{17, 0.35f}, variants::Default{}, true); }
}

#if SEQATTN_HAS_AMX
// User code that uses AMX on the engine's thread, as a ScoreMod running oneDNN
// would: it leaves the thread's tiles released, or configured its own way.
__attribute__((target("amx-tile"))) void use_amx_elsewhere(int n) {
  if (n % 2 == 0) {
    _tile_release();
  } else {
    amx::detail::load_config(amx::detail::narrow_config(4, 4));
  }
}
#endif

TEST_CASE("bf16 dot path: score variants run on the native path", "[bf16_dot]") {
  // The variant hooks act on the fp32 scores, the same on both paths.
  std::mt19937 rng(1303);
  const Case x(rng, 2, 150, 150, 6, 2, 72);
  std::vector<float> slopes, sinks;
  for (index_t h = 0; h < x.heads; ++h) {
    slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(x.heads)));
    sinks.push_back(0.5f * static_cast<float>(h % 3) - 0.25f);
  }
  SECTION("softcap") { check_case(x, CausalMask{}, variants::Softcap{5.0f}, true); }
  SECTION("ALiBi") { check_case(x, CausalMask{Alignment::bottom_right}, variants::Alibi{slopes}, true); }
  SECTION("sinks") { check_case(x, CausalMask{}, variants::Sinks{sinks}, true); }
  SECTION("scale, softcap and ALiBi chained") {
    check_case(x, FullMask{}, variants::chain(variants::Scale{0.2f}, variants::Softcap{3.0f}, variants::Alibi{slopes}),
               true);
  }
  SECTION("a ScoreMod that uses AMX itself between a tile's products") {
    // Head dim 64, so the AMX path takes the call where the CPU has it; the
    // tiles the task keeps configured (amx::TileScope) must survive the hook
    // releasing them or loading another configuration.
    const Case y(rng, 2, 150, 150, 6, 2, 64);
    const auto hook = variants::ScoreMod{[](float s, index_t, index_t, index_t, index_t) {
#if SEQATTN_HAS_AMX
      thread_local int calls = 0;
      if (amx::available()) use_amx_elsewhere(calls++);
#endif
      return s;
    }};
    check_case(y, CausalMask{}, hook, true);
  }
}

TEST_CASE("bf16 dot path: GQA heads stacked as rows of one task", "[bf16_dot]") {
  // Few queries per sequence with large GQA groups: the plan stacks a group's
  // heads (and, where each group fills whole vectors, several K/V heads) into
  // the rows of one task, so the path's row offsets per K/V group run.
  std::mt19937 rng(1307);
  SECTION("16 queries, 8 heads over 1 K/V head: 128 stacked rows") {
    const Case x(rng, 1, 16, 150, 8, 1, 64);
    check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
  SECTION("8 queries, 16 heads over 2 K/V heads: two groups of 64 rows in one task") {
    const Case x(rng, 2, 8, 97, 16, 2, 72);
    check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
  SECTION("5 queries, 16 heads over 2 K/V heads: 40 rows per task, padded") {
    const Case x(rng, 1, 5, 130, 16, 2, 128);
    check_case(x, FullMask{}, variants::Default{}, true);
  }
}

TEST_CASE("bf16 dot path: KV splits and odd head dims", "[bf16_dot]") {
  std::mt19937 rng(1304);
  SECTION("kv splits merge native partials") {
    const Case x(rng, 1, 140, 300, 4, 4, 64);
    check_case(x, FullMask{}, variants::Default{}, true, 2, 3);
  }
  SECTION("d = 17") {
    const Case x(rng, 1, 100, 77, 2, 1, 17);
    check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
  SECTION("d = 1") {
    const Case x(rng, 1, 66, 65, 2, 2, 1);
    check_case(x, FullMask{}, variants::Default{}, true);
  }
}

TEST_CASE("bf16 dot path: the widening path keeps what native does not take", "[bf16_dot]") {
  std::mt19937 rng(1305);
  SECTION("K with a head-dim stride other than 1") {
    const Case x(rng, 1, 130, 130, 4, 2, 72, DimStrided::k);
    check_case(x, CausalMask{}, variants::Default{}, false);
  }
}

TEST_CASE("bf16 dot path: Q with a head-dim stride other than 1 is packed element by element", "[bf16_dot]") {
  // The vector packing of Qt2 reads unit-stride rows only; the others take
  // the element loop, on the same native path.
  std::mt19937 rng(1311);
  SECTION("prefill, odd head dim") {
    const Case x(rng, 1, 130, 130, 4, 2, 33, DimStrided::q);
    check_case(x, CausalMask{}, variants::Default{}, true);
  }
  SECTION("stacked GQA rows") {
    const Case x(rng, 2, 5, 97, 16, 2, 72, DimStrided::q);
    check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
}

// Decode (at most 32 rows a task): the pair dot's 8-row blocks (8-row groups
// on AVX3; full vectors elsewhere), AMX with narrowed tiles, and widening,
// each forced, element by element against the fp32 reference. Query
// lengths 1-4, GQA groups of 1, 4, 8 and 16 (32/4 and 16/2 stack their K/V
// groups into one task), key lengths that are no multiple of the 64-key
// tile, head dims 128, 72, 80, 64, 33 and 256.
TEST_CASE("bf16 dot path: decode shapes on every bf16 path against the fp32 reference", "[bf16_dot][decode]") {
  std::mt19937 rng(1309);
  const index_t dims[] = {128, 72, 80, 64, 33, 256};
  const index_t kv_lens[] = {1, 63, 65, 300, 777, 129};
  struct Heads {
    index_t heads, kv_heads, max_sq;
  };
  const Heads groups[] = {{32, 4, 1}, {8, 1, 4}, {16, 2, 2}, {8, 2, 4}, {4, 4, 4}};
  for (int trial = 0; trial < 12; ++trial) {
    const Heads g = groups[trial % 5];
    const index_t d = dims[trial % 6];
    const index_t sq = 1 + static_cast<index_t>(rng() % static_cast<unsigned>(g.max_sq));
    const index_t skv = std::max(sq, kv_lens[static_cast<std::size_t>(rng() % 6)]);
    const index_t batch = 1 + trial % 2;
    const Case x(rng, batch, sq, skv, g.heads, g.kv_heads, d);
    DYNAMIC_SECTION("trial " << trial << ": B " << batch << " sq " << sq << " skv " << skv << " d " << d << " heads "
                             << g.heads << "/" << g.kv_heads) {
      check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
      check_case(x, SlidingWindowMask{50, 0, Alignment::bottom_right}, variants::Softcap{5.0f}, true, 2, 3);
    }
  }
}

// The decode QK^T reads K 8 dims a broadcast: head dims that leave 1-7 dims
// after the last 8 (a masked tail), and the largest its stack buffers take.
TEST_CASE("bf16 dot path: decode head dims with a partial last block of 8", "[bf16_dot][decode]") {
  std::mt19937 rng(1312);
  for (const index_t d : {1, 3, 20, 46, 127, 512}) {
    for (const index_t heads : {32, 8}) {
      const Case x(rng, 1, 1, 130, heads, heads / 8, d);
      DYNAMIC_SECTION("d " << d << " heads " << heads << "/" << heads / 8) {
        check_case(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
      }
    }
  }
}

// The NaN policy on the decode blocks (attention/softmax_state.hpp): a NaN K
// element reaches only the rows of its K/V head that see it; infinities and
// NaN in keys a window hides (inside a partial tile, so their weights are
// zero next to non-zero ones) change nothing; an infinite V element the rows
// see gives them inf / NaN as in the reference.
TEST_CASE("bf16 dot path: decode follows the NaN policy on every bf16 path", "[bf16_dot][decode][nan]") {
  std::mt19937 rng(1310);
  for (const index_t d : {128, 72}) {
    Case x(rng, 1, 1, 300, 32, 4, d);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (index_t e = 0; e < d; ++e) {  // key 195: hidden by the window below (visible keys 199..299)
      x.v(0, 195, 2, e) = bfloat16(e % 2 ? nan : inf);
      x.k(0, 195, 2, e) = bfloat16(nan);
    }
    x.k(0, 250, 1, 3) = bfloat16(nan);  // query heads 8..15 see it
    x.v(0, 260, 3, 5) = bfloat16(inf);  // heads 24..31: dim 5 inf
    x.qf = Case::widen(x.q);
    x.kf = Case::widen(x.k);
    x.vf = Case::widen(x.v);
    const SlidingWindowMask mask{100, 0, Alignment::bottom_right};
    Tensor<float> want(x.out_shape()), want_lse(x.lse_shape());
    attention_forward(plan_attention<backends::Reference>(shape_of(x.in_f32()), mask), x.in_f32(), want.view(),
                      want_lse.view());
    for (const Bf16DotPath path : {Bf16DotPath::native, Bf16DotPath::amx, Bf16DotPath::widen}) {
      INFO("d " << d << ", path " << static_cast<int>(path));
      const Run r = run_highway(x, mask, variants::Default{}, path, 2, 0);
      index_t bad = 0, nan_rows = 0;
      for (index_t h = 0; h < x.heads; ++h) {
        for (index_t e = 0; e < d; ++e) {
          const float g = to_float(r.out(0, 0, h, e)), w = want(0, 0, h, e);
          if (std::isnan(w) || std::isnan(g)) {
            bad += !(std::isnan(w) && std::isnan(g));
          } else if (std::isinf(w) || std::isinf(g)) {
            bad += g != w;
          } else {
            bad += !(std::abs(g - w) <= kU * std::abs(w) + 6 * kU);
          }
        }
        nan_rows += std::isnan(want(0, 0, h, 0));
      }
      CHECK(nan_rows == 8);  // heads 8..15
      CHECK(bad == 0);
    }
  }
}

// The AMX A-operand packer against its definition, element by element: both
// orientations (P^T from St[key][row] in the forward and the backward's dS^T;
// dS rows in the backward), row and column counts off the 16-row and 32-column
// blocks, padding rows and columns, values that round up, down and to even.
// Where AMX runs this is the vector packer; elsewhere the scalar loop.
TEST_CASE("amx::bf16_rows packs rows and columns as rounding element by element", "[bf16_dot][amx]") {
  std::mt19937 rng(2711);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  constexpr index_t kStride = 128;  // the engine's St / dP row length (kBlockQ)
  std::vector<float> src(static_cast<std::size_t>(kStride * kStride));
  for (float& x : src) x = value(rng);
  // Exact halfway cases: ties to even, both ways.
  src[0] = std::bit_cast<float>(0x3F808000u);
  src[1] = std::bit_cast<float>(0x3F818000u);
  src[kStride] = std::bit_cast<float>(0x3F807FFFu);
  int shapes = 0;
  for (const bool across : {true, false}) {
    for (const index_t rows : {1, 7, 8, 16, 17, 40, 64, 128}) {
      for (const index_t cols : {1, 2, 31, 32, 33, 63, 64, 100, 128}) {
        const index_t len = (cols + 31) / 32 * 32;
        const index_t rows_pad = rows < 16 ? rows + (rows % 2) : (rows + 15) / 16 * 16;
        const std::ptrdiff_t row_step = across ? 1 : kStride, col_step = across ? kStride : 1;
        std::vector<std::uint16_t> got(static_cast<std::size_t>(rows_pad * len), 0xFFFF);
        amx::bf16_rows(src.data(), row_step, col_step, rows, cols, len, rows_pad, got.data());
        int bad = 0;
        for (index_t r = 0; r < rows_pad; ++r) {
          for (index_t c = 0; c < len; ++c) {
            const std::uint16_t want = r < rows && c < cols
                                           ? bfloat16(src[static_cast<std::size_t>(r * row_step + c * col_step)]).bits
                                           : std::uint16_t{0};
            bad += got[static_cast<std::size_t>(r * len + c)] != want;
          }
        }
        INFO((across ? "across" : "along") << " rows " << rows << " cols " << cols << " rows_pad " << rows_pad);
        CHECK(bad == 0);
        ++shapes;
      }
    }
  }
  CHECK(shapes == 2 * 8 * 9);
}

// amx::matmul_sum (the backward's dQ: one term per visit of a q-tile) is
// matmul after matmul, bit for bit: C's tiles hold fp32 between the terms
// either way. Terms of 1 to 3 steps with their own strides, C of whole and
// narrowed (decode-sized) tiles, overwritten and accumulated; and each sum
// against an fp64 reference. AMX has no other implementation: on a CPU
// without it there is nothing to run, and the test says so.
TEST_CASE("amx::matmul_sum adds its terms in order as one matmul after another", "[bf16_dot][amx]") {
  if (!amx::available()) {
    WARN("this CPU has no AMX: amx::matmul_sum not run");
    return;
  }
  std::mt19937 rng(2713);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const auto random_bf16 = [&](index_t n) {
    std::vector<std::uint16_t> v(static_cast<std::size_t>(n));
    for (std::uint16_t& x : v) x = bfloat16(value(rng)).bits;
    return v;
  };
  int shapes = 0;
  for (const index_t a_rows : {8, 16, 48, 128}) {
    for (const index_t b_cols : {8, 16, 32, 128}) {
      for (const int count : {1, 2, 4}) {
        for (const bool accumulate : {false, true}) {
          std::vector<std::vector<std::uint16_t>> a_data, b_data;
          std::vector<amx::Term> terms;
          for (int t = 0; t < count; ++t) {
            const index_t steps = 1 + (t + a_rows / 16) % 3, a_len = steps * 32 + 32 * (t % 2);  // padded A rows
            const index_t b_len = b_cols + 16 * (t % 2);                                         // padded B rows
            a_data.push_back(random_bf16(a_rows * a_len));
            b_data.push_back(random_bf16(steps * 16 * b_len * 2));
            terms.push_back({a_data.back().data(), static_cast<std::size_t>(a_len) * 2, b_data.back().data(),
                             static_cast<std::size_t>(b_len) * 4, steps});
          }
          std::vector<float> c0(static_cast<std::size_t>(a_rows * b_cols));
          for (float& x : c0) x = value(rng);
          std::vector<float> one_by_one = c0, summed = c0;
          for (int t = 0; t < count; ++t) {
            const amx::Term& m = terms[static_cast<std::size_t>(t)];
            amx::matmul(m.a, m.a_stride, a_rows, m.b, m.b_stride, b_cols, m.steps, one_by_one.data(), b_cols * 4,
                        accumulate || t > 0);
          }
          amx::matmul_sum(terms.data(), count, a_rows, b_cols, summed.data(), b_cols * 4, accumulate);
          int differ = 0, far = 0;
          for (index_t i = 0; i < a_rows; ++i) {
            for (index_t j = 0; j < b_cols; ++j) {
              double want = accumulate ? c0[static_cast<std::size_t>(i * b_cols + j)] : 0.0, size = std::abs(want);
              for (const amx::Term& m : terms) {
                const auto* a = static_cast<const std::uint16_t*>(m.a);
                const auto* b = static_cast<const std::uint16_t*>(m.b);
                for (index_t k = 0; k < m.steps * 32; ++k) {
                  const double x = to_float(bfloat16::from_bits(a[i * (m.a_stride / 2) + k])) *
                                   to_float(bfloat16::from_bits(b[(k / 2) * (m.b_stride / 2) + 2 * j + k % 2]));
                  want += x;
                  size += std::abs(x);
                }
              }
              const float got = summed[static_cast<std::size_t>(i * b_cols + j)];
              differ += std::bit_cast<std::uint32_t>(got) !=
                        std::bit_cast<std::uint32_t>(one_by_one[static_cast<std::size_t>(i * b_cols + j)]);
              far += std::abs(got - want) > 1e-5 * size;
            }
          }
          INFO("a_rows " << a_rows << " b_cols " << b_cols << " terms " << count << " accumulate " << accumulate);
          CHECK(differ == 0);
          CHECK(far == 0);
          ++shapes;
        }
      }
    }
  }
  CHECK(shapes == 96);
}

TEST_CASE("bf16 dot path: automatic choice and bad settings", "[bf16_dot]") {
  using Kernel = seqattn::HWY_NAMESPACE::Bf16DotKernel;
  std::mt19937 rng(1306);
  const Case x(rng, 1, 130, 130, 4, 4, 64);
  const Run r = run_highway(x, CausalMask{}, variants::Default{}, Bf16DotPath::automatic, 2, 0);
  // The fastest of the paths the probe timed; without the instruction the
  // emulation is never chosen automatically.
  const auto& s = Kernel::probed();
  INFO("probe: widen " << s.widen * 1e6 << " us, pairs " << s.pairs * 1e6 << " us, amx " << s.amx * 1e6 << " us");
  const bool amx_wins = amx::available() && s.amx < s.widen && s.amx <= s.pairs;
  CHECK((r.amx_tasks > 0) == amx_wins);
  if (!Kernel::kNative) CHECK(r.native_tasks == 0);
  if (Kernel::kNative) CHECK((r.native_tasks > 0) == (!amx_wins && s.pairs < s.widen));
  CHECK_THROWS_AS(set_bf16_dot_path(static_cast<Bf16DotPath>(4)), std::invalid_argument);
  CHECK(bf16_dot_path() == static_cast<Bf16DotPath>(SEQATTN_BF16_DOT));
}

#if defined(SEQATTN_TEST_DISPATCH)
// The runtime-dispatch library compiles the instruction into its AVX3_DL body
// and runs it where CPUID reports AVX512_BF16: the same checks through
// backends::Dispatched (with the instruction on such a CPU, the emulation on
// other AVX3_DL CPUs, and the other targets' emulation elsewhere).
TEST_CASE("bf16 dot path: the runtime-dispatched kernels", "[bf16_dot][dispatch]") {
  const std::string_view target = dispatch::best_simd_target();
  INFO("dispatched target " << target);
  CHECK(dispatch::bf16_dot_instruction() == (target == "AVX3_DL" && detail::cpu_has_avx512_bf16()));
  std::mt19937 rng(1308);
  SECTION("causal, bottom-right, GQA 6/2, d = 80") {
    const Case x(rng, 2, 200, 203, 6, 2, 80);
    check_case<backends::Dispatched>(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
  SECTION("documents with empty segments, sinks") {
    const Case x(rng, 1, 203, 203, 4, 2, 72);
    const std::vector<float> sinks{0.5f, -1.0f, 0.0f, 2.0f};
    check_case<backends::Dispatched>(x, TestDocumentMask{{37, 0, 5, 90, 0, 1, 70}}, variants::Sinks{sinks}, true);
  }
  SECTION("kv splits, d = 33") {
    const Case x(rng, 1, 140, 300, 4, 4, 33);
    check_case<backends::Dispatched>(x, FullMask{}, variants::Default{}, true, 2, 3);
  }
  SECTION("decode: the pair dot's 8-row blocks, GQA 32/4") {
    const Case x(rng, 2, 1, 300, 32, 4, 128);
    check_case<backends::Dispatched>(x, CausalMask{Alignment::bottom_right}, variants::Default{}, true);
  }
}
#endif

}  // namespace seqattn_test_attention_bf16_dot_test
