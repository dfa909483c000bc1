// Mask metadata build costs (issue 3).
//
// 1. BlockMask build with 128x128 tiles for causal, sliding-window (4096
//    left) and 64-document causal masks at 128K and 1M tokens:
//      BM_BlockMaskStructural  build_block_mask: q-block spans skip empty
//                              tiles, full tiles are listed as ranges, partial
//                              tiles get deduplicated bits (O(#q-blocks +
//                              #partial tiles) work, O(#tiles) memory at most)
//      BM_BlockMaskTokenScan   the baseline: every tile classified by scanning
//                              its elements with the predicate
//                              (detail::classify_by_scan), as a dense-mask
//                              builder does. A full scan is 10^11-10^12
//                              predicate calls, so it runs on `sampled_rows`
//                              evenly spread q-block rows and is extrapolated
//                              to all rows: `extrapolated_s`. The
//                              `speedup_vs_structural` counter divides that by
//                              a structural build timed in the same process.
// 2. Top-k mask at t=4096, s=32768, k=2048: scatter into a new tensor (O(t·s)
//    fill + O(t·k) writes; the 512 MiB fresh allocation's page faults
//    dominate), into a reused buffer, and moved between two selections
//    (O(t·k) writes only), vs broadcast-compare (O(t·k·s)), which runs on 8
//    rows and is extrapolated to t=4096 (`extrapolated_s`); it reports
//    `speedup_scatter` against a scatter of the same rows timed in-process.
// 3. What a training step's new segment ids cost per call (issue 23): 16
//    documents of random lengths in 8192 tokens, 4 heads, causal inside each,
//    the CPU engine's 64x64 tiles (backends::Scalar: the planning code every
//    CPU backend shares), forward and backward work:
//      BM_DocumentPlanPerCall   plan_attention of the document mask over the
//                               ids (what a call with new ids planned before)
//      BM_SegmentIdsPerCall     parse the ids (SegmentIds) and refine the
//                               plan of the static causal mask, made once
//                               (what the engine does per call now)
//      BM_SegmentIdsParseOnly   what both pay: drawing and parsing the ids
#include "seqattn/masks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "seqattn/attention/detail/tiled_backward.hpp"
#include "seqattn/backends/scalar.hpp"

#include "support/bench_main.hpp"

namespace {

using namespace seqattn;

constexpr BlockShape kTile{128, 128};

enum Kind : int { kCausal = 0, kWindow = 1, kDocuments = 2 };
const char* kind_name(int k) { return k == kCausal ? "causal" : k == kWindow ? "window4096" : "documents64"; }

// Segment ids of 64 equal documents over n tokens.
struct Documents {
  std::vector<std::int32_t> ids;
  DocumentLayout layout;
  explicit Documents(index_t n) : ids(static_cast<std::size_t>(n)) {
    for (index_t t = 0; t < n; ++t) ids[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(1 + t * 64 / n);
    layout = DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, n}));
  }
};

template <class F>
void with_mask(int kind, index_t n, F&& f) {
  if (kind == kCausal) {
    f(CausalMask{});
  } else if (kind == kWindow) {
    f(SlidingWindowMask{4096, 0});
  } else {
    static std::vector<std::pair<index_t, std::unique_ptr<Documents>>> cache;  // built once per length
    auto it = std::find_if(cache.begin(), cache.end(), [n](const auto& e) { return e.first == n; });
    if (it == cache.end()) {
      cache.emplace_back(n, std::make_unique<Documents>(n));
      it = cache.end() - 1;
    }
    f(document_mask(it->second->layout, CausalMask{}));
  }
}

