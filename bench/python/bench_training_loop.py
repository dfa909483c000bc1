"""A training-like loop on seqattn.jax: what planning costs per step, beside the step and this machine's limit.

8 layers x 20 steps of attention, forward and backward (jax.value_and_grad of one jitted step), B = 1,
8192 tokens, 4 heads, d = 64, fp32, `--threads` threads, in two settings:
  documents  16 packed documents of random lengths, new each step (new traced segment ids), causal
             inside each document: the causal plan (made once) refined by each call's ids (the
             segment-id operand: parsed and applied per call, bench/masks.cpp BM_SegmentIdsPerCall
             times that); before the operand, the document mask over each step's ids was planned
             once per step and pass and shared by the layers;
  static     a static mask (causal, 256-token window) and no segment ids: planned once per (mask,
             shape, pass) for the whole loop.
The XLA handlers keep the plans (python/src/jax_ffi.cpp, call_plan); before they did, every call
planned: "before caching" is that cost, layers x the two plans measured alone.
Printed per setting: the planning of one layer's calls measured alone (seqattn.plan of the forward and
the backward plan: what every handler call cost before plans were cached, and what a call with segment
ids costs now), the step time, planning's share of the step, and the attention rate in GFLOP/s beside
NumPy's sgemm rate measured in the same run (the practical ceiling). FLOPs: 2 * (dk + dv) per allowed
(head, query, key) pair forward, 2.5x that backward (5 matmuls to the forward's 2).

  python bench/python/bench_training_loop.py [--threads 2] [--steps 20] [--layers 8]
"""

import argparse
import time

import numpy as np

import jax
import jax.numpy as jnp

import seqattn
import seqattn.jax as sj

from bench_attention import sgemm_gflops

TOKENS, HEADS, DIM, DOCS, WINDOW = 8192, 4, 64, 16, 256


def document_ids(rng):
    """Segment ids [1, TOKENS] of DOCS documents with random lengths (each at least 64 tokens)."""
    cuts = np.sort(rng.choice(np.arange(1, TOKENS // 64), DOCS - 1, replace=False)) * 64
    lengths = np.diff(np.concatenate(([0], cuts, [TOKENS])))
    return np.repeat(np.arange(1, DOCS + 1, dtype=np.int32), lengths)[None, :]


def pairs_of(ids):
    _, counts = np.unique(ids, return_counts=True)
    return int(np.sum(counts * (counts + 1) // 2))


def window_pairs():
    return sum(min(i + 1, WINDOW + 1) for i in range(TOKENS))


def best_of(fn, repeat=5):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    shape = (1, TOKENS, HEADS, DIM)
    causal = seqattn.CausalMask()
    static = seqattn.CausalMask() & seqattn.SlidingWindowMask(WINDOW, 0)

    def layer_plans(mask, ids):
        kw = {} if ids is None else {"segment_ids": ids}
        seqattn.plan(shape, shape, shape, mask, backward=False, threads=args.threads, **kw)
        seqattn.plan(shape, shape, shape, mask, backward=True, threads=args.threads, **kw)

    qkv = [jnp.asarray(rng.standard_normal((args.layers,) + shape, np.float32)) for _ in range(3)]

    def make_step(mask, with_ids):
        def loss(qs, ks, vs, ids):
            total = 0.0
            for layer in range(args.layers):
                kw = {"segment_ids": ids} if with_ids else {}
                out = sj.attention(qs[layer], ks[layer], vs[layer], mask, threads=args.threads, **kw)
                total = total + jnp.sum(out * out)
            return total

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    print(f"seqattn {seqattn.simd_target}, {args.threads} threads, {args.layers} layers x {args.steps} steps, "
          f"B=1 T={TOKENS} H={HEADS} d={DIM} fp32")
    print(f"sgemm (NumPy, 2048^3): {sgemm_gflops():.1f} GFLOP/s")
    for name, mask, with_ids in (("documents", causal, True), ("static", static, False)):
        step = make_step(mask, with_ids)
        id_sets = [document_ids(rng) for _ in range(args.steps)]
        plan_s = best_of(lambda: layer_plans(mask, id_sets[0] if with_ids else None))
        jax.block_until_ready(step(*qkv, id_sets[0]))  # compile
        stats0 = seqattn._core._ffi_plan_cache_stats()
        t = time.perf_counter()
        for ids in id_sets:
            jax.block_until_ready(step(*qkv, ids))
        total = time.perf_counter() - t
        plans, hits = (a - b for a, b in zip(seqattn._core._ffi_plan_cache_stats(), stats0))
        per_step = total / args.steps
        planned_per_step = plans * plan_s / 2 / args.steps  # plan_s: two plans (forward, backward)
        pairs = np.mean([pairs_of(ids) for ids in id_sets]) if with_ids else window_pairs()
        flops = pairs * HEADS * 2 * (DIM + DIM) * 3.5 * args.layers
        print(f"{name:9s}  plan (fwd+bwd, one layer) {plan_s * 1e3:7.2f} ms   step {per_step * 1e3:8.1f} ms   "
              f"planning {planned_per_step * 1e3:7.2f} ms/step ({100 * planned_per_step / per_step:4.1f}%)   "
              f"before caching {args.layers * plan_s * 1e3:7.2f} ms/step   "
              f"{flops / per_step / 1e9:6.1f} GFLOP/s   handler plans made {plans}, reused {hits}")


if __name__ == "__main__":
    main()
