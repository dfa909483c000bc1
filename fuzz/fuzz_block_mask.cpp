// libFuzzer target: build_block_mask over compositions of the structural and
// document masks (&, |, ~, PerHeadMask), with and without tile bits, checked
// tile by tile against classify_by_scan, bit by bit against mask.allowed, and
// BlockMask::allowed against mask.allowed.
#include <algorithm>
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <vector>

#include "fuzz_common.hpp"

using namespace seqattn;

namespace {

constexpr index_t kMaxCells = 8000;  // sum over the batch of q_len * kv_len * heads: keeps a run fast

Alignment alignment(FuzzedDataProvider& fdp) {
  return fdp.ConsumeBool() ? Alignment::bottom_right : Alignment::top_left;
}

SlidingWindowMask window(FuzzedDataProvider& fdp) {
  SlidingWindowMask w;
  w.left = fdp.ConsumeIntegralInRange<int>(-2, 70);
  w.right = fdp.ConsumeIntegralInRange<int>(-2, 70);
  w.alignment = alignment(fdp);
  return w;
}

// Shrinks the lengths until the element-level checks stay cheap.
void cap_cells(RaggedLengths& l, index_t heads) {
  for (;;) {
    index_t cells = 0;
    for (std::size_t b = 0; b < l.q.size(); ++b) cells += l.q[b] * l.kv[b] * heads;
    if (cells <= kMaxCells) return;
    for (std::size_t b = 0; b < l.q.size(); ++b) {
      if (l.q[b] >= l.kv[b]) {
        l.q[b] /= 2;
      } else {
        l.kv[b] /= 2;
      }
    }
  }
}

// Segment ids (batch, len): runs of ids 0..4 with fuzzed lengths.
std::vector<std::int32_t> fuzz_ids(FuzzedDataProvider& fdp, index_t batch, index_t len) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * len), 0);
  for (index_t b = 0; b < batch; ++b) {
    index_t t = 0;
    std::int32_t next = 1;
    while (t < len) {
      const index_t run = fdp.ConsumeIntegralInRange<int>(1, 40);
      const std::uint8_t kind = fdp.ConsumeIntegralInRange<std::uint8_t>(0, 7);
      // Mostly increasing ids with padding between; sometimes any small id (may repeat, then rejected).
      const std::int32_t id = kind == 0 ? 0 : kind == 1 ? fdp.ConsumeIntegralInRange<std::int32_t>(0, 4) : next++;
      for (index_t k = 0; k < run && t < len; ++k, ++t) ids[static_cast<std::size_t>(b * len + t)] = id;
    }
  }
  return ids;
}

std::vector<std::int32_t> fuzz_pos(FuzzedDataProvider& fdp, const std::vector<std::int32_t>& ids, index_t len) {
  std::vector<std::int32_t> pos(ids.size(), 0);
  const bool arbitrary = fdp.ConsumeIntegralInRange<int>(0, 3) == 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (arbitrary) {
      pos[i] = fdp.ConsumeIntegralInRange<std::int32_t>(-1, 8);
    } else {
      const bool start = i % static_cast<std::size_t>(len) == 0 || ids[i] != ids[i - 1];
      pos[i] = start ? 0 : pos[i - 1] + 1;
    }
  }
  return pos;
}

template <class M>
void build_and_check(const M& mask, const RaggedLengths& lengths, index_t heads, BlockShape block, bool bits) {
  BlockMaskOptions opts;
  opts.store_tile_bits = bits;
  const BlockMask bm = build_block_mask(mask, lengths, heads, block, opts);
  seqattn::fuzz::check_block_mask(mask, bm, heads, bits);
}