template <class M>
double seconds_of(M&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_BlockMaskStructural(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const index_t n = state.range(1);
  with_mask(kind, n, [&](const auto& mask) {
    BlockMask bm;
    for (auto _ : state) {
      bm = build_block_mask(mask, RaggedLengths::uniform(1, n, n), 1, kTile);
      benchmark::DoNotOptimize(bm);
    }
    state.counters["tiles"] = static_cast<double>(bm.num_tiles());
    state.counters["full_tiles"] = static_cast<double>(bm.num_full_tiles());
    state.counters["partial_tiles"] = static_cast<double>(bm.num_partial_tiles());
    state.counters["distinct_partial"] = static_cast<double>(bm.num_distinct_partial_tiles());
    state.counters["metadata_bytes"] = static_cast<double>(bm.memory_bytes());
    state.counters["bytes_per_tile"] = static_cast<double>(bm.memory_bytes()) / static_cast<double>(bm.num_tiles());
    state.counters["tiles_per_s"] =
        benchmark::Counter(static_cast<double>(bm.num_tiles()), benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(std::string(kind_name(kind)) + " structural");
  });
}

void BM_BlockMaskTokenScan(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const index_t n = state.range(1);
  const index_t rows = (n + kTile.q - 1) / kTile.q;
  const index_t cols = (n + kTile.kv - 1) / kTile.kv;
  const index_t sampled = n >= (1 << 20) ? 2 : 8;
  with_mask(kind, n, [&](const auto& mask) {
    const MaskContext ctx{0, 0, n, n};
    double scanned_s = 0;
    std::int64_t iterations = 0;
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      index_t non_empty = 0;
      for (index_t i = 0; i < sampled; ++i) {
        const index_t qb = (2 * i + 1) * rows / (2 * sampled);  // evenly spread rows
        for (index_t kb = 0; kb < cols; ++kb) {
          const Tile t{qb * kTile.q, std::min(n, (qb + 1) * kTile.q), kb * kTile.kv, std::min(n, (kb + 1) * kTile.kv)};
          non_empty += detail::classify_by_scan(mask, ctx, t) != TileClass::empty;
        }
      }
      benchmark::DoNotOptimize(non_empty);
      scanned_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++iterations;
    }
    const double extrapolated =
        scanned_s / static_cast<double>(iterations) * static_cast<double>(rows) / static_cast<double>(sampled);
    const double structural = seconds_of(
        [&] { benchmark::DoNotOptimize(build_block_mask(mask, RaggedLengths::uniform(1, n, n), 1, kTile)); });
    state.counters["sampled_rows"] = static_cast<double>(sampled);
    state.counters["total_rows"] = static_cast<double>(rows);
    state.counters["extrapolated_s"] = extrapolated;
    state.counters["structural_s"] = structural;
    state.counters["speedup_vs_structural"] = extrapolated / structural;
    state.SetLabel(std::string(kind_name(kind)) + " token scan, " + std::to_string(sampled) + " of " +
                   std::to_string(rows) + " q-block rows sampled, extrapolated");
  });
}

void block_mask_args(benchmark::internal::Benchmark* b) {
  for (int kind : {kCausal, kWindow, kDocuments}) {
    for (index_t n : {index_t{128} << 10, index_t{1} << 20}) b->Args({kind, n});
  }
}

BENCHMARK(BM_BlockMaskStructural)->Apply(block_mask_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockMaskTokenScan)->Apply(block_mask_args)->Unit(benchmark::kMillisecond)->Iterations(1);

// ---- Top-k: scatter vs broadcast-compare -----------------------------------

constexpr index_t kTopT = 4096, kTopS = 32768, kTopK = 2048;

Tensor<std::int32_t> random_topk(index_t rows) {
  std::mt19937 rng(5);
  Tensor<std::int32_t> idx(Extents{1, rows, kTopK});
  std::vector<std::int32_t> all(static_cast<std::size_t>(kTopS));
  std::iota(all.begin(), all.end(), 0);
  for (index_t r = 0; r < rows; ++r) {
    for (index_t j = 0; j < kTopK; ++j) {  // partial Fisher-Yates: k distinct keys
      std::swap(all[static_cast<std::size_t>(j)],
                all[static_cast<std::size_t>(std::uniform_int_distribution<index_t>(j, kTopS - 1)(rng))]);
      idx(index_t{0}, r, j) = all[static_cast<std::size_t>(j)];
    }
  }
  return idx;
}

void BM_TopKScatter(benchmark::State& state) {
  const index_t rows = state.range(0);
  const Tensor<std::int32_t> idx = random_topk(rows);
  for (auto _ : state) benchmark::DoNotOptimize(topk_scatter_mask(idx.view(), kTopS));
  const double bytes = static_cast<double>(rows * kTopS * 4);
  state.counters["written_GBps"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GBps_1t"] = seqattn::bench::limits().memcpy_gbps_1t;
  state.SetLabel("t=" + std::to_string(rows) + " of 4096 rows, s=32768, k=2048");
}

// The same fill + scatter into a reused buffer (no page faults), and the
// O(t·k) move from one selection to another.
void BM_TopKScatterInto(benchmark::State& state) {
  const index_t rows = state.range(0);
  const Tensor<std::int32_t> idx = random_topk(rows);
  Tensor<float> out(Extents{1, rows, kTopS});
  for (auto _ : state) {
    topk_scatter_mask_into(out.view(), idx.view());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["written_GBps"] =
      benchmark::Counter(static_cast<double>(rows * kTopS * 4), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GBps_1t"] = seqattn::bench::limits().memcpy_gbps_1t;
  state.SetLabel("t=" + std::to_string(rows) + ", s=32768, k=2048, reused buffer");
}

void BM_TopKRescatter(benchmark::State& state) {
  const index_t rows = state.range(0);
  const Tensor<std::int32_t> a = random_topk(rows);
  Tensor<std::int32_t> b = random_topk(rows);
  std::reverse(b.values().begin(), b.values().end());  // a different selection (rows swapped too)
  Tensor<float> out(Extents{1, rows, kTopS});
  topk_scatter_mask_into(out.view(), a.view());
  bool at_a = true;
  for (auto _ : state) {
    topk_rescatter_mask(out.view(), at_a ? a.view() : b.view(), at_a ? b.view() : a.view());
    at_a = !at_a;
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["writes_per_s"] =
      benchmark::Counter(static_cast<double>(2 * rows * kTopK), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("t=" + std::to_string(rows) + ", s=32768, k=2048: O(t*k) writes only");
}

void BM_TopKBroadcastCompare(benchmark::State& state) {
  const index_t rows = state.range(0);
  const Tensor<std::int32_t> idx = random_topk(rows);
  double broadcast = 0;
  for (auto _ : state) {
    broadcast += seconds_of([&] { benchmark::DoNotOptimize(detail::topk_broadcast_mask(idx.view(), kTopS)); });
  }
  broadcast /= static_cast<double>(state.iterations());
  // Scatter on the same rows, timed here for the ratio.
  double scatter = 1e30;
  for (int i = 0; i < 5; ++i) {
    scatter = std::min(scatter, seconds_of([&] { benchmark::DoNotOptimize(topk_scatter_mask(idx.view(), kTopS)); }));
  }
  state.counters["compares_per_s"] =
      benchmark::Counter(static_cast<double>(rows * kTopK * kTopS), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["scatter_s_same_rows"] = scatter;
  state.counters["extrapolated_s"] = broadcast * static_cast<double>(kTopT) / static_cast<double>(rows);
  state.counters["speedup_scatter"] = broadcast / scatter;
  state.SetLabel("t=" + std::to_string(rows) + " of 4096 rows sampled, s=32768, k=2048; extrapolate x" +
                 std::to_string(kTopT / rows));
}

BENCHMARK(BM_TopKScatter)->Arg(64)->Arg(kTopT)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopKScatterInto)->Arg(kTopT)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopKRescatter)->Arg(kTopT)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopKBroadcastCompare)->Arg(8)->Unit(benchmark::kMillisecond)->Iterations(1);

// ---- 3. Segment ids per call ---------------------------------------------------

constexpr index_t kStepTokens = 8192, kStepHeads = 4, kStepDocs = 16;

std::vector<std::int32_t> step_ids(std::mt19937& rng) {
  std::vector<index_t> cuts(static_cast<std::size_t>(kStepTokens / 64 - 1));
  std::iota(cuts.begin(), cuts.end(), 1);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(kStepDocs - 1);
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kStepTokens));
  std::size_t doc = 0;
  for (index_t t = 0; t < kStepTokens; ++t) {
    while (doc < cuts.size() && t >= cuts[doc] * 64) ++doc;
    ids[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(doc + 1);
  }
  return ids;
}

AttentionShape step_shape() {
  AttentionShape shape;
  shape.lengths = RaggedLengths::uniform(1, kStepTokens, kStepTokens);
  shape.heads = shape.kv_heads = kStepHeads;
  shape.dk = shape.dv = 64;
  return shape;
}

void BM_DocumentPlanPerCall(benchmark::State& state) {
  std::mt19937 rng(1);
  const AttentionShape shape = step_shape();
  PlanOptions options;
  options.backward = true;
  for (auto _ : state) {
    const std::vector<std::int32_t> ids = step_ids(rng);
    const DocumentLayout layout =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, kStepTokens}));
    const auto plan = plan_attention<backends::Scalar>(shape, document_mask(layout, CausalMask{}), options, 2);
    benchmark::DoNotOptimize(plan.work().forward.tiles.data());
  }
}

