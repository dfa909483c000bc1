// FlashKernel (backends/highway-inl.h) on every Highway target, element by
// element against ScalarKernel (backends/scalar.hpp, the contract in plain C++).
//
// foreach_target.h re-includes this file once per target it compiles; with
// HWY_COMPILE_ALL_ATTAINABLE that is every attainable target (on x86: SCALAR
// or EMU128, SSSE3, SSE4, AVX2, AVX3) whatever the static target. tests/
// CMakeLists.txt compiles this file without SEQATTN_SIMD_FLAGS, like
// src/dispatch.cc: each body carries its own target attributes, so the SSSE3
// body is SSSE3 code and not AVX2 code in disguise. Each body exports its
// FlashKernel entry points as function pointers (FlashKernelOfThisTarget);
// the HWY_ONCE part fetches the body of every compiled target this CPU
// supports through the HWY_EXPORT table (mocking hwy::SupportedTargets() with
// hwy::SetSupportedTargetsForTest, as Highway's own gtest fixtures do) and
// checks it. The references and the comparisons are compiled once, for the
// baseline target, so every target is compared against the same numbers.

#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE  // must precede the first Highway header
#endif
// This TU is built without SIMD flags on purpose (every target's body carries
// its own attributes), so backends::Highway's baseline here is the portable
// target: expected, not the mistake backends/highway.hpp warns about.
#ifndef SEQATTN_ALLOW_SCALAR
#define SEQATTN_ALLOW_SCALAR
#endif

#ifndef SEQATTN_TESTS_KERNELS_HIGHWAY_TARGETS_ENTRY
#define SEQATTN_TESTS_KERNELS_HIGHWAY_TARGETS_ENTRY
#include <cstdint>
#include <memory>

#include "seqattn/attention/detail/problem.hpp"
#include "seqattn/attention/inputs.hpp"
#include "seqattn/attention/options.hpp"
#include "seqattn/attention/plan.hpp"
#include "seqattn/attention/variants.hpp"
#include "seqattn/backends/cpu_tiled.hpp"
#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/masks/block_mask.hpp"

namespace seqattn::kernel_tests {

// The whole engine on one target: plans with `block_mask` (built at the
// target's tile shape) and runs with the options' variant on `workers` threads.
template <class T>
using ForwardFn = void (*)(const AttentionInputs<T>&, const BlockMask&, TensorView<T>, TensorView<float>,
                           const AttentionOptions&, int);

// One target's FlashKernel: its constants and its static member functions.
struct FlashKernelEntry {
  std::int64_t target = 0;  // HWY_TARGET of the body that filled this in
  const char* name = "";
  index_t block_q = 0, block_kv = 0, lanes = 0;
  index_t (*padded_rows)(index_t) = nullptr;
  index_t (*padded_dim)(index_t) = nullptr;
  void (*to_f32_float)(const float*, index_t, float*) = nullptr;
  void (*to_f32_bf16)(const bfloat16*, index_t, float*) = nullptr;
  void (*scores)(const float*, index_t, index_t, const float*, index_t, index_t, float*, const RowsAhead&) = nullptr;
  void (*softcap)(float*, index_t, index_t, float) = nullptr;
  void (*apply_column_bits)(float*, index_t, index_t, const std::uint8_t*, index_t) = nullptr;
  bool (*online_softmax)(float*, index_t, index_t, float*, float*, float*) = nullptr;
  bool (*online_softmax_to_bf16)(float*, index_t, index_t, float*, float*, float*) = nullptr;
  void (*accumulate_pv)(const float*, index_t, index_t, const float*, index_t, index_t, const float*, float*,
                        const RowsAhead&) = nullptr;
  void (*accumulate_pv_unguarded)(const float*, index_t, index_t, const float*, index_t, index_t, const float*, float*,
                                  const RowsAhead&) = nullptr;
  void (*softmax_backward_lanes)(float*, float*, index_t, index_t, const float*, const float*) = nullptr;
  void (*softmax_backward_columns)(float*, float*, index_t, index_t, const float*, const float*) = nullptr;
  void (*transpose_rows)(const float* const*, index_t, index_t, index_t, float, float*) = nullptr;
  ForwardFn<float> forward_f32 = nullptr;
  // Forward, then backward with the same plan; writes dq, dk, dv.
  void (*backward_f32)(const AttentionInputs<float>&, const BlockMask&, TensorView<const float> dout,
                       TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, int workers) = nullptr;
  ForwardFn<bfloat16> forward_bf16 = nullptr;
};

}  // namespace seqattn::kernel_tests
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/highway_targets_test.cc"
#include <hwy/foreach_target.h>  // must precede highway.h
#include <hwy/highway.h>

#include "seqattn/backends/highway-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqattn::HWY_NAMESPACE {

struct EngineOfThisTarget : backends::CpuTiled<FlashKernel> {
  static const char* name() { return hwy::TargetName(HWY_TARGET); }
};

template <class T>
void ForwardOnThisTarget(const AttentionInputs<T>& in, const BlockMask& bm, TensorView<T> out, TensorView<float> lse,
                         const AttentionOptions& options, int workers) {
  const std::shared_ptr<const BlockMask> borrowed(std::shared_ptr<void>{}, &bm);
  const auto plan = plan_attention<EngineOfThisTarget>(shape_of(in), borrowed, PlanOptions{options.kv_splits}, workers);
  const variants::Standard variant{options.scale, {options.softcap}, {options.sinks}};
  const AttentionShape shape = shape_of(in);
  const detail::AttentionProblem<T> problem = detail::make_attention_problem(in, shape, out, lse);
  execution::ThreadPool pool(workers);
  EngineOfThisTarget::forward(plan, problem, variant, pool);
}

void BackwardOnThisTarget(const AttentionInputs<float>& in, const BlockMask& bm, TensorView<const float> dout,
                          TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, int workers) {
  const std::shared_ptr<const BlockMask> borrowed(std::shared_ptr<void>{}, &bm);
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<EngineOfThisTarget>(shape_of(in), borrowed, options, workers);
  const AttentionShape shape = shape_of(in);
  Tensor<float> out(dout.shape());
  const index_t tokens = in.q.extent(1);
  Tensor<float> lse(Extents{in.q.extent(0), shape.heads, tokens});
  execution::ThreadPool pool(workers);
  const variants::Default variant;
  EngineOfThisTarget::forward(plan, detail::make_attention_problem(in, shape, out.view(), lse.view()), variant, pool);
  const auto problem = detail::make_backward_problem(in, shape, TensorView<const float>(out.view()),
                                                     TensorView<const float>(lse.view()), dout, dq, dk, dv, {});
  EngineOfThisTarget::backward(plan, problem, variant, pool);
}

kernel_tests::FlashKernelEntry FlashKernelOfThisTarget() {
  using K = FlashKernel;
  kernel_tests::FlashKernelEntry e;
  e.target = HWY_TARGET;
  e.name = hwy::TargetName(HWY_TARGET);
  e.block_q = K::kBlockQ;
  e.block_kv = K::kBlockKv;
  e.lanes = K::kLanes;
  e.padded_rows = &K::padded_rows;
  e.padded_dim = &K::padded_dim;
  e.to_f32_float = static_cast<void (*)(const float*, index_t, float*)>(&K::to_f32);
  e.to_f32_bf16 = static_cast<void (*)(const bfloat16*, index_t, float*)>(&K::to_f32);
  e.scores = &K::scores;
  e.softcap = &K::softcap;
  e.apply_column_bits = &K::apply_column_bits;
  e.online_softmax = &K::online_softmax;
  e.online_softmax_to_bf16 = &K::online_softmax_to_bf16;
  e.accumulate_pv = &K::accumulate_pv;
  e.accumulate_pv_unguarded = &K::accumulate_pv_unguarded;
  e.softmax_backward_lanes = &K::softmax_backward_lanes;
  e.softmax_backward_columns = &K::softmax_backward_columns;
  e.transpose_rows = &K::transpose_rows;
  e.forward_f32 = &ForwardOnThisTarget<float>;
  e.backward_f32 = &BackwardOnThisTarget;
  e.forward_bf16 = &ForwardOnThisTarget<bfloat16>;
  return e;
}

}  // namespace seqattn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/backends/scalar.hpp"
#include "seqattn/masks.hpp"

#include "support/catch.hpp"

