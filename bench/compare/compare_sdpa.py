#!/usr/bin/env python3
"""seqattn's CPU engine next to PyTorch's CPU SDPA on the same shapes.

Runs the seqattn benchmark binary (bench/attention.cpp) on five shapes, and
the backward pass of causal attention, and, when `torch` is importable,
torch.nn.functional.scaled_dot_product_attention on the same shapes and thread
count, then prints one table with both times and their ratio. Without torch it
prints seqattn's column alone.

  python3 bench/compare/compare_sdpa.py --bench build/h-perf-native/bench/seqattn_attention
  python3 bench/compare/compare_sdpa.py --shapes 4k --repetitions 1   # a quick run

Shapes (fp32 unless marked bf16, d = 128, batch 1):
  causal 4k / 16k   8 heads, causal                      BM_PrefillCausal<float>/{4096,16384}/2
  causal bf16       the same in bf16                      BM_PrefillCausal<bfloat16>/{4096,16384}/2
  documents 8k      16 causal documents in 8192 tokens    BM_Documents8k/2
  window 16k        sliding window of 1024 keys, causal   BM_SlidingWindow16k/2
  decode 32k        1 query, 32 heads over 4 KV heads     BM_DecodeGqa8<float>/2 (and <bfloat16>)

Backward, causal, 8 heads (fp32 and bf16, 4k and 16k):
  BM_BackwardCausal<float>/{4096,16384}/2 and <bfloat16>; each gives two rows,
  "fwd+bwd" (a forward and then its backward) and "bwd" (the backward alone).
  seqattn: bwd is the benchmark's time, fwd+bwd adds its fwd_ms counter (the
  forward run right before each backward). torch: q, k and v require grad;
  out = SDPA(q, k, v, is_causal=True) and then out.backward(grad) are timed
  one after the other, fwd+bwd from the forward's start, bwd from the
  backward's. Torch allocates its gradients inside the timing (seqattn writes
  into buffers allocated once), as a training step does. A 16k backward
  does 16 times the work of a 4k one (on two Zen 5 cores, torch's 4k fp32
  forward + backward took 1.3 s): --shapes 4k leaves the 16k rows out.

PyTorch has no document or window kernel on CPU: those rows pass a dense
boolean mask (materialized, as users of SDPA must), which is part of the
comparison. Times are medians over --repetitions runs after one warm-up.
--shapes REGEX keeps the shapes whose name (the table's first column, less
" fwd+bwd" or " bwd") it matches: --shapes 4k runs causal 4k fp32 and bf16,
forward and backward.

The header gives the limits the binary measured in the same run: the fp32 FMA
peak, the bf16 dot-product peak where the binary is built for AVX512_BF16
(bench/support/machine_limits.hpp), and the streaming-read bandwidth.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time

SHAPES = [
    # name, seqattn benchmark name, torch case (kind, tokens, dtype)
    ("causal 4k", "BM_PrefillCausal<float>/4096/2", ("causal", 4096, "float32")),
    ("causal 16k", "BM_PrefillCausal<float>/16384/2", ("causal", 16384, "float32")),
    ("causal 4k bf16", "BM_PrefillCausal<bfloat16>/4096/2", ("causal", 4096, "bfloat16")),
    ("causal 16k bf16", "BM_PrefillCausal<bfloat16>/16384/2", ("causal", 16384, "bfloat16")),
    ("16 documents in 8k", "BM_Documents8k/2", ("documents", 8192, "float32")),
    ("window 1k over 16k", "BM_SlidingWindow16k/2", ("window", 16384, "float32")),
    ("decode 32k GQA 32/4", "BM_DecodeGqa8<float>/2", ("decode", 32768, "float32")),
    ("decode 32k bf16", "BM_DecodeGqa8<bfloat16>/2", ("decode", 32768, "bfloat16")),
]

BACKWARD_SHAPES = [
    # name, seqattn benchmark name, torch case (tokens, dtype); causal, 8 heads, d = 128
    ("causal 4k", "BM_BackwardCausal<float>/4096/2", (4096, "float32")),
    ("causal 16k", "BM_BackwardCausal<float>/16384/2", (16384, "float32")),
    ("causal 4k bf16", "BM_BackwardCausal<bfloat16>/4096/2", (4096, "bfloat16")),
    ("causal 16k bf16", "BM_BackwardCausal<bfloat16>/16384/2", (16384, "bfloat16")),
]

# The document lengths of BM_Documents8k (the 16th takes the rest of 8192).
DOC_LENGTHS = [300, 700, 512, 256, 1024, 128, 640, 384, 512, 896, 200, 440, 512, 600, 400]


# What Google Benchmark appends to a name: a fixed iteration count, then how it is timed.
_SUFFIX = re.compile(r"(/iterations:[0-9]+)?(/manual_time|/real_time)?$")


def run_seqattn(binary, names, repetitions):
    """Median real time (ms) and median counters of each benchmark, from Google Benchmark's JSON."""
    pattern = "^(" + "|".join(_escape(n) for n in names) + ")" + _SUFFIX.pattern
    cmd = [binary, "--benchmark_filter=" + pattern, "--benchmark_format=json",
           "--benchmark_repetitions=%d" % repetitions, "--benchmark_report_aggregates_only=true"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout.strip():
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit("compare_sdpa: %s exited %d with no results: %s" % (binary, run.returncode, last))
    data = json.loads(run.stdout)
    medians, single = {}, {}
    for b in data["benchmarks"]:
        # With one repetition Google Benchmark computes no aggregates and reports the run itself.
        if b.get("aggregate_name") == "median":
            into = medians
        elif b.get("run_type") == "iteration":
            into = single
        else:
            continue
        name = _SUFFIX.sub("", b["run_name"])
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        into[name] = dict(b, ms=b["real_time"] * scale)
    return dict(single, **medians), data.get("context", {})


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _num(x):
    try:
        return "%.1f" % float(x)
    except (TypeError, ValueError):
        return "?"


def _escape(name):
    # POSIX extended syntax (Google Benchmark's std::regex): '<' and '>' are
    # plain characters and may not be escaped.
    return "".join("\\" + c if c in "()[]{}.*+?^$|\\" else c for c in name)


def torch_case(torch, kind, n, dtype):
    """A callable running SDPA for one shape."""
    F = torch.nn.functional
    torch.manual_seed(0)
    d = 128
    dt = getattr(torch, dtype)

    def randn(*shape):
        return torch.randn(*shape).to(dt)

    if kind == "decode":
        q = randn(1, 32, 1, d)
        k = randn(1, 4, n, d)
        v = randn(1, 4, n, d)
        try:
            F.scaled_dot_product_attention(q, k[:, :, :8], v[:, :, :8], enable_gqa=True)
            return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        except TypeError:  # torch < 2.5: repeat K/V per query head, as users did
            return lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(8, 1), v.repeat_interleave(8, 1))
    q = randn(1, 8, n, d)
    k = randn(1, 8, n, d)
    v = randn(1, 8, n, d)
    if kind == "causal":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    idx = torch.arange(n)
    causal = idx[None, :] <= idx[:, None]
    if kind == "documents":
        ids = torch.full((n,), 16)
        at = 0
        for doc, length in enumerate(DOC_LENGTHS):
            ids[at:at + length] = doc + 1
            at += length
        mask = causal & (ids[:, None] == ids[None, :])
    else:  # window: keys q - 1023 .. q
        mask = causal & (idx[:, None] - idx[None, :] <= 1023)
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def torch_backward_ms(torch, n, dtype, repetitions):
    """(fwd+bwd ms, bwd ms), medians, of causal SDPA's forward and then its backward."""
    F = torch.nn.functional
    torch.manual_seed(0)
    d = 128
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 8, n, d).to(dt).requires_grad_() for _ in range(3))
    grad = torch.randn(1, 8, n, d).to(dt)

    def once():
        q.grad = k.grad = v.grad = None  # a fresh step, not accumulation into the last one's gradients
        start = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mid = time.perf_counter()
        out.backward(grad)
        end = time.perf_counter()
        return (end - start) * 1e3, (end - mid) * 1e3

    once()  # warm-up
    runs = [once() for _ in range(repetitions)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def time_ms(fn, repetitions):
    fn()  # warm-up
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build/h-perf-native/bench/seqattn_attention",
                        help="the seqattn attention benchmark binary")
    parser.add_argument("--threads", type=int, default=2, help="threads for PyTorch (seqattn's shapes use 2)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--shapes", metavar="REGEX",
                        help="only the shapes whose name this matches (re.search), e.g. 4k or 'causal 4k'")
    args = parser.parse_args()

    keep = (lambda label: re.search(args.shapes, label)) if args.shapes else (lambda label: True)
    shapes = [s for s in SHAPES if keep(s[0])]
    backward_shapes = [s for s in BACKWARD_SHAPES if keep(s[0])]
    if not shapes and not backward_shapes:
        sys.exit("compare_sdpa: --shapes %r matches no shape" % args.shapes)
    seq_results, context = run_seqattn(args.bench, [n for _, n, _ in shapes + backward_shapes], args.repetitions)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)

    print("CPU: %s" % cpu_model())
    print("seqattn: %s, Highway target %s" % (args.bench, context.get("highway_target", "?")))
    # The binary measures its limits on every CPU it may use: pin it (taskset) to the threads compared.
    # The bf16 dot-product peak is absent where the binary is not built for AVX512_BF16.
    bf16_peak = context.get("bf16_dot_peak_gflops_all")
    print("limits measured in the same run: fp32 FMA peak %s GFLOP/s, %sstreaming read %s GB/s (all usable CPUs)"
          % (_num(context.get("fma_peak_gflops_all")),
             "bf16 dot peak %s GFLOP/s, " % _num(bf16_peak) if bf16_peak else "",
             _num(context.get("read_gbps_all"))))
    if torch is not None:
        print("PyTorch %s, %d threads, CPU SDPA" % (torch.__version__, torch.get_num_threads()))
    else:
        print("PyTorch: not importable, seqattn column only")
    print()
    header = "%-24s %12s %12s %10s" % ("shape", "seqattn ms", "torch ms", "torch/ours")
    print(header)
    print("-" * len(header))

    def row(label, ours, theirs):
        ratio = theirs / ours if ours and theirs else None
        fmt = lambda x: "%12.2f" % x if x is not None else "%12s" % "-"
        print("%-24s %s %s %10s" % (label, fmt(ours), fmt(theirs), "%.2fx" % ratio if ratio else "-"))

    for label, name, (kind, n, dtype) in shapes:
        ours = seq_results.get(name, {}).get("ms")
        theirs = None
        if torch is not None:
            try:
                theirs = time_ms(torch_case(torch, kind, n, dtype), args.repetitions)
            except RuntimeError as e:  # e.g. out of memory for a dense mask
                print("  (torch failed on %s: %s)" % (label, e), file=sys.stderr)
        row(label, ours, theirs)
    for label, name, (n, dtype) in backward_shapes:
        result = seq_results.get(name)
        # The benchmark's time is the backward's; fwd_ms is the forward before it.
        ours_bwd = result["ms"] if result else None
        ours_both = ours_bwd + result["fwd_ms"] if result and "fwd_ms" in result else None
        theirs_both = theirs_bwd = None
        if torch is not None:
            try:
                theirs_both, theirs_bwd = torch_backward_ms(torch, n, dtype, args.repetitions)
            except RuntimeError as e:
                print("  (torch failed on %s backward: %s)" % (label, e), file=sys.stderr)
        row(label + " fwd+bwd", ours_both, theirs_both)
        row(label + " bwd", ours_bwd, theirs_bwd)


if __name__ == "__main__":
    main()
