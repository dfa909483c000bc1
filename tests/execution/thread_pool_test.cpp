// The execution policies under concurrency. These tests are what the TSan
// preset builds and runs (scripts/test.sh, stage tsan): they make many threads
// share one pool, reuse it across calls, throw from tasks, and run the engine's
// forward and backward passes on it, checking results against Serial.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "seqattn/seqattn.hpp"

#include "support/catch.hpp"
#include "support/engine_instances.hpp"  // the common engine configurations, compiled once

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_execution_thread_pool_test {

using namespace seqattn;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST_CASE("ThreadPool runs every task exactly once, with worker ids that never overlap") {
  for (int threads : {1, 2, 3, 5}) {
    execution::ThreadPool pool(threads);
    for (index_t n : {index_t{0}, index_t{1}, index_t{2}, index_t{7}, index_t{1000}}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::vector<std::atomic<int>> in_use(static_cast<std::size_t>(threads));
      std::atomic<bool> overlap{false};
      std::atomic<int> bad_worker{0};
      pool.parallel_for(n, [&](index_t task, int worker) {
        if (worker < 0 || worker >= threads) {
          bad_worker.fetch_add(1);
          return;
        }
        if (in_use[static_cast<std::size_t>(worker)].fetch_add(1) != 0) overlap = true;
        hits[static_cast<std::size_t>(task)].fetch_add(1);
        in_use[static_cast<std::size_t>(worker)].fetch_sub(1);
      });
      CHECK(bad_worker.load() == 0);
      CHECK_FALSE(overlap.load());
      CHECK(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; }));
    }
  }
}

TEST_CASE("ThreadPool is reusable across many calls and passes a task's exception to the caller") {
  execution::ThreadPool pool(3);
  std::vector<long> sums(200);
  for (std::size_t call = 0; call < sums.size(); ++call) {
    std::atomic<long> sum{0};
    pool.parallel_for(static_cast<index_t>(call % 17 + 1), [&](index_t task, int) { sum.fetch_add(task + 1); });
    sums[call] = sum.load();
  }
  for (std::size_t call = 0; call < sums.size(); ++call) {
    const long n = static_cast<long>(call % 17 + 1);
    CHECK(sums[call] == n * (n + 1) / 2);
  }
  CHECK_THROWS_WITH(pool.parallel_for(50,
                                      [](index_t task, int) {
                                        if (task == 31) throw std::runtime_error("task 31 failed");
                                      }),
                    ContainsSubstring("task 31 failed"));
  std::atomic<int> after{0};
  pool.parallel_for(10, [&](index_t, int) { after.fetch_add(1); });  // still usable after an error
  CHECK(after.load() == 10);
}

TEST_CASE("concurrent callers sharing one pool get Serial's results bit for bit") {
  const index_t batch = 2, seq = 150, heads = 4, kv_heads = 2, dim = 72;
  const auto qd = random_floats(static_cast<std::size_t>(batch * seq * heads * dim), 1);
  const auto kd = random_floats(static_cast<std::size_t>(batch * seq * kv_heads * dim), 2);
  const auto vd = random_floats(static_cast<std::size_t>(batch * seq * kv_heads * dim), 3);
  const TensorView<const float> q(qd.data(), Extents{batch, seq, heads, dim});
  const TensorView<const float> k(kd.data(), Extents{batch, seq, kv_heads, dim});
  const TensorView<const float> v(vd.data(), Extents{batch, seq, kv_heads, dim});
  const AttentionInputs<float> in{q, k, v};
  const auto mask = CausalMask{} & SlidingWindowMask{60, 0};

  PlanOptions options;
  options.kv_splits = 2;  // exercises the partial-result merge across workers
  execution::Serial serial;
  const auto serial_plan = plan_attention<backends::Highway>(shape_of(in), mask, options, 1);
  Tensor<float> want_out(Extents{batch, seq, heads, dim}), want_lse(Extents{batch, heads, seq});
  attention_forward(serial_plan, in, want_out.view(), want_lse.view(), serial);

  execution::ThreadPool pool(2);
  const auto plan = plan_attention<backends::Highway>(shape_of(in), mask, options, pool.workers());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep) {
        Tensor<float> out(Extents{batch, seq, heads, dim}), lse(Extents{batch, heads, seq});
        attention_forward(plan, in, out.view(), lse.view(), pool);
        if (!bitwise_equal(out, want_out) || !bitwise_equal(lse, want_lse)) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  CHECK(mismatches.load() == 0);
}

TEST_CASE("the backward pass on a pool is bitwise identical to Serial") {
  const index_t seq = 97, heads = 4, kv_heads = 1, dim = 80;
  const auto qd = random_floats(static_cast<std::size_t>(seq * heads * dim), 4);
  const auto kd = random_floats(static_cast<std::size_t>(seq * kv_heads * dim), 5);
  const auto vd = random_floats(static_cast<std::size_t>(seq * kv_heads * dim), 6);
  const auto dod = random_floats(static_cast<std::size_t>(seq * heads * dim), 7);
  const TensorView<const float> q(qd.data(), Extents{1, seq, heads, dim});
  const TensorView<const float> k(kd.data(), Extents{1, seq, kv_heads, dim});
  const TensorView<const float> v(vd.data(), Extents{1, seq, kv_heads, dim});
  const TensorView<const float> dout(dod.data(), Extents{1, seq, heads, dim});
  const AttentionInputs<float> in{q, k, v};
  PlanOptions options;
  options.backward = true;

  auto run = [&](auto& exec, int workers) {
    const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, options, workers);
    Tensor<float> out(Extents{1, seq, heads, dim}), lse(Extents{1, heads, seq});
    Tensor<float> dq(Extents{1, seq, heads, dim}), dk(Extents{1, seq, kv_heads, dim}),
        dv(Extents{1, seq, kv_heads, dim});
    attention_forward(plan, in, out.view(), lse.view(), exec);
    attention_backward(plan, in, out.view(), lse.view(), dout, dq.view(), dk.view(), dv.view(), exec);
    return std::vector<Tensor<float>>{std::move(dq), std::move(dk), std::move(dv)};
  };
  execution::Serial serial;
  const auto want = run(serial, 1);
  execution::ThreadPool pool(3);
  const auto got = run(pool, pool.workers());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(bitwise_equal(got[i], want[i]));
}

}  // namespace seqattn_test_execution_thread_pool_test