namespace seqattn {
HWY_EXPORT(FlashKernelOfThisTarget);

namespace kernel_tests {
namespace {

using backends::ScalarKernel;

// Query rows per tile. Besides the usual counts, 33 and 100 give AVX3 three
// row vectors (rows_p 48, and 112 = 4 + 3 vectors), the only way to reach
// its 3-vector QK^T block.
constexpr index_t kRowCounts[] = {1, 3, 8, 9, 17, 33, 64, 100, 127, 128};
constexpr index_t kSq = ScalarKernel::kBlockQ;  // ScalarKernel's row stride (FlashKernel's differs)
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- targets -----------------------------------------------------------------

std::string target_names(std::int64_t targets) {
  std::string out;
  for (std::int64_t rest = targets; rest != 0; rest &= rest - 1) {
    if (!out.empty()) out += ' ';
    out += hwy::TargetName(rest & -rest);
  }
  return out.empty() ? "(none)" : out;
}

struct Targets {
  std::int64_t compiled = HWY_TARGETS;
  std::int64_t supported = 0;  // hwy::SupportedTargets() before any mock
  std::int64_t expected = 0;   // compiled & supported: every one of these must run
  std::vector<std::int64_t> requested;
  std::vector<FlashKernelEntry> kernels;  // kernels[i] is the body dispatched for requested[i]
};

// The FlashKernel of every compiled target this CPU supports, best first,
// each fetched through the dispatch table while SupportedTargets() is mocked
// to that one target.
const Targets& targets() {
  static const Targets t = [] {
    Targets r;
    r.supported = hwy::SupportedTargets();
    r.expected = r.compiled & r.supported;
    for (std::int64_t rest = r.expected; rest != 0; rest &= rest - 1) {
      const std::int64_t target = rest & -rest;
      hwy::SetSupportedTargetsForTest(target);
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
      r.requested.push_back(target);
      r.kernels.push_back(HWY_DYNAMIC_DISPATCH(FlashKernelOfThisTarget)());
    }
    hwy::SetSupportedTargetsForTest(0);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    std::fprintf(stderr, "seqattn kernel tests: Highway targets compiled: %s; supported by this CPU: %s; run: %s\n",
                 target_names(r.compiled).c_str(), target_names(r.supported).c_str(), target_names(r.expected).c_str());
    return r;
  }();
  return t;
}

// Runs fn(kernel) for every target, naming the target in failure messages,
// and records which targets ran.
template <class Fn>
void for_each_target(std::int64_t& ran, Fn&& fn) {
  for (const FlashKernelEntry& kernel : targets().kernels) {
    INFO("Highway target " << kernel.name);
    fn(kernel);
    ran |= kernel.target;
  }
}

using SoftmaxFn = bool (*)(float*, index_t, index_t, float*, float*, float*);

// fn(kernel, softmax, p_tol) for every target and both of its online
// softmaxes; p_tol(w): how far a weight may be from the reference's w:
// exact exponentials within 1e-6 relative, those for weights rounded to
// bf16 next within 3e-6 (the polynomial) plus the rounding of x log2(e)
// (2^-24 |log2 w| ln 2 relative).
template <class Fn>
void for_each_target_and_softmax(std::int64_t& ran, Fn&& fn) {
  for_each_target(ran, [&](const FlashKernelEntry& kernel) {
    for (const bool to_bf16 : {false, true}) {
      INFO((to_bf16 ? "online_softmax_to_bf16" : "online_softmax"));
      const auto p_tol = [to_bf16](float w) {
        const double rel = to_bf16 ? 3e-6 + 1.2e-7 * std::abs(std::log(std::max(w, 1e-37f))) : 1e-6;
        return rel * w + 1e-37;
      };
      fn(kernel, to_bf16 ? kernel.online_softmax_to_bf16 : kernel.online_softmax, p_tol);
    }
  });
}

// Any target's kernel, for the tile shape (each test checks that every target
// has the same).
const FlashKernelEntry& any_kernel() {
  REQUIRE(!targets().kernels.empty());
  return targets().kernels.front();
}

void require_every_target_ran(std::int64_t ran) {
  INFO("targets expected (compiled and supported): " << target_names(targets().expected)
                                                     << "; targets run: " << target_names(ran));
  REQUIRE((ran & HWY_STATIC_TARGET) != 0);
  REQUIRE(ran == targets().expected);
}

// ---- buffers and comparisons ---------------------------------------------------

// Exactly n floats, aligned for any Highway vector, so AddressSanitizer sees
// the exact bounds.
class Buffer {
 public:
  static constexpr std::size_t kAlign = 64;  // FlashKernel's vectors have at most 16 floats

  explicit Buffer(index_t n, float fill = 0.0f)
      : n_(n),
        p_(static_cast<float*>(::operator new (static_cast<std::size_t>(std::max<index_t>(n, 1)) * sizeof(float),
                                               std::align_val_t{kAlign}))) {
    std::fill_n(p_.get(), n, fill);
  }
  float* data() { return p_.get(); }
  const float* data() const { return p_.get(); }
  float& operator[](index_t i) { return p_.get()[i]; }
  float operator[](index_t i) const { return p_.get()[i]; }
  index_t size() const { return n_; }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete (p, std::align_val_t{kAlign}); }
  };
  index_t n_;
  std::unique_ptr<float, Free> p_;
};

// A prefetch hint over `n` rows of `base` (`stride` floats apart, `width`
// each): what the engine hands the kernels in decode. It must change no value;
// n other than the kernel's key count leaves a remainder of lines per step.
struct AheadRows {
  std::vector<const void*> rows;
  RowsAhead hint;
  AheadRows(const float* base, index_t n, index_t stride, index_t width) {
    for (index_t j = 0; j < n; ++j) rows.push_back(base + j * stride);
    hint = RowsAhead{rows.data(), n, width * static_cast<index_t>(sizeof(float))};
  }
};

// Fills elements that a kernel must neither write nor read into its results.
const float kSentinel = std::bit_cast<float>(0x7FC0DEADu);
const float kPoison = std::bit_cast<float>(0x7FC0BEEFu);

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

bool near(float got, float want, double tol) {
  if (std::isnan(got) || std::isnan(want)) return false;
  if (std::isinf(got) || std::isinf(want)) return got == want;
  return std::abs(static_cast<double>(got) - static_cast<double>(want)) <= tol;
}

// Element-by-element mismatches of one kernel call, the first few described.
class Report {
 public:
  template <class Where>
  void expect_near(float got, float want, double tol, Where&& where) {
    ++checked_;
    if (!near(got, want, tol)) fail(where(), got, want, tol);
  }
  template <class Where>
  void expect_bits(float got, float want, Where&& where) {
    ++checked_;
    if (bits_of(got) != bits_of(want)) fail(where(), got, want, 0.0);
  }
  index_t checked() const { return checked_; }
  index_t bad() const { return bad_; }
  std::string text() const {
    return std::to_string(bad_) + " of " + std::to_string(checked_) + " elements differ\n" + first_.str();
  }

 private:
  void fail(const std::string& where, float got, float want, double tol) {
    if (bad_++ < 6) {
      first_.precision(9);
      first_ << "  " << where << ": got " << got << " (0x" << std::hex << bits_of(got) << std::dec << "), want " << want
             << " (0x" << std::hex << bits_of(want) << std::dec << "), tolerance " << tol << '\n';
    }
  }
  index_t checked_ = 0, bad_ = 0;
  std::ostringstream first_;
};

void check_report(const Report& report) {
  INFO(report.text());
  CHECK(report.checked() > 0);
  CHECK(report.bad() == 0);
}

auto at(const char* what, index_t i) {
  return [=] { return std::string(what) + "[" + std::to_string(i) + "]"; };
}
auto at(const char* what, index_t i, index_t j) {
  return [=] { return std::string(what) + "[" + std::to_string(i) + "][" + std::to_string(j) + "]"; };
}

std::vector<float> uniform(std::mt19937& rng, index_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (float& x : out) x = dist(rng);
  return out;
}

// ---- ScalarKernel on FlashKernel's layout ------------------------------------------
// ScalarKernel's tiles have a row stride of kSq = 64 (FlashKernel's: 128), so
// the references below run it on 64-row chunks of a [n][stride] tile that are
// copied to its layout and back; every kernel is independent across rows.
template <class Fn>
void scalar_chunks(float* tile, index_t stride, index_t n, index_t rows, Fn&& fn) {
  std::vector<float> s(static_cast<std::size_t>(std::max<index_t>(n, 1) * kSq));
  for (index_t r0 = 0; r0 < rows; r0 += kSq) {
    const index_t nr = std::min(kSq, rows - r0);
    for (index_t j = 0; j < n; ++j) std::copy_n(tile + j * stride + r0, nr, s.data() + j * kSq);
    fn(s.data(), r0, nr);
    for (index_t j = 0; j < n; ++j) std::copy_n(s.data() + j * kSq, nr, tile + j * stride + r0);
  }
}

}  // namespace
}  // namespace kernel_tests
}  // namespace seqattn

using seqattn::index_t;
using namespace seqattn::kernel_tests;

namespace {
// An AheadStream request that records the line instead of prefetching it.
struct RecordLines {
  std::vector<const char*>* lines;
  std::vector<bool>* into_l2 = nullptr;  // each line's level, where asked
  void operator()(const char* p, bool l2) const {
    lines->push_back(p);
    if (into_l2 != nullptr) into_l2->push_back(l2);
  }
};
}  // namespace

TEST_CASE("AheadStream requests each line of its lists once, in order, at an even rate", "[kernels][ahead]") {
  using seqattn::BasicAheadStream;
  using seqattn::RowsAhead;
  alignas(64) static char memory[64 * 64];
  const auto row_at = [](index_t i) -> const void* { return memory + 64 * i; };
  // Rows of 256 bytes (4 lines), of 100 bytes (2 lines, the last partial), of no bytes, and an empty list.
  std::vector<const void*> wide, narrow, nothing;
  for (index_t j = 0; j < 5; ++j) wide.push_back(row_at(8 * j));
  for (index_t j = 0; j < 3; ++j) narrow.push_back(row_at(48 + 2 * j));
  for (index_t j = 0; j < 2; ++j) nothing.push_back(row_at(60 + j));
  const RowsAhead zero_bytes{nothing.data(), 2, 0};
  const RowsAhead second{narrow.data(), 3, 100, &zero_bytes};
  const RowsAhead first{wide.data(), 5, 256, &second};
  const RowsAhead head{nullptr, 0, 0, &first};  // an empty list at the head of a chain
  std::vector<const char*> want;
  for (const void* row : wide) {
    for (index_t b = 0; b < 256; b += 64) want.push_back(static_cast<const char*>(row) + b);
  }
  for (const void* row : narrow) {
    for (index_t b = 0; b < 100; b += 64) want.push_back(static_cast<const char*>(row) + b);
  }
  const auto lines = static_cast<index_t>(want.size());
  REQUIRE(head.lines() == lines);
  for (const index_t steps : {index_t{1}, index_t{3}, index_t{7}, index_t{26}, index_t{64}, index_t{200}}) {
    INFO("steps " << steps);
    std::vector<const char*> got;
    BasicAheadStream<RecordLines> stream(head, steps, RecordLines{&got});
    std::size_t before = 0;
    for (index_t k = 1; k <= steps; ++k) {
      stream.step();
      // After k steps, floor(k * lines / steps) lines: never more than one above the even share.
      CHECK(static_cast<index_t>(got.size()) == k * lines / steps);
      CHECK(static_cast<index_t>(got.size() - before) <= (lines + steps - 1) / steps);
      before = got.size();
    }
    CHECK(got == want);
  }
  std::vector<const char*> none;
  BasicAheadStream<RecordLines> empty_stream(RowsAhead{}, 4, RecordLines{&none});
  for (int k = 0; k < 4; ++k) empty_stream.step();
  CHECK(none.empty());
}

