// Test main shared by every seqattn test binary: states the Highway target
// (on stderr, so CTest's test discovery, which parses stdout, is unaffected)
// and refuses to build a SIMD-less configuration by accident.

#include <cstdio>

#include "seqattn/core/simd.hpp"

#include "support/catch_session.hpp"

#if SEQATTN_STATIC_TARGET_IS_SCALAR && !defined(SEQATTN_ALLOW_SCALAR)
#error "seqattn tests would run on Highway's SCALAR/EMU128 target: set SEQATTN_SIMD_FLAGS (see CMakePresets.json)"
#endif

int main(int argc, char* argv[]) {
  std::fprintf(stderr, "seqattn tests: Highway static target %s\n", seqattn::static_simd_target());
  return seqattn::testing::run_catch_session(argc, argv);
}
