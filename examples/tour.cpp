// A tour of seqattn for newcomers: run it with scripts/demo.sh.
#include <cstdio>

#include "seqattn/seqattn.hpp"

using namespace seqattn;

int main() {
  std::printf("seqattn %d.%d.%d tour (Highway target %s)\n\n", kVersionMajor, kVersionMinor, kVersionPatch,
              static_simd_target());
  const BlockMask bm = build_block_mask(CausalMask{}, RaggedLengths::uniform(1, 1024, 1024), 1, {128, 128});
  std::printf(
      "A causal mask over 1024 tokens in 128x128 tiles: %td full tiles, %td partial tiles "
      "(%td distinct bit patterns), %td of %td tiles skipped.\n",
      bm.num_full_tiles(), bm.num_partial_tiles(), bm.num_distinct_partial_tiles(),
      bm.num_tiles() - bm.num_full_tiles() - bm.num_partial_tiles(), bm.num_tiles());
  return 0;
}
