"""seqattn.pallas.builders under jax.jit on the CPU: build time and the bytes of metadata each layout holds.

Cases (new input values every call, one compilation each; best of --repeat after a compiling call):
  documents   16 documents of random lengths in one row of 8k tokens, inner CausalMask, blocks --block
              (partial tiles left to the kernel's predicate: no stored tile)
  DSA         top-k token selections, q_len = kv_len = --dsa-len, k = --topk, blocks --dsa-block:
                uniform  k keys drawn from the causal past, default bounds (every kv block may be hit), then with
                         max_stored_tiles at the causal bound
                local    k keys drawn from the --local keys before the query, max_tiles the bound that holds
  Kascade     --kascade-heads groups, 8k tokens, --tiles kv blocks selected per q block (blocks --block)
Reported: ms per call, listed entries (q-major), stored tiles, and the layout's bytes: the int32 lists of both
majors, the int8 tiles of both majors, and their sum; overflow / invalid as the builder reported them. Every
layout is checked once against the host reference (dense_from_layout of a subsampled region would not be
cheaper, so the check is validate() on the host).

  python bench/python/bench_pallas_builders.py [--repeat 3] [--block 128] [--dsa-len 4096] [--topk 256]
"""

import argparse
import os

import numpy as np

import jax

import seqattn
from seqattn.pallas import builders as B
from seqattn.pallas import layout as L

from bench_attention import best_of, cpu_name
from bench_tpu_metadata import documents


def metadata_bytes(lay):
    lists = sum(np.asarray(a).nbytes for a in lay.arrays() if np.asarray(a).dtype == np.int32)
    tiles = np.asarray(lay.q_tiles).nbytes + np.asarray(lay.kv_tiles).nbytes
    return lists, tiles


def report(name, fn, inputs, repeat):
    dev = [jax.device_put(x) for x in inputs]
    calls = iter(range(10**9))

    def run():
        jax.block_until_ready(fn(dev[next(calls) % len(dev)]))

    t = best_of(run, repeat)
    build = fn(dev[0])
    lay = jax.tree_util.tree_map(np.asarray, build.layout)
    L.validate(lay)
    lists, tiles = metadata_bytes(lay)
    entries = int(lay.q_count.sum())
    print(f"| {name} | {t * 1e3:.1f} | {entries} | {lay.q_tiles.shape[0]} | {lists / 2**10:.0f} KiB | "
          f"{tiles / 2**20:.2f} MiB | {(lists + tiles) / 2**20:.2f} MiB | {bool(build.overflow)} / "
          f"{bool(build.invalid)} |")


def dsa_indices(rng, n, k, local):
    """[1, n, k]: per query k distinct keys from its causal past (or the `local` keys before it), -1 where the
    past is shorter than k."""
    out = np.full((n, k), -1, np.int32)
    for q in range(n):
        lo = 0 if local is None else max(0, q + 1 - local)
        pool = np.arange(lo, q + 1)
        pick = rng.choice(pool, min(k, pool.size), replace=False)
        out[q, :pick.size] = pick
    return out[None]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--dsa-len", type=int, default=4096)
    ap.add_argument("--dsa-block", type=int, default=128)
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--local", type=int, default=1024)
    ap.add_argument("--kascade-heads", type=int, default=8)
    ap.add_argument("--tiles", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; jax {jax.__version__} on {jax.devices()[0].platform}\n")
    print("| case | ms per call | entries | stored tiles | int32 lists | int8 tiles | total | overflow / invalid |")
    print("|---|---|---|---|---|---|---|---|")

    b, s = args.block, 8192
    docs = [documents(rng, s, 16) for _ in range(args.repeat + 1)]
    report(f"documents: 16 in {s}, causal, {b} x {b}",
           jax.jit(lambda i: B.document_layout(i, mask=seqattn.CausalMask(), block_q=b, block_kv=b)), docs,
           args.repeat)

    n, k, db = args.dsa_len, args.topk, args.dsa_block
    uniform = [dsa_indices(rng, n, k, None) for _ in range(2)]
    report(f"DSA uniform: t = s = {n}, k = {k}, {db} x {db}, default width {-(-n // db)}",
           jax.jit(lambda i: B.topk_token_layout(i, kv_len=n, block_q=db, block_kv=db)), uniform, args.repeat)
    nq = -(-n // db)
    causal = nq * (nq + 1) // 2  # keys from the causal past: q block i meets kv blocks 0..i
    report(f"DSA uniform: as above, max_stored_tiles {causal} (the causal bound)",
           jax.jit(lambda i: B.topk_token_layout(i, kv_len=n, block_q=db, block_kv=db, max_stored_tiles=causal)),
           uniform, args.repeat)
    local = [dsa_indices(rng, n, k, args.local) for _ in range(2)]
    bound = -(-(args.local + db) // db) + 1  # the blocks a q block's keys can span, plus one for misalignment
    report(f"DSA local {args.local}: t = s = {n}, k = {k}, {db} x {db}, max_tiles {bound}",
           jax.jit(lambda i: B.topk_token_layout(i, kv_len=n, block_q=db, block_kv=db, max_tiles=bound)), local,
           args.repeat)

    nq = s // b
    sel = [rng.integers(0, nq, (1, args.kascade_heads, nq, args.tiles)).astype(np.int32)
           for _ in range(args.repeat + 1)]
    report(f"Kascade: {args.kascade_heads} groups, {s} tokens, {args.tiles} tiles per q block, {b} x {b}",
           jax.jit(lambda x: B.topk_tile_layout(x, q_len=s, kv_len=s, block_q=b, block_kv=b)), sel, args.repeat)


if __name__ == "__main__":
    main()
