// The NaN and infinity policy (README, "NaN and infinity"; attention/
// softmax_state.hpp) on every CPU backend, forward and backward, with the
// same inputs: Reference, Scalar, Highway (both bf16 paths) and, where the
// build links it, Dispatched. Each case states which rows turn NaN and
// requires every other element to equal a run on NaN-free inputs exactly:
// a value the mask hides must not reach any result.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "seqattn/masks.hpp"
#if defined(SEQATTN_TEST_DISPATCH)
#include "seqattn/dispatch.hpp"
#endif

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_nan_policy_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A causal window of 20 keys with keys 45 and 100 hidden from every row:
// they sit inside partial tiles that other keys of the same tile share.
struct HiddenKeysMask {
  static constexpr bool head_invariant = true;
  static bool hidden(index_t kv) { return kv == 45 || kv == 100; }
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return kv <= q && kv >= q - 20 && !hidden(kv); }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};
bool window_sees(index_t q, index_t kv) { return HiddenKeysMask{}.allowed(MaskContext{}, q, kv); }

template <class T>
struct Inputs {
  Tensor<T> q, k, v, dout;
  const SegmentTable* table = nullptr;
  AttentionInputs<T> in() const { return {q.view(), k.view(), v.view(), table}; }
  // lse is [B, H, S] for BSHD and [H, T] for THD.
  Extents lse_shape() const {
    return table ? detail::make_extents({q.extent(1), q.extent(0)})
                 : detail::make_extents({q.extent(0), q.extent(2), q.extent(1)});
  }
};

template <class T>
Inputs<T> random_inputs(const Extents& q_shape, const Extents& kv_shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs<T> x{random_tensor<T>(q_shape, rng), random_tensor<T>(kv_shape, rng), random_tensor<T>(kv_shape, rng),
              random_tensor<T>(q_shape, rng)};
  return x;
}

template <class T>
struct Results {
  std::string backend;
  Tensor<T> out;
  Tensor<float> lse;
  Tensor<T> dq, dk, dv;
};

// Forward, then backward with the same plan; every output starts at 7 so an
// element a backend leaves unwritten shows.
template <class Backend, class T, class M, class V>
Results<T> run(const Inputs<T>& x, const M& mask, const V& variant, int workers) {
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<Backend>(shape_of(x.in()), mask, options, workers);
  Results<T> r{Backend::name(),
               Tensor<T>(x.q.shape(), from_float<T>(7.0f)),
               Tensor<float>(x.lse_shape(), 7.0f),
               Tensor<T>(x.q.shape(), from_float<T>(7.0f)),
               Tensor<T>(x.k.shape(), from_float<T>(7.0f)),
               Tensor<T>(x.v.shape(), from_float<T>(7.0f))};
  execution::ThreadPool pool(workers);
  attention_forward(plan, x.in(), r.out.view(), r.lse.view(), variant, pool);
  attention_backward(plan, x.in(), r.out.view(), r.lse.view(), x.dout.view(),
                     AttentionGrads<T>{r.dq.view(), r.dk.view(), r.dv.view()}, variant, pool);
  return r;
}

// Every CPU backend on the same inputs; bf16 runs Highway on both of its
// paths (widening and the pair-dot kernels, forced on).
template <class T, class M, class V>
std::vector<Results<T>> run_all(const Inputs<T>& x, const M& mask, const V& variant) {
  std::vector<Results<T>> all;
  all.push_back(run<backends::Reference>(x, mask, variant, 1));
  all.push_back(run<backends::Scalar>(x, mask, variant, 2));
  if constexpr (std::is_same_v<T, bfloat16>) {
    const Bf16DotPath saved = bf16_dot_path();
    set_bf16_dot_path(Bf16DotPath::widen);
    all.push_back(run<backends::Highway>(x, mask, variant, 2));
    all.back().backend += " (bf16 widen)";
    set_bf16_dot_path(Bf16DotPath::native);
    all.push_back(run<backends::Highway>(x, mask, variant, 2));
    all.back().backend += " (bf16 pair dot)";
    set_bf16_dot_path(saved);
  } else {
    all.push_back(run<backends::Highway>(x, mask, variant, 2));
  }
#if defined(SEQATTN_TEST_DISPATCH)
  if constexpr (dispatch::detail::kCompiledVariant<V>) all.push_back(run<backends::Dispatched>(x, mask, variant, 2));
#endif
  return all;
}

