// libFuzzer target: TopKLayout::from_indices over fuzzed indices (-1 padding,
// duplicates and out-of-range values included) and MultiItemLayout from fuzzed
// items; TopKMask / MultiItemMask (alone or composed with a causal mask)
// through build_block_mask, checked like fuzz_block_mask.
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <vector>

#include "fuzz_common.hpp"

using namespace seqattn;

namespace {

constexpr index_t kMaxCells = 8000;

template <class M>
void run(FuzzedDataProvider& fdp, const M& mask, const RaggedLengths& lengths) {
  index_t heads = fdp.ConsumeIntegralInRange<int>(1, 3);
  index_t cells = 0;
  for (std::size_t i = 0; i < lengths.q.size(); ++i) cells += lengths.q[i] * lengths.kv[i];
  if (cells * heads > kMaxCells) heads = 1;  // keeps the element-level checks cheap
  BlockShape block;
  block.q = fdp.ConsumeIntegralInRange<int>(1, 130);
  block.kv = fdp.ConsumeIntegralInRange<int>(1, 130);
  for (const bool bits : {true, false}) {
    seqattn::fuzz::guarded([&] {
      BlockMaskOptions opts;
      opts.store_tile_bits = bits;
      const BlockMask bm = build_block_mask(mask, lengths, heads, block, opts);
      seqattn::fuzz::check_block_mask(mask, bm, heads, bits);
    });
  }
}

template <class M>
void run_composed(FuzzedDataProvider& fdp, const M& mask, const RaggedLengths& lengths) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      run(fdp, mask, lengths);
      break;
    case 1:
      run(fdp, mask & CausalMask{fdp.ConsumeBool() ? Alignment::bottom_right : Alignment::top_left}, lengths);
      break;
    case 2:
      run(fdp, ~mask, lengths);
      break;
    default: {
      SlidingWindowMask w;
      w.left = fdp.ConsumeIntegralInRange<int>(-1, 20);
      w.right = fdp.ConsumeIntegralInRange<int>(-1, 20);
      run(fdp, mask | w, lengths);
    }
  }
}

void fuzz_topk(FuzzedDataProvider& fdp) {
  const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 2);
  const index_t t = fdp.ConsumeIntegralInRange<int>(1, 40);
  const index_t k = fdp.ConsumeIntegralInRange<int>(1, 8);
  const index_t kv_len = fdp.ConsumeIntegralInRange<int>(0, 100);
  const bool extra_dim = fdp.ConsumeIntegralInRange<int>(0, 7) == 0;
  std::vector<std::int32_t> idx(static_cast<std::size_t>(batch * t * k));
  for (auto& v : idx) {
    const int kind = fdp.ConsumeIntegralInRange<int>(0, 15);
    if (kind == 0) {
      v = -1;  // padding
    } else if (kind == 1) {
      v = fdp.ConsumeIntegral<std::int32_t>();  // anything: mostly rejected
    } else if (kind == 2) {
      v = static_cast<std::int32_t>(kv_len);  // one past the end: rejected
    } else {
      v = kv_len > 0 ? fdp.ConsumeIntegralInRange<std::int32_t>(0, static_cast<std::int32_t>(kv_len) - 1) : -1;
    }
  }
  // kv_len of the mask context: the layout's, sometimes another (rejected by check()).
  const bool other_lengths = fdp.ConsumeIntegralInRange<int>(0, 15) == 0;
  seqattn::fuzz::guarded([&] {
    const Extents shape = extra_dim ? Extents{1, batch, t, k} : Extents{batch, t, k};
    const TopKLayout layout = TopKLayout::from_indices(TensorView<const std::int32_t>(idx.data(), shape), kv_len);
    const TopKMask mask = topk_mask(layout);
    RaggedLengths lengths = layout.lengths();
    if (other_lengths) lengths.kv[0] += 1;
    run_composed(fdp, mask, lengths);
  });
}

void fuzz_multi_item(FuzzedDataProvider& fdp) {
  const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 3);
  MultiItemLayout layout;
  seqattn::fuzz::guarded([&] {
    for (index_t b = 0; b < batch; ++b) {
      switch (fdp.ConsumeIntegralInRange<int>(0, 2)) {
        case 0: {
          // Tokens with delimiter 1; must end on a delimiter (else rejected).
          std::vector<std::int32_t> tokens(fdp.ConsumeIntegralInRange<std::size_t>(0, 100));
          for (auto& tok : tokens) tok = fdp.ConsumeIntegralInRange<int>(0, 5) == 0 ? 1 : 0;
          if (!tokens.empty() && fdp.ConsumeIntegralInRange<int>(0, 7) != 0) tokens.back() = 1;
          layout.add_packed(tokens, 1);
          break;
        }
        case 1: {
          const index_t query = fdp.ConsumeIntegralInRange<int>(-1, 40);
          std::vector<index_t> items(fdp.ConsumeIntegralInRange<std::size_t>(0, 6));
          for (auto& it : items) it = fdp.ConsumeIntegralInRange<int>(-1, 20);
          layout.add_items(query, items);
          break;
        }
        default:
          layout.add_causal(fdp.ConsumeIntegralInRange<int>(-1, 100));
      }
    }
    const MultiItemMask mask = multi_item_mask(layout);
    run_composed(fdp, mask, layout.lengths());
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  if (fdp.ConsumeIntegralInRange<int>(0, 3) != 0) {
    fuzz_topk(fdp);
  } else {
    fuzz_multi_item(fdp);
  }
  return 0;
}
