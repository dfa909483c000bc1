#!/usr/bin/env bash
# The test suite, in stages. Installs missing Debian packages first.
#   release  every test, optimized build (AVX2), MPI ring tests included
#   asan     every test under AddressSanitizer + UndefinedBehaviorSanitizer,
#            at -Og: about half the compile time of -O1 under the sanitizers'
#            instrumentation, for tests that run a quarter longer (measured
#            cold on 2 cores: build ~800 s -> 448 s, tests 69 s -> 89 s)
#   tsan     the execution (thread pool) tests under ThreadSanitizer
#   fuzz     each libFuzzer target for SEQATTN_FUZZ_SECONDS (default 20 here,
#            30 in a plain CMake build; scripts/fuzz.sh runs longer) on its corpus
#   python   the Python package: a wheel built from an sdist, installed into a
#            venv under build/, then pytest against the installed package
#   quick    not in the default list: the unit tests at -O1 (no CUDA, MPI,
#            dispatch library, examples, benchmarks or source checks), for
#            day-to-day work: SEQATTN_TEST_STAGES=quick
# Env:
#   SEQATTN_TEST_STAGES="release tsan"   run a subset of stages (default: all, in this order)
#   SEQATTN_JOBS=N                       parallel build/test jobs (default: nproc)
# Compilations go through ccache when it is installed (ensure-deps installs
# it), keyed relative to the checkout so that fresh clones share the cache.
# CUDA: when nvcc is found (PATH, CUDACXX or /usr/local/cuda/bin; see
# cmake/SeqattnCuda.cmake) the release stage also builds the CUDA backend's
# GPU test, benchmark and example (the kernels once, in generated instance
# files) for sm_80 and sm_90a; the GPU test (CTest label gpu) reports Skipped
# on machines without a CUDA device. There the build is a compile check only:
# one architecture, as PTX alone (CUDAARCHS=90a-virtual, when not already set:
# no ptxas), with the device code unoptimized (CUDAFLAGS -Xcicc -O0: cicc's
# optimizer took most of the rest), checks the same source at about a tenth of
# the cost of optimized sm_80 + sm_90a binaries. No nvcc: the
# option is off and the stage passes without them. asan/tsan/fuzz never
# build CUDA code; the host-only CUDA planning tests (tests/cuda/*.cpp) run
# in release and asan. The dispatch library (src/dispatch.cc, every Highway
# target in one TU) is built and tested in release only: its kernels are
# FlashKernel's, which the kernel tests run under ASan on every target.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

# Without a GPU the CUDA programs never run, so their host code is not
# optimized either (CMAKE_CUDA_FLAGS_RELEASE without -O3: g++ at -O0 on the
# GPU test's reference engine and Catch2 code was most of the CUDA targets'
# remaining 300 s of CPU time); with one, CMake's default comes back.
cuda_config=(-DCMAKE_CUDA_FLAGS_RELEASE="-O3 -DNDEBUG")
if ! nvidia-smi -L >/dev/null 2>&1; then
  if [[ -z "${CUDAARCHS:-}" ]]; then export CUDAARCHS=90a-virtual; fi
  if [[ "${CUDAFLAGS:-}" != *-Xcicc* ]]; then export CUDAFLAGS="${CUDAFLAGS:-} -Xcicc -O0"; fi
  # The kernel instances in one file per storage type: nvcc's fixed cost per
  # file, not the kernels, is most of a compile-only build (python/CMakeLists.txt's
  # CUDA module measured 254 s as 20 files, 29 s as 2, at -j2).
  cuda_config=(-DCMAKE_CUDA_FLAGS_RELEASE=-DNDEBUG -DSEQATTN_CUDA_INSTANCE_FILES=type)
fi

stages=${SEQATTN_TEST_STAGES:-${SEQATTN_TEST_PRESETS:-"release asan tsan fuzz python"}}
jobs=${SEQATTN_JOBS:-$(nproc)}

if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  # Depend mode: a miss compiles once, instead of preprocessing first to
  # hash the result (about 2 s of our headers per file, a fifth of a cold build).
  export CCACHE_DEPEND=1
fi

# Ninja (ensure-deps installs it): it starts a file's compile as soon as its
# own inputs exist, where CMake's Makefiles wait for every dependency target
# of its target. A build folder keeps the generator it was made with.
generator_for() {
  local cache="build/$1/CMakeCache.txt"
  if [[ -f "$cache" ]]; then
    sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache"
  elif command -v ninja >/dev/null 2>&1; then
    echo Ninja
  fi
}

configure() {
  local preset=$1 generator
  shift
  generator=$(generator_for "$preset")
  if [[ -n "$generator" ]]; then
    CMAKE_GENERATOR="$generator" cmake --preset "$preset" "$@"
  else
    cmake --preset "$preset" "$@"
  fi
}

run_preset() {
  local preset=$1
  configure "$preset" "${cuda_config[@]}"
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
}

total_start=$(date +%s)
for stage in $stages; do
  start=$(date +%s)
  echo "=== seqattn: stage $stage"
  case "$stage" in
    release | asan | tsan | quick) run_preset "$stage" ;;
    fuzz)
      # Each fuzzer is one process on one core: run them two at a time.
      configure fuzz -DSEQATTN_FUZZ_SECONDS="${SEQATTN_FUZZ_SECONDS:-20}"
      cmake --build --preset fuzz -j "$jobs"
      ctest --preset fuzz -j "$jobs"
      ;;
    python) bash scripts/test-python.sh ;;
    *)
      echo "scripts/test.sh: unknown stage '$stage' (release asan tsan fuzz python quick)" >&2
      exit 2
      ;;
  esac
  echo "=== seqattn: stage $stage passed in $(($(date +%s) - start)) s"
done
echo "=== seqattn: all stages ($stages) passed in $(($(date +%s) - total_start)) s"
if command -v ccache >/dev/null 2>&1; then ccache --show-stats 2>/dev/null | grep -iE 'hit|miss' | head -n 4 || true; fi
