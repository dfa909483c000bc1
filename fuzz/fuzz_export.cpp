// libFuzzer target: the exports of a BlockMask against the BlockMask itself.
//   - flex (masks/flex_export.hpp): to_flex_block_mask's index arrays decoded
//     back into tile classes (which flex takes from content: a short edge tile
//     is never full) and checked as permutations; flex_tile_table decoded back
//     element by element;
//   - Splash (backends/splash.hpp): MaskInfo's block_mask, data_next,
//     mask_next and partial_mask_blocks decoded back (fwd and dK/dV, head and
//     q-sequence shards, unshrunk), and the shrunk / in-kernel forms run;
// over BlockMasks built from AnyMask trees (fuzz_masks.hpp) and BlockMasks
// assembled by hand with BlockMask::Builder from random, possibly invalid
// rows: those must be rejected with seqattn::invalid_argument or be
// consistent, and never make an export read or write out of bounds.
#include <algorithm>
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <limits>
#include <vector>

#include "seqattn/backends/splash.hpp"

#include "fuzz_masks.hpp"

using namespace seqattn;

namespace {

constexpr index_t kMaxCells = 6000;

// The class flex and Splash give a tile: from its content after padding with
// `false` to the full block (0 empty, 1 partial, 2 full).
int content_class(const BlockMask& bm, index_t b, index_t h, index_t qb, index_t kb) {
  const Tile t = bm.tile(b, qb, kb);
  const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)};
  index_t ones = 0;
  for (index_t q = t.q_begin; q < t.q_end; ++q) {
    for (index_t kv = t.kv_begin; kv < t.kv_end; ++kv) ones += bm.allowed(ctx, q, kv) ? 1 : 0;
  }
  return ones == 0 ? 0 : ones == bm.block_shape().q * bm.block_shape().kv ? 2 : 1;
}

// Row of `n` indices: the first `count` listed ones ascending, then the rest
// ascending, together a permutation of [0, n). Returns which are listed.
std::vector<bool> decode_row(const std::int32_t* row, index_t n, std::int32_t count, const char* what) {
  FUZZ_CHECK(count >= 0 && count <= n, "%s: count %d outside [0, %lld]", what, count, (long long)n);
  std::vector<bool> listed(static_cast<std::size_t>(n), false), seen(static_cast<std::size_t>(n), false);
  for (index_t i = 0; i < n; ++i) {
    FUZZ_CHECK(row[i] >= 0 && row[i] < n, "%s: index %d outside [0, %lld)", what, row[i], (long long)n);
    FUZZ_CHECK(!seen[static_cast<std::size_t>(row[i])], "%s: index %d twice", what, row[i]);
    seen[static_cast<std::size_t>(row[i])] = true;
    if (i > 0 && i != count) FUZZ_CHECK(row[i - 1] < row[i], "%s: not ascending at %lld", what, (long long)i);
    if (i < count) listed[static_cast<std::size_t>(row[i])] = true;
  }
  return listed;
}

