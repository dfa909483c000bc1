"""Attention forward from Python (seqattn.attention) against this machine's limits, in one run.

Causal prefill, B = 1, 8 heads, d = 128, fp32 and bf16, at 1k and 4k tokens, and GQA decode
(1 query, 32 heads over 4 K/V heads, 32k keys), on `--threads` threads. FLOPs are counted as
bench/attention.cpp counts them: 2 * (dk + dv) per allowed (head, query, key) pair.

The limits, measured here on the same threads:
  sgemm      NumPy's float32 matmul (its BLAS, on the BLAS's own threads) on 2048^3: the dense-GEMM
             rate this machine gives a well-tuned library, the practical ceiling for prefill;
  read       NumPy's sum over a 512 MiB float32 array, one slice per thread: the streaming-read
             rate decode is bound by.
The SIMD target the engine chose (`seqattn.simd_target`) and whether bf16 prefill may use
AVX512_BF16 (`seqattn.bf16_dot_instruction`) are printed with the results; times are the best of 3.

  python bench/python/bench_attention.py [--threads 2] [--sizes 1024,4096]
"""

import argparse
import time

import numpy as np

import seqattn


def best_of(fn, repeat=3):
    fn()  # warm: thread pool, probe, page faults
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def cpu_name():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")


def sgemm_gflops():
    a = np.random.default_rng(0).standard_normal((2048, 2048), np.float32)
    t = best_of(lambda: a @ a)
    return 2 * 2048**3 / t / 1e9


def read_gbps(threads):
    # NumPy's reductions release the GIL: one slice per thread, summed at once.
    from concurrent.futures import ThreadPoolExecutor

    x = np.ones(128 * 2**20, np.float32)
    parts = np.array_split(x, threads)
    with ThreadPoolExecutor(threads) as pool:
        t = best_of(lambda: list(pool.map(np.sum, parts)))
    return x.nbytes / t / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1024,4096")
    args = ap.parse_args()
    try:
        import ml_dtypes

        bf16 = ml_dtypes.bfloat16
    except ImportError:
        bf16 = None
    rng = np.random.default_rng(1)
    gemm, read = sgemm_gflops(), read_gbps(args.threads)
    print(f"seqattn {seqattn.__version__}: SIMD target {seqattn.simd_target}, "
          f"AVX512_BF16 pair dot {'available' if getattr(seqattn, 'bf16_dot_instruction', False) else 'not available'}, "
          f"{args.threads} threads")
    print(f"limits: NumPy sgemm 2048^3 {gemm:.1f} GFLOP/s; NumPy streaming read {read:.1f} GB/s\n")
    print("| case | dtype | ms | GFLOP/s | of sgemm | GB/s | of read |")
    print("|---|---|---|---|---|---|---|")
    heads, d = 8, 128
    for n in (int(s) for s in args.sizes.split(",")):
        for name, dtype in (("f32", np.float32), ("bf16", bf16)):
            if dtype is None:
                continue
            q, k, v = (rng.standard_normal((1, n, heads, d), np.float32).astype(dtype) for _ in range(3))
            t = best_of(lambda: seqattn.attention(q, k, v, seqattn.CausalMask(), threads=args.threads))
            flops = 2 * (d + d) * heads * n * (n + 1) / 2
            print(f"| causal {n} | {name} | {t * 1e3:.1f} | {flops / t / 1e9:.1f} | {flops / t / 1e9 / gemm:.2f} "
                  f"| - | - |")
    kv_len, hq, hkv = 32768, 32, 4
    for name, dtype in (("f32", np.float32), ("bf16", bf16)):
        if dtype is None:
            continue
        q = rng.standard_normal((1, 1, hq, d), np.float32).astype(dtype)
        k, v = (rng.standard_normal((1, kv_len, hkv, d), np.float32).astype(dtype) for _ in range(2))
        t = best_of(lambda: seqattn.attention(q, k, v, threads=args.threads))
        flops = 2 * (d + d) * hq * kv_len
        gbs = (k.nbytes + v.nbytes) / t / 1e9
        print(f"| decode 1 x {kv_len}, GQA {hq}/{hkv} | {name} | {t * 1e3:.2f} | {flops / t / 1e9:.1f} | "
              f"{flops / t / 1e9 / gemm:.2f} | {gbs:.1f} | {gbs / read:.2f} |")


if __name__ == "__main__":
    main()
