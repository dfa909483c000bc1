// Host-side planning of the Tpu backend (backends/tpu.hpp): the BlockLayout
// of our Pallas kernel (its contract: python/seqattn/pallas/layout.py).
//   - every mask kind, BSHD ragged with padding and THD packed streams: the
//     dense mask rebuilt from the query-major lists and, separately, from the
//     key-major lists equals the description's predicate at every element of
//     the padded grid (0 past each sequence's end and between sequences);
//   - the contract's guarantees, checked on their own: full tiles lie inside
//     the sequences, no listed tile is empty, tiles are distinct by content,
//     starts/counts/widths, fetch indices;
//   - worked examples with known arrays, the page table, and argument errors.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/backends/tpu.hpp"
#include "seqattn/masks.hpp"

#include "cuda/random_mask_cases.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_cuda_tpu_plan_test {

using namespace seqattn;
using seqattn::backends::Tpu;
using seqattn::backends::TpuBlockLists;
using seqattn::backends::TpuLayout;
using seqattn::backends::TpuSequences;
using seqattn_test_random_masks::MaskCase;
using seqattn_test_random_masks::pick;
using seqattn_test_random_masks::random_mask_case;

namespace {

// [batch, mask_heads, rows, cols] booleans of one direction of the padded grid.
struct Dense {
  index_t batch = 0, heads = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> v;
  Dense(index_t b, index_t h, index_t r, index_t c)
      : batch(b), heads(h), rows(r), cols(c), v(static_cast<std::size_t>(b * h * r * c), 0) {}
  std::uint8_t& at(index_t b, index_t h, index_t r, index_t c) {
    return v[static_cast<std::size_t>(((b * heads + h) * rows + r) * cols + c)];
  }
};

// The contract's per-direction guarantees, and the dense mask the lists claim.
// `row_block` x `col_block` tiles; the key-major direction passes them swapped.
Dense rebuild(const TpuBlockLists& l, index_t batch, index_t heads, index_t rows, index_t cols, index_t row_block,
              index_t col_block, const std::string& what) {
  INFO(what);
  const index_t nr = (rows + row_block - 1) / row_block, nc = (cols + col_block - 1) / col_block;
  const auto n_rows = static_cast<std::size_t>(batch * heads * nr);
  REQUIRE(l.start.size() == n_rows);
  REQUIRE(l.count.size() == n_rows);
  const std::size_t entries = l.block.size();
  REQUIRE(entries >= 1);
  REQUIRE(l.tile.size() == entries);
  REQUIRE(l.fetch.size() == entries);
  REQUIRE(l.num_tiles >= 1);
  REQUIRE(l.tiles.size() == static_cast<std::size_t>(l.num_tiles * row_block * col_block));
  const auto tile_at = [&](std::int32_t t, index_t r, index_t c) {
    return l.tiles[static_cast<std::size_t>((t * row_block + r) * col_block + c)];
  };

  // Fetch: the nearest partial tile at or before each entry, 0 before any.
  std::int32_t fetched = 0;
  for (std::size_t e = 0; e < entries; ++e) {
    if (l.tile[e] >= 0) fetched = l.tile[e];
    REQUIRE(l.fetch[e] == fetched);
  }
  // Tiles are distinct by content; none is all 0 or all 1 (those are not
  // partial); values are 0 or 1.
  std::set<std::vector<std::int8_t>> contents;
  std::int32_t partial_entries = 0;
  for (const std::int32_t t : l.tile) partial_entries += t >= 0 ? 1 : 0;
  for (std::int32_t t = 0; t < l.num_tiles && partial_entries > 0; ++t) {
    const auto first = l.tiles.begin() + t * row_block * col_block;
    std::vector<std::int8_t> content(first, first + row_block * col_block);
    CHECK(std::all_of(content.begin(), content.end(), [](std::int8_t x) { return x == 0 || x == 1; }));
    CHECK(std::count(content.begin(), content.end(), 1) > 0);
    CHECK(std::count(content.begin(), content.end(), 0) > 0);
    CHECK(contents.insert(content).second);
  }

  Dense out(batch, heads, nr * row_block, nc * col_block);
  index_t max_count = 0;
  std::int32_t listed_before = -1;  // the last entry of the rows so far
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < heads; ++h) {
      for (index_t rb = 0; rb < nr; ++rb) {
        const auto r = static_cast<std::size_t>((b * heads + h) * nr + rb);
        const std::int32_t start = l.start[r], count = l.count[r];
        REQUIRE(count >= 0);
        REQUIRE(start >= 0);
        REQUIRE(static_cast<std::size_t>(start + std::max(count - 1, 0)) < entries);
        max_count = std::max<index_t>(max_count, count);
        // An empty row repeats the last entry listed before it (no DMA).
        if (count == 0) CHECK(start == std::max(listed_before, std::int32_t{0}));
        if (count > 0) listed_before = start + count - 1;
        for (std::int32_t e = start; e < start + count; ++e) {
          const auto i = static_cast<std::size_t>(e);
          const std::int32_t cb = l.block[i], t = l.tile[i];
          REQUIRE(cb >= 0);
          REQUIRE(cb < nc);
          if (e > start) REQUIRE(l.block[i - 1] < cb);
          REQUIRE(t >= -1);
          REQUIRE(t < l.num_tiles);
          for (index_t x = 0; x < row_block; ++x) {
            for (index_t y = 0; y < col_block; ++y) {
              out.at(b, h, rb * row_block + x, cb * col_block + y) = t < 0 ? 1 : tile_at(t, x, y);
            }
          }
        }
      }
    }
  }
  CHECK(l.width == std::max<index_t>(1, max_count));
  return out;
}

