"""seqattn.tpu.block_classes under jax.jit on the CPU, against this machine's memory-read rate, in one run.

One row of S tokens packed with 64 documents of random lengths (new lengths every call: the ids are
traced, one compilation serves them all), at S = 8k, 32k and 128k, blocks of --block (default 512 x 512,
Splash's default; 128 x 128 too with --block 128), for
  causal          DocumentMask inner CausalMask(), self-attention (kv ids = q ids)
  docs + window   inner SlidingWindowMask(1024, 0): causal with a 1024-token window, self-attention
  causal, kv ids  inner CausalMask() with kv_segment_ids given (the same ids, passed again): the path that
                  pairs q and kv runs by id through a sort
Reported: ms per call (best of --repeat, after a warm-up call that compiles), ms per 32k tokens, and for
scale the C++ host builder on the same ids (seqattn.DocumentMask(...).block_mask(...).classes(), which
also builds the full BlockMask: tile lists and partial-tile bits).

The limit, measured here: NumPy's sum over a 512 MiB float32 array, on 1 thread and on --threads
threads (one slice each): the streaming-read rate. The builder reads and writes a few int32 arrays of
S elements and a few of #tiles, so it is bound by memory traffic and XLA's per-op overheads, not FLOPs.

  python bench/python/bench_tpu_metadata.py [--threads 2] [--sizes 8192,32768,131072] [--block 512]
"""

import argparse
import os

import numpy as np

import jax
import jax.numpy as jnp

import seqattn
from seqattn import tpu

from bench_attention import best_of, cpu_name, read_gbps


def documents(rng, s, docs):
    """[1, s] ids of `docs` documents with random lengths (>= 1 token) covering the row."""
    cuts = np.sort(rng.choice(np.arange(1, s), docs - 1, replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [s]]))
    return np.repeat(np.arange(1, docs + 1, dtype=np.int32), lengths)[None, :]


def metadata_arguments(doc):
    """The options the metadata benchmarks share."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="8192,32768,131072")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    return ap


def print_machine(args, extra=""):
    """The machine, the versions and the run's memory-read limit, measured now."""
    read1, read_n = read_gbps(1), read_gbps(args.threads)
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; jax {jax.__version__} on {jax.devices()[0].platform}{extra}; "
          f"blocks {args.block} x {args.block}, {args.docs} documents per row")
    print(f"limit: NumPy streaming read {read1:.1f} GB/s on 1 thread, {read_n:.1f} GB/s on {args.threads}\n")


def main():
    args = metadata_arguments(__doc__).parse_args()
    rng = np.random.default_rng(1)
    print_machine(args)
    print("| S | mask | tiles | ms per call | ms per 32k tokens | C++ host BlockMask ms |")
    print("|---|---|---|---|---|---|")
    cases = [
        ("causal", seqattn.CausalMask(), False),
        ("docs + window 1024", seqattn.SlidingWindowMask(1024, 0), False),
        ("causal, kv ids", seqattn.CausalMask(), True),
    ]
    b = args.block
    for s in (int(x) for x in args.sizes.split(",")):
        ids_list = [documents(rng, s, args.docs) for _ in range(args.repeat + 1)]
        tiles = (-(-s // b)) ** 2
        for name, inner, cross in cases:
            if cross:
                fn = jax.jit(lambda i, k, inner=inner: tpu.block_classes(i, kv_segment_ids=k, inner=inner,
                                                                         block_size=(b, b)))
            else:
                fn = jax.jit(lambda i, k, inner=inner: tpu.block_classes(i, inner=inner, block_size=(b, b)))
            dev = [jnp.asarray(i) for i in ids_list]
            calls = iter(range(10**9))

            def run():
                i = dev[next(calls) % len(dev)]  # new ids each call, one compilation
                fn(i, i).block_until_ready()

            t = best_of(run, args.repeat)
            host = best_of(lambda: seqattn.DocumentMask(ids_list[0], None, inner).block_mask(
                block_size=(b, b)).classes(), args.repeat)
            # Check once that the device result is the host one.
            want = seqattn.DocumentMask(ids_list[0], None, inner).block_mask(block_size=(b, b)).classes()
            assert np.array_equal(np.asarray(fn(dev[0], dev[0])), want)
            print(f"| {s} | {name} | {tiles} | {t * 1e3:.2f} | {t * 1e3 * 32768 / s:.2f} | {host * 1e3:.2f} |")


if __name__ == "__main__":
    main()
