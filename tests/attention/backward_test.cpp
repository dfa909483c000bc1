// The backward pass: the reference backward against central finite
// differences of a double-precision forward; the tiled backends against the
// reference on every mask kind, head dims 64..256, GQA, decode and ragged THD
// shapes, every score variant; fully masked rows; determinism across worker
// counts; errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_backward_test {

using namespace seqattn;
using namespace seqattn::testing;
using Catch::Matchers::Contains;

namespace {

struct Problem {
  Extents q_shape, kv_shape, out_shape, lse_shape;
  Tensor<float> q, k, v, dout;
  const SegmentTable* segments = nullptr;

  Problem(std::mt19937& rng, index_t batch, index_t sq, index_t skv, index_t heads, index_t kv_heads, index_t d)
      : q_shape(detail::make_extents({batch, sq, heads, d})),
        kv_shape(detail::make_extents({batch, skv, kv_heads, d})),
        out_shape(q_shape),
        lse_shape(detail::make_extents({batch, heads, sq})),
        q(random_tensor<float>(q_shape, rng)),
        k(random_tensor<float>(kv_shape, rng)),
        v(random_tensor<float>(kv_shape, rng)),
        dout(random_tensor<float>(out_shape, rng)) {}
  // THD: q [tq, heads, d], k/v [tkv, kv_heads, d].
  Problem(std::mt19937& rng, const SegmentTable& table, index_t tq, index_t tkv, index_t heads, index_t kv_heads,
          index_t d)
      : q_shape(detail::make_extents({tq, heads, d})),
        kv_shape(detail::make_extents({tkv, kv_heads, d})),
        out_shape(q_shape),
        lse_shape(detail::make_extents({heads, tq})),
        q(random_tensor<float>(q_shape, rng)),
        k(random_tensor<float>(kv_shape, rng)),
        v(random_tensor<float>(kv_shape, rng)),
        dout(random_tensor<float>(out_shape, rng)),
        segments(&table) {}
  AttentionInputs<float> in() const { return {q.view(), k.view(), v.view(), segments}; }
};

struct Grads {
  Tensor<float> dq, dk, dv;
  std::vector<float> dsinks;
  explicit Grads(const Problem& x, index_t heads = 0)
      : dq(x.q_shape, 7.0f), dk(x.kv_shape, 7.0f), dv(x.kv_shape, 7.0f), dsinks(static_cast<std::size_t>(heads)) {}
  AttentionGrads<float> views() { return {dq.view(), dk.view(), dv.view(), dsinks}; }
};

// Forward with Backend, then backward with the same plan.
template <class Backend, class M, class V>
Grads run_backward(const Problem& x, const M& mask, const V& variant, int workers, index_t heads_for_sinks = 0) {
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<Backend>(shape_of(x.in()), mask, options, workers);
  Tensor<float> out(x.out_shape), lse(x.lse_shape);
  execution::ThreadPool pool(workers);
  attention_forward(plan, x.in(), out.view(), lse.view(), variant, pool);
  Grads g(x, heads_for_sinks);
  attention_backward(plan, x.in(), out.view(), lse.view(), x.dout.view(), g.views(), variant, pool);
  return g;
}

// Every gradient within `tol` of the reference, relative to the largest
// reference value of that tensor.
void check_grads(const Grads& got, const Grads& want, double tol) {
  CHECK(compare(got.dq, want.dq).relative() <= tol);
  CHECK(compare(got.dk, want.dk).relative() <= tol);
  CHECK(compare(got.dv, want.dv).relative() <= tol);
  for (std::size_t h = 0; h < want.dsinks.size(); ++h) {
    CHECK(std::abs(got.dsinks[h] - want.dsinks[h]) <= tol * std::max(1.0f, std::abs(want.dsinks[h])));
  }
}

template <class Backend, class M, class V = variants::Default>
void check_against_reference(const Problem& x, const M& mask, int workers, const V& variant = {},
                             index_t heads_for_sinks = 0) {
  const Grads want = run_backward<backends::Reference>(x, mask, variant, 1, heads_for_sinks);
  const Grads got = run_backward<Backend>(x, mask, variant, workers, heads_for_sinks);
  check_grads(got, want, 2e-4);
}

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

}  // namespace

// ---- The reference against finite differences -------------------------------

