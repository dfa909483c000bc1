// backends::Cuda against the reference backend, element by element: every
// mask kind, BSHD and THD with empty segments, head dims 64/72/80/128/256,
// GQA with and without packed heads, KV splits, every device variant, bf16
// and fp16, fully masked rows, and the errors of bad calls; the backward pass
// (dq, dk, dv, dsinks) likewise for head dims up to 128, deterministic; and
// variants that run their own score hooks on the device (Bias over a device
// tensor, a user's ScoreMod and variant type), forward and backward.
//
// Needs a CUDA device: without one the binary prints why and exits with 77,
// which CTest reports as skipped (SKIP_RETURN_CODE). Catch2's implementation
// comes from seqattn_catch (tests/support/catch_implementation.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "seqattn/backends/cuda.cuh"
#include "seqattn/masks.hpp"

#include "attention/attention_test_support.hpp"
#include "support/catch_session.hpp"

namespace seqattn::testing {
namespace {

template <class T>
struct DeviceTensor {
  cuda::DeviceBuffer<T> buffer;
  Extents shape;

  explicit DeviceTensor(const Tensor<T>& host) : buffer(static_cast<std::size_t>(host.size())), shape(host.shape()) {
    buffer.upload(std::span<const T>(host.data(), static_cast<std::size_t>(host.size())));
  }
  TensorView<T> view() const { return TensorView<T>(buffer.data(), shape); }
  Tensor<T> download() const {
    Tensor<T> host(shape);
    cuda::check(cudaMemcpy(host.data(), buffer.data(), buffer.size() * sizeof(T), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    return host;
  }
};

template <class T>
Tensor<T> rounded_to(const Tensor<float>& x) {
  Tensor<T> t(x.shape());
  for (index_t i = 0; i < x.size(); ++i) t.data()[i] = from_float<T>(x.data()[i]);
  return t;
}
template <class T>
Tensor<float> widened(const Tensor<T>& x) {
  Tensor<float> t(x.shape());
  for (index_t i = 0; i < x.size(); ++i) t.data()[i] = to_float(x.data()[i]);
  return t;
}

struct Problem {
  Tensor<float> q, k, v;
  const SegmentTable* segments = nullptr;
};

Problem random_bshd(std::mt19937& rng, index_t batch, index_t sq, index_t skv, index_t heads, index_t kv_heads,
                    index_t dk, index_t dv) {
  return {random_tensor<float>(detail::make_extents({batch, sq, heads, dk}), rng),
          random_tensor<float>(detail::make_extents({batch, skv, kv_heads, dk}), rng),
          random_tensor<float>(detail::make_extents({batch, skv, kv_heads, dv}), rng)};
}

// The inputs rounded to T, the same values widened to fp32 for the reference,
// and the shapes of out and LSE.
template <class T>
struct Rounded {
  Tensor<T> q, k, v;
  Tensor<float> qf, kf, vf;
  AttentionInputs<float> ref_in;
  AttentionShape shape;
  Extents out_shape, lse_shape;

  explicit Rounded(const Problem& pr)
      : q(rounded_to<T>(pr.q)),
        k(rounded_to<T>(pr.k)),
        v(rounded_to<T>(pr.v)),
        qf(widened(q)),
        kf(widened(k)),
        vf(widened(v)),
        ref_in{qf.view(), kf.view(), vf.view(), pr.segments},
        shape(shape_of(ref_in)),
        out_shape(pr.q.shape()) {
    out_shape[out_shape.rank() - 1] = shape.dv;
    lse_shape = shape.layout == Layout::bshd ? detail::make_extents({shape.batch(), shape.heads, pr.q.extent(1)})
                                             : detail::make_extents({shape.heads, pr.q.extent(0)});
  }
  Rounded(const Rounded&) = delete;  // ref_in views the members
  Rounded& operator=(const Rounded&) = delete;
};

struct Result {
  Tensor<float> out, lse;
  AttentionShape shape;
};

// Set by the test of the mma.sync prefill kernel: plans that would take the
// Hopper kernel (LaunchPlan::wgmma) take the mma.sync one instead.
bool force_mma_sync = false;

// Runs the Cuda backend on the inputs rounded to T and the reference backend
// on the same rounded values in fp32; checks every output element and LSE.
// host_variant: the variant the reference runs, when `variant` reads device
// memory (a BiasTensor); the same values in host memory.
template <class T, class M, class V>
Result check_cuda(const Problem& pr, const M& mask, const V& variant, PlanOptions options = {},
                  const V* host_variant = nullptr) {
  const Rounded<T> r(pr);
  const Tensor<T>&q = r.q, &k = r.k, &v = r.v;
  const AttentionInputs<float>& ref_in = r.ref_in;
  const AttentionShape& shape = r.shape;
  const Extents &out_shape = r.out_shape, &lse_shape = r.lse_shape;
  Tensor<float> want(out_shape, 7.0f), want_lse(lse_shape, 7.0f);
  attention_forward(plan_attention<backends::Reference>(shape, mask), ref_in, want.view(), want_lse.view(),
                    host_variant ? *host_variant : variant);

  const DeviceTensor<T> dq(q), dk(k), dv(v);
  DeviceTensor<T> dout(Tensor<T>(out_shape, from_float<T>(7.0f)));
  DeviceTensor<float> dlse(Tensor<float>(lse_shape, 7.0f));
  const AttentionInputs<T> in{dq.view(), dk.view(), dv.view(), pr.segments};
  const auto plan = plan_attention<backends::Cuda>(shape, mask, options);
  cuda::LaunchPlan& launch = plan.work().device->launch;
  if (force_mma_sync) launch.wgmma = false;
  INFO("kernel: " << (launch.decode ? "decode" : launch.wgmma ? "wgmma" : "mma.sync"));
  attention_forward(plan, in, dout.view(), dlse.view(), variant, cuda::Stream{});
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const Tensor<float> got = widened(dout.download());
  const Tensor<float> got_lse = dlse.download();

  const double tol = std::is_same_v<T, bfloat16> ? 2e-2 : 4e-3;
  index_t bad = 0, first_bad = -1;
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    if (!(std::abs(g - w) <= tol * (1.0 + std::abs(w))) && bad++ == 0) first_bad = i;
  }
  INFO(shape << "; first mismatching output element " << first_bad << " of " << got.size());
  CHECK(bad == 0);
  CHECK(compare(got, want).nmse() <= (std::is_same_v<T, bfloat16> ? 2e-4 : 1e-5));
  check_lse(got_lse, want_lse, 1e-3);
  // Rows no key may attend to: exactly zero.
  index_t nonzero = 0;
  if (shape.layout == Layout::bshd) {
    for (index_t b = 0; b < shape.batch(); ++b)
      for (index_t h = 0; h < shape.heads; ++h)
        for (index_t i = 0; i < pr.q.extent(1); ++i)
          if (want_lse(b, h, i) == -INFINITY)
            for (index_t d = 0; d < shape.dv; ++d) nonzero += got(b, i, h, d) != 0.0f;
  }
  CHECK(nonzero == 0);
  return {got, got_lse, shape};
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST_CASE("cuda: every mask kind, BSHD, head dims 64 to 256", "[cuda][gpu]") {
  std::mt19937 rng(11);
  each_mask_kind([&](const auto& mask) {
    for (const auto& [dk, dv] : {std::pair<index_t, index_t>{64, 64}, {72, 72}, {80, 48}, {128, 128}, {256, 256}}) {
      INFO("dk " << dk << ", dv " << dv);
      const Problem pr = random_bshd(rng, 2, 150, 203, 6, 2, dk, dv);
      check_cuda<bfloat16>(pr, mask, variants::Default{});
    }
  });
}

// On a compute capability 9.x device with the Hopper kernel built
// (SEQATTN_CUDA_WGMMA), prefill plans of head dims up to 128 take it, and the
// other tests check it; here the mma.sync kernel runs those shapes too.
TEST_CASE("cuda: the mma.sync prefill kernel where the Hopper kernel would run", "[cuda][gpu]") {
  int device = 0, major = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  cuda::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  std::mt19937 rng(23);
  {
    const Problem pr = random_bshd(rng, 1, 300, 300, 2, 2, 128, 128);
    const Rounded<bfloat16> r(pr);
    const auto plan = plan_attention<backends::Cuda>(r.shape, CausalMask{});
    CHECK(plan.work().device->launch.wgmma == (cuda::kWgmmaBuilt && major == 9));
  }
  struct ForceMmaSync {
    ForceMmaSync() { force_mma_sync = true; }
    ~ForceMmaSync() { force_mma_sync = false; }
  } force;
  each_mask_kind([&](const auto& mask) {
    for (const auto& [dk, dv] : {std::pair<index_t, index_t>{64, 64}, {80, 48}, {128, 128}}) {
      INFO("dk " << dk << ", dv " << dv);
      const Problem pr = random_bshd(rng, 2, 150, 203, 6, 2, dk, dv);
      check_cuda<bfloat16>(pr, mask, variants::Default{});
    }
  });
}

TEST_CASE("cuda: long rows, several q-blocks and kv splits", "[cuda][gpu]") {
  std::mt19937 rng(12);
  const Problem pr = random_bshd(rng, 1, 700, 1100, 4, 4, 128, 128);
  SECTION("causal, bottom-right") {
    check_cuda<bfloat16>(pr, CausalMask{Alignment::bottom_right}, variants::Default{});
  }
  SECTION("window, forced splits") {
    PlanOptions o;
    o.kv_splits = 5;
    check_cuda<bfloat16>(pr, SlidingWindowMask{300, 0, Alignment::bottom_right}, variants::Default{}, o);
  }
  SECTION("rows with no allowed key, forced splits, sinks") {
    PlanOptions o;
    o.kv_splits = 3;
    const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
    check_cuda<bfloat16>(pr, TestBlankRowsMask{}, variants::Sinks{sinks}, o);
  }
}

TEST_CASE("cuda: decode packs GQA heads and splits the keys", "[cuda][gpu]") {
  std::mt19937 rng(13);
  for (const index_t sq : {1, 3, 16}) {
    INFO("q_len " << sq);
    const Problem pr = random_bshd(rng, 2, sq, 5000, 32, 4, 128, 128);
    const auto plan = plan_attention<backends::Cuda>(
        shape_of(AttentionInputs<float>{pr.q.view(), pr.k.view(), pr.v.view()}), CausalMask{Alignment::bottom_right});
    CHECK(plan.work().device->launch.heads_per_cta == 8);
    CHECK(plan.work().device->launch.kv_splits > 1);
    CHECK(plan.work().device->launch.decode == (sq * 8 <= 16));
    check_cuda<bfloat16>(pr, CausalMask{Alignment::bottom_right}, variants::Default{});
    const std::vector<float> sinks(32, 1.5f);
    check_cuda<bfloat16>(pr, FullMask{}, variants::Sinks{sinks});
  }
}

TEST_CASE("cuda: decode kernel with per-head masks and score variants", "[cuda][gpu]") {
  std::mt19937 rng(20);
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f, 0.03f, 0.02f},
      sinks{1.0f, -2.0f, 0.0f, 3.0f, 0.5f, 9.0f};
  for (const index_t dim : {64, 80, 128}) {
    INFO("head dim " << dim);
    const Problem pr = random_bshd(rng, 3, 5, 777, 6, 2, dim, dim);
    const AttentionShape shape = shape_of(AttentionInputs<float>{pr.q.view(), pr.k.view(), pr.v.view()});
    const auto plan = plan_attention<backends::Cuda>(shape, TestPerHeadWindowMask{40});
    CHECK(plan.work().device->launch.decode);
    CHECK(plan.work().device->launch.heads_per_cta == 1);
    check_cuda<bfloat16>(pr, TestPerHeadWindowMask{40}, variants::Default{});
    check_cuda<bfloat16>(pr, TestBlankRowsMask{},
                         variants::chain(variants::Softcap{6.0f}, variants::Alibi{slopes}, variants::Sinks{sinks}));
    PlanOptions one_split;
    one_split.kv_splits = 1;
    check_cuda<bfloat16>(pr, CausalMask{Alignment::bottom_right}, variants::Sinks{sinks}, one_split);
  }
}

// Paged K/V: pages in random order, read through a host block table (the
// backend uploads the page list); BSHD decode and THD queries.
TEST_CASE("cuda: paged K/V cache", "[cuda][gpu][paged]") {
  std::mt19937 rng(21);
  for (const index_t page_size : {16, 64, 100}) {
    INFO("page_size " << page_size);
    const std::vector<std::int32_t> kv_lens{1000, 1, 333, 0};
    const index_t batch = 4, heads = 8, kv_heads = 2, dim = 128, max_pages = 1000 / page_size + 2;
    index_t num_pages = 0;
    for (const auto len : kv_lens) num_pages += (len + page_size - 1) / page_size;
    num_pages += 3;  // pages nobody reads
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int32_t> table(static_cast<std::size_t>(batch * max_pages), -1);
    std::size_t next = 0;
    for (index_t b = 0; b < batch; ++b)
      for (index_t i = 0; i < (kv_lens[static_cast<std::size_t>(b)] + page_size - 1) / page_size; ++i)
        table[static_cast<std::size_t>(b * max_pages + i)] = order[next++];
    const Tensor<bfloat16> kp =
        rounded_to<bfloat16>(random_tensor<float>(detail::make_extents({num_pages, page_size, kv_heads, dim}), rng));
    const Tensor<bfloat16> vp =
        rounded_to<bfloat16>(random_tensor<float>(detail::make_extents({num_pages, page_size, kv_heads, dim}), rng));
    const Tensor<float> kpf = widened(kp), vpf = widened(vp);
    const TensorView<const std::int32_t> table_view(table.data(), Extents{batch, max_pages});
    const TensorView<const std::int32_t> lens_view(kv_lens.data(), Extents{batch});
    const DeviceTensor<bfloat16> dkp(kp), dvp(vp);

    for (const bool thd : {false, true}) {
      INFO((thd ? "THD queries" : "BSHD decode"));
      const std::vector<std::int32_t> cu{0, 3, 4, 20, 20};
      const Extents q_shape =
          thd ? detail::make_extents({20, heads, dim}) : detail::make_extents({batch, 1, heads, dim});
      const Tensor<bfloat16> q = rounded_to<bfloat16>(random_tensor<float>(q_shape, rng));
      const Tensor<float> qf = widened(q);
      const TensorView<const std::int32_t> cu_view =
          thd ? TensorView<const std::int32_t>(cu.data(), Extents{batch + 1}) : TensorView<const std::int32_t>{};
      const PagedAttentionInputs<float> ref_in{qf.view(), {kpf.view(), vpf.view(), table_view, lens_view}, cu_view};
      const AttentionShape shape = shape_of(ref_in);
      const Extents lse_shape = thd ? detail::make_extents({heads, 20}) : detail::make_extents({batch, heads, 1});
      Tensor<float> want(q_shape, 7.0f), want_lse(lse_shape, 7.0f);
      const CausalMask mask{Alignment::bottom_right};
      const std::vector<float> sinks(static_cast<std::size_t>(heads), 0.25f);
      attention_forward(plan_attention<backends::Reference>(shape, mask), ref_in, want.view(), want_lse.view(),
                        variants::Sinks{sinks});

      const DeviceTensor<bfloat16> dq(q);
      DeviceTensor<bfloat16> dout(Tensor<bfloat16>(q_shape, bfloat16(7.0f)));
      DeviceTensor<float> dlse(Tensor<float>(lse_shape, 7.0f));
      const PagedAttentionInputs<bfloat16> in{dq.view(), {dkp.view(), dvp.view(), table_view, lens_view}, cu_view};
      const auto plan = plan_attention<backends::Cuda>(shape, mask);
      for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the uploaded page list
        attention_forward(plan, in, dout.view(), dlse.view(), variants::Sinks{sinks}, cuda::Stream{});
      }
      cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      const Tensor<float> got = widened(dout.download());
      index_t bad = 0;
      for (index_t i = 0; i < got.size(); ++i) {
        const double g = got.data()[i], w = want.data()[i];
        bad += !(std::abs(g - w) <= 2e-2 * (1.0 + std::abs(w)));
      }
      CHECK(bad == 0);
      check_lse(dlse.download(), want_lse, 1e-3);
    }
  }
}

// The requests of a multi-item layout packed as THD (8 query heads over 2
// K/V heads, d = 64), after a gap of 3 tokens: rows nobody writes.
struct PackedRequests {
  std::vector<std::int32_t> offsets, lens;
  SegmentTable table;
  Problem problem;