// ---- element-wise comparisons ---------------------------------------------------

// Mismatches of got against want: NaN exactly where want is NaN, infinities
// equal, finite values within tol * max(1, max |want|) (tol 0: equal).
template <class T>
void check_elements(const Tensor<T>& got, const Tensor<T>& want, double tol, const std::string& what) {
  REQUIRE(got.shape() == want.shape());
  double scale = 1.0;
  for (index_t i = 0; i < want.size(); ++i) {
    const double w = to_float(want.data()[i]);
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  }
  index_t bad = 0;
  std::ostringstream first;
  for (index_t i = 0; i < got.size(); ++i) {
    const float g = to_float(got.data()[i]), w = to_float(want.data()[i]);
    bool ok = false;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g) || tol == 0.0) {
      ok = g == w;
    } else {
      ok = std::abs(static_cast<double>(g) - w) <= tol * scale;
    }
    if (!ok && bad++ < 4) first << "  [" << i << "] got " << g << ", want " << w << '\n';
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ\n" << first.str());
  CHECK(bad == 0);
}

template <class T>
double tolerance(bool gradient) {
  if constexpr (std::is_same_v<T, float>) return gradient ? 2e-4 : 1e-5;
  return 4e-2;
}

// Every backend against the reference, element by element.
template <class T>
void check_backends_agree(const std::vector<Results<T>>& all) {
  const Results<T>& want = all.front();
  for (std::size_t b = 1; b < all.size(); ++b) {
    const Results<T>& got = all[b];
    check_elements(got.out, want.out, tolerance<T>(false), got.backend + " out");
    check_elements(got.lse, want.lse, std::is_same_v<T, float> ? 1e-5 : 1e-2, got.backend + " lse");
    check_elements(got.dq, want.dq, tolerance<T>(true), got.backend + " dq");
    check_elements(got.dk, want.dk, tolerance<T>(true), got.backend + " dk");
    check_elements(got.dv, want.dv, tolerance<T>(true), got.backend + " dv");
  }
}

// Rows (token t, head h) of a [1, S, H, D] or [T, H, D] tensor: all NaN where
// nan_row(t, h), else bitwise what the clean run gave.
template <class T, class Pred>
void check_rows(const Tensor<T>& got, const Tensor<T>& clean, Pred nan_row, const std::string& what) {
  REQUIRE(got.shape() == clean.shape());
  const index_t dim = got.extent(-1), heads = got.extent(-2);
  index_t bad = 0;
  std::ostringstream first;
  for (index_t i = 0; i < got.size(); ++i) {
    const index_t row = i / dim, t = row / heads, h = row % heads;
    const float g = to_float(got.data()[i]), c = to_float(clean.data()[i]);
    const bool ok = nan_row(t, h) ? std::isnan(g) : (g == c || (std::isnan(g) && std::isnan(c)));
    if (!ok && bad++ < 4) {
      first << "  token " << t << " head " << h << " element " << i % dim << ": got " << g << ", clean run " << c
            << (nan_row(t, h) ? " (NaN expected)" : "") << '\n';
    }
  }
  INFO(what << ": " << bad << " elements break the rule\n" << first.str());
  CHECK(bad == 0);
}

// The same for lse ([1, H, S] or [H, T]).
template <class Pred>
void check_lse_rows(const Tensor<float>& got, const Tensor<float>& clean, Pred nan_row, const std::string& what) {
  const index_t tokens = got.extent(-1);
  index_t bad = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const index_t t = i % tokens, h = (i / tokens) % got.extent(-2);
    const float g = got.data()[i], c = clean.data()[i];
    bad += !(nan_row(t, h) ? std::isnan(g) : (g == c || (std::isnan(g) && std::isnan(c))));
  }
  INFO(what << " lse: " << bad << " rows break the rule");
  CHECK(bad == 0);
}