namespace {

using Logit = std::function<double(double scaled, index_t h, index_t q, index_t kv)>;

// L = sum(out * W) of BSHD attention in double, from flat q, k, v and sinks.
struct DoubleForward {
  index_t sq, skv, heads, kv_heads, d;
  double scale;
  std::function<bool(index_t h, index_t q, index_t kv)> allowed;
  Logit logit;
  bool with_sinks = false;

  double loss(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
              const std::vector<double>& sinks, const std::vector<double>& w) const {
    double total = 0.0;
    const index_t group = heads / kv_heads;
    for (index_t h = 0; h < heads; ++h) {
      for (index_t i = 0; i < sq; ++i) {
        std::vector<double> z(static_cast<std::size_t>(skv), -INFINITY);
        double top = with_sinks ? sinks[static_cast<std::size_t>(h)] : -INFINITY;
        for (index_t j = 0; j < skv; ++j) {
          if (!allowed(h, i, j)) continue;
          double dot = 0;
          for (index_t e = 0; e < d; ++e) {
            dot += q[static_cast<std::size_t>((i * heads + h) * d + e)] *
                   k[static_cast<std::size_t>((j * kv_heads + h / group) * d + e)];
          }
          z[static_cast<std::size_t>(j)] = logit(scale * dot, h, i, j);
          top = std::max(top, z[static_cast<std::size_t>(j)]);
        }
        if (std::isinf(top)) continue;
        double sum = with_sinks ? std::exp(sinks[static_cast<std::size_t>(h)] - top) : 0.0;
        for (double x : z) sum += std::exp(x - top);
        for (index_t j = 0; j < skv; ++j) {
          const double p = std::exp(z[static_cast<std::size_t>(j)] - top) / sum;
          for (index_t e = 0; e < d; ++e) {
            total += p * v[static_cast<std::size_t>((j * kv_heads + h / group) * d + e)] *
                     w[static_cast<std::size_t>((i * heads + h) * d + e)];
          }
        }
      }
    }
    return total;
  }
};

std::vector<double> to_double(const Tensor<float>& t) { return {t.values().begin(), t.values().end()}; }

// Central differences of every input element against the reference backward.
template <class M, class V>
void check_finite_differences(const M& mask, const V& variant, const DoubleForward& f, std::vector<float> sinks = {}) {
  std::mt19937 rng(401);
  const Problem x(rng, 1, f.sq, f.skv, f.heads, f.kv_heads, f.d);
  const Grads g = run_backward<backends::Reference>(x, mask, variant, 1, sinks.empty() ? 0 : f.heads);
  std::vector<double> q = to_double(x.q), k = to_double(x.k), v = to_double(x.v), w = to_double(x.dout);
  std::vector<double> s(sinks.begin(), sinks.end());
  const double eps = 1e-5;
  index_t bad = 0, checked = 0;
  auto probe = [&](std::vector<double>& values, const float* analytic) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double keep = values[i];
      values[i] = keep + eps;
      const double up = f.loss(q, k, v, s, w);
      values[i] = keep - eps;
      const double down = f.loss(q, k, v, s, w);
      values[i] = keep;
      const double numeric = (up - down) / (2 * eps);
      ++checked;
      if (std::abs(numeric - analytic[i]) > 1e-4 * std::max(1.0, std::abs(numeric))) {
        if (bad++ < 5) UNSCOPED_INFO("element " << i << ": numeric " << numeric << ", analytic " << analytic[i]);
      }
    }
  };
  probe(q, g.dq.data());
  probe(k, g.dk.data());
  probe(v, g.dv.data());
  if (!s.empty()) probe(s, g.dsinks.data());
  CHECK(checked > 0);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("the reference backward equals finite differences of the forward", "[attention][backward]") {
  DoubleForward f{6, 9, 4, 2, 5, 1.0 / std::sqrt(5.0), nullptr, nullptr};
  f.logit = [](double s, index_t, index_t, index_t) { return s; };
  SECTION("causal, bottom-right, GQA 2") {
    f.allowed = [](index_t, index_t q, index_t kv) { return kv <= q + 3; };
    check_finite_differences(CausalMask{Alignment::bottom_right}, variants::Default{}, f);
  }
  SECTION("rows with no allowed key") {
    f.allowed = [](index_t, index_t q, index_t kv) { return q % 3 != 1 && kv <= q; };
    check_finite_differences(TestBlankRowsMask{}, variants::Default{}, f);
  }
  SECTION("softcap with a scale") {
    f.scale = 0.8;
    f.allowed = [](index_t, index_t, index_t) { return true; };
    f.logit = [](double s, index_t, index_t, index_t) { return 1.5 * std::tanh(s / 1.5); };
    check_finite_differences(FullMask{}, variants::chain(variants::Scale{0.8f}, variants::Softcap{1.5f}), f);
  }
  SECTION("ALiBi") {
    static const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
    f.allowed = [](index_t, index_t q, index_t kv) { return kv <= q + 3; };
    f.logit = [](double s, index_t h, index_t q, index_t kv) {
      return s - slopes[static_cast<std::size_t>(h)] * static_cast<double>(std::abs(q + 3 - kv));
    };
    check_finite_differences(CausalMask{Alignment::bottom_right}, variants::Alibi{slopes}, f);
  }
  SECTION("sinks, with their own gradient") {
    const std::vector<float> sinks{0.3f, -0.7f, 1.1f, 0.0f};
    f.with_sinks = true;
    f.allowed = [](index_t, index_t q, index_t kv) { return q % 3 != 1 && kv <= q; };
    check_finite_differences(TestBlankRowsMask{}, variants::Sinks{sinks}, f, sinks);
  }
  SECTION("score_mod with its derivative") {
    f.allowed = [](index_t, index_t, index_t) { return true; };
    f.logit = [](double s, index_t h, index_t, index_t kv) { return s * s * 0.3 + 0.1 * static_cast<double>(h + kv); };
    const auto mod = variants::ScoreMod{[](float s, index_t, index_t h, index_t, index_t kv) {
                                          return s * s * 0.3f + 0.1f * static_cast<float>(h + kv);
                                        },
                                        [](float s, index_t, index_t, index_t, index_t) { return 0.6f * s; }};
    check_finite_differences(FullMask{}, mod, f);
  }
}

