"""Forward-pass work of seqattn's Pallas TPU kernel against Splash on the same masks: counts, not TPU time.

Nothing here runs on a TPU or measures time. For each workload both kernels' metadata is built on the host and
``seqattn.pallas.traffic`` walks their grids in order, counting what each pass would do: grid steps (each costs a
little even when it computes nothing), steps that compute (the matmuls), K/V block copies from HBM (Pallas copies a
block when its index differs from the previous step's), partial-mask copies, and the HBM bytes of all of it (Q in,
O and the fp32 LSE out, K/V, int8 masks; bf16 data). Only ratios between the two columns mean anything, and only
about the work the metadata schedules; the TPU speed of our kernel is not measured.

Metadata:
  ours    ``seqattn.pallas.static_layout`` (the C++ TPU policy) for every static mask, and the jitted device
          builder ``topk_tile_layout`` for Kascade (its only builder), run here on the CPU.
  Splash  ``seqattn.splash.mask_info``: Splash's MaskInfo, the arrays JAX's ``_process_mask`` returns. Causal and
          the sliding window are Splash mask classes (computed in the kernel: no stored masks); documents,
          multi-item, DSA top-k and Kascade have no Splash class, so their static route is a NumpyMask of the
          dense pattern, whose MaskInfo seqattn builds in C++ from the mask's structure (JAX's Python builder
          on a 32k dense array would take minutes; the arrays are the same, python/tests/test_splash.py).

Workloads (one sequence each; heads, KV heads and head dim from --heads / --kv-heads / --head-dim; blocks
--block x --block for both kernels; lengths multiples of the block, as Splash requires):
  causal        the baseline, --len tokens
  documents     16 documents of random lengths in 8k tokens, causal inside each; a second row builds ours with
                the device builder ``document_layout``, which leaves partial tiles to the kernel's segment-id
                predicate (no stored masks; the ids' bytes are added, at most one [block] int32 read per Q block
                and per K/V copy) at its default width NK, the only bound that holds for any ids under jit
  window        a 1k window (SlidingWindowMask(1024, 0)) over 16k tokens; second row as above (one segment, the
                kernel's ``inner=window(1024, 0)``, no ids), with the window's static width bound
  multi-item    sglang-jax packing query ‖ d ‖ item ‖ d ‖ … (query 256 tokens, items of 120-360 tokens, one empty
                item, the last item stretched so the length is a multiple of the block) at 8k, 16k and 32k tokens;
                then a serving batch of four requests (8k, 5k, 3k, 2k) in one call, padded to 8k, against Splash
                run request by request (it has no ragged batch; our side pays for the padding)
  DSA           32k tokens, top-2048 keys per query (causal past); the keys are synthetic, not an indexer's:
                "uniform" draws them from the whole past (the worst case for block sparsity), "local" from the
                4096 keys before the query
  Kascade       32k tokens, 10% of the kv blocks before each q block selected (random past blocks: which ones
                does not change the counts, only their number does) plus the q block's own causal keys; one
                selection for all heads (the TPU fork's Splash path, §C.3 path A; per-group selections would
                multiply the host memory of the Splash side by the groups)

  python bench/python/bench_pallas_blocks.py [--block 512] [--heads 32 --kv-heads 8 --head-dim 128]
"""

import argparse
import os
import time

import numpy as np

import jax

import seqattn
from seqattn import splash
from seqattn.pallas import document_layout, static_layout, topk_tile_layout
from seqattn.pallas.traffic import layout_forward_work, splash_forward_work

from bench_attention import cpu_name
from bench_tpu_metadata import documents

DELIM = 1 << 20  # the multi-item delimiter; item tokens are drawn below it


def multi_item_tokens(rng, s, block):
    """One packed request of exactly s tokens (s a multiple of block): query 256, items of 120-360 tokens, the
    third item empty; the last item absorbs the rest so the length is s."""
    query = rng.integers(0, DELIM, 256)
    parts, n = [query, [DELIM]], 257
    while True:
        item = 0 if len(parts) == 6 else int(rng.integers(120, 361))
        if n + item + 1 + 121 + 1 > s:
            break
        parts += [rng.integers(0, DELIM, item), [DELIM]]
        n += item + 1
    parts += [rng.integers(0, DELIM, s - n - 1), [DELIM]]
    tokens = np.concatenate(parts).astype(np.int32)
    assert tokens.size == s and s % block == 0
    return tokens


