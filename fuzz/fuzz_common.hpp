// Shared by the libFuzzer targets: a check that aborts with a message (so a
// mismatch is a fuzzer crash with a reproducer), a guard that lets only
// seqattn::invalid_argument through, and the BlockMask-vs-predicate checker.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "seqattn/seqattn.hpp"

#define FUZZ_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fprintf(stderr, "\n");                                                            \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace seqattn::fuzz {

// Runs `body`; a seqattn::invalid_argument is the documented rejection of bad
// input and ends the run quietly. Any other exception aborts (reported by
// libFuzzer as a crash) after printing its type and message.
template <class F>
void guarded(F&& body) {
  try {
    body();
  } catch (const seqattn::invalid_argument&) {
    // Rejected input: fine.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception (not seqattn::invalid_argument): %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "unexpected non-std exception\n");
    std::abort();
  }
}

// Listed classes must equal brute force (classify_by_scan), except that
// `partial` is always sound; full ranges non-empty and increasing; partial
// blocks increasing and disjoint from the full ranges; stored tile bits equal
// to the predicate inside the tile and zero outside it (short edge tiles);
// BlockMask::allowed, evaluated from the tile lists and bits alone (predicate
// removed), equal to mask.allowed everywhere.
template <class M>
void check_block_mask(const M& mask, const BlockMask& bm, index_t heads, bool expect_bits) {
  BlockMask structural = bm;  // without the element predicate: allowed() reads lists and bits
  structural.set_predicate({});
  for (index_t b = 0; b < bm.batch(); ++b) {
    for (index_t h = 0; h < heads; ++h) {
      const MaskContext ctx{b, h, bm.q_len(b), bm.kv_len(b)};
      const index_t nkv = bm.num_kv_blocks(b);
      for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
        std::vector<TileClass> listed(static_cast<std::size_t>(nkv), TileClass::empty);
        index_t prev_end = -1;
        for (auto r : bm.full_ranges(b, h, qb)) {
          FUZZ_CHECK(r.begin < r.end && r.begin >= 0 && r.end <= nkv && r.begin >= prev_end,
                     "b=%lld h=%lld qb=%lld: bad full range [%d, %d) (nkv=%lld, previous end %lld)", (long long)b,
                     (long long)h, (long long)qb, r.begin, r.end, (long long)nkv, (long long)prev_end);
          prev_end = r.end;
          for (auto kb = r.begin; kb < r.end; ++kb) listed[static_cast<std::size_t>(kb)] = TileClass::full;
        }
        FUZZ_CHECK(bm.num_full_blocks(b, h, qb) == static_cast<index_t>(bm.full_blocks(b, h, qb).size()),
                   "num_full_blocks disagrees with full_blocks");
        const auto partial = bm.partial_blocks(b, h, qb);
        const auto ids = bm.partial_tile_ids(b, h, qb);
        if (expect_bits) {
          FUZZ_CHECK(ids.size() == partial.size(), "b=%lld qb=%lld: %zu tile ids for %zu partial blocks", (long long)b,
                     (long long)qb, ids.size(), partial.size());
        }
        for (std::size_t i = 0; i < partial.size(); ++i) {
          const std::int32_t kb = partial[i];
          FUZZ_CHECK(kb >= 0 && kb < nkv, "partial block %d outside [0, %lld)", kb, (long long)nkv);
          if (i > 0) FUZZ_CHECK(partial[i - 1] < kb, "partial blocks not increasing");
          FUZZ_CHECK(listed[static_cast<std::size_t>(kb)] == TileClass::empty,
                     "b=%lld h=%lld qb=%lld kb=%d listed both full and partial", (long long)b, (long long)h,
                     (long long)qb, kb);
          listed[static_cast<std::size_t>(kb)] = TileClass::partial;
          if (ids.empty()) continue;
          const Tile t = bm.tile(b, qb, kb);
          const auto bits = bm.tile_bits(ids[i]);
          for (index_t r = 0; r < bm.block_shape().q; ++r) {
            for (index_t c = 0; c < bm.block_shape().kv; ++c) {
              const bool bit = (bits[static_cast<std::size_t>(r * bm.words_per_row() + c / 64)] >> (c % 64)) & 1u;
              const bool inside = r < t.rows() && c < t.cols();
              const bool want = inside && mask.allowed(ctx, t.q_begin + r, t.kv_begin + c);
              FUZZ_CHECK(bit == want, "tile bit b=%lld h=%lld qb=%lld kb=%d r=%lld c=%lld is %d, mask says %d",
                         (long long)b, (long long)h, (long long)qb, kb, (long long)r, (long long)c, int(bit),
                         int(want));
            }
          }
        }
        for (index_t kb = 0; kb < nkv; ++kb) {
          const Tile t = bm.tile(b, qb, kb);
          const TileClass brute = detail::classify_by_scan(mask, ctx, t);
          const TileClass got = listed[static_cast<std::size_t>(kb)];
          FUZZ_CHECK(got == TileClass::partial || got == brute,
                     "b=%lld h=%lld qb=%lld kb=%lld (tile q[%lld,%lld) kv[%lld,%lld)): listed %d, scan says %d",
                     (long long)b, (long long)h, (long long)qb, (long long)kb, (long long)t.q_begin, (long long)t.q_end,
                     (long long)t.kv_begin, (long long)t.kv_end, int(got), int(brute));
          // A partial tile that is really empty or full is sound but wasteful: allowed.
        }
      }
      // Element level: the BlockMask (with and without its predicate) against the mask.
      for (index_t q = 0; q < ctx.q_len; ++q) {
        for (index_t kv = 0; kv < ctx.kv_len; ++kv) {
          const bool want = mask.allowed(ctx, q, kv);
          FUZZ_CHECK(bm.allowed(ctx, q, kv) == want, "BlockMask::allowed b=%lld h=%lld q=%lld kv=%lld != %d",
                     (long long)b, (long long)h, (long long)q, (long long)kv, int(want));
          if (expect_bits || bm.num_partial_tiles() == 0) {
            FUZZ_CHECK(structural.allowed(ctx, q, kv) == want,
                       "BlockMask::allowed from tiles/bits b=%lld h=%lld q=%lld kv=%lld != %d", (long long)b,
                       (long long)h, (long long)q, (long long)kv, int(want));
          }
        }
      }
    }
  }
}

}  // namespace seqattn::fuzz