// ---- The tiled backends against the reference ---------------------------------

TEMPLATE_TEST_CASE("tiled backward matches the reference for every mask kind", "[attention][backward]",
                   backends::Highway, backends::Scalar) {
  std::mt19937 rng(411);
  const Problem prefill(rng, 2, 70, 90, 6, 2, 72);
  const Problem decode(rng, 1, 2, 300, 6, 1, 80);
  auto each = [&](const auto& mask) {
    for (const Problem* x : {&prefill, &decode}) {
      CAPTURE(x->q_shape, x->kv_shape);
      check_against_reference<TestType>(*x, mask, 2);
    }
  };
  each_mask_kind(each);
}

TEST_CASE("tiled backward over head dims 64 to 256, several tiles each way", "[attention][backward]") {
  std::mt19937 rng(419);
  for (const index_t d : {64, 80, 128, 256}) {
    CAPTURE(d);
    const Problem x(rng, 1, d >= 128 ? 140 : 200, d >= 128 ? 150 : 210, 4, 2, d);
    check_against_reference<backends::Highway>(x, CausalMask{Alignment::bottom_right}, 2);
    check_against_reference<backends::Scalar>(x, SlidingWindowMask{50, 0}, 3);
  }
}

// A key task sweeps several kv-tiles over the q-tiles that see them
// (tiled_backward.hpp, sweep_key_task): 2 sequences x 8 K/V heads are 16 key
// groups, so one dQ copy and tasks of all 10 kv-tiles: a full sweep of 8 and
// a short one of 2.
TEST_CASE("tiled backward sweeps of several kv-tiles match the reference", "[attention][backward]") {
  std::mt19937 rng(463);
  const Problem x(rng, 2, 600, 640, 8, 8, 24);
  check_against_reference<backends::Highway>(x, CausalMask{Alignment::bottom_right}, 2);
  check_against_reference<backends::Highway>(x, SlidingWindowMask{150, 20}, 2);
  check_against_reference<backends::Highway>(x, TestRandomDenseMask{5, 0.3f}, 2);
}