// Compares the rebuilt grid (which covers whole blocks) with `allowed` over
// the padded arrays and requires 0 in the blocks' overhang past them: a full
// tile there would claim elements outside the sequences.
template <class Allowed>
void require_equal(Dense& got, index_t batch, index_t heads, index_t rows, index_t cols, bool key_major,
                   const Allowed& allowed, const std::string& what) {
  INFO(what << (key_major ? " (key-major)" : " (query-major)"));
  index_t mismatches = 0;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < heads; ++h) {
      for (index_t r = 0; r < got.rows; ++r) {
        for (index_t c = 0; c < got.cols; ++c) {
          const bool inside = r < rows && c < cols;
          const bool want = inside && (key_major ? allowed(b, h, c, r) : allowed(b, h, r, c));
          if ((got.at(b, h, r, c) != 0) != want && ++mismatches <= 5) {
            FAIL_CHECK("element (batch " << b << ", head " << h << ", row " << r << ", col " << c << ") is "
                                         << int{got.at(b, h, r, c)} << ", want " << want);
          }
        }
      }
    }
  }
  REQUIRE(mismatches == 0);
}

template <class Allowed>
void check_layout(const TpuLayout& lay, index_t batch, index_t heads, index_t q_len, index_t kv_len, BlockShape block,
                  const Allowed& allowed, const std::string& what) {
  REQUIRE(lay.batch == batch);
  REQUIRE(lay.q_len == q_len);
  REQUIRE(lay.kv_len == kv_len);
  REQUIRE(lay.block.q == block.q);
  REQUIRE(lay.block.kv == block.kv);
  REQUIRE((lay.mask_heads == 1 || lay.mask_heads == heads));
  Dense q = rebuild(lay.queries, batch, lay.mask_heads, q_len, kv_len, block.q, block.kv, what);
  Dense k = rebuild(lay.keys, batch, lay.mask_heads, kv_len, q_len, block.kv, block.q, what);
  // A one-head layout must hold for every head.
  for (index_t h = 0; h < heads; ++h) {
    const index_t stored = lay.mask_heads == 1 ? 0 : h;
    const auto of_head = [&](index_t b, index_t, index_t r, index_t c) { return allowed(b, h, r, c); };
    Dense q_head(batch, 1, q.rows, q.cols), k_head(batch, 1, k.rows, k.cols);
    for (index_t b = 0; b < batch; ++b) {
      for (index_t r = 0; r < q.rows; ++r) {
        for (index_t c = 0; c < q.cols; ++c) q_head.at(b, 0, r, c) = q.at(b, stored, r, c);
      }
      for (index_t r = 0; r < k.rows; ++r) {
        for (index_t c = 0; c < k.cols; ++c) k_head.at(b, 0, r, c) = k.at(b, stored, r, c);
      }
    }
    const std::string head_what = what + ", head " + std::to_string(h);
    require_equal(q_head, batch, 1, q_len, kv_len, false, of_head, head_what);
    require_equal(k_head, batch, 1, kv_len, q_len, true, of_head, head_what);
  }
}

