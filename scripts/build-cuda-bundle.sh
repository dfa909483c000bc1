#!/usr/bin/env bash
# Builds the CUDA backend's GPU programs with nvcc directly (no CMake), for
# copying to a GPU machine that has neither Highway nor Catch2 libraries:
#   build/cuda-bundle/seqattn_test_cuda_attention   tests/cuda/cuda_attention_test.cu
#   build/cuda-bundle/seqattn_bench_cuda            bench/cuda/bench_cuda.cu
#   build/cuda-bundle/seqattn_example_cuda_attention examples/cuda/cuda_attention.cu
# (each when its source exists). The CUDA runtime, libstdc++ and libgcc are
# linked statically; Highway is used header-only (its static target, no
# libhwy.so); Catch2 v2 is header-only (v3: libCatch2.a, static). The
# benchmark links cuBLAS dynamically (libcublas.so.13: no static cuBLAS ships
# with the toolkit here, and it would be hundreds of MB), with an rpath to
# /usr/local/cuda/lib64. The script fails if a binary needs libhwy or a shared
# libcudart.
#
# Run on the GPU machine:
#   build/cuda-bundle/seqattn_test_cuda_attention   (exit 77: no CUDA device)
#   build/cuda-bundle/seqattn_bench_cuda
#
# Env:
#   SEQATTN_CUDA_GENCODE  default "-gencode arch=compute_90a,code=sm_90a" (H100/H200 only;
#                         with compute_90a the programs define SEQATTN_CUDA_WGMMA
#                         and prefill takes the Hopper kernel)
#   SEQATTN_SIMD_FLAGS    host SIMD flags, default as in CMake: -march=x86-64-v3 -DHWY_DISABLE_PCLMUL_AES
#   SEQATTN_JOBS          programs compiled at once (default 2)
#   NVCC                  default: nvcc on PATH, else /usr/local/cuda/bin/nvcc
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=build/cuda-bundle

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ ! -x "$nvcc" ]]; then
  echo "build-cuda-bundle: no nvcc (set NVCC, or put the CUDA toolkit's bin/ on PATH)" >&2
  exit 1
fi
read -r -a gencode <<<"${SEQATTN_CUDA_GENCODE:-"-gencode arch=compute_90a,code=sm_90a"}"
read -r -a simd <<<"${SEQATTN_SIMD_FLAGS:-"-march=x86-64-v3 -DHWY_DISABLE_PCLMUL_AES"}"
max_jobs=${SEQATTN_JOBS:-2}
cxx=${CXX:-g++}

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(ccache)
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
fi

# The flags of the CMake build (cmake/SeqattnCuda.cmake), less the warnings
# as errors: this build ships binaries, the CMake build checks the code.
# Device code compressed in the fat binaries (-compress-all: about 5x
# smaller), so that the programs fit a device call's upload.
flags=(-std=c++20 -O3 -DNDEBUG "${gencode[@]}" -ccbin "$cxx" --cudart=static -Xfatbin=-compress-all
  -Xcompiler=-Wall -Xcompiler=-Wextra --diag-suppress=1675 -I"$root/include")
for f in "${simd[@]}"; do
  if [[ $f == -D* || $f == -U* ]]; then flags+=("$f"); else flags+=("-Xcompiler=$f"); fi
done
[[ " ${gencode[*]} " == *90a* ]] && flags+=(-DSEQATTN_CUDA_WGMMA)
link=(-Xcompiler=-static-libstdc++ -Xcompiler=-static-libgcc)

# Catch2: v2 (Debian 12) is header-only and the test compiles its runner; v3
# (Ubuntu 24.04) needs libCatch2.a and catch_session.hpp for the test's own main.
catch=(-I"$root/tests") catch_libs=()
if echo '#include <catch2/catch_session.hpp>' | "$cxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
  catch+=(--pre-include catch2/catch_session.hpp)
  catch_libs+=(-lCatch2)
fi