// All of a backend's results against its own clean run: out, lse and dq rows
// NaN where row_nan says, dk and dv rows NaN where key_nan says, every other
// element bitwise equal.
template <class T, class RowNan, class KeyNan>
void check_against_clean(const std::vector<Results<T>>& all, const std::vector<Results<T>>& clean, RowNan row_nan,
                         KeyNan key_nan) {
  REQUIRE(all.size() == clean.size());
  for (std::size_t b = 0; b < all.size(); ++b) {
    const Results<T>& got = all[b];
    check_rows(got.out, clean[b].out, row_nan, got.backend + " out");
    check_lse_rows(got.lse, clean[b].lse, row_nan, got.backend);
    check_rows(got.dq, clean[b].dq, row_nan, got.backend + " dq");
    check_rows(got.dk, clean[b].dk, key_nan, got.backend + " dk");
    check_rows(got.dv, clean[b].dv, key_nan, got.backend + " dv");
  }
}

template <class T>
void set(Tensor<T>& x, index_t token, index_t head, index_t e, float value) {
  x(0, token, head, e) = from_float<T>(value);
}
template <class T>
void set_row(Tensor<T>& x, index_t token, index_t head, float value) {
  for (index_t e = 0; e < x.extent(-1); ++e) set(x, token, head, e, value);
}

// 150 queries and keys (Highway: 2 x 3 tiles, Scalar 3 x 3), 2 query heads
// on 1 K/V head, head dim 40.
template <class T>
Inputs<T> window_inputs() {
  return random_inputs<T>(detail::make_extents({1, 150, 2, 40}), detail::make_extents({1, 150, 1, 40}), 2101);
}

template <class T>
void nan_in_a_query_row() {
  const HiddenKeysMask mask;
  const Inputs<T> clean_in = window_inputs<T>();
  const auto clean = run_all(clean_in, mask, variants::Default{});
  check_backends_agree(clean);
  Inputs<T> x = window_inputs<T>();
  set(x.q, 70, 1, 5, kNaN);
  const auto all = run_all(x, mask, variants::Default{});
  check_backends_agree(all);
  check_against_clean(
      all, clean, [](index_t t, index_t h) { return t == 70 && h == 1; },
      [](index_t j, index_t) { return window_sees(70, j); });
}

template <class T>
void nan_in_a_visible_key() {
  const HiddenKeysMask mask;
  const auto clean = run_all(window_inputs<T>(), mask, variants::Default{});
  Inputs<T> x = window_inputs<T>();
  set(x.k, 60, 0, 3, kNaN);
  const auto all = run_all(x, mask, variants::Default{});
  check_backends_agree(all);
  // Rows that see key 60 turn NaN, and so does every key those rows see.
  auto row_nan = [](index_t t, index_t) { return window_sees(t, 60); };
  auto key_nan = [](index_t j, index_t) {
    for (index_t t = 60; t <= 80; ++t) {
      if (window_sees(t, j)) return true;
    }
    return false;
  };
  check_against_clean(all, clean, row_nan, key_nan);
}

template <class T, class V = variants::Default>
void non_finite_hidden_rows(float k45, float v45, float k100, float v100, const V& variant = {}) {
  const HiddenKeysMask mask;
  const auto clean = run_all(window_inputs<T>(), mask, variant);
  Inputs<T> x = window_inputs<T>();
  set_row(x.k, 45, 0, k45);
  set_row(x.v, 45, 0, v45);
  set(x.k, 100, 0, 7, k100);
  set(x.v, 100, 0, 2, v100);
  const auto all = run_all(x, mask, variant);
  check_backends_agree(all);
  auto none = [](index_t, index_t) { return false; };
  check_against_clean(all, clean, none, none);
}

}  // namespace

TEST_CASE("NaN policy: a NaN in q reaches only its own row and the keys that row sees", "[attention][nan]") {
  SECTION("fp32") { nan_in_a_query_row<float>(); }
  SECTION("bf16") { nan_in_a_query_row<bfloat16>(); }
}

TEST_CASE("NaN policy: a NaN in a visible k element makes the rows that see it NaN", "[attention][nan]") {
  SECTION("fp32") { nan_in_a_visible_key<float>(); }
  SECTION("bf16") { nan_in_a_visible_key<bfloat16>(); }
}