std::string describe(const MaskCase& c) {
  std::string s = c.name + ", heads " + std::to_string(c.heads) + ", lengths";
  for (std::size_t b = 0; b < c.lengths.q.size(); ++b) {
    s += " (" + std::to_string(c.lengths.q[b]) + ", " + std::to_string(c.lengths.kv[b]) + ")";
  }
  return s;
}

BlockShape pick_block(std::mt19937& rng) {
  static constexpr BlockShape kBlocks[] = {{128, 128}, {64, 128}, {128, 64}, {32, 96}, {16, 8}, {8, 200}};
  return kBlocks[pick(rng, 0, static_cast<index_t>(std::size(kBlocks)) - 1)];
}

}  // namespace

TEST_CASE("Tpu::plan: BSHD ragged batches of every mask kind, element by element", "[tpu]") {
  std::mt19937 rng(20251126);
  for (int iter = 0; iter < 120; ++iter) {
    const MaskCase c = random_mask_case(rng, 300);
    const BlockShape block = pick_block(rng);
    const index_t batch = c.lengths.batch();
    index_t q_len = 1, kv_len = 1;
    for (index_t b = 0; b < batch; ++b) {
      q_len = std::max(q_len, c.lengths.q[static_cast<std::size_t>(b)]);
      kv_len = std::max(kv_len, c.lengths.kv[static_cast<std::size_t>(b)]);
    }
    // Padding past the longest sequence, sometimes whole blocks of it.
    q_len += pick(rng, 0, 1) * pick(rng, 0, 2 * block.q);
    kv_len += pick(rng, 0, 1) * pick(rng, 0, 2 * block.kv);
    const TpuLayout lay =
        Tpu::plan(c.mask, TpuSequences::ragged(q_len, kv_len, c.lengths.q, c.lengths.kv), c.heads, block);
    CHECK(lay.mask_heads == (c.mask.invariant_over_heads() ? 1 : c.heads));
    const auto allowed = [&](index_t b, index_t h, index_t q, index_t kv) {
      const index_t ql = c.lengths.q[static_cast<std::size_t>(b)], kl = c.lengths.kv[static_cast<std::size_t>(b)];
      return q < ql && kv < kl && c.mask.allowed(MaskContext{b, h, ql, kl}, q, kv);
    };
    check_layout(lay, batch, c.heads, q_len, kv_len, block, allowed,
                 describe(c) + ", padded (" + std::to_string(q_len) + ", " + std::to_string(kv_len) + "), block (" +
                     std::to_string(block.q) + ", " + std::to_string(block.kv) + ")");
  }
}

