// float16: IEEE binary16 storage type with round-to-nearest-even conversion.
//
// Like bfloat16 it only stores: arithmetic happens in fp32. The CPU backends
// compute on float and bfloat16; the Cuda backend also takes float16 (its
// tensor cores multiply fp16 as well as bf16).
#pragma once

#include <bit>
#include <cstdint>

namespace seqattn {

struct float16 {
  std::uint16_t bits = 0;

  constexpr float16() = default;
  explicit constexpr float16(float value) : bits(round_from_float(value)) {}
  explicit constexpr operator float() const { return to_float_bits(bits); }

  static constexpr float16 from_bits(std::uint16_t b) {
    float16 out;
    out.bits = b;
    return out;
  }
  friend constexpr bool operator==(float16 a, float16 b) { return a.bits == b.bits; }

 private:
  static constexpr std::uint16_t round_from_float(float value) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) {  // inf or NaN (NaN stays a quiet NaN)
      return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u));
    }
    if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
    if (abs < 0x38800000u) {  // result is subnormal (or zero): align to 2^-24 units, round to even
      const std::uint32_t exp = abs >> 23;
      if (exp < 102) return static_cast<std::uint16_t>(sign);  // below half of the smallest subnormal
      const std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;
      const std::uint32_t shift = 126 - exp;  // 14 .. 24
      const std::uint32_t half = 1u << (shift - 1);
      const std::uint32_t rest = mant & ((1u << shift) - 1);
      std::uint32_t r = mant >> shift;
      if (rest > half || (rest == half && (r & 1u))) ++r;
      return static_cast<std::uint16_t>(sign | r);
    }
    const std::uint32_t lsb = (abs >> 13) & 1u;
    const std::uint32_t rounded = abs + 0x0FFFu + lsb;  // carries into the exponent correctly
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  static constexpr float to_float_bits(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1Fu;
    std::uint32_t mant = h & 0x03FFu;
    if (exp == 0x1Fu) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
    if (mant == 0) return std::bit_cast<float>(sign);
    std::uint32_t e = 113;  // subnormal: normalize
    while ((mant & 0x0400u) == 0) {
      mant <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x03FFu) << 13));
  }
};

static_assert(sizeof(float16) == 2);

constexpr float to_float(float16 x) { return static_cast<float>(x); }

}  // namespace seqattn