// The sweep's order on planned work, recorded by a pass that computes
// nothing: every ref visited once, each kv-tile's visits in its refs' order
// between its start and its store, each visit after its q-tile was loaded
// and with that q-tile's head and block, every key block stored once; and a
// causal mask's q-tiles loaded once for several kv-tiles.
TEST_CASE("the backward's key sweep visits every ref once, in each tile's order", "[attention][backward]") {
  using Kernel = backends::Scalar::Kernel;
  using detail::KeyTile;
  struct Recorder {
    const detail::TiledBackwardWork& w;
    std::map<const KeyTile<Kernel>*, const detail::KeyBlock*> block_of;
    std::map<const KeyTile<Kernel>*, std::size_t> next_ref;
    std::vector<int> visited, stored;
    index_t h = -1;
    std::int32_t q_block = -1;
    bool q_loaded = false, q_open = false;
    std::size_t q_loads = 0, visits = 0, q_ends = 0, q_visits = 0, sweep = 1;

    void start_tile(const detail::KeyBlock& block, KeyTile<Kernel>& t) {
      REQUIRE(block_of.count(&t) == 0);  // stored by its previous sweep
      block_of[&t] = &block;
      next_ref[&t] = block.refs_begin;
    }
    void load_tile(const KeyTile<Kernel>& t) const {
      REQUIRE(block_of.count(&t) == 1);
      REQUIRE(block_of.at(&t)->refs_begin != block_of.at(&t)->refs_end);  // only a tile some q-tile sees
    }
    void start_q_tile(index_t head, std::int32_t block) {
      REQUIRE(!q_open);  // the last q-tile ended
      h = head;
      q_block = block;
      q_loaded = false;
      q_open = true;
      q_visits = 0;
    }
    void load_q_tile() {
      q_loaded = true;
      ++q_loads;
    }
    void visit(const detail::QTileRef& ref, const KeyTile<Kernel>& t) {
      REQUIRE(q_loaded);
      REQUIRE(ref.head == h);
      REQUIRE(ref.q_block == q_block);
      REQUIRE(block_of.count(&t) == 1);
      const auto i = static_cast<std::size_t>(&ref - w.q_refs.data());
      REQUIRE(i == next_ref[&t]++);
      ++visited[i];
      ++visits;
      ++q_visits;
    }
    // A pass may defer a product of the q-tile's visits to here (AmxKeyPass
    // sums its dQ products in at most one slot per tile of the sweep).
    void end_q_tile() {
      REQUIRE(q_open);
      REQUIRE(q_visits >= 1);
      REQUIRE(q_visits <= sweep);
      q_open = false;
      ++q_ends;
    }
    void store(const KeyTile<Kernel>& t) {
      REQUIRE(block_of.count(&t) == 1);
      REQUIRE(next_ref[&t] == block_of[&t]->refs_end);
      ++stored[static_cast<std::size_t>(block_of[&t] - w.key_blocks.data())];
      block_of.erase(&t);
    }
  };
  const std::vector<std::int32_t> doc_ids = [] {  // documents of 700, 90, 1 and 1209 tokens
    std::vector<std::int32_t> ids;
    const std::pair<std::int32_t, std::size_t> runs[] = {{1, 700}, {2, 90}, {3, 1}, {4, 1209}};
    for (const auto& [id, len] : runs) ids.insert(ids.end(), len, id);
    return ids;
  }();
  const DocumentLayout docs =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(doc_ids.data(), {1, 2000}));
  const auto check = [&](const auto& mask, RaggedLengths lengths, index_t heads, index_t kv_heads, bool shares_loads) {
    const PlanningCase planned = planning_case(mask, std::move(lengths), heads, kv_heads);
    const detail::TiledBackwardWork w = detail::plan_tiled_backward<Kernel>(planned.shape, planned.bm);
    for (const std::size_t sweep :
         {std::size_t{1}, std::size_t{3}, static_cast<std::size_t>(detail::kKeyTilesPerSweep)}) {
      CAPTURE(sweep);
      std::vector<KeyTile<Kernel>> tiles;
      for (std::size_t i = 0; i < sweep; ++i) tiles.emplace_back(16, 16, 16, 16, detail::Bf16Tiles::widen);
      Recorder rec{w, {}, {}, std::vector<int>(w.q_refs.size()), std::vector<int>(w.key_blocks.size())};
      rec.sweep = sweep;
      for (const detail::KeyTask& task : w.key_tasks) {
        detail::sweep_key_task(rec, w, task, std::span<KeyTile<Kernel>>(tiles));
        CHECK(rec.block_of.empty());
      }
      CHECK(rec.visits == w.q_refs.size());
      CHECK(rec.q_ends == rec.q_loads);
      CHECK(!rec.q_open);
      CHECK(std::all_of(rec.visited.begin(), rec.visited.end(), [](int n) { return n == 1; }));
      CHECK(std::all_of(rec.stored.begin(), rec.stored.end(), [](int n) { return n == 1; }));
      if (sweep == 1) CHECK(rec.q_loads == rec.visits);
      if (sweep > 1 && shares_loads) CHECK(rec.q_loads * 2 < rec.visits);
    }
  };
  check(CausalMask{}, RaggedLengths{{2000, 1300}, {2000, 1300}}, 4, 2, true);
  check(document_mask(docs, CausalMask{}), RaggedLengths::uniform(1, 2000, 2000), 2, 1, true);
  check(SlidingWindowMask{300, 0}, RaggedLengths::uniform(1, 2000, 2000), 3, 3, false);
  check(CausalMask{Alignment::bottom_right}, RaggedLengths::uniform(1, 5, 2000), 2, 2, false);
}

