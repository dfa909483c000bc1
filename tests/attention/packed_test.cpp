// Packed (THD) inputs: ragged segments with empty ones, padding between
// segments, head-dependent masks, prebuilt BlockMasks and strided views.
#include <cmath>
#include <random>
#include <vector>

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_packed_test {

using namespace seqattn;
using namespace seqattn::testing;

namespace {

struct Packed {
  std::vector<std::int32_t> q_offsets, q_lens, kv_offsets, kv_lens;
  index_t q_tokens = 0, kv_tokens = 0;
  SegmentTable table() const { return {q_offsets, q_lens, kv_offsets, kv_lens}; }
};

// Random segments; some have no queries, no keys or neither, and padding
// tokens sit between segments on both axes.
Packed random_segments(std::mt19937& rng, int segments, index_t max_len) {
  Packed p;
  std::uniform_int_distribution<index_t> len(0, max_len), pad(0, 3);
  for (int i = 0; i < segments; ++i) {
    index_t q = len(rng), kv = len(rng);
    if (i % 4 == 1) q = 0;
    if (i % 5 == 2) kv = 0;
    p.q_tokens += pad(rng);
    p.kv_tokens += pad(rng);
    p.q_offsets.push_back(static_cast<std::int32_t>(p.q_tokens));
    p.kv_offsets.push_back(static_cast<std::int32_t>(p.kv_tokens));
    p.q_lens.push_back(static_cast<std::int32_t>(q));
    p.kv_lens.push_back(static_cast<std::int32_t>(kv));
    p.q_tokens += q;
    p.kv_tokens += kv;
  }
  p.q_tokens += 2;
  return p;
}

template <class Backend, class T, class M>
void check_thd(const Packed& seg, index_t heads, index_t kv_heads, index_t dk, index_t dv, const M& mask,
               const AttentionOptions& options, int workers, std::mt19937& rng) {
  CAPTURE(seg.q_tokens, seg.kv_tokens, heads, kv_heads, dk, dv, workers);
  const auto q = random_tensor<T>(detail::make_extents({seg.q_tokens, heads, dk}), rng);
  const auto k = random_tensor<T>(detail::make_extents({seg.kv_tokens, kv_heads, dk}), rng);
  const auto v = random_tensor<T>(detail::make_extents({seg.kv_tokens, kv_heads, dv}), rng);
  const SegmentTable table = seg.table();
  const AttentionInputs<T> in{q.view(), k.view(), v.view(), &table};
  const auto [out, lse] =
      check_against_reference<Backend>(in, mask, options, workers, detail::make_extents({seg.q_tokens, heads, dv}),
                                       detail::make_extents({heads, seg.q_tokens}));
  // Padding tokens between segments are left alone.
  std::vector<bool> covered(static_cast<std::size_t>(seg.q_tokens), false);
  for (std::size_t i = 0; i < seg.q_lens.size(); ++i) {
    for (index_t t = seg.q_offsets[i]; t < seg.q_offsets[i] + seg.q_lens[i]; ++t) {
      covered[static_cast<std::size_t>(t)] = true;
    }
  }
  for (index_t t = 0; t < seg.q_tokens; ++t) {
    if (!covered[static_cast<std::size_t>(t)]) {
      REQUIRE(to_float(out(t, index_t{0}, index_t{0})) == 7.0f);
      REQUIRE(lse(index_t{0}, t) == 7.0f);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("THD ragged batches match the reference", "[attention][thd]", backends::Highway, backends::Scalar) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 6; ++trial) {
    const Packed seg = random_segments(rng, 3 + trial, 100);
    const int workers = 1 + trial % 3;
    const index_t group = trial % 3 == 0 ? 1 : (trial % 3 == 1 ? 4 : 8);
    const index_t d = trial % 2 ? 80 : 64;
    check_thd<TestType, float>(seg, group, 1, d, d, CausalMask{Alignment::bottom_right}, {}, workers, rng);
    check_thd<TestType, float>(seg, 2 * group, 2, d, d, TestPerHeadWindowMask{4}, {}, workers, rng);
    check_thd<TestType, float>(seg, 2, 2, 72, 72, TestRandomDenseMask{static_cast<std::uint32_t>(trial), 0.4f}, {},
                               workers, rng);
  }
}

TEST_CASE("THD with bf16 storage and decode-sized segments", "[attention][thd][bf16]") {
  std::mt19937 rng(37);
  const Packed seg = random_segments(rng, 7, 90);
  check_thd<backends::Highway, bfloat16>(seg, 8, 1, 128, 128, CausalMask{Alignment::bottom_right}, {}, 2, rng);
  // Decode: one query per segment over long, ragged KV.
  Packed decode;
  for (int i = 0; i < 4; ++i) {
    decode.q_offsets.push_back(i);
    decode.q_lens.push_back(i == 2 ? 0 : 1);
    decode.kv_offsets.push_back(static_cast<std::int32_t>(decode.kv_tokens));
    decode.kv_lens.push_back(300 + 211 * i);
    decode.kv_tokens += 300 + 211 * i;
  }
  decode.q_tokens = 4;
  for (const int workers : {1, 2, 3}) {
    check_thd<backends::Highway, float>(decode, 8, 1, 128, 128, CausalMask{Alignment::bottom_right}, {}, workers, rng);
    check_thd<backends::Highway, bfloat16>(decode, 4, 2, 64, 64, FullMask{}, {}, workers, rng);
  }
}

TEST_CASE("a prebuilt BlockMask is reused, with or without tile bits", "[attention]") {
  std::mt19937 rng(41);
  const auto q = random_tensor<float>({2, 70, 4, 64}, rng);
  const auto k = random_tensor<float>({2, 130, 2, 64}, rng);
  const auto v = random_tensor<float>({2, 130, 2, 64}, rng);
  const AttentionInputs<float> in{q.view(), k.view(), v.view()};
  const TestWindowMask mask{40, 0};
  Tensor<float> want({2, 70, 4, 64}), out({2, 70, 4, 64});
  Tensor<float> want_lse({2, 4, 70}), lse({2, 4, 70});
  attention_forward<backends::Reference>(in, mask, want.view(), want_lse.view());
  for (const bool bits : {true, false}) {
    const BlockMask bm = make_attention_block_mask<backends::Highway>(in, mask, BlockMaskOptions{bits});
    CHECK(bm.has_tile_bits() == bits);
    AttentionOptions options;
    options.block_mask = &bm;
    attention_forward(in, mask, out.view(), lse.view(), options);
    CHECK(compare(out, want).relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
  }
}

TEST_CASE("strided views: sliced tokens and a head-major (BHSD) tensor seen as BSHD", "[attention]") {
  std::mt19937 rng(43);
  // K and V interleaved in one [B, S, 2, Hkv, D] buffer; Q stored BHSD.
  const auto q_bhsd = random_tensor<float>({2, 4, 50, 72}, rng);
  const auto kv = random_tensor<float>({2, 90, 2, 2, 72}, rng);
  const TensorView<const float> qv = q_bhsd.view();
  const TensorView<const float> q(qv.data(), {2, 50, 4, 72}, {qv.stride(0), qv.stride(2), qv.stride(1), 1});
  const TensorView<const float> k = kv.view().select(2, 0);
  const TensorView<const float> v = kv.view().select(2, 1);
  // V with a non-unit dim stride: every other element of a wider buffer.
  const auto v_wide = random_tensor<float>({2, 90, 2, 144}, rng);
  const TensorView<const float> vw = v_wide.view();
  const TensorView<const float> v_strided(vw.data(), {2, 90, 2, 72}, {vw.stride(0), vw.stride(1), vw.stride(2), 2});
  for (const auto& vv : {v, v_strided}) {
    const AttentionInputs<float> in{q, k, vv};
    Tensor<float> want({2, 50, 4, 72}), out({2, 50, 4, 72});
    Tensor<float> want_lse({2, 4, 50}), lse({2, 4, 50});
    attention_forward<backends::Reference>(in, CausalMask{}, want.view(), want_lse.view());
    attention_forward(in, CausalMask{}, out.view(), lse.view());
    CHECK(compare(out, want).relative() <= 1e-5);
    check_lse(lse, want_lse, 1e-5);
    // Output written through a strided view too, lse not requested.
    Tensor<float> out_bhsd({2, 4, 50, 72});
    const TensorView<float> ob = out_bhsd.view();
    const TensorView<float> out_view(ob.data(), {2, 50, 4, 72}, {ob.stride(0), ob.stride(2), ob.stride(1), 1});
    attention_forward<backends::Scalar>(in, CausalMask{}, out_view, TensorView<float>{});
    const double tol = 1e-5 * compare(want, want).max_abs_ref;
    for (index_t b = 0; b < 2; ++b) {
      for (index_t i = 0; i < 50; ++i) {
        for (index_t h = 0; h < 4; ++h) {
          for (index_t e = 0; e < 72; e += 7) {
            REQUIRE(std::abs(out_bhsd(b, h, i, e) - want(b, i, h, e)) <= tol);
          }
        }
      }
    }
  }
}

}  // namespace seqattn_test_attention_packed_test
