// Ring attention (and its all-gather variant) against single-process
// attention: every rank computes the whole problem with attention_forward and
// compares its own shard, element by element, output and LSE.
//
// Tolerances: fp32 1e-5 absolute on outputs (inputs ~N(0,1), outputs within
// [-4, 4]) and on finite LSEs. bf16 stores each step's partial output in bf16
// before the fp32 merge, so a ring output may differ from the single-process
// one by the rounding of the partials plus the final rounding: 2^-7 relative
// to the largest output (two bf16 ulps); LSEs are fp32 in both and stay
// within 1e-4.
//
// Only non-aborting CHECKs follow a collective: a rank that stopped early
// would leave the others waiting in the next collective.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mpi.h>
#include <random>
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

struct Problem {
  index_t heads = 2, kv_heads = 2, dk = 32, dv = 32;
  cp::RingOptions options;
};

struct Errors {
  double out = 0;          // max |ring - single|
  double out_scale = 0;    // max |single|
  double lse = 0;          // max over finite LSEs; inf when -inf meets a finite value
  index_t empty_rows = 0;  // rows with LSE -inf (seen nothing)
  int skipped = 0;
};

// Runs one case on every rank and returns this rank's errors.
template <class T, MaskDescription M>
Errors run_case(const ShardLayout& layout, const M& mask, const Problem& p) {
  const bool bshd = layout.layout() == Layout::bshd;
  const int rank = world_rank();
  std::mt19937 rng(1234);  // the same global problem on every rank
  const index_t tokens = bshd ? layout.global_len(0) : layout.global_tokens();
  auto shape = [&](index_t h, index_t d) {
    return bshd ? Extents{layout.batch(), tokens, h, d} : Extents{tokens, h, d};
  };
  const Tensor<T> q = random_tensor<T>(shape(p.heads, p.dk), rng);
  const Tensor<T> k = random_tensor<T>(shape(p.kv_heads, p.dk), rng);
  const Tensor<T> v = random_tensor<T>(shape(p.kv_heads, p.dv), rng);

  // Single process, the whole sequence.
  std::vector<std::int32_t> offsets, lens;
  for (index_t b = 0; b < layout.batch(); ++b) {
    offsets.push_back(static_cast<std::int32_t>(layout.global_offset(b)));
    lens.push_back(static_cast<std::int32_t>(layout.global_len(b)));
  }
  const SegmentTable table{offsets, lens, offsets, lens};
  const AttentionInputs<T> whole{q.view(), k.view(), v.view(), bshd ? nullptr : &table};
  Tensor<T> ref_out(shape(p.heads, p.dv));
  Tensor<float> ref_lse(bshd ? Extents{layout.batch(), p.heads, tokens} : Extents{p.heads, tokens});
  AttentionOptions ao;
  ao.scale = p.options.scale;
  ao.softcap = p.options.softcap;
  ao.sinks = p.options.sinks;
  attention_forward<backends::Highway>(whole, mask, ref_out.view(), ref_lse.view(), ao);

  // This rank's shard through the ring.
  const Tensor<T> lq = layout.shard(q.view(), rank);
  const Tensor<T> lk = layout.shard(k.view(), rank);
  const Tensor<T> lv = layout.shard(v.view(), rank);
  cp::RingPlan<T> plan(MPI_COMM_WORLD, layout, p.heads, p.kv_heads, p.dk, p.dv, mask, p.options);
  Tensor<T> out(plan.out_shape(), from_float<T>(12345.0f));
  Tensor<float> lse(plan.lse_shape(), 12345.0f);
  execution::ThreadPool pool(2);
  plan.forward(lq.view(), lk.view(), lv.view(), out.view(), lse.view(), pool);

  Errors e;
  e.skipped = plan.skipped_steps();
  const Tensor<T> want_out = layout.shard(ref_out.view(), rank);
  const Tensor<float> want_lse = layout.shard_axis(ref_lse.view(), rank, bshd ? 2 : 1);
  for (index_t i = 0; i < out.size(); ++i) {
    e.out = std::max(e.out, static_cast<double>(std::abs(to_float(out.data()[i]) - to_float(want_out.data()[i]))));
    e.out_scale = std::max(e.out_scale, static_cast<double>(std::abs(to_float(want_out.data()[i]))));
    if (std::isnan(to_float(out.data()[i]))) e.out = INFINITY;
  }
  for (index_t i = 0; i < lse.size(); ++i) {
    const float a = lse.data()[i], b = want_lse.data()[i];
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) e.lse = INFINITY;
      if (a == -INFINITY && b == -INFINITY) ++e.empty_rows;
    } else {
      e.lse = std::max(e.lse, static_cast<double>(std::abs(a - b)));
    }
  }
  return e;
}