  PackedRequests(const MultiItemLayout& layout, std::mt19937& rng) {
    const RaggedLengths lengths = layout.lengths();
    index_t tokens = 3;
    for (index_t b = 0; b < lengths.batch(); ++b) {
      offsets.push_back(static_cast<std::int32_t>(tokens));
      lens.push_back(static_cast<std::int32_t>(lengths.q[static_cast<std::size_t>(b)]));
      tokens += lengths.q[static_cast<std::size_t>(b)];
    }
    table = SegmentTable{offsets, lens, offsets, lens};
    problem = Problem{random_tensor<float>(detail::make_extents({tokens, 8, 64}), rng),
                      random_tensor<float>(detail::make_extents({tokens, 2, 64}), rng),
                      random_tensor<float>(detail::make_extents({tokens, 2, 64}), rng), &table};
  }
  PackedRequests(const PackedRequests&) = delete;  // table views offsets and lens, problem the table
  PackedRequests& operator=(const PackedRequests&) = delete;
};

// Packed THD with an empty segment, a one-token one and one without keys
// (4 query heads over 1 K/V head, d = 128).
struct VarlenSegments {
  std::vector<std::int32_t> q_off{0, 5, 5, 300, 301}, q_len{5, 0, 295, 1, 200};
  std::vector<std::int32_t> kv_off{0, 10, 10, 400, 401}, kv_len{10, 0, 390, 1, 0};
  SegmentTable table{q_off, q_len, kv_off, kv_len};
  Problem problem;

