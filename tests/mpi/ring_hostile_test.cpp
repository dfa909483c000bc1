// Ring attention under hostile input (issue 21: findings 22, 24/33, 30, 35,
// 37): every rank must throw the same error instead of hanging, writing into
// freed buffers or computing a silently wrong result.
//
// Only non-aborting CHECKs follow a collective: a rank that stopped early
// would leave the others waiting in the next collective.
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <mpi.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/cp.hpp"
#include "seqattn/masks.hpp"

#include "mpi_test_support.hpp"
#include "support/catch.hpp"
#include "support/engine_instances.hpp"  // the common engine configurations, compiled once

namespace {

using namespace seqattn;
using cp::Algorithm;
using cp::Sharding;
using cp::ShardLayout;

using testing::random_tensor;
using testing::world_rank;
using testing::world_size;

// What `fn` threw on this rank ("" when it did not throw), and whether the
// exception was a seqattn::invalid_argument.
struct Outcome {
  std::string message;
  bool invalid_argument = false;
};

Outcome outcome_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const seqattn::invalid_argument& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what(), false};
  }
  return {};
}

// True when every rank holds the same text.
bool same_on_every_rank(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// Every rank threw the same seqattn::invalid_argument containing `needle`.
void check_same_invalid_argument(const Outcome& o, const std::string& needle) {
  INFO("rank " << world_rank() << " of " << world_size() << " threw: '" << o.message << "'");
  CHECK(o.invalid_argument);
  CHECK_THAT(o.message, ContainsSubstring(needle));
  CHECK(same_on_every_rank(o.message));
}

// Serial, except that its `fail_at`-th parallel_for (counting from 0) throws
// before running anything: user code failing in the middle of the ring.
struct ThrowingExec {
  int fail_at = -1;
  int calls = 0;
  int workers() const { return 1; }
  template <class F>
  void parallel_for(index_t n, F&& f) {
    if (calls++ == fail_at) throw std::runtime_error("ThrowingExec: injected failure");
    for (index_t i = 0; i < n; ++i) f(i, 0);
  }
};

template <class T>
Tensor<T> filled(const Extents& shape, float seed) {
  Tensor<T> t(shape);
  index_t i = 0;
  for (auto& x : t.values()) x = from_float<T>(std::sin(seed + 0.37f * static_cast<float>(i++)));
  return t;
}

}  // namespace

TEST_CASE("ring hostile: invalid scale, softcap and sinks are rejected on every rank before the ring", "[mpi]") {
  const int P = world_size();
  const ShardLayout layout = ShardLayout::bshd(1, 64, P, Sharding::contiguous);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> nan_sinks = {0.5f, nan}, inf_sinks = {inf, 0.0f};
  struct Case {
    const char* name;
    cp::RingOptions options;
    const char* needle;
  };
  std::vector<Case> cases;
  for (Algorithm algo : {Algorithm::ring, Algorithm::all_gather}) {
    cp::RingOptions o;
    o.algorithm = algo;
    cases.push_back({"negative softcap", o, "softcap must be finite and >= 0"});
    cases.back().options.softcap = -1.0f;
    cases.push_back({"infinite softcap", o, "softcap must be finite and >= 0"});
    cases.back().options.softcap = inf;
    cases.push_back({"NaN softcap", o, "softcap must be finite and >= 0"});
    cases.back().options.softcap = nan;
    cases.push_back({"infinite scale", o, "scale must be finite"});
    cases.back().options.scale = inf;
    cases.push_back({"NaN sink", o, "sink"});
    cases.back().options.sinks = nan_sinks;
    cases.push_back({"infinite sink", o, "sink"});
    cases.back().options.sinks = inf_sinks;
  }
  for (const Case& c : cases) {
    INFO(c.name << ", " << (c.options.algorithm == Algorithm::ring ? "ring" : "all-gather"));
    // Before the fix the plan was built and the engine rejected the option in
    // the middle of the ring, with MPI_Irecv/MPI_Isend still in flight into
    // buffers that the plan's destructor then freed.
    const Outcome o = outcome_of([&] {
      cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, FullMask{}, c.options);
      const Tensor<float> q = filled<float>(plan.q_shape(), 1.0f);
      Tensor<float> out(plan.out_shape());
      plan.forward(q.view(), q.view(), q.view(), out.view(), TensorView<float>{}, execution::Serial{});
    });
    check_same_invalid_argument(o, c.needle);
    CHECK_THAT(o.message, ContainsSubstring("ring_attention plan"));
  }
  // One rank alone with a bad softcap: every rank hears of it.
  cp::RingOptions lone;
  lone.softcap = world_rank() == P - 1 ? -2.0f : 0.0f;
  const Outcome o =
      outcome_of([&] { cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, FullMask{}, lone); });
  check_same_invalid_argument(o, "softcap");
  CHECK_THAT(o.message, ContainsSubstring("rank " + std::to_string(P - 1) + " of"));
}

