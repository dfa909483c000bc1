// Sequence descriptors from segment ids + positions over 1M tokens (8 rows of
// 131072), as a streaming pass: bytes of input the derivation must read per
// second, beside this machine's memcpy (read + write) and streaming-read
// bandwidth measured in the same run. Cross-attention reads every id and
// position of q and kv once; self-attention reads only the ids (every segment
// attends whole, positions cannot trim it). The natural bound is read
// bandwidth.
//
// 1M tokens of ids + positions are 8 MB, which stays in a 32 MB L3 between
// iterations, while the machine limits are measured far beyond the LLC; the
// */64 variants (8M tokens, 64 MB) read from DRAM and compare like for like.
// Rates use wall-clock time, like the machine limits, so that a shared
// (loaded) machine skews both alike.
#include "seqattn/descriptors.hpp"

#include <cstdint>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "support/bench_main.hpp"

namespace {

using seqattn::AttnMaskType;
using seqattn::Extents;
using seqattn::index_t;
using seqattn::Int32View;
using seqattn::SeqLayout;

constexpr index_t kTokensPerRow = 131072;  // 8 rows = 1Mi tokens

struct Inputs {
  std::vector<std::int32_t> ids, pos;
  int max_segments = 1;
};

// Rows packed with segments of mean length `mean_len` (uniform in
// [mean/2, 3*mean/2]), a short padding gap after one in four, positions
// 0, 1, ... within each segment plus `pos_shift`.
Inputs make_inputs(index_t rows, index_t mean_len, int pos_shift, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<index_t> seg_len(mean_len / 2 + 1, mean_len + mean_len / 2);
  std::uniform_int_distribution<int> coin(0, 3);
  Inputs in;
  in.ids.assign(static_cast<std::size_t>(rows * kTokensPerRow), 0);
  in.pos.assign(in.ids.size(), 0);
  for (index_t r = 0; r < rows; ++r) {
    index_t t = 0;
    int id = 0;
    while (t < kTokensPerRow) {
      const index_t len = std::min(seg_len(rng), kTokensPerRow - t);
      ++id;
      for (index_t k = 0; k < len; ++k) {
        in.ids[static_cast<std::size_t>(r * kTokensPerRow + t + k)] = id;
        in.pos[static_cast<std::size_t>(r * kTokensPerRow + t + k)] = static_cast<std::int32_t>(k) + pos_shift;
      }
      t += len;
      if (coin(rng) == 0) t += 3;  // padding gap
    }
    in.max_segments = std::max(in.max_segments, id);
  }
  return in;
}

void report(benchmark::State& state, index_t tokens, double bytes_per_iteration) {
  const auto& limits = seqattn::bench::limits();
  const double gb = bytes_per_iteration * static_cast<double>(state.iterations()) * 1e-9;
  state.counters["GB/s"] = benchmark::Counter(gb, benchmark::Counter::kIsRate);
  state.counters["frac_memcpy"] = benchmark::Counter(gb / limits.memcpy_gbps_1t, benchmark::Counter::kIsRate);
  state.counters["frac_read"] = benchmark::Counter(gb / limits.read_gbps_1t, benchmark::Counter::kIsRate);
  state.counters["Mtokens/s"] = benchmark::Counter(
      static_cast<double>(tokens) * static_cast<double>(state.iterations()) * 1e-6, benchmark::Counter::kIsRate);
}

// Self-attention THD: q and kv share ids and positions; only the ids are read.
void BM_ThdSelfAttention(benchmark::State& state) {
  const index_t rows = state.range(1);
  const Inputs in = make_inputs(rows, state.range(0), 0, 1);
  const Int32View ids(in.ids.data(), Extents{rows, kTokensPerRow});
  const Int32View pos(in.pos.data(), Extents{rows, kTokensPerRow});
  for (auto _ : state) {
    auto d = seqattn::derive_seqlens_and_offsets(ids, pos, AttnMaskType::padding_causal, SeqLayout::thd, {},
                                                 in.max_segments);
    benchmark::DoNotOptimize(d.seqlens.q.data());
  }
  // Self-attention needs the ids only (every segment attends whole).
  report(state, rows * kTokensPerRow, static_cast<double>(in.ids.size() * sizeof(std::int32_t)));
  state.counters["segments/row"] = static_cast<double>(in.max_segments);
}
// Args: mean segment length, rows of 131072 tokens.
BENCHMARK(BM_ThdSelfAttention)
    ->ArgNames({"seg_len", "rows"})
    ->Args({16, 8})
    ->Args({256, 8})
    ->Args({4096, 8})
    ->Args({256, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Cross-attention THD with distinct q and kv buffers whose positions differ,
// so the causal mask trims every segment (the second, partial pass runs).
void BM_ThdCrossAttentionTrimmed(benchmark::State& state) {
  const index_t rows = state.range(1);
  const Inputs q = make_inputs(rows, state.range(0), 0, 2);
  Inputs kv = q;  // same segmentation, keys start one position later
  for (std::size_t i = 0; i < kv.pos.size(); ++i) kv.pos[i] += kv.ids[i] != 0;
  const Extents shape{rows, kTokensPerRow};
  for (auto _ : state) {
    auto d = seqattn::derive_seqlens_and_offsets({Int32View(q.ids.data(), shape), Int32View(kv.ids.data(), shape)},
                                                 {Int32View(q.pos.data(), shape), Int32View(kv.pos.data(), shape)},
                                                 AttnMaskType::padding_causal, SeqLayout::thd, {}, q.max_segments);
    benchmark::DoNotOptimize(d.seqlens.kv.data());
  }
  report(state, rows * kTokensPerRow, 4.0 * static_cast<double>(q.ids.size() * sizeof(std::int32_t)));
}
BENCHMARK(BM_ThdCrossAttentionTrimmed)
    ->ArgNames({"seg_len", "rows"})
    ->Args({256, 8})
    ->Args({4096, 8})
    ->Args({256, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// BSHD padding: one right-padded sequence per row; only ids are read.
void BM_BshdPadding(benchmark::State& state) {
  const index_t rows = state.range(0);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows * kTokensPerRow), 0), pos(kTokensPerRow, 0);
  for (index_t r = 0; r < rows; ++r) {
    for (index_t t = 0; t < kTokensPerRow - 1000 * (r % 100); ++t)
      ids[static_cast<std::size_t>(r * kTokensPerRow + t)] = 1;
  }
  const Int32View id_view(ids.data(), Extents{rows, kTokensPerRow});
  const Int32View pos_view(pos.data(), Extents{kTokensPerRow});
  for (auto _ : state) {
    auto d = seqattn::derive_seqlens_and_offsets(id_view, pos_view, AttnMaskType::padding, SeqLayout::bshd);
    benchmark::DoNotOptimize(d.seqlens.q.data());
  }
  report(state, rows * kTokensPerRow, static_cast<double>(ids.size() * sizeof(std::int32_t)));
}
BENCHMARK(BM_BshdPadding)->ArgName("rows")->Arg(8)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

SEQATTN_BENCHMARK_MAIN();
