// Flash-attention forward throughput, read against this machine's limits.
//
// FLOPs are counted as ggml does, 2 * (Dk + Dv) per (query head, query, key)
// pair, but only over the pairs the mask allows (causal: about half the dense
// count; documents and windows: their allowed pairs), i.e. the work that must
// be done. Each benchmark reports GFLOP/s and its fraction of the fp32 FMA
// peak measured in this binary (bench/support) for the same thread count; decode also reports
// the K/V bytes streamed per second and their fraction of the measured
// streaming-read bandwidth (at start-up, and beside the row: ReadBeside). `tiles` is the fraction of (q-tile, kv-tile)
// pairs the engine visits (the rest are skipped as empty), `computed` the score pairs it computes (full tiles
// whole, partial ones by their row bands where the plan made them; padding rows not counted) over the allowed
// ones. bf16 prefill and
// backward rows also report bf16_peak_frac, against the bf16 dot-product
// peak, where the binary measured one (AVX512_BF16).
#include "seqattn/attention.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <sys/mman.h>
#include <vector>

#include <benchmark/benchmark.h>

#include "seqattn/masks.hpp"

#include "support/bench_main.hpp"
#include "support/random_tensor.hpp"

namespace {

using namespace seqattn;

// Random values in memory backed by transparent huge pages where the kernel
// allows it (THP "madvise" mode): a KV cache of many MiB is allocated that way
// by inference runtimes, and 4 KiB pages would make decode TLB-bound.
template <class T>
class HugeBuffer {
 public:
  HugeBuffer(const Extents& shape, std::uint32_t seed) : shape_(shape) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    bytes_ = (static_cast<std::size_t>(shape.size()) * sizeof(T) + kHuge - 1) / kHuge * kHuge;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes_, MADV_HUGEPAGE);
    data_ = static_cast<T*>(p);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (index_t i = 0; i < shape.size(); ++i) data_[i] = from_float<T>(dist(rng));
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  ~HugeBuffer() { munmap(data_, bytes_); }
  TensorView<const T> view() const { return TensorView<const T>(data_, shape_); }

 private:
  Extents shape_;
  T* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Allowed (q, kv) pairs of one head of one sequence.
// Runs the planned forward pass once per benchmark iteration with manual
// timing; returns the mean seconds per call.
template <class Plan, class Inputs, class T>
double timed_forward_calls(benchmark::State& state, const Plan& plan, const Inputs& in, Tensor<T>& out,
                           Tensor<float>& lse, execution::ThreadPool& pool) {
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    attention_forward(plan, in, out.view(), lse.view(), pool);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  return seconds / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
}

// Decode rows: K/V bytes streamed per second, as a fraction of the
// streaming-read bandwidth measured at start-up (bw_frac) and of the one
// measured with the same thread count right before and right after this
// row's timed calls (read_GBps_now, bw_frac_now): on a shared machine the
// bandwidth moves between minutes, and the second fraction compares the row
// with what the memory gave meanwhile.
struct ReadBeside {
  int threads = 1;
  double before = 0;
  explicit ReadBeside(int threads_) : threads(threads_), before(bench::read_gbps_now(threads_, 0.2)) {}
  void report(benchmark::State& state, double kv_bytes, double per_call) const {
    const double after = bench::read_gbps_now(threads, 0.2);
    const double now = 0.5 * (before + after);
    const auto& lim = bench::limits();
    const double gbps = kv_bytes * 1e-9 / per_call;
    state.counters["GBps"] = gbps;
    state.counters["bw_frac"] = gbps / (threads == 1 ? lim.read_gbps_1t : lim.read_gbps_all);
    state.counters["read_GBps_now"] = now;
    state.counters["bw_frac_now"] = gbps / now;
  }
};

// A bf16 row may run on VDPBF16PS, 64 FLOP per instruction to an fp32 FMA's
// 32: its fraction of the fp32 peak alone overstates how close it comes to
// what its instruction allows.
template <class T>
void report_bf16_peak_frac(benchmark::State& state, double gflops, int threads) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    const auto& lim = bench::limits();
    const double peak = threads == 1 ? lim.bf16_dot_gflops_1t : lim.bf16_dot_gflops_all;
    if (peak > 0) state.counters["bf16_peak_frac"] = gflops / peak;
  }
}

