#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "seqattn/core.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_core_tensor_test {

using seqattn::Extents;
using seqattn::Tensor;
using seqattn::TensorView;

TEST_CASE("Extents print like NumPy shapes and compare by value") {
  CHECK(Extents{2, 1, 8}.to_string() == "(2, 1, 8)");
  CHECK(Extents{8}.to_string() == "(8,)");
  CHECK(Extents{}.to_string() == "()");
  CHECK(Extents{}.size() == 1);
  CHECK(Extents{2, 3, 4}.size() == 24);
  CHECK(Extents{2, 3, 4}.last(2) == Extents{3, 4});
  CHECK(Extents{2, 3, 4}.first(1) == Extents{2});
  CHECK(Extents{2, 3}.concat(Extents{5}) == Extents{2, 3, 5});
  CHECK_FALSE(Extents{2, 3} == Extents{3, 2});
  CHECK_THROWS_AS((Extents{1, 1, 1, 1, 1, 1, 1, 1, 1}), seqattn::invalid_argument);
}

TEST_CASE("TensorView indexes row-major and strided data") {
  std::vector<int> values(24);
  for (int i = 0; i < 24; ++i) values[static_cast<std::size_t>(i)] = i;
  TensorView<int> v(values.data(), Extents{2, 3, 4});
  CHECK(v(1, 2, 3) == 23);
  CHECK(v(0, 1, 0) == 4);
  CHECK(v.is_contiguous());

  // Select drops a dimension; slice keeps it but narrows it.
  auto row = v.select(0, 1);
  CHECK(row.shape() == Extents{3, 4});
  CHECK(row(2, 1) == 21);
  auto cols = v.slice(2, 1, 3);
  CHECK(cols.shape() == Extents{2, 3, 2});
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols(1, 0, 1) == 14);
  auto copy = seqattn::to_tensor(cols);
  CHECK(copy.shape() == cols.shape());
  CHECK(copy(1, 0, 1) == 14);
  CHECK(copy.view().is_contiguous());

  // Zero strides broadcast.
  TensorView<int> broadcast(values.data(), Extents{5, 4}, Extents{0, 1});
  CHECK(broadcast(4, 3) == 3);

  // Non-const converts to const.
  TensorView<const int> cv = v;
  CHECK(cv(0, 0, 1) == 1);
  CHECK(v.reshape(Extents{6, 4})(5, 3) == 23);
  CHECK_THROWS_WITH(cols.reshape(Extents{12}), Catch::Matchers::Contains("not contiguous"));
  CHECK_THROWS_WITH(v.reshape(Extents{5, 5}), Catch::Matchers::Contains("cannot reshape (2, 3, 4) into (5, 5)"));
}

TEST_CASE("Tensor owns contiguous storage and checks its size") {
  Tensor<float> t(Extents{2, 2}, 1.5f);
  t(1, 0) = 3.0f;
  CHECK(t.view()(1, 0) == 3.0f);
  CHECK(t.size() == 4);
  CHECK_THROWS_WITH((Tensor<int>(Extents{2, 2}, std::vector<int>{1, 2, 3})),
                    Catch::Matchers::Contains("3 values do not fill shape (2, 2)"));
  std::vector<int> v{1, 2, 3, 4, 5, 6};
  TensorView<const int> view(v.data(), Extents{2, 3});
  CHECK_THROWS_WITH(seqattn::detail::require_shape(view, Extents{3, 2}, "segment_ids"),
                    Catch::Matchers::Contains("segment_ids must have shape (3, 2), got (2, 3)"));
}

TEST_CASE("bfloat16 rounds to nearest even, unlike Highway 1.0.3's truncation") {
  using seqattn::bfloat16;
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  CHECK(static_cast<float>(bfloat16(1.0f + 0x1p-8f)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: goes up.
  CHECK(static_cast<float>(bfloat16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  // Just above halfway rounds up where truncation would not.
  CHECK(static_cast<float>(bfloat16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::infinity()))));
  for (float x : {0.0f, -2.5f, 3.140625f, 65280.0f}) CHECK(static_cast<float>(bfloat16(x)) == x);
}

TEST_CASE("TensorView over an existing buffer checks the buffer holds the shape") {
  std::vector<float> buffer(2 * 3 * 4);
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
  const TensorView<float> v(buffer, {2, 3, 4});
  CHECK(v.data() == buffer.data());
  CHECK(v(1, 2, 3) == 23.0f);
  const std::vector<float>& cref = buffer;
  const TensorView<const float> c(cref, {6, 4});
  CHECK(c(5, 3) == 23.0f);
  CHECK_THROWS_WITH((TensorView<float>(buffer, {5, 5})),
                    ContainsSubstring("needs 25 elements but the buffer holds 24"));
  CHECK_THROWS_WITH((TensorView<float>(buffer, {2, -3})), ContainsSubstring("negative extent"));
}

TEST_CASE("Extents take any integer type, so a container's size needs no cast") {
  const std::vector<int> ids(7);
  const Extents e{1, ids.size()};  // size_t: a narrowing error with an initializer_list<int64_t>
  CHECK(e.rank() == 2);
  CHECK(e[1] == 7);
  const Extents f{std::uint8_t{3}, 4L, std::int64_t{5}};
  CHECK(f.size() == 60);
  const Extents huge{std::numeric_limits<std::uint64_t>::max()};
  CHECK(huge.any_negative());  // beyond index_t: rejected as negative by every size check
  CHECK_THROWS_WITH(Tensor<float>(huge), ContainsSubstring("negative extent"));
}

}  // namespace seqattn_test_core_tensor_test