  explicit VarlenSegments(std::mt19937& rng)
      : problem{random_tensor<float>(detail::make_extents({501, 4, 128}), rng),
                random_tensor<float>(detail::make_extents({401, 1, 128}), rng),
                random_tensor<float>(detail::make_extents({401, 1, 128}), rng), &table} {}
  VarlenSegments(const VarlenSegments&) = delete;  // table views the vectors, problem the table
  VarlenSegments& operator=(const VarlenSegments&) = delete;
};

TEST_CASE("cuda: packed THD with empty segments", "[cuda][gpu][thd]") {
  std::mt19937 rng(14);
  SECTION("multi-item requests") {
    MultiItemLayout layout;
    layout.add_items(20, std::vector<index_t>{7, 0, 30, 12});
    layout.add_items(5, std::vector<index_t>{40});
    layout.add_items(130, std::vector<index_t>{1, 2, 3, 70});
    const PackedRequests requests(layout, rng);
    check_cuda<bfloat16>(requests.problem, multi_item_mask(layout), variants::Default{});
  }
  SECTION("varlen causal with empty and one-token segments") {
    const VarlenSegments varlen(rng);
    check_cuda<bfloat16>(varlen.problem, CausalMask{Alignment::bottom_right}, variants::Default{});
  }
}

TEST_CASE("cuda: data-driven masks", "[cuda][gpu]") {
  std::mt19937 rng(15);
  const index_t batch = 2, len = 333;
  const Problem pr = random_bshd(rng, batch, len, len, 4, 2, 128, 128);
  SECTION("documents") {
    std::vector<std::int32_t> ids;
    for (index_t b = 0; b < batch; ++b)
      for (index_t t = 0; t < len; ++t) ids.push_back(static_cast<std::int32_t>(1 + t / (17 + 40 * b)));
    const DocumentLayout layout =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{batch, len}));
    check_cuda<bfloat16>(pr, document_mask(layout, CausalMask{}), variants::Default{});
  }
  SECTION("top-k AND causal") {
    std::vector<float> scores(static_cast<std::size_t>(batch * len * len));
    std::normal_distribution<float> dist;
    for (float& s : scores) s = dist(rng);
    const Tensor<std::int32_t> idx = top_k(TensorView<const float>(scores.data(), Extents{batch, len, len}), 40);
    const TopKLayout layout = TopKLayout::from_indices(idx.view(), len);
    check_cuda<bfloat16>(pr, topk_mask(layout) & CausalMask{}, variants::Default{});
  }
}

TEST_CASE("cuda: score variants", "[cuda][gpu]") {
  std::mt19937 rng(16);
  const Problem pr = random_bshd(rng, 2, 190, 260, 4, 2, 128, 128);
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f}, sinks{1.0f, -2.0f, 0.0f, 3.0f};
  const CausalMask causal{Alignment::bottom_right};
  SECTION("scale") { check_cuda<bfloat16>(pr, causal, variants::Scale{0.3f}); }
  SECTION("softcap") {
    check_cuda<bfloat16>(pr, causal, variants::chain(variants::Scale{1.0f}, variants::Softcap{5.0f}));
  }
  SECTION("sinks") { check_cuda<bfloat16>(pr, TestBlankRowsMask{}, variants::Sinks{sinks}); }
  SECTION("alibi") { check_cuda<bfloat16>(pr, causal, variants::Alibi{slopes}); }
  SECTION("softcap then alibi, with sinks") {
    check_cuda<bfloat16>(pr, causal,
                         variants::chain(variants::Softcap{8.0f}, variants::Alibi{slopes}, variants::Sinks{sinks}));
  }
  SECTION("standard") {
    variants::Standard s;
    s.scale_value = 0.2f;
    s.softcap = {10.0f};
    s.sinks = {sinks};
    check_cuda<bfloat16>(pr, causal, s);
  }
}

TEST_CASE("cuda: fp16 storage", "[cuda][gpu]") {
  std::mt19937 rng(17);
  const Problem pr = random_bshd(rng, 2, 130, 140, 8, 2, 64, 64);
  check_cuda<float16>(pr, CausalMask{}, variants::Default{});
  const Problem dec = random_bshd(rng, 1, 1, 3000, 8, 1, 256, 256);
  check_cuda<float16>(dec, FullMask{}, variants::Default{});
}

TEST_CASE("cuda: one plan, many calls on two streams", "[cuda][gpu]") {
  std::mt19937 rng(18);
  const Problem a = random_bshd(rng, 1, 200, 200, 2, 2, 64, 64), b = random_bshd(rng, 1, 200, 200, 2, 2, 64, 64);
  const Tensor<bfloat16> qa = rounded_to<bfloat16>(a.q), ka = rounded_to<bfloat16>(a.k), va = rounded_to<bfloat16>(a.v);
  const Tensor<bfloat16> qb = rounded_to<bfloat16>(b.q), kb = rounded_to<bfloat16>(b.k), vb = rounded_to<bfloat16>(b.v);
  const DeviceTensor<bfloat16> dqa(qa), dka(ka), dva(va), dqb(qb), dkb(kb), dvb(vb);
  DeviceTensor<bfloat16> oa(Tensor<bfloat16>(qa.shape())), ob(Tensor<bfloat16>(qa.shape()));
  const AttentionInputs<bfloat16> ina{dqa.view(), dka.view(), dva.view()}, inb{dqb.view(), dkb.view(), dvb.view()};
  const auto plan = plan_attention<backends::Cuda>(shape_of(ina), CausalMask{});
  cudaStream_t s1, s2;
  cuda::check(cudaStreamCreate(&s1), "cudaStreamCreate");
  cuda::check(cudaStreamCreate(&s2), "cudaStreamCreate");
  const std::vector<float> sa{1.0f, 2.0f}, sb{-1.0f, 0.5f};
  for (int rep = 0; rep < 5; ++rep) {
    attention_forward(plan, ina, oa.view(), {}, variants::Sinks{sa}, cuda::Stream{s1});
    attention_forward(plan, inb, ob.view(), {}, variants::Sinks{sb}, cuda::Stream{s2});
  }
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  for (int which = 0; which < 2; ++which) {
    const Tensor<float> qf = widened(which ? qb : qa), kf = widened(which ? kb : ka), vf = widened(which ? vb : va);
    const AttentionInputs<float> in{qf.view(), kf.view(), vf.view()};
    Tensor<float> want(qf.shape());
    attention_forward(plan_attention<backends::Reference>(shape_of(in), CausalMask{}), in, want.view(), {},
                      variants::Sinks{which ? sb : sa});
    CHECK(compare(widened((which ? ob : oa).download()), want).nmse() <= 2e-4);
  }
}