TEST_CASE("ring hostile: an exception from the execution policy mid-ring reaches every rank, nothing in flight",
          "[mpi]") {
  const int P = world_size();
  const int rank = world_rank();
  const ShardLayout layout = ShardLayout::bshd(2, 64 * P, P, Sharding::dual_chunk_swap);
  for (bool backward : {false, true}) {
    INFO((backward ? "backward" : "forward"));
    cp::RingOptions options;
    options.backward = true;
    // Scoped plan: before the fix its destructor freed the wire buffers that
    // the failing rank's posted receives still pointed at.
    const auto run = [&](auto&& exec, Tensor<float>& out, Tensor<float>& dq) {
      cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, FullMask{}, options);
      const Tensor<float> q = filled<float>(plan.q_shape(), 1.0f + static_cast<float>(rank));
      const Tensor<float> k = filled<float>(plan.k_shape(), 2.0f + static_cast<float>(rank));
      const Tensor<float> v = filled<float>(plan.v_shape(), 3.0f + static_cast<float>(rank));
      const Tensor<float> dout = filled<float>(plan.out_shape(), 4.0f + static_cast<float>(rank));
      Tensor<float> lse(plan.lse_shape());
      Tensor<float> dk(plan.k_shape()), dv(plan.v_shape());
      if (!backward) {
        plan.forward(q.view(), k.view(), v.view(), out.view(), lse.view(), exec);
        return;
      }
      plan.forward(q.view(), k.view(), v.view(), out.view(), lse.view(), execution::Serial{});
      plan.backward(q.view(), k.view(), v.view(), TensorView<const float>(out.view()),
                    TensorView<const float>(lse.view()), dout.view(), dq.view(), dk.view(), dv.view(), {}, exec);
    };
    Tensor<float> want_out(Extents{2, layout.local_tokens(rank), 2, 16}), want_dq(want_out.shape());
    run(execution::Serial{}, want_out, want_dq);
    // Rank 0's policy throws at its first parallel_for: step 0, with the
    // step's transfers posted. The others must not wait forever for it.
    Tensor<float> out(want_out.shape(), -7.0f), dq(want_out.shape(), -7.0f);
    ThrowingExec failing{rank == 0 ? 0 : -1};
    const Outcome o = outcome_of([&] { run(failing, out, dq); });
    INFO("rank " << rank << " threw: '" << o.message << "'");
    CHECK_THAT(o.message, ContainsSubstring("ThrowingExec: injected failure"));
    if (rank != 0) CHECK_THAT(o.message, ContainsSubstring("rank 0 of " + std::to_string(P)));
    // Nothing half-written: the outputs keep what they held.
    const Tensor<float>& untouched = backward ? dq : out;
    bool kept = true;
    for (const float x : untouched.values()) kept = kept && x == -7.0f;
    CHECK(kept);
    // A fresh plan afterwards pairs its messages with the right peers.
    Tensor<float> again_out(want_out.shape()), again_dq(want_out.shape());
    CHECK_NOTHROW(run(execution::Serial{}, again_out, again_dq));
    const Tensor<float>& got = backward ? again_dq : again_out;
    const Tensor<float>& want = backward ? want_dq : want_out;
    bool equal = true;
    for (index_t i = 0; i < got.size(); ++i) equal = equal && got.data()[i] == want.data()[i];
    CHECK(equal);
  }
}

TEST_CASE("ring hostile: a per-rank setting one rank rejects throws on every rank", "[mpi]") {
  const int P = world_size();
  const int bad = P - 1;
  const ShardLayout layout = ShardLayout::bshd(1, 64, P, Sharding::dual_chunk_swap);
  for (Algorithm algo : {Algorithm::ring, Algorithm::all_gather}) {
    INFO((algo == Algorithm::ring ? "ring" : "all-gather"));
    cp::RingOptions o;
    o.algorithm = algo;
    o.kv_splits = world_rank() == bad ? limits::kMaxKvSplits + 1 : 0;
    check_same_invalid_argument(
        outcome_of([&] { cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{}, o); }),
        "kv_splits must be at most");
    o.kv_splits = 0;
    const int workers = world_rank() == bad ? 0 : 1;
    check_same_invalid_argument(
        outcome_of([&] { cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{}, o, workers); }),
        "workers must be at least 1");
  }
  // The plan still forms afterwards: no rank was left in a collective.
  CHECK_NOTHROW(cp::RingPlan<float>(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{}));
}