def dsa_indices(rng, s, k, local=None):
    """int32 [1, s, k]: per query k distinct keys of its causal past (or of the `local` keys up to it), all of
    them when fewer; -1 pads. Drawn as the k largest of random scores, 256 queries at a time."""
    out = np.full((s, k), -1, np.int32)
    out[:k, :] = np.where(np.arange(k)[None, :] <= np.arange(k)[:, None], np.arange(k)[None, :], -1)
    for lo in range(k, s, 256):
        rows = np.arange(lo, min(lo + 256, s))
        if local is None:
            score = rng.random((rows.size, s))
            score[np.arange(s)[None, :] > rows[:, None]] = -1.0
            out[rows] = np.argpartition(score, -k, axis=1)[:, -k:]
        else:
            first = np.maximum(rows - local + 1, 0)
            span = rows - first + 1  # keys first..row, at most `local`
            score = rng.random((rows.size, local))
            score[np.arange(local)[None, :] >= span[:, None]] = -1.0
            out[rows] = first[:, None] + np.argpartition(score, -k, axis=1)[:, -k:]
    return out[None]


def kascade_selection(rng, s, block, share=0.10):
    """int32 [1, NQ, k]: per q block k = ceil(share * NK) random kv blocks strictly before it (-1 pads)."""
    nq = s // block
    k = max(1, int(np.ceil(share * nq)))
    sel = np.full((nq, k), -1, np.int32)
    for t in range(1, nq):
        pick = rng.choice(t, min(k, t), replace=False)
        sel[t, : pick.size] = pick
    return sel[None]


def kascade_splash_mask(sel, s, block):
    """The reuse rule as a TopKMask (keys of selected blocks before the q block, then its own causal keys), for
    Splash's side: one row per query, built a q block at a time."""
    nq, k = sel.shape[1:]
    width = k * block + block
    idx = np.full((s, width), -1, np.int32)
    local = np.arange(block)
    for t in range(nq):
        blocks = np.sort(sel[0, t][sel[0, t] >= 0])
        before = (blocks[:, None] * block + local[None, :]).reshape(-1)
        n = before.size
        rows = slice(t * block, (t + 1) * block)
        idx[rows, :n] = before
        own = t * block + local  # row i sees t*block .. i
        idx[rows, n: n + block] = np.where(local[None, :] <= local[:, None], own[None, :], -1)
    return seqattn.TopKMask(idx[None], s)


def device_layout(ids, inner, block, q_width=None):
    """document_layout (jitted, on this host's CPU) as host arrays: partial tiles are -2, the kernel's predicate.
    ``q_width``: the static bound on a row's blocks (None: NK, the only bound that holds for any ids)."""
    build = jax.jit(lambda i: document_layout(i, mask=inner, block_q=block, block_kv=block, q_width=q_width))(ids)
    assert not bool(build.overflow)
    return jax.tree_util.tree_map(np.asarray, build.layout)


