// The forward's K/V bands (attention/detail/packed_kv.hpp): prefill shapes
// whose plan copies each (sequence, K/V head)'s K and V once before its
// tasks, on fp32 and on the bf16 arithmetics (pair words, widening), against
// the reference. Each case first requires that the call packs. Covered: BSHD
// and THD sequences of different lengths (each band's keys from its own
// sequence), head dims 128, 72, 33, 80 (pair words padded to the kernel's
// width), GQA, K stored with a head-dim stride, softcap with KV splits,
// segment ids of the call (the plan's work refined per call), tiles whose
// first key is odd (V packed per tile instead) and tiles whose odd last key
// pairs with a key every row hides and whose V is NaN, a hidden non-finite V
// value in a later chunk of the copy; and the size limit of a band's copy.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "seqattn/attention/segment_ids.hpp"
#include "seqattn/backends/highway.hpp"
#include "seqattn/masks.hpp"

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_packed_kv_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

// Keys 45 .. 100, causally; every row hides the others. With 64-key tiles,
// the first tile's keys some row sees start at the odd key 45, and the
// second tile's stop after key 100, pairing it with key 101, which no row
// sees.
struct BandEdgesMask {
  static constexpr bool head_invariant = true;
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return kv >= 45 && kv <= 100 && kv <= q; }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

// Causal, with key 600 hidden from every row: in a 700-key sequence the band
// copy's third and last chunk of keys (512 .. 699) holds it.
struct HiddenKeyMask {
  static constexpr bool head_invariant = true;
  bool allowed(const MaskContext&, index_t q, index_t kv) const { return kv <= q && kv != 600; }
  TileClass classify(const MaskContext& ctx, const Tile& t) const { return detail::classify_by_scan(*this, ctx, t); }
};

constexpr int kWorkers = 2;

// Whether a forward call of the Highway backend on `workers` workers packs
// K/V in bands for these inputs.
template <class T, class M>
bool call_packs(const AttentionInputs<T>& in, const M& mask, const Extents& out_shape, const Extents& lse_shape,
                index_t kv_splits = 0) {
  using Kernel = backends::Highway::Kernel;
  const auto plan = plan_attention<backends::Highway>(shape_of(in), mask, PlanOptions{kv_splits}, kWorkers);
  Tensor<T> out(out_shape);
  Tensor<float> lse(lse_shape);
  const detail::AttentionProblem<T> p = detail::make_attention_problem(in, shape_of(in), out.view(), lse.view());
  const bool pairs = detail::kPackVPairs<Kernel, T>;
  if (p.segment_ids == nullptr) return !detail::kv_bands<Kernel>(p, plan.work().forward, pairs).empty();
  const detail::TiledWork refined = detail::refine_tiled_work(
      plan.work().forward, detail::SegmentTiles(*p.segment_ids, Kernel::kBlockQ, Kernel::kBlockKv));
  return !detail::kv_bands<Kernel>(p, refined, pairs).empty();
}

// The backend against the reference: fp32, then bf16 on the pair arithmetic
// and on the widening one.
template <class M>
void check_packed(const AttentionInputs<float>& in, const AttentionInputs<bfloat16>& in_bf16, const M& mask,
                  const Extents& out_shape, const Extents& lse_shape, const AttentionOptions& options = {}) {
  REQUIRE(call_packs(in, mask, out_shape, lse_shape, options.kv_splits));
  REQUIRE(call_packs(in_bf16, mask, out_shape, lse_shape, options.kv_splits));
  check_against_reference<backends::Highway>(in, mask, options, kWorkers, out_shape, lse_shape);
  for (const Bf16DotPath path : {Bf16DotPath::native, Bf16DotPath::widen}) {
    const Bf16PathScope scope(path);
    INFO("bf16 path " << static_cast<int>(path));
    check_against_reference<backends::Highway>(in_bf16, mask, options, kWorkers, out_shape, lse_shape);
  }
}

Tensor<bfloat16> to_bf16(const Tensor<float>& t) {
  Tensor<bfloat16> b(t.shape());
  for (index_t i = 0; i < t.size(); ++i) b.data()[i] = from_float<bfloat16>(t.data()[i]);
  return b;
}

