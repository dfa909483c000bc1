// Ring attention over MPI: time per step, communication hidden behind
// compute, and scaling against one process, on this machine.
//
//   mpirun -np 2 ./build/native/bench/seqattn_ring_attention [tokens=4096] [reps=3]
//   mpirun -np 4 --oversubscribe ./build/native/bench/seqattn_ring_attention
//
// Workload: one causal sequence, DualChunkSwap shards, 8 query heads over 8
// kv heads, d = 128, fp32, one thread per rank. Rank 0 first measures the
// machine's limits (support/machine_limits.hpp) and the single-process time
// of the same problem on one thread (the 1-rank point), the other ranks
// idle meanwhile. Then every rank runs the ring `reps` times (after one
// warm-up); the wall time of a call is the slowest rank's.
//
// Communication hidden: the time one ring exchange of a shard takes alone
// (Isend/Irecv/Waitall, no compute) against the time the ring waits after
// its compute: hidden = 1 - wait / exchange, per step, averaged over ranks
// and steps that send. With more ranks than cores the ranks share cores, so
// the 4-rank figures on a 2-core machine measure oversubscription, not
// scaling: they are reported with that note.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <random>
#include <thread>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/cp.hpp"
#include "seqattn/masks/structural.hpp"

#include "support/machine_limits.hpp"

namespace {

using namespace seqattn;

constexpr index_t kHeads = 8, kKvHeads = 8, kDim = 128;

double causal_flops(index_t s) {
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  return 2.0 * static_cast<double>(kHeads * (kDim + kDim)) * pairs;
}

Tensor<float> random_tensor(const Extents& shape, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  Tensor<float> t(shape);
  for (float& x : t.values()) x = dist(rng);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const index_t tokens = argc > 1 ? std::atol(argv[1]) : 4096;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  std::mt19937 rng(3);
  const Tensor<float> q = random_tensor(Extents{1, tokens, kHeads, kDim}, rng);
  const Tensor<float> k = random_tensor(Extents{1, tokens, kKvHeads, kDim}, rng);
  const Tensor<float> v = random_tensor(Extents{1, tokens, kKvHeads, kDim}, rng);
  execution::Serial serial;

  // Rank 0 alone: the machine's limits and the 1-process point.
  bench::MachineLimits lim;
  double single_s = 0;
  if (rank == 0) {
    lim = bench::measure_machine_limits();
    bench::print_machine_limits(lim);
    const AttentionInputs<float> in{q.view(), k.view(), v.view()};
    const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, {}, 1);
    Tensor<float> out(Extents{1, tokens, kHeads, kDim});
    Tensor<float> lse(Extents{1, kHeads, tokens});
    attention_forward(plan, in, out.view(), lse.view(), serial);
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      const double t0 = MPI_Wtime();
      attention_forward(plan, in, out.view(), lse.view(), serial);
      t.push_back(MPI_Wtime() - t0);
    }
    single_s = median(t);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const cp::ShardLayout layout = cp::ShardLayout::bshd(1, tokens, size, cp::Sharding::dual_chunk_swap);
  const Tensor<float> lq = layout.shard(q.view(), rank), lk = layout.shard(k.view(), rank),
                      lv = layout.shard(v.view(), rank);