template <class M>
void run(FuzzedDataProvider& fdp, const M& mask, const RaggedLengths& lengths, index_t heads) {
  BlockShape block;
  block.q = fdp.ConsumeIntegralInRange<int>(1, 130);
  block.kv = fdp.ConsumeIntegralInRange<int>(1, 130);
  const bool bits_first = fdp.ConsumeBool();
  seqattn::fuzz::guarded([&] { build_and_check(mask, lengths, heads, block, bits_first); });
  seqattn::fuzz::guarded([&] { build_and_check(mask, lengths, heads, block, !bits_first); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const int which = fdp.ConsumeIntegralInRange<int>(0, 13);
  const index_t heads = fdp.ConsumeIntegralInRange<int>(1, 3);
  const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 3);
  RaggedLengths lengths;
  for (index_t b = 0; b < batch; ++b) {
    lengths.q.push_back(fdp.ConsumeIntegralInRange<int>(0, 200));
    lengths.kv.push_back(fdp.ConsumeBool() ? lengths.q.back() : fdp.ConsumeIntegralInRange<int>(0, 200));
  }
  cap_cells(lengths, heads);

  const auto document = [&](auto inner_of) {
    // Uniform lengths from the first sequence, ids (and maybe positions) over them.
    const index_t q_len = lengths.q[0], kv_len = lengths.kv[0];
    const bool self = q_len == kv_len && fdp.ConsumeBool();
    std::vector<std::int32_t> q_ids = fuzz_ids(fdp, batch, q_len);
    std::vector<std::int32_t> kv_ids = self ? q_ids : fuzz_ids(fdp, batch, kv_len);
    const bool with_pos = fdp.ConsumeBool();
    std::vector<std::int32_t> q_pos = fuzz_pos(fdp, q_ids, std::max<index_t>(q_len, 1));
    std::vector<std::int32_t> kv_pos = self ? q_pos : fuzz_pos(fdp, kv_ids, std::max<index_t>(kv_len, 1));
    seqattn::fuzz::guarded([&] {
      const TensorView<const std::int32_t> qi(q_ids.data(), Extents{batch, q_len});
      const TensorView<const std::int32_t> ki(kv_ids.data(), Extents{batch, kv_len});
      const TensorView<const std::int32_t> qp(q_pos.data(), Extents{batch, q_len});
      const TensorView<const std::int32_t> kp(kv_pos.data(), Extents{batch, kv_len});
      const DocumentLayout layout =
          self ? DocumentLayout::from_segment_ids(qi, with_pos ? qp : TensorView<const std::int32_t>{})
               : DocumentLayout::from_segment_ids(qi, ki, with_pos ? qp : TensorView<const std::int32_t>{},
                                                  with_pos ? kp : TensorView<const std::int32_t>{});
      run(fdp, inner_of(layout), layout.lengths(), heads);
    });
  };

  switch (which) {
    case 0:
      run(fdp, CausalMask{}, lengths, heads);
      break;
    case 1:
      run(fdp, CausalMask{Alignment::bottom_right}, lengths, heads);
      break;
    case 2:
      run(fdp, window(fdp), lengths, heads);
      break;
    case 3: {
      ChunkedCausalMask m;
      m.chunk = fdp.ConsumeIntegralInRange<int>(0, 70);  // 0 is rejected by check()
      m.alignment = alignment(fdp);
      run(fdp, m, lengths, heads);
      break;
    }
    case 4: {
      PrefixLMMask m;
      std::vector<std::int32_t> prefixes;
      if (fdp.ConsumeBool()) {
        m.prefix = fdp.ConsumeIntegralInRange<int>(-1, 220);
      } else {
        const index_t n = fdp.ConsumeIntegralInRange<int>(0, 4);  // != batch is rejected
        for (index_t i = 0; i < n; ++i) prefixes.push_back(fdp.ConsumeIntegralInRange<std::int32_t>(-1, 220));
        m.prefix_lengths = prefixes;
      }
      m.alignment = alignment(fdp);
      run(fdp, m, lengths, heads);
      break;
    }
    case 5:
      run(fdp, FullMask{}, lengths, heads);
      break;
    case 6: {
      const CausalMask inner{alignment(fdp)};
      document([&](const DocumentLayout& l) { return document_mask(l, inner); });
      break;
    }
    case 7: {
      const SlidingWindowMask inner = window(fdp);
      document([&](const DocumentLayout& l) { return document_mask(l, inner); });
      break;
    }
    case 8: {
      const CausalMask c{alignment(fdp)};
      run(fdp, c & ~window(fdp), lengths, heads);
      break;
    }
    case 9: {
      PrefixLMMask p;
      p.prefix = fdp.ConsumeIntegralInRange<int>(0, 100);
      run(fdp, window(fdp) | p, lengths, heads);
      break;
    }
    case 10: {
      ChunkedCausalMask c;
      c.chunk = fdp.ConsumeIntegralInRange<int>(1, 70);
      c.alignment = alignment(fdp);
      run(fdp, ~(CausalMask{alignment(fdp)} & ~c) | (window(fdp) & FullMask{}), lengths, heads);
      break;
    }
    case 11: {
      // One window per head; a wrong count is rejected by check().
      std::vector<SlidingWindowMask> per_head;
      const index_t n = fdp.ConsumeIntegralInRange<int>(0, 10) == 0 ? heads + 1 : heads;
      for (index_t h = 0; h < n; ++h) per_head.push_back(window(fdp));
      run(fdp, PerHeadMask<SlidingWindowMask>{per_head}, lengths, heads);
      break;
    }
    case 12: {
      const SlidingWindowMask w = window(fdp);
      document([&](const DocumentLayout& l) { return document_mask(l, CausalMask{}) & ~w; });
      break;
    }
    default: {
      const CausalMask c{alignment(fdp)};
      document([&](const DocumentLayout& l) { return document_mask(l) | c; });
      break;
    }
  }
  return 0;
}