TEST_CASE("Tpu::plan: THD packed streams, each sequence masked in its own coordinates", "[tpu]") {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 120; ++iter) {
    const MaskCase c = random_mask_case(rng, 200);
    const BlockShape block = pick_block(rng);
    std::vector<index_t> cu_q{0}, cu_kv{0};
    for (std::size_t b = 0; b < c.lengths.q.size(); ++b) {
      cu_q.push_back(cu_q.back() + c.lengths.q[b]);
      cu_kv.push_back(cu_kv.back() + c.lengths.kv[b]);
    }
    const index_t q_len = std::max<index_t>(1, cu_q.back() + pick(rng, 0, 1) * pick(rng, 0, 150));
    const index_t kv_len = std::max<index_t>(1, cu_kv.back() + pick(rng, 0, 1) * pick(rng, 0, 150));
    const TpuLayout lay = Tpu::plan(c.mask, TpuSequences::packed(q_len, kv_len, cu_q, cu_kv), c.heads, block);
    const auto sequence_of = [](const std::vector<index_t>& cu, index_t token) {
      for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
        if (token >= cu[b] && token < cu[b + 1]) return static_cast<index_t>(b);
      }
      return index_t{-1};
    };
    const auto allowed = [&](index_t, index_t h, index_t q, index_t kv) {
      const index_t b = sequence_of(cu_q, q);
      if (b < 0 || b != sequence_of(cu_kv, kv)) return false;
      const auto s = static_cast<std::size_t>(b);
      return c.mask.allowed(MaskContext{b, h, cu_q[s + 1] - cu_q[s], cu_kv[s + 1] - cu_kv[s]}, q - cu_q[s],
                            kv - cu_kv[s]);
    };
    check_layout(lay, 1, c.heads, q_len, kv_len, block, allowed,
                 "THD " + describe(c) + ", stream (" + std::to_string(q_len) + ", " + std::to_string(kv_len) +
                     "), block (" + std::to_string(block.q) + ", " + std::to_string(block.kv) + ")");
  }
}

TEST_CASE("Tpu::plan: dense masks with a head dim, ragged and packed", "[tpu]") {
  // The random cases above have no DenseMask: mostly-on, mostly-off and
  // half-on arrays, whose tiles are classified by scanning every element.
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 24; ++iter) {
    const index_t batch = pick(rng, 1, 3), heads = pick(rng, 1, 3);
    const index_t q = pick(rng, 1, 150), kv = pick(rng, 1, 150);
    const int density = static_cast<int>(pick(rng, 0, 2));
    auto values = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(batch * heads * q * kv));
    for (auto& v : *values) {
      const index_t roll = pick(rng, 0, 99);
      v = density == 0 ? roll < 3 : density == 1 ? roll < 50 : roll < 97;
    }
    const AnyMask mask(
        DenseMask<std::uint8_t>{TensorView<const std::uint8_t>(values->data(), Extents{batch, heads, q, kv})}, values);
    std::vector<index_t> q_lens, kv_lens, cu_q{0}, cu_kv{0};
    for (index_t b = 0; b < batch; ++b) {
      q_lens.push_back(pick(rng, 0, q));
      kv_lens.push_back(pick(rng, 0, kv));
      cu_q.push_back(cu_q.back() + q_lens.back());
      cu_kv.push_back(cu_kv.back() + kv_lens.back());
    }
    const BlockShape block = pick_block(rng);
    const auto value = [&](index_t b, index_t h, index_t r, index_t c) {
      return (*values)[static_cast<std::size_t>(((b * heads + h) * q + r) * kv + c)] != 0;
    };
    const std::string what = "dense, density " + std::to_string(density) + ", batch " + std::to_string(batch) +
                             ", heads " + std::to_string(heads) + ", values (" + std::to_string(q) + ", " +
                             std::to_string(kv) + "), block (" + std::to_string(block.q) + ", " +
                             std::to_string(block.kv) + ")";
    const TpuLayout bshd = Tpu::plan(mask, TpuSequences::ragged(q, kv, q_lens, kv_lens), heads, block);
    check_layout(
        bshd, batch, heads, q, kv, block,
        [&](index_t b, index_t h, index_t r, index_t c) {
          return r < q_lens[static_cast<std::size_t>(b)] && c < kv_lens[static_cast<std::size_t>(b)] &&
                 value(b, h, r, c);
        },
        what);
    const TpuLayout thd = Tpu::plan(
        mask, TpuSequences::packed(std::max<index_t>(1, cu_q.back()), std::max<index_t>(1, cu_kv.back()), cu_q, cu_kv),
        heads, block);
    check_layout(
        thd, 1, heads, std::max<index_t>(1, cu_q.back()), std::max<index_t>(1, cu_kv.back()), block,
        [&](index_t, index_t h, index_t r, index_t c) {
          for (index_t b = 0; b < batch; ++b) {
            const auto s = static_cast<std::size_t>(b);
            if (r >= cu_q[s] && r < cu_q[s + 1]) {
              return c >= cu_kv[s] && c < cu_kv[s + 1] && value(b, h, r - cu_q[s], c - cu_kv[s]);
            }
          }
          return false;
        },
        "THD " + what);
  }
}