  // One exchange of a shard alone (what the ring must hide).
  const index_t shard_bytes = layout.local_tokens(rank) * kKvHeads * 2 * kDim * static_cast<index_t>(sizeof(float));
  double exchange_s = 0;
  if (size > 1) {
    std::vector<char> a(static_cast<std::size_t>(shard_bytes)), b(a.size());
    const int next = (rank + 1) % size, prev = (rank - 1 + size) % size;
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Request r[2];
      MPI_Irecv(b.data(), static_cast<int>(shard_bytes), MPI_BYTE, prev, 1, MPI_COMM_WORLD, &r[0]);
      MPI_Isend(a.data(), static_cast<int>(shard_bytes), MPI_BYTE, next, 1, MPI_COMM_WORLD, &r[1]);
      MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
      t.push_back(MPI_Wtime() - t0);
    }
    exchange_s = median(t);
  }

  auto run = [&](cp::Algorithm algo, std::vector<double>* steps) {
    cp::RingOptions options;
    options.algorithm = algo;
    cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, kHeads, kKvHeads, kDim, kDim, CausalMask{}, options, 1);
    Tensor<float> out(plan.out_shape());
    Tensor<float> lse(plan.lse_shape());
    plan.forward(lq.view(), lk.view(), lv.view(), out.view(), lse.view(), serial);  // warm-up
    std::vector<double> wall;
    std::vector<double> compute(static_cast<std::size_t>(size), 0.0), wait(static_cast<std::size_t>(size), 0.0);
    for (int i = 0; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      plan.forward(lq.view(), lk.view(), lv.view(), out.view(), lse.view(), serial);
      double mine = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      wall.push_back(slowest);
      if (algo == cp::Algorithm::ring) {
        for (int s = 0; s < size; ++s) {
          compute[static_cast<std::size_t>(s)] += plan.last_timings()[static_cast<std::size_t>(s)].compute_s / reps;
          wait[static_cast<std::size_t>(s)] += plan.last_timings()[static_cast<std::size_t>(s)].wait_s / reps;
        }
      }
    }
    if (steps) {
      // Per rank: compute and wait per step, gathered on rank 0.
      std::vector<double> mine(compute);
      mine.insert(mine.end(), wait.begin(), wait.end());
      steps->assign(static_cast<std::size_t>(2 * size * size), 0.0);
      MPI_Gather(mine.data(), 2 * size, MPI_DOUBLE, steps->data(), 2 * size, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    return median(wall);
  };
  std::vector<double> steps;
  const double ring_s = run(cp::Algorithm::ring, &steps);
  const double ag_s = run(cp::Algorithm::all_gather, nullptr);
  double exchange_max = 0;
  MPI_Reduce(&exchange_s, &exchange_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  if (rank == 0) {
    const double flops = causal_flops(tokens);
    const bool over = static_cast<unsigned>(size) > cores;
    std::printf(
        "ring attention: causal, 1 x %td tokens, %td heads over %td kv heads, d %td, fp32, DualChunkSwap, "
        "1 thread per rank, %d rank(s) on %u core(s)%s\n",
        tokens, kHeads, kKvHeads, kDim, size, cores, over ? " (OVERSUBSCRIBED: ranks share cores)" : "");
    std::printf("  1 process       %8.1f ms  %7.1f GFLOP/s  %.2f of the 1-thread FMA peak (%.1f GFLOP/s)\n",
                single_s * 1e3, flops / single_s * 1e-9, flops / single_s * 1e-9 / lim.fma_gflops_1t,
                lim.fma_gflops_1t);
    const double peak_p = lim.fma_gflops_1t * std::min<double>(size, cores);
    std::printf("  ring, %d ranks   %8.1f ms  %7.1f GFLOP/s  %.2f of the FMA peak of %d core(s)  speedup %.2fx\n", size,
                ring_s * 1e3, flops / ring_s * 1e-9, flops / ring_s * 1e-9 / peak_p, std::min<int>(size, cores),
                single_s / ring_s);
    std::printf("  all-gather      %8.1f ms  %7.1f GFLOP/s  speedup %.2fx\n", ag_s * 1e3, flops / ag_s * 1e-9,
                single_s / ag_s);
    if (size > 1) {
      std::printf("  one shard exchange alone (%.2f MB): %.3f ms (slowest rank)\n",
                  static_cast<double>(shard_bytes) * 1e-6, exchange_max * 1e3);
      std::printf("  per step (ms, compute+merge / wait after compute), rank by rank:\n");
      double waited = 0;
      int sending = 0;
      for (int r = 0; r < size; ++r) {
        std::printf("    rank %d:", r);
        for (int s = 0; s < size; ++s) {
          const double c = steps[static_cast<std::size_t>(2 * size * r + s)];
          const double w = steps[static_cast<std::size_t>(2 * size * r + size + s)];
          std::printf("  %7.2f/%5.2f", c * 1e3, w * 1e3);
          if (s + 1 < size) {
            waited += w;
            ++sending;
          }
        }
        std::printf("\n");
      }
      const double mean_wait = waited / std::max(1, sending);
      const double hidden = exchange_max > 0 ? std::clamp(1.0 - mean_wait / exchange_max, 0.0, 1.0) : 1.0;
      std::printf("  communication hidden behind compute: %.0f %% (mean wait %.3f ms vs exchange %.3f ms)\n",
                  hidden * 100, mean_wait * 1e3, exchange_max * 1e3);
    }
  }
  MPI_Finalize();
  return 0;
}