// Decode over a tile that crosses pages calls the kernel once per page, each
// call requesting its share of the tile's rows ahead: the parts of a chain
// request every line of it once, in order, however the keys are split.
TEST_CASE("RowsAheadPart splits a chain of two lists into parts that together request it once", "[kernels][ahead]") {
  using seqattn::BasicAheadStream;
  using seqattn::RowsAhead;
  using seqattn::RowsAheadPart;
  alignas(64) static char memory[64 * 64];
  std::vector<const void*> own, next;
  for (index_t j = 0; j < 7; ++j) own.push_back(memory + 64 * (2 * j));
  for (index_t j = 0; j < 11; ++j) next.push_back(memory + 64 * (20 + 3 * j));
  const RowsAhead second{next.data(), 11, 130, nullptr, true};  // 3 lines a row, into L2
  const RowsAhead first{own.data(), 7, 64, &second};
  std::vector<const char*> want;
  std::vector<bool> want_l2;
  BasicAheadStream<RecordLines> whole(first, 1, RecordLines{&want, &want_l2});
  whole.step();
  REQUIRE(static_cast<index_t>(want.size()) == 7 + 11 * 3);
  // Each list's lines at its own level.
  CHECK(std::count(want_l2.begin(), want_l2.begin() + 7, true) == 0);
  CHECK(std::count(want_l2.begin() + 7, want_l2.end(), false) == 0);
  // Keys of a 45-key tile split as pages of 16 starting 5 keys into a page, and other splits.
  for (const std::vector<index_t>& bounds :
       {std::vector<index_t>{0, 11, 27, 43, 45}, {0, 45}, {0, 1, 2, 44, 45}, {0, 20, 25, 45}}) {
    std::vector<const char*> got;
    std::vector<bool> got_l2;
    INFO("parts " << bounds.size() - 1);
    for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
      const RowsAheadPart part(first, bounds[i], bounds[i + 1], 45);
      // Each part's share of the 18 rows, in proportion to its keys.
      index_t rows = 0;
      for (const RowsAhead* list = &part.get(); list != nullptr; list = list->also) rows += list->n;
      CHECK(rows == 18 * bounds[i + 1] / 45 - 18 * bounds[i] / 45);
      BasicAheadStream<RecordLines> stream(part.get(), 3, RecordLines{&got, &got_l2});
      for (int k = 0; k < 3; ++k) stream.step();
    }
    CHECK(got == want);
    CHECK(got_l2 == want_l2);
  }
  const RowsAheadPart none(RowsAhead{}, 0, 16, 64);
  CHECK(none.get().empty());
}