def row(name, ours, theirs, seconds):
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
    print(f"| {name} | {ours.grid_steps} / {theirs.grid_steps} | {ratio(ours.grid_steps, theirs.grid_steps)} | "
          f"{ours.computed} / {theirs.computed} | {ours.kv_fetches} / {theirs.kv_fetches} | "
          f"{ours.mask_fetches} / {theirs.mask_fetches} | {ours.hbm_bytes / 2**20:.0f} / "
          f"{theirs.hbm_bytes / 2**20:.0f} | {ratio(ours.hbm_bytes, theirs.hbm_bytes)} | {seconds:.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--len", type=int, default=32768, help="causal, DSA and Kascade length")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--skip", default="", help="comma-separated workload names to leave out (e.g. dsa)")
    args = ap.parse_args()
    b, h, hkv, d = args.block, args.heads, args.kv_heads, args.head_dim
    skip = set(filter(None, args.skip.split(",")))
    rng = np.random.default_rng(0)
    work = dict(heads=h, kv_heads=hkv, head_dim=d, itemsize=2)

    def compare(name, mask, s, layout=None, id_arrays=0):
        """One row; ``id_arrays``: int32 [S] arrays the kernel's predicate reads (segment ids: 1), counted as
        read with every Q block and, at most, with every K/V copy (traffic.py leaves them out)."""
        t = time.perf_counter()
        layout = static_layout(mask, s, block_q=b, block_kv=b) if layout is None else layout
        ours = layout_forward_work(layout, **work)
        ours = ours._replace(hbm_bytes=ours.hbm_bytes + id_arrays * 4 * (ours.q_fetches + ours.kv_fetches) * b)
        del layout
        info = splash.mask_info(mask, b, b, q_len=s, kv_len=s, heads=1)
        theirs = splash_forward_work(info, block_q=b, block_kv=b, **work)
        row(name, ours, theirs, time.perf_counter() - t)

    print(f"{cpu_name()}, {os.cpu_count()} CPUs; jax {jax.__version__}. Forward pass, {h} q heads on {hkv} KV heads, "
          f"head dim {d}, bf16, blocks {b} x {b} for both kernels. Counts, not TPU time.\n")
    print("| workload | grid steps ours / Splash | ratio | computed ours / Splash | K/V DMAs ours / Splash | "
          "mask DMAs ours / Splash | HBM MiB ours / Splash | bytes ratio | host s |")
    print("|---|---|---|---|---|---|---|---|---|")
    s = args.len
    if "causal" not in skip:
        compare(f"causal {s // 1024}k", seqattn.CausalMask(), s)
    if "documents" not in skip:
        ids = documents(rng, 8192, 16)
        docs = seqattn.DocumentMask(ids, inner=seqattn.CausalMask())
        compare("16 documents in 8k, causal", docs, 8192)
        # The device builder leaves partial tiles to the kernel's predicate on the segment ids: no stored masks.
        pred = device_layout(ids, seqattn.CausalMask(), b)
        compare("  same, ours from document_layout (predicate tiles)", docs, 8192, pred, id_arrays=1)
    if "window" not in skip:
        window = seqattn.SlidingWindowMask(1024, 0)
        compare("1k window over 16k", window, 16384)
        # One segment: the predicate is the window on token indices alone (flash_attention(inner=window(1024, 0))).
        # A q block's keys span 1024 + block positions: that many blocks, one more when 1024 is not a multiple.
        pred = device_layout(np.ones((1, 16384), np.int32), window, b, q_width=-(-(1024 + b) // b) + (1024 % b > 0))
        compare("  same, ours from document_layout (predicate tiles)", window, 16384, pred)
    if "multi-item" not in skip:
        for n in (8192, 16384, 32768):
            tokens = multi_item_tokens(rng, n, b)
            items = int((tokens == DELIM).sum()) - 1
            compare(f"multi-item {n // 1024}k ({items} items)", seqattn.MultiItemMask(tokens, DELIM), n)
    if "multi-item" not in skip:
        # The serving case: a ragged batch of requests in one call, padded to the longest (BSHD, as paged K/V
        # needs); Splash has no ragged batch, so its side is one call per request on that request alone.
        lens = [8192, 5120, 3072, 2048]
        t = time.perf_counter()
        reqs = [multi_item_tokens(rng, n, b) for n in lens]
        layout = static_layout(seqattn.MultiItemMask(reqs, DELIM), max(lens), q_lens=lens, block_q=b, block_kv=b)
        ours = layout_forward_work(layout, **work)
        theirs = sum((splash_forward_work(splash.mask_info(seqattn.MultiItemMask(r, DELIM), b, b, heads=1),
                                          block_q=b, block_kv=b, **work) for r in reqs[1:]),
                     splash_forward_work(splash.mask_info(seqattn.MultiItemMask(reqs[0], DELIM), b, b, heads=1),
                                         block_q=b, block_kv=b, **work))
        row(f"multi-item batch of {len(lens)} ({'/'.join(str(n // 1024) + 'k' for n in lens)}), padded", ours,
            theirs, time.perf_counter() - t)
    if "dsa" not in skip:
        for kind, local in (("uniform", None), ("local 4096", 4096)):
            idx = dsa_indices(rng, s, args.topk, local)
            compare(f"DSA {s // 1024}k top-{args.topk}, {kind}", seqattn.TopKMask(idx, s), s)
            del idx
    if "kascade" not in skip:
        sel = kascade_selection(rng, s, b)
        build = jax.jit(lambda x: topk_tile_layout(x, q_len=s, kv_len=s, block_q=b, block_kv=b))(sel)
        assert not bool(build.overflow) and not bool(build.invalid)
        layout = jax.tree_util.tree_map(np.asarray, build.layout)
        compare(f"Kascade {s // 1024}k, {sel.shape[-1]} of {s // b} blocks", kascade_splash_mask(sel, s, b), s,
                layout)


if __name__ == "__main__":
    main()