TEST_CASE("cuda: bad calls throw and name the problem", "[cuda][gpu][errors]") {
  std::mt19937 rng(19);
  const Problem pr = random_bshd(rng, 1, 40, 40, 2, 2, 64, 64);
  const Tensor<bfloat16> q = rounded_to<bfloat16>(pr.q), k = rounded_to<bfloat16>(pr.k), v = rounded_to<bfloat16>(pr.v);
  Tensor<bfloat16> out(q.shape());
  const AttentionInputs<bfloat16> host_in{q.view(), k.view(), v.view()};
  const auto plan = plan_attention<backends::Cuda>(shape_of(host_in), CausalMask{});
  CHECK_THROWS_WITH(attention_forward(plan, host_in, out.view(), {}),
                    ContainsSubstring("q must point to device memory"));

  // fp32 inputs are rejected at compile time (kStores): attention_forward static_asserts.

  AttentionShape odd = shape_of(host_in);
  odd.dk = 12;
  CHECK_THROWS_WITH(plan_attention<backends::Cuda>(odd, CausalMask{}), ContainsSubstring("multiples of 8"));
  odd.dk = 320;
  CHECK_THROWS_WITH(plan_attention<backends::Cuda>(odd, CausalMask{}), ContainsSubstring("head dims up to 256"));
  PlanOptions no_bits;
  no_bits.store_tile_bits = false;
  CHECK_THROWS_WITH(plan_attention<backends::Cuda>(shape_of(host_in), CausalMask{}, no_bits),
                    ContainsSubstring("store_tile_bits"));

  // A K view with a head stride that breaks 16-byte rows.
  const DeviceTensor<bfloat16> dq(q), dv(v);
  Tensor<bfloat16> wide(detail::make_extents({1, 40, 2, 68}));
  const DeviceTensor<bfloat16> dwide(wide);
  DeviceTensor<bfloat16> dout(out);
  const TensorView<const bfloat16> k_odd(dwide.buffer.data(), detail::make_extents({1, 40, 2, 64}),
                                         Strides(detail::make_extents({40 * 2 * 68, 2 * 68, 68, 1})));
  const AttentionInputs<bfloat16> odd_in{dq.view(), k_odd, dv.view()};
  CHECK_THROWS_WITH(attention_forward(plan, odd_in, dout.view(), {}), ContainsSubstring("16-byte aligned"));
}

// ---- NaN policy (README, "NaN and infinity") ----------------------------------
// Not yet run on a GPU when written (no device in that session): the
// kernels' NaN handling compiled with nvcc only.

// Backends::Cuda against the reference on inputs holding NaN or infinity:
// NaN exactly where the reference has NaN (out and LSE), infinities equal,
// everything else within the tolerance of check_cuda.
template <class T, class M, class V>
void check_cuda_policy(const Problem& pr, const M& mask, const V& variant, PlanOptions options = {}) {
  const Rounded<T> r(pr);
  const Tensor<T>&q = r.q, &k = r.k, &v = r.v;
  const AttentionInputs<float>& ref_in = r.ref_in;
  const AttentionShape& shape = r.shape;
  const Extents &out_shape = r.out_shape, &lse_shape = r.lse_shape;
  Tensor<float> want(out_shape, 7.0f), want_lse(lse_shape, 7.0f);
  attention_forward(plan_attention<backends::Reference>(shape, mask), ref_in, want.view(), want_lse.view(), variant);

  const DeviceTensor<T> dq(q), dk(k), dv(v);
  DeviceTensor<T> dout(Tensor<T>(out_shape, from_float<T>(7.0f)));
  DeviceTensor<float> dlse(Tensor<float>(lse_shape, 7.0f));
  const AttentionInputs<T> in{dq.view(), dk.view(), dv.view(), pr.segments};
  const auto plan = plan_attention<backends::Cuda>(shape, mask, options);
  cuda::LaunchPlan& launch = plan.work().device->launch;
  if (force_mma_sync) launch.wgmma = false;
  INFO("kernel: " << (launch.decode ? "decode" : launch.wgmma ? "wgmma" : "mma.sync"));
  attention_forward(plan, in, dout.view(), dlse.view(), variant, cuda::Stream{});
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const Tensor<float> got = widened(dout.download());
  const Tensor<float> got_lse = dlse.download();

  auto mismatches = [](const Tensor<float>& g, const Tensor<float>& w, double tol) {
    index_t bad = 0;
    for (index_t i = 0; i < g.size(); ++i) {
      const double a = g.data()[i], b = w.data()[i];
      if (std::isnan(a) || std::isnan(b)) {
        bad += !(std::isnan(a) && std::isnan(b));
      } else if (std::isinf(a) || std::isinf(b)) {
        bad += a != b;
      } else {
        bad += !(std::abs(a - b) <= tol * (1.0 + std::abs(b)));
      }
    }
    return bad;
  };
  index_t nan_rows = 0;
  for (index_t i = 0; i < want_lse.size(); ++i) nan_rows += std::isnan(want_lse.data()[i]);
  INFO(shape << "; " << nan_rows << " NaN rows in the reference");
  CHECK(mismatches(got, want, std::is_same_v<T, bfloat16> ? 2e-2 : 4e-3) == 0);
  CHECK(mismatches(got_lse, want_lse, 1e-3) == 0);
}

// Documents of 50, 70 and 40 tokens in one sequence (TestDocumentMask{{50, 70,
// 40}}); document 1 holds NaN and infinities in K, V and Q rows that tiles
// share with the other documents.
Problem documents_with_non_finite_values(std::mt19937& rng) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Problem pr = random_bshd(rng, 1, 160, 160, 4, 2, 128, 128);
  for (index_t e = 0; e < 128; ++e) {
    pr.v(0, 118, 0, e) = nan;
    pr.v(0, 119, 1, e) = e % 2 ? inf : -inf;
  }
  pr.k(0, 100, 1, 5) = nan;
  pr.q(0, 80, 2, 3) = nan;
  return pr;
}

TEST_CASE("cuda: NaN policy: values the mask hides never reach a row", "[cuda][gpu][nan]") {
  std::mt19937 rng(41);
  const Problem pr = documents_with_non_finite_values(rng);
  const TestDocumentMask documents{{50, 70, 40}};
  check_cuda_policy<bfloat16>(pr, documents, variants::Default{});
  check_cuda_policy<float16>(pr, documents, variants::Default{});
  PlanOptions split;
  split.kv_splits = 3;
  check_cuda_policy<bfloat16>(pr, documents, variants::Default{}, split);
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  check_cuda_policy<bfloat16>(pr, documents, variants::Sinks{sinks});
}

TEST_CASE("cuda: NaN policy in the decode kernel and the split merge", "[cuda][gpu][nan]") {
  std::mt19937 rng(42);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Problem pr = random_bshd(rng, 2, 1, 3000, 32, 4, 128, 128);
  // Sequence 0: a NaN V row outside the window (hidden); sequence 1: a NaN
  // key inside it for K/V head 2 (its 8 query heads turn NaN).
  for (index_t e = 0; e < 128; ++e) pr.v(0, 1000, 1, e) = nan;
  pr.k(1, 2900, 2, 7) = nan;
  const SlidingWindowMask window{600, 0, Alignment::bottom_right};
  check_cuda_policy<bfloat16>(pr, window, variants::Default{});
  PlanOptions split;
  split.kv_splits = 6;
  check_cuda_policy<bfloat16>(pr, window, variants::Default{}, split);
  check_cuda_policy<float16>(pr, window, variants::Default{}, split);
}

// ---- Backward ------------------------------------------------------------------