TEST_CASE("tiled backward on ragged THD with empty segments", "[attention][backward][thd]") {
  std::mt19937 rng(421);
  const std::vector<std::int32_t> q_off{0, 30, 30, 33, 110}, q_len{30, 0, 3, 77, 20};
  const std::vector<std::int32_t> kv_off{0, 40, 52, 60, 150}, kv_len{40, 12, 0, 90, 25};
  const SegmentTable table{q_off, q_len, kv_off, kv_len};
  const Problem x(rng, table, 130, 175, 4, 2, 64);
  SECTION("causal, bottom-right") {
    check_against_reference<backends::Highway>(x, CausalMask{Alignment::bottom_right}, 2);
    check_against_reference<backends::Scalar>(x, CausalMask{Alignment::bottom_right}, 1);
  }
  SECTION("random dense predicate") { check_against_reference<backends::Highway>(x, TestRandomDenseMask{3, 0.4f}, 3); }
  SECTION("keys of a segment without queries get zero gradients") {
    const Grads g = run_backward<backends::Highway>(x, CausalMask{Alignment::bottom_right}, variants::Default{}, 2);
    for (index_t t = 40; t < 52; ++t) {
      for (index_t e = 0; e < 64; ++e) {
        REQUIRE(g.dk(t, 0, e) == 0.0f);
        REQUIRE(g.dv(t, 1, e) == 0.0f);
      }
    }
  }
}

TEST_CASE("tiled backward with every score variant", "[attention][backward][variants]") {
  std::mt19937 rng(431);
  const Problem prefill(rng, 1, 90, 110, 6, 2, 64);
  const Problem decode(rng, 1, 3, 400, 6, 1, 64);
  std::vector<float> slopes, sinks;
  for (index_t h = 0; h < 6; ++h) {
    slopes.push_back(std::exp2(-static_cast<float>(h + 1)));
    sinks.push_back(0.4f * static_cast<float>(h) - 1.0f);
  }
  const auto mod = variants::ScoreMod{[](float s, index_t, index_t h, index_t q, index_t kv) {
                                        return 0.5f * s + 0.01f * static_cast<float>(h * (q - kv));
                                      },
                                      [](float, index_t, index_t, index_t, index_t) { return 0.5f; }};
  for (const Problem* x : {&prefill, &decode}) {
    CAPTURE(x->q_shape);
    const auto mask = CausalMask{Alignment::bottom_right};
    check_against_reference<backends::Highway>(*x, mask, 2, variants::Softcap{3.0f});
    check_against_reference<backends::Scalar>(*x, TestBlankRowsMask{}, 2, variants::Alibi{slopes});
    check_against_reference<backends::Highway>(*x, TestBlankRowsMask{}, 3, variants::Sinks{sinks}, 6);
    check_against_reference<backends::Highway>(*x, mask, 2, mod);
    check_against_reference<backends::Scalar>(*x, TestPerHeadWindowMask{9}, 2,
                                              variants::chain(variants::Scale{0.2f}, variants::Alibi{slopes},
                                                              variants::Softcap{4.0f}, variants::Sinks{sinks}),
                                              6);
  }
}

