#!/usr/bin/env bash
# Builds, on this machine, CPU programs for another x86 machine that has no
# Highway or Catch2 (e.g. a GPU box with a Sapphire Rapids host CPU), with the
# compiler targeting that CPU (default -march=sapphirerapids: AVX512_BF16, so
# the bf16 pair-dot path uses VDPBF16PS; see backends/highway_bf16-inl.h):
#   build/cpu-bundle/seqattn_test_bf16_dot   tests/attention/bf16_dot_test.cpp
#                                            (+ tests/support/main.cpp), fully static
#   build/cpu-bundle/seqattn_bf16_dot        bench/bf16_dot.cpp (Google Benchmark)
#   build/cpu-bundle/seqattn_attention       bench/attention.cpp (Google Benchmark)
#   build/cpu-bundle/libbenchmark.so.1debian the benchmark library (only a shared
#                                            one ships with Debian's libbenchmark-dev),
#                                            found through the binary's rpath $ORIGIN
# Highway is used header-only at its static target (HWY_COMPILE_ONLY_STATIC:
# no libhwy). Catch2 v2 (Debian 12) is header-only; v3 needs libCatch2.a.
# The benchmark links libstdc++ dynamically, as libbenchmark.so does (one
# libstdc++ in the process): the target machine needs libstdc++.so.6 from GCC
# >= 12 and a glibc at least as new as the symbols MANIFEST.txt lists.
#
# The binaries execute AVX512_BF16 (and possibly AVX512_FP16/VBMI) code: on a
# CPU without them they stop with SIGILL once such code runs. Listing the
# tests (--list-tests) and --help work anywhere with AVX-512.
#
# Run on the target machine:
#   build/cpu-bundle/seqattn_test_bf16_dot
#   build/cpu-bundle/seqattn_bf16_dot --benchmark_filter='Rate|Tile|Probe'
#   build/cpu-bundle/seqattn_bf16_dot --benchmark_filter=PrefillCausal
#   taskset -c 0,1 build/cpu-bundle/seqattn_attention   (limits measured on the CPUs taskset allows)
#
# Env:
#   SEQATTN_CPU_FLAGS  default "-march=sapphirerapids -DHWY_COMPILE_ONLY_STATIC"
#   SEQATTN_JOBS       programs compiled at once (default 2)
#   CXX                default g++
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=build/cpu-bundle

read -r -a simd <<<"${SEQATTN_CPU_FLAGS:-"-march=sapphirerapids -DHWY_COMPILE_ONLY_STATIC"}"
max_jobs=${SEQATTN_JOBS:-2}
cxx=${CXX:-g++}

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(ccache)
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
fi

# The flags of the CMake build, less the warnings as errors: this build ships
# binaries, the CMake build checks the code.
flags=(-std=c++20 -O3 -DNDEBUG -Wall -Wextra -Wpedantic "${simd[@]}" -I"$root/include" -pthread)

catch_libs=()
if echo '#include <catch2/catch_session.hpp>' | "$cxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
  catch_libs+=(-lCatch2)
fi
libbenchmark=$("$cxx" -print-file-name=libbenchmark.so)
if [[ ! -e "$libbenchmark" || "$libbenchmark" == libbenchmark.so ]]; then
  echo "build-cpu-bundle: no libbenchmark.so (Debian: apt-get install libbenchmark-dev)" >&2
  exit 1
fi
libbenchmark_soname=$(objdump -p "$libbenchmark" | awk '/SONAME/ {print $2}')

mkdir -p "$out"
names=()
build() { # name [compile flags and sources...] [-- libraries...]
  local name=$1
  shift
  local args=() libs=()
  while (($#)) && [[ $1 != -- ]]; do args+=("$1") && shift; done
  (($#)) && shift && libs=("$@")
  local log="$out/$name.log"
  echo "build-cpu-bundle: $name"
  rm -f "$out/$name" "$log.rc"
  (
    rc=0
    "${launcher[@]}" "$cxx" "${flags[@]}" "${args[@]}" -o "$out/$name" "${libs[@]}" >"$log" 2>&1 || rc=$?
    echo "$rc" >"$log.rc"
  ) &
  names+=("$name")
  while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
}

start=$SECONDS
build seqattn_test_bf16_dot -I"$root/tests" tests/attention/bf16_dot_test.cpp tests/support/main.cpp \
  -- -static "${catch_libs[@]}"
build seqattn_bf16_dot -I"$root/bench" bench/bf16_dot.cpp -- -lbenchmark -static-libgcc '-Wl,-rpath,$ORIGIN'
build seqattn_attention -I"$root/bench" bench/attention.cpp -- -lbenchmark -static-libgcc '-Wl,-rpath,$ORIGIN'
wait

status=0
for name in "${names[@]}"; do
  if [[ "$(cat "$out/$name.log.rc" 2>/dev/null)" != 0 ]]; then
    echo "build-cpu-bundle: FAILED: $name (log: $out/$name.log)" >&2
    cat "$out/$name.log" >&2
    status=1
  fi
  rm -f "$out/$name.log.rc"
done
((status == 0)) || exit 1
cp -L "$libbenchmark" "$out/$libbenchmark_soname"

needed() { objdump -p "$1" | awk '/NEEDED/ {printf "%s ", $2}'; }
glibc_max() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1; }
glibcxx_max() { objdump -T "$1" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1; }
if [[ -n "$(needed "$out/seqattn_test_bf16_dot")" ]]; then
  echo "build-cpu-bundle: seqattn_test_bf16_dot is not static: $(needed "$out/seqattn_test_bf16_dot")" >&2
  exit 1
fi
for bench in seqattn_bf16_dot seqattn_attention; do
  if grep -qE 'libhwy|libCatch2' <<<"$(needed "$out/$bench")"; then
    echo "build-cpu-bundle: $bench needs a library the target machine may lack" >&2
    exit 1
  fi
done
{
  echo "seqattn CPU bundle: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) by $("$cxx" --version | head -n 1)"
  echo "flags: ${simd[*]}"
  echo "instructions: $(objdump -d "$out/seqattn_test_bf16_dot" | grep -c vdpbf16ps) vdpbf16ps in seqattn_test_bf16_dot, $(objdump -d "$out/seqattn_bf16_dot" | grep -c vdpbf16ps) in seqattn_bf16_dot"
  echo
  echo "seqattn_test_bf16_dot: $(stat -c %s "$out/seqattn_test_bf16_dot") bytes; static"
  for f in seqattn_bf16_dot seqattn_attention "$libbenchmark_soname"; do
    echo "$f: $(stat -c %s "$out/$f") bytes; needs: $(needed "$out/$f"); newest symbols: $(glibc_max "$out/$f") $(glibcxx_max "$out/$f")"
  done
} >"$out/MANIFEST.txt"
echo "build-cpu-bundle: ${names[*]} in $out/ ($((SECONDS - start)) s); see $out/MANIFEST.txt"
