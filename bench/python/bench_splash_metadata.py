"""Splash metadata from traced segment ids (seqattn.tpu) against Splash's and tokamax's own builders, and the
blocks Splash computes with it against Splash with segment ids alone -- CPU timings, TPU work counted.

Workloads (one row of S tokens, new random document lengths each call; the ids are traced, one compilation
serves them all), at S = 8k, 32k, 128k:
  documents         --docs documents (default 64), causal inside each
  docs + window     the same documents, a 1024-token causal window inside each
  multi-item        one sglang-jax request: a 1k-token query, then items of 100-400 tokens, each ending with
                    a delimiter (seqattn.tpu.multi_item_classes; Splash has no multi-item mask)
Metadata columns (ms per call, best of --repeat):
  seqattn jit       seqattn.tpu.splash_mask_info under jax.jit: forward, dQ and dK/dV MaskInfos (documents,
                    window); multi_item_classes for multi-item (tile classes only)
  JAX dynamic       jax's _process_dynamic_mask under jit on the dense [S, S] mask built from the ids (what a
                    Splash user can do under jit today; forward MaskInfo only); skipped above --dense-max
  JAX / tokamax _process_mask   their host builders on the dense mask of one row (a Python loop over
                    blocks; forward MaskInfo); above --dense-max estimated from the largest measured size
                    by the tile count (marked est.)
Blocks (TPU work, not time): the grid steps that compute in the forward pass with seqattn's metadata, Splash
with the static mask and segment ids alone (every tile of the causal / window mask), and their ratio.

The limit, measured in the same run: NumPy's streaming read over 512 MiB on 1 and --threads threads. The jit
builders move a few int32 arrays of S and of #tiles elements: bound by memory traffic and per-op overheads.

  python bench/python/bench_splash_metadata.py [--sizes 8192,32768,131072] [--block 512] [--docs 64]
"""

import time

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi

import seqattn
from seqattn import tpu

from bench_attention import best_of
from bench_tpu_metadata import documents, metadata_arguments, print_machine

try:
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask as tm
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask_info as tmi
except ImportError:  # tokamax is a test dependency, not the package's
    tm = tmi = None


def multi_item_row(rng, s, delimiter=-1):
    """[1, s] tokens of one request: a 1k query, items of 100-400 tokens, each ending with the delimiter."""
    tokens = rng.integers(0, 1000, s).astype(np.int32)
    ends, t = [1023], 1024
    while True:
        t += int(rng.integers(100, 401))
        if t >= s:
            break
        ends.append(t - 1)
    ends.append(s - 1)
    tokens[ends] = delimiter
    return tokens[None, :]


def dense_documents(ids, window=None):
    q = np.arange(ids.shape[-1])
    row = ids[0]
    allowed = (row[:, None] == row[None, :]) & (q[:, None] >= q[None, :])
    if window is not None:
        allowed &= q[:, None] - q[None, :] <= window
    return allowed


def dense_multi_item(tokens, delimiter=-1):
    s = tokens.shape[-1]
    row = tokens[0]
    delims = np.flatnonzero(row == delimiter)
    prefix_end = delims[0] + 1
    seg_start = np.zeros(s, np.int64)
    for a, b in zip(delims[:-1], delims[1:]):
        seg_start[a + 1:b + 1] = a + 1
    q, k = np.arange(s)[:, None], np.arange(s)[None, :]
    return np.where(q < prefix_end, k <= q, (k < prefix_end) | ((seg_start[:, None] <= k) & (k <= q)))


