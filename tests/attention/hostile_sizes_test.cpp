// Issue 14 ("Memory safety under hostile sizes"): attention findings as
// regression tests. Each repro crashed, read out of bounds or returned a
// wrong result without an error before the fix; now every backend throws
// seqattn::invalid_argument before it allocates or indexes.
#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/attention.hpp"
#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_hostile_sizes_test {

using namespace seqattn;

namespace {
constexpr std::int32_t kI32Max = std::numeric_limits<std::int32_t>::max();

// A [.., heads, dim] view of one broadcast value: any shape, no memory.
TensorView<const float> broadcast(const float* one, Extents shape) {
  Strides zero;
  for (int d = 0; d < shape.rank(); ++d) zero.push_back(0);
  return {one, shape, zero};
}

// Runs the one-call forward on each backend; every one must throw
// invalid_argument (with `what` in the message when given).
template <class T, class M>
void require_all_backends_throw(const AttentionInputs<T>& in, const M& mask, TensorView<T> out, TensorView<float> lse,
                                const AttentionOptions& options = {}, const char* what = "") {
  CHECK_THROWS_WITH(attention_forward<backends::Highway>(in, mask, out, lse, options), ContainsSubstring(what));
  CHECK_THROWS_WITH(attention_forward<backends::Scalar>(in, mask, out, lse, options), ContainsSubstring(what));
  CHECK_THROWS_WITH(attention_forward<backends::Reference>(in, mask, out, lse, options), ContainsSubstring(what));
  CHECK_THROWS_AS(attention_forward<backends::Reference>(in, mask, out, lse, options), seqattn::invalid_argument);
}
}  // namespace

TEST_CASE("issue 14 #1: THD segments whose offset + length wraps int32 are rejected on every backend") {
  std::vector<float> q(4 * 4, 0.5f), out(4 * 4);
  const TensorView<const float> qv(q.data(), Extents{4, 1, 4});
  const std::vector<std::int32_t> big{kI32Max}, one{1}, zero{0}, big2{kI32Max - 1}, two{2};
  const SegmentTable q_side{big, one, zero, one};
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv, &q_side}, CausalMask{},
                             TensorView<float>(out.data(), Extents{4, 1, 4}), {}, {}, "query tokens");
  const SegmentTable kv_side{zero, one, big2, two};
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv, &kv_side}, CausalMask{},
                             TensorView<float>(out.data(), Extents{4, 1, 4}), {}, {}, "key/value tokens");
}

TEST_CASE("issue 14 #2: kv_splits is limited (the task count must not wrap)") {
  std::vector<float> q(4 * 4, 0.5f), out(4 * 4);
  const TensorView<const float> qv(q.data(), Extents{1, 4, 1, 4});
  AttentionOptions options;
  options.kv_splits = index_t{1} << 62;
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv}, CausalMask{},
                             TensorView<float>(out.data(), Extents{1, 4, 1, 4}), {}, options, "kMaxKvSplits");
  options.kv_splits = index_t{1} << 40;
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv}, CausalMask{},
                             TensorView<float>(out.data(), Extents{1, 4, 1, 4}), {}, options, "kMaxKvSplits");
}

TEST_CASE("issue 14 #3: a head dim whose scratch size wraps is rejected before any allocation") {
  const float one = 1.0f;
  const index_t dk = (index_t{1} << 57) + 1;
  const TensorView<const float> q = broadcast(&one, Extents{1, 2, 1, dk});
  std::vector<float> out(2 * 4);
  const TensorView<const float> v = broadcast(&one, Extents{1, 2, 1, 4});
  require_all_backends_throw(AttentionInputs<float>{q, q, v}, CausalMask{},
                             TensorView<float>(out.data(), Extents{1, 2, 1, 4}), {}, {}, "kMaxHeadDim");
}

