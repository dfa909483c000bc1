// Paged K/V (PagedAttentionInputs): every backend on a page-table cache
// against the same backend on the contiguous layout, element by element, and
// against the reference; random page permutations, page sizes 16/64/256 and
// sizes that are no multiple of the tile, GQA, decode and prefill, BSHD and
// THD queries, masks that skip tiles, fp32 and bf16. Slots and pages no
// sequence owns hold NaN, so a read outside the table would show.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "seqattn/attention.hpp"

#include "attention/attention_test_support.hpp"
#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_paged_kv_test {

using namespace seqattn;
using seqattn::testing::compare;
using seqattn::testing::random_tensor;

namespace {

using Rng = std::mt19937;
index_t uniform(Rng& rng, index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(rng); }

struct PagedCase {
  std::vector<index_t> q_lens;   // equal for BSHD queries
  std::vector<index_t> kv_lens;  // ragged
  index_t heads = 4, kv_heads = 2, dk = 72, dv = 80, page_size = 16;
  bool thd_q = false;
  int workers = 2;
};

// One cache laid out both ways: contiguous THD K/V with a SegmentTable, and
// pages in a random order with a block table padded with -1.
template <class T>
struct PagedFixture {
  PagedCase c;
  Tensor<T> q, k, v, k_pages, v_pages;
  Tensor<std::int32_t> block_table, kv_lens_t, cu_q;
  std::vector<std::int32_t> q_off, q_len, kv_off, kv_len;
  SegmentTable table;
  index_t tq = 0;