// bf16: relative to the largest output (2^-7: two bf16 ulps at the top).
template <class T>
double out_tolerance(double out_scale) {
  return std::is_same_v<T, float> ? 1e-5 : std::max(1.0, out_scale) / 128;
}
template <class T>
constexpr double lse_tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-4;
}

template <class T, MaskDescription M>
Errors check_case(const char* name, const ShardLayout& layout, const M& mask, const Problem& p) {
  const Errors e = run_case<T>(layout, mask, p);
  INFO(name << " on rank " << world_rank() << " of " << world_size() << (sizeof(T) == 2 ? " (bf16)" : " (fp32)")
            << ": max |out error| " << e.out << ", max |lse error| " << e.lse << ", empty rows " << e.empty_rows
            << ", skipped steps " << e.skipped);
  CHECK(e.out <= out_tolerance<T>(e.out_scale));
  CHECK(e.lse <= lse_tolerance<T>());
  return e;
}

// Brute force: the number of ranks whose keys this rank's queries never see.
template <MaskDescription M>
int invisible_ranks(const ShardLayout& layout, const M& mask, index_t heads) {
  const int rank = world_rank();
  int n = 0;
  for (int src = 0; src < layout.cp_size(); ++src) {
    bool any = false;
    for (index_t b = 0; b < layout.batch() && !any; ++b) {
      const auto& qp = layout.map(rank).positions[static_cast<std::size_t>(b)];
      const auto& kp = layout.map(src).positions[static_cast<std::size_t>(b)];
      const MaskContext base{b, 0, layout.global_len(b), layout.global_len(b)};
      for (index_t h = 0; h < heads && !any; ++h) {
        MaskContext ctx = base;
        ctx.head = h;
        for (index_t qi : qp) {
          for (index_t ki : kp) any = any || mask.allowed(ctx, qi, ki);
        }
      }
    }
    n += any ? 0 : 1;
  }
  return n;
}

const Algorithm kAlgorithms[] = {Algorithm::ring, Algorithm::all_gather};
const char* name_of(Algorithm a) { return a == Algorithm::ring ? "ring" : "all-gather"; }

}  // namespace

TEST_CASE("ring attention: causal, BSHD, every sharding, both algorithms", "[mpi]") {
  const int P = world_size();
  for (Algorithm algo : kAlgorithms) {
    for (Sharding sh : {Sharding::contiguous, Sharding::dual_chunk_swap, Sharding::striped}) {
      const ShardLayout layout = ShardLayout::bshd(2, 256, P, sh, sh == Sharding::striped ? 8 : 1);
      Problem p;
      p.options.algorithm = algo;
      const Errors e = check_case<float>(name_of(algo), layout, CausalMask{}, p);
      if (algo == Algorithm::ring) {
        // The skip rule is exact for interval masks on contiguous runs.
        CHECK(e.skipped == invisible_ranks(layout, CausalMask{}, p.heads));
        if (sh == Sharding::contiguous) CHECK(e.skipped == P - 1 - world_rank());
        if (sh == Sharding::dual_chunk_swap) CHECK(e.skipped == 0);
      }
    }
  }
}