// Gradients of the Cuda backend against the reference's, element by element,
// on the scale of the whole tensor: |got - want| against tol (|want| + rms(want)).
// Like FlashAttention, the kernels round P and dS to the storage type before
// the tensor cores, so an element's error follows the size of the terms of
// its sum (large where dS is, whatever cancellation leaves), not its value:
// its distribution has a tail. So: no element beyond 4 tol, at most one in
// 10^4 (and 2) beyond tol, and a bounded normalized squared error. NaN and
// infinities must sit exactly where the reference has them.
index_t gradient_mismatches(const Tensor<float>& got, const Tensor<float>& want, double tol, double max_nmse,
                            std::string& first) {
  double sq = 0;
  index_t finite = 0;
  for (index_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(want.data()[i])) {
      sq += double{want.data()[i]} * want.data()[i];
      ++finite;
    }
  }
  const double rms = finite > 0 ? std::sqrt(sq / static_cast<double>(finite)) : 0.0;
  index_t bad = 0, outliers = 0;
  double sq_diff = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    bool ok = true;
    if (std::isnan(g) || std::isnan(w)) {
      ok = std::isnan(g) && std::isnan(w);
    } else if (std::isinf(g) || std::isinf(w)) {
      ok = g == w;
    } else {
      const double diff = std::abs(g - w), scale = std::abs(w) + rms;
      sq_diff += diff * diff;
      ok = diff <= 4 * tol * scale;
      outliers += diff > tol * scale;
    }
    if (!ok && bad++ == 0) first = detail::concat("element ", i, ": got ", g, ", want ", w, " (rms ", rms, ")");
  }
  const index_t allowed = std::max<index_t>(2, finite / 10000);
  if (outliers > allowed) {
    first += detail::concat("; ", outliers, " elements beyond the tolerance, ", allowed, " allowed");
    ++bad;
  }
  const double nmse = sq > 0 ? sq_diff / sq : sq_diff;
  if (!(nmse <= max_nmse)) {
    first += detail::concat("; normalized squared error ", nmse, " over ", max_nmse);
    ++bad;
  }
  return bad;
}

struct BackwardCase {
  PlanOptions options;
  bool dsinks_on_device = false;
  const Tensor<float>* dout = nullptr;  // else random
};