  PagedFixture(const PagedCase& pc, Rng& rng) : c(pc) {
    const auto batch = static_cast<index_t>(c.q_lens.size());
    index_t tkv = 0;
    for (index_t b = 0; b < batch; ++b) {
      q_off.push_back(static_cast<std::int32_t>(tq));
      kv_off.push_back(static_cast<std::int32_t>(tkv));
      q_len.push_back(static_cast<std::int32_t>(c.q_lens[static_cast<std::size_t>(b)]));
      kv_len.push_back(static_cast<std::int32_t>(c.kv_lens[static_cast<std::size_t>(b)]));
      tq += c.q_lens[static_cast<std::size_t>(b)];
      tkv += c.kv_lens[static_cast<std::size_t>(b)];
    }
    table = {q_off, q_len, kv_off, kv_len};
    q = random_tensor<T>(Extents{tq, c.heads, c.dk}, rng);
    k = random_tensor<T>(Extents{tkv, c.kv_heads, c.dk}, rng);
    v = random_tensor<T>(Extents{tkv, c.kv_heads, c.dv}, rng);

    const index_t ps = c.page_size;
    index_t needed = 0, max_pages = 0;
    for (index_t len : c.kv_lens) {
      needed += (len + ps - 1) / ps;
      max_pages = std::max(max_pages, (len + ps - 1) / ps);
    }
    max_pages += uniform(rng, 0, 2);
    const index_t num_pages = needed + uniform(rng, 0, 3);
    std::vector<std::int32_t> perm(static_cast<std::size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const T nan = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    k_pages = Tensor<T>(Extents{num_pages, ps, c.kv_heads, c.dk}, nan);
    v_pages = Tensor<T>(Extents{num_pages, ps, c.kv_heads, c.dv}, nan);
    block_table = Tensor<std::int32_t>(Extents{batch, max_pages}, -1);
    kv_lens_t = Tensor<std::int32_t>(Extents{batch});
    cu_q = Tensor<std::int32_t>(Extents{batch + 1});
    std::size_t next = 0;
    for (index_t b = 0; b < batch; ++b) {
      kv_lens_t(b) = kv_len[static_cast<std::size_t>(b)];
      cu_q(b) = q_off[static_cast<std::size_t>(b)];
      for (index_t j = 0; j < kv_len[static_cast<std::size_t>(b)]; ++j) {
        if (j % ps == 0) block_table(b, j / ps) = perm[next++];
        const index_t page = block_table(b, j / ps), token = kv_off[static_cast<std::size_t>(b)] + j;
        for (index_t h = 0; h < c.kv_heads; ++h) {
          for (index_t d = 0; d < c.dk; ++d) k_pages(page, j % ps, h, d) = k(token, h, d);
          for (index_t d = 0; d < c.dv; ++d) v_pages(page, j % ps, h, d) = v(token, h, d);
        }
      }
    }
    cu_q(batch) = static_cast<std::int32_t>(tq);
  }

  AttentionInputs<T> contiguous() const { return {q.view(), k.view(), v.view(), &table}; }
  PagedAttentionInputs<T> paged() const {
    const auto batch = static_cast<index_t>(c.q_lens.size());
    TensorView<const T> qv = q.view();
    if (!c.thd_q) qv = TensorView<const T>(q.data(), Extents{batch, batch > 0 ? tq / batch : 0, c.heads, c.dk});
    PagedAttentionInputs<T> in{qv, {k_pages.view(), v_pages.view(), block_table.view(), kv_lens_t.view()}, {}};
    if (c.thd_q) in.cu_seqlens_q = cu_q.view();
    return in;
  }
  Extents out_shape() const {
    const auto batch = static_cast<index_t>(c.q_lens.size());
    return c.thd_q ? Extents{tq, c.heads, c.dv} : Extents{batch, batch > 0 ? tq / batch : 0, c.heads, c.dv};
  }
  Extents lse_shape() const {
    const auto batch = static_cast<index_t>(c.q_lens.size());
    return c.thd_q ? Extents{c.heads, tq} : Extents{batch, c.heads, batch > 0 ? tq / batch : 0};
  }
  // The contiguous (THD) lse entry of a paged lse index.
  float contiguous_lse(const Tensor<float>& lse_c, index_t i) const {
    if (c.thd_q) return lse_c.data()[i];
    const index_t sq = c.q_lens.front(), h = i / sq % c.heads, b = i / (sq * c.heads), s = i % sq;
    return lse_c(h, b * sq + s);
  }
};

// Runs Backend on the paged and on the contiguous layout and the reference on
// the contiguous one: paged == contiguous to fp32 rounding, both against the
// reference within the suite's tolerances.
template <class Backend, class T, class M>
void check_paged(const PagedCase& pc, const M& mask, Rng& rng) {
  const PagedFixture<T> f(pc, rng);
  const AttentionInputs<T> cont = f.contiguous();
  const PagedAttentionInputs<T> paged = f.paged();
  execution::ThreadPool pool(pc.workers);

  const auto plan_p = plan_attention<Backend>(shape_of(paged), mask, {}, pool.workers());
  Tensor<T> out_p(f.out_shape(), from_float<T>(7.0f));
  Tensor<float> lse_p(f.lse_shape(), 7.0f);
  attention_forward(plan_p, paged, out_p.view(), lse_p.view(), pool);

  const auto plan_c = plan_attention<Backend>(shape_of(cont), mask, {}, pool.workers());
  Tensor<T> out_c(Extents{f.tq, pc.heads, pc.dv}, from_float<T>(7.0f));
  Tensor<float> lse_c(Extents{pc.heads, f.tq}, 7.0f);
  attention_forward(plan_c, cont, out_c.view(), lse_c.view(), pool);

  const auto plan_r = plan_attention<backends::Reference>(shape_of(cont), mask);
  Tensor<T> out_r(out_c.shape(), from_float<T>(7.0f));
  Tensor<float> lse_r(lse_c.shape(), 7.0f);
  attention_forward(plan_r, cont, out_r.view(), lse_r.view());

  // Same values in the same order: only the addresses differ.
  index_t mismatches = 0, first = -1;
  for (index_t i = 0; i < out_p.size(); ++i) {
    const float g = to_float(out_p.data()[i]), w = to_float(out_c.data()[i]);
    if (!(std::abs(g - w) <= 1e-6f * std::max(1.0f, std::abs(w))) && mismatches++ == 0) first = i;
  }
  INFO("paged vs contiguous: first mismatching out index " << first);
  CHECK(mismatches == 0);
  index_t lse_bad = 0;
  for (index_t i = 0; i < lse_p.size(); ++i) {
    const float g = lse_p.data()[i], w = f.contiguous_lse(lse_c, i);
    const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= 1e-6f * std::max(1.0f, std::abs(w));
    lse_bad += ok ? 0 : 1;
  }
  CHECK(lse_bad == 0);

  const auto err = compare(out_c, out_r);
  if constexpr (std::is_same_v<T, float>) {
    CHECK(err.relative() <= 1e-5);
    seqattn::testing::check_lse(lse_c, lse_r, 1e-5);
  } else {
    CHECK(err.nmse() <= 5e-4);
    seqattn::testing::check_lse(lse_c, lse_r, 1e-2);
  }
}

template <class Each>
void each_paged_mask(Each&& each) {
  SECTION("full") { each(FullMask{}); }
  SECTION("causal, bottom-right") { each(CausalMask{Alignment::bottom_right}); }
  SECTION("sliding window") { each(SlidingWindowMask{70, 0, Alignment::bottom_right}); }
  SECTION("documents") { each(seqattn::testing::TestDocumentMask{}); }
}

}  // namespace

TEMPLATE_TEST_CASE("paged K/V equals the contiguous layout: decode", "[attention][paged]", float, bfloat16) {
  using T = TestType;
  each_paged_mask([](const auto& mask) {
    Rng rng(11);
    for (const index_t ps : {16, 64, 256, 24, 100}) {
      for (const auto& [hq, hkv] : {std::pair<index_t, index_t>{8, 1}, {32, 4}, {4, 4}}) {
        PagedCase c;
        c.q_lens = {1, 1, 1};
        c.kv_lens = {uniform(rng, 1, 700), 0, uniform(rng, 1, 300)};
        c.heads = hq;
        c.kv_heads = hkv;
        c.dk = 72;
        // dv 72 pads to 80 on AVX-512: fp32 K read page by page in place
        // beside V staged (pages of 100); V, too, page by page elsewhere.
        c.dv = ps == 100 ? 72 : 80;
        c.page_size = ps;
        INFO("page_size " << ps << " heads " << hq << "/" << hkv << " dv " << c.dv);
        check_paged<backends::Highway, T>(c, mask, rng);
        check_paged<backends::Scalar, T>(c, mask, rng);
      }
    }
  });
}

// bf16 decode on each bf16 path forced (the pair dot's 8-row blocks, AMX's
// narrowed tiles, widening): K and V rows are read in place through the page
// table, page by page. On AMX (dk 128; pages of 24 have dk 72, which AMX
// does not take) K tiles in pages of 16 run one product per page; in pages
// of 40 most tiles have a run that is not whole 16-key A tiles and are
// copied, and a tile that starts 8 keys into a page runs two 32-key
// products in place.
TEST_CASE("paged K/V equals the contiguous layout: bf16 decode on each bf16 path", "[attention][paged][decode]") {
  struct Restore {
    Bf16DotPath saved = bf16_dot_path();
    ~Restore() { set_bf16_dot_path(saved); }
  } restore;
  Rng rng(13);
  for (const Bf16DotPath path : {Bf16DotPath::native, Bf16DotPath::amx, Bf16DotPath::widen}) {
    for (const index_t ps : {16, 24, 40, 256}) {
      for (const auto& [hq, hkv] : {std::pair<index_t, index_t>{32, 4}, {8, 1}}) {
        PagedCase c;
        c.q_lens = {1, 1};
        c.kv_lens = {uniform(rng, 1, 700), uniform(rng, 1, 300)};
        c.heads = hq;
        c.kv_heads = hkv;
        c.dk = ps == 24 ? 72 : 128;
        c.dv = ps == 24 ? 80 : 128;
        c.page_size = ps;
        INFO("path " << static_cast<int>(path) << " page_size " << ps << " heads " << hq << "/" << hkv);
        set_bf16_dot_path(path);
        check_paged<backends::Highway, bfloat16>(c, CausalMask{Alignment::bottom_right}, rng);
      }
    }
  }
}

TEMPLATE_TEST_CASE("paged K/V equals the contiguous layout: prefill", "[attention][paged]", float, bfloat16) {
  using T = TestType;
  each_paged_mask([](const auto& mask) {
    Rng rng(23);
    for (const index_t ps : {16, 64, 256, 40}) {
      for (const bool thd : {false, true}) {
        PagedCase c;
        c.thd_q = thd;
        const index_t sq = uniform(rng, 1, 150);
        c.q_lens = thd ? std::vector<index_t>{uniform(rng, 0, 150), sq, 0} : std::vector<index_t>{sq, sq};
        for (index_t q : c.q_lens) c.kv_lens.push_back(q + uniform(rng, 0, 200));  // chunked prefill: history + chunk
        c.heads = 4;
        c.kv_heads = uniform(rng, 0, 1) ? 1 : 2;
        c.dk = uniform(rng, 0, 1) ? 72 : 64;
        c.dv = 80;
        c.page_size = ps;
        c.workers = static_cast<int>(uniform(rng, 1, 3));
        INFO("page_size " << ps << (thd ? " THD" : " BSHD") << " kv_heads " << c.kv_heads);
        check_paged<backends::Highway, T>(c, mask, rng);
        check_paged<backends::Scalar, T>(c, mask, rng);
      }
    }
  });
}

TEST_CASE("paged K/V on the reference backend equals its contiguous run", "[attention][paged]") {
  Rng rng(5);
  PagedCase c;
  c.q_lens = {9, 9};
  c.kv_lens = {40, 77};
  c.heads = 4;
  c.kv_heads = 2;
  c.page_size = 16;
  check_paged<backends::Reference, float>(c, CausalMask{Alignment::bottom_right}, rng);
}

TEST_CASE("paged K/V with one KV head reads whole-page tiles in place", "[attention][paged]") {
  // Hkv = 1, fp32, pages of 64 and 256: tiles inside one page are used in
  // place, those of 24-key pages staged; both equal the contiguous layout.
  Rng rng(3);
  for (const index_t ps : {64, 256, 24}) {
    PagedCase c;
    c.q_lens = {200};
    c.kv_lens = {uniform(rng, 300, 600)};
    c.heads = 2;
    c.kv_heads = 1;
    c.dk = 64;
    c.dv = 64;
    c.page_size = ps;
    check_paged<backends::Highway, float>(c, CausalMask{Alignment::bottom_right}, rng);
  }
}

TEST_CASE("paged K/V: invalid tables and shapes throw naming the argument", "[attention][paged][errors]") {
  Rng rng(1);
  PagedCase c;
  c.q_lens = {1, 1};
  c.kv_lens = {40, 20};
  c.page_size = 16;
  PagedFixture<float> f(c, rng);
  Tensor<float> out(f.out_shape()), lse(f.lse_shape());
  auto run = [&](const PagedAttentionInputs<float>& in) {
    const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{Alignment::bottom_right});
    attention_forward(plan, in, out.view(), lse.view());
  };
  REQUIRE_NOTHROW(run(f.paged()));

