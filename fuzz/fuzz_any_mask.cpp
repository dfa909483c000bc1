// libFuzzer target: AnyMask trees (fuzz_masks.hpp: every mask kind under &,
// |, ~, DocumentMask, PerHeadMask, copied, assigned, moved from) checked tile
// by tile (classify against a scan, kv_span, row_bits), through
// build_block_mask with and without tile bits (fuzz::check_block_mask), and
// to_dense against allowed element by element.
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_masks.hpp"

using namespace seqattn;

namespace {

constexpr index_t kMaxCells = 6000;  // batch * heads * q * kv

void check_dense(const AnyMask& mask, const RaggedLengths& lengths, index_t heads) {
  const Tensor<std::uint8_t> dense = to_dense(mask, lengths, heads);
  FUZZ_CHECK(dense.rank() == 4 && dense.extent(0) == lengths.batch() && dense.extent(1) == heads,
             "to_dense has rank %d, extents %lld x %lld", dense.rank(), (long long)dense.extent(0),
             (long long)dense.extent(1));
  for (index_t b = 0; b < lengths.batch(); ++b) {
    const index_t q_len = lengths.q[static_cast<std::size_t>(b)], kv_len = lengths.kv[static_cast<std::size_t>(b)];
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, q_len, kv_len};
      for (index_t q = 0; q < dense.extent(2); ++q) {
        for (index_t kv = 0; kv < dense.extent(3); ++kv) {
          const bool inside = q < q_len && kv < kv_len;
          const bool want = inside && mask.allowed(ctx, q, kv);
          FUZZ_CHECK(dense(b, h, q, kv) == (want ? 1 : 0), "to_dense b=%lld h=%lld q=%lld kv=%lld is %d, want %d",
                     (long long)b, (long long)h, (long long)q, (long long)kv, int(dense(b, h, q, kv)), int(want));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const index_t heads = fdp.ConsumeIntegralInRange<int>(1, 3);
  const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 3);
  const RaggedLengths lengths = seqattn::fuzz::fuzz_lengths(fdp, batch, heads, 90, kMaxCells);
  BlockShape block;
  block.q = fdp.ConsumeIntegralInRange<int>(1, 70);
  block.kv = fdp.ConsumeIntegralInRange<int>(1, 70);
  const bool bits_first = fdp.ConsumeBool();
  seqattn::fuzz::guarded([&] {
    seqattn::fuzz::MaskFactory factory(fdp, lengths, heads);
    const AnyMask mask = factory.make();
    detail::check_mask(mask, lengths, heads);
    seqattn::fuzz::check_classes(mask, lengths, heads, block, mask.invariant_over_heads());
    for (const bool bits : {bits_first, !bits_first}) {
      BlockMaskOptions options;
      options.store_tile_bits = bits;
      const BlockMask bm = build_block_mask(mask, lengths, heads, block, options);
      FUZZ_CHECK(bm.heads() == heads || (bm.heads() == 1 && mask.invariant_over_heads()),
                 "BlockMask stores %lld heads for %lld (invariant %d)", (long long)bm.heads(), (long long)heads,
                 int(mask.invariant_over_heads()));
      seqattn::fuzz::check_block_mask(mask, bm, heads, bits);
      // The transpose lists the same tiles from the key side.
      const BlockMask t = bm.transposed();
      for (index_t b = 0; b < bm.batch(); ++b) {
        for (index_t h = 0; h < heads; ++h) {
          const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)}, tctx{b, h, bm.kv_len(b), bm.q_len(b)};
          for (index_t q = 0; q < ctx.q_len; ++q) {
            for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
              FUZZ_CHECK(t.allowed(tctx, kv, q) == mask.allowed(ctx, q, kv),
                         "transposed().allowed(b=%lld h=%lld kv=%lld q=%lld) differs", (long long)b, (long long)h,
                         (long long)kv, (long long)q);
            }
          }
        }
      }
    }
    check_dense(mask, lengths, heads);
  });
  return 0;
}