TEST_CASE("Tpu::plan: causal 256 x 256 in 128-blocks lists one shared diagonal tile", "[tpu]") {
  const TpuLayout lay = Tpu::plan(CausalMask{}, TpuSequences::padded(1, 256, 256), 4, {128, 128});
  CHECK(lay.mask_heads == 1);
  const TpuBlockLists& q = lay.queries;
  CHECK(q.start == std::vector<std::int32_t>{0, 1});
  CHECK(q.count == std::vector<std::int32_t>{1, 2});
  CHECK(q.block == std::vector<std::int32_t>{0, 0, 1});
  CHECK(q.tile == std::vector<std::int32_t>{0, -1, 0});
  CHECK(q.fetch == std::vector<std::int32_t>{0, 0, 0});
  CHECK(q.width == 2);
  REQUIRE(q.num_tiles == 1);
  for (index_t r = 0; r < 128; ++r) {
    for (index_t c = 0; c < 128; ++c) REQUIRE(q.tiles[static_cast<std::size_t>(r * 128 + c)] == (c <= r ? 1 : 0));
  }
  // Key-major: key block 0 is seen by q blocks 0 (diagonal) and 1 (full).
  const TpuBlockLists& k = lay.keys;
  CHECK(k.start == std::vector<std::int32_t>{0, 2});
  CHECK(k.count == std::vector<std::int32_t>{2, 1});
  CHECK(k.block == std::vector<std::int32_t>{0, 1, 1});
  CHECK(k.tile == std::vector<std::int32_t>{0, -1, 0});
  for (index_t j = 0; j < 128; ++j) {
    for (index_t i = 0; i < 128; ++i) REQUIRE(k.tiles[static_cast<std::size_t>(j * 128 + i)] == (j <= i ? 1 : 0));
  }
}

TEST_CASE("Tpu::plan: a full tile cut by the sequence's end becomes a partial tile, 0 outside", "[tpu]") {
  // The BlockMask calls all four tiles of a 200 x 200 full mask full; on the
  // TPU only the first covers a whole 128 x 128 box.
  const TpuLayout lay = Tpu::plan(FullMask{}, TpuSequences::padded(2, 200, 200), 1, {128, 128});
  const TpuBlockLists& q = lay.queries;
  CHECK(q.start == std::vector<std::int32_t>{0, 2, 4, 6});
  CHECK(q.count == std::vector<std::int32_t>{2, 2, 2, 2});
  CHECK(q.tile == std::vector<std::int32_t>{-1, 0, 1, 2, -1, 0, 1, 2});
  REQUIRE(q.num_tiles == 3);
  const auto ones = [&](std::int32_t t) {
    return std::count(q.tiles.begin() + t * 128 * 128, q.tiles.begin() + (t + 1) * 128 * 128, std::int8_t{1});
  };
  CHECK(ones(0) == 128 * 72);
  CHECK(ones(1) == 72 * 128);
  CHECK(ones(2) == 72 * 72);
  // Ragged: the second sequence is shorter, so its first tile is cut too and
  // its last q block (past its 100 tokens) lists nothing.
  const TpuLayout rag = Tpu::plan(FullMask{}, TpuSequences::ragged(200, 200, {200, 100}, {200, 100}), 1, {128, 128});
  CHECK(rag.queries.count == std::vector<std::int32_t>{2, 2, 1, 0});
  CHECK(rag.keys.count == std::vector<std::int32_t>{2, 2, 1, 0});
  CHECK(rag.queries.start.back() == static_cast<std::int32_t>(rag.queries.block.size()) - 1);
  // A short first sequence: its empty q block repeats its own last entry
  // (0), not the next sequence's first (1), so it fetches nothing.
  const TpuLayout mid = Tpu::plan(FullMask{}, TpuSequences::ragged(200, 200, {100, 200}, {100, 200}), 1, {128, 128});
  CHECK(mid.queries.count == std::vector<std::int32_t>{1, 0, 2, 2});
  CHECK(mid.queries.start == std::vector<std::int32_t>{0, 0, 1, 3});
  CHECK(mid.keys.count == std::vector<std::int32_t>{1, 0, 2, 2});
  CHECK(mid.keys.start == std::vector<std::int32_t>{0, 0, 1, 3});
}

