// bf16 prefill on the CPU: the widening path against the bf16 pair-dot path
// (backends/highway_bf16-inl.h), for this binary's Highway target.
//
//   BM_Fp32FmaRate     fp32 FMA throughput, 12 independent chains, 1 thread
//   BM_PairDotRate     bf16 pair-dot throughput the same way: VDPBF16PS where
//                      the binary is built with AVX512_BF16 (label "native"),
//                      else the emulation (label "emulated"); 4 FLOP per lane
//   BM_TileQK/path/conv  one in-cache 128 x 64 tile of QK^T, d = 128, 1 thread
//   BM_TilePV/path/conv  one in-cache 128 x 64 tile of P.V, d = 128
//        path 0: widening (fp32 FlashKernel), 1: pair dot; (P.V only) their
//        unguarded forms, which skip the NaN policy's scans where the softmax
//        saw no tiny weight or V is known finite: 2 pair dot, 3 widening;
//        conv 1 includes the per-tile conversions each path does in the engine (widen: bf16 K or
//        V -> fp32; pair dot: none for K, read in place; for P.V, pack V and
//        round/pack P), conv 0 the kernel only
//   BM_AmxRate         TDPBF16PS throughput, 1 thread (where the CPU has AMX)
//   BM_TileAmx/step    one in-cache tile through the AMX tiles' steps, each alone
//   BM_Probe           the automatic choice's one-time probe: seconds per tile
//                      of each path and the choice (1 = pair dot); dec_*: the
//                      decode probe (4 tiles of 8 rows x 64 keys)
//   BM_PrefillCausal/s/threads/path   end to end, causal, d = 128, 8 heads,
//        1, 2 and all hardware threads;
//        path 0: widen, 1: pair dot, 2: automatic, 3: fp32 inputs (baseline)
// GFLOPs counts 2 FLOP per MAC. Run on a quiet machine, e.g.
//   seqattn_bf16_dot --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "seqattn/attention.hpp"
#include "seqattn/backends/highway.hpp"
#include "seqattn/masks.hpp"

#include "support/bench_main.hpp"
#include "support/random_tensor.hpp"

namespace {

using namespace seqattn;
namespace hn = hwy::HWY_NAMESPACE;
using Flash = seqattn::HWY_NAMESPACE::FlashKernel;
using Dot = seqattn::HWY_NAMESPACE::Bf16DotKernel;

constexpr index_t kBq = Flash::kBlockQ, kBkv = Flash::kBlockKv, kD = 128;

std::string target_label() {
  return std::string(backends::Highway::target()) + (Dot::kNative ? " native" : " emulated");
}

// ---- peak rates ------------------------------------------------------------------

// 12 chains, each from a different value (see bench/support/machine_limits.hpp).
template <class Step>
HWY_NOINLINE double rate_gflops(benchmark::State& state, double flop_per_op, Step step) {
  const Flash::D d;
  Flash::V a[12];
  for (int i = 0; i < 12; ++i) a[i] = hn::Set(d, 0.1f + 0.01f * static_cast<float>(i));
  constexpr long kInner = 1 << 14;
  double seconds = 0, ops = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < kInner; ++i) {
      HWY_UNROLL(12)
      for (int c = 0; c < 12; ++c) a[c] = step(a[c]);
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ops += 12.0 * kInner;
  }
  Flash::V sum = a[0];
  for (int i = 1; i < 12; ++i) sum = hn::Add(sum, a[i]);
  benchmark::DoNotOptimize(hn::GetLane(sum));
  return ops * flop_per_op / seconds * 1e-9;
}

void BM_Fp32FmaRate(benchmark::State& state) {
  const Flash::D d;
  const auto x = hn::Set(d, 0.999999f), y = hn::Set(d, 1e-7f);
  const double lanes = static_cast<double>(hn::Lanes(d));
  state.counters["GFLOPs"] = rate_gflops(state, 2.0 * lanes, [&](Flash::V a) { return hn::MulAdd(a, x, y); });
  state.SetLabel(target_label());
}
BENCHMARK(BM_Fp32FmaRate);