TEST_CASE("ring attention: sliding window, prefix-LM, chunked causal, full", "[mpi]") {
  const int P = world_size();
  for (Algorithm algo : kAlgorithms) {
    const ShardLayout cont = ShardLayout::bshd(1, 320, P, Sharding::contiguous);
    const ShardLayout dcs = ShardLayout::bshd(1, 320, P, Sharding::dual_chunk_swap);
    Problem p;
    p.options.algorithm = algo;
    const SlidingWindowMask window{40, 0};
    const Errors w = check_case<float>("window", cont, window, p);
    if (algo == Algorithm::ring) CHECK(w.skipped == invisible_ranks(cont, window, p.heads));
    check_case<float>("window, DualChunkSwap", dcs, SlidingWindowMask{40, 8}, p);
    check_case<float>("prefix-LM", dcs, PrefixLMMask{70}, p);
    check_case<float>("chunked causal", cont, ChunkedCausalMask{48}, p);
    check_case<float>("full", dcs, FullMask{}, p);
  }
}

TEST_CASE("ring attention: documents spanning rank boundaries", "[mpi]") {
  const int P = world_size();
  // Documents of 37, 100, 80, 23 and 80 tokens: every rank boundary of the
  // contiguous and the DualChunkSwap split falls inside a document.
  std::vector<std::int32_t> ids;
  const int doc_lens[] = {37, 100, 80, 23, 80};
  for (int d = 0; d < 5; ++d) ids.insert(ids.end(), static_cast<std::size_t>(doc_lens[d]), d + 1);
  const Tensor<std::int32_t> id_tensor(Extents{1, 320}, ids);
  const DocumentLayout docs = DocumentLayout::from_segment_ids(id_tensor.view());
  const auto mask = document_mask(docs, CausalMask{});
  for (Algorithm algo : kAlgorithms) {
    Problem p;
    p.options.algorithm = algo;
    for (Sharding sh : {Sharding::contiguous, Sharding::dual_chunk_swap}) {
      const ShardLayout layout = ShardLayout::bshd(1, 320, P, sh);
      const Errors e = check_case<float>("documents (causal inside)", layout, mask, p);
      if (algo == Algorithm::ring) CHECK(e.skipped == invisible_ranks(layout, mask, p.heads));
    }
    check_case<bfloat16>("documents, bf16", ShardLayout::bshd(1, 320, P, Sharding::dual_chunk_swap), mask, p);
  }
}

TEST_CASE("ring attention: multi-item scoring", "[mpi]") {
  const int P = world_size();
  // query (29 tokens) | d | item | d | item | d ... 256 tokens in all.
  constexpr std::int32_t kDelim = -7;
  std::vector<std::int32_t> tokens(256, 3);
  tokens[29] = kDelim;
  for (std::size_t i = 29 + 31; i < tokens.size(); i += 31) tokens[i] = kDelim;
  tokens.back() = kDelim;
  MultiItemLayout items;
  items.add_packed(tokens, kDelim);
  const auto mask = multi_item_mask(items);
  for (Algorithm algo : kAlgorithms) {
    Problem p;
    p.options.algorithm = algo;
    check_case<float>("multi-item", ShardLayout::bshd(1, 256, P, Sharding::dual_chunk_swap), mask, p);
  }
}

TEST_CASE("ring attention: top-k rows, and a rank whose queries see nothing", "[mpi]") {
  const int P = world_size();
  constexpr index_t kS = 256, kK = 24;
  // The first half of the rows select nothing (-1 padding only): on the
  // contiguous split rank 0 (and rank 1 of 4) sees no key at all.
  std::mt19937 rng(99);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(kS * kK), -1);
  for (index_t q = kS / 2; q < kS; ++q) {
    std::vector<std::int32_t> all(static_cast<std::size_t>(kS));
    for (index_t j = 0; j < kS; ++j) all[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    std::shuffle(all.begin(), all.end(), rng);
    for (index_t j = 0; j < kK - (q % 5); ++j)
      idx[static_cast<std::size_t>(q * kK + j)] = all[static_cast<std::size_t>(j)];
  }
  const Tensor<std::int32_t> indices(Extents{1, kS, kK}, idx);
  const TopKLayout topk = TopKLayout::from_indices(indices.view(), kS);
  const auto mask = topk_mask(topk);
  for (Algorithm algo : kAlgorithms) {
    Problem p;
    p.options.algorithm = algo;
    const ShardLayout cont = ShardLayout::bshd(1, kS, P, Sharding::contiguous);
    const Errors e = check_case<float>("top-k, contiguous", cont, mask, p);
    const index_t local_rows = cont.local_tokens(world_rank()) * p.heads;
    if (world_rank() < P / 2) {
      CHECK(e.empty_rows == local_rows);  // out 0 and lse -inf, as single-process
      if (algo == Algorithm::ring) CHECK(e.skipped == P);
    }
    check_case<float>("top-k, DualChunkSwap", ShardLayout::bshd(1, kS, P, Sharding::dual_chunk_swap), mask, p);
  }
}

