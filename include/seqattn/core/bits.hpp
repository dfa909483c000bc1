// Bit words: a row of keys (a BlockMask tile row, a mask's row_bits) is
// stored as 64-bit words, key c in word c / 64 at bit c % 64.
#pragma once

#include <cstdint>

#include "seqattn/core/checked.hpp"

namespace seqattn::detail {

// Bit i (i >= 0) of the words starting at `words`.
inline bool test_bit(const std::uint64_t* words, index_t i) { return (words[i / 64] >> (i % 64)) & 1u; }

}  // namespace seqattn::detail