void BM_PairDotRate(benchmark::State& state) {
  const Dot::DU du;
  // Pairs of bf16 (1 - 2^-8, 2^-20): acc grows by 2^-19 a step, so the chains
  // (through the accumulator) neither overflow nor go denormal.
  const auto x = hn::Set(du, 0x3F7F3F7Fu), y = hn::Set(du, 0x35803580u);
  const double lanes = static_cast<double>(hn::Lanes(du));
  state.counters["GFLOPs"] =
      rate_gflops(state, 4.0 * lanes, [&](Flash::V a) { return Dot::PairDot<Dot::kNative>(a, x, y); });
  state.SetLabel(target_label());
}
BENCHMARK(BM_PairDotRate);

// ---- one in-cache tile -----------------------------------------------------------

struct Tile {
  Dot::ProbeTile t;
  detail::AlignedFloats vbuf_f32{kBkv * kD};
  Tile() {
    for (index_t j = 0; j < kBkv; ++j) Flash::to_f32(t.v.data() + j * kD, kD, vbuf_f32.get() + j * kD);
    for (index_t j = 0; j < kBkv; ++j) Flash::to_f32(t.k.data() + j * kD, kD, t.kbuf.get() + j * kD);
    std::fill_n(t.st.get(), kBkv * kBq, 0.01f);
  }
};

constexpr double kTileFlop = 2.0 * kBq * kBkv * kD;