void check_flex(const BlockMask& bm, FuzzedDataProvider& fdp) {
  const index_t B = bm.batch() == 1 ? fdp.ConsumeIntegralInRange<int>(1, 3) : bm.batch();
  const index_t H = bm.heads() == 1 ? fdp.ConsumeIntegralInRange<int>(1, 3) : bm.heads();
  FlexExportOptions options;
  options.separate_full_blocks = fdp.ConsumeBool();
  options.compute_q_blocks = fdp.ConsumeBool();
  const FlexBlockMaskArrays f = to_flex_block_mask(bm, B, H, options);
  const index_t nq = bm.num_q_blocks(0), nkv = bm.num_kv_blocks(0);
  FUZZ_CHECK(f.kv_indices.shape() == (Extents{B, H, nq, nkv}), "kv_indices has the wrong shape");
  FUZZ_CHECK(options.separate_full_blocks != f.full_kv_indices.empty() || nq * nkv == 0,
             "full_kv_indices present: %d, separate_full_blocks %d", int(!f.full_kv_indices.empty()),
             int(options.separate_full_blocks));
  std::vector<int> cls(static_cast<std::size_t>(nq * nkv));
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      const index_t sb = bm.batch() == 1 ? 0 : b, sh = bm.heads() == 1 ? 0 : h;
      for (index_t qb = 0; qb < nq; ++qb) {
        for (index_t kb = 0; kb < nkv; ++kb)
          cls[static_cast<std::size_t>(qb * nkv + kb)] = content_class(bm, sb, sh, qb, kb);
      }
      const index_t s = b * H + h;
      auto want_partial = [&](int c) { return c == 1 || (c == 2 && !options.separate_full_blocks); };
      for (index_t qb = 0; qb < nq; ++qb) {
        const auto partial = decode_row(f.kv_indices.data() + (s * nq + qb) * nkv, nkv,
                                        f.kv_num_blocks.data()[s * nq + qb], "kv_indices");
        std::vector<bool> full(static_cast<std::size_t>(nkv), false);
        if (options.separate_full_blocks) {
          full = decode_row(f.full_kv_indices.data() + (s * nq + qb) * nkv, nkv,
                            f.full_kv_num_blocks.data()[s * nq + qb], "full_kv_indices");
        }
        for (index_t kb = 0; kb < nkv; ++kb) {
          const int c = cls[static_cast<std::size_t>(qb * nkv + kb)];
          FUZZ_CHECK(partial[static_cast<std::size_t>(kb)] == want_partial(c) &&
                         full[static_cast<std::size_t>(kb)] == (c == 2 && options.separate_full_blocks),
                     "flex b=%lld h=%lld qb=%lld kb=%lld: content class %d, listed partial %d full %d", (long long)b,
                     (long long)h, (long long)qb, (long long)kb, c, int(partial[static_cast<std::size_t>(kb)]),
                     int(full[static_cast<std::size_t>(kb)]));
        }
      }
      if (!options.compute_q_blocks) continue;
      for (index_t kb = 0; kb < nkv; ++kb) {
        const auto partial =
            decode_row(f.q_indices.data() + (s * nkv + kb) * nq, nq, f.q_num_blocks.data()[s * nkv + kb], "q_indices");
        std::vector<bool> full(static_cast<std::size_t>(nq), false);
        if (options.separate_full_blocks) {
          full = decode_row(f.full_q_indices.data() + (s * nkv + kb) * nq, nq, f.full_q_num_blocks.data()[s * nkv + kb],
                            "full_q_indices");
        }
        for (index_t qb = 0; qb < nq; ++qb) {
          const int c = cls[static_cast<std::size_t>(qb * nkv + kb)];
          FUZZ_CHECK(partial[static_cast<std::size_t>(qb)] == want_partial(c) &&
                         full[static_cast<std::size_t>(qb)] == (c == 2 && options.separate_full_blocks),
                     "flex q side b=%lld h=%lld kb=%lld qb=%lld: content class %d", (long long)b, (long long)h,
                     (long long)kb, (long long)qb, c);
        }
      }
    }
  }

  // The tile table, element by element.
  const FlexTileTable table = flex_tile_table(bm);
  const BlockShape s = bm.block_shape();
  const index_t n = table.tile_bits.empty() ? 0 : table.tile_bits.extent(0);
  for (index_t b = 0; b < bm.batch(); ++b) {
    for (index_t h = 0; h < bm.heads(); ++h) {
      const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)};
      for (index_t qb = 0; qb < nq; ++qb) {
        for (index_t kb = 0; kb < nkv; ++kb) {
          const std::int32_t id = table.tile_ids(b, h, qb, kb);
          const int c = content_class(bm, b, h, qb, kb);
          FUZZ_CHECK((id == kFlexEmptyTile) == (c == 0) && (id == kFlexFullTile) == (c == 2),
                     "tile table b=%lld h=%lld qb=%lld kb=%lld: id %d, content class %d", (long long)b, (long long)h,
                     (long long)qb, (long long)kb, id, c);
          if (c != 1) continue;
          FUZZ_CHECK(id >= 0 && id < n, "tile id %d outside [0, %lld)", id, (long long)n);
          const Tile t = bm.tile(b, qb, kb);
          for (index_t r = 0; r < s.q; ++r) {
            for (index_t col = 0; col < s.kv; ++col) {
              const bool inside = r < t.rows() && col < t.cols();
              const bool want = inside && bm.allowed(ctx, t.q_begin + r, t.kv_begin + col);
              FUZZ_CHECK(table.tile_bits(id, r, col) == (want ? 1 : 0),
                         "tile table bits b=%lld h=%lld qb=%lld kb=%lld r=%lld c=%lld: %d, want %d", (long long)b,
                         (long long)h, (long long)qb, (long long)kb, (long long)r, (long long)col,
                         int(table.tile_bits(id, r, col)), int(want));
            }
          }
        }
      }
    }
  }
}