// Q, K, V as BSHD in fp32 and bf16; K optionally over [B, S, D, H] storage.
struct Bshd {
  index_t batch, sq, skv, heads, kv_heads, d;
  bool k_dim_strided;
  Tensor<float> q, k, v;
  Tensor<bfloat16> qb, kb, vb;
  Bshd(std::mt19937& rng, index_t batch_, index_t sq_, index_t skv_, index_t heads_, index_t kv_heads_, index_t d_,
       bool k_dim_strided_ = false)
      : batch(batch_),
        sq(sq_),
        skv(skv_),
        heads(heads_),
        kv_heads(kv_heads_),
        d(d_),
        k_dim_strided(k_dim_strided_),
        q(random_tensor<float>(detail::make_extents({batch, sq, heads, d}), rng)),
        k(random_tensor<float>(k_dim_strided ? detail::make_extents({batch, skv, d, kv_heads})
                                             : detail::make_extents({batch, skv, kv_heads, d}),
                               rng)),
        v(random_tensor<float>(detail::make_extents({batch, skv, kv_heads, d}), rng)),
        qb(to_bf16(q)),
        kb(to_bf16(k)),
        vb(to_bf16(v)) {}
  template <class T>
  AttentionInputs<T> in(const Tensor<T>& q_, const Tensor<T>& k_, const Tensor<T>& v_) const {
    TensorView<const T> kv(k_.data(), k_.shape());
    if (k_dim_strided) {
      kv = TensorView<const T>(k_.data(), detail::make_extents({batch, skv, kv_heads, d}),
                               detail::make_extents({skv * d * kv_heads, d * kv_heads, 1, kv_heads}));
    }
    return {TensorView<const T>(q_.data(), q_.shape()), kv, TensorView<const T>(v_.data(), v_.shape())};
  }
  Extents out_shape() const { return detail::make_extents({batch, sq, heads, d}); }
  Extents lse_shape() const { return detail::make_extents({batch, heads, sq}); }
  template <class M>
  void check(const M& mask, const AttentionOptions& options = {}) const {
    check_packed(in(q, k, v), in(qb, kb, vb), mask, out_shape(), lse_shape(), options);
  }
};

}  // namespace

TEST_CASE("packed K/V bands: BSHD prefill against the reference", "[attention][packed_kv]") {
  std::mt19937 rng(2711);
  SECTION("causal, two sequences, GQA 8/2, d 128") { Bshd(rng, 2, 700, 700, 8, 2, 128).check(CausalMask{}); }
  SECTION("bottom-right causal over a longer K/V, d 72") {
    Bshd(rng, 1, 520, 650, 8, 2, 72).check(CausalMask{Alignment::bottom_right});
  }
  SECTION("full mask, odd head dim 33, K with a head-dim stride") {
    Bshd(rng, 1, 300, 333, 8, 2, 33, true).check(FullMask{});
  }
  SECTION("sliding window, d 80") { Bshd(rng, 1, 900, 900, 8, 2, 80).check(SlidingWindowMask{200, 0}); }
  SECTION("softcap and KV splits") {
    AttentionOptions options;
    options.softcap = 5.0f;
    options.kv_splits = 3;
    Bshd(rng, 1, 256, 1600, 8, 2, 64).check(FullMask{}, options);
  }
}

TEST_CASE("packed K/V bands: segment ids of the call refine the plan's tiles", "[attention][packed_kv][segment_ids]") {
  std::mt19937 rng(2716);
  const Bshd x(rng, 2, 1000, 1000, 8, 2, 64);
  // Per sequence: documents of 421 and 579 tokens, then one of 1000.
  std::vector<std::int32_t> raw_ids(2000, 3);
  for (index_t t = 0; t < 1000; ++t) raw_ids[static_cast<std::size_t>(t)] = t < 421 ? 1 : 2;
  const TensorView<const std::int32_t> raw(raw_ids.data(), detail::make_extents({2, 1000}));
  const SegmentIds ids = SegmentIds::from_segment_ids(raw);
  const auto with_ids = [&](auto in) {
    in.segment_ids = &ids;
    return in;
  };
  const auto in = with_ids(x.in(x.q, x.k, x.v));
  const auto in_bf16 = with_ids(x.in(x.qb, x.kb, x.vb));
  REQUIRE(call_packs(in, CausalMask{}, x.out_shape(), x.lse_shape()));
  REQUIRE(call_packs(in_bf16, CausalMask{}, x.out_shape(), x.lse_shape()));
  // The reference: the document mask of the same ids, without the operand.
  const auto docs = AnyMask(document_mask(ids.layout(), CausalMask{}));
  for (const bool bf16 : {false, true}) {
    for (const Bf16DotPath path : {Bf16DotPath::native, Bf16DotPath::widen}) {
      const Bf16PathScope scope(path);
      INFO("bf16 " << bf16 << " path " << static_cast<int>(path));
      const auto check = [&](const auto& with_operand, const auto& without) {
        using T = std::remove_cvref_t<decltype(*with_operand.q.data())>;
        Tensor<T> out(x.out_shape(), from_float<T>(7.0f)), want = out;
        Tensor<float> lse(x.lse_shape(), 7.0f), want_lse = lse;
        attention_forward<backends::Reference>(without, docs, want.view(), want_lse.view(), AttentionOptions{});
        execution::ThreadPool pool(kWorkers);
        const auto plan = plan_attention<backends::Highway>(shape_of(without), CausalMask{}, {}, kWorkers);
        attention_forward(plan, with_operand, out.view(), lse.view(), pool);
        const ErrorStats err = compare(out, want);
        CHECK((bf16 ? err.nmse() <= 5e-4 : err.relative() <= 1e-5));
        check_lse(lse, want_lse, bf16 ? 1e-2 : 1e-5);
      };
      if (bf16) {
        check(in_bf16, x.in(x.qb, x.kb, x.vb));
      } else {
        check(in, x.in(x.q, x.k, x.v));
      }
    }
  }
}