TEST_CASE("Tpu::plan: a mask that allows nothing lists one dummy entry and one zero tile", "[tpu]") {
  const TpuLayout lay = Tpu::plan(~FullMask{}, TpuSequences::padded(2, 300, 70), 3, {128, 64});
  for (const TpuBlockLists* l : {&lay.queries, &lay.keys}) {
    CHECK(std::all_of(l->count.begin(), l->count.end(), [](std::int32_t n) { return n == 0; }));
    CHECK(std::all_of(l->start.begin(), l->start.end(), [](std::int32_t s) { return s == 0; }));
    CHECK(l->block == std::vector<std::int32_t>{0});
    CHECK(l->tile == std::vector<std::int32_t>{-1});
    CHECK(l->fetch == std::vector<std::int32_t>{0});
    CHECK(l->width == 1);
    CHECK(l->num_tiles == 1);
    CHECK(std::all_of(l->tiles.begin(), l->tiles.end(), [](std::int8_t x) { return x == 0; }));
  }
  CHECK(lay.queries.start.size() == 2 * 3);
  CHECK(lay.keys.start.size() == 2 * 2);
}

TEST_CASE("Tpu::plan: a head-dependent mask keeps one row per head", "[tpu]") {
  const AnyMask per_head = mask_mod([](index_t, index_t h, index_t q, index_t kv) { return kv <= q + 40 * h; });
  const TpuLayout lay = Tpu::plan(per_head, TpuSequences::padded(1, 128, 256), 3, {64, 64});
  CHECK(lay.mask_heads == 3);
  CHECK(lay.queries.start.size() == 3 * 2);
  CHECK(lay.keys.start.size() == 3 * 4);
}

TEST_CASE("Tpu::plan: argument errors name the argument before any work", "[tpu]") {
  const AnyMask causal = CausalMask{};
  const auto fails = [&](const TpuSequences& s, index_t heads, BlockShape block, const char* names) {
    CHECK_THROWS_AS(Tpu::plan(causal, s, heads, block), std::invalid_argument);
    CHECK_THROWS_WITH(Tpu::plan(causal, s, heads, block), ContainsSubstring(names));
  };
  fails(TpuSequences::padded(1, 64, 64), 0, {128, 128}, "heads");
  fails(TpuSequences::padded(1, 64, 64), 1, {0, 128}, "block_q");
  fails(TpuSequences::padded(1, 64, 64), 1, {128, 1 << 17}, "block_kv");
  fails(TpuSequences::padded(1, 0, 64), 1, {128, 128}, "q_len");
  fails(TpuSequences::padded(0, 64, 64), 1, {128, 128}, "batch");
  // Padding is bounded too: every padded block gets a row, whatever the sequences hold.
  fails(TpuSequences::ragged(index_t{1} << 41, 64, {10}, {10}), 1, {16, 16}, "q_len = 2199023255552 is");
  fails(TpuSequences::ragged(64, index_t{1} << 41, {10}, {10}), 1, {16, 16}, "kv_len = 2199023255552 is");
  fails(TpuSequences::padded(1 << 20, 64, index_t{1} << 30), 64, {128, 1}, "rows of the layout");
  fails(TpuSequences::ragged(64, 64, {10, 65}, {10, 10}), 1, {128, 128}, "q_lens[1] = 65");
  fails(TpuSequences::ragged(64, 64, {10, 20}, {10}), 1, {128, 128}, "kv_lens");
  fails(TpuSequences::ragged(64, 64, {10, 20}, {10, -1}), 1, {128, 128}, "kv_lens[1] = -1");
  fails(TpuSequences::packed(64, 64, {1, 10}, {0, 10}), 1, {128, 128}, "cu_seqlens_q must start at 0");
  fails(TpuSequences::packed(64, 64, {0, 10, 5}, {0, 10, 20}), 1, {128, 128}, "cu_seqlens_q must be non-decreasing");
  fails(TpuSequences::packed(64, 64, {0, 10, 65}, {0, 10, 20}), 1, {128, 128}, "q_len = 64");
  fails(TpuSequences::packed(64, 64, {0, 10}, {0, 10, 20}), 1, {128, 128}, "cu_seqlens_kv");
  fails(TpuSequences::packed(64, 64, {0}, {0}), 1, {128, 128}, "cu_seqlens_q");
  TpuSequences two_rows = TpuSequences::packed(64, 64, {0, 10}, {0, 10});
  two_rows.batch = 2;
  fails(two_rows, 1, {128, 128}, "batch must be 1");
  // 70000^2 full 1 x 1 tiles: more entries than int32 reaches, refused from
  // the BlockMask's counts before any list (or the transpose) is built.
  CHECK_THROWS_WITH(Tpu::plan(FullMask{}, TpuSequences::padded(1, 70000, 70000), 1, {1, 1}),
                    ContainsSubstring("use larger blocks"));
  // The mask's own check, against the sequences it is asked about: a document
  // mask of 64-token rows does not fit a packed sequence of 10 tokens.
  std::vector<std::int32_t> ids(64, 1);
  const DocumentLayout docs =
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{1, 64}));
  CHECK_THROWS_AS(Tpu::plan(document_mask(docs), TpuSequences::packed(64, 64, {0, 10}, {0, 10}), 1, {128, 128}),
                  std::invalid_argument);
}