// Runs the Cuda forward and backward on the inputs rounded to T, and the
// reference backward in fp32 on the same values fed the Cuda forward's own out
// and LSE (so that the backward alone is compared); checks dq, dk, dv and the
// sinks' gradient. Two backward calls must agree bit for bit (determinism).
// host_variant: as in check_cuda.
template <class T, class M, class V>
void check_cuda_backward(const Problem& pr, const M& mask, const V& variant, std::mt19937& rng, BackwardCase bc = {},
                         const V* host_variant = nullptr) {
  const Rounded<T> r(pr);
  const Tensor<T>&q = r.q, &k = r.k, &v = r.v;
  const AttentionInputs<float>& ref_in = r.ref_in;
  const AttentionShape& shape = r.shape;
  const Extents &out_shape = r.out_shape, &lse_shape = r.lse_shape;
  const Tensor<T> dout = rounded_to<T>(bc.dout ? *bc.dout : random_tensor<float>(out_shape, rng));
  const Tensor<float> dout_f = widened(dout);

  bc.options.backward = true;
  const auto plan = plan_attention<backends::Cuda>(shape, mask, bc.options);
  const DeviceTensor<T> dq_in(q), dk_in(k), dv_in(v), d_dout(dout);
  DeviceTensor<T> d_out(Tensor<T>(out_shape, from_float<T>(7.0f)));
  DeviceTensor<float> d_lse(Tensor<float>(lse_shape, 7.0f));
  const AttentionInputs<T> in{dq_in.view(), dk_in.view(), dv_in.view(), pr.segments};
  attention_forward(plan, in, d_out.view(), d_lse.view(), variant, cuda::Stream{});

  Extents dv_shape = pr.v.shape();
  DeviceTensor<T> gq(Tensor<T>(q.shape(), from_float<T>(7.0f))), gk(Tensor<T>(k.shape(), from_float<T>(7.0f))),
      gv(Tensor<T>(dv_shape, from_float<T>(7.0f)));
  std::vector<float> dsinks(static_cast<std::size_t>(shape.heads), 7.0f);
  cuda::DeviceBuffer<float> dsinks_dev(dsinks.size());
  dsinks_dev.upload(std::span<const float>(dsinks));
  const std::span<float> dsinks_span =
      bc.dsinks_on_device ? std::span<float>(dsinks_dev.data(), dsinks.size()) : std::span<float>(dsinks);
  const AttentionGrads<T> grads{gq.view(), gk.view(), gv.view(), dsinks_span};
  const TensorView<const T> out_view(d_out.buffer.data(), out_shape);
  const TensorView<const float> lse_view(d_lse.buffer.data(), lse_shape);
  const TensorView<const T> dout_view(d_dout.buffer.data(), out_shape);
  attention_backward(plan, in, out_view, lse_view, dout_view, grads, variant, cuda::Stream{});
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const Tensor<T> got_q = gq.download(), got_k = gk.download(), got_v = gv.download();
  if (bc.dsinks_on_device) {
    cuda::check(cudaMemcpy(dsinks.data(), dsinks_dev.data(), dsinks.size() * sizeof(float), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
  }

  // Deterministic: a second call writes the same bits.
  attention_backward(plan, in, out_view, lse_view, dout_view, grads, variant, cuda::Stream{});
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto same_bits = [](const Tensor<T>& a, const Tensor<T>& b) {
    return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
  };
  CHECK(same_bits(gq.download(), got_q));
  CHECK(same_bits(gk.download(), got_k));
  CHECK(same_bits(gv.download(), got_v));

  const Tensor<float> out_f = widened(d_out.download()), lse_f = d_lse.download();
  Tensor<float> want_q(q.shape(), 7.0f), want_k(k.shape(), 7.0f), want_v(dv_shape, 7.0f);
  std::vector<float> want_sinks(dsinks.size(), 7.0f);
  PlanOptions ref_options;
  ref_options.backward = true;
  attention_backward(plan_attention<backends::Reference>(shape, mask, ref_options), ref_in, out_f.view(), lse_f.view(),
                     dout_f.view(),
                     AttentionGrads<float>{want_q.view(), want_k.view(), want_v.view(), std::span<float>(want_sinks)},
                     host_variant ? *host_variant : variant, execution::Serial{});

  const bool bf16 = std::is_same_v<T, bfloat16>;
  const double tol = bf16 ? 4e-2 : 1e-2, max_nmse = bf16 ? 1e-3 : 1e-4;
  INFO(shape);
  auto check_gradient = [&](const char* name, const Tensor<float>& got, const Tensor<float>& want, double tolerance) {
    std::string first;
    const index_t bad = gradient_mismatches(got, want, tolerance, max_nmse, first);
    INFO(name << ": " << bad << " mismatches; first: " << first);
    CHECK(bad == 0);
  };
  check_gradient("dq", widened(got_q), want_q, tol);
  check_gradient("dk", widened(got_k), want_k, tol);
  check_gradient("dv", widened(got_v), want_v, tol);
  // The sinks' gradient, -sum over rows of exp(sink - lse) (dO . O): one fp32 sum per head. The kernel reads
  // the forward's O as stored (bf16 / fp16); the reference recomputes O exactly. So the GPU is held to the
  // sum over its own stored O and LSE (in double: only summation order differs), and to the exact reference
  // within the error of O's storage rounding, bounded per head from the data: sum_rows exp(sink - lse)
  // sum_e |dO_e O_e| 2^-8 (half an ulp is 2^-9 of |O_e| for bf16, 2^-11 for fp16). Rows outside every THD
  // segment are nobody's: the kernels neither write nor read them.
  const index_t dv_dim = out_f.shape()[out_f.shape().rank() - 1];
  const index_t seq = pr.segments ? out_f.shape()[0] : out_f.shape()[1];
  std::vector<std::pair<index_t, index_t>> rows;  // (batch, token)
  if (pr.segments) {
    for (index_t s = 0; s < pr.segments->size(); ++s) {
      const auto u = static_cast<std::size_t>(s);
      for (index_t i = 0; i < pr.segments->q_lens[u]; ++i) rows.emplace_back(0, pr.segments->q_offsets[u] + i);
    }
  } else {
    for (index_t b = 0; b < out_f.shape()[0]; ++b)
      for (index_t i = 0; i < seq; ++i) rows.emplace_back(b, i);
  }
  const V& sink_variant = host_variant ? *host_variant : variant;
  std::vector<double> own(dsinks.size(), 0.0), rounding(dsinks.size(), 0.0);
  if constexpr (HasSinkHook<V>) {
    for (index_t h = 0; h < shape.heads && seqattn::detail::variant_has_sink(sink_variant); ++h) {
      const double sink = sink_variant.sink(h);
      for (const auto& [b, i] : rows) {
        const double lse = lse_f.data()[(b * shape.heads + h) * seq + i];
        if (lse == -std::numeric_limits<double>::infinity()) continue;  // sees nothing: no sink gradient
        const float* o = out_f.data() + ((b * seq + i) * shape.heads + h) * dv_dim;
        const float* d_o = dout_f.data() + ((b * seq + i) * shape.heads + h) * dv_dim;
        double delta = 0.0, magnitude = 0.0;
        for (index_t e = 0; e < dv_dim; ++e) {
          delta += double{d_o[e]} * o[e];
          magnitude += std::abs(double{d_o[e]} * o[e]);
        }
        const double weight = std::exp(sink - lse);
        own[static_cast<std::size_t>(h)] -= weight * delta;
        rounding[static_cast<std::size_t>(h)] += weight * magnitude * std::ldexp(1.0, bf16 ? -8 : -10);
      }
    }
  }
  double rms = 0.0, own_rms = 0.0;
  for (std::size_t h = 0; h < dsinks.size(); ++h) {
    if (std::isfinite(want_sinks[h])) rms += double{want_sinks[h]} * want_sinks[h];
    if (std::isfinite(own[h])) own_rms += own[h] * own[h];
  }
  rms = std::sqrt(rms / static_cast<double>(dsinks.size()));
  own_rms = std::sqrt(own_rms / static_cast<double>(dsinks.size()));
  for (std::size_t h = 0; h < dsinks.size(); ++h) {
    const double got = dsinks[h], want = want_sinks[h];
    INFO("dsinks of head " << h << ": got " << got << ", from the stored O and LSE " << own[h] << ", exact " << want
                           << ", O's rounding bound " << rounding[h]);
    if (!std::isfinite(want)) {  // the NaN policy's rows: the same non-finite value
      CHECK((std::isnan(want) ? std::isnan(got) : got == want));
      continue;
    }
    CHECK(std::abs(got - own[h]) <= 1e-4 * (std::abs(own[h]) + own_rms));
    CHECK(std::abs(got - want) <= rounding[h] + 2.5e-3 * (std::abs(want) + rms));
  }
}

TEST_CASE("cuda backward: every mask kind, BSHD, head dims 64 to 128", "[cuda][gpu][backward]") {
  std::mt19937 rng(51);
  each_mask_kind([&](const auto& mask) {
    for (const auto& [dk, dv] : {std::pair<index_t, index_t>{64, 64}, {72, 72}, {80, 48}, {128, 128}}) {
      INFO("dk " << dk << ", dv " << dv);
      const Problem pr = random_bshd(rng, 2, 150, 203, 6, 2, dk, dv);
      check_cuda_backward<bfloat16>(pr, mask, variants::Default{}, rng);
    }
  });
}

TEST_CASE("cuda backward: long rows, GQA groups, fp16", "[cuda][gpu][backward]") {
  std::mt19937 rng(52);
  const Problem pr = random_bshd(rng, 1, 700, 1100, 8, 2, 128, 128);
  SECTION("causal, bottom-right") {
    check_cuda_backward<bfloat16>(pr, CausalMask{Alignment::bottom_right}, variants::Default{}, rng);
  }
  SECTION("window") {
    check_cuda_backward<bfloat16>(pr, SlidingWindowMask{300, 0, Alignment::bottom_right}, variants::Default{}, rng);
  }
  SECTION("full, fp16") { check_cuda_backward<float16>(pr, FullMask{}, variants::Default{}, rng); }
  SECTION("more queries than keys") {
    const Problem tall = random_bshd(rng, 2, 900, 70, 4, 1, 64, 64);
    check_cuda_backward<bfloat16>(tall, CausalMask{}, variants::Default{}, rng);
    check_cuda_backward<float16>(tall, FullMask{}, variants::Default{}, rng);
  }
}

TEST_CASE("cuda backward: score variants and the sinks' gradient", "[cuda][gpu][backward]") {
  std::mt19937 rng(53);
  const Problem pr = random_bshd(rng, 2, 190, 260, 4, 2, 128, 128);
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f}, sinks{1.0f, -2.0f, 0.0f, 3.0f};
  const CausalMask causal{Alignment::bottom_right};
  SECTION("scale") { check_cuda_backward<bfloat16>(pr, causal, variants::Scale{0.3f}, rng); }
  SECTION("softcap") {
    check_cuda_backward<bfloat16>(pr, causal, variants::chain(variants::Scale{1.0f}, variants::Softcap{5.0f}), rng);
  }
  SECTION("sinks, dsinks on the host and on the device") {
    check_cuda_backward<bfloat16>(pr, TestBlankRowsMask{}, variants::Sinks{sinks}, rng);
    BackwardCase on_device;
    on_device.dsinks_on_device = true;
    check_cuda_backward<bfloat16>(pr, causal, variants::Sinks{sinks}, rng, on_device);
  }
  SECTION("alibi") { check_cuda_backward<bfloat16>(pr, causal, variants::Alibi{slopes}, rng); }
  SECTION("softcap then alibi, with sinks") {
    check_cuda_backward<bfloat16>(
        pr, causal, variants::chain(variants::Softcap{8.0f}, variants::Alibi{slopes}, variants::Sinks{sinks}), rng);
  }
  SECTION("standard") {
    variants::Standard s;
    s.scale_value = 0.2f;
    s.softcap = {10.0f};
    s.sinks = {sinks};
    check_cuda_backward<bfloat16>(pr, causal, s, rng);
  }
}

TEST_CASE("cuda backward: packed THD with empty segments, data-driven masks", "[cuda][gpu][backward][thd]") {
  std::mt19937 rng(54);
  SECTION("varlen causal with empty and one-token segments") {
    const VarlenSegments varlen(rng);
    check_cuda_backward<bfloat16>(varlen.problem, CausalMask{Alignment::bottom_right}, variants::Default{}, rng);
  }
  SECTION("no queries at all: dK and dV are zero") {
    const std::vector<std::int32_t> q_off{0, 0}, q_len{0, 0}, kv_off{0, 30}, kv_len{30, 70};
    const SegmentTable table{q_off, q_len, kv_off, kv_len};
    Problem pr{random_tensor<float>(detail::make_extents({4, 2, 64}), rng),
               random_tensor<float>(detail::make_extents({100, 1, 64}), rng),
               random_tensor<float>(detail::make_extents({100, 1, 64}), rng), &table};
    check_cuda_backward<bfloat16>(pr, FullMask{}, variants::Default{}, rng);
  }
  SECTION("multi-item requests") {
    MultiItemLayout layout;
    layout.add_items(20, std::vector<index_t>{7, 0, 30, 12});
    layout.add_items(130, std::vector<index_t>{1, 2, 3, 70});
    const PackedRequests requests(layout, rng);
    check_cuda_backward<bfloat16>(requests.problem, multi_item_mask(layout), variants::Default{}, rng);
  }
  SECTION("documents and top-k") {
    const index_t batch = 2, len = 333;
    const Problem pr = random_bshd(rng, batch, len, len, 4, 2, 128, 128);
    std::vector<std::int32_t> ids;
    for (index_t b = 0; b < batch; ++b)
      for (index_t t = 0; t < len; ++t) ids.push_back(static_cast<std::int32_t>(1 + t / (17 + 40 * b)));
    const DocumentLayout docs =
        DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), Extents{batch, len}));
    check_cuda_backward<bfloat16>(pr, document_mask(docs, CausalMask{}), variants::Default{}, rng);
    std::vector<float> scores(static_cast<std::size_t>(batch * len * len));
    std::normal_distribution<float> dist;
    for (float& s : scores) s = dist(rng);
    const Tensor<std::int32_t> idx = top_k(TensorView<const float>(scores.data(), Extents{batch, len, len}), 40);
    const TopKLayout top = TopKLayout::from_indices(idx.view(), len);
    check_cuda_backward<bfloat16>(pr, topk_mask(top) & CausalMask{}, variants::Default{}, rng);
  }
}

