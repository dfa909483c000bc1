"""Mask metadata build times: seqattn against the upstream builders, on the CPU.

  Splash: seqattn.splash.mask_info            vs jax's splash _process_mask (block 512 x 512, 1 head);
          "from a BlockMask": the export alone, from a prebuilt seqattn BlockMask (no BlockMask build)
  flex:   seqattn.torch.block_mask            vs torch's create_block_mask   (BLOCK_SIZE 128, B = H = 1)

for causal, sliding-window (1024 keys) and 64-document (causal inside) masks at 8k, 32k and 128k tokens,
in one run. Splash has no document class: its document mask is a NumpyMask of the dense pattern (what a
Splash user writes). An upstream build is skipped where it would take more than 60 s (estimated from the
previous size: both upstream builders cost O(tokens^2)) or where create_block_mask's dense Q x KV mask
would need more than 8 GB; the table says so and gives the estimate. seqattn times are the best of 3.

  python bench/python/bench_masks.py [--sizes 8192,32768,131072] [--limit 60]
"""

import argparse
import gc
import time

import numpy as np

import seqattn
from seqattn import splash

SPLASH_BLOCK = 512
FLEX_BLOCK = 128
WINDOW = 1024
DOCS = 64


def best_of(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def once(fn):
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def doc_ids(n):
    bounds = np.linspace(0, n, DOCS + 1).astype(np.int64)
    ids = np.zeros(n, np.int32)
    for d in range(DOCS):
        ids[bounds[d] : bounds[d + 1]] = d + 1
    return ids


def seqattn_mask(kind, n):
    if kind == "causal":
        return seqattn.CausalMask()
    if kind == "window":
        return seqattn.SlidingWindowMask(WINDOW - 1, 0)
    return seqattn.DocumentMask(doc_ids(n)[None, :], inner=seqattn.CausalMask())


def jax_mask(kind, n):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    if kind == "causal":
        m = sm.CausalMask((n, n))
    elif kind == "window":
        m = sm.LocalMask((n, n), (WINDOW - 1, 0), 0)
    else:
        ids = doc_ids(n)
        m = sm.NumpyMask((ids[:, None] == ids[None, :]) & np.tri(n, dtype=bool))
    return sm.MultiHeadMask((m,))


def flex_mask_mod(kind, n):
    import torch

    if kind == "causal":
        return lambda b, h, q, kv: kv <= q
    if kind == "window":
        return lambda b, h, q, kv: (kv <= q) & (q - kv < WINDOW)
    doc = torch.from_numpy(doc_ids(n))
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q)


def fmt_s(s):
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


