// Ring attention over MPI (context parallelism): every rank holds a
// DualChunkSwap shard of a causal sequence, K/V shards travel around the ring,
// and each rank checks its part of the result against single-process
// attention over the whole sequence.
//
//   mpirun -np 4 ./build/release/examples/seqattn_example_ring_attention [tokens] [all-gather]
//
// (as root add --allow-run-as-root; on fewer cores than ranks add --oversubscribe).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <random>
#include <string>

#include "seqattn/cp.hpp"
#include "seqattn/seqattn.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  try {
    using namespace seqattn;
    const index_t tokens = argc > 1 ? std::atol(argv[1]) : 2048;
    const bool all_gather = argc > 2 && std::string(argv[2]) == "all-gather";
    constexpr index_t kHeads = 8, kKvHeads = 2, kDim = 64;

    // Every rank knows the global layout; DualChunkSwap gives each rank
    // chunks r and 2P-1-r, so causal work is even across ranks.
    const cp::ShardLayout layout = cp::ShardLayout::bshd(1, tokens, size, cp::Sharding::dual_chunk_swap);

    // The global q, k, v (the same seed everywhere): in a model each rank
    // would produce only its shard.
    std::mt19937 rng(7);
    std::normal_distribution<float> dist;
    auto random = [&](index_t h) {
      Tensor<float> t(Extents{1, tokens, h, kDim});
      for (float& x : t.values()) x = dist(rng);
      return t;
    };
    const Tensor<float> q = random(kHeads), k = random(kKvHeads), v = random(kKvHeads);
    const Tensor<float> local_q = layout.shard(q.view(), rank), local_k = layout.shard(k.view(), rank),
                        local_v = layout.shard(v.view(), rank);

    cp::RingOptions options;
    options.algorithm = all_gather ? cp::Algorithm::all_gather : cp::Algorithm::ring;
    execution::ThreadPool pool(1);
    // Planned once (collectively): per-step plans, buffers, validation.
    cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, kHeads, kKvHeads, kDim, kDim, CausalMask{}, options,
                             pool.workers());
    Tensor<float> out(plan.out_shape());
    Tensor<float> lse(plan.lse_shape());
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    plan.forward(local_q.view(), local_k.view(), local_v.view(), out.view(), lse.view(), pool);
    const double elapsed = MPI_Wtime() - t0;

    // The same rows from single-process attention.
    Tensor<float> ref_out(Extents{1, tokens, kHeads, kDim});
    Tensor<float> ref_lse(Extents{1, kHeads, tokens});
    attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view()}, CausalMask{}, ref_out.view(),
                      ref_lse.view());
    const Tensor<float> want = layout.shard(ref_out.view(), rank);
    double err = 0;
    for (index_t i = 0; i < out.size(); ++i) err = std::max(err, double{std::abs(out.data()[i] - want.data()[i])});

    std::printf("rank %d/%d: %s, %td of %td tokens (chunks %d and %d), %.2f ms, skipped %d steps, max |error| %.2e\n",
                rank, size, all_gather ? "all-gather" : "ring", layout.local_tokens(rank), tokens, rank,
                2 * size - 1 - rank, elapsed * 1e3, plan.skipped_steps(), err);
    status = err <= 1e-5 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