TEST_CASE("rows no key may attend to have zero gradients", "[attention][backward]") {
  std::mt19937 rng(433);
  const Problem x(rng, 1, 40, 40, 2, 2, 64);
  const Grads g = run_backward<backends::Highway>(x, TestBlankRowsMask{}, variants::Default{}, 2);
  for (index_t i = 1; i < 40; i += 3) {
    for (index_t e = 0; e < 64; ++e) REQUIRE(g.dq(0, i, 1, e) == 0.0f);
  }
  // Key 39 is seen by query 39 only, and 39 % 3 == 0: seen. Key 37 by 37 (blank: no) and later rows.
  check_against_reference<backends::Highway>(x, TestBlankRowsMask{}, 1);
}

TEST_CASE("tiled backward is bitwise identical for any worker count", "[attention][backward]") {
  std::mt19937 rng(439);
  const auto mask = CausalMask{Alignment::bottom_right};
  // Key tasks of one or two kv-tiles (4 dQ copies), and of 10 (two sweeps, one copy).
  for (const Problem& x : {Problem(rng, 2, 150, 170, 8, 2, 64), Problem(rng, 2, 600, 640, 8, 8, 24)}) {
    CAPTURE(x.q_shape, x.kv_shape);
    const Grads one = run_backward<backends::Highway>(x, mask, variants::Softcap{5.0f}, 1);
    for (const int workers : {2, 3}) {
      const Grads many = run_backward<backends::Highway>(x, mask, variants::Softcap{5.0f}, workers);
      CHECK(bitwise_equal(one.dq, many.dq));
      CHECK(bitwise_equal(one.dk, many.dk));
      CHECK(bitwise_equal(one.dv, many.dv));
    }
  }
}

// One masking step serves both tile layouts (mask_tile, tiled_forward.hpp):
// column bits, the BlockMask's row bits (GQA heads stacked in decode) and the
// element predicate (a BlockMask without bits) put -inf in the same places.
TEST_CASE("masking from tile bits and from the predicate gives identical results, forward and backward",
          "[attention][backward]") {
  std::mt19937 rng(449);
  for (const index_t sq : {index_t{3}, index_t{150}}) {
    INFO("queries " << sq);
    const Problem x(rng, 2, sq, 170, 8, 2, 72);
    const auto mask = CausalMask{Alignment::bottom_right} & SlidingWindowMask{40, 0};
    const AttentionShape shape = shape_of(x.in());
    PlanOptions options;
    options.backward = true;
    struct Result {
      Tensor<float> out, lse;
      Grads g;
    };
    auto run = [&](bool bits) {
      const auto plan = plan_attention<backends::Highway>(
          shape,
          build_block_mask(mask, shape.lengths, shape.heads, backends::Highway::block_shape(), BlockMaskOptions{bits}),
          options, 2);
      REQUIRE(plan.block_mask().has_tile_bits() == bits);
      Result r{Tensor<float>(x.out_shape), Tensor<float>(x.lse_shape), Grads(x)};
      execution::ThreadPool pool(2);
      attention_forward(plan, x.in(), r.out.view(), r.lse.view(), pool);
      attention_backward(plan, x.in(), r.out.view(), r.lse.view(), x.dout.view(), r.g.views(), variants::Default{},
                         pool);
      return r;
    };
    const Result with_bits = run(true), predicate = run(false);
    CHECK(bitwise_equal(with_bits.out, predicate.out));
    CHECK(bitwise_equal(with_bits.lse, predicate.lse));
    CHECK(bitwise_equal(with_bits.g.dq, predicate.g.dq));
    CHECK(bitwise_equal(with_bits.g.dk, predicate.g.dk));
    CHECK(bitwise_equal(with_bits.g.dv, predicate.g.dv));
    check_against_reference<backends::Highway>(x, mask, 2);
  }
}

