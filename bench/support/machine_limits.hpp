// The machine's own limits, measured in the benchmark binary itself, so every
// throughput figure can be read as a fraction of what this machine can do:
//   - fp32 FMA peak: independent MulAdd chains on the Highway target this
//     binary was compiled for (its vector width is the kernels' width too);
//   - bf16 dot-product peak, where the binary is compiled for AVX512_BF16:
//     independent VDPBF16PS chains, the instruction of the bf16 pair-dot
//     kernels (64 FLOP per instruction to an fp32 FMA's 32), so bf16 rows can
//     be read against what their instruction allows;
//   - memcpy bandwidth: bytes read + bytes written per second on buffers far
//     larger than the last-level cache;
//   - streaming read bandwidth: bytes read per second (what decode is bound by).
// Each is taken with 1 thread and with one thread per CPU this process may run
// on (its affinity mask: `taskset -c 0,1` measures, and compares against, two
// cores of a larger machine).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <hwy/highway.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace seqattn::bench {

struct MachineLimits {
  const char* simd_target = "";
  int threads = 1;
  double fma_gflops_1t = 0;   // fp32, one thread
  double fma_gflops_all = 0;  // fp32, all threads
  // bf16 pairs into fp32 (VDPBF16PS), 2 FLOP per bf16 MAC; 0 where the binary
  // is not compiled for AVX512_BF16 (its kernels cannot use the instruction).
  double bf16_dot_gflops_1t = 0;
  double bf16_dot_gflops_all = 0;
  double memcpy_gbps_1t = 0;  // (read + write) bytes / s
  double memcpy_gbps_all = 0;
  double read_gbps_1t = 0;  // read bytes / s
  double read_gbps_all = 0;
};

namespace detail {

namespace hn = hwy::HWY_NAMESPACE;

// Twelve independent accumulator chains cover FMA latency (4 cycles) times
// two FMA pipes with room to spare, so the loop is throughput-bound. Each
// chain starts from a different value: chains that start equal compute equal
// values, and GCC merges them into one latency-bound chain (which made an
// earlier version of this function report 2.5x the real peak).
// Never inlined: inlined into a thread lambda, GCC 12 spilled the accumulators
// to the stack and the two-thread figure fell below the one-thread one.
HWY_NOINLINE inline double fma_gflops_one_thread(double seconds) {
  const hn::ScalableTag<float> d;
  auto a0 = hn::Set(d, 0.10f), a1 = hn::Set(d, 0.11f), a2 = hn::Set(d, 0.12f), a3 = hn::Set(d, 0.13f);
  auto a4 = hn::Set(d, 0.14f), a5 = hn::Set(d, 0.15f), a6 = hn::Set(d, 0.16f), a7 = hn::Set(d, 0.17f);
  auto a8 = hn::Set(d, 0.18f), a9 = hn::Set(d, 0.19f), a10 = hn::Set(d, 0.20f), a11 = hn::Set(d, 0.21f);
  const auto x = hn::Set(d, 0.999999f), y = hn::Set(d, 1e-7f);
  constexpr long kInner = 1 << 16;
  constexpr double kChains = 12.0;
  long iterations = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (long i = 0; i < kInner; ++i) {
      a0 = hn::MulAdd(a0, x, y);
      a1 = hn::MulAdd(a1, x, y);
      a2 = hn::MulAdd(a2, x, y);
      a3 = hn::MulAdd(a3, x, y);
      a4 = hn::MulAdd(a4, x, y);
      a5 = hn::MulAdd(a5, x, y);
      a6 = hn::MulAdd(a6, x, y);
      a7 = hn::MulAdd(a7, x, y);
      a8 = hn::MulAdd(a8, x, y);
      a9 = hn::MulAdd(a9, x, y);
      a10 = hn::MulAdd(a10, x, y);
      a11 = hn::MulAdd(a11, x, y);
    }
    iterations += kInner;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  const auto sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));
  volatile float sink = hn::GetLane(sum);
  (void)sink;
  return 2.0 * kChains * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations) / elapsed * 1e-9;
}

#if defined(__AVX512BF16__)
// The fp32 loop's method with VDPBF16PS. 16 chains, each from a different
// value, keep the loop throughput-bound on a core with two pipes for it and a
// latency of up to 8 cycles. Each step adds (1 - 2^-8) * 2^-20 twice to every
// lane: the accumulators neither overflow nor go denormal.
HWY_NOINLINE inline double bf16_dot_gflops_one_thread(double seconds) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.1f + 0.01f * static_cast<float>(c));
  const auto x = (__m512bh)_mm512_set1_epi32(0x3F7F3F7F), y = (__m512bh)_mm512_set1_epi32(0x35803580);
  constexpr long kInner = 1 << 16;
  long iterations = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (long i = 0; i < kInner; ++i) {
      HWY_UNROLL(16)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
    }
    iterations += kInner;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  // Stored, not _mm512_reduce_add_ps: GCC 12 warns (-Werror=uninitialized)
  // inside that intrinsic's extract in some TUs built with -march=native.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  for (int i = 1; i < 16; ++i) sink = sink + lanes[i];
  // 32 bf16 MACs per instruction, 2 FLOP each.
  return 64.0 * kChains * static_cast<double>(iterations) / elapsed * 1e-9;
}
#endif

