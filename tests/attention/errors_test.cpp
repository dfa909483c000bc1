// Bad shapes and options throw seqattn::invalid_argument naming the argument.
#include <vector>

#include "attention_test_support.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_attention_errors_test {

using namespace seqattn;
using Catch::Matchers::Contains;

namespace {

struct Fixture {
  Tensor<float> q{{1, 8, 4, 64}}, k{{1, 10, 2, 64}}, v{{1, 10, 2, 64}};
  Tensor<float> out{{1, 8, 4, 64}}, lse{{1, 4, 8}};
  AttentionInputs<float> in() const { return {q.view(), k.view(), v.view()}; }
};

}  // namespace

TEST_CASE("attention_forward rejects bad shapes with clear messages", "[attention][errors]") {
  Fixture f;
  const CausalMask mask;
  CHECK_NOTHROW(attention_forward(f.in(), mask, f.out.view(), f.lse.view()));

  const Tensor<float> q3({8, 4, 64});
  CHECK_THROWS_WITH(
      attention_forward(AttentionInputs<float>{q3.view(), f.k.view(), f.v.view()}, mask, f.out.view(), f.lse.view()),
      Contains("q must have rank 4") && Contains("got shape (8, 4, 64)") &&
          Contains("packed THD input needs a SegmentTable"));
  const Tensor<float> k_bad_dim({1, 10, 2, 32});
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{f.q.view(), k_bad_dim.view(), f.v.view()}, mask,
                                      f.out.view(), f.lse.view()),
                    Contains("same head dim") && Contains("(1, 10, 2, 32)"));
  const Tensor<float> k3({1, 10, 3, 64}), v3({1, 10, 3, 64});
  CHECK_THROWS_WITH(
      attention_forward(AttentionInputs<float>{f.q.view(), k3.view(), v3.view()}, mask, f.out.view(), f.lse.view()),
      Contains("multiple of key/value heads (3)"));
  const Tensor<float> v_short({1, 9, 2, 64});
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{f.q.view(), f.k.view(), v_short.view()}, mask,
                                      f.out.view(), f.lse.view()),
                    Contains("k and v must agree"));
  Tensor<float> out_bad({1, 8, 4, 32});
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, out_bad.view(), f.lse.view()),
                    Contains("out must have shape (1, 8, 4, 64), got (1, 8, 4, 32)"));
  Tensor<float> lse_bad({1, 8, 4});
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, f.out.view(), lse_bad.view()),
                    Contains("lse must have shape (1, 4, 8), got (1, 8, 4)"));

  AttentionOptions options;
  const std::vector<float> sinks(3, 0.0f);
  options.sinks = sinks;
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, f.out.view(), f.lse.view(), options),
                    Contains("one logit per query head (4), got 3"));
  options = {};
  options.softcap = -1.0f;
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, f.out.view(), f.lse.view(), options), Contains("softcap"));
}

TEST_CASE("attention_forward rejects a BlockMask that does not fit", "[attention][errors]") {
  Fixture f;
  const CausalMask mask;
  AttentionOptions options;
  const BlockMask wrong_block = build_block_mask(mask, RaggedLengths::uniform(1, 8, 10), 4, {32, 32});
  options.block_mask = &wrong_block;
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, f.out.view(), f.lse.view(), options),
                    Contains("block shape (32, 32)") &&
                        Contains(detail::concat("tiles by (", attention_block_shape<backends::Highway>().q, ", ",
                                                attention_block_shape<backends::Highway>().kv, ")")));
  const BlockMask wrong_len =
      build_block_mask(mask, RaggedLengths::uniform(1, 8, 12), 4, attention_block_shape<backends::Highway>());
  options.block_mask = &wrong_len;
  CHECK_THROWS_WITH(attention_forward(f.in(), mask, f.out.view(), f.lse.view(), options),
                    Contains("lengths (q 8, kv 12)") && Contains("(q 8, kv 10)"));
}

TEST_CASE("THD segment tables are validated", "[attention][errors][thd]") {
  const Tensor<float> q({10, 2, 64}), k({12, 2, 64}), v({12, 2, 64});
  Tensor<float> out({10, 2, 64}), lse({2, 10});
  const std::vector<std::int32_t> q_off{0, 4}, q_len{5, 3}, kv_off{0, 6}, kv_len{6, 6};
  const SegmentTable overlapping{q_off, q_len, kv_off, kv_len};
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view(), &overlapping}, FullMask{},
                                      out.view(), lse.view()),
                    Contains("segments overlap on the query axis: tokens [0, 5) and [4, 7)"));
  const std::vector<std::int32_t> kv_len_long{6, 7};
  const SegmentTable outside{q_off, q_len, kv_off, kv_len_long};
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view(), &outside}, FullMask{},
                                      out.view(), lse.view()),
                    Contains("segment 1 covers key/value tokens [6, 13) outside [0, 12)"));
  // A negative length is named as such (it used to read "covers [4, 3)").
  const std::vector<std::int32_t> q_len_negative{4, -1};
  const SegmentTable negative{q_off, q_len_negative, kv_off, kv_len};
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{q.view(), k.view(), v.view(), &negative}, FullMask{},
                                      out.view(), lse.view()),
                    Contains("segment 1 has a negative length (q_lens[1] = -1, kv_lens[1] = 6)"));
  const Tensor<float> q4({1, 10, 2, 64});
  const std::vector<std::int32_t> one{0}, ten{10}, twelve{12};
  const SegmentTable fine{one, ten, one, twelve};
  CHECK_THROWS_WITH(attention_forward(AttentionInputs<float>{q4.view(), k.view(), v.view(), &fine}, FullMask{},
                                      out.view(), lse.view()),
                    Contains("q must have rank 3 (THD layout"));
}

}  // namespace seqattn_test_attention_errors_test
