// The three scenario workloads against their dense paths.
//
//   MultiItem/{dense,segment}     500 items packed in one request (~4.5K tokens): attention with the T x T mask
//                                 materialized (to_dense + DenseMask, scanned into a BlockMask) vs the O(T)
//                                 segment metadata (MultiItemMask). Mask construction is part of each call,
//                                 as it is per request in serving. Upstream's TPU ratio: 2.01x.
//   DsaMask/{scatter,broadcast}   top-k indices [t, k] -> 0/1 mask [t, s] (t = 1024, s = 4096, k = 512).
//   Dsa/{dense,indexer,topk_full,topk_gathered}  4096 tokens, k = 512: dense causal attention; index scores +
//                                 top-k; top-k attention through the library's TopKMask over the full K/V;
//                                 top-k attention over per-64-query-block gathered K/V (what dsa::sparse_attention
//                                 runs).
//   Kascade/{dense,anchor,reuse}  4096 tokens, tile 32, 10% budget: dense causal attention of a reuse layer;
//                                 the anchor's pooled-mass selection; the reuse layer (gather + attention).
//
// GFLOP/s count 2 (Dk + Dv) per (query head, allowed query-key pair): the work the mask leaves, so a sparse
// path is not credited for skipped work. peak_frac divides by this binary's measured one-thread fp32 FMA peak.
// Everything runs single-threaded (execution::Serial) so ratios compare algorithms, not thread scheduling.
#include "seqattn/scenarios.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "seqattn/masks.hpp"

#include "support/bench_main.hpp"

namespace {

using namespace seqattn;
using namespace seqattn::scenarios;

void report_flops(benchmark::State& state, double pairs, index_t heads, index_t dk, index_t dv) {
  const double flops = pairs * static_cast<double>(heads) * 2.0 * static_cast<double>(dk + dv);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double peak = bench::limits().fma_gflops_1t;
  if (peak > 0) {
    state.counters["peak_frac"] =
        benchmark::Counter(flops * 1e-9 / peak, benchmark::Counter::kIsIterationInvariantRate);
  }
}

// ---------------------------------------------------------------------------
// Multi-item scoring.

struct MultiItemSetup {
  multi_item::PackedRequest request;
  Projections proj;
  float scale = 0.25f;
  double pairs = 0;  // allowed (q, kv) pairs
};

const MultiItemSetup& multi_item_setup() {
  static const MultiItemSetup s = [] {
    MultiItemSetup m;
    const TinyModel model;
    multi_item::Options o;
    o.delimiter = 63;
    SplitMix64 rng(42);
    const auto items = workloads::random_items(rng, 500, 16, 63);
    m.request = multi_item::pack(std::vector<std::int32_t>(32, 5), items, o);
    m.proj = model.project(m.request.tokens, m.request.positions);
    m.scale = model.softmax_scale();
    for (index_t q = 0; q < m.request.size(); ++q) {
      for (index_t k = 0; k <= q; ++k) m.pairs += m.request.allowed(q, k) ? 1.0 : 0.0;
    }
    return m;
  }();
  return s;
}

void BM_MultiItem(benchmark::State& state, multi_item::MaskMode mode) {
  const MultiItemSetup& s = multi_item_setup();
  for (auto _ : state) {
    AttentionOutput out = multi_item::attend_packed(s.proj, s.scale, s.request, mode);
    benchmark::DoNotOptimize(out.out.data());
  }
  state.counters["tokens"] = static_cast<double>(s.request.size());
  state.counters["items/s"] = benchmark::Counter(500.0, benchmark::Counter::kIsIterationInvariantRate);
  report_flops(state, s.pairs, s.proj.q.extent(1), s.proj.q.extent(2), s.proj.v.extent(2));
}
BENCHMARK_CAPTURE(BM_MultiItem, dense, multi_item::MaskMode::dense)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MultiItem, segment, multi_item::MaskMode::segment)->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------
// DSA.

constexpr index_t kDsaTokens = 4096, kDsaTopK = 512, kDsaHeads = 8, kDsaDim = 64;

struct DsaSetup {
  workloads::DsaInputs in;
  Tensor<float> scores;
  dsa::TopK topk;
  double topk_pairs = 0, causal_pairs = 0;
};

