#!/usr/bin/env bash
# The test suite: builds and runs every test under the release preset (AVX2)
# and under ASan + UBSan. Installs missing Debian packages first.
#   SEQATTN_TEST_PRESETS="release"  run a subset of presets
#   SEQATTN_JOBS=N                  parallel build/test jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

presets=${SEQATTN_TEST_PRESETS:-"release asan"}
jobs=${SEQATTN_JOBS:-$(nproc)}
for preset in $presets; do
  echo "=== seqattn: preset $preset"
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
done
