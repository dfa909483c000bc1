// The scenarios' runtime-dispatched kernels (scenarios/kernels.hpp, compiled
// per Highway target in src/scenario_kernels.cc) on every compiled target this
// CPU runs, element by element against naive double-precision references.
// Each target's table is fetched through the dispatch entry point while
// hwy::SupportedTargets() is mocked to that one target, so one binary checks
// them all. Key counts are not multiples of any vector width.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

// clang-format off
#include "seqattn/core/hwy_config.hpp"  // before any Highway header
#include <hwy/targets.h>
// clang-format on

#include "seqattn/scenarios/kernels.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_scenarios_scenario_kernels_test {

using seqattn::index_t;
using seqattn::dispatch::ScenarioKernels;

namespace {

constexpr index_t kKeyCounts[] = {1, 7, 31, 72, 80, 129};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kSentinel = -12345.0f;  // beyond what a kernel may write

std::string names_of(std::int64_t targets) {
  std::string out;
  for (std::int64_t rest = targets; rest != 0; rest &= rest - 1)
    out += std::string(hwy::TargetName(rest & -rest)) + ' ';
  return out;
}

// The kernel table of every compiled target this CPU runs, best first.
const std::vector<ScenarioKernels>& tables() {
  static const std::vector<ScenarioKernels> all = [] {
    std::vector<ScenarioKernels> r;
    const std::int64_t runnable = seqattn::dispatch::scenario_kernel_targets() & hwy::SupportedTargets();
    for (std::int64_t rest = runnable; rest != 0; rest &= rest - 1) {
      hwy::SetSupportedTargetsForTest(rest & -rest);
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
      r.push_back(seqattn::dispatch::scenario_kernels());
    }
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    std::fprintf(stderr, "scenario kernels: compiled %s; run %s\n",
                 names_of(seqattn::dispatch::scenario_kernel_targets()).c_str(), names_of(runnable).c_str());
    return r;
  }();
  return all;
}

// Runs fn(table) on every target (the first test case checks there is one table per target).
template <class Fn>
void on_every_target(Fn&& fn) {
  for (const ScenarioKernels& k : tables()) {
    INFO("Highway target " << k.target);
    fn(k);
  }
}

// got agrees with the exact want: the same non-finite value, or within tol.
bool agrees(float got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return static_cast<double>(got) == want;
  return std::abs(static_cast<double>(got) - want) <= tol;
}

// Counts mismatches of one call and describes the first.
struct Mismatches {
  index_t count = 0;
  std::string first;
  void check(float got, double want, double tol, const char* what, index_t i) {
    if (agrees(got, want, tol)) return;
    if (count++ == 0) {
      first = std::string(what) + "[" + std::to_string(i) + "]: got " + std::to_string(got) + ", want " +
              std::to_string(want) + " (tolerance " + std::to_string(tol) + ")";
    }
  }
};

void require_none(const Mismatches& m) {
  INFO(m.count << " mismatches; first: " << m.first);
  CHECK(m.count == 0);
}

std::vector<float> uniform(std::mt19937& rng, index_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Keys k [n][d] in a target's chunked layout [npad / W][d][W], zero-padded to
// npad, a multiple of W (what the kernels read).
struct ChunkedKeys {
  index_t npad = 0;
  std::vector<float> kt;

  ChunkedKeys(const std::vector<float>& k, index_t n, index_t d, index_t width)
      : npad((n + width - 1) / width * width), kt(static_cast<std::size_t>(npad * d), 0.0f) {
    for (index_t j = 0; j < n; ++j) {
      for (index_t c = 0; c < d; ++c) {
        kt[static_cast<std::size_t>((j / width) * width * d + c * width + j % width)] =
            k[static_cast<std::size_t>(j * d + c)];
      }
    }
  }
  // An output row for npad keys and a few more floats a kernel must leave alone.
  std::vector<float> output() const { return std::vector<float>(static_cast<std::size_t>(npad + 3), kSentinel); }
};

// out[j] against want(j) = {exact value, tolerance} for the npad keys, and the
// floats past them untouched.
template <class Want>
void check_keys(Mismatches& m, const std::vector<float>& out, index_t npad, const char* what, Want&& want) {
  for (index_t j = 0; j < npad; ++j) {
    const auto [value, tol] = want(j);
    m.check(out[static_cast<std::size_t>(j)], value, tol, what, j);
  }
  for (auto j = static_cast<std::size_t>(npad); j < out.size(); ++j) {
    m.check(out[j], kSentinel, 0.0, "past npad", static_cast<index_t>(j));
  }
}

// q . k_j in double, and the sum of its finite |terms| (for the tolerance); keys past n are zero.
std::pair<double, double> dot(const float* q, const std::vector<float>& k, index_t n, index_t d, index_t j) {
  double s = 0.0, mag = 0.0;
  for (index_t c = 0; c < d; ++c) {
    const double kc = j < n ? k[static_cast<std::size_t>(j * d + c)] : 0.0;
    const double term = static_cast<double>(q[c]) * kc;
    s += term;
    if (std::isfinite(term)) mag += std::abs(term);
  }
  return {s, mag};
}

float special(int which) { return which == 0 ? kNaN : which == 1 ? kInf : -kInf; }

}  // namespace

TEST_CASE("scenario kernels are compiled for every Highway target and each supported one runs", "[scenarios][simd]") {
  const std::int64_t compiled = seqattn::dispatch::scenario_kernel_targets();
  INFO("compiled: " << names_of(compiled));
#if HWY_ARCH_X86
  constexpr std::int64_t kX86 = HWY_SSSE3 | HWY_SSE4 | HWY_AVX2 | HWY_AVX3;
  CHECK((compiled & kX86) == kX86);
  CHECK((compiled & (HWY_SCALAR | HWY_EMU128)) != 0);
#endif
  REQUIRE(!tables().empty());
  std::int64_t seen = 0;
  for (const ScenarioKernels& k : tables()) {
    INFO("target " << k.target);
    CHECK((seen & k.target_bit) == 0);  // one table per target
    CHECK(std::string(k.target) == hwy::TargetName(k.target_bit));
    CHECK(k.chunk_width >= 2);
    CHECK(k.chunk_width % 2 == 0);
    CHECK(k.index_rows != nullptr);
    CHECK(k.pool_scores != nullptr);
    CHECK(k.pool_softmax != nullptr);
    seen |= k.target_bit;
  }
  // The entry point, unmocked, gives the best of them.
  CHECK(seqattn::dispatch::scenario_kernels().target_bit == tables().front().target_bit);
}

TEST_CASE("index_rows (DSA indexer) matches a naive reference on every Highway target", "[scenarios][simd]") {
  std::mt19937 rng(2301);
  // specials: -1 none; else NaN / +inf / -inf (0, 1, 2) placed in q, k or w.
  for (const index_t n : kKeyCounts) {
    for (const index_t h : {index_t{1}, index_t{3}}) {
      for (const index_t d : {index_t{1}, index_t{7}, index_t{32}}) {
        for (int spec = -1; spec < 9; ++spec) {
          std::vector<float> k = uniform(rng, n * d), q = uniform(rng, 2 * h * d), w = uniform(rng, 2 * h, 0.0f, 1.0f);
          if (spec >= 0) {
            const float x = special(spec % 3);
            if (spec / 3 == 0) q[static_cast<std::size_t>(d / 2)] = x;        // row 0, head 0
            if (spec / 3 == 1) k[static_cast<std::size_t>((n / 2) * d)] = x;  // key n / 2
            if (spec / 3 == 2) w[static_cast<std::size_t>(h)] = x;            // row 1, head 0
          }
          on_every_target([&](const ScenarioKernels& kern) {
            INFO("n = " << n << ", h = " << h << ", d = " << d << ", special case " << spec);
            const ChunkedKeys keys(k, n, d, kern.chunk_width);
            std::vector<float> out0 = keys.output(), out1 = keys.output();
            kern.index_rows(q.data(), w.data(), h, d, keys.kt.data(), keys.npad, out0.data(), out1.data());
            Mismatches m;
            for (index_t r = 0; r < 2; ++r) {
              check_keys(m, r == 0 ? out0 : out1, keys.npad, r == 0 ? "out0" : "out1", [&](index_t j) {
                double want = 0.0, mag = 0.0;
                for (index_t hh = 0; hh < h; ++hh) {
                  const auto [s, smag] = dot(q.data() + (r * h + hh) * d, k, n, d, j);
                  const double relu = s > 0.0 ? s : 0.0;  // NaN -> 0, as hn::Max(dot, 0) gives
                  const double wh = w[static_cast<std::size_t>(r * h + hh)];
                  want += relu * wh;
                  mag += smag * std::abs(wh);
                }
                return std::pair{want, 1e-5 * mag + 1e-30};
              });
            }
            require_none(m);
          });
        }
      }
    }
  }
}

TEST_CASE("pool_scores (Kascade) matches a naive reference on every Highway target", "[scenarios][simd]") {
  std::mt19937 rng(2302);
  for (const index_t n : kKeyCounts) {
    for (const index_t d : {index_t{1}, index_t{7}, index_t{33}}) {
      for (int spec = -1; spec < 6; ++spec) {
        std::vector<float> q = uniform(rng, d), k = uniform(rng, n * d);
        if (spec >= 0 && spec / 3 == 0) q[static_cast<std::size_t>(d - 1)] = special(spec % 3);
        if (spec >= 0 && spec / 3 == 1) k[static_cast<std::size_t>((n - 1) * d)] = special(spec % 3);
        on_every_target([&](const ScenarioKernels& kern) {
          INFO("n = " << n << ", d = " << d << ", special case " << spec);
          const ChunkedKeys keys(k, n, d, kern.chunk_width);
          std::vector<float> p = keys.output();
          kern.pool_scores(q.data(), d, keys.kt.data(), keys.npad, p.data());
          Mismatches m;
          check_keys(m, p, keys.npad, "p", [&](index_t j) {
            const auto [s, mag] = dot(q.data(), k, n, d, j);
            return std::pair{s, 1e-5 * mag + 1e-30};
          });
          require_none(m);
        });
      }
    }
  }
}

TEST_CASE("pool_softmax (Kascade) matches a naive reference on every Highway target", "[scenarios][simd]") {
  std::mt19937 rng(2303);
  for (const index_t n : kKeyCounts) {
    for (const index_t before : {index_t{0}, index_t{1}, n / 2, n - 1, n}) {
      for (const bool masked : {false, true}) {
        std::vector<float> p0 = uniform(rng, n, -8.0f, 8.0f);
        // -inf scores weigh 0 (the contract: at least one finite score).
        if (masked) {
          for (index_t j = 1; j < n; j += 3) p0[static_cast<std::size_t>(j)] = -kInf;
        }
        const std::vector<float> dst0 = uniform(rng, n + 3, 0.0f, 1.0f);
        double m = -INFINITY, sum = 0.0;
        for (const float x : p0) m = std::max(m, static_cast<double>(x));
        std::vector<double> e(static_cast<std::size_t>(n));
        for (index_t j = 0; j < n; ++j)
          sum += (e[static_cast<std::size_t>(j)] = std::exp(p0[static_cast<std::size_t>(j)] - m));
        on_every_target([&](const ScenarioKernels& kern) {
          INFO("n = " << n << ", before = " << before << (masked ? ", with -inf scores" : ""));
          std::vector<float> p = p0, dst = dst0;
          kern.pool_softmax(p.data(), n, before, dst.data());
          Mismatches mm;
          for (index_t j = 0; j < n; ++j) {
            const double ej = e[static_cast<std::size_t>(j)];
            mm.check(p[static_cast<std::size_t>(j)], ej, 1e-5 * ej + 1e-30, "p", j);
          }
          for (index_t j = 0; j < n + 3; ++j) {
            const double d0 = dst0[static_cast<std::size_t>(j)];
            const double want = j < before ? d0 + e[static_cast<std::size_t>(j)] / sum : d0;
            mm.check(dst[static_cast<std::size_t>(j)], want, j < before ? 1e-6 + 1e-5 * want : 0.0, "dst", j);
          }
          require_none(mm);
        });
      }
    }
  }
}

}  // namespace seqattn_test_scenarios_scenario_kernels_test