bool fits(const backends::SplashIndexArray& a) {
  index_t lo = std::numeric_limits<index_t>::max(), hi = std::numeric_limits<index_t>::min();
  for (index_t i = 0; i < a.values.size(); ++i) {
    lo = std::min<index_t>(lo, a.values.data()[i]);
    hi = std::max<index_t>(hi, a.values.data()[i]);
  }
  if (a.values.size() == 0) return true;
  switch (a.dtype) {
    case backends::SmemDtype::int8:
      return lo >= -128 && hi <= 127;
    case backends::SmemDtype::int16:
      return lo >= -32768 && hi <= 32767;
    default:
      return true;
  }
}

index_t divisor(FuzzedDataProvider& fdp, index_t n) {
  std::vector<index_t> ds;
  for (index_t d = 1; d <= n; ++d) {
    if (n % d == 0) ds.push_back(d);
  }
  // Sometimes a non-divisor (rejected).
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) return n + 1;
  return ds[fdp.ConsumeIntegralInRange<std::size_t>(0, ds.size() - 1)];
}

void check_splash(const BlockMask& bm, index_t heads, FuzzedDataProvider& fdp) {
  using backends::Splash;
  backends::SplashOptions options;
  const index_t batch = fdp.ConsumeIntegralInRange<index_t>(0, bm.batch() - 1);
  options.is_dkv = fdp.ConsumeBool();
  options.head_shards = divisor(fdp, heads);
  const BlockShape block = bm.block_shape();
  const index_t nq = block.q > 0 ? bm.q_len(batch) / block.q : 0;
  options.q_seq_shards = nq > 0 ? divisor(fdp, nq) : 1;
  options.downcast_smem_data = fdp.ConsumeBool();
  options.shrink_grid = fdp.ConsumeIntegralInRange<int>(0, 3) == 0;
  const backends::SplashMaskInfo info = Splash::mask_info(bm, heads, options, batch);
  FUZZ_CHECK(fits(info.block_mask) && fits(info.data_next) && (!info.mask_next || fits(*info.mask_next)),
             "a MaskInfo array does not fit its dtype");
  for (index_t i = 0; i < info.block_mask.values.size(); ++i) {
    const std::int32_t c = info.block_mask.values.data()[i];
    FUZZ_CHECK(c >= 0 && c <= 2, "block_mask value %d", c);
  }
  if (options.shrink_grid) return;  // the shrunk grid is checked for sanity only

  const index_t nkv = bm.kv_len(batch) / block.kv;
  const auto& bmv = info.block_mask.values;
  FUZZ_CHECK(bmv.rank() == 3 && bmv.extent(1) == nq && bmv.extent(2) == nkv &&
                 (bmv.extent(0) == heads || bmv.extent(0) == options.head_shards),
             "block_mask shape %lld x %lld x %lld for %lld heads, %lld head shards, grid %lld x %lld",
             (long long)bmv.extent(0), (long long)bmv.extent(1), (long long)bmv.extent(2), (long long)heads,
             (long long)options.head_shards, (long long)nq, (long long)nkv);
  const index_t heads_per_shard = heads / options.head_shards;
  const index_t q_blocks_per_shard = nq / options.q_seq_shards;
  const MaskContext base{batch, 0, bm.q_len(batch), bm.kv_len(batch)};
  for (index_t h = 0; h < heads; ++h) {
    const index_t r = bmv.extent(0) == heads ? h : h / heads_per_shard;
    const index_t sh = bm.heads() == 1 ? 0 : h;
    MaskContext ctx = base;
    ctx.head = sh;
    for (index_t qb = 0; qb < nq; ++qb) {
      for (index_t kb = 0; kb < nkv; ++kb) {
        const int want = content_class(bm, batch, sh, qb, kb);
        const std::int32_t got = bmv(r, qb, kb);
        FUZZ_CHECK(got == want, "Splash block_mask head %lld (row %lld) qb=%lld kb=%lld is %d, content class %d",
                   (long long)h, (long long)r, (long long)qb, (long long)kb, got, want);
        if (want == 0) continue;
        const std::int32_t next = info.data_next.values(r, qb, kb);
        const index_t q0 = qb / q_blocks_per_shard * q_blocks_per_shard;
        FUZZ_CHECK(next == (options.is_dkv ? qb - q0 : kb), "data_next at a non-empty cell (%lld, %lld) is %d",
                   (long long)qb, (long long)kb, next);
        if (want != 1) continue;
        FUZZ_CHECK(info.mask_next && info.partial_mask_blocks, "a partial tile but no mask_next / partial blocks");
        const std::int32_t id = info.mask_next->values(r, qb, kb);
        const Tensor<std::uint8_t>& blocks = *info.partial_mask_blocks;
        FUZZ_CHECK(id >= 0 && id < blocks.extent(0), "mask_next %d outside [0, %lld)", id, (long long)blocks.extent(0));
        const Tile t = bm.tile(batch, qb, kb);
        for (index_t i = 0; i < block.q; ++i) {
          for (index_t j = 0; j < block.kv; ++j) {
            const bool allowed = bm.allowed(ctx, t.q_begin + i, t.kv_begin + j);
            const std::uint8_t bit = options.is_dkv ? blocks(id, j, i) : blocks(id, i, j);
            FUZZ_CHECK(bit == (allowed ? 1 : 0), "partial_mask_blocks[%d] (%lld, %lld) is %d, mask says %d", id,
                       (long long)i, (long long)j, int(bit), int(allowed));
          }
        }
      }
    }
  }
}