TEST_CASE("FlashKernel is compiled for every Highway target and each supported one runs", "[kernels]") {
  const Targets& t = targets();
  INFO("compiled: " << target_names(t.compiled) << "; supported: " << target_names(t.supported)
                    << "; run: " << target_names(t.expected));
  REQUIRE((t.compiled & HWY_STATIC_TARGET) != 0);
  REQUIRE((t.expected & HWY_STATIC_TARGET) != 0);
#if HWY_ARCH_X86
  // Every x86 target Highway 1.0.3 builds for dynamic dispatch (AVX3_DL only
  // with HWY_WANT_AVX3_DL), plus the portable fallback.
  constexpr std::int64_t kX86 = HWY_SSSE3 | HWY_SSE4 | HWY_AVX2 | HWY_AVX3;
  CHECK((t.compiled & kX86) == kX86);
  CHECK((t.compiled & (HWY_SCALAR | HWY_EMU128)) != 0);
#endif
  REQUIRE(t.kernels.size() == t.requested.size());
  std::int64_t ran = 0;
  for (std::size_t i = 0; i < t.kernels.size(); ++i) {
    const FlashKernelEntry& k = t.kernels[i];
    INFO("requested target " << hwy::TargetName(t.requested[i]) << ", body of target " << k.name);
    CHECK(k.target == t.requested[i]);
    CHECK(k.block_q % 8 == 0);
    CHECK(k.block_q >= kSq);
    CHECK(k.block_kv >= 64);
    CHECK(k.lanes >= 1);
    ran |= k.target;
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel to_f32 matches ScalarKernel on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(101);
  std::uniform_int_distribution<std::uint32_t> word;
  const float specials[] = {0.0f,
                            -0.0f,
                            kInf,
                            -kInf,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::max()};
  for (index_t n = 0; n <= 70; ++n) {
    for (index_t offset : {0, 1}) {  // rows start anywhere in a K/V tensor
      // float: a copy, bit for bit (NaN and signed zero included).
      std::vector<float> f(static_cast<std::size_t>(n + offset));
      for (index_t i = 0; i < n + offset; ++i) {
        f[static_cast<std::size_t>(i)] =
            i % 9 == 4 ? specials[(i / 9) % 7] : std::bit_cast<float>(word(rng) & 0xBFFFFFFFu);
      }
      // bfloat16: every bit pattern, NaNs and denormals included.
      std::vector<seqattn::bfloat16> b(static_cast<std::size_t>(n + offset));
      for (auto& x : b) x = seqattn::bfloat16::from_bits(static_cast<std::uint16_t>(word(rng)));
      Buffer want_f(n + 16, kSentinel), want_b(n + 16, kSentinel);
      ScalarKernel::to_f32(f.data() + offset, n, want_f.data());
      ScalarKernel::to_f32(b.data() + offset, n, want_b.data());
      for_each_target(ran, [&](const FlashKernelEntry& k) {
        INFO("n = " << n << ", source offset " << offset);
        Buffer got_f(n + 16, kSentinel), got_b(n + 16, kSentinel);
        k.to_f32_float(f.data() + offset, n, got_f.data());
        k.to_f32_bf16(b.data() + offset, n, got_b.data());
        Report rf, rb;
        for (index_t i = 0; i < n + 16; ++i) {  // past n: untouched
          rf.expect_bits(got_f[i], want_f[i], at("float dst", i));
          rb.expect_bits(got_b[i], want_b[i], at("bf16 dst", i));
        }
        check_report(rf);
        check_report(rb);
      });
    }
  }
  require_every_target_ran(ran);
}

// Rows anywhere (their own pointers, as a task's stacked heads), whole 16 x 16
// blocks and edges of every size, scale 1 (bit for bit: NaN payloads, signed
// zeros) and 0.125 (exact in fp32); padded lanes zero; beyond them only
// whole 16-lane padding may be written, and nothing past `width` dst rows.
TEST_CASE("FlashKernel transpose_rows transposes on every Highway target", "[kernels][backward]") {
  std::int64_t ran = 0;
  std::mt19937 rng(151);
  std::uniform_int_distribution<std::uint32_t> word;
  for (const index_t n : {1, 7, 8, 15, 16, 17, 33, 64, 100, 128}) {
    for (const index_t width : {1, 5, 16, 31, 32, 47, 64, 72, 128}) {
      for (const float scale : {1.0f, 0.125f}) {
        for_each_target(ran, [&](const FlashKernelEntry& k) {
          if (n > k.block_q) return;
          INFO("n " << n << ", width " << width << ", scale " << scale);
          const index_t bq = k.block_q, n_p = k.padded_rows(n), stride = width + 3;
          Buffer src(n * stride + 16, 0.0f), got((width + 1) * bq, kSentinel);
          for (index_t i = 0; i < src.size(); ++i) src[i] = std::bit_cast<float>(word(rng));
          std::vector<const float*> rows;
          for (index_t r = 0; r < n; ++r) rows.push_back(src.data() + (n - 1 - r) * stride);  // any order
          k.transpose_rows(rows.data(), n, n_p, width, scale, got.data());
          Report rep;
          for (index_t d = 0; d <= width; ++d) {
            for (index_t r = 0; r < bq; ++r) {
              const float g = got[d * bq + r];
              if (d < width && r < n) {
                rep.expect_bits(g, rows[static_cast<std::size_t>(r)][d] * scale, at("dst", d * bq + r));
              } else if (d < width && r < n_p) {
                rep.expect_bits(g, 0.0f, at("padding", d * bq + r));
              } else if (d < width && r < (n_p + 15) / 16 * 16) {
                rep.expect_bits(g, bits_of(g) == 0u ? 0.0f : kSentinel, at("past padding", d * bq + r));
              } else {
                rep.expect_bits(g, kSentinel, at("untouched", d * bq + r));
              }
            }
          }
          check_report(rep);
        });
      }
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel scores match ScalarKernel on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(202);
  for (const index_t rows : kRowCounts) {
    for (const index_t dk : {1, 7, 64, 72, 80, 96, 128, 256}) {
      for (const index_t cols : {1, 5, 63, 64}) {
        // The engine passes dk (its own copy of K) or the tensor's token
        // stride: K rows start anywhere.
        const index_t k_stride = dk + std::array<index_t, 4>{1, 0, 5, 16}[static_cast<std::size_t>((rows + dk) % 4)];
        const std::vector<float> k = uniform(rng, (cols - 1) * k_stride + dk, -1.0f, 1.0f);  // exact size
        const std::vector<float> q = uniform(rng, rows * dk, -1.0f, 1.0f);                   // q[r][d]

        // Reference: ScalarKernel with its own padding (none), want[j][r].
        Buffer want(cols * rows), mag(cols * rows);
        {
          Buffer qt(dk * rows);
          for (index_t d = 0; d < dk; ++d) {
            for (index_t r = 0; r < rows; ++r) qt[d * rows + r] = q[static_cast<std::size_t>(r * dk + d)];
          }
          scalar_chunks(want.data(), rows, cols, rows, [&](float* st, index_t r0, index_t nr) {
            std::vector<float> qs(static_cast<std::size_t>(dk * kSq));
            for (index_t d = 0; d < dk; ++d) std::copy_n(qt.data() + d * rows + r0, nr, qs.data() + d * kSq);
            ScalarKernel::scores(qs.data(), nr, dk, k.data(), k_stride, cols, st);
          });
          for (index_t j = 0; j < cols; ++j) {
            for (index_t r = 0; r < rows; ++r) {
              double s = 0.0;
              for (index_t d = 0; d < dk; ++d) {
                s += std::abs(static_cast<double>(k[static_cast<std::size_t>(j * k_stride + d)]) *
                              q[static_cast<std::size_t>(r * dk + d)]);
              }
              mag[j * rows + r] = static_cast<float>(s);
            }
          }
        }

        for_each_target(ran, [&](const FlashKernelEntry& kernel) {
          const index_t bq = kernel.block_q, rows_p = kernel.padded_rows(rows);
          INFO("rows = " << rows << " (rows_p = " << rows_p << "), dk = " << dk << ", cols = " << cols
                         << ", k_stride = " << k_stride);
          REQUIRE(rows_p >= rows);
          REQUIRE(rows_p <= bq);
          // Qt[d][r]: queries, then zero padding queries, then poison the
          // kernel must not store.
          Buffer qt(dk * bq, kPoison);
          for (index_t d = 0; d < dk; ++d) {
            for (index_t r = 0; r < rows_p; ++r)
              qt[d * bq + r] = r < rows ? q[static_cast<std::size_t>(r * dk + d)] : 0.0f;
          }
          Buffer st(kernel.block_kv * bq, kSentinel);
          const AheadRows ahead(k.data(), (cols + 1) / 2, k_stride, dk);  // the next rows: here, K's own
          kernel.scores(qt.data(), rows_p, dk, k.data(), k_stride, cols, st.data(), ahead.hint);
          Report rep;
          for (index_t j = 0; j < kernel.block_kv; ++j) {
            for (index_t r = 0; r < bq; ++r) {
              if (j < cols && r < rows) {
                rep.expect_near(st[j * bq + r], want[j * rows + r], 1e-5 * mag[j * rows + r], at("St", j, r));
              } else if (j >= cols || r >= rows_p) {
                rep.expect_bits(st[j * bq + r], kSentinel, at("St (outside cols x rows_p)", j, r));
              }
            }
          }
          check_report(rep);
        });
      }
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel softcap matches ScalarKernel on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(303);
  const float specials[] = {0.0f, -0.0f, 1e-7f, -1e-7f, 1e-30f, 18.7f, -18.8f, 100.0f, -1e4f, kInf, -kInf};
  int config = 0;
  for (const index_t rows : kRowCounts) {
    for (const index_t cols : {1, 5, 63, 64}) {
      const float cap = std::array<float, 3>{1.0f, 20.0f, 50.0f}[static_cast<std::size_t>(config++ % 3)];
      const index_t bq = any_kernel().block_q, bkv = any_kernel().block_kv;
      // One input tile for every target; the reference over all of its rows.
      Buffer in(bkv * bq);
      {
        const std::vector<float> x = uniform(rng, bkv * bq, -25.0f, 25.0f);
        for (index_t i = 0; i < bkv * bq; ++i)
          in[i] = i % 13 == 5 ? specials[(i / 13) % 11] : x[static_cast<std::size_t>(i)];
      }
      Buffer want(bkv * bq);
      std::copy_n(in.data(), bkv * bq, want.data());
      scalar_chunks(want.data(), bq, cols, bq,
                    [&](float* st, index_t, index_t nr) { ScalarKernel::softcap(st, cols, nr, cap); });

      for_each_target(ran, [&](const FlashKernelEntry& kernel) {
        REQUIRE(kernel.block_q == bq);
        REQUIRE(kernel.block_kv == bkv);
        // The engine passes padded_rows(rows); any rows_p is handled (tails
        // are blended), so the unpadded count is checked too.
        for (const index_t rows_p : {kernel.padded_rows(rows), rows}) {
          INFO("rows_p = " << rows_p << ", cols = " << cols << ", cap = " << cap);
          Buffer st(bkv * bq);
          std::copy_n(in.data(), bkv * bq, st.data());
          kernel.softcap(st.data(), cols, rows_p, cap);
          Report rep;
          for (index_t j = 0; j < bkv; ++j) {
            for (index_t r = 0; r < bq; ++r) {
              const index_t i = j * bq + r;
              if (j < cols && r < rows_p) {
                rep.expect_near(st[i], want[i], 1e-6 * std::abs(want[i]) + 1e-37, at("St", j, r));
              } else {
                rep.expect_bits(st[i], in[i], at("St (outside cols x rows_p)", j, r));
              }
            }
          }
          check_report(rep);
        }
      });
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel apply_column_bits matches ScalarKernel on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(404);
  std::uniform_int_distribution<int> byte(0, 255);
  const index_t bq = any_kernel().block_q, bkv = any_kernel().block_kv;
  for (const index_t rows_p : {1, 3, 5, 8, 9, 13, 16, 17, 23, 31, 33, 47, 63, 64, 65, 100, 121, 127, 128}) {
    for (const index_t cols : {1, 5, 63, 64}) {
      // Minimal rows of bits (what ASan checks) and the engine's kBlockQ / 8.
      for (const index_t bytes_per_key : {(rows_p + 7) / 8, bq / 8}) {
        std::vector<std::uint8_t> bits(static_cast<std::size_t>(cols * bytes_per_key));  // exact size
        for (auto& b : bits) b = static_cast<std::uint8_t>(byte(rng));
        const std::vector<float> x = uniform(rng, bkv * bq, -10.0f, 10.0f);
        Buffer in(bkv * bq), want(bkv * bq);
        std::copy(x.begin(), x.end(), in.data());
        std::copy(x.begin(), x.end(), want.data());
        scalar_chunks(want.data(), bq, cols, rows_p, [&](float* st, index_t r0, index_t nr) {
          ScalarKernel::apply_column_bits(st, cols, nr, bits.data() + r0 / 8, bytes_per_key);
        });

        for_each_target(ran, [&](const FlashKernelEntry& kernel) {
          REQUIRE(kernel.block_q == bq);
          REQUIRE(kernel.block_kv == bkv);
          INFO("rows_p = " << rows_p << ", cols = " << cols << ", bytes_per_key = " << bytes_per_key);
          Buffer st(bkv * bq);
          std::copy_n(in.data(), bkv * bq, st.data());
          kernel.apply_column_bits(st.data(), cols, rows_p, bits.data(), bytes_per_key);
          Report rep;
          for (index_t j = 0; j < bkv; ++j) {
            for (index_t r = 0; r < bq; ++r) rep.expect_bits(st[j * bq + r], want[j * bq + r], at("St", j, r));
          }
          check_report(rep);
        });
      }
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel online_softmax matches ScalarKernel over several tiles on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(505);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit;
  const index_t bq = any_kernel().block_q, bkv = any_kernel().block_kv;
  // Tiles of one row block: full and partial tiles; the offsets make the
  // running max rise, stay and fall, and exp() reach denormals.
  const index_t tile_cols[] = {64, 5, 64, 1, 63, 64};
  const float tile_shift[] = {-3.0f, 6.0f, 2.0f, 40.0f, -60.0f, 45.0f};
  const index_t n_tiles = 6;
  std::int64_t held = 0;  // rows checked where the running max held
  for (const index_t rows : kRowCounts) {
    // Row kinds: only -inf in every tile; only -inf until tile 2; one tile
    // of only -inf after finite ones; random -inf elsewhere.
    auto score = [&](index_t t, index_t r) -> float {
      if (r % 7 == 2) return -kInf;
      if (r % 5 == 1 && t < 2) return -kInf;
      if (r % 6 == 4 && t == 2) return -kInf;
      if (unit(rng) < 0.15f) return -kInf;
      return tile_shift[t] + 4.0f * normal(rng) + 0.05f * static_cast<float>(r);
    };
    std::vector<std::vector<float>> input(n_tiles);  // input[t][j * rows + r]
    for (index_t t = 0; t < n_tiles; ++t) {
      auto& s = input[static_cast<std::size_t>(t)];
      s.resize(static_cast<std::size_t>(tile_cols[t] * rows));
      for (index_t j = 0; j < tile_cols[t]; ++j) {
        for (index_t r = 0; r < rows; ++r) s[static_cast<std::size_t>(j * rows + r)] = score(t, r);
      }
    }
    // Reference states after each tile.
    std::vector<std::vector<float>> want_p(n_tiles), want_m(n_tiles), want_l(n_tiles), want_alpha(n_tiles);
    {
      std::vector<float> m(static_cast<std::size_t>(rows), -kInf), l(static_cast<std::size_t>(rows), 0.0f),
          alpha(static_cast<std::size_t>(rows));
      for (index_t t = 0; t < n_tiles; ++t) {
        auto& p = want_p[static_cast<std::size_t>(t)];
        p = input[static_cast<std::size_t>(t)];
        scalar_chunks(p.data(), rows, tile_cols[t], rows, [&](float* st, index_t r0, index_t nr) {
          ScalarKernel::online_softmax(st, tile_cols[t], nr, m.data() + r0, l.data() + r0, alpha.data() + r0);
        });
        want_m[static_cast<std::size_t>(t)] = m;
        want_l[static_cast<std::size_t>(t)] = l;
        want_alpha[static_cast<std::size_t>(t)] = alpha;
      }
    }

    // Both online softmaxes (for_each_target_and_softmax); the row sums
    // within 1e-5 for both.
    for_each_target_and_softmax(ran, [&](const FlashKernelEntry& kernel, const SoftmaxFn softmax, const auto& p_tol) {
      REQUIRE(kernel.block_q == bq);
      REQUIRE(kernel.block_kv == bkv);
      const index_t rows_p = kernel.padded_rows(rows);
      // State as the engine keeps it: kBlockQ rows; rows_p are live here.
      Buffer m(bq, kSentinel), l(bq, kSentinel), alpha(bq, kSentinel);
      std::fill_n(m.data(), rows_p, -kInf);
      std::fill_n(l.data(), rows_p, 0.0f);
      for (index_t t = 0; t < n_tiles; ++t) {
        const index_t cols = tile_cols[t];
        INFO("rows = " << rows << " (rows_p = " << rows_p << "), tile " << t << " of " << n_tiles
                       << ", cols = " << cols);
        Buffer st(bkv * bq, kSentinel);
        for (index_t j = 0; j < cols; ++j) {
          for (index_t r = 0; r < rows_p; ++r) {  // padding queries score 0
            st[j * bq + r] =
                r < rows ? input[static_cast<std::size_t>(t)][static_cast<std::size_t>(j * rows + r)] : 0.0f;
          }
        }
        const bool tiny = softmax(st.data(), cols, rows_p, m.data(), l.data(), alpha.data());
        bool any_tiny = false;  // the answer, from the weights it wrote
        for (index_t j = 0; j < cols; ++j) {
          for (index_t r = 0; r < rows_p; ++r) any_tiny |= !(st[j * bq + r] >= std::numeric_limits<float>::min());
        }
        CHECK(tiny == any_tiny);
        const auto& wp = want_p[static_cast<std::size_t>(t)];
        const auto& wm = want_m[static_cast<std::size_t>(t)];
        const auto& wl = want_l[static_cast<std::size_t>(t)];
        const auto& wa = want_alpha[static_cast<std::size_t>(t)];
        Report rp, rm, rl, ra;
        for (index_t j = 0; j < bkv; ++j) {
          for (index_t r = 0; r < bq; ++r) {
            if (j < cols && r < rows) {
              const float w = wp[static_cast<std::size_t>(j * rows + r)];
              rp.expect_near(st[j * bq + r], w, p_tol(w), at("P", j, r));
            } else if (j >= cols || r >= rows_p) {
              rp.expect_bits(st[j * bq + r], kSentinel, at("St (outside cols x rows_p)", j, r));
            }
          }
        }
        for (index_t r = 0; r < bq; ++r) {
          if (r < rows) {
            const auto i = static_cast<std::size_t>(r);
            rm.expect_bits(m[r], wm[i], at("m", r));  // a max: exact
            rl.expect_near(l[r], wl[i], 1e-5 * wl[i] + 1e-37, at("l", r));
            ra.expect_near(alpha[r], wa[i], 1e-6 * wa[i] + 1e-37, at("alpha", r));
            // Where the max held, exactly 1: the AMX tiles skip rescaling such rows of O.
            if (t > 0 && std::isfinite(wm[i]) && wm[i] == want_m[static_cast<std::size_t>(t - 1)][i]) {
              ra.expect_bits(alpha[r], 1.0f, at("alpha (the max held)", r));
              ++held;
            }
          } else if (r >= rows_p) {
            rm.expect_bits(m[r], kSentinel, at("m (past rows_p)", r));
            rl.expect_bits(l[r], kSentinel, at("l (past rows_p)", r));
            ra.expect_bits(alpha[r], kSentinel, at("alpha (past rows_p)", r));
          }
        }
        check_report(rp);
        check_report(rm);
        check_report(rl);
        check_report(ra);
      }
    });
  }
  CHECK(held > 0);
  require_every_target_ran(ran);
}

// Tiles whose answer is known: scores within a few units of each other (no
// weight below the smallest normal float), and one score that makes a weight
// zero or denormal: masked (-inf), underflowing (200 below the row's max),
// denormal (95 below), a NaN score (a weight of 0 or NaN). The engine
// skips P.V's zero-weight guard on the answer false, so a wrong false would
// let a hidden non-finite V value into O.
TEST_CASE("online_softmax reports tiny weights on every Highway target and ScalarKernel", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(515);
  std::uniform_real_distribution<float> spread(-3.0f, 3.0f);
  const index_t bq = any_kernel().block_q, bkv = any_kernel().block_kv;
  struct Case {
    const char* name;
    float odd_score;  // at (key, row) = (cols - 1, rows - 1), relative to the others
    bool tiny;
  };
  const Case cases[] = {{"no tiny weight", 0.0f, false},
                        {"a masked score", -kInf, true},
                        {"an underflowing score", -200.0f, true},
                        {"a denormal weight", -95.0f, true},
                        {"a NaN score", std::numeric_limits<float>::quiet_NaN(), true}};
  for (const index_t rows : {1, 8, 13, 16, 40, 128}) {
    for (const index_t cols : {1, 2, 37, 64}) {
      if (rows > bq || cols > bkv) continue;
      for (const Case& c : cases) {
        INFO(c.name << ", rows = " << rows << ", cols = " << cols);
        std::vector<float> input(static_cast<std::size_t>(bkv * bq), 0.0f);  // padding rows score 0, as the engine's
        for (index_t j = 0; j < cols; ++j) {
          for (index_t r = 0; r < rows; ++r) input[static_cast<std::size_t>(j * bq + r)] = spread(rng);
        }
        float& odd = input[static_cast<std::size_t>((cols - 1) * bq + rows - 1)];
        odd = std::isnan(c.odd_score) || std::isinf(c.odd_score) ? c.odd_score : odd + c.odd_score;
        // A lone score has no other to fall behind: it is its row's max.
        const bool tiny = c.tiny && !(cols == 1 && std::isfinite(c.odd_score));
        {
          INFO("ScalarKernel");
          std::vector<float> st = input, m(static_cast<std::size_t>(bq), -kInf), l(static_cast<std::size_t>(bq), 0.0f),
                             alpha(static_cast<std::size_t>(bq));
          bool scalar_tiny = false;
          scalar_chunks(st.data(), bq, cols, rows, [&](float* chunk, index_t r0, index_t nr) {
            scalar_tiny |=
                ScalarKernel::online_softmax(chunk, cols, nr, m.data() + r0, l.data() + r0, alpha.data() + r0);
          });
          CHECK(scalar_tiny == tiny);
        }
        for_each_target_and_softmax(ran, [&](const FlashKernelEntry& kernel, const SoftmaxFn softmax, const auto&) {
          const index_t rows_p = kernel.padded_rows(rows);
          Buffer st(bkv * bq, kSentinel), m(bq, -kInf), l(bq, 0.0f), alpha(bq, kSentinel);
          std::copy(input.begin(), input.end(), st.data());
          CHECK(softmax(st.data(), cols, rows_p, m.data(), l.data(), alpha.data()) == tiny);
        });
      }
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("FlashKernel accumulate_pv matches ScalarKernel on every Highway target", "[kernels]") {
  std::int64_t ran = 0;
  std::mt19937 rng(606);
  const index_t bq = any_kernel().block_q;
  // 1, 12, 48 and 96 reach the 1-, 2- and 3-vector P.V blocks that the
  // common head dims leave out on some targets (AVX3: 48 is 3 vectors, 96 is
  // 4 + 2; SSE4: 12 is 2 + 1).
  for (const index_t dv : {1, 8, 12, 48, 64, 72, 80, 96, 128, 256}) {
    for (index_t rows = 1; rows <= bq; ++rows) {
      const index_t cols = std::array<index_t, 4>{1, 5, 63, 64}[static_cast<std::size_t>(rows % 4)];
      // v_stride - dvp: the engine passes dvp (its own copy of V) or the
      // tensor's token stride.
      const index_t extra = std::array<index_t, 4>{1, 0, 3, 16}[static_cast<std::size_t>((rows / 4) % 4)];
      // Probabilities, some exactly 0; alpha with exact 0 (first finite
      // tile) and 1 (max unchanged).
      std::vector<float> p = uniform(rng, cols * bq, 0.0f, 1.0f);  // p[j * bq + r]
      for (index_t i = 0; i < cols * bq; i += 11) p[static_cast<std::size_t>(i)] = 0.0f;
      const std::vector<float> v = uniform(rng, cols * dv, -1.0f, 1.0f);  // v[j][e]
      std::vector<float> alpha = uniform(rng, rows, 0.0f, 1.0f);
      for (index_t r = 0; r < rows; ++r) {
        if (r % 9 == 0) alpha[static_cast<std::size_t>(r)] = 0.0f;
        if (r % 9 == 1) alpha[static_cast<std::size_t>(r)] = 1.0f;
      }
      const std::vector<float> o0 = uniform(rng, rows * dv, -2.0f, 2.0f);  // o0[r][e]

      // Reference: ScalarKernel with its own padding (dvp = dv), want[r][e].
      std::vector<float> want = o0, mag(static_cast<std::size_t>(rows * dv));
      {
        std::vector<float> pt = p;
        scalar_chunks(pt.data(), bq, cols, rows, [&](float* ps, index_t r0, index_t nr) {
          ScalarKernel::accumulate_pv(ps, nr, cols, v.data(), dv, dv, alpha.data() + r0, want.data() + r0 * dv);
        });
        for (index_t r = 0; r < rows; ++r) {
          for (index_t e = 0; e < dv; ++e) {
            double s = std::abs(static_cast<double>(alpha[static_cast<std::size_t>(r)]) *
                                o0[static_cast<std::size_t>(r * dv + e)]);
            for (index_t j = 0; j < cols; ++j) {
              s += std::abs(static_cast<double>(p[static_cast<std::size_t>(j * bq + r)]) *
                            v[static_cast<std::size_t>(j * dv + e)]);
            }
            mag[static_cast<std::size_t>(r * dv + e)] = static_cast<float>(s);
          }
        }
      }

      for_each_target(ran, [&](const FlashKernelEntry& kernel) {
        REQUIRE(kernel.block_q == bq);
        const index_t dvp = kernel.padded_dim(dv), v_stride = dvp + extra;
        INFO("rows = " << rows << ", dv = " << dv << " (dvp = " << dvp << "), cols = " << cols
                       << ", v_stride = " << v_stride);
        REQUIRE(dvp >= dv);
        REQUIRE(dvp % kernel.lanes == 0);
        // V rows padded to dvp with zeros (as the engine does); exact size.
        Buffer vb((cols - 1) * v_stride + dvp, kPoison);
        for (index_t j = 0; j < cols; ++j) {
          for (index_t e = 0; e < dvp; ++e)
            vb[j * v_stride + e] = e < dv ? v[static_cast<std::size_t>(j * dv + e)] : 0.0f;
        }
        Buffer pt(cols * bq, kPoison);  // rows past `rows` are not read
        for (index_t j = 0; j < cols; ++j) {
          std::copy_n(p.data() + j * bq, rows, pt.data() + j * bq);
        }
        Buffer ab(rows);
        std::copy(alpha.begin(), alpha.end(), ab.data());
        // A chain of two lists, the first empty: the stream skips it.
        const AheadRows rows_ahead(vb.data(), cols, v_stride, dvp);
        const seqattn::RowsAhead ahead{nullptr, 0, 0, &rows_ahead.hint};
        // Both forms: with V finite, the unguarded one's zero weights add 0.
        for (const bool guarded : {true, false}) {
          INFO((guarded ? "accumulate_pv" : "accumulate_pv_unguarded"));
          Buffer o(rows * dvp);  // padding columns start at 0, as in the engine
          for (index_t r = 0; r < rows; ++r) std::copy_n(o0.data() + r * dv, dv, o.data() + r * dvp);
          (guarded ? kernel.accumulate_pv : kernel.accumulate_pv_unguarded)(pt.data(), rows, cols, vb.data(), v_stride,
                                                                            dvp, ab.data(), o.data(), ahead);
          Report rep;
          for (index_t r = 0; r < rows; ++r) {
            for (index_t e = 0; e < dvp; ++e) {
              if (e < dv) {
                const auto i = static_cast<std::size_t>(r * dv + e);
                rep.expect_near(o[r * dvp + e], want[i], 1e-5 * mag[i] + 1e-37, at("O", r, e));
              } else {  // alpha * 0 + P * 0
                rep.expect_bits(o[r * dvp + e], 0.0f, at("O (padding column)", r, e));
              }
            }
          }
          check_report(rep);
        }
      });
    }
  }
  require_every_target_ran(ran);
}

// ---- the whole engine per target ------------------------------------------------

namespace seqattn::kernel_tests {
namespace {

template <class T>
Tensor<T> random_values(const Extents& shape, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor<T> t(shape);
  for (auto& x : t.values()) x = from_float<T>(dist(rng));
  return t;
}

// The CpuTiled engine with each target's kernel against the Scalar backend
// on one BSHD problem: fp32 relative error <= 1e-5, bf16 NMSE <= 5e-4.
template <class T, class M>
void check_engine(std::int64_t& ran, const M& mask, index_t batch, index_t sq, index_t skv, index_t heads,
                  index_t kv_heads, index_t d, const AttentionOptions& options, int workers, std::mt19937& rng) {
  CAPTURE(batch, sq, skv, heads, kv_heads, d, workers, options.softcap, options.kv_splits);
  const auto q = random_values<T>(detail::make_extents({batch, sq, heads, d}), rng);
  const auto k = random_values<T>(detail::make_extents({batch, skv, kv_heads, d}), rng);
  const auto v = random_values<T>(detail::make_extents({batch, skv, kv_heads, d}), rng);
  const AttentionInputs<T> in{q.view(), k.view(), v.view()};
  const Extents out_shape = detail::make_extents({batch, sq, heads, d});
  const Extents lse_shape = detail::make_extents({batch, heads, sq});
  Tensor<T> want(out_shape);
  Tensor<float> want_lse(lse_shape);
  attention_forward<backends::Scalar>(in, mask, want.view(), want_lse.view(), options);
  const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(batch, sq, skv), heads,
                                        {any_kernel().block_q, any_kernel().block_kv});
  for_each_target(ran, [&](const FlashKernelEntry& kernel) {
    Tensor<T> out(out_shape, from_float<T>(7.0f));
    Tensor<float> lse(lse_shape, 7.0f);
    if constexpr (std::is_same_v<T, float>) {
      kernel.forward_f32(in, bm, out.view(), lse.view(), options, workers);
    } else {
      kernel.forward_bf16(in, bm, out.view(), lse.view(), options, workers);
    }
    double max_diff = 0, max_ref = 0, sq_diff = 0, sq_ref = 0, lse_diff = 0;
    for (index_t i = 0; i < out.size(); ++i) {
      const double g = to_float(out.data()[i]), w = to_float(want.data()[i]);
      max_diff = std::max(max_diff, std::abs(g - w));
      max_ref = std::max(max_ref, std::abs(w));
      sq_diff += (g - w) * (g - w);
      sq_ref += w * w;
    }
    for (index_t i = 0; i < lse.size(); ++i) {
      const float g = lse.data()[i], w = want_lse.data()[i];
      lse_diff = std::max<double>(lse_diff, std::isinf(w) ? (g == w ? 0.0 : kInf) : std::abs(g - w));
    }
    if constexpr (std::is_same_v<T, float>) {
      CHECK(max_diff <= 1e-5 * std::max(1.0, max_ref));
      CHECK(lse_diff <= 1e-5 * 20);
    } else {
      CHECK(sq_diff <= 5e-4 * sq_ref);
      CHECK(lse_diff <= 1e-2 * 20);
    }
  });
}

}  // namespace
}  // namespace seqattn::kernel_tests

TEST_CASE("the tiled engine on every Highway target matches the Scalar backend", "[kernels][engine]") {
  using namespace seqattn;
  using kernel_tests::check_engine;
  std::mt19937 rng(301);
  std::int64_t ran = 0;
  AttentionOptions plain;
  // Prefill: tails that are not whole tiles or vectors, GQA, head dims 72/80/128.
  check_engine<float>(ran, CausalMask{Alignment::bottom_right}, 2, 150, 170, 6, 2, 72, plain, 2, rng);
  check_engine<float>(ran, SlidingWindowMask{30, 5}, 1, 140, 140, 4, 4, 80, plain, 1, rng);
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  AttentionOptions capped;
  capped.softcap = 4.0f;
  capped.sinks = sinks;
  check_engine<float>(ran, FullMask{}, 1, 37, 90, 4, 1, 128, capped, 2, rng);
  // Partial tiles without bits, through the carried predicate.
  check_engine<float>(ran, CausalMask{} & ~SlidingWindowMask{3, 0}, 1, 90, 100, 2, 2, 64, plain, 1, rng);
  // Decode: GQA rows stacked (8 and 16 per K/V head), KV split across workers.
  check_engine<float>(ran, CausalMask{Alignment::bottom_right}, 1, 1, 900, 8, 1, 128, plain, 2, rng);
  check_engine<float>(ran, FullMask{}, 2, 2, 500, 16, 2, 64, plain, 3, rng);
  AttentionOptions split;
  split.kv_splits = 5;
  check_engine<float>(ran, CausalMask{Alignment::bottom_right}, 1, 3, 700, 4, 4, 96, split, 1, rng);
  // bf16 storage.
  check_engine<bfloat16>(ran, CausalMask{}, 1, 130, 130, 4, 2, 128, plain, 2, rng);
  check_engine<bfloat16>(ran, FullMask{}, 1, 1, 600, 8, 1, 80, plain, 2, rng);
  kernel_tests::require_every_target_ran(ran);
}

TEST_CASE("FlashKernel softmax_backward matches its formula on every Highway target", "[kernels][backward]") {
  using namespace seqattn;
  using namespace seqattn::kernel_tests;
  std::int64_t ran = 0;
  std::mt19937 rng(311);
  const index_t bq = any_kernel().block_q;
  std::uniform_real_distribution<float> score(-20.0f, 5.0f), stat(-2.0f, 10.0f), grad(-3.0f, 3.0f);
  for (const index_t rows : {1, 3, 9, 33, 64, 100, 128}) {
    for (const index_t cols : {1, 5, 64, 128}) {
      std::vector<float> s0(static_cast<std::size_t>(bq * bq)), dp0(s0.size()), lse(static_cast<std::size_t>(bq)),
          delta(lse.size());
      for (std::size_t i = 0; i < s0.size(); ++i) {
        s0[i] = i % 11 == 3 ? -kInf : score(rng);  // masked scores
        dp0[i] = grad(rng);
      }
      for (std::size_t i = 0; i < lse.size(); ++i) {
        lse[i] = i % 7 == 2 ? kInf : stat(rng);  // rows that saw nothing
        delta[i] = grad(rng);
      }
      for_each_target(ran, [&](const FlashKernelEntry& kernel) {
        const index_t rows_p = kernel.padded_rows(rows);
        for (const bool by_lane : {true, false}) {
          INFO("rows_p = " << rows_p << ", cols = " << cols << (by_lane ? ", per lane" : ", per column"));
          Buffer s(bq * bq), dp(bq * bq);
          std::copy(s0.begin(), s0.end(), s.data());
          std::copy(dp0.begin(), dp0.end(), dp.data());
          (by_lane ? kernel.softmax_backward_lanes : kernel.softmax_backward_columns)(s.data(), dp.data(), cols, rows_p,
                                                                                      lse.data(), delta.data());
          Report rep;
          for (index_t j = 0; j < cols; ++j) {
            for (index_t r = 0; r < rows_p; ++r) {
              const auto i = static_cast<std::size_t>(j * bq + r);
              const auto k = static_cast<std::size_t>(by_lane ? r : j);
              const double p = std::exp(double{s0[i]} - lse[k]);
              const double ds = p * (double{dp0[i]} - delta[k]);
              rep.expect_near(s[static_cast<index_t>(i)], static_cast<float>(p), 2e-6 * p + 1e-37, at("P", j, r));
              rep.expect_near(dp[static_cast<index_t>(i)], static_cast<float>(ds), 1e-5 * (p * 6.0) + 1e-37,
                              at("dS", j, r));
            }
          }
          check_report(rep);
        }
      });
    }
  }
  require_every_target_ran(ran);
}

TEST_CASE("the backward pass on every Highway target matches the Scalar backend", "[kernels][engine][backward]") {
  using namespace seqattn;
  using namespace seqattn::kernel_tests;
  std::mt19937 rng(313);
  std::int64_t ran = 0;
  struct Case {
    index_t sq, skv, heads, kv_heads, d;
    int workers;
  };
  for (const Case c : {Case{150, 170, 4, 2, 64, 2}, Case{70, 90, 2, 1, 80, 1}, Case{3, 300, 8, 1, 128, 2}}) {
    CAPTURE(c.sq, c.skv, c.heads, c.kv_heads, c.d);
    const auto q = random_values<float>(detail::make_extents({1, c.sq, c.heads, c.d}), rng);
    const auto k = random_values<float>(detail::make_extents({1, c.skv, c.kv_heads, c.d}), rng);
    const auto v = random_values<float>(detail::make_extents({1, c.skv, c.kv_heads, c.d}), rng);
    const auto dout = random_values<float>(q.shape(), rng);
    const AttentionInputs<float> in{q.view(), k.view(), v.view()};
    const auto mask = CausalMask{Alignment::bottom_right} & ~SlidingWindowMask{5, 0, Alignment::bottom_right};
    PlanOptions options;
    options.backward = true;
    const auto plan = plan_attention<backends::Scalar>(shape_of(in), mask, options);
    Tensor<float> out(q.shape()), lse(detail::make_extents({1, c.heads, c.sq}));
    attention_forward(plan, in, out.view(), lse.view());
    Tensor<float> want_dq(q.shape()), want_dk(k.shape()), want_dv(v.shape());
    attention_backward(plan, in, out.view(), lse.view(), dout.view(), want_dq.view(), want_dk.view(), want_dv.view());
    const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(1, c.sq, c.skv), c.heads,
                                          {any_kernel().block_q, any_kernel().block_kv});
    for_each_target(ran, [&](const FlashKernelEntry& kernel) {
      Tensor<float> dq(q.shape(), 7.0f), dk(k.shape(), 7.0f), dv(v.shape(), 7.0f);
      kernel.backward_f32(in, bm, dout.view(), dq.view(), dk.view(), dv.view(), c.workers);
      for (const auto& [got, want] : {std::pair{&dq, &want_dq}, {&dk, &want_dk}, {&dv, &want_dv}}) {
        double max_diff = 0, max_ref = 0;
        for (index_t i = 0; i < got->size(); ++i) {
          max_diff = std::max<double>(max_diff, std::abs(got->data()[i] - want->data()[i]));
          max_ref = std::max<double>(max_ref, std::abs(want->data()[i]));
        }
        CHECK(max_diff <= 2e-4 * std::max(1.0, max_ref));
      }
    });
  }
  require_every_target_ran(ran);
}

namespace seqattn::kernel_tests {
namespace {

// bf16 decode on one target with the bf16 path `path` forced, element by
// element against the Scalar backend in fp32 on the same (exactly widened)
// inputs: |o - ref| <= u |ref| + u max|V| + 1e-5 max|V| (u = 2^-8: the bf16
// output and, on the pair-dot and AMX paths, P rounded to bf16; see
// tests/attention/bf16_dot_test.cpp). Where the window hides key `hidden`,
// its V row is +inf / NaN and its K row NaN: they must change nothing.
template <class M>
void check_bf16_decode_elements(std::int64_t& ran, Bf16DotPath path, const M& mask, index_t batch, index_t sq,
                                index_t skv, index_t heads, index_t kv_heads, index_t d, index_t hidden,
                                std::mt19937& rng) {
  CAPTURE(static_cast<int>(path), batch, sq, skv, heads, kv_heads, d, hidden);
  const auto q = random_values<bfloat16>(detail::make_extents({batch, sq, heads, d}), rng);
  auto k = random_values<bfloat16>(detail::make_extents({batch, skv, kv_heads, d}), rng);
  auto v = random_values<bfloat16>(detail::make_extents({batch, skv, kv_heads, d}), rng);
  if (hidden >= 0) {
    for (index_t b = 0; b < batch; ++b) {
      for (index_t h = 0; h < kv_heads; ++h) {
        for (index_t e = 0; e < d; ++e) {
          k(b, hidden, h, e) = bfloat16(std::numeric_limits<float>::quiet_NaN());
          v(b, hidden, h, e) = bfloat16(e % 2 ? std::numeric_limits<float>::quiet_NaN() : kInf);
        }
      }
    }
  }
  auto widen = [](const Tensor<bfloat16>& t) {
    Tensor<float> f(t.shape());
    for (index_t i = 0; i < t.size(); ++i) f.data()[i] = to_float(t.data()[i]);
    return f;
  };
  const Tensor<float> qf = widen(q), kf = widen(k), vf = widen(v);
  double vmax = 0;
  for (index_t i = 0; i < vf.size(); ++i) {
    if (std::isfinite(vf.data()[i])) vmax = std::max(vmax, std::abs(static_cast<double>(vf.data()[i])));
  }
  const Extents out_shape = detail::make_extents({batch, sq, heads, d});
  const Extents lse_shape = detail::make_extents({batch, heads, sq});
  Tensor<float> want(out_shape), want_lse(lse_shape);
  attention_forward<backends::Scalar>(AttentionInputs<float>{qf.view(), kf.view(), vf.view()}, mask, want.view(),
                                      want_lse.view());
  const AttentionInputs<bfloat16> in{q.view(), k.view(), v.view()};
  const BlockMask bm = build_block_mask(mask, RaggedLengths::uniform(batch, sq, skv), heads,
                                        {any_kernel().block_q, any_kernel().block_kv});
  const Bf16DotPath saved = bf16_dot_path();
  set_bf16_dot_path(path);
  for_each_target(ran, [&](const FlashKernelEntry& kernel) {
    Tensor<bfloat16> out(out_shape, bfloat16(7.0f));
    Tensor<float> lse(lse_shape, 7.0f);
    kernel.forward_bf16(in, bm, out.view(), lse.view(), AttentionOptions{}, 2);
    Report rep;
    for (index_t i = 0; i < out.size(); ++i) {
      const float w = want.data()[i];
      rep.expect_near(to_float(out.data()[i]), w, 1.0 / 256 * (std::abs(w) + vmax) + 1e-5 * vmax, at("out", i));
    }
    for (index_t i = 0; i < lse.size(); ++i) {
      rep.expect_near(lse.data()[i], want_lse.data()[i], 1e-4 * std::max(1.0f, std::abs(want_lse.data()[i])),
                      at("lse", i));
    }
    check_report(rep);
  });
  set_bf16_dot_path(saved);
}

}  // namespace
}  // namespace seqattn::kernel_tests

TEST_CASE("bf16 decode on every Highway target and bf16 path matches the Scalar backend element by element",
          "[kernels][engine][bf16_dot][decode]") {
  // Pair dot forced (AVX3: the 8-row decode blocks; other targets: their
  // full-vector blocks, emulated), AMX forced (the automatic choice where the
  // CPU has none, or for dims AMX does not take), widening.
  using namespace seqattn;
  using kernel_tests::check_bf16_decode_elements;
  std::mt19937 rng(341);
  std::int64_t ran = 0;
  const std::uint64_t before = bf16_native_tasks();
  for (const Bf16DotPath path : {Bf16DotPath::native, Bf16DotPath::amx, Bf16DotPath::widen}) {
    // GQA 32/4 (four 8-row groups in one task), 8/1 over 4 queries, 16/2 over 2, MHA.
    check_bf16_decode_elements(ran, path, CausalMask{Alignment::bottom_right}, 1, 1, 300, 32, 4, 128, -1, rng);
    check_bf16_decode_elements(ran, path, FullMask{}, 2, 4, 131, 8, 1, 72, -1, rng);
    check_bf16_decode_elements(ran, path, CausalMask{Alignment::bottom_right}, 1, 2, 77, 16, 2, 80, -1, rng);
    check_bf16_decode_elements(ran, path, FullMask{}, 1, 3, 65, 4, 4, 33, -1, rng);
    check_bf16_decode_elements(ran, path, FullMask{}, 1, 1, 200, 8, 1, 256, -1, rng);
    // Keys 150..199 visible to the one query: key 140 (in the partial tile
    // 128..191) holds NaN K and inf / NaN V.
    check_bf16_decode_elements(ran, path, SlidingWindowMask{49, 0, Alignment::bottom_right}, 1, 1, 200, 32, 4, 128, 140,
                               rng);
    check_bf16_decode_elements(ran, path, SlidingWindowMask{49, 0, Alignment::bottom_right}, 1, 1, 200, 8, 1, 72, 140,
                               rng);
  }
  CHECK(bf16_native_tasks() > before);
  kernel_tests::require_every_target_ran(ran);
}

TEST_CASE("the bf16 pair-dot path on every Highway target matches the Scalar backend", "[kernels][engine][bf16_dot]") {
  // The path is forced on (backends/highway_bf16-inl.h): targets without
  // AVX512_BF16 run its emulated pair dot, so its packing, odd tails and P
  // rounding run on every target. tests/attention/bf16_dot_test.cpp holds the
  // element-wise bounds; here, the engine-level NMSE of check_engine.
  using namespace seqattn;
  using kernel_tests::check_engine;
  struct Restore {
    Bf16DotPath saved = bf16_dot_path();
    ~Restore() { set_bf16_dot_path(saved); }
  } restore;
  set_bf16_dot_path(Bf16DotPath::native);
  std::mt19937 rng(331);
  std::int64_t ran = 0;
  const std::uint64_t before = bf16_native_tasks();
  AttentionOptions plain;
  check_engine<bfloat16>(ran, CausalMask{}, 1, 130, 130, 4, 2, 128, plain, 2, rng);
  check_engine<bfloat16>(ran, CausalMask{Alignment::bottom_right}, 2, 150, 170, 6, 2, 33, plain, 2, rng);
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  AttentionOptions capped;
  capped.softcap = 4.0f;
  capped.sinks = sinks;
  check_engine<bfloat16>(ran, SlidingWindowMask{40, 0}, 1, 90, 90, 4, 1, 72, capped, 2, rng);
  CHECK(bf16_native_tasks() > before);
  kernel_tests::require_every_target_ran(ran);
}

// ---- the NaN policy on every target (attention/softmax_state.hpp) -------------------

namespace seqattn::kernel_tests {
namespace {

// NaN exactly where want is NaN, infinities equal, other elements within
// tol * max(1, max |want|).
template <class T>
index_t policy_mismatches(const Tensor<T>& got, const Tensor<T>& want, double tol) {
  double scale = 1.0;
  for (index_t i = 0; i < want.size(); ++i) {
    const double w = to_float(want.data()[i]);
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  }
  index_t bad = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const float g = to_float(got.data()[i]), w = to_float(want.data()[i]);
    if (std::isnan(g) || std::isnan(w)) {
      bad += !(std::isnan(g) && std::isnan(w));
    } else if (std::isinf(g) || std::isinf(w)) {
      bad += g != w;
    } else {
      bad += std::abs(static_cast<double>(g) - w) > tol * scale;
    }
  }
  return bad;
}

// Keys 45 and 100 hidden from every row, a causal window of 20 otherwise.
struct HiddenKeysMask {
  static constexpr bool head_invariant = true;
  bool allowed(const MaskContext&, index_t q, index_t kv) const {
    return kv <= q && kv >= q - 20 && kv != 45 && kv != 100;
  }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

}  // namespace
}  // namespace seqattn::kernel_tests

TEST_CASE("FlashKernel follows the NaN policy on every Highway target", "[kernels][nan]") {
  using namespace seqattn;
  using namespace seqattn::kernel_tests;
  std::int64_t ran = 0;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const index_t bq = any_kernel().block_q, bkv = any_kernel().block_kv;
  for (const index_t rows : {3, 8, 17, 64}) {
    for_each_target(ran, [&](const FlashKernelEntry& kernel) {
      INFO("rows = " << rows);
      const index_t rows_p = kernel.padded_rows(rows), cols = 20;
      // online_softmax (both: for_each_target_and_softmax): row 0 a NaN
      // score, row 1 a +inf score, row 2 only -inf, the others finite; then a
      // finite tile: the NaN rows stay NaN.
      for (const SoftmaxFn softmax : {kernel.online_softmax, kernel.online_softmax_to_bf16}) {
        Buffer m(bq), l(bq), alpha(bq), st(bkv * bq);
        std::fill_n(m.data(), bq, -kInf);
        for (int tile = 0; tile < 2; ++tile) {
          for (index_t j = 0; j < cols; ++j) {
            for (index_t r = 0; r < rows_p; ++r) st[j * bq + r] = 0.1f * static_cast<float>(j - r);
          }
          if (tile == 0) {
            st[7 * bq + 0] = nan;
            st[3 * bq + 1] = kInf;
          }
          for (index_t j = 0; j < cols; ++j) st[j * bq + 2] = -kInf;
          if (rows > 3) st[5 * bq + 3] = -kInf;  // a masked score in a finite row
          softmax(st.data(), cols, rows_p, m.data(), l.data(), alpha.data());
          INFO("tile " << tile);
          for (index_t r = 0; r < 2; ++r) {
            CHECK(std::isnan(m[r]));
            CHECK(std::isnan(l[r]));
            CHECK(std::isnan(alpha[r]));
          }
          CHECK(m[2] == -kInf);
          CHECK(l[2] == 0.0f);
          for (index_t j = 0; j < cols; ++j) CHECK(st[j * bq + 2] == 0.0f);  // weights of masked scores: exactly 0
          if (rows > 3) CHECK(st[5 * bq + 3] == 0.0f);
          for (index_t r = 3; r < rows; ++r) CHECK(std::isfinite(l[r]));
        }
      }

      // accumulate_pv: zero weights against NaN and infinite V rows leave O
      // as ScalarKernel (a select) leaves it: finite where no weight meets them.
      const index_t dv = 40, dvp = kernel.padded_dim(dv);
      Buffer pt(bkv * bq), v(cols * dvp), a(bq, 1.0f), o(rows * dvp), want(rows * dvp);
      std::vector<float> p_ref(static_cast<std::size_t>(cols * ScalarKernel::kBlockQ));
      for (index_t j = 0; j < cols; ++j) {
        for (index_t e = 0; e < dvp; ++e) v[j * dvp + e] = e < dv ? 0.01f * static_cast<float>(j + e) : 0.0f;
        for (index_t r = 0; r < rows; ++r) {
          // Key 4 is NaN and weighted only by row 0, key 9 is +inf and weighted by no row.
          const float w = (j == 4 && r != 0) || j == 9 || (j + r) % 5 == 0 ? 0.0f : 0.05f;
          pt[j * bq + r] = w;
          p_ref[static_cast<std::size_t>(j * ScalarKernel::kBlockQ + r)] = w;
        }
      }
      for (index_t e = 0; e < dvp; e += 3) v[4 * dvp + e] = nan;
      v[9 * dvp + 1] = kInf;
      ScalarKernel::accumulate_pv(p_ref.data(), rows, cols, v.data(), dvp, dvp, a.data(), want.data());
      kernel.accumulate_pv(pt.data(), rows, cols, v.data(), dvp, dvp, a.data(), o.data(), {});
      Report rep;
      for (index_t r = 0; r < rows; ++r) {
        for (index_t e = 0; e < dv; ++e) {
          if (std::isnan(want[r * dvp + e])) {
            rep.expect_bits(std::isnan(o[r * dvp + e]) ? 1.0f : 0.0f, 1.0f, at("O (NaN expected)", r, e));
          } else {
            rep.expect_near(o[r * dvp + e], want[r * dvp + e], 1e-5, at("O", r, e));
          }
        }
      }
      check_report(rep);
      for (index_t e = 1; e < dv; ++e) CHECK(std::isfinite(want[dvp + e]));  // row 1 never weights key 4

      // softmax_backward: a masked score gives P = 0 and dS = 0 whatever lse
      // (NaN) and dP (NaN: a hidden V row) hold; a visible score of a NaN row gives NaN.
      Buffer s(bq * bq), dp(bq * bq), lse(bq, nan), delta(bq, 0.5f);
      for (const bool by_lane : {true, false}) {
        INFO((by_lane ? "per lane" : "per column"));
        s[0] = -kInf;
        dp[0] = nan;
        s[1] = 0.5f;
        (by_lane ? kernel.softmax_backward_lanes : kernel.softmax_backward_columns)(s.data(), dp.data(), 1, rows_p,
                                                                                    lse.data(), delta.data());
        CHECK(s[0] == 0.0f);
        CHECK(dp[0] == 0.0f);
        CHECK(std::isnan(s[1]));
      }
    });
  }
  require_every_target_ran(ran);
}

TEST_CASE("the tiled engine on every Highway target follows the NaN policy like the reference",
          "[kernels][engine][nan]") {
  using namespace seqattn;
  using namespace seqattn::kernel_tests;
  std::int64_t ran = 0;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(2401);
  const Extents q_shape = detail::make_extents({1, 150, 2, 40}), kv_shape = detail::make_extents({1, 150, 1, 40});
  auto q = random_values<float>(q_shape, rng), k = random_values<float>(kv_shape, rng),
       v = random_values<float>(kv_shape, rng);
  const auto dout = random_values<float>(q_shape, rng);
  q(0, 70, 1, 5) = nan;  // one row NaN
  k(0, 60, 0, 3) = nan;  // the rows that see key 60 NaN
  for (index_t e = 0; e < 40; ++e) {
    k(0, 45, 0, e) = nan;  // hidden from every row: no effect
    v(0, 45, 0, e) = e % 2 ? nan : kInf;
  }
  v(0, 100, 0, 7) = -kInf;
  const HiddenKeysMask mask;
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  Tensor<float> want(q_shape), want_lse(detail::make_extents({1, 2, 150}));
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view());
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Reference>(shape_of(in), mask, options);
  Tensor<float> want_dq(q_shape), want_dk(kv_shape), want_dv(kv_shape);
  attention_backward(plan, in, want.view(), want_lse.view(), dout.view(), want_dq.view(), want_dk.view(),
                     want_dv.view());
  index_t finite_rows = 0;
  for (index_t t = 0; t < 150; ++t) finite_rows += std::isfinite(want(0, t, 0, 0));
  REQUIRE(finite_rows > 100);
  REQUIRE(std::isnan(want(0, 70, 1, 0)));

  Tensor<bfloat16> qb(q_shape), kb(kv_shape), vb(kv_shape), want_b(q_shape);
  for (index_t i = 0; i < q.size(); ++i) qb.data()[i] = bfloat16(q.data()[i]);
  for (index_t i = 0; i < k.size(); ++i) kb.data()[i] = bfloat16(k.data()[i]);
  for (index_t i = 0; i < v.size(); ++i) vb.data()[i] = bfloat16(v.data()[i]);
  const AttentionInputs<bfloat16> in_b{qb.view(), kb.view(), vb.view()};
  Tensor<float> want_lse_b(want_lse.shape());
  attention_forward<backends::Reference>(in_b, mask, want_b.view(), want_lse_b.view());

  const BlockMask bm =
      build_block_mask(mask, RaggedLengths::uniform(1, 150, 150), 2, {any_kernel().block_q, any_kernel().block_kv});
  struct Restore {
    Bf16DotPath saved = bf16_dot_path();
    ~Restore() { set_bf16_dot_path(saved); }
  } restore;
  for_each_target(ran, [&](const FlashKernelEntry& kernel) {
    Tensor<float> out(q_shape, 7.0f), lse(want_lse.shape(), 7.0f);
    kernel.forward_f32(in, bm, out.view(), lse.view(), AttentionOptions{}, 2);
    CHECK(policy_mismatches(out, want, 1e-5) == 0);
    CHECK(policy_mismatches(lse, want_lse, 1e-5) == 0);
    Tensor<float> dq(q_shape, 7.0f), dk(kv_shape, 7.0f), dv(kv_shape, 7.0f);
    kernel.backward_f32(in, bm, dout.view(), dq.view(), dk.view(), dv.view(), 2);
    CHECK(policy_mismatches(dq, want_dq, 2e-4) == 0);
    CHECK(policy_mismatches(dk, want_dk, 2e-4) == 0);
    CHECK(policy_mismatches(dv, want_dv, 2e-4) == 0);
    for (const Bf16DotPath path : {Bf16DotPath::widen, Bf16DotPath::native}) {
      INFO((path == Bf16DotPath::native ? "bf16 pair dot" : "bf16 widen"));
      set_bf16_dot_path(path);
      Tensor<bfloat16> out_b(q_shape, bfloat16(7.0f));
      kernel.forward_bf16(in_b, bm, out_b.view(), lse.view(), AttentionOptions{}, 2);
      CHECK(policy_mismatches(out_b, want_b, 4e-2) == 0);
      CHECK(policy_mismatches(lse, want_lse_b, 1e-2) == 0);
    }
  });
  require_every_target_ran(ran);
}

#endif  // HWY_ONCE