TEST_CASE("ring hostile: masks that differ by their parameters only are told apart", "[mpi]") {
  const int P = world_size();
  if (P < 2) return;
  const bool odd = world_rank() == P - 1;
  const ShardLayout layout = ShardLayout::bshd(1, 1024, P, Sharding::contiguous);
  const auto plan_with = [&](const auto& mask) {
    return outcome_of([&] { cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, mask); });
  };
  check_same_invalid_argument(plan_with(SlidingWindowMask{odd ? 301 : 300, 0}), "the mask");
  check_same_invalid_argument(plan_with(SlidingWindowMask{300, odd ? 1 : 0}), "the mask");
  check_same_invalid_argument(plan_with(PrefixLMMask{odd ? 301 : 300}), "the mask");
  check_same_invalid_argument(plan_with(ChunkedCausalMask{odd ? 257 : 256}), "the mask");
  check_same_invalid_argument(plan_with(CausalMask{} & SlidingWindowMask{odd ? 301 : 300, 0}), "the mask");
  check_same_invalid_argument(plan_with(~SlidingWindowMask{odd ? 301 : 300, 0} | CausalMask{}), "the mask");
  // Equal parameters still agree.
  CHECK(plan_with(CausalMask{} & SlidingWindowMask{300, 0}).message.empty());
}

TEST_CASE("ring hostile: ShardLayout with a huge cp_size is refused before allocating", "[mpi]") {
  // Before the fix: one TokenMap per rank, INT_MAX of them, ended in
  // std::bad_alloc (an out-of-memory abort under AddressSanitizer).
  CHECK_THROWS_WITH(ShardLayout::bshd(1, 64, INT_MAX, Sharding::contiguous),
                    ContainsSubstring("cp_size") && ContainsSubstring("at most"));
  const std::vector<std::int32_t> lens = {64, 64};
  CHECK_THROWS_AS(ShardLayout::thd(lens, INT_MAX, Sharding::contiguous), seqattn::invalid_argument);
  CHECK_NOTHROW(ShardLayout::bshd(1, 64, cp::kMaxCpSize, Sharding::contiguous));
}

TEST_CASE("ring hostile: backward gradients without data or over their inputs throw on every rank", "[mpi]") {
  const int P = world_size();
  const int rank = world_rank();
  const ShardLayout layout = ShardLayout::bshd(1, 64, P, Sharding::dual_chunk_swap);
  cp::RingOptions options;
  options.backward = true;
  cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{}, options);
  const Tensor<float> q = filled<float>(plan.q_shape(), 1.0f), v = filled<float>(plan.v_shape(), 3.0f),
                      dout = filled<float>(plan.out_shape(), 4.0f);
  Tensor<float> k = filled<float>(plan.k_shape(), 2.0f);
  Tensor<float> out(plan.out_shape()), lse(plan.lse_shape());
  plan.forward(q.view(), TensorView<const float>(k.view()), v.view(), out.view(), lse.view(), execution::Serial{});
  Tensor<float> dq(plan.q_shape()), dk(plan.k_shape()), dv(plan.v_shape());
  // q, k and v have the same shape here, so one buffer can pose as another.
  Tensor<float> shared(Extents{2 * q.size()});
  const auto backward = [&](TensorView<float> gq, TensorView<float> gk, TensorView<float> gv,
                            TensorView<const float> d) {
    return outcome_of([&] {
      plan.backward(q.view(), TensorView<const float>(k.view()), v.view(), TensorView<const float>(out.view()),
                    TensorView<const float>(lse.view()), d, gq, gk, gv, {}, execution::Serial{});
    });
  };
  const bool odd = rank == P - 1;
  // No data (on one rank only): before the fix a segfault.
  const TensorView<float> no_dq(nullptr, plan.q_shape());
  check_same_invalid_argument(backward(odd ? no_dq : dq.view(), dk.view(), dv.view(), dout.view()), "dq");
  check_same_invalid_argument(
      backward(dq.view(), dk.view(), dv.view(), odd ? TensorView<const float>(nullptr, plan.out_shape()) : dout.view()),
      "dout");
  // dk written over k, which the ring still reads.
  check_same_invalid_argument(backward(dq.view(), odd ? k.view() : dk.view(), dv.view(), dout.view()), "overlap");
  // dq and dk in one buffer.
  const TensorView<float> first(shared.data(), plan.q_shape());
  const TensorView<float> second(shared.data() + q.size() / 2, plan.k_shape());
  check_same_invalid_argument(backward(first, odd ? second : dk.view(), dv.view(), dout.view()), "overlap");
  // A wrong out shape is named as backward's argument, not forward's.
  const Outcome wrong_out = outcome_of([&] {
    plan.backward(q.view(), TensorView<const float>(k.view()), v.view(),
                  TensorView<const float>(out.data(), Extents{1, out.shape()[1], 2, 8}),
                  TensorView<const float>(lse.view()), dout.view(), dq.view(), dk.view(), dv.view(), {},
                  execution::Serial{});
  });
  check_same_invalid_argument(wrong_out, "ring_attention_backward: out must have shape");
  // Distinct buffers still work.
  CHECK(backward(dq.view(), dk.view(), dv.view(), dout.view()).message.empty());
}