// A BlockMask assembled by hand, rows of random (possibly invalid) entries.
BlockMask hand_built(FuzzedDataProvider& fdp, index_t& heads) {
  RaggedLengths lengths;
  const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 2);
  const bool uniform = fdp.ConsumeIntegralInRange<int>(0, 3) != 0;
  for (index_t b = 0; b < batch; ++b) {
    lengths.q.push_back(uniform && b > 0 ? lengths.q[0] : fdp.ConsumeIntegralInRange<index_t>(0, 40));
    lengths.kv.push_back(uniform && b > 0 ? lengths.kv[0] : fdp.ConsumeIntegralInRange<index_t>(0, 40));
  }
  heads = fdp.ConsumeIntegralInRange<int>(1, 2);
  const index_t stored = fdp.ConsumeBool() ? 1 : heads;
  BlockShape block;
  block.q = fdp.ConsumeIntegralInRange<int>(1, 12);
  block.kv = fdp.ConsumeIntegralInRange<int>(1, 70);
  BlockMask::Builder builder(lengths, stored, block);
  index_t rows = 0;
  for (index_t b = 0; b < batch; ++b) rows += (lengths.q[static_cast<std::size_t>(b)] + block.q - 1) / block.q;
  rows *= stored;
  // Mostly the right number of rows, sometimes one more or one fewer.
  const int row_delta = fdp.ConsumeIntegralInRange<int>(0, 15);
  rows += row_delta == 0 ? 1 : row_delta == 1 ? -1 : 0;
  const index_t max_kb = (*std::max_element(lengths.kv.begin(), lengths.kv.end()) + block.kv - 1) / block.kv;
  const index_t words = static_cast<index_t>(block.q * ((block.kv + 63) / 64));
  const bool with_bits = fdp.ConsumeBool();
  std::vector<std::uint64_t> bits;
  for (index_t r = 0; r < rows; ++r) {
    // Entries in increasing order unless the input says otherwise.
    std::int32_t kb = fdp.ConsumeIntegralInRange<std::int32_t>(-1, 1);
    const int entries = fdp.ConsumeIntegralInRange<int>(0, 4);
    for (int e = 0; e < entries && fdp.remaining_bytes() > 0; ++e) {
      const int step = fdp.ConsumeIntegralInRange<int>(0, 15);
      kb += step == 0 ? -1 : step == 1 ? 0 : step < 4 ? static_cast<std::int32_t>(max_kb) : 1;
      switch (fdp.ConsumeIntegralInRange<int>(0, 2)) {
        case 0:
          builder.add_full(kb);
          break;
        case 1: {
          const std::int32_t end = kb + fdp.ConsumeIntegralInRange<std::int32_t>(-1, 3);
          builder.add_full_range(kb, end);
          kb = std::max(kb, end - 1);
          break;
        }
        default: {
          const int size = fdp.ConsumeIntegralInRange<int>(0, 15);
          bits.assign(!with_bits  ? 0
                      : size == 0 ? static_cast<std::size_t>(words + 1)
                                  : static_cast<std::size_t>(words),
                      0);
          for (auto& w : bits) w = fdp.ConsumeIntegral<std::uint64_t>();
          builder.add_partial(kb, bits);
        }
      }
    }
    builder.end_row();
  }
  return builder.finish();
}

