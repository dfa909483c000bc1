// A consumer of the installed or embedded package: includes the umbrella
// header and exercises the public API end to end. Exit code 0 = success.
#include <cstdio>

#include "seqattn/seqattn.hpp"

int main() {
  seqattn::Tensor<int> t(seqattn::Extents{2, 3}, 7);
  if (t.view()(1, 2) != 7) return 1;
  std::printf("seqattn %d.%d.%d consumer OK (Highway target %s)\n", seqattn::kVersionMajor, seqattn::kVersionMinor,
              seqattn::kVersionPatch, seqattn::static_simd_target());
  return 0;
}
