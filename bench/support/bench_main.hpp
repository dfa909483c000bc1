// main() for seqattn benchmarks: measures the machine's limits first, prints
// them (and the Highway target) and publishes them as benchmark context, so
// each benchmark can report its throughput as a fraction of the limit.
#pragma once

#include <string>

#include <benchmark/benchmark.h>

#include "support/machine_limits.hpp"

namespace seqattn::bench {

inline MachineLimits& limits() {
  static MachineLimits m;
  return m;
}

inline int run_benchmarks(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  limits() = measure_machine_limits();
  print_machine_limits(limits());
  const MachineLimits& m = limits();
  benchmark::AddCustomContext("highway_target", m.simd_target);
  benchmark::AddCustomContext("fma_peak_gflops_1t", std::to_string(m.fma_gflops_1t));
  benchmark::AddCustomContext("fma_peak_gflops_all", std::to_string(m.fma_gflops_all));
  // Absent, not 0, where the binary has no VDPBF16PS: nothing was measured.
  if (m.bf16_dot_gflops_1t > 0) {
    benchmark::AddCustomContext("bf16_dot_peak_gflops_1t", std::to_string(m.bf16_dot_gflops_1t));
    benchmark::AddCustomContext("bf16_dot_peak_gflops_all", std::to_string(m.bf16_dot_gflops_all));
  }
  benchmark::AddCustomContext("memcpy_gbps_1t", std::to_string(m.memcpy_gbps_1t));
  benchmark::AddCustomContext("memcpy_gbps_all", std::to_string(m.memcpy_gbps_all));
  benchmark::AddCustomContext("read_gbps_1t", std::to_string(m.read_gbps_1t));
  benchmark::AddCustomContext("read_gbps_all", std::to_string(m.read_gbps_all));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace seqattn::bench

#define SEQATTN_BENCHMARK_MAIN() \
  int main(int argc, char** argv) { return ::seqattn::bench::run_benchmarks(argc, argv); }
