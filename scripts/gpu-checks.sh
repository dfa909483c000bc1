#!/usr/bin/env bash
# The GPU checks of the CUDA backend in one run, for a machine with an NVIDIA
# GPU that received build/cuda-bundle/ (scripts/build-cuda-bundle.sh): the GPU
# tests, then seqattn's benchmark beside the GPU's own limits, then PyTorch's
# kernels on the same shapes (bench/compare/cuda_vs_torch.py). Each step has
# its own time limit, so a hang in one leaves the others' results.
#   scripts/gpu-checks.sh OUTDIR [TEST_FILTER]
# Writes OUTDIR/tests.log, bench.json, bench.log, bench_mma_sync.json,
# bench-mma-sync.log, torch.json, torch.log (and
# sanitize-*.log with SEQATTN_SANITIZE_FILTER set).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-checks.sh OUTDIR [TEST_FILTER]}
filter=${2:-}
mkdir -p "$out"
bundle=build/cuda-bundle
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
status=0
step() { # name seconds command...
  local name=$1 seconds=$2 start=$SECONDS rc=0
  shift 2
  echo "=== $name"
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1 || rc=$?
  tail -n 40 "$out/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  ((rc == 0)) || status=1
}
step tests "${SEQATTN_TEST_SECONDS:-240}" "$bundle/seqattn_test_cuda_attention" ${filter:+"$filter"} --durations yes
# compute-sanitizer's race and memory checks on the tests that SEQATTN_SANITIZE_FILTER
# names (each test runs 10-100x slower under it).
if [[ -n "${SEQATTN_SANITIZE_FILTER:-}" ]] && command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    step "sanitize-$tool" "${SEQATTN_SANITIZE_SECONDS:-90}" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$bundle/seqattn_test_cuda_attention" "$SEQATTN_SANITIZE_FILTER"
  done
fi
step bench "${SEQATTN_BENCH_SECONDS:-150}" "$bundle/seqattn_bench_cuda" --json "$out/bench.json"
# The same forward shapes on the mma.sync kernels, where the Hopper (wgmma)
# kernel ran above: both kernels' figures from one machine.
step bench-mma-sync "${SEQATTN_BENCH_SECONDS:-150}" "$bundle/seqattn_bench_cuda" --no-backward --no-limits --mma-sync \
  --json "$out/bench_mma_sync.json"
export PYTHONUNBUFFERED=1
step torch "${SEQATTN_TORCH_SECONDS:-200}" python3 bench/compare/cuda_vs_torch.py --json "$out/torch.json"
exit $status