mkdir -p "$out"
names=()
build() { # name source [compile flags...] [-- libraries...]
  local name=$1 src=$2
  shift 2
  local extra=() libs=()
  while (($#)) && [[ $1 != -- ]]; do extra+=("$1") && shift; done
  (($#)) && shift && libs=("$@")
  if [[ ! -f "$src" ]]; then
    echo "build-cuda-bundle: $src not there, $name skipped"
    return 0
  fi
  local log="$out/$name.log"
  echo "build-cuda-bundle: $name <- $src"
  rm -f "$out/$name" "$log.rc"
  (
    rc=0
    "${launcher[@]}" "$nvcc" "${flags[@]}" "${extra[@]}" "$src" -o "$out/$name" "${link[@]}" "${libs[@]}" \
      >"$log" 2>&1 || rc=$?
    echo "$rc" >"$log.rc"
  ) &
  names+=("$name")
  while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
}

start=$SECONDS
# The kernels once, one object per configuration (as cmake/SeqattnCuda.cmake
# does), compiled in parallel; the programs declare them extern.
instances=()
mkdir -p "$out/instances"
for type in bfloat16 float16; do
  for dim in 64 128 256; do
    for hook in plain softcap_alibi; do # the built-in score hooks (backends/cuda/score_hooks.cuh)
      hook_type=seqattn::cuda::detail::PlainScores
      [[ $hook == softcap_alibi ]] && hook_type=seqattn::cuda::detail::SoftcapAlibiScores
      for pass in forward backward; do
        [[ $pass == backward && $dim == 256 ]] && continue
        params=ForwardParams plan=LaunchPlan
        [[ $pass == backward ]] && params=BackwardParams plan=BackwardLaunchPlan
        src="$out/instances/${pass}_${type}_d${dim}_${hook}.cu"
        text="#define SEQATTN_CUDA_INSTANCE_TU
#include \"seqattn/backends/cuda.cuh\"
template void seqattn::cuda::detail::launch_${pass}<seqattn::${type}, ${dim}, ${hook_type}>(
    const seqattn::cuda::detail::${params}<seqattn::${type}>&, const seqattn::cuda::${plan}&, const ${hook_type}&,
    cudaStream_t);"
        [[ -f "$src" && "$(cat "$src")" == "$text" ]] || echo "$text" >"$src"
        (
          "${launcher[@]}" "$nvcc" "${flags[@]}" -c "$src" -o "${src%.cu}.o" >"${src%.cu}.log" 2>&1 ||
            { echo "build-cuda-bundle: FAILED: $src" >&2 && cat "${src%.cu}.log" >&2 && exit 1; }
        ) &
        instances+=("${src%.cu}.o")
        while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || exit 1; done
      done
    done
  done
done
while (($(jobs -rp | wc -l) > 0)); do wait -n || exit 1; done
echo "build-cuda-bundle: ${#instances[@]} kernel instances compiled ($((SECONDS - start)) s)"
flags+=(-DSEQATTN_CUDA_SEPARATE_INSTANCES)

# The test's host-side objects, as CMake's seqattn_catch and
# seqattn_test_engine: Catch2's implementation and the CPU engine
# configurations the reference comparisons use (tests/support/engine_instances.hpp).
test_objects=()
for src in tests/support/catch_implementation.cpp tests/support/engine/*.cpp; do
  obj="$out/instances/host_$(basename "${src%.cpp}").o"
  (
    "${launcher[@]}" "$cxx" -std=c++20 -O2 -DNDEBUG "${simd[@]}" -I"$root/include" -I"$root/tests" -c "$src" -o "$obj" \
      >"${obj%.o}.log" 2>&1 || { echo "build-cuda-bundle: FAILED: $src" >&2 && cat "${obj%.o}.log" >&2 && exit 1; }
  ) &
  test_objects+=("$obj")
  while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || exit 1; done
done
while (($(jobs -rp | wc -l) > 0)); do wait -n || exit 1; done

build seqattn_test_cuda_attention tests/cuda/cuda_attention_test.cu "${catch[@]}" -- "${instances[@]}" \
  "${test_objects[@]}" "${catch_libs[@]}"
build seqattn_bench_cuda bench/cuda/bench_cuda.cu -- "${instances[@]}" -lcublas -Xlinker=-rpath=/usr/local/cuda/lib64
build seqattn_example_cuda_attention examples/cuda/cuda_attention.cu -- "${instances[@]}"
wait

status=0
for name in "${names[@]}"; do
  if [[ "$(cat "$out/$name.log.rc" 2>/dev/null)" != 0 ]]; then
    echo "build-cuda-bundle: FAILED: $name (log: $out/$name.log)" >&2
    cat "$out/$name.log" >&2
    status=1
  fi
  rm -f "$out/$name.log.rc"
done
((status == 0)) || exit 1

# Self-contained: the binaries themselves need no libhwy, no shared CUDA
# runtime, libstdc++ or Catch2 (cuBLAS, for the benchmark, needs its own).
for name in "${names[@]}"; do
  needed=$(objdump -p "$out/$name" | awk '/NEEDED/ {printf "%s ", $2}')
  if grep -qE 'libhwy|libcudart|libstdc\+\+|libCatch2' <<<"$needed"; then
    echo "build-cuda-bundle: $name needs a library the GPU machine may lack: $needed" >&2
    exit 1
  fi
done
{
  echo "seqattn CUDA bundle: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) by $("$nvcc" --version | tail -n 2 | head -n 1), host $("$cxx" --version | head -n 1)"
  echo "gencode: ${gencode[*]}"
  for name in "${names[@]}"; do
    echo
    echo "$name: $(stat -c %s "$out/$name") bytes; needs: $(objdump -p "$out/$name" | awk '/NEEDED/ {printf "%s ", $2}')"
  done
} >"$out/MANIFEST.txt"
echo "build-cuda-bundle: ${names[*]} in $out/ ($((SECONDS - start)) s); see $out/MANIFEST.txt"