TEST_CASE("issue 14 #5: the Reference backend checks the mask against the batch like the tiled ones") {
  std::vector<float> q(3 * 5 * 2 * 4, 0.25f), out(q.size());
  const TensorView<const float> qv(q.data(), Extents{3, 5, 2, 4});
  const TensorView<float> ov(out.data(), Extents{3, 5, 2, 4});
  const std::vector<CausalMask> one_mask(1);
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv}, PerHeadMask<CausalMask>{one_mask}, ov, {});
  const std::vector<std::int32_t> ids{1, 1};
  const DocumentLayout layout = DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(ids.data(), {1, 2}));
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv}, document_mask(layout), ov, {}, {}, "DocumentMask");
}

TEST_CASE("issue 14 #6: make_attention_block_mask validates its inputs") {
  std::vector<float> q(4 * 4, 0.5f);
  const TensorView<const float> qv(q.data(), Extents{4, 1, 4});
  const std::vector<std::int32_t> off{0}, len{2}, none{};
  const SegmentTable short_kv{off, len, off, none};
  CHECK_THROWS_WITH(make_attention_block_mask(AttentionInputs<float>{qv, qv, qv, &short_kv}, CausalMask{}),
                    ContainsSubstring("one entry per segment"));
  const TensorView<const float> neg(q.data(), Extents{-1, 1, 1, 4}, Strides{0, 0, 0, 1});
  CHECK_THROWS_WITH(make_attention_block_mask(AttentionInputs<float>{neg, neg, neg}, CausalMask{}),
                    ContainsSubstring("non-negative"));
}

TEST_CASE("issue 14 #8: null k, v or out is rejected, not dereferenced") {
  std::vector<float> q(2 * 4, 0.5f), out(2 * 4);
  const TensorView<const float> qv(q.data(), Extents{1, 2, 1, 4});
  const TensorView<const float> null_view(nullptr, Extents{1, 2, 1, 4});
  const TensorView<float> ov(out.data(), Extents{1, 2, 1, 4});
  require_all_backends_throw(AttentionInputs<float>{qv, null_view, qv}, CausalMask{}, ov, {}, {}, "k has no data");
  require_all_backends_throw(AttentionInputs<float>{qv, qv, null_view}, CausalMask{}, ov, {}, {}, "v has no data");
  require_all_backends_throw(AttentionInputs<float>{qv, qv, qv}, CausalMask{},
                             TensorView<float>(nullptr, Extents{1, 2, 1, 4}), {}, {}, "out has no data");
}

TEST_CASE("issue 14 #11: a kv length with more blocks than int32 ids is rejected, not truncated") {
  const float one = 1.0f;
  const index_t skv = 64 * ((index_t{1} << 32) + 1);
  const TensorView<const float> q = broadcast(&one, Extents{1, 1, 1, 4});
  const TensorView<const float> kv = broadcast(&one, Extents{1, skv, 1, 4});
  std::vector<float> out(4), lse(1);
  require_all_backends_throw(AttentionInputs<float>{q, kv, kv}, FullMask{},
                             TensorView<float>(out.data(), Extents{1, 1, 1, 4}),
                             TensorView<float>(lse.data(), Extents{1, 1, 1}), {}, "kMaxBlocksPerAxis");
}

TEST_CASE("issue 14: negative extents and hand-made shapes beyond the limits are rejected") {
  std::vector<float> q(4, 0.5f), out(4);
  const TensorView<const float> neg(q.data(), Extents{-1, 1, 1, 4}, Strides{0, 0, 0, 1});
  require_all_backends_throw(AttentionInputs<float>{neg, neg, neg}, CausalMask{},
                             TensorView<float>(out.data(), Extents{-1, 1, 1, 4}, Strides{0, 0, 0, 1}), {}, {},
                             "non-negative");
  AttentionShape shape;
  shape.lengths = RaggedLengths::uniform(1, 4, 4);
  shape.heads = shape.kv_heads = 1;
  shape.dk = shape.dv = index_t{1} << 40;
  CHECK_THROWS_WITH(detail::check_shape_limits(shape, "plan_attention"), ContainsSubstring("kMaxHeadDim"));
}

}  // namespace seqattn_test_attention_hostile_sizes_test