TEST_CASE("cuda backward: NaN policy: values the mask hides never reach a gradient", "[cuda][gpu][backward][nan]") {
  std::mt19937 rng(55);
  // As in the forward's policy test, and a NaN in one dO row of document 1.
  const Problem pr = documents_with_non_finite_values(rng);
  Tensor<float> dout = random_tensor<float>(detail::make_extents({1, 160, 4, 128}), rng);
  dout(0, 90, 1, 7) = std::numeric_limits<float>::quiet_NaN();
  const TestDocumentMask documents{{50, 70, 40}};
  BackwardCase bc;
  bc.dout = &dout;
  check_cuda_backward<bfloat16>(pr, documents, variants::Default{}, rng, bc);
  check_cuda_backward<float16>(pr, documents, variants::Default{}, rng, bc);
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  check_cuda_backward<bfloat16>(pr, documents, variants::Sinks{sinks}, rng, bc);
}

TEST_CASE("cuda backward: bad calls throw and name the problem", "[cuda][gpu][backward][errors]") {
  std::mt19937 rng(56);
  const Problem pr = random_bshd(rng, 1, 40, 40, 2, 2, 64, 64);
  const Tensor<bfloat16> q = rounded_to<bfloat16>(pr.q), k = rounded_to<bfloat16>(pr.k), v = rounded_to<bfloat16>(pr.v);
  const DeviceTensor<bfloat16> dq(q), dk(k), dv(v);
  DeviceTensor<bfloat16> out(q), gq(q), gk(k), gv(v);
  DeviceTensor<float> lse(Tensor<float>(detail::make_extents({1, 2, 40}), 0.0f));
  const AttentionInputs<bfloat16> in{dq.view(), dk.view(), dv.view()};
  const TensorView<const bfloat16> out_view(out.buffer.data(), q.shape());
  const TensorView<const float> lse_view(lse.buffer.data(), lse.shape);
  const auto forward_only = plan_attention<backends::Cuda>(shape_of(in), CausalMask{});
  CHECK_THROWS_WITH(attention_backward(forward_only, in, out_view, lse_view, out_view, gq.view(), gk.view(), gv.view(),
                                       cuda::Stream{}),
                    ContainsSubstring("PlanOptions::backward"));
  PlanOptions backward;
  backward.backward = true;
  AttentionShape wide = shape_of(in);
  wide.dk = wide.dv = 256;
  CHECK_THROWS_WITH(plan_attention<backends::Cuda>(wide, CausalMask{}, backward),
                    ContainsSubstring("backward pass supports head dims up to 128"));
  const auto plan = plan_attention<backends::Cuda>(shape_of(in), CausalMask{}, backward);
  const Tensor<bfloat16> host_dout(q.shape());
  CHECK_THROWS_WITH(attention_backward(plan, in, out_view, lse_view, host_dout.view(), gq.view(), gk.view(), gv.view(),
                                       cuda::Stream{}),
                    ContainsSubstring("attention_backward (Cuda): dout must point to device memory"));
}

// ---- Device score hooks (backends/cuda/score_hooks.cuh) ------------------------
// Variants that are not built in run their own score hooks in device code:
// Bias with a BiasTensor in device memory, a user's ScoreMod and a variant
// type of the user's own, in Chains with the built-in parts. Each is checked
// against the reference backend given the same variant over host data.
// Two variant types only (each instantiates every kernel in this file).

// A bias [batch or 1, heads, q, kv] of normal values with some -inf entries
// (the pair is excluded), and rows of head 1 that the bias excludes entirely.
Tensor<float> random_bias(std::mt19937& rng, index_t batch, index_t heads, index_t q, index_t kv) {
  Tensor<float> bias(detail::make_extents({batch, heads, q, kv}));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform;
  for (index_t i = 0; i < bias.size(); ++i) bias.data()[i] = uniform(rng) < 0.05f ? -INFINITY : normal(rng);
  for (index_t b = 0; b < batch; ++b)
    for (index_t i = 3; i < q; i += 17)
      for (index_t j = 0; j < kv; ++j) bias(b, std::min<index_t>(1, heads - 1), i, j) = -INFINITY;
  return bias;
}

// The bias in host and device memory, and the variant over each.
using BiasVariant = variants::Chain<variants::Softcap, variants::Alibi, variants::Bias<variants::BiasTensor>>;
struct BiasCase {
  Tensor<float> host;
  DeviceTensor<float> device;
  std::vector<float> slopes;
  BiasVariant on_host, on_device;

  BiasCase(Tensor<float> bias, float softcap, std::vector<float> alibi_slopes)
      : host(std::move(bias)),
        device(host),
        slopes(std::move(alibi_slopes)),
        on_host(variants::chain(variants::Softcap{softcap}, variants::Alibi{slopes},
                                variants::Bias{variants::BiasTensor(host.view())})),
        on_device(variants::chain(variants::Softcap{softcap}, variants::Alibi{slopes},
                                  variants::Bias{variants::BiasTensor(device.view())})) {}
  BiasCase(const BiasCase&) = delete;  // the variants view host, device and slopes
  BiasCase& operator=(const BiasCase&) = delete;
};

// A user's score_mod: a tanh soft-cap written out, plus a relative-position
// term per head; and its derivative. Device-callable functors.
struct SoftcapRelative {
  float cap, slope;
  SEQATTN_HOST_DEVICE float operator()(float s, index_t, index_t h, index_t q, index_t kv) const {
    const float distance = static_cast<float>(q > kv ? q - kv : kv - q);
    return cap * std::tanh(s / cap) - slope * static_cast<float>(h + 1) * distance;
  }
};
struct SoftcapRelativeGrad {
  float cap;
  SEQATTN_HOST_DEVICE float operator()(float s, index_t, index_t, index_t, index_t) const {
    const float t = std::tanh(s / cap);
    return 1.0f - t * t;
  }
};
// A score variant type of the user's own, reading every ScoreIndex field.
struct SequenceTilt {
  float weight = 0.0f;
  SEQATTN_HOST_DEVICE float score(float s, const ScoreIndex& at) const {
    return s + weight * static_cast<float>((at.batch % 3) - at.head + (at.kv_len - at.q_len) % 5 + (at.q % 2));
  }
  SEQATTN_HOST_DEVICE float score_grad(float, const ScoreIndex&) const { return 1.0f; }
};
using UserVariant = variants::Chain<variants::Scale, variants::ScoreMod<SoftcapRelative, SoftcapRelativeGrad>,
                                    SequenceTilt, variants::Sinks>;
UserVariant user_variant(float scale, std::span<const float> sinks) {
  return variants::chain(variants::Scale{scale},
                         variants::ScoreMod{SoftcapRelative{6.0f, 0.01f}, SoftcapRelativeGrad{6.0f}},
                         SequenceTilt{0.125f}, variants::Sinks{sinks});
}

// Packed THD: segments of (q, kv) lengths with an empty one and a one-token
// one; heads over kv_heads, head dim `dim`.
struct ThdSegments {
  std::vector<std::int32_t> q_off, q_len{5, 0, 150, 1, 90}, kv_off, kv_len{5, 0, 150, 1, 130};
  SegmentTable table;
  Problem problem;