TEST_CASE("NaN policy: NaN or infinity in k and v rows the mask hides changes nothing", "[attention][nan]") {
  SECTION("fp32, NaN v") { non_finite_hidden_rows<float>(1.0f, kNaN, 1.0f, 1.0f); }
  SECTION("fp32, infinite v") { non_finite_hidden_rows<float>(1.0f, kInf, 1.0f, -kInf); }
  SECTION("fp32, NaN and infinite k") { non_finite_hidden_rows<float>(kNaN, 1.0f, kInf, 1.0f); }
  SECTION("fp32, all at once") { non_finite_hidden_rows<float>(kNaN, kNaN, -kInf, kInf); }
  SECTION("fp32, NaN k under softcap (its gradient of a NaN score is NaN)") {
    non_finite_hidden_rows<float>(kNaN, kNaN, kNaN, 1.0f, variants::Softcap{5.0f});
  }
  SECTION("bf16, NaN v") { non_finite_hidden_rows<bfloat16>(1.0f, kNaN, 1.0f, kInf); }
  SECTION("bf16, NaN k") { non_finite_hidden_rows<bfloat16>(kNaN, 1.0f, kInf, 1.0f); }
}

namespace {

// Logits from a score variant: row 30 meets a +inf logit (IEEE: the row is
// NaN), row 90 sees only -inf logits (it sees nothing: out 0, lse -inf),
// row 110 meets a NaN logit, and row 120's logits of keys 110..115 are -inf
// (zero weight: those keys' values must not reach it).
float policy_logit(float s, index_t, index_t, index_t q, index_t kv) {
  if (q == 30 && kv == 25) return kInf;
  if (q == 90) return -kInf;
  if (q == 110 && kv == 105) return kNaN;
  if (q == 120 && kv >= 110 && kv <= 115) return -kInf;
  return s;
}
float policy_logit_grad(float, index_t, index_t, index_t, index_t) { return 1.0f; }

template <class T>
void infinite_and_nan_logits() {
  const HiddenKeysMask mask;
  const variants::ScoreMod variant{policy_logit, policy_logit_grad};
  const auto base = run_all(window_inputs<T>(), mask, variant);
  check_backends_agree(base);
  for (const auto& r : base) {
    INFO(r.backend);
    for (index_t h = 0; h < 2; ++h) {
      CHECK(std::isnan(to_float(r.out(0, 30, h, 0))));
      CHECK(std::isnan(r.lse(0, h, 30)));
      CHECK(std::isnan(to_float(r.out(0, 110, h, 3))));
      CHECK(std::isnan(r.lse(0, h, 110)));
      CHECK(to_float(r.out(0, 90, h, 1)) == 0.0f);
      CHECK(r.lse(0, h, 90) == -kInf);
      CHECK(to_float(r.dq(0, 90, h, 0)) == 0.0f);
      CHECK(std::isfinite(to_float(r.out(0, 120, h, 0))));
      CHECK(std::isnan(to_float(r.dq(0, 30, h, 0))));
    }
  }
  // A NaN value row with zero weight (a -inf logit) stays out of row 120;
  // the rows that give key 112 weight turn NaN.
  Inputs<T> x = window_inputs<T>();
  set_row(x.v, 112, 0, kNaN);
  const auto all = run_all(x, mask, variant);
  check_backends_agree(all);
  for (std::size_t b = 0; b < all.size(); ++b) {
    auto row_nan = [](index_t t, index_t) { return t == 30 || t == 110 || (t != 120 && window_sees(t, 112)); };
    check_rows(all[b].out, base[b].out, row_nan, all[b].backend + " out");
    // lse does not depend on v.
    check_lse_rows(
        all[b].lse, base[b].lse, [](index_t t, index_t) { return t == 30 || t == 110; }, all[b].backend);
  }
}

}  // namespace

TEST_CASE("NaN policy: +inf logits follow IEEE, rows of -inf logits see nothing", "[attention][nan]") {
  SECTION("fp32") { infinite_and_nan_logits<float>(); }
  SECTION("bf16") { infinite_and_nan_logits<bfloat16>(); }
}

