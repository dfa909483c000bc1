#!/usr/bin/env bash
# The Python package's tests: a venv (numpy, nanobind, scikit-build-core,
# pytest, jax[cpu], ml_dtypes, torch and atheris, pinned in python/requirements-test.txt;
# cached, linked as build/python-venv), an incremental build of the package
# into it (build dir build/python), then pytest, then the atheris fuzz target
# (python/tests/fuzz) for SEQATTN_FUZZ_SECONDS.
# Idempotent: a second run reuses the venv and the CMake build dir. Extra
# arguments go to pytest.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/build/python-venv"
build_dir="$root/build/python"
python="${PYTHON:-python3}"
start=$SECONDS
step_start=$SECONDS
step() {
  local now=$SECONDS
  printf 'test-python: %-34s %4ds\n' "$1" $((now - step_start))
  step_start=$now
}

# The venv lives in a cache keyed on python/requirements-test.txt and the
# interpreter, so that fresh clones (CI) reuse it instead of unpacking torch's
# CUDA wheels again; build/python-venv links to it.
requirements="$root/python/requirements-test.txt"
key=$( (cat "$requirements"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
cache="${SEQATTN_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqattn}/python-venv-$key"
if [[ ! -f "$cache/.seqattn-complete" ]]; then
  rm -rf "$cache"
  mkdir -p "$(dirname "$cache")"
  "$python" -m venv "$cache"
  # torch is required (the flex-export tests need it): a failed install fails
  # this script. pip's cache (~/.cache/pip) keeps reinstalls fast.
  if ! "$cache/bin/python" -m pip install -q -r "$requirements"; then
    echo "test-python: FAILED to install the Python test dependencies ($requirements)" >&2
    exit 1
  fi
  "$cache/bin/python" -c 'import torch, jax, numpy, nanobind' || {
    echo "test-python: FAILED: the test dependencies are installed but do not import" >&2
    exit 1
  }
  touch "$cache/.seqattn-complete"
fi
mkdir -p "$root/build"
if [[ -L "$venv" || ! -e "$venv" ]]; then
  ln -sfn "$cache" "$venv"
else
  echo "test-python: $venv exists and is not a link to the cached venv; using the cache directly" >&2
  venv="$cache"
fi
py="$venv/bin/python"
step "dependencies"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# --no-build-isolation: build with the venv's nanobind / scikit-build-core
# and reuse build/python between runs (incremental CMake build).
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$py" -m pip install --no-build-isolation --no-deps -q \
  --config-settings=build-dir="$build_dir" "${launcher[@]}" "$root"
step "build + install seqattn"

cd "$root/python/tests"
"$py" -m pytest -q "$@"
step "pytest"

# The atheris fuzz target over the entry points (python/tests/fuzz), for
# SEQATTN_FUZZ_SECONDS (default 30; 0 skips it), on a fresh corpus in the
# build tree seeded from the checked-in one; reproducers land in
# build/python-fuzz/artifacts.
fuzz_seconds="${SEQATTN_FUZZ_SECONDS:-30}"
if [[ "$fuzz_seconds" != 0 ]]; then
  fuzz_dir="$root/build/python-fuzz"
  rm -rf "$fuzz_dir/corpus"
  mkdir -p "$fuzz_dir/corpus" "$fuzz_dir/artifacts"
  "$py" "$root/python/tests/fuzz/fuzz_entry_points.py" -max_total_time="$fuzz_seconds" -timeout=30 \
    -rss_limit_mb=6144 -print_final_stats=1 -artifact_prefix="$fuzz_dir/artifacts/" \
    "$fuzz_dir/corpus" "$root/python/tests/fuzz/corpus" >"$fuzz_dir/log.txt" 2>&1 || {
    tail -n 60 "$fuzz_dir/log.txt" >&2
    echo "test-python: FAILED: the atheris fuzz target found a crash (reproducer under $fuzz_dir/artifacts)" >&2
    exit 1
  }
  grep -E 'stat::number_of_executed_units|cov:' "$fuzz_dir/log.txt" | tail -n 2 || true
  step "fuzz (atheris, ${fuzz_seconds} s)"
fi
printf 'test-python: %-34s %4ds\n' "total" $((SECONDS - start))
