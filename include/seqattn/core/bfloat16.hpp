// bfloat16 storage type with round-to-nearest-even conversion.
//
// Highway 1.0.3's DemoteTo(bf16) and hwy::BF16FromF32 truncate; frameworks
// (PyTorch, JAX) round to nearest even. Converting through this type keeps
// seqattn's bf16 outputs bit-identical to theirs. Arithmetic always happens in
// fp32: this type only stores.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace seqattn {

struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  explicit constexpr bfloat16(float value) : bits(round_from_float(value)) {}
  explicit constexpr operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

  static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 out;
    out.bits = b;
    return out;
  }

  friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }

 private:
  static constexpr std::uint16_t round_from_float(float value) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
    }
    const std::uint32_t lsb = (u >> 16) & 1u;
    return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
  }
};

static_assert(sizeof(bfloat16) == 2);

// Storage-to-compute conversion used by kernels templated on the storage type.
constexpr float to_float(float x) { return x; }
constexpr float to_float(bfloat16 x) { return static_cast<float>(x); }

template <class T>
constexpr T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return T(x);
  }
}

}  // namespace seqattn
