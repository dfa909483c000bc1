// seqattn::float16 against the compiler's IEEE binary16 (_Float16): every bit
// pattern back to float, and round-to-nearest-even from float on edge cases
// and a million random values (normals, subnormals, overflow, NaN).
#include "seqattn/core/float16.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_core_float16_test {

namespace {

std::uint16_t bits_of(_Float16 h) {
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 4) == 0;  // distinguishes -0 from +0
}

}  // namespace

TEST_CASE("float16: every bit pattern widens like _Float16", "[core][float16]") {
  int mismatches = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    _Float16 h;
    const auto bits = static_cast<std::uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    mismatches += !same_float(static_cast<float>(seqattn::float16::from_bits(bits)), static_cast<float>(h));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("float16: rounding from float matches _Float16", "[core][float16]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float x :
       {0.0f,         -0.0f,         1.0f,          -1.0f,          65504.0f,        65519.0f,      65520.0f,
        -65520.0f,    1e9f,          inf,           -inf,           5.9604645e-8f,   2.9802322e-8f, 2.9802326e-8f,
        8.940697e-8f, 6.1035156e-5f, 6.1035152e-5f, 1.00048828125f, 1.000732421875f, 3.14159265f}) {
    INFO("x = " << x);
    CHECK(seqattn::float16(x).bits == bits_of(static_cast<_Float16>(x)));
  }
  CHECK(std::isnan(static_cast<float>(seqattn::float16(std::numeric_limits<float>::quiet_NaN()))));
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  int mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    mismatches += seqattn::float16(x).bits != bits_of(static_cast<_Float16>(x));
  }
  CHECK(mismatches == 0);
}

}  // namespace seqattn_test_core_float16_test