  ThdSegments(std::mt19937& rng, index_t heads, index_t kv_heads, index_t dim) {
    std::int32_t q_tokens = 2, kv_tokens = 0;  // 2 rows before the first segment: nobody's
    for (std::size_t i = 0; i < q_len.size(); ++i) {
      q_off.push_back(q_tokens);
      kv_off.push_back(kv_tokens);
      q_tokens += q_len[i];
      kv_tokens += kv_len[i];
    }
    table = SegmentTable{q_off, q_len, kv_off, kv_len};
    problem = Problem{random_tensor<float>(detail::make_extents({q_tokens, heads, dim}), rng),
                      random_tensor<float>(detail::make_extents({kv_tokens, kv_heads, dim}), rng),
                      random_tensor<float>(detail::make_extents({kv_tokens, kv_heads, dim}), rng), &table};
  }
  ThdSegments(const ThdSegments&) = delete;  // table views the vectors, problem the table
  ThdSegments& operator=(const ThdSegments&) = delete;
};

// Calls each(problem, mask, batch extent of a per-sequence tensor, max q, max kv, what)
// for BSHD and THD, causal and document masks, 4 query heads over 2 K/V heads.
template <class Each>
void each_hook_problem(std::mt19937& rng, index_t dim, Each&& each) {
  const CausalMask causal{Alignment::bottom_right};
  const TestDocumentMask documents{{50, 70, 40}};
  {
    const Problem pr = random_bshd(rng, 2, 150, 203, 4, 2, dim, dim);
    each(pr, causal, 2, 150, 203, "BSHD, causal");
    each(pr, documents, 2, 150, 203, "BSHD, documents");
  }
  {
    const ThdSegments thd(rng, 4, 2, dim);
    each(thd.problem, causal, 5, 150, 150, "THD, causal");
    each(thd.problem, documents, 5, 150, 150, "THD, documents");
  }
}

TEST_CASE("cuda hooks: Bias from a device tensor, forward and backward", "[cuda][gpu][hooks][backward]") {
  std::mt19937 rng(61);
  for (const index_t dim : {64, 128}) {
    each_hook_problem(rng, dim,
                      [&](const Problem& pr, const auto& mask, index_t batch, index_t q, index_t kv, const char* what) {
                        INFO(what << ", head dim " << dim);
                        // BSHD: one bias for both sequences (batch extent 1, broadcast); THD: one per segment.
                        const index_t bias_batch = pr.segments ? batch : 1;
                        const BiasCase bias(random_bias(rng, bias_batch, 4, q, kv), 0.0f, std::vector<float>(4, 0.0f));
                        check_cuda<bfloat16>(pr, mask, bias.on_device, {}, &bias.on_host);
                        check_cuda_backward<bfloat16>(pr, mask, bias.on_device, rng, {}, &bias.on_host);
                      });
  }
  SECTION("after softcap and ALiBi, with forced KV splits, and decode") {
    const Problem pr = random_bshd(rng, 2, 150, 203, 4, 2, 128, 128);
    const BiasCase bias(random_bias(rng, 2, 4, 150, 203), 8.0f, {0.5f, 0.25f, 0.125f, 0.0625f});
    const CausalMask causal{Alignment::bottom_right};
    check_cuda<bfloat16>(pr, causal, bias.on_device, {}, &bias.on_host);
    PlanOptions split;
    split.kv_splits = 3;
    check_cuda<bfloat16>(pr, causal, bias.on_device, split, &bias.on_host);
    check_cuda_backward<bfloat16>(pr, causal, bias.on_device, rng, {}, &bias.on_host);
    const Problem dec = random_bshd(rng, 2, 3, 700, 8, 2, 64, 64);
    const BiasCase dec_bias(random_bias(rng, 2, 8, 3, 700), 0.0f, std::vector<float>(8, 0.1f));
    CHECK(plan_attention<backends::Cuda>(shape_of(AttentionInputs<float>{dec.q.view(), dec.k.view(), dec.v.view()}),
                                         causal)
              .work()
              .device->launch.decode);
    check_cuda<bfloat16>(dec, causal, dec_bias.on_device, {}, &dec_bias.on_host);
  }
}

TEST_CASE("cuda hooks: a user's device ScoreMod and score variant, forward and backward",
          "[cuda][gpu][hooks][backward]") {
  std::mt19937 rng(62);
  const std::vector<float> sinks{1.0f, -2.0f, 0.0f, 3.0f};
  for (const index_t dim : {64, 128}) {
    each_hook_problem(rng, dim, [&](const Problem& pr, const auto& mask, index_t, index_t, index_t, const char* what) {
      INFO(what << ", head dim " << dim);
      const UserVariant plain = user_variant(0.2f, {}), with_sinks = user_variant(0.125f, sinks);
      check_cuda<bfloat16>(pr, mask, plain);
      check_cuda<bfloat16>(pr, mask, with_sinks);
      check_cuda_backward<bfloat16>(pr, mask, plain, rng);
      check_cuda_backward<bfloat16>(pr, mask, with_sinks, rng);
    });
  }
  SECTION("decode and KV splits") {
    const Problem dec = random_bshd(rng, 2, 1, 3000, 8, 2, 128, 128);
    const std::vector<float> sinks8(8, 0.5f);
    check_cuda<bfloat16>(dec, CausalMask{Alignment::bottom_right}, user_variant(0.1f, sinks8));
    PlanOptions split;
    split.kv_splits = 4;
    const Problem pr = random_bshd(rng, 1, 300, 900, 4, 4, 64, 64);
    check_cuda<bfloat16>(pr, FullMask{}, user_variant(0.1f, sinks), split);
  }
}

TEST_CASE("cuda hooks: a BiasTensor in host memory is refused before anything runs", "[cuda][gpu][hooks][errors]") {
  std::mt19937 rng(63);
  const Problem pr = random_bshd(rng, 1, 40, 40, 2, 2, 64, 64);
  const Tensor<bfloat16> q = rounded_to<bfloat16>(pr.q), k = rounded_to<bfloat16>(pr.k), v = rounded_to<bfloat16>(pr.v);
  const DeviceTensor<bfloat16> dq(q), dk(k), dv(v);
  DeviceTensor<bfloat16> out(Tensor<bfloat16>(q.shape(), bfloat16(7.0f))), gq(q), gk(k), gv(v);
  DeviceTensor<float> lse(Tensor<float>(detail::make_extents({1, 2, 40}), 0.0f));
  const AttentionInputs<bfloat16> in{dq.view(), dk.view(), dv.view()};
  const BiasCase bias(random_bias(rng, 1, 2, 40, 40), 0.0f, {0.0f, 0.0f});
  PlanOptions backward;
  backward.backward = true;
  const auto plan = plan_attention<backends::Cuda>(shape_of(in), CausalMask{}, backward);
  const char* message = "bias (variants::BiasTensor of shape (1, 2, 40, 40)) must point to device memory";
  CHECK_THROWS_WITH(attention_forward(plan, in, out.view(), lse.view(), bias.on_host, cuda::Stream{}),
                    ContainsSubstring("attention_forward (Cuda): ") && ContainsSubstring(message));
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const Tensor<bfloat16> untouched = out.download();
  CHECK(std::all_of(untouched.data(), untouched.data() + untouched.size(),
                    [](bfloat16 x) { return to_float(x) == 7.0f; }));
  const TensorView<const bfloat16> out_view(out.buffer.data(), q.shape());
  const TensorView<const float> lse_view(lse.buffer.data(), lse.shape);
  CHECK_THROWS_WITH(
      attention_backward(plan, in, out_view, lse_view, out_view,
                         AttentionGrads<bfloat16>{gq.view(), gk.view(), gv.view()}, bias.on_host, cuda::Stream{}),
      ContainsSubstring("attention_backward (Cuda): ") && ContainsSubstring(message));
  // A bias that does not cover the call: the variant's own check, on the host.
  const BiasCase small(random_bias(rng, 1, 2, 40, 30), 0.0f, {0.0f, 0.0f});
  CHECK_THROWS_WITH(attention_forward(plan, in, out.view(), lse.view(), small.on_device, cuda::Stream{}),
                    ContainsSubstring("does not cover the call"));
}

}  // namespace
}  // namespace seqattn::testing

int main(int argc, char* argv[]) {
  if (!seqattn::testing::have_gpu()) {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    std::printf("SKIPPED: the Cuda backend tests need a CUDA device; cudaGetDeviceCount: %s\n",
                status == cudaSuccess ? "0 devices" : cudaGetErrorString(status));
    return 77;
  }
  return seqattn::testing::run_catch_session(argc, argv);
}