TEST_CASE("packed K/V bands: tiles that start at an odd key or end beside a hidden NaN key",
          "[attention][packed_kv][nan]") {
  std::mt19937 rng(2712);
  Bshd x(rng, 1, 600, 300, 16, 2, 80);
  // Keys 44 and 101 (hidden from every row) hold NaN and infinity in K and V:
  // 44 shares a pair with 45 in the band's pair words, 101 with 100.
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  for (const index_t key : {44, 101}) {
    for (index_t h = 0; h < x.kv_heads; ++h) {
      for (index_t e = 0; e < x.d; ++e) {
        x.k(0, key, h, e) = key == 44 ? kNaN : kInf;
        x.v(0, key, h, e) = key == 44 ? kInf : kNaN;
        x.kb(0, key, h, e) = from_float<bfloat16>(x.k(0, key, h, e));
        x.vb(0, key, h, e) = from_float<bfloat16>(x.v(0, key, h, e));
      }
    }
  }
  x.check(BandEdgesMask{});
}

// The band copy says per chunk of keys whether its V is finite, and tiles of
// finite chunks skip the scans for zero weights beside non-finite values: a
// hidden NaN (and an infinity) in a later chunk must still be skipped there.
// Only the last K/V head's band holds them, so a flag left over from the
// band before (whose chunk is finite) would let them through. (Which tiles
// skip the scans is not observed here: only that no result changes.)
TEST_CASE("packed K/V bands: a hidden non-finite V value in a later chunk of keys", "[attention][packed_kv][nan]") {
  std::mt19937 rng(2714);
  Bshd x(rng, 1, 700, 700, 8, 2, 128);
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  const index_t h = x.kv_heads - 1;
  for (index_t e = 0; e < x.d; ++e) {
    x.v(0, 600, h, e) = e % 2 == 0 ? kNaN : kInf;
    x.vb(0, 600, h, e) = from_float<bfloat16>(x.v(0, 600, h, e));
  }
  x.check(HiddenKeyMask{});
}

TEST_CASE("packed K/V bands: THD sequences of different lengths, one of them empty", "[attention][packed_kv][thd]") {
  std::mt19937 rng(2713);
  const std::vector<std::int32_t> q_off{0, 700, 700, 1033}, q_len{700, 0, 333, 517};
  const std::vector<std::int32_t> kv_off{0, 700, 760, 1093}, kv_len{700, 60, 333, 517};
  const SegmentTable table{q_off, q_len, kv_off, kv_len};
  const index_t heads = 6, kv_heads = 2, d = 64;
  const Tensor<float> q = random_tensor<float>(detail::make_extents({1550, heads, d}), rng);
  const Tensor<float> k = random_tensor<float>(detail::make_extents({1610, kv_heads, d}), rng);
  const Tensor<float> v = random_tensor<float>(detail::make_extents({1610, kv_heads, d}), rng);
  const Tensor<bfloat16> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  const AttentionInputs<float> in{q.view(), k.view(), v.view(), &table};
  const AttentionInputs<bfloat16> in_bf16{qb.view(), kb.view(), vb.view(), &table};
  check_packed(in, in_bf16, CausalMask{Alignment::bottom_right}, q.shape(), detail::make_extents({heads, 1550}));
}

TEST_CASE("packed K/V bands: only where the copy of a band stays within its size limit", "[attention][packed_kv]") {
  std::mt19937 rng(2715);
  const Bshd x(rng, 1, 700, 700, 8, 2, 64);
  const auto in = x.in(x.q, x.k, x.v);
  const auto plan = plan_attention<backends::Highway>(shape_of(in), CausalMask{}, {}, kWorkers);
  Tensor<float> out(x.out_shape());
  Tensor<float> lse(x.lse_shape());
  const detail::AttentionProblem<float> p = detail::make_attention_problem(in, shape_of(in), out.view(), lse.view());
  using Kernel = backends::Highway::Kernel;
  const index_t band_bytes = 700 * (64 + 64) * 4;
  CHECK_FALSE(detail::kv_bands<Kernel>(p, plan.work().forward, false, band_bytes).empty());
  CHECK(detail::kv_bands<Kernel>(p, plan.work().forward, false, band_bytes - 1).empty());
}

}  // namespace seqattn_test_attention_packed_kv_test