const DsaSetup& dsa_setup() {
  static const DsaSetup s = [] {
    DsaSetup d;
    d.in = workloads::dsa_inputs(kDsaTokens, kDsaHeads, 2, kDsaDim, 4, 32, 11);
    d.scores = dsa::index_scores(d.in.index_q.view(), d.in.index_k.view(), d.in.index_w.view());
    d.topk = dsa::select_topk(d.scores.view(), kDsaTopK, dsa::TopKOrder::by_index);
    for (index_t c : d.topk.counts) d.topk_pairs += static_cast<double>(c);
    d.causal_pairs = static_cast<double>(kDsaTokens) * static_cast<double>(kDsaTokens + 1) / 2.0;
    return d;
  }();
  return s;
}

void BM_DsaMask(benchmark::State& state, bool scatter) {
  const DsaSetup& s = dsa_setup();
  const auto rows = s.topk.indices.view().slice(0, 0, 1024);
  for (auto _ : state) {
    Tensor<std::uint8_t> m =
        scatter ? dsa::mask_by_scatter(rows, kDsaTokens) : dsa::mask_by_broadcast_compare(rows, kDsaTokens);
    benchmark::DoNotOptimize(m.data());
  }
  state.counters["mask_bytes/s"] = benchmark::Counter(
      1024.0 * kDsaTokens, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
}
BENCHMARK_CAPTURE(BM_DsaMask, scatter, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DsaMask, broadcast, false)->Unit(benchmark::kMillisecond);

void BM_Dsa_dense(benchmark::State& state) {
  const DsaSetup& s = dsa_setup();
  for (auto _ : state) {
    AttentionOutput out = attend(s.in.q.view(), s.in.k.view(), s.in.v.view(), s.in.scale, CausalMask{});
    benchmark::DoNotOptimize(out.out.data());
  }
  report_flops(state, s.causal_pairs, kDsaHeads, kDsaDim, kDsaDim);
}
BENCHMARK(BM_Dsa_dense)->Unit(benchmark::kMillisecond);

void BM_Dsa_indexer(benchmark::State& state) {
  const DsaSetup& s = dsa_setup();
  for (auto _ : state) {
    dsa::TopK t = dsa::indexer_topk(s.in.index_q.view(), s.in.index_k.view(), s.in.index_w.view(), kDsaTopK);
    benchmark::DoNotOptimize(t.indices.data());
  }
  // 2 d flops per (indexer head, causal pair) for the scores.
  report_flops(state, s.causal_pairs, 4, 32, 0);
}
BENCHMARK(BM_Dsa_indexer)->Unit(benchmark::kMillisecond);

void BM_Dsa_topk_full(benchmark::State& state) {
  const DsaSetup& s = dsa_setup();
  const TopKLayout layout = dsa::topk_layout(s.topk);
  const BlockMask bm = build_block_mask(topk_mask(layout), layout.lengths(), kDsaHeads, {64, 64});
  for (auto _ : state) {
    AttentionOutput out = attend(s.in.q.view(), s.in.k.view(), s.in.v.view(), s.in.scale, topk_mask(layout));
    benchmark::DoNotOptimize(out.out.data());
  }
  state.counters["tiles"] =
      static_cast<double>(bm.num_full_tiles() + bm.num_partial_tiles()) / static_cast<double>(bm.num_tiles());
  report_flops(state, s.topk_pairs, kDsaHeads, kDsaDim, kDsaDim);
}
BENCHMARK(BM_Dsa_topk_full)->Unit(benchmark::kMillisecond);

void BM_Dsa_topk_gathered(benchmark::State& state) {
  const DsaSetup& s = dsa_setup();
  double keys = 0;
  for (auto _ : state) {
    const dsa::GatheredSelection g = dsa::gather_selection(s.topk, s.in.k.view(), s.in.v.view());
    AttentionOutput out =
        attend_thd(s.in.q.view(), g.k.view(), g.v.view(), g.table(), s.in.scale, dsa::GatheredSelectionMask{&g});
    benchmark::DoNotOptimize(out.out.data());
    keys = static_cast<double>(g.gathered_keys()) / static_cast<double>(g.kv_lens.size());
  }
  state.counters["union_keys_per_block"] = keys;
  report_flops(state, s.topk_pairs, kDsaHeads, kDsaDim, kDsaDim);
}
BENCHMARK(BM_Dsa_topk_gathered)->Unit(benchmark::kMillisecond);

// What a caller runs: indexer, top-k, path choice, attention.
void BM_Dsa_end_to_end(benchmark::State& state) {
  const DsaSetup& s = dsa_setup();
  for (auto _ : state) {
    dsa::Result r = dsa::sparse_attention(s.in.q.view(), s.in.k.view(), s.in.v.view(), s.in.scale, s.in.index_q.view(),
                                          s.in.index_k.view(), s.in.index_w.view(), kDsaTopK);
    benchmark::DoNotOptimize(r.attention.out.data());
  }
  report_flops(state, s.topk_pairs, kDsaHeads, kDsaDim, kDsaDim);
}
BENCHMARK(BM_Dsa_end_to_end)->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------
// Kascade.

constexpr index_t kKasTokens = 4096, kKasHeads = 8, kKasGroups = 2, kKasDim = 64;

struct KascadeSetup {
  std::vector<workloads::KascadeLayer> layers;
  kascade::Selection anchor;
  std::vector<index_t> head_map;
  float scale = 0.125f;
  double sparse_pairs = 0, causal_pairs = 0;
};

const KascadeSetup& kascade_setup() {
  static const KascadeSetup s = [] {
    KascadeSetup k;
    k.layers = workloads::kascade_layers(kKasTokens, kKasHeads, kKasGroups, kKasDim, 2, 5);
    k.anchor = kascade::select_anchor(k.layers[0].q.view(), k.layers[0].k.view(), k.scale);
    k.head_map = kascade::calibrate_head_map(
        k.anchor, kascade::pooled_mass(k.layers[1].q.view(), k.layers[1].k.view(), k.scale, 32).view());
    for (index_t t = 0; t < k.anchor.tiling.num_tiles(); ++t) {
      const double rows = static_cast<double>(k.anchor.tiling.rows(t));
      k.sparse_pairs += rows * static_cast<double>(k.anchor.count(t)) + rows * (rows + 1) / 2;
    }
    k.causal_pairs = static_cast<double>(kKasTokens) * static_cast<double>(kKasTokens + 1) / 2.0;
    return k;
  }();
  return s;
}

void BM_Kascade_dense(benchmark::State& state) {
  const KascadeSetup& s = kascade_setup();
  const auto& L = s.layers[1];
  for (auto _ : state) {
    AttentionOutput out = attend(L.q.view(), L.k.view(), L.v.view(), s.scale, CausalMask{});
    benchmark::DoNotOptimize(out.out.data());
  }
  report_flops(state, s.causal_pairs, kKasHeads, kKasDim, kKasDim);
}
BENCHMARK(BM_Kascade_dense)->Unit(benchmark::kMillisecond);

void BM_Kascade_anchor(benchmark::State& state) {
  const KascadeSetup& s = kascade_setup();
  for (auto _ : state) {
    kascade::Selection sel = kascade::select_anchor(s.layers[0].q.view(), s.layers[0].k.view(), s.scale);
    benchmark::DoNotOptimize(sel.indices.data());
  }
  // q.k only (2 Dk per pair); the softmax and pooling are on top.
  report_flops(state, s.causal_pairs, kKasHeads, kKasDim, 0);
}
BENCHMARK(BM_Kascade_anchor)->Unit(benchmark::kMillisecond);

void BM_Kascade_reuse(benchmark::State& state) {
  const KascadeSetup& s = kascade_setup();
  const auto& L = s.layers[1];
  for (auto _ : state) {
    AttentionOutput out =
        kascade::sparse_attention(L.q.view(), kascade::gather(s.anchor, s.head_map, L.k.view(), L.v.view()), s.scale);
    benchmark::DoNotOptimize(out.out.data());
  }
  state.counters["keys_per_query"] = s.sparse_pairs / static_cast<double>(kKasTokens);
  report_flops(state, s.sparse_pairs, kKasHeads, kKasDim, kKasDim);
}
BENCHMARK(BM_Kascade_reuse)->Unit(benchmark::kMillisecond);

}  // namespace

SEQATTN_BENCHMARK_MAIN();
