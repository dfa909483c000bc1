#!/usr/bin/env python3
"""seqattn's CPU engine next to PyTorch's CPU SDPA on the same shapes.

Runs the seqattn benchmark binary (bench/attention.cpp) on five shapes and,
when `torch` is importable, torch.nn.functional.scaled_dot_product_attention
on the same shapes and thread count, then prints one table with both times
and their ratio. Without torch it prints seqattn's column alone.

  python3 bench/compare/compare_sdpa.py --bench build/h-perf-native/bench/seqattn_attention

Shapes (fp32 unless marked bf16, d = 128, batch 1):
  causal 4k / 16k   8 heads, causal                      BM_PrefillCausal<float>/{4096,16384}/2
  causal bf16       the same in bf16                      BM_PrefillCausal<bfloat16>/{4096,16384}/2
  documents 8k      16 causal documents in 8192 tokens    BM_Documents8k/2
  window 16k        sliding window of 1024 keys, causal   BM_SlidingWindow16k/2
  decode 32k        1 query, 32 heads over 4 KV heads     BM_DecodeGqa8<float>/2 (and <bfloat16>)

PyTorch has no document or window kernel on CPU: those rows pass a dense
boolean mask (materialized, as users of SDPA must), which is part of the
comparison. Times are medians over --repetitions runs after one warm-up.
"""
import argparse
import json
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

# The document lengths of BM_Documents8k (the 16th takes the rest of 8192).
DOC_LENGTHS = [300, 700, 512, 256, 1024, 128, 640, 384, 512, 896, 200, 440, 512, 600, 400]


def run_seqattn(binary, repetitions):
    """Median real time (ms) of each benchmark, from Google Benchmark's JSON."""
    # Benchmarks timed manually carry a /manual_time suffix in their names.
    pattern = "^(" + "|".join(_escape(n) for _, n, _ in SHAPES) + ")(/manual_time|/real_time)?$"
    cmd = [binary, "--benchmark_filter=" + pattern, "--benchmark_format=json",
           "--benchmark_repetitions=%d" % repetitions, "--benchmark_report_aggregates_only=true"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout.strip():
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit("compare_sdpa: %s exited %d with no results: %s" % (binary, run.returncode, last))
    data = json.loads(run.stdout)
    times = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        if name.endswith("/manual_time"):
            name = name[: -len("/manual_time")]
        if name.endswith("/real_time"):
            name = name[: -len("/real_time")]
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        times[name] = b["real_time"] * scale
    return times, data.get("context", {})


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
    args = parser.parse_args()

    seq_times, context = run_seqattn(args.bench, args.repetitions)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)

    print("CPU: %s" % cpu_model())
    print("seqattn: %s, Highway target %s" % (args.bench, context.get("highway_target", "?")))
    # The binary measures its limits on every CPU it may use: pin it (taskset) to the threads compared.
    print("limits measured in the same run: fp32 FMA peak %s GFLOP/s, streaming read %s GB/s (all usable CPUs)"
          % (_num(context.get("fma_peak_gflops_all")), _num(context.get("read_gbps_all"))))
    if torch is not None:
        print("PyTorch %s, %d threads, CPU SDPA" % (torch.__version__, torch.get_num_threads()))
    else:
        print("PyTorch: not importable, seqattn column only")
    print()
    header = "%-22s %12s %12s %10s" % ("shape", "seqattn ms", "torch ms", "torch/ours")
    print(header)
    print("-" * len(header))
    for label, name, (kind, n, dtype) in SHAPES:
        ours = seq_times.get(name)
        theirs = None
        if torch is not None:
            try:
                theirs = time_ms(torch_case(torch, kind, n, dtype), args.repetitions)
            except RuntimeError as e:  # e.g. out of memory for a dense mask
                print("  (torch failed on %s: %s)" % (label, e), file=sys.stderr)
        ratio = theirs / ours if ours and theirs else None
        fmt = lambda x: "%12.2f" % x if x is not None else "%12s" % "-"
        print("%-22s %s %s %10s" % (label, fmt(ours), fmt(theirs), "%.2fx" % ratio if ratio else "-"))


if __name__ == "__main__":
    main()
