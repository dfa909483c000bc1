#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) in build/fuzz and runs each
# for SECONDS (default 600) on a fresh corpus seeded from fuzz/corpus/<name>/,
# then prints executions and coverage per target. CI runs them for 30 s each
# (scripts/test.sh, stage fuzz); this script is for longer runs by hand.
#   scripts/fuzz.sh [SECONDS]
# Env: JOBS (build parallelism, default 2), CXX (default clang++), FUZZERS
# (space-separated subset of targets).
set -euo pipefail

seconds="${1:-600}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build/fuzz"
jobs="${JOBS:-2}"
cxx="${CXX:-clang++}"
fuzzers="${FUZZERS:-fuzz_descriptors fuzz_block_mask fuzz_topk fuzz_attention fuzz_plan fuzz_paged fuzz_any_mask fuzz_export}"

command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (needs clang with libFuzzer, e.g. clang + libclang-rt-14-dev)" >&2; exit 1; }

cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE= \
  -DSEQATTN_BUILD_FUZZERS=ON -DSEQATTN_BUILD_TESTS=OFF -DSEQATTN_BUILD_EXAMPLES=OFF \
  -DSEQATTN_BUILD_BENCHMARKS=OFF -DSEQATTN_BUILD_DISPATCH=OFF >/dev/null
start=$(date +%s)
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $fuzzers
echo "fuzz.sh: built in $(($(date +%s) - start)) s"

runs="$build/runs"
status=0
summary=""
for name in $fuzzers; do
  corpus="$runs/$name/corpus"
  artifacts="$runs/$name/artifacts"
  log="$runs/$name/log.txt"
  rm -rf "$runs/$name"
  mkdir -p "$corpus" "$artifacts"
  echo "fuzz.sh: running $name for ${seconds} s (log: $log)"
  rc=0
  "$build/fuzz/$name" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$root/fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*' || echo "?")
  line="$name: executions=${execs} cov=${cov} corpus=$(find "$corpus" -type f | wc -l)"
  if [ "$rc" -ne 0 ]; then
    status=1
    line="$line FAILED (exit $rc; reproducer: $(ls "$artifacts" | head -n 1 || true))"
    grep -E 'FUZZ_CHECK|ERROR:|unexpected exception|SUMMARY' "$log" | head -n 5 || true
  fi
  echo "$line"
  summary="$summary$line"$'\n'
done
echo
echo "fuzz.sh summary (${seconds} s per target):"
printf '%s' "$summary"
exit "$status"