def time_once(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = metadata_arguments(__doc__)
    ap.add_argument("--dense-max", type=int, default=32768, help="largest S whose dense [S, S] mask is built")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    b = args.block
    print_machine(args, f"; tokamax {'present' if tmi else 'absent'}")
    print("| S | workload | seqattn jit ms | ms per 32k | JAX dynamic ms | JAX _process_mask s | "
          "tokamax _process_mask s | blocks: seqattn | Splash + ids alone | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    bs = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b, block_q_dq=b,
                       block_kv_dq=b)
    measured = {}  # workload -> (tiles, JAX s, tokamax s) at the largest dense size
    for s in (int(x) for x in args.sizes.split(",")):
        tiles = (s // b) ** 2
        for name, inner, window in (("documents", seqattn.CausalMask(), None),
                                    ("docs + window 1024", seqattn.SlidingWindowMask(1024, 0), 1024),
                                    ("multi-item", None, None)):
            if inner is not None:
                rows = [documents(rng, s, args.docs) for _ in range(args.repeat + 1)]
                fn = jax.jit(lambda i, inner=inner: tpu.splash_mask_info(i, mask=inner, block_sizes=bs))
                static_mask = sm.CausalMask((s, s)) if window is None else sm.LocalMask((s, s), (window, 0), 0)
            else:
                rows = [multi_item_row(rng, s) for _ in range(args.repeat + 1)]
                fn = jax.jit(lambda t: tpu.multi_item_classes(t, -1, block_size=b))
                static_mask = sm.CausalMask((s, s))
            dev = [jnp.asarray(r) for r in rows]
            calls = iter(range(10**9))
            jax.block_until_ready(fn(dev[0]))

            def run():
                jax.block_until_ready(fn(dev[next(calls) % len(dev)]))

            t_ours = best_of(run, args.repeat)
            out = fn(dev[0])
            classes = np.asarray(out.forward.block_mask if inner is not None else out)
            ours_blocks = int((classes != 0).sum())
            static_info, _ = smi._process_mask(sm.MultiHeadMask([static_mask]), (b, b), False, shrink_grid=False)
            alone = int((np.asarray(static_info.block_mask) != 0).sum())

            jax_dyn = jax_host = tok_host = "n/a"
            if s <= args.dense_max:
                dense = (dense_documents(rows[0], window) if inner is not None else dense_multi_item(rows[0]))
                if inner is not None:
                    dyn = jax.jit(lambda i, window=window: smi._process_dynamic_mask(
                        jnp.asarray(_dense_jnp(i, window))[None], (b, b), False)[0].block_mask)
                    jax.block_until_ready(dyn(dev[0]))
                    jax_dyn = f"{best_of(lambda: jax.block_until_ready(dyn(dev[1])), 2) * 1e3:.1f}"
                smi._process_mask.cache_clear()
                t_jax = time_once(lambda: smi._process_mask(sm.MultiHeadMask([sm.NumpyMask(dense)]), (b, b), False,
                                                            shrink_grid=False))
                t_tok = None
                if tmi is not None:
                    tmi._process_mask.cache_clear()
                    t_tok = time_once(lambda: tmi._process_mask(tm.NumpyMask(dense), (b, b), False))
                measured[name] = (tiles, t_jax, t_tok)
                jax_host = f"{t_jax:.2f}"
                tok_host = "n/a" if t_tok is None else f"{t_tok:.2f}"
                del dense
            elif name in measured:
                t0, t_jax, t_tok = measured[name]
                jax_host = f"{t_jax * tiles / t0:.0f} (est.)"
                tok_host = "n/a" if t_tok is None else f"{t_tok * tiles / t0:.0f} (est.)"
            print(f"| {s} | {name} | {t_ours * 1e3:.2f} | {t_ours * 1e3 * 32768 / s:.2f} | {jax_dyn} | {jax_host} | "
                  f"{tok_host} | {ours_blocks} | {alone} | {alone / max(ours_blocks, 1):.1f} |", flush=True)


def _dense_jnp(ids, window):
    """The dense [S, S] document mask from traced ids in jax.numpy (what a Splash user builds under jit)."""
    row = ids[0]
    q = jnp.arange(row.shape[0])
    allowed = (row[:, None] == row[None, :]) & (q[:, None] >= q[None, :])
    if window is not None:
        allowed &= q[:, None] - q[None, :] <= window
    return allowed


if __name__ == "__main__":
    main()
