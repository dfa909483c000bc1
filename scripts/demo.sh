#!/usr/bin/env bash
# The demo: builds the examples (release preset) and runs the seqattn tour.
# Installs missing Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

jobs=${SEQATTN_JOBS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target seqattn_example_tour
./build/release/examples/seqattn_example_tour "$@"