namespace {

// Three documents of 50, 70 and 40 tokens, causal within each.
constexpr index_t kDocLen[] = {50, 70, 40};
index_t doc_of(index_t t) { return t < 50 ? 0 : t < 120 ? 1 : 2; }

template <class T>
Inputs<T> packed_inputs(bool thd) {
  const index_t n = 160;
  if (thd) return random_inputs<T>(detail::make_extents({n, 2, 48}), detail::make_extents({n, 1, 48}), 2203);
  return random_inputs<T>(detail::make_extents({1, n, 2, 48}), detail::make_extents({1, n, 1, 48}), 2203);
}

// Document 1 holds NaN: in a query row, a key element and a whole value row.
template <class T>
void poison_document_one(Inputs<T>& x) {
  const bool thd = x.table != nullptr;
  auto put = [&](Tensor<T>& t, index_t token, index_t e) {
    if (thd) {
      t(token, 0, e) = from_float<T>(kNaN);
    } else {
      t(0, token, 0, e) = from_float<T>(kNaN);
    }
  };
  put(x.q, 80, 3);
  put(x.k, 100, 5);
  for (index_t e = 0; e < x.v.extent(-1); ++e) put(x.v, 118, e);
}

template <class T, class M>
void packed_documents(const M& mask, bool thd, const SegmentTable* table) {
  Inputs<T> clean_in = packed_inputs<T>(thd);
  clean_in.table = table;
  const auto clean = run_all(clean_in, mask, variants::Default{});
  Inputs<T> x = packed_inputs<T>(thd);
  x.table = table;
  poison_document_one(x);
  const auto all = run_all(x, mask, variants::Default{});
  check_backends_agree(all);
  // Documents 0 and 2 exactly as without the NaN; document 1 NaN from row 80
  // (the query) and from row 100 (the key) on.
  auto row_nan = [](index_t t, index_t h) { return doc_of(t) == 1 && ((t == 80 && h == 0) || t >= 100); };
  auto key_nan = [](index_t j, index_t) { return doc_of(j) == 1; };
  check_against_clean(all, clean, row_nan, key_nan);
}

}  // namespace

TEST_CASE("NaN policy: a packed batch where one document holds NaN leaves the others exact", "[attention][nan]") {
  const std::vector<std::int32_t> offsets{0, kDocLen[0], kDocLen[0] + kDocLen[1]};
  const std::vector<std::int32_t> lens{kDocLen[0], kDocLen[1], kDocLen[2]};
  const SegmentTable table{offsets, lens, offsets, lens};
  const TestDocumentMask documents{{kDocLen[0], kDocLen[1], kDocLen[2]}};
  SECTION("THD segments, fp32") { packed_documents<float>(CausalMask{}, true, &table); }
  SECTION("THD segments, bf16") { packed_documents<bfloat16>(CausalMask{}, true, &table); }
  SECTION("one sequence with a document mask, fp32") { packed_documents<float>(documents, false, nullptr); }
  SECTION("one sequence with a document mask, bf16") { packed_documents<bfloat16>(documents, false, nullptr); }
}

TEST_CASE("NaN policy: split-KV partials keep a NaN row NaN", "[attention][nan]") {
  // Decode-shaped rows split over KV chunks: the NaN lands in one chunk.
  std::mt19937 rng(2311);
  const auto q = random_tensor<float>(detail::make_extents({1, 2, 4, 32}), rng);
  auto k = random_tensor<float>(detail::make_extents({1, 600, 2, 32}), rng);
  const auto v = random_tensor<float>(detail::make_extents({1, 600, 2, 32}), rng);
  k(0, 300, 1, 4) = kNaN;
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  AttentionOptions options;
  options.kv_splits = 4;
  for (const bool highway : {false, true}) {
    Tensor<float> out(q.shape()), lse(detail::make_extents({1, 4, 2}));
    if (highway) {
      attention_forward<backends::Highway>(in, FullMask{}, out.view(), lse.view(), options);
    } else {
      attention_forward<backends::Scalar>(in, FullMask{}, out.view(), lse.view(), options);
    }
    for (index_t t = 0; t < 2; ++t) {
      for (index_t h = 0; h < 4; ++h) {
        INFO((highway ? "Highway" : "Scalar") << " token " << t << " head " << h);
        CHECK(std::isnan(out(0, t, h, 0)) == (h >= 2));
        CHECK(std::isnan(lse(0, h, t)) == (h >= 2));
      }
    }
  }
}

}  // namespace seqattn_test_attention_nan_policy_test
