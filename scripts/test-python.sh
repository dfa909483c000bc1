#!/usr/bin/env bash
# The Python package's tests: a venv (numpy, nanobind, scikit-build-core,
# pytest, jax[cpu], ml_dtypes, torch and atheris, pinned in python/requirements-test.txt;
# cached, linked as build/python-venv), an sdist (build/python-sdist), a
# wheel built from it incrementally (build dir build/python, wheel in
# build/python-wheel) and installed into the venv, then pytest against the
# installed wheel from outside the source tree (a file missing from the sdist
# or the wheel fails), then the atheris fuzz target (python/tests/fuzz) for
# SEQATTN_FUZZ_SECONDS.
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
  launcher=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
    --config-settings=cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# seqattn._cuda, the CUDA module, is built where nvcc is found (python/CMakeLists.txt);
# SEQATTN_PYTHON_CUDA=OFF|ON (environment) forces it off or on, and tells
# python/tests/test_cuda_host.py what to expect. Without a GPU its tests run on
# the host only, so the build is the compile check of scripts/test.sh's release
# stage: PTX for one architecture (CUDAARCHS=90a-virtual: no ptxas), device code
# unoptimized (CUDAFLAGS -Xcicc -O0), the .cu files' host code at -O0, and the
# kernel instances in one file per storage type (SEQATTN_CUDA_INSTANCE_FILES:
# nvcc's fixed cost per file, not the kernels, is most of such a build; 2 files
# instead of 20 took the instances from 254 s to 29 s at -j2 here).
cuda_config=()
if [[ -n "${SEQATTN_PYTHON_CUDA:-}" ]]; then
  cuda_config+=(--config-settings=cmake.define.SEQATTN_PYTHON_CUDA="$SEQATTN_PYTHON_CUDA")
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  if [[ -z "${CUDAARCHS:-}" ]]; then export CUDAARCHS=90a-virtual; fi
  if [[ "${CUDAFLAGS:-}" != *-Xcicc* ]]; then export CUDAFLAGS="${CUDAFLAGS:-} -Xcicc -O0"; fi
  cuda_config+=(--config-settings=cmake.define.CMAKE_CUDA_FLAGS_RELEASE=-DNDEBUG
    --config-settings=cmake.define.SEQATTN_CUDA_INSTANCE_FILES=type)
fi
# The wheel is built from an sdist, as a package index would build it, so a
# file missing from the sdist fails here too. The sdist is mirrored into a
# fixed directory, rewriting only the files whose content changed: its
# members carry one fixed mtime, which would hide changes from the
# incremental build (and re-extracting everything would rebuild everything).
sdist_dir="$root/build/python-sdist"
sdist_src="$sdist_dir/src"
rm -f "$sdist_dir"/*.tar.gz
mkdir -p "$sdist_dir"
(cd "$root" && "$py" -c 'import sys; from scikit_build_core.build import build_sdist; build_sdist(sys.argv[1])' \
  "$sdist_dir" >/dev/null)
"$py" - "$sdist_dir"/seqattn-*.tar.gz "$sdist_src" <<'EOF'
import pathlib
import sys
import tarfile

archive, dest = sys.argv[1], pathlib.Path(sys.argv[2])
kept = set()
with tarfile.open(archive) as tar:
    for member in tar.getmembers():
        if not member.isfile():
            continue
        rel = pathlib.Path(*pathlib.PurePosixPath(member.name).parts[1:])
        kept.add(rel)
        data = tar.extractfile(member).read()
        out = dest / rel
        if out.is_file() and out.read_bytes() == data:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        out.chmod(member.mode & 0o777)
for path in sorted(dest.rglob("*"), reverse=True):
    if path.is_file() and path.relative_to(dest) not in kept:
        path.unlink()
    elif path.is_dir() and not any(path.iterdir()):
        path.rmdir()
EOF
step "sdist"

# --no-build-isolation: build with the venv's nanobind / scikit-build-core /
# jaxlib and reuse build/python between runs (incremental CMake build); an
# isolated build (what `pip install .` does) would download the build
# requirements and compile everything each run. The wheel, not the source
# tree, is what gets tested.
if [[ -f "$build_dir/CMakeCache.txt" ]] &&
  ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$sdist_src" "$build_dir/CMakeCache.txt"; then
  rm -rf "$build_dir" # configured for another source directory (the tree, before the wheel came from the sdist)
fi
wheel_dir="$root/build/python-wheel"
rm -rf "$wheel_dir"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$py" -m pip wheel --no-build-isolation --no-deps -q -w "$wheel_dir" \
  --config-settings=build-dir="$build_dir" "${launcher[@]}" "${cuda_config[@]}" "$sdist_src"
wheels=("$wheel_dir"/seqattn-*.whl)
if [[ ${#wheels[@]} != 1 || ! -f "${wheels[0]}" ]]; then
  echo "test-python: FAILED: expected one seqattn wheel in $wheel_dir, found: ${wheels[*]}" >&2
  exit 1
fi
step "build wheel"
"$py" -m pip install --force-reinstall --no-deps -q "${wheels[0]}"
step "install wheel"

# From an empty directory, so that python/ is not on sys.path and the tests
# import the installed package (test_packaging.py checks that they do); pytest
# puts python/tests itself on sys.path for the shared oracles module.
outside="$(mktemp -d)"
trap 'rm -rf "$outside"' EXIT
# Without arguments, two pytest processes share the suite: the Pallas and tokamax files (interpret-mode kernels,
# single-threaded XLA compiles, about half the time) beside the rest, so a 2-core CI machine runs both halves at
# once. With arguments (a -k filter, files), one process.
tests="$root/python/tests"
if [[ $# -gt 0 ]]; then
  (cd "$outside" && "$py" -m pytest -q -p no:cacheprovider --rootdir="$tests" "$tests" "$@")
else
  heavy=("$tests"/test_pallas_*.py "$tests"/test_tokamax.py)
  ignore=()
  for f in "${heavy[@]}"; do ignore+=("--ignore=$f"); done
  (cd "$outside" && "$py" -m pytest -q -p no:cacheprovider --rootdir="$tests" "${heavy[@]}") >"$outside/heavy.log" 2>&1 &
  heavy_pid=$!
  rest_rc=0
  (cd "$outside" && "$py" -m pytest -q -p no:cacheprovider --rootdir="$tests" "$tests" "${ignore[@]}") || rest_rc=$?
  heavy_rc=0
  wait "$heavy_pid" || heavy_rc=$?
  echo "test-python: the Pallas and tokamax half:"
  cat "$outside/heavy.log"
  if ((rest_rc != 0 || heavy_rc != 0)); then
    echo "test-python: FAILED: pytest exited with $rest_rc (the rest) and $heavy_rc (Pallas and tokamax)" >&2
    exit 1
  fi
fi
step "pytest"

# The atheris fuzz target over the entry points (python/tests/fuzz), for
# SEQATTN_FUZZ_SECONDS (default 20; 0 skips it), on a fresh corpus in the
# build tree seeded from the checked-in one; reproducers land in
# build/python-fuzz/artifacts.
fuzz_seconds="${SEQATTN_FUZZ_SECONDS:-20}"
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