// The structure of an accepted hand-built BlockMask, as check_block_mask
// reads it: ranges in bounds and increasing, partial blocks in bounds,
// increasing and disjoint from the full ranges, one tile id per partial block.
void check_structure(const BlockMask& bm) {
  for (index_t b = 0; b < bm.batch(); ++b) {
    const index_t nkv = bm.num_kv_blocks(b);
    for (index_t h = 0; h < bm.heads(); ++h) {
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        std::vector<bool> full(static_cast<std::size_t>(nkv), false);
        index_t prev = -1;
        for (const BlockRange r : bm.full_ranges(b, h, qb)) {
          FUZZ_CHECK(r.begin < r.end && r.begin >= 0 && r.end <= nkv && r.begin >= prev,
                     "accepted BlockMask: full range [%d, %d) in a row of %lld kv-blocks (previous end %lld)", r.begin,
                     r.end, (long long)nkv, (long long)prev);
          prev = r.end;
          for (auto kb = r.begin; kb < r.end; ++kb) full[static_cast<std::size_t>(kb)] = true;
        }
        const auto partial = bm.partial_blocks(b, h, qb);
        const auto ids = bm.partial_tile_ids(b, h, qb);
        FUZZ_CHECK(ids.empty() || ids.size() == partial.size(),
                   "accepted BlockMask: %zu tile ids for %zu partial blocks", ids.size(), partial.size());
        for (std::size_t i = 0; i < partial.size(); ++i) {
          FUZZ_CHECK(partial[i] >= 0 && partial[i] < nkv && (i == 0 || partial[i - 1] < partial[i]) &&
                         !full[static_cast<std::size_t>(partial[i])],
                     "accepted BlockMask: partial block %d in a row of %lld kv-blocks", partial[i], (long long)nkv);
          if (!ids.empty()) {
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < bm.num_distinct_partial_tiles(), "accepted BlockMask: tile id %d",
                       ids[i]);
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const int mode = fdp.ConsumeIntegralInRange<int>(0, 3);
  seqattn::fuzz::guarded([&] {
    BlockMask bm;
    index_t heads = 1;
    if (mode == 0) {
      bm = hand_built(fdp, heads);
      check_structure(bm);
    } else {
      heads = fdp.ConsumeIntegralInRange<int>(1, 3);
      const index_t batch = fdp.ConsumeIntegralInRange<int>(1, 2);
      BlockShape block;
      block.q = fdp.ConsumeIntegralInRange<int>(1, 40);
      block.kv = fdp.ConsumeIntegralInRange<int>(1, 70);
      // Mostly whole blocks (Splash needs them), sometimes a short edge.
      RaggedLengths lengths;
      const index_t nq = fdp.ConsumeIntegralInRange<int>(1, 6), nkv = fdp.ConsumeIntegralInRange<int>(1, 6);
      const bool short_edge = fdp.ConsumeIntegralInRange<int>(0, 3) == 0;
      for (index_t b = 0; b < batch; ++b) {
        lengths.q.push_back(nq * block.q - (short_edge ? fdp.ConsumeIntegralInRange<index_t>(0, block.q - 1) : 0));
        lengths.kv.push_back(nkv * block.kv - (short_edge ? fdp.ConsumeIntegralInRange<index_t>(0, block.kv - 1) : 0));
      }
      for (;;) {
        index_t cells = 0;
        for (std::size_t b = 0; b < lengths.q.size(); ++b) cells += lengths.q[b] * lengths.kv[b] * heads;
        if (cells <= kMaxCells) break;
        block.q = std::max<index_t>(1, block.q / 2);
        block.kv = std::max<index_t>(1, block.kv / 2);
        for (std::size_t b = 0; b < lengths.q.size(); ++b) {
          lengths.q[b] = std::min(lengths.q[b], nq * block.q);
          lengths.kv[b] = std::min(lengths.kv[b], nkv * block.kv);
        }
      }
      seqattn::fuzz::MaskFactory factory(fdp, lengths, heads);
      const AnyMask mask = factory.make();
      BlockMaskOptions options;
      options.store_tile_bits = fdp.ConsumeIntegralInRange<int>(0, 3) != 0;
      bm = build_block_mask(mask, lengths, heads, block, options);
      if (mode == 3 && batch == 1 && lengths.q[0] % block.q == 0 && lengths.kv[0] % block.kv == 0) {
        // The description overload: in-kernel kinds get a mask function.
        backends::SplashOptions so;
        so.is_dkv = fdp.ConsumeBool();
        so.shrink_grid = fdp.ConsumeBool();
        const auto info = backends::Splash::mask_info(mask, lengths.q[0], lengths.kv[0], heads, block, so);
        FUZZ_CHECK(info.mask_function.has_value() == info.q_sequence.has_value(),
                   "mask_function and q_sequence must come together");
        if (info.mask_function) FUZZ_CHECK(!info.partial_mask_blocks, "an in-kernel mask with stored tiles");
      }
    }
    const bool uniform =
        std::all_of(bm.lengths().q.begin(), bm.lengths().q.end(), [&](index_t x) { return x == bm.q_len(0); }) &&
        std::all_of(bm.lengths().kv.begin(), bm.lengths().kv.end(), [&](index_t x) { return x == bm.kv_len(0); });
    if (uniform || fdp.ConsumeIntegralInRange<int>(0, 7) == 0) seqattn::fuzz::guarded([&] { check_flex(bm, fdp); });
    seqattn::fuzz::guarded([&] { check_splash(bm, heads, fdp); });
  });
  return 0;
}