template <class M>
double allowed_pairs(const M& mask, index_t q_len, index_t kv_len) {
  const MaskContext ctx{0, 0, q_len, kv_len};
  double n = 0;
  for (index_t q = 0; q < q_len; ++q) {
    // Every mask here is an interval of keys per row: count by its ends.
    index_t lo = 0;
    while (lo < kv_len && !mask.allowed(ctx, q, lo)) ++lo;
    index_t hi = lo;
    while (hi < kv_len && mask.allowed(ctx, q, hi)) ++hi;
    n += static_cast<double>(hi - lo);
  }
  return n;
}

// Score pairs the forward computes, from the plan's work (full tiles whole,
// partial ones by their row bands where the plan made them, else whole; each
// clipped to the unit's rows, padding not counted, and to the keys), over
// all heads: over allowed_pairs x heads, the overcompute.
template <class Plan>
double computed_pairs(const Plan& plan, index_t kv_len) {
  const detail::TiledWork& w = plan.work().forward;
  constexpr index_t kBkv = backends::Highway::Kernel::kBlockKv;
  double n = 0;
  for (const detail::WorkUnit& u : w.units) {
    for (std::size_t i = u.tiles_begin; i < u.tiles_end; ++i) {
      const detail::TileRef ref = w.tiles[i];
      const index_t cols = std::min(kBkv, kv_len - index_t{ref.kv_block} * kBkv);
      if (ref.tile_id < 0 || w.span_begin.empty()) {
        n += static_cast<double>(u.rows() * cols);
        continue;
      }
      for (const detail::TileSpan& span : w.row_bands(ref.tile_id)) {
        const index_t rows = std::min<index_t>(u.rows(), span.row_end) - span.row_begin;
        const index_t keys = std::min<index_t>(cols, span.col_end) - span.col_begin;
        if (rows > 0 && keys > 0) n += static_cast<double>(rows * keys);
      }
    }
  }
  return n;
}

// K and V stored [B, S, Hkv, D] (BSHD) or, with head_major, [B, Hkv, S, D]
// (a KV cache with one contiguous run of tokens per head) seen as BSHD.
template <class T, class M>
void run_attention(benchmark::State& state, const M& mask, index_t batch, index_t q_len, index_t kv_len, index_t heads,
                   index_t kv_heads, index_t d, int threads, bool head_major = false) {
  const auto q = bench::random_tensor<T>({batch, q_len, heads, d}, 1);
  const Extents kv_shape = head_major ? Extents{batch, kv_heads, kv_len, d} : Extents{batch, kv_len, kv_heads, d};
  const HugeBuffer<T> k(kv_shape, 2), v(kv_shape, 3);
  Tensor<T> out({batch, q_len, heads, d});
  Tensor<float> lse({batch, heads, q_len});
  auto as_bshd = [&](const HugeBuffer<T>& t) {
    const TensorView<const T> view = t.view();
    if (!head_major) return view;
    return TensorView<const T>(view.data(), {batch, kv_len, kv_heads, d},
                               {view.stride(0), view.stride(2), view.stride(1), view.stride(3)});
  };
  const AttentionInputs<T> in{q.view(), as_bshd(k), as_bshd(v)};
  // Planned once, outside the timed loop: what a runtime does per model.
  const auto plan = plan_attention<backends::Highway>(shape_of(in), mask, {}, threads);
  const BlockMask& bm = plan.block_mask();
  execution::ThreadPool pool(threads);
  const bool decode = q_len <= 4;  // bandwidth-bound on streaming K and V once per KV head
  std::optional<ReadBeside> read;
  if (decode) read.emplace(threads);
  const double per_call = timed_forward_calls(state, plan, in, out, lse, pool);
  const double allowed = allowed_pairs(mask, q_len, kv_len);
  const double gflops = 2.0 * static_cast<double>(batch * heads * (d + d)) * allowed * 1e-9 / per_call;
  const auto& lim = bench::limits();
  state.counters["GFLOPs"] = gflops;
  state.counters["peak_frac"] = gflops / (threads == 1 ? lim.fma_gflops_1t : lim.fma_gflops_all);
  if (!decode) report_bf16_peak_frac<T>(state, gflops, threads);  // decode is bound by memory, not by either peak
  const double visited = static_cast<double>(bm.num_full_tiles() + bm.num_partial_tiles());
  state.counters["tiles"] = visited / static_cast<double>(bm.num_tiles());
  if (batch == 1) state.counters["computed"] = computed_pairs(plan, kv_len) / (allowed * static_cast<double>(heads));
  if (decode) read->report(state, static_cast<double>(batch * kv_len * kv_heads * 2 * d) * sizeof(T), per_call);
  state.SetLabel(std::string(backends::Highway::target()) + (std::is_same_v<T, float> ? " f32" : " bf16"));
}