TEST_CASE("bf16 backward stays close to the reference", "[attention][backward][bf16]") {
  std::mt19937 rng(443);
  auto to_bf16 = [](const Tensor<float>& t) {
    Tensor<bfloat16> r(t.shape());
    for (index_t i = 0; i < t.size(); ++i) r.data()[i] = bfloat16(t.data()[i]);
    return r;
  };
  const Problem x(rng, 1, 100, 120, 4, 2, 128);
  const Tensor<bfloat16> q = to_bf16(x.q), k = to_bf16(x.k), v = to_bf16(x.v), dout = to_bf16(x.dout);
  const AttentionInputs<bfloat16> in{q.view(), k.view(), v.view()};
  auto run = [&](auto backend) {
    using Backend = decltype(backend);
    PlanOptions options;
    options.backward = true;
    const auto plan = plan_attention<Backend>(shape_of(in), CausalMask{}, options, 2);
    Tensor<bfloat16> out(x.out_shape), dq(x.q_shape), dk(x.kv_shape), dv(x.kv_shape);
    Tensor<float> lse(x.lse_shape);
    execution::ThreadPool pool(2);
    attention_forward(plan, in, out.view(), lse.view(), pool);
    attention_backward(plan, in, out.view(), lse.view(), dout.view(), dq.view(), dk.view(), dv.view(), pool);
    return std::array<Tensor<bfloat16>, 3>{std::move(dq), std::move(dk), std::move(dv)};
  };
  const auto want = run(backends::Reference{});
  const auto got = run(backends::Highway{});
  for (std::size_t i = 0; i < 3; ++i) CHECK(compare(got[i], want[i]).nmse() <= 1e-3);
}

// The bf16 key pass on AMX tiles (tiled_backward.hpp, AmxKeyPass) where
// the CPU has AMX, and on pair dot products (PairKeyPass: the instruction
// where the CPU has it, else its emulation): random shapes with q- and
// kv-tiles cut short, GQA, odd and non-power-of-two head dims, masks with
// partial tiles, softcap (a score hook); P and dS rounded to bf16 give an
// NMSE of about 1e-5 against the fp32 reference. Forcing AMX on a CPU
// without it (or with a non-finite input) runs the vector path: the same
// checks then hold and no AMX task is counted.
TEST_CASE("bf16 backward on AMX tiles and pair dots stays close to the reference",
          "[attention][backward][bf16][amx][pairs]") {
  std::mt19937 rng(457);
  auto to_bf16 = [](const Tensor<float>& t) {
    Tensor<bfloat16> r(t.shape());
    for (index_t i = 0; i < t.size(); ++i) r.data()[i] = bfloat16(t.data()[i]);
    return r;
  };
  struct Shape {
    index_t sq, skv, heads, kv_heads, d;
  };
  const auto ids = [](index_t n) {  // three documents
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(1 + i * 3 / n);
    return v;
  };
  // The last shape's 16 K/V heads get one dQ copy: key tasks of all 9 kv-tiles, a sweep of 8 and one of 1.
  for (const Shape sh :
       {Shape{100, 120, 4, 2, 128}, Shape{200, 200, 2, 2, 64}, Shape{37, 150, 4, 1, 96}, Shape{70, 70, 3, 3, 72},
        Shape{130, 90, 4, 2, 33}, Shape{9, 9, 2, 1, 80}, Shape{576, 576, 16, 16, 32}}) {
    const Problem x(rng, 1, sh.sq, sh.skv, sh.heads, sh.kv_heads, sh.d);
    Tensor<bfloat16> q = to_bf16(x.q), k = to_bf16(x.k), v = to_bf16(x.v), dout = to_bf16(x.dout);
    const AttentionInputs<bfloat16> in{q.view(), k.view(), v.view()};
    const std::vector<std::int32_t> doc_ids = ids(sh.sq);
    // path_tasks: the backward's key tasks on the forced path (its counter's increase over the backward call).
    auto run = [&](auto backend, auto mask, Bf16DotPath path, std::uint64_t* path_tasks) {
      using Backend = decltype(backend);
      const Bf16DotPath saved = bf16_dot_path();
      set_bf16_dot_path(path);
      PlanOptions options;
      options.backward = true;
      const auto plan = plan_attention<Backend>(shape_of(in), mask, options, 2);
      Tensor<bfloat16> out(x.out_shape), dq(x.q_shape), dk(x.kv_shape), dv(x.kv_shape);
      Tensor<float> lse(x.lse_shape);
      execution::ThreadPool pool(2);
      attention_forward(plan, in, out.view(), lse.view(), variants::Softcap{8.0f}, pool);
      const auto tasks = [&] { return path == Bf16DotPath::amx ? bf16_amx_tasks() : bf16_native_tasks(); };
      const std::uint64_t before = tasks();
      attention_backward(plan, in, out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()},
                         variants::Softcap{8.0f}, pool);
      if (path_tasks != nullptr) *path_tasks = tasks() - before;
      set_bf16_dot_path(saved);
      return std::array<Tensor<bfloat16>, 3>{std::move(dq), std::move(dk), std::move(dv)};
    };
    auto check = [&](auto mask) {
      INFO("sq " << sh.sq << " skv " << sh.skv << " heads " << sh.heads << "/" << sh.kv_heads << " d " << sh.d);
      const auto want = run(backends::Reference{}, mask, Bf16DotPath::widen, nullptr);
      for (const Bf16DotPath path : {Bf16DotPath::amx, Bf16DotPath::native}) {
        INFO("path " << static_cast<int>(path));
        std::uint64_t tasks = 0;
        const auto got = run(backends::Highway{}, mask, path, &tasks);
        if (path == Bf16DotPath::amx) CHECK((tasks > 0) == (amx::available() && sh.d % 32 == 0));
        if (path == Bf16DotPath::native) CHECK(tasks > 0);
        for (std::size_t i = 0; i < 3; ++i) CHECK(compare(got[i], want[i]).nmse() <= 1e-4);
      }
    };
    check(CausalMask{Alignment::bottom_right});
    check(SlidingWindowMask{40, 0, Alignment::bottom_right});
    if (sh.sq == sh.skv) {
      std::vector<std::int32_t> ids_of = doc_ids;
      ids_of[0] = 0;  // token 0 is padding: no query sees key 0
      const DocumentLayout layout =
          DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids_of.data(), {1, sh.sq}));
      check(document_mask(layout, CausalMask{}));
      // A NaN in the hidden key: the vector path takes the call off AMX (which would meet it with zero weights);
      // the pair dots keep it and skip it through their select blocks. No gradient turns NaN.
      const bfloat16 saved_key = k.data()[0];
      k.data()[0] = bfloat16(std::numeric_limits<float>::quiet_NaN());
      for (const Bf16DotPath path : {Bf16DotPath::amx, Bf16DotPath::native}) {
        std::uint64_t tasks = 0;
        const auto got = run(backends::Highway{}, document_mask(layout, CausalMask{}), path, &tasks);
        CHECK((tasks == 0) == (path == Bf16DotPath::amx));
        for (const auto& g : got) {
          for (index_t i = 0; i < g.size(); ++i) REQUIRE(std::isfinite(to_float(g.data()[i])));
        }
      }
      k.data()[0] = saved_key;
    }
  }
}

