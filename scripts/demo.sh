#!/usr/bin/env bash
# The demo: builds the examples (release preset) and runs the seqattn tour.
# Installs missing Debian packages first. Arguments go to the tour
# (scripts/demo.sh --help lists them, e.g. --svg FILE).
#
# Also built: the mask gallery (examples/mask_gallery.cpp), which prints every
# mask kind as ASCII and writes SVG pictures of each mask and its BlockMask:
#   ./build/release/examples/seqattn_example_mask_gallery [DIR]   (default DIR: mask_gallery)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

jobs=${SEQATTN_JOBS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target seqattn_example_tour seqattn_example_mask_gallery
./build/release/examples/seqattn_example_tour "$@"
case " $* " in
  *" --help "* | *" -h "*) ;;
  *)
    echo
    echo "Next: every mask kind as pictures (examples/mask_gallery.cpp):"
    echo "  ./build/release/examples/seqattn_example_mask_gallery mask_gallery   # ASCII here, SVG files in mask_gallery/"
    ;;
esac