  SECTION("page index out of range") {
    f.block_table(1, 0) = static_cast<std::int32_t>(f.k_pages.shape()[0]);
    REQUIRE_THROWS_WITH(run(f.paged()), ContainsSubstring("block_table[1][0]") && ContainsSubstring("k_pages"));
    f.block_table(1, 0) = -1;
    REQUIRE_THROWS_WITH(run(f.paged()), ContainsSubstring("block_table[1][0] = -1"));
  }
  SECTION("block table too short for kv_len") {
    f.kv_lens_t(0) = static_cast<std::int32_t>(f.block_table.shape()[1] * 16 + 1);
    REQUIRE_THROWS_WITH(run(f.paged()), ContainsSubstring("kv_lens[0]") && ContainsSubstring("block_table has shape"));
  }
  SECTION("negative kv_len") {
    f.kv_lens_t(1) = -3;
    REQUIRE_THROWS_WITH(run(f.paged()), ContainsSubstring("kv_lens[1] = -3"));
  }
  SECTION("k and v pages disagree") {
    Tensor<float> v2(Extents{f.v_pages.shape()[0], 8, c.kv_heads, c.dv});
    auto in = f.paged();
    in.kv.v_pages = v2.view();
    REQUIRE_THROWS_WITH(run(in), ContainsSubstring("k_pages and v_pages must agree"));
  }
  SECTION("kv_lens and block_table disagree in batch") {
    Tensor<std::int32_t> lens(Extents{3}, 1);
    auto in = f.paged();
    in.kv.kv_lens = lens.view();
    REQUIRE_THROWS_WITH(run(in), ContainsSubstring("kv_lens has shape"));
  }
  SECTION("q batch differs from the block table") {
    auto in = f.paged();
    in.q = TensorView<const float>(f.q.data(), Extents{1, 2, c.heads, c.dk});
    REQUIRE_THROWS_WITH(run(in), ContainsSubstring("q has shape"));
  }
  SECTION("cu_seqlens_q of the wrong length") {
    Tensor<std::int32_t> cu(Extents{2}, 0);
    auto in = f.paged();
    in.q = f.q.view();
    in.cu_seqlens_q = cu.view();
    REQUIRE_THROWS_WITH(run(in), ContainsSubstring("cu_seqlens_q must have shape (3)"));
  }
  SECTION("a plan of other lengths") {
    const auto plan = plan_attention<backends::Highway>(shape_of(f.paged()), CausalMask{});
    f.kv_lens_t(1) = 21;
    REQUIRE_THROWS_WITH(attention_forward(plan, f.paged(), out.view(), lse.view()),
                        ContainsSubstring("the plan was made for"));
  }
  SECTION("out of the wrong shape") {
    Tensor<float> bad(Extents{2, 1, c.heads, c.dv + 1});
    const auto plan = plan_attention<backends::Highway>(shape_of(f.paged()), CausalMask{});
    REQUIRE_THROWS_WITH(attention_forward(plan, f.paged(), bad.view(), lse.view()), ContainsSubstring("out"));
  }
}

}  // namespace seqattn_test_attention_paged_kv_test