TEST_CASE("attention_backward rejects what it cannot use", "[attention][backward][errors]") {
  std::mt19937 rng(449);
  const Problem x(rng, 1, 8, 10, 4, 2, 64);
  Tensor<float> out(x.out_shape), lse(x.lse_shape);
  Grads g(x);
  const auto forward_only = plan_attention<backends::Highway>(shape_of(x.in()), CausalMask{});
  attention_forward(forward_only, x.in(), out.view(), lse.view());
  CHECK_THROWS_WITH(attention_backward(forward_only, x.in(), out.view(), lse.view(), x.dout.view(), g.dq.view(),
                                       g.dk.view(), g.dv.view()),
                    Contains("made without PlanOptions::backward = true"));
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Highway>(shape_of(x.in()), CausalMask{}, options);
  Tensor<float> dq_bad(detail::make_extents({1, 8, 4, 32}));
  CHECK_THROWS_WITH(
      attention_backward(plan, x.in(), out.view(), lse.view(), x.dout.view(), dq_bad.view(), g.dk.view(), g.dv.view()),
      Contains("attention_backward: dq must have shape (1, 8, 4, 64), got (1, 8, 4, 32)"));
  CHECK_THROWS_WITH(attention_backward(plan, x.in(), out.view(), TensorView<const float>{}, x.dout.view(), g.dq.view(),
                                       g.dk.view(), g.dv.view()),
                    Contains("lse is required"));
  Tensor<float> out_bad(detail::make_extents({1, 8, 4, 32}));
  CHECK_THROWS_WITH(attention_backward(plan, x.in(), out_bad.view(), lse.view(), x.dout.view(), g.dq.view(),
                                       g.dk.view(), g.dv.view()),
                    Contains("attention_backward: out must have shape"));
  std::vector<float> three(3);
  CHECK_THROWS_WITH(attention_backward(plan, x.in(), out.view(), lse.view(), x.dout.view(),
                                       AttentionGrads<float>{g.dq.view(), g.dk.view(), g.dv.view(), three},
                                       variants::Default{}, execution::Serial{}),
                    Contains("dsinks must hold one value per query head (4), got 3"));
}

}  // namespace seqattn_test_attention_backward_test