TEST_CASE("ring attention: GQA, softcap, sinks, scale, fp32 and bf16", "[mpi]") {
  const int P = world_size();
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.25f, 0.75f, 3.0f};
  for (Algorithm algo : kAlgorithms) {
    Problem p;
    p.heads = 8;
    p.kv_heads = 2;
    p.dk = 48;
    p.dv = 24;
    p.options.algorithm = algo;
    p.options.softcap = 20.0f;
    p.options.sinks = sinks;
    p.options.scale = 0.1f;
    const ShardLayout layout = ShardLayout::bshd(2, 128, P, Sharding::dual_chunk_swap);
    check_case<float>("GQA 8/2 causal, softcap, sinks", layout, CausalMask{}, p);
    check_case<bfloat16>("GQA 8/2 causal, softcap, sinks", layout, CausalMask{}, p);
    p.options.sinks = {};
    p.options.softcap = 0.0f;
    p.kv_heads = 1;  // MQA
    check_case<float>("MQA window", layout, SlidingWindowMask{30, 0}, p);
  }
}

TEST_CASE("ring attention: packed THD segments split per rank", "[mpi]") {
  const int P = world_size();
  // Segment lengths divisible by 2 * cp_size for P in {1, 2, 4}.
  const std::vector<std::int32_t> cu = {0, 64, 192, 216, 256, 256, 336};
  for (Algorithm algo : kAlgorithms) {
    for (Sharding sh : {Sharding::contiguous, Sharding::dual_chunk_swap}) {
      const ShardLayout layout = ShardLayout::thd_from_cu_seqlens(cu, P, sh);
      Problem p;
      p.heads = 4;
      p.kv_heads = 2;
      p.options.algorithm = algo;
      const Errors e = check_case<float>("THD causal", layout, CausalMask{}, p);
      if (algo == Algorithm::ring) CHECK(e.skipped == invisible_ranks(layout, CausalMask{}, p.heads));
      check_case<float>("THD window", layout, SlidingWindowMask{20, 0}, p);
      check_case<bfloat16>("THD causal bf16", layout, CausalMask{}, p);
    }
  }
}