// Prefill, causal, d = 128, 8 heads; args: sequence length, threads.
template <class T>
void BM_PrefillCausal(benchmark::State& state) {
  const index_t s = state.range(0);
  run_attention<T>(state, CausalMask{}, 1, s, s, 8, 8, 128, static_cast<int>(state.range(1)));
}
BENCHMARK_TEMPLATE(BM_PrefillCausal, float)
    ->ArgsProduct({{1024, 4096, 16384}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_TEMPLATE(BM_PrefillCausal, bfloat16)
    ->ArgsProduct({{4096, 16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// The same with K/V stored head-major ([B, Hkv, S, D]): one head's rows
// contiguous. The forward packs BSHD K/V one head at a time where that pays
// (attention/detail/packed_kv.hpp): both layouts should run alike.
template <class T>
void BM_PrefillCausalHeadMajor(benchmark::State& state) {
  const index_t s = state.range(0);
  run_attention<T>(state, CausalMask{}, 1, s, s, 8, 8, 128, static_cast<int>(state.range(1)), true);
}
BENCHMARK_TEMPLATE(BM_PrefillCausalHeadMajor, float)
    ->ArgsProduct({{4096, 16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_TEMPLATE(BM_PrefillCausalHeadMajor, bfloat16)
    ->ArgsProduct({{4096, 16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// 16 documents of unequal length packed into 8192 tokens; compare its time
// with causal 8k (same tokens, no documents): the ratio should follow `tiles`.
void BM_Documents8k(benchmark::State& state) {
  // Lengths of the first 15 documents; the 16th takes the rest of the 8192 tokens.
  const index_t lengths[15] = {300, 700, 512, 256, 1024, 128, 640, 384, 512, 896, 200, 440, 512, 600, 400};
  std::vector<std::int32_t> ids;
  for (std::int32_t doc = 0; doc < 15; ++doc) ids.insert(ids.end(), static_cast<std::size_t>(lengths[doc]), doc + 1);
  ids.resize(8192, 16);
  const DocumentLayout layout = DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), {1, 8192}));
  run_attention<float>(state, document_mask(layout, CausalMask{}), 1, 8192, 8192, 8, 8, 128,
                       static_cast<int>(state.range(0)));
}
BENCHMARK(BM_Documents8k)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

void BM_Causal8k(benchmark::State& state) {
  run_attention<float>(state, CausalMask{}, 1, 8192, 8192, 8, 8, 128, static_cast<int>(state.range(0)));
}
BENCHMARK(BM_Causal8k)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// Sliding window of 1024 keys over 16k tokens.
void BM_SlidingWindow16k(benchmark::State& state) {
  run_attention<float>(state, SlidingWindowMask{1023, 0}, 1, 16384, 16384, 8, 8, 128, static_cast<int>(state.range(0)));
}
BENCHMARK(BM_SlidingWindow16k)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// Decode: 1 query, 32k keys, 32 query heads over 4 KV heads (GQA 8), d = 128.
template <class T>
void BM_DecodeGqa8(benchmark::State& state) {
  run_attention<T>(state, FullMask{}, 1, 1, 32768, 32, 4, 128, static_cast<int>(state.range(0)));
}
BENCHMARK_TEMPLATE(BM_DecodeGqa8, float)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// The same with a head-major KV cache ([B, Hkv, S, D] seen through strides).
template <class T>
void BM_DecodeGqa8HeadMajor(benchmark::State& state) {
  run_attention<T>(state, FullMask{}, 1, 1, 32768, 32, 4, 128, static_cast<int>(state.range(0)), true);
}
BENCHMARK_TEMPLATE(BM_DecodeGqa8HeadMajor, float)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_TEMPLATE(BM_DecodeGqa8, bfloat16)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// BM_DecodeGqa8 over 4k keys: K/V of 16 MiB in fp32, 8 MiB in bf16, read
// again every call, so from the last-level cache where that holds them (32
// MiB on the Zen 5 VMs of the comments here): decode's rate where DRAM does
// not bound it, to read beside the DRAM rows' GBps.
template <class T>
void BM_DecodeGqa8InCache(benchmark::State& state) {
  run_attention<T>(state, FullMask{}, 1, 1, 4096, 32, 4, 128, static_cast<int>(state.range(0)));
}
BENCHMARK_TEMPLATE(BM_DecodeGqa8InCache, float)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_TEMPLATE(BM_DecodeGqa8InCache, bfloat16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// Decode, 8 query heads over 1 KV head (GQA 8/1, MQA-like), d = 128.
template <class T>
void BM_DecodeGqa8x1(benchmark::State& state) {
  run_attention<T>(state, FullMask{}, 1, 1, 32768, 8, 1, 128, static_cast<int>(state.range(0)));
}
BENCHMARK_TEMPLATE(BM_DecodeGqa8x1, float)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_TEMPLATE(BM_DecodeGqa8x1, bfloat16)->Arg(2)->Unit(benchmark::kMillisecond)->UseManualTime();

// Decode on a paged K/V cache (vLLM layout [pages, page_size, Hkv, D], pages
// in a random order): 1 query, 32k keys, heads / kv_heads, d = 128; args:
// page size, threads. Compare with the contiguous BM_DecodeGqa8 figures.
template <class T>
void run_paged_decode(benchmark::State& state, index_t heads, index_t kv_heads) {
  constexpr index_t kKv = 32768, kDim = 128;
  const index_t page_size = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const index_t pages = (kKv + page_size - 1) / page_size;
  const auto q = bench::random_tensor<T>({1, 1, heads, kDim}, 1);
  const HugeBuffer<T> k({pages, page_size, kv_heads, kDim}, 2), v({pages, page_size, kv_heads, kDim}, 3);
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
  for (index_t i = 0; i < pages; ++i) table[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  const std::int32_t kv_len = kKv;
  const PagedAttentionInputs<T> in{q.view(),
                                   {k.view(), v.view(), TensorView<const std::int32_t>(table.data(), {1, pages}),
                                    TensorView<const std::int32_t>(&kv_len, {1})}};
  Tensor<T> out({1, 1, heads, kDim});
  Tensor<float> lse({1, heads, 1});
  const auto plan = plan_attention<backends::Highway>(shape_of(in), FullMask{}, {}, threads);
  execution::ThreadPool pool(threads);
  const ReadBeside read(threads);
  const double per_call = timed_forward_calls(state, plan, in, out, lse, pool);
  read.report(state, static_cast<double>(kKv * kv_heads * 2 * kDim) * sizeof(T), per_call);
  state.SetLabel(std::string(backends::Highway::target()) + (std::is_same_v<T, float> ? " f32" : " bf16") + " paged");
}
template <class T>
void BM_PagedDecodeGqa8(benchmark::State& state) {
  run_paged_decode<T>(state, 32, 4);
}
template <class T>
void BM_PagedDecodeGqa8x1(benchmark::State& state) {
  run_paged_decode<T>(state, 8, 1);
}
BENCHMARK_TEMPLATE(BM_PagedDecodeGqa8, float)
    ->ArgsProduct({{16, 256}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_TEMPLATE(BM_PagedDecodeGqa8, bfloat16)->Args({16, 2})->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_TEMPLATE(BM_PagedDecodeGqa8x1, float)->Args({16, 2})->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK_TEMPLATE(BM_PagedDecodeGqa8x1, bfloat16)->Args({16, 2})->Unit(benchmark::kMillisecond)->UseManualTime();

// Backward pass, causal, d = 128, 8 heads; args: sequence length, threads.
// Reports the backward time over the forward time (FlashAttention-2's goal
// is about 2.5x) and GFLOP/s counting 2.5x the forward's FLOPs, as
// FlashAttention does, against the FMA peak measured in this binary.
template <class T>
void BM_BackwardCausal(benchmark::State& state) {
  const index_t s = state.range(0), heads = 8, d = 128;
  const int threads = static_cast<int>(state.range(1));
  const auto q = bench::random_tensor<T>({1, s, heads, d}, 1);
  const auto k = bench::random_tensor<T>({1, s, heads, d}, 2);
  const auto v = bench::random_tensor<T>({1, s, heads, d}, 3);
  const auto dout = bench::random_tensor<T>({1, s, heads, d}, 4);
  Tensor<T> out({1, s, heads, d}), dq({1, s, heads, d}), dk({1, s, heads, d}), dv({1, s, heads, d});
  Tensor<float> lse({1, heads, s});
  const AttentionInputs<T> in{q.view(), k.view(), v.view()};
  PlanOptions options;
  options.backward = true;
  const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, options, threads);
  execution::ThreadPool pool(threads);
  double forward_s = 0, backward_s = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    attention_forward(plan, in, out.view(), lse.view(), pool);
    const auto t1 = std::chrono::steady_clock::now();
    attention_backward(plan, in, out.view(), lse.view(), dout.view(), dq.view(), dk.view(), dv.view(), pool);
    const auto t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(dq.data());
    forward_s += std::chrono::duration<double>(t1 - t0).count();
    backward_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t1).count());
  }
  const auto n = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  const double forward_flops = 2.0 * static_cast<double>(heads * (d + d)) * allowed_pairs(CausalMask{}, s, s);
  const double gflops = 2.5 * forward_flops * 1e-9 / (backward_s / n);
  const auto& lim = bench::limits();
  state.counters["fwd_ms"] = forward_s / n * 1e3;
  state.counters["bwd_over_fwd"] = backward_s / forward_s;
  state.counters["GFLOPs"] = gflops;
  state.counters["peak_frac"] = gflops / (threads == 1 ? lim.fma_gflops_1t : lim.fma_gflops_all);
  report_bf16_peak_frac<T>(state, gflops, threads);
  state.SetLabel(std::string(backends::Highway::target()) + (std::is_same_v<T, float> ? " f32" : " bf16"));
}
BENCHMARK_TEMPLATE(BM_BackwardCausal, float)
    ->ArgsProduct({{4096, 16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(2);
BENCHMARK_TEMPLATE(BM_BackwardCausal, bfloat16)
    ->ArgsProduct({{4096, 16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(2);

// Eight layers of one forward pass share a mask: with one AttentionPlan the
// BlockMask and the work partition are built once (arg 1), with the one-call
// API once per layer (arg 0). 16 documents in 4096 tokens, 8 heads, d = 128,
// 2 threads; `plan_ms` is the time of one plan_attention alone.
void BM_EightLayers(benchmark::State& state) {
  const bool reuse = state.range(0) != 0;
  constexpr index_t kTokens = 4096, kHeads = 8, kDim = 128, kLayers = 8;
  std::vector<std::int32_t> ids(kTokens);
  for (index_t i = 0; i < kTokens; ++i)
    ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(1 + i * 16 / kTokens);
  const DocumentLayout layout =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), {1, kTokens}));
  const auto mask = document_mask(layout, CausalMask{});
  const auto q = bench::random_tensor<float>({1, kTokens, kHeads, kDim}, 1);
  const auto k = bench::random_tensor<float>({1, kTokens, kHeads, kDim}, 2);
  const auto v = bench::random_tensor<float>({1, kTokens, kHeads, kDim}, 3);
  Tensor<float> out({1, kTokens, kHeads, kDim});
  Tensor<float> lse({1, kHeads, kTokens});
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  execution::ThreadPool pool(2);
  const auto plan_start = std::chrono::steady_clock::now();
  const auto plan = plan_attention<backends::Highway>(shape_of(in), mask, {}, 2);
  const double plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - plan_start).count();
  for (auto _ : state) {
    for (index_t layer = 0; layer < kLayers; ++layer) {
      if (reuse) {
        attention_forward(plan, in, out.view(), lse.view(), pool);
      } else {
        attention_forward(in, mask, out.view(), lse.view(), {}, pool);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["plan_ms"] = plan_ms;
  state.SetLabel(reuse ? "one plan" : "plan per layer");
}
BENCHMARK(BM_EightLayers)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

SEQATTN_BENCHMARK_MAIN()
