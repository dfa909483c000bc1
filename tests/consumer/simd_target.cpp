// Compiled by the consumer.simd.* tests with the flags users pass (none,
// -march=x86-64-v3, -march=sapphirerapids, ...): prints the Highway target
// backends::Highway gets, so the tests can check the flag table in README.md.
#include <cstdio>

#include "seqattn/seqattn.hpp"

int main() {
  std::printf("seqattn static target: %s (backend %s)\n", seqattn::static_simd_target(),
              seqattn::backends::Highway::target());
  return 0;
}