void BM_TileQK(benchmark::State& state) {
  const bool native = state.range(0) == 1, conv = state.range(1) == 1;
  Tile x;
  for (auto _ : state) {
    if (native) {
      Dot::scores<Dot::kNative>(x.t.qt2.get(), kBq, kD, x.t.krows.data(), kBkv, 1.0f, x.t.st.get());
    } else {
      if (conv) {
        for (index_t j = 0; j < kBkv; ++j) Flash::to_f32(x.t.k.data() + j * kD, kD, x.t.kbuf.get() + j * kD);
      }
      Flash::scores(x.t.qt.get(), kBq, kD, x.t.kbuf.get(), kD, kBkv, x.t.st.get());
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(kTileFlop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(target_label() + (native ? " pair-dot" : " widen") + (conv ? " +conv" : ""));
}
BENCHMARK(BM_TileQK)->ArgsProduct({{0, 1}, {0, 1}});

void BM_TilePV(benchmark::State& state) {
  const bool native = state.range(0) == 1 || state.range(0) == 2, unguarded = state.range(0) >= 2,
             conv = state.range(1) == 1;
  Tile x;
  if (native) {
    Dot::pack_p(x.t.st.get(), kBkv, kBq);
    Dot::pack_v([&](index_t j) { return x.t.v.data() + j * kD; }, 1, kBkv, kD, kD, x.t.vbuf.get());
  }
  for (auto _ : state) {
    if (native) {
      if (conv) {
        std::fill_n(x.t.st.get(), kBkv * kBq, 0.01f);  // P as fp32 again (scores would write it)
        Dot::pack_p(x.t.st.get(), kBkv, kBq);
        Dot::pack_v([&](index_t j) { return x.t.v.data() + j * kD; }, 1, kBkv, kD, kD, x.t.vbuf.get());
      }
      if (unguarded) {
        Dot::accumulate_pv_unguarded<Dot::kNative>(x.t.st.get(), kBq, kBkv / 2, x.t.vbuf.get(), kD, x.t.alpha.get(),
                                                   x.t.o.get());
      } else {
        Dot::accumulate_pv<Dot::kNative>(x.t.st.get(), kBq, kBkv / 2, x.t.vbuf.get(), kD, x.t.alpha.get(), x.t.o.get());
      }
    } else {
      if (conv) {
        for (index_t j = 0; j < kBkv; ++j) Flash::to_f32(x.t.v.data() + j * kD, kD, x.vbuf_f32.get() + j * kD);
      }
      if (unguarded) {
        Flash::accumulate_pv_unguarded(x.t.st.get(), kBq, kBkv, x.vbuf_f32.get(), kD, kD, x.t.alpha.get(), x.t.o.get());
      } else {
        Flash::accumulate_pv(x.t.st.get(), kBq, kBkv, x.vbuf_f32.get(), kD, kD, x.t.alpha.get(), x.t.o.get());
      }
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(kTileFlop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(target_label() + (native ? " pair-dot" : " widen") + (unguarded ? ", unguarded" : "") +
                 (conv ? (native ? " +conv (incl. refilling P)" : " +conv") : ""));
}
BENCHMARK(BM_TilePV)->ArgsProduct({{0, 1}, {0, 1}})->Args({2, 0})->Args({3, 0});

void BM_Probe(benchmark::State& state) {
  Dot::ProbeSeconds s;
  for (auto _ : state) s = Dot::probe_seconds();
  state.counters["widen_us"] = s.widen * 1e6;
  state.counters["pairdot_us"] = s.pairs < 1e29 ? s.pairs * 1e6 : -1;  // -1: no instruction
  state.counters["amx_us"] = s.amx < 1e29 ? s.amx * 1e6 : -1;          // -1: no AMX
  // The decode probe: 4 tiles of 8 rows x 64 keys.
  state.counters["dec_widen_us"] = s.decode_widen * 1e6;
  state.counters["dec_pairdot_us"] = s.decode_pairs < 1e29 ? s.decode_pairs * 1e6 : -1;
  state.counters["dec_amx_us"] = s.decode_amx < 1e29 ? s.decode_amx * 1e6 : -1;
  state.SetLabel(target_label());
}
BENCHMARK(BM_Probe)->Iterations(3);

// ---- AMX (where the CPU has it) ------------------------------------------------------

// TDPBF16PS throughput: four independent 16 x 16 C tiles from two A and two B
// tiles loaded once, as the 2 x 2 register block of backends/amx.hpp without
// its loads; 16 * 16 * 32 * 2 FLOP per instruction. -1 where AMX is absent.
#if SEQATTN_HAS_AMX
__attribute__((target("amx-tile,amx-bf16"))) double amx_rate_gflops(long steps) {
  const amx::detail::TileConfig& config = amx::detail::config();
  alignas(64) static std::uint16_t operand[4 * 16 * 32];
  alignas(64) static float c[16 * 16];
  std::fill(std::begin(operand), std::end(operand), std::uint16_t{0x3C00});  // 2^-7: sums stay small
  amx::detail::load_config(config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand + 512, 64);
  _tile_loadd(6, operand + 1024, 64);
  _tile_loadd(7, operand + 1536, 64);
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < steps; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  _tile_release();
  benchmark::DoNotOptimize(c[0]);
  return 4.0 * static_cast<double>(steps) * 16 * 16 * 32 * 2 / seconds * 1e-9;
}
#endif

void BM_AmxRate(benchmark::State& state) {
  double best = -1;
  for (auto _ : state) {
#if SEQATTN_HAS_AMX
    if (amx::available()) best = std::max(best, amx_rate_gflops(1 << 16));
#endif
  }
  state.counters["GFLOPs"] = best;  // best of the iterations, 1 thread
  state.SetLabel(best < 0 ? "no AMX" : "TDPBF16PS");
}
BENCHMARK(BM_AmxRate)->Iterations(5);

// One in-cache 128 x 64 tile, d = 128, 1 thread, through AmxTiles' steps (backends/highway_bf16-inl.h), each alone:
//   0 K.Qt2 (AMX), 1 online softmax (fp32 weights for bf16), 2 P rounded and transposed into Pq rows
//   (amx::bf16_rows), 3 V into pairs (pack_v), 4 O scaled by alpha, 5 Pq.Vp into O (AMX), 6 the whole tile but the
//   softmax (the probe's amx tile: 0 + 2 + 3 + 4 + 5 and the scale of the scores).
void BM_TileAmx(benchmark::State& state) {
  const int step = static_cast<int>(state.range(0));
  if (!amx::available()) {
    for (auto _ : state) {
    }
    state.SetLabel("no AMX");
    return;
  }
  Dot::ProbeTile t;
  auto* pq = reinterpret_cast<std::uint16_t*>(t.kbuf.get());
  const auto* qt2 = reinterpret_cast<const std::uint32_t*>(t.qt2.get());
  const auto* vp = reinterpret_cast<const std::uint32_t*>(t.vbuf.get());
  detail::AlignedFloats m(kBq), l(kBq), alpha(kBq);
  std::fill_n(t.st.get(), kBkv * kBq, 0.01f);
  for (auto _ : state) {
    switch (step) {
      case 0:
        amx::key_query_scores(t.krows[0], kD * 2, kBkv, qt2, kBq * sizeof(float), kBq, kD, t.st.get(),
                              kBq * sizeof(float));
        break;
      case 1:
        std::fill_n(m.get(), kBq, 0.0f);  // the same weights every time: none underflows
        std::fill_n(l.get(), kBq, 1.0f);
        benchmark::DoNotOptimize(Flash::online_softmax_to_bf16(t.st.get(), kBkv, kBq, m.get(), l.get(), alpha.get()));
        break;
      case 2:
        amx::bf16_rows(t.st.get(), 1, kBq, kBq, kBkv, kBkv, kBq, pq);
        break;
      case 3:
        Dot::pack_v([&](index_t j) { return t.v.data() + j * kD; }, 1, kBkv, kD, kD, t.vbuf.get());
        break;
      case 4:
        Dot::scale_o(t.o.get(), kBq, kD, t.alpha.get());
        break;
      case 5:
        amx::accumulate_pv(pq, kBkv * 2, kBq, kBkv, vp, kD * sizeof(float), kD, t.o.get(), kD * sizeof(float));
        break;
      default:
        t.amx();
        break;
    }
    benchmark::ClobberMemory();
  }
  if (step == 0 || step == 5 || step == 6) {
    const double flop = step == 6 ? 2 * kTileFlop : kTileFlop;
    state.counters["GFLOPs"] = benchmark::Counter(flop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  }
  static constexpr const char* kSteps[] = {"K.Qt2", "softmax", "pack P", "pack V", "scale O", "P.V", "tile"};
  state.SetLabel(kSteps[step]);
}
BENCHMARK(BM_TileAmx)->DenseRange(0, 6);

// ---- end to end --------------------------------------------------------------------

template <class T>
double prefill_seconds(benchmark::State& state, index_t s, int threads) {
  constexpr index_t heads = 8;
  const Extents shape = detail::make_extents({1, s, heads, kD});
  const auto q = bench::random_tensor<T>(shape, 1), k = bench::random_tensor<T>(shape, 2),
             v = bench::random_tensor<T>(shape, 3);
  Tensor<T> out(shape);
  Tensor<float> lse(detail::make_extents({1, heads, s}));
  const AttentionInputs<T> in{q.view(), k.view(), v.view()};
  const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, {}, threads);
  execution::ThreadPool pool(threads);
  attention_forward(plan, in, out.view(), lse.view(), pool);  // warm-up (and the probe, once)
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    attention_forward(plan, in, out.view(), lse.view(), pool);
    benchmark::DoNotOptimize(out.data());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(dt);
    seconds += dt;
  }
  return seconds / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
}

void BM_PrefillCausal(benchmark::State& state) {
  const index_t s = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto path = state.range(2);
  const Bf16DotPath saved = bf16_dot_path();
  double per_call = 0;
  std::string label = target_label();
  if (path == 3) {
    per_call = prefill_seconds<float>(state, s, threads);
    label += " f32";
  } else {
    set_bf16_dot_path(static_cast<Bf16DotPath>(path));
    const std::uint64_t before = bf16_native_tasks(), amx_before = bf16_amx_tasks();
    per_call = prefill_seconds<bfloat16>(state, s, threads);
    label += path == 0 ? " bf16 widen" : path == 1 ? " bf16 pair-dot" : " bf16 auto";
    if (path == 2) {
      label += bf16_amx_tasks() > amx_before  ? " (chose amx)"
               : bf16_native_tasks() > before ? " (chose pair-dot)"
                                              : " (chose widen)";
    }
    set_bf16_dot_path(saved);
  }
  // Causal: s (s + 1) / 2 allowed pairs per head, 2 (Dk + Dv) FLOP each.
  const double flop = 2.0 * 8 * (kD + kD) * (static_cast<double>(s) * static_cast<double>(s + 1) / 2);
  const double gflops = flop * 1e-9 / per_call;
  const auto& lim = bench::limits();
  state.counters["GFLOPs"] = gflops;
  state.counters["peak_frac"] = gflops / (threads == 1 ? lim.fma_gflops_1t : lim.fma_gflops_all);
  state.SetLabel(label);
}
// s in {1k, 4k} x 1, 2 and all hardware threads x the four paths, the paths
// of one (s, threads) next to each other.
void prefill_args(benchmark::internal::Benchmark* b) {
  std::vector<std::int64_t> threads{1, 2, std::max<std::int64_t>(1, std::thread::hardware_concurrency())};
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  for (const std::int64_t s : {1024, 4096}) {
    for (const std::int64_t t : threads) {
      for (const std::int64_t path : {3, 0, 1, 2}) b->Args({s, t, path});
    }
  }
}
BENCHMARK(BM_PrefillCausal)->Apply(prefill_args)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

SEQATTN_BENCHMARK_MAIN()