void BM_SegmentIdsPerCall(benchmark::State& state) {
  std::mt19937 rng(1);
  const AttentionShape shape = step_shape();
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Scalar>(shape, CausalMask{}, options, 2);
  using Kernel = backends::Scalar::Kernel;
  for (auto _ : state) {
    const std::vector<std::int32_t> raw = step_ids(rng);
    const SegmentIds ids =
        SegmentIds::from_segment_ids(TensorView<const std::int32_t>(raw.data(), Extents{1, kStepTokens}));
    const detail::SegmentTiles tiles(ids, Kernel::kBlockQ, Kernel::kBlockKv);
    const detail::TiledWork fwd = detail::refine_tiled_work(plan.work().forward, tiles);
    const detail::TiledBackwardWork bwd = detail::refine_backward_work(*plan.work().backward, tiles);
    benchmark::DoNotOptimize(fwd.tiles.data());
    benchmark::DoNotOptimize(bwd.q_refs.data());
  }
}

// What both of the above pay: drawing the ids and parsing them into runs.
void BM_SegmentIdsParseOnly(benchmark::State& state) {
  std::mt19937 rng(1);
  for (auto _ : state) {
    const std::vector<std::int32_t> raw = step_ids(rng);
    const SegmentIds ids =
        SegmentIds::from_segment_ids(TensorView<const std::int32_t>(raw.data(), Extents{1, kStepTokens}));
    benchmark::DoNotOptimize(ids.q_keys(0).data());
  }
}

BENCHMARK(BM_SegmentIdsParseOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DocumentPlanPerCall)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SegmentIdsPerCall)->Unit(benchmark::kMicrosecond);

}  // namespace

SEQATTN_BENCHMARK_MAIN()