class Upstream:
    """Runs an upstream build unless the previous size says it would exceed the limits."""

    def __init__(self, limit_s, bytes_per_element=0.0, limit_bytes=float("inf")):
        self.limit_s, self.bpe, self.limit_bytes = limit_s, bytes_per_element, limit_bytes
        self.last = {}  # kind -> (n, seconds)

    def skip_reason(self, kind, n):
        """Why the build at n is not run, or None to run it."""
        est = self.estimate(kind, n)
        if est is not None and est > self.limit_s:
            return f"skipped (est. {est:.0f} s > {self.limit_s:.0f} s)"
        mem = self.bpe * n * n
        if mem > self.limit_bytes:
            return f"skipped (dense mask ~{mem / 2**30:.0f} GiB)"
        return None

    def run(self, kind, n, make):
        """make() builds the inputs (untimed) and returns the build to time."""
        reason = self.skip_reason(kind, n)
        if reason is not None:
            return None, reason
        fn = make()
        t = once(fn)
        self.last[kind] = (n, t)
        return t, fmt_s(t)

    def estimate(self, kind, n):
        if kind not in self.last:
            return None
        n0, t0 = self.last[kind]
        return t0 * (n / n0) ** 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8192,32768,131072")
    ap.add_argument("--limit", type=float, default=60.0, help="skip an upstream build estimated above this (s)")
    ap.add_argument("--kinds", default="causal,window,docs64")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = [k if k != "docs64" else "docs" for k in args.kinds.split(",")]

    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi
    except Exception as e:  # noqa: BLE001
        smi = None
        print(f"jax splash not importable ({e}); Splash upstream columns empty")
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask

        from seqattn import torch as st
    except Exception as e:  # noqa: BLE001
        torch = None
        print(f"torch not importable ({e}); flex columns empty")

    # Warm-up: first calls pay one-time costs (torch's vmap tracing, jax's first numpy paths) that are not
    # the builders' work.
    for kind in kinds:
        seqattn_mask(kind, 1024)
        if smi is not None:
            smi._process_mask(jax_mask(kind, 1024), (SPLASH_BLOCK, SPLASH_BLOCK), False)
            smi._process_mask.cache_clear()
        if torch is not None:
            create_block_mask(flex_mask_mod(kind, 1024), 1, 1, 1024, 1024, device="cpu", BLOCK_SIZE=FLEX_BLOCK)
            st.block_mask(seqattn_mask(kind, 1024), 1, 1, 1024, 1024, BLOCK_SIZE=FLEX_BLOCK)

    splash_up = Upstream(args.limit)
    # Splash's document mask is a dense NumpyMask: ~3 bytes per element while it is built and hashed.
    splash_docs_up = Upstream(args.limit, bytes_per_element=3.0, limit_bytes=8 * 2**30)
    # create_block_mask materialises the Q x KV mask plus int intermediates (~12 B per element measured at 16k).
    flex_up = Upstream(args.limit, bytes_per_element=12.0, limit_bytes=8 * 2**30)

    rows = []
    for n in sizes:
        for kind in kinds:
            label = "docs64" if kind == "docs" else kind
            m = seqattn_mask(kind, n)
            ours_s = best_of(lambda: splash.mask_info(m, SPLASH_BLOCK, SPLASH_BLOCK, q_len=n, kv_len=n, heads=1))
            # The export alone, from a prebuilt seqattn BlockMask (the rest is the BlockMask build).
            bm = m.block_mask(n, n, block_size=(SPLASH_BLOCK, SPLASH_BLOCK))
            export_s = best_of(lambda: splash.mask_info(bm, SPLASH_BLOCK, SPLASH_BLOCK))
            up_s, up_txt, sp_txt = None, "-", "-"
            if smi is not None:
                smi._process_mask.cache_clear()

                def make_splash(kind=kind, n=n):
                    jm = jax_mask(kind, n)  # the dense NumpyMask of the documents is built here, untimed
                    return lambda: smi._process_mask(jm, (SPLASH_BLOCK, SPLASH_BLOCK), False)

                up = splash_docs_up if kind == "docs" else splash_up
                up_s, up_txt = up.run(kind, n, make_splash)
                smi._process_mask.cache_clear()
                if up_s is not None:
                    sp_txt = f"{up_s / ours_s:.0f}x"
                else:
                    est = up.estimate(kind, n)
                    sp_txt = f"~{est / ours_s:.0f}x (est.)" if est else "-"
            fx_s, fx_txt, fup_txt, fsp_txt = None, "-", "-", "-"
            if torch is not None:
                fx_s = best_of(lambda: st.block_mask(m, 1, 1, n, n, BLOCK_SIZE=FLEX_BLOCK))
                fx_txt = fmt_s(fx_s)
                mod = flex_mask_mod(kind, n)
                fup_s, fup_txt = flex_up.run(
                    kind, n, lambda: lambda: create_block_mask(mod, 1, 1, n, n, device="cpu", BLOCK_SIZE=FLEX_BLOCK))
                if fup_s is not None:
                    fsp_txt = f"{fup_s / fx_s:.0f}x"
                else:
                    est = flex_up.estimate(kind, n)
                    fsp_txt = f"~{est / fx_s:.0f}x (est.)" if est else "-"
            rows.append((label, n, fmt_s(ours_s), fmt_s(export_s), up_txt, sp_txt, fx_txt, fup_txt, fsp_txt))
            print(" | ".join(str(c) for c in rows[-1]), flush=True)

    head = ("mask", "tokens", "seqattn MaskInfo", "from a BlockMask", "jax _process_mask", "speedup",
            "seqattn flex export",
            "create_block_mask", "speedup")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
