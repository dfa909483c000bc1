// libFuzzer target: paged K/V (PagedAttentionInputs) with random block tables
// against the contiguous equivalent gathered through the same table, on
// backends::Highway and backends::Reference: BSHD queries or THD queries with
// cu_seqlens_q, GQA, ragged kv_lens, page sizes 1..64, pages in any order and
// shared between sequences (duplicates), padding past the used entries. Slots
// and pages no sequence reads hold NaN, so a read outside the table shows.
// Hostile tables (out-of-range or negative pages, short tables, page sizes
// near INT64_MAX, bad cu_seqlens_q, cu_seqlens_q with a shape but no data)
// must be rejected with seqattn::invalid_argument, before anything is read.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "fuzz_masks.hpp"

using namespace seqattn;

namespace {

constexpr double kMaxWork = 40000;  // heads * sum(q * kv) * (dk + dv)
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 7.0f;

float value(FuzzedDataProvider& fdp) { return (static_cast<float>(fdp.ConsumeIntegral<std::uint8_t>()) - 128) / 32; }

struct Case {
  index_t batch = 1, heads = 1, kv_heads = 1, dk = 1, dv = 1, sq = 0;
  index_t page_size = 1, num_pages = 0, max_pages = 0;
  bool thd = false;
  bool huge_page = false;  // page_size near INT64_MAX over an empty page pool
  std::vector<std::int32_t> kv_lens, cu, table;
  Tensor<float> q, k_pages, v_pages;
  // Contiguous equivalent (THD).
  std::vector<std::int32_t> q_off, q_len, kv_off, kv_len;
  SegmentTable segments;
  Tensor<float> k, v;
  index_t tq = 0, tkv = 0;
  bool cu_without_data = false;
  bool must_reject = false;
};

PagedAttentionInputs<float> paged(const Case& c, const Tensor<std::int32_t>& table, const Tensor<std::int32_t>& lens,
                                  const Tensor<std::int32_t>& cu) {
  TensorView<const float> kp = c.k_pages.view(), vp = c.v_pages.view();
  if (c.huge_page) {
    // No pages at all, so no data is needed: only the page size is hostile.
    kp = TensorView<const float>(c.k_pages.data(), Extents{0, c.page_size, c.kv_heads, c.dk});
    vp = TensorView<const float>(c.v_pages.data(), Extents{0, c.page_size, c.kv_heads, c.dv});
  }
  PagedAttentionInputs<float> in{c.q.view(), {kp, vp, table.view(), lens.view()}, {}};
  if (c.thd) in.cu_seqlens_q = c.cu_without_data ? TensorView<const std::int32_t>(nullptr, cu.shape()) : cu.view();
  return in;
}

template <class Backend, class M>
void compare_backend(Case& c, const M& mask, const variants::Standard& variant, int workers) {
  const Tensor<std::int32_t> table(Extents{c.batch, c.max_pages}, std::vector<std::int32_t>(c.table));
  const Tensor<std::int32_t> lens(Extents{c.batch}, std::vector<std::int32_t>(c.kv_lens));
  const Tensor<std::int32_t> cu(Extents{c.batch + 1}, std::vector<std::int32_t>(c.cu));
  const PagedAttentionInputs<float> in = paged(c, table, lens, cu);
  execution::ThreadPool pool(workers);
  const Extents out_shape = c.thd ? Extents{c.tq, c.heads, c.dv} : Extents{c.batch, c.sq, c.heads, c.dv};
  const Extents lse_shape = c.thd ? Extents{c.heads, c.tq} : Extents{c.batch, c.heads, c.sq};
  Tensor<float> out_p(out_shape, kSentinel), lse_p(lse_shape, kSentinel);
  try {
    const auto plan = plan_attention<Backend>(shape_of(in), mask, {}, workers);
    attention_forward(plan, in, out_p.view(), lse_p.view(), variant, pool);
  } catch (const seqattn::invalid_argument&) {
    return;  // rejected (must_reject or the mask's check): the contiguous call is not compared
  }
  FUZZ_CHECK(!c.must_reject, "an invalid paged input was accepted (page size %lld, %lld pages, table %lld x %lld)",
             (long long)c.page_size, (long long)c.num_pages, (long long)c.batch, (long long)c.max_pages);

  const AttentionInputs<float> cont{TensorView<const float>(c.q.data(), Extents{c.tq, c.heads, c.dk}), c.k.view(),
                                    c.v.view(), &c.segments};
  const auto plan_c = plan_attention<Backend>(shape_of(cont), mask, {}, workers);
  Tensor<float> out_c(Extents{c.tq, c.heads, c.dv}, kSentinel), lse_c(Extents{c.heads, c.tq}, kSentinel);
  attention_forward(plan_c, cont, out_c.view(), lse_c.view(), variant, pool);

  // Same values in the same order (BSHD out [B, Sq, H, Dv] is THD [B * Sq, H, Dv]).
  for (index_t i = 0; i < out_c.size(); ++i) {
    const float g = out_p.data()[i], w = out_c.data()[i];
    FUZZ_CHECK(std::isfinite(g) && std::abs(g - w) <= 1e-5f * std::max(1.0f, std::abs(w)),
               "%s out[%lld]: paged %.9g, contiguous %.9g", Backend::name(), (long long)i, g, w);
  }
  for (index_t i = 0; i < lse_p.size(); ++i) {
    float w = lse_c.data()[i];
    if (!c.thd) {
      const index_t s = i % c.sq, h = i / c.sq % c.heads, b = i / (c.sq * c.heads);
      w = lse_c(h, b * c.sq + s);
    }
    const float g = lse_p.data()[i];
    const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= 1e-5f * std::max(1.0f, std::abs(w));
    FUZZ_CHECK(ok, "%s lse[%lld]: paged %.9g, contiguous %.9g", Backend::name(), (long long)i, g, w);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Case c;
  c.batch = fdp.ConsumeIntegralInRange<int>(1, 3);
  c.kv_heads = fdp.ConsumeIntegralInRange<int>(1, 2);
  c.heads = c.kv_heads * fdp.ConsumeIntegralInRange<int>(1, 3);
  static constexpr index_t kDims[] = {1, 3, 8, 16, 17, 32, 40, 64};
  c.dk = kDims[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kDims) - 1)];
  c.dv = fdp.ConsumeBool() ? c.dk : kDims[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kDims) - 1)];
  static constexpr index_t kPageSizes[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64};
  c.page_size = kPageSizes[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kPageSizes) - 1)];
  c.thd = fdp.ConsumeBool();
  c.sq = fdp.ConsumeIntegralInRange<int>(1, 24);
  index_t needed = 0, longest = 0;
  for (index_t b = 0; b < c.batch; ++b) {
    c.kv_lens.push_back(fdp.ConsumeIntegralInRange<std::int32_t>(0, 60));
    needed += (c.kv_lens.back() + c.page_size - 1) / c.page_size;
    longest = std::max<index_t>(longest, (c.kv_lens.back() + c.page_size - 1) / c.page_size);
  }
  // Queries: THD offsets with gaps (cu_seqlens_q), or Sq each.
  c.cu.push_back(fdp.ConsumeIntegralInRange<std::int32_t>(0, 2));
  for (index_t b = 0; b < c.batch; ++b) {
    c.cu.push_back(c.cu.back() + (c.thd ? fdp.ConsumeIntegralInRange<std::int32_t>(0, 24) : 0));
  }
  c.tq = c.thd ? c.cu.back() + fdp.ConsumeIntegralInRange<std::int32_t>(0, 2) : c.batch * c.sq;
  // Keep the problem cheap: shrink kv_lens (the table then has spare entries).
  for (;;) {
    double cells = 0;
    for (index_t b = 0; b < c.batch; ++b) {
      const double ql = c.thd ? c.cu[static_cast<std::size_t>(b + 1)] - c.cu[static_cast<std::size_t>(b)] : c.sq;
      cells += ql * c.kv_lens[static_cast<std::size_t>(b)];
    }
    if (cells * static_cast<double>(c.heads * (c.dk + c.dv)) <= kMaxWork) break;
    for (auto& l : c.kv_lens) l /= 2;
  }

  c.max_pages = longest + fdp.ConsumeIntegralInRange<int>(0, 2);
  c.num_pages = needed + fdp.ConsumeIntegralInRange<int>(0, 3);
  const bool share = fdp.ConsumeIntegralInRange<int>(0, 3) == 0;  // pages reused across sequences
  std::vector<std::int32_t> perm(static_cast<std::size_t>(c.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = perm.size(); i > 1; --i)
    std::swap(perm[i - 1], perm[fdp.ConsumeIntegralInRange<std::size_t>(0, i - 1)]);
  c.table.assign(static_cast<std::size_t>(c.batch * c.max_pages), -1);
  std::size_t next = 0;
  for (index_t b = 0; b < c.batch; ++b) {
    const index_t used = (c.kv_lens[static_cast<std::size_t>(b)] + c.page_size - 1) / c.page_size;
    for (index_t i = 0; i < c.max_pages; ++i) {
      auto& e = c.table[static_cast<std::size_t>(b * c.max_pages + i)];
      if (i < used) {
        e = share && c.num_pages > 0
                ? fdp.ConsumeIntegralInRange<std::int32_t>(0, static_cast<std::int32_t>(c.num_pages) - 1)
                : perm[next++];
      } else {
        e = fdp.ConsumeBool() ? -1 : fdp.ConsumeIntegral<std::int32_t>();  // never read
      }
    }
  }

  // Hostile inputs, each of which must be rejected.
  switch (fdp.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      if (needed > 0) {
        // An entry that is read names no page.
        for (index_t b = 0; b < c.batch; ++b) {
          if (c.kv_lens[static_cast<std::size_t>(b)] == 0) continue;
          const index_t used = (c.kv_lens[static_cast<std::size_t>(b)] + c.page_size - 1) / c.page_size;
          const auto i = fdp.ConsumeIntegralInRange<index_t>(0, used - 1);
          const std::int32_t bad[] = {-1, static_cast<std::int32_t>(c.num_pages),
                                      std::numeric_limits<std::int32_t>::max(),
                                      std::numeric_limits<std::int32_t>::min()};
          c.table[static_cast<std::size_t>(b * c.max_pages + i)] = bad[fdp.ConsumeIntegralInRange<int>(0, 3)];
          c.must_reject = true;
          break;
        }
      }
      break;
    case 1:
      if (longest > 0) {
        // A kv_len that needs more pages than the table has.
        c.kv_lens[0] = static_cast<std::int32_t>(c.max_pages * c.page_size + 1);
        c.must_reject = true;
      }
      break;
    case 2: {
      // Page sizes near INT64_MAX (no pages): must not overflow the page count.
      const index_t huge[] = {std::numeric_limits<index_t>::max(), std::numeric_limits<index_t>::max() - 1,
                              index_t{1} << 62, index_t{1} << 40};
      c.huge_page = true;
      c.page_size = huge[fdp.ConsumeIntegralInRange<int>(0, 3)];
      c.must_reject = std::any_of(c.kv_lens.begin(), c.kv_lens.end(), [](std::int32_t l) { return l > 0; });
      break;
    }
    case 3:
      if (c.thd) {
        c.cu_without_data = true;
        c.must_reject = true;
      }
      break;
    case 4:
      if (c.thd) {
        // Decreasing or past the q tokens.
        const auto b = fdp.ConsumeIntegralInRange<std::size_t>(1, static_cast<std::size_t>(c.batch));
        c.cu[b] = fdp.ConsumeBool() ? c.cu[b - 1] - 1 : static_cast<std::int32_t>(c.tq + 1);
        c.must_reject = true;
      }
      break;
    case 5:
      c.kv_lens[0] = -1;
      c.must_reject = true;
      break;
    default:
      break;
  }

  // Pages full of NaN; the slots a sequence owns get values.
  const index_t pages_alloc = c.huge_page ? 0 : c.num_pages, ps_alloc = c.huge_page ? 1 : c.page_size;
  c.k_pages = Tensor<float>(Extents{pages_alloc, ps_alloc, c.kv_heads, c.dk}, kNaN);
  c.v_pages = Tensor<float>(Extents{pages_alloc, ps_alloc, c.kv_heads, c.dv}, kNaN);
  c.q = c.thd ? Tensor<float>(Extents{c.tq, c.heads, c.dk}) : Tensor<float>(Extents{c.batch, c.sq, c.heads, c.dk});
  for (index_t i = 0; i < c.q.size(); ++i) c.q.data()[i] = value(fdp);
  if (!c.must_reject) {
    for (index_t b = 0; b < c.batch; ++b) {
      for (index_t j = 0; j < c.kv_lens[static_cast<std::size_t>(b)]; ++j) {
        const index_t page = c.table[static_cast<std::size_t>(b * c.max_pages + j / c.page_size)];
        for (index_t h = 0; h < c.kv_heads; ++h) {
          // Shared pages keep the values written first (both layouts read the same slot).
          if (std::isnan(c.k_pages(page, j % c.page_size, h, 0))) {
            for (index_t d = 0; d < c.dk; ++d) c.k_pages(page, j % c.page_size, h, d) = value(fdp);
            for (index_t d = 0; d < c.dv; ++d) c.v_pages(page, j % c.page_size, h, d) = value(fdp);
          }
        }
      }
    }
    // The contiguous equivalent, gathered through the table.
    for (index_t b = 0; b < c.batch; ++b) {
      c.q_off.push_back(c.thd ? c.cu[static_cast<std::size_t>(b)] : static_cast<std::int32_t>(b * c.sq));
      c.q_len.push_back(c.thd ? c.cu[static_cast<std::size_t>(b + 1)] - c.cu[static_cast<std::size_t>(b)]
                              : static_cast<std::int32_t>(c.sq));
      c.kv_off.push_back(static_cast<std::int32_t>(c.tkv));
      c.kv_len.push_back(c.kv_lens[static_cast<std::size_t>(b)]);
      c.tkv += c.kv_lens[static_cast<std::size_t>(b)];
    }
    c.segments = SegmentTable{c.q_off, c.q_len, c.kv_off, c.kv_len};
    c.k = Tensor<float>(Extents{c.tkv, c.kv_heads, c.dk});
    c.v = Tensor<float>(Extents{c.tkv, c.kv_heads, c.dv});
    for (index_t b = 0; b < c.batch; ++b) {
      for (index_t j = 0; j < c.kv_lens[static_cast<std::size_t>(b)]; ++j) {
        const index_t page = c.table[static_cast<std::size_t>(b * c.max_pages + j / c.page_size)];
        const index_t token = c.kv_off[static_cast<std::size_t>(b)] + j;
        for (index_t h = 0; h < c.kv_heads; ++h) {
          for (index_t d = 0; d < c.dk; ++d) c.k(token, h, d) = c.k_pages(page, j % c.page_size, h, d);
          for (index_t d = 0; d < c.dv; ++d) c.v(token, h, d) = c.v_pages(page, j % c.page_size, h, d);
        }
      }
    }
  }

  variants::Standard variant;
  if (fdp.ConsumeBool()) variant.softcap.cap = static_cast<float>(fdp.ConsumeIntegralInRange<int>(1, 30));
  std::vector<float> sinks;
  if (fdp.ConsumeBool()) {
    for (index_t h = 0; h < c.heads; ++h) sinks.push_back(value(fdp));
    variant.sinks.logits = sinks;
  }
  const int workers = fdp.ConsumeIntegralInRange<int>(1, 2);
  RaggedLengths lengths;
  for (index_t b = 0; b < c.batch; ++b) {
    lengths.q.push_back(c.thd ? c.cu[static_cast<std::size_t>(b + 1)] - c.cu[static_cast<std::size_t>(b)] : c.sq);
    lengths.kv.push_back(c.kv_lens[static_cast<std::size_t>(b)]);
  }
  seqattn::fuzz::guarded([&] {
    seqattn::fuzz::MaskFactory factory(fdp, lengths, c.heads, false);
    const AnyMask mask = fdp.ConsumeBool() ? AnyMask(CausalMask{Alignment::bottom_right}) : factory.make();
    compare_backend<backends::Highway>(c, mask, variant, workers);
    compare_backend<backends::Reference>(c, mask, variant, 1);
  });
  return 0;
}
