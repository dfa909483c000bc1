// The NaN policy (README, "NaN and infinity") through ring attention: NaN in
// one rank's shard of one document reaches exactly the rows of that document
// that see it, on every rank; the merge of partials keeps a NaN partial NaN
// and the other documents equal a NaN-free single-process run.
//
// Only non-aborting CHECKs follow a collective (see ring_attention_test.cpp).
#include <cmath>
#include <cstdint>
#include <limits>
#include <mpi.h>
#include <random>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/cp.hpp"
#include "seqattn/masks.hpp"

#include "mpi_test_support.hpp"
#include "support/catch.hpp"
#include "support/engine_instances.hpp"  // the common engine configurations, compiled once

namespace {

using namespace seqattn;

using testing::random_tensor;
using testing::world_rank;
using testing::world_size;

// Documents of 37, 100, 80, 23 and 80 tokens (ids 1..5), causal inside.
constexpr int kDocLens[] = {37, 100, 80, 23, 80};
constexpr index_t kTokens = 320, kHeads = 2, kDim = 32;

// NaN in q at token 100 head 0 (document 2), in k at token 150 (document 3,
// the first rank's shard on a contiguous split) and in the v row of token 230
// (document 5, the last rank's shard): the rows that see them turn NaN, the
// LSE only where the logits do (v does not reach it).
bool nan_lse(index_t t, index_t h) { return (t == 100 && h == 0) || (t >= 150 && t < 217); }
bool nan_out(index_t t, index_t h) { return nan_lse(t, h) || (t >= 230 && t < 240); }

template <class T>
void check_ring(cp::Algorithm algorithm, cp::Sharding sharding) {
  const int rank = world_rank(), ranks = world_size();
  std::vector<std::int32_t> ids;
  for (int d = 0; d < 5; ++d) ids.insert(ids.end(), static_cast<std::size_t>(kDocLens[d]), d + 1);
  const Tensor<std::int32_t> id_tensor(Extents{1, kTokens}, ids);
  const DocumentLayout docs = DocumentLayout::from_segment_ids(id_tensor.view());
  const auto mask = document_mask(docs, CausalMask{});

  std::mt19937 rng(4321);  // the same global problem on every rank
  const Extents shape{1, kTokens, kHeads, kDim};
  const Tensor<T> q0 = random_tensor<T>(shape, rng), k0 = random_tensor<T>(shape, rng),
                  v0 = random_tensor<T>(shape, rng);
  Tensor<T> q = q0, k = k0, v = v0;
  const T nan = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  q(0, 100, 0, 3) = nan;
  for (index_t h = 0; h < kHeads; ++h) {
    k(0, 150, h, 5) = nan;
    for (index_t e = 0; e < kDim; ++e) v(0, 230, h, e) = nan;
  }

  // The NaN-free single-process result: what every row outside nan_out must match.
  const AttentionInputs<T> clean_in{q0.view(), k0.view(), v0.view()};
  Tensor<T> clean_out(shape);
  Tensor<float> clean_lse(Extents{1, kHeads, kTokens});
  attention_forward<backends::Reference>(clean_in, mask, clean_out.view(), clean_lse.view());

  const cp::ShardLayout layout = cp::ShardLayout::bshd(1, kTokens, ranks, sharding);
  cp::RingOptions options;
  options.algorithm = algorithm;
  const Tensor<T> lq = layout.shard(q.view(), rank), lk = layout.shard(k.view(), rank),
                  lv = layout.shard(v.view(), rank);
  cp::RingPlan<T> plan(MPI_COMM_WORLD, layout, kHeads, kHeads, kDim, kDim, mask, options);
  Tensor<T> out(plan.out_shape(), from_float<T>(7.0f));
  Tensor<float> lse(plan.lse_shape(), 7.0f);
  execution::ThreadPool pool(2);
  plan.forward(lq.view(), lk.view(), lv.view(), out.view(), lse.view(), pool);

  const Tensor<T> want = layout.shard(clean_out.view(), rank);
  const Tensor<float> want_lse = layout.shard_axis(clean_lse.view(), rank, 2);
  const std::vector<index_t>& positions = layout.map(rank).positions[0];
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1.0 / 32;  // bf16: partials rounded per step
  index_t wrong_nan = 0, wrong_value = 0, nan_rows = 0;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const index_t t = positions[i], local = static_cast<index_t>(i);
    for (index_t h = 0; h < kHeads; ++h) {
      const bool expect_nan = nan_out(t, h);
      nan_rows += expect_nan;
      const float l = lse(0, h, local);
      if (std::isnan(l) != nan_lse(t, h)) ++wrong_nan;
      if (!nan_lse(t, h) && !(std::abs(l - want_lse(0, h, local)) <= 1e-4)) ++wrong_value;
      for (index_t e = 0; e < kDim; ++e) {
        const float g = to_float(out(0, local, h, e)), w = to_float(want(0, local, h, e));
        if (std::isnan(g) != expect_nan) ++wrong_nan;
        if (!expect_nan && !(std::abs(g - w) <= tol)) ++wrong_value;
      }
    }
  }
  INFO((algorithm == cp::Algorithm::ring ? "ring" : "all-gather")
       << (sharding == cp::Sharding::contiguous ? ", contiguous" : ", DualChunkSwap")
       << (sizeof(T) == 2 ? ", bf16" : ", fp32") << ", rank " << rank << " of " << ranks << ": " << nan_rows
       << " NaN rows expected here");
  CHECK(wrong_nan == 0);
  CHECK(wrong_value == 0);
}

}  // namespace

TEST_CASE("ring attention: NaN in one rank's shard of one document stays in the rows that see it", "[mpi][nan]") {
  for (const cp::Algorithm algorithm : {cp::Algorithm::ring, cp::Algorithm::all_gather}) {
    check_ring<float>(algorithm, cp::Sharding::contiguous);
    // DualChunkSwap splits the sequence into 2 * ranks chunks.
    if (kTokens % (2 * world_size()) == 0) check_ring<float>(algorithm, cp::Sharding::dual_chunk_swap);
    check_ring<bfloat16>(algorithm, cp::Sharding::contiguous);
  }
}