TEST_CASE("Tpu::page_table: checked block tables, unread entries become page 0", "[tpu]") {
  const std::vector<std::int32_t> table{7, 3, -1, -1, 2, 5, 6, 1, 4, -1, -1, -1};
  const TensorView<const std::int32_t> view(table.data(), Extents{3, 4});
  const std::vector<std::int32_t> lens{200, 512, 1};
  const TensorView<const std::int32_t> lens_view(lens.data(), Extents{3});
  const auto t = Tpu::page_table(view, lens_view, 8, 128, 128);
  CHECK(t.batch == 3);
  CHECK(t.pages_per_seq == 4);
  CHECK(t.pages == std::vector<std::int32_t>{7, 3, 0, 0, 2, 5, 6, 1, 4, 0, 0, 0});

  const auto fails = [&](TensorView<const std::int32_t> tab, TensorView<const std::int32_t> kv, index_t num_pages,
                         index_t page_size, index_t block_kv, const char* names) {
    CHECK_THROWS_AS(Tpu::page_table(tab, kv, num_pages, page_size, block_kv), std::invalid_argument);
    CHECK_THROWS_WITH(Tpu::page_table(tab, kv, num_pages, page_size, block_kv), ContainsSubstring(names));
  };
  fails(view, lens_view, 8, 64, 128, "page_size must equal block_kv");
  fails(view, lens_view, 7, 128, 128, "block_table[0][0] = 7");
  fails(view, lens_view, 0, 128, 128, "num_pages");
  fails(TensorView<const std::int32_t>(table.data(), Extents{12}), lens_view, 8, 128, 128,
        "block_table must have shape");
  fails(view, TensorView<const std::int32_t>(lens.data(), Extents{2}), 8, 128, 128, "kv_lens must have shape [3]");
  const std::vector<std::int32_t> too_long{200, 513, 1};
  fails(view, TensorView<const std::int32_t>(too_long.data(), Extents{3}), 8, 128, 128, "kv_lens[1] = 513");
  const std::vector<std::int32_t> reads_padding{200, 512, 129};
  fails(view, TensorView<const std::int32_t>(reads_padding.data(), Extents{3}), 8, 128, 128, "block_table[2][1] = -1");
}

}  // namespace seqattn_test_cuda_tpu_plan_test