HWY_NOINLINE inline double read_gbps_one_thread(const float* data, std::size_t n, double seconds) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  std::size_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (std::size_t i = 0; i + 4 * lanes <= n; i += 4 * lanes) {
      s0 = hn::Add(s0, hn::LoadU(d, data + i));
      s1 = hn::Add(s1, hn::LoadU(d, data + i + lanes));
      s2 = hn::Add(s2, hn::LoadU(d, data + i + 2 * lanes));
      s3 = hn::Add(s3, hn::LoadU(d, data + i + 3 * lanes));
    }
    bytes += n * sizeof(float);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  volatile float sink = hn::GetLane(s0 + s1 + s2 + s3);
  (void)sink;
  return static_cast<double>(bytes) / elapsed * 1e-9;
}

HWY_NOINLINE inline double memcpy_gbps_one_thread(char* dst, const char* src, std::size_t n, double seconds) {
  std::size_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    std::memcpy(dst, src, n);
    bytes += 2 * n;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return static_cast<double>(bytes) / elapsed * 1e-9;
}

// Runs fn(thread_index) on `threads` threads at once and sums the results.
template <class Fn>
double run_on_threads(int threads, Fn fn) {
  std::vector<double> results(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) {
      }
      results[static_cast<std::size_t>(t)] = fn(t);
    });
  }
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double r : results) sum += r;
  return sum;
}

// CPUs in this process's affinity mask (hardware_concurrency counts every CPU
// of the machine, also those taskset or a cgroup excludes).
inline int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace detail

// Measures all limits; takes about 2.5 s.
inline MachineLimits measure_machine_limits() {
  MachineLimits m;
  m.simd_target = hwy::TargetName(HWY_STATIC_TARGET);
  m.threads = detail::usable_cpus();
  m.fma_gflops_1t = detail::fma_gflops_one_thread(0.3);
  m.fma_gflops_all = detail::run_on_threads(m.threads, [](int) { return detail::fma_gflops_one_thread(0.3); });
#if defined(__AVX512BF16__)
  m.bf16_dot_gflops_1t = detail::bf16_dot_gflops_one_thread(0.3);
  m.bf16_dot_gflops_all =
      detail::run_on_threads(m.threads, [](int) { return detail::bf16_dot_gflops_one_thread(0.3); });
#endif

  constexpr std::size_t kBytes = std::size_t{256} << 20;  // per thread; far beyond any LLC share
  std::vector<std::vector<char>> src(static_cast<std::size_t>(m.threads)), dst(src.size());
  for (std::size_t t = 0; t < src.size(); ++t) {
    src[t].assign(kBytes, static_cast<char>(t + 1));
    dst[t].assign(kBytes, 0);
  }
  m.memcpy_gbps_1t = detail::memcpy_gbps_one_thread(dst[0].data(), src[0].data(), kBytes, 0.3);
  m.memcpy_gbps_all = detail::run_on_threads(m.threads, [&](int t) {
    auto i = static_cast<std::size_t>(t);
    return detail::memcpy_gbps_one_thread(dst[i].data(), src[i].data(), kBytes, 0.3);
  });
  auto as_floats = [&](int t) { return reinterpret_cast<const float*>(src[static_cast<std::size_t>(t)].data()); };
  m.read_gbps_1t = detail::read_gbps_one_thread(as_floats(0), kBytes / sizeof(float), 0.3);
  m.read_gbps_all = detail::run_on_threads(
      m.threads, [&](int t) { return detail::read_gbps_one_thread(as_floats(t), kBytes / sizeof(float), 0.3); });
  return m;
}

// Streaming-read bandwidth of `threads` threads measured now, over
// `seconds`, on buffers of 256 MiB per thread that are allocated (and
// touched) once per process and kept: the limit a memory-bound benchmark row
// is compared with right beside its own timing, which on a shared machine
// moves from one minute to the next (measure_machine_limits runs once, at
// start-up).
inline double read_gbps_now(int threads, double seconds) {
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  static std::vector<std::vector<float>> buffers;
  while (buffers.size() < static_cast<std::size_t>(threads)) buffers.emplace_back(kBytes / sizeof(float), 1.0f);
  if (threads == 1) return detail::read_gbps_one_thread(buffers[0].data(), kBytes / sizeof(float), seconds);
  return detail::run_on_threads(threads, [&](int t) {
    return detail::read_gbps_one_thread(buffers[static_cast<std::size_t>(t)].data(), kBytes / sizeof(float), seconds);
  });
}

inline void print_machine_limits(const MachineLimits& m) {
  std::fprintf(stderr,
               "machine limits (Highway target %s, %d threads):\n"
               "  fp32 FMA peak   %8.1f GFLOP/s (1 thread)  %8.1f GFLOP/s (%d threads)\n",
               m.simd_target, m.threads, m.fma_gflops_1t, m.fma_gflops_all, m.threads);
  if (m.bf16_dot_gflops_1t > 0) {
    std::fprintf(stderr, "  bf16 dot peak   %8.1f GFLOP/s (1 thread)  %8.1f GFLOP/s (%d threads)\n",
                 m.bf16_dot_gflops_1t, m.bf16_dot_gflops_all, m.threads);
  }
  std::fprintf(stderr,
               "  memcpy (r+w)    %8.1f GB/s    (1 thread)  %8.1f GB/s    (%d threads)\n"
               "  streaming read  %8.1f GB/s    (1 thread)  %8.1f GB/s    (%d threads)\n",
               m.memcpy_gbps_1t, m.memcpy_gbps_all, m.threads, m.read_gbps_1t, m.read_gbps_all, m.threads);
}

}  // namespace seqattn::bench