TEST_CASE("ring attention: ranks that disagree throw on every rank instead of hanging", "[mpi]") {
  const int P = world_size();
  const int rank = world_rank();
  const ShardLayout layout = ShardLayout::bshd(1, 64, P, Sharding::dual_chunk_swap);
  // Rank 1 (or rank 0 alone) plans another head count.
  const index_t heads = rank == std::min(1, P - 1) ? 4 : 2;
  auto make_plan = [&] { cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, heads, 2, 16, 16, CausalMask{}); };
  if (P > 1) {
    CHECK_THROWS_WITH(make_plan(), ContainsSubstring("disagree on the query heads"));
  }
  // Another mask on one rank.
  auto mask_plan = [&] {
    if (rank == P - 1) {
      cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, SlidingWindowMask{5, 0});
    } else {
      cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{});
    }
  };
  if (P > 1) CHECK_THROWS_WITH(mask_plan(), ContainsSubstring("the mask"));
  // A layout for another number of ranks: every rank learns which rank failed.
  const ShardLayout wrong = ShardLayout::bshd(1, 64, rank == 0 ? P + 1 : P, Sharding::contiguous);
  CHECK_THROWS_WITH((cp::RingPlan<float>(MPI_COMM_WORLD, wrong, 2, 2, 16, 16, CausalMask{})),
                    ContainsSubstring("rank 0 of") && ContainsSubstring("cp_size"));
  // At call time: rank 0 passes a q of the wrong shape; every rank throws.
  cp::RingPlan<float> plan(MPI_COMM_WORLD, layout, 2, 2, 16, 16, CausalMask{});
  const index_t n = layout.local_tokens(rank);
  Tensor<float> q(Extents{1, rank == 0 ? n + 1 : n, 2, 16}, 0.0f), k(Extents{1, n, 2, 16}, 0.0f),
      v(Extents{1, n, 2, 16}, 0.0f), out(plan.out_shape());
  CHECK_THROWS_WITH(plan.forward(q.view(), k.view(), v.view(), out.view(), TensorView<float>{}, execution::Serial{}),
                    ContainsSubstring("q must have shape"));
  // The plan still works afterwards (nothing was left in flight).
  Tensor<float> good_q(plan.q_shape(), 0.5f);
  CHECK_NOTHROW(plan.forward(good_q.view(), k.view(), v.view(), out.view(), TensorView<float>{}, execution::Serial{}));
  // Invalid arguments a single rank can see are invalid_argument too.
  CHECK_THROWS_AS(ShardLayout::bshd(1, 63, 2, Sharding::dual_chunk_swap), seqattn::invalid_argument);
}

namespace {

struct GradErrors {
  double dq = 0, dk = 0, dv = 0, dsinks = 0;
  double scale = 0;  // max |gradient| of the single-process result
};

// Ring backward against single-process attention_backward: every rank
// computes the whole problem's gradients and compares its shard.
template <class T, MaskDescription M>
GradErrors run_backward(const ShardLayout& layout, const M& mask, const Problem& p) {
  const bool bshd = layout.layout() == Layout::bshd;
  const int rank = world_rank();
  std::mt19937 rng(4321);
  const index_t tokens = bshd ? layout.global_len(0) : layout.global_tokens();
  auto shape = [&](index_t h, index_t d) {
    return bshd ? Extents{layout.batch(), tokens, h, d} : Extents{tokens, h, d};
  };
  const Tensor<T> q = random_tensor<T>(shape(p.heads, p.dk), rng);
  const Tensor<T> k = random_tensor<T>(shape(p.kv_heads, p.dk), rng);
  const Tensor<T> v = random_tensor<T>(shape(p.kv_heads, p.dv), rng);
  const Tensor<T> dout = random_tensor<T>(shape(p.heads, p.dv), rng);
  std::vector<std::int32_t> offsets, lens;
  for (index_t b = 0; b < layout.batch(); ++b) {
    offsets.push_back(static_cast<std::int32_t>(layout.global_offset(b)));
    lens.push_back(static_cast<std::int32_t>(layout.global_len(b)));
  }
  const SegmentTable table{offsets, lens, offsets, lens};
  const AttentionInputs<T> whole{q.view(), k.view(), v.view(), bshd ? nullptr : &table};
  PlanOptions po;
  po.backward = true;
  const auto plan = plan_attention<backends::Highway>(shape_of(whole), mask, po);
  const variants::Standard variant{p.options.scale, {p.options.softcap}, {p.options.sinks}};
  Tensor<T> ref_out(shape(p.heads, p.dv));
  Tensor<float> ref_lse(bshd ? Extents{layout.batch(), p.heads, tokens} : Extents{p.heads, tokens});
  attention_forward(plan, whole, ref_out.view(), ref_lse.view(), variant);
  Tensor<T> rdq(q.shape()), rdk(k.shape()), rdv(v.shape());
  std::vector<float> rdsinks(p.options.sinks.empty() ? 0 : static_cast<std::size_t>(p.heads));
  attention_backward(plan, whole, ref_out.view(), ref_lse.view(), dout.view(),
                     AttentionGrads<T>{rdq.view(), rdk.view(), rdv.view(), rdsinks}, variant, execution::Serial{});

  cp::RingOptions options = p.options;
  options.backward = true;
  cp::RingPlan<T> ring(MPI_COMM_WORLD, layout, p.heads, p.kv_heads, p.dk, p.dv, mask, options);
  const Tensor<T> lq = layout.shard(q.view(), rank), lk = layout.shard(k.view(), rank),
                  lv = layout.shard(v.view(), rank), ldout = layout.shard(dout.view(), rank);
  Tensor<T> out(ring.out_shape());
  Tensor<float> lse(ring.lse_shape());
  execution::ThreadPool pool(2);
  ring.forward(lq.view(), lk.view(), lv.view(), out.view(), lse.view(), pool);
  Tensor<T> dq(ring.q_shape(), from_float<T>(777.0f)), dk(ring.k_shape(), from_float<T>(777.0f)),
      dv(ring.v_shape(), from_float<T>(777.0f));
  std::vector<float> dsinks(rdsinks.size(), 777.0f);
  ring.backward(lq.view(), lk.view(), lv.view(), TensorView<const T>(out.view()), TensorView<const float>(lse.view()),
                ldout.view(), dq.view(), dk.view(), dv.view(), dsinks, pool);

  GradErrors e;
  auto compare = [&](const Tensor<T>& got, const Tensor<T>& ref_global, double& err) {
    const Tensor<T> want = layout.shard(ref_global.view(), rank);
    for (index_t i = 0; i < got.size(); ++i) {
      const double a = to_float(got.data()[i]), b = to_float(want.data()[i]);
      err = std::max(err, std::isnan(a) ? INFINITY : std::abs(a - b));
      e.scale = std::max(e.scale, std::abs(b));
    }
  };
  compare(dq, rdq, e.dq);
  compare(dk, rdk, e.dk);
  compare(dv, rdv, e.dv);
  for (std::size_t h = 0; h < dsinks.size(); ++h) {
    e.dsinks = std::max(e.dsinks, static_cast<double>(std::abs(dsinks[h] - rdsinks[h])));
  }
  return e;
}

template <class T, MaskDescription M>
void check_backward(const char* name, const ShardLayout& layout, const M& mask, const Problem& p) {
  const GradErrors e = run_backward<T>(layout, mask, p);
  // Gradients sum over up to `tokens` terms: tolerances relative to the
  // largest gradient (fp32 1e-5; bf16 per-step rounding of dQ/dK/dV before the fp32 sum, 2^-6).
  const double tol = (std::is_same_v<T, float> ? 1e-5 : 1.0 / 64) * std::max(1.0, e.scale);
  INFO(name << " backward on rank " << world_rank() << " of " << world_size()
            << (sizeof(T) == 2 ? " (bf16)" : " (fp32)") << ": max |error| dq " << e.dq << ", dk " << e.dk << ", dv "
            << e.dv << ", dsinks " << e.dsinks << " (largest gradient " << e.scale << ")");
  CHECK(e.dq <= tol);
  CHECK(e.dk <= tol);
  CHECK(e.dv <= tol);
  CHECK(e.dsinks <= tol);
}

}  // namespace

TEST_CASE("ring attention backward: dQ, dK, dV (and sinks) match single-process", "[mpi]") {
  const int P = world_size();
  Problem p;
  p.heads = 4;
  p.kv_heads = 2;
  for (Sharding sh : {Sharding::contiguous, Sharding::dual_chunk_swap}) {
    const ShardLayout layout = ShardLayout::bshd(2, 192, P, sh);
    check_backward<float>("causal GQA", layout, CausalMask{}, p);
    check_backward<float>("window", layout, SlidingWindowMask{30, 5}, p);
  }
  const std::vector<std::int32_t> cu = {0, 64, 192, 216, 256};
  check_backward<float>("THD causal", ShardLayout::thd_from_cu_seqlens(cu, P), CausalMask{}, p);
  check_backward<bfloat16>("causal", ShardLayout::bshd(1, 128, P, Sharding::dual_chunk_swap), CausalMask{}, p);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  p.options.sinks = sinks;
  p.options.softcap = 15.0f;
  check_backward<float>("causal, sinks, softcap", ShardLayout::bshd(1, 128, P, Sharding::dual_chunk_swap), CausalMask{},
                        p);
}
