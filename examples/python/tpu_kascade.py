"""Kascade sparse attention on seqattn's Pallas TPU kernel: an anchor layer's top-k tiles reused by later layers.

  python examples/python/tpu_kascade.py

The anchor layer attends densely (causal) with our kernel; its LSE gives the post-softmax probabilities, which
are pooled per KV group and q block over the keys strictly before the block's first query, summed per kv block,
and ``lax.top_k`` picks the kv blocks (docs/semantics/multi-item-topk-kascade.md §C.1, with the selection at
the kernel's kv-block granularity, as the TPU fork's generation 2 selects 128-token tiles, §C.3). Two reuse
layers then take the anchor's selection through a head map (reuse group g reads anchor group hm[g], §C.1) and
attend with ``seqattn.pallas.topk_tile_layout``: query i of q block t sees key j iff
``j <= i and (j >= first query of t or block(j) is selected for t)``.

Checks, element by element: the anchor's output against the C++ engine with ``seqattn.CausalMask``; each reuse
layer's output and LSE against the engine with a ``seqattn.PerHeadMask`` of ``seqattn.TopKMask`` s whose token
sets are built here from the rule above, independently of the layout builder; and the layout's dense mask
against that mask. Then the forward work of a reuse layer against Splash on the same mask.
"""

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import seqattn
from seqattn import splash
from seqattn.pallas import dense_from_layout, static_layout, topk_tile_layout, validate
from seqattn.pallas.kernel import flash_attention
from seqattn.pallas.traffic import layout_forward_work, splash_forward_work

BLOCK = 128
SEQ = 1024  # 8 q blocks, 8 kv blocks
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
TOP_TILES = 2  # kv blocks selected per (KV group, q block), besides the q block's own causal keys
HEAD_MAP = [1, 0]  # reuse group g takes anchor group HEAD_MAP[g]
TOL = 1e-4


def anchor_selection(q, k, lse):
    """int32 [B, KV_HEADS, NQ, TOP_TILES]: per KV group and q block the kv blocks with the most pooled
    probability on keys before the block's first query (ties: lowest block first, as lax.top_k)."""
    b, h, s, d = q.shape
    group = h // KV_HEADS
    kr = jnp.repeat(k, group, axis=1)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, kr) / np.sqrt(d)
    p = jnp.where(jnp.tril(jnp.ones((s, s), bool)), jnp.exp(logits - lse[..., None]), 0.0)
    nq = s // BLOCK
    pooled = p.reshape(b, KV_HEADS, group, nq, BLOCK, s).sum(axis=(2, 4))  # [B, G, NQ, S]
    first = jnp.arange(nq)[:, None] * BLOCK
    pooled = jnp.where(jnp.arange(s)[None, :] < first, pooled, 0.0)  # keys strictly before the q block
    per_block = pooled.reshape(b, KV_HEADS, nq, s // BLOCK, BLOCK).sum(-1)
    return lax.top_k(per_block, TOP_TILES)[1].astype(jnp.int32)


def reuse_tokens(sel_heads, s):
    """The reuse rule in token terms, independently of the builder: int32 [B, H, S, s] top-k indices (the
    keys of query i, -1 padded) from the per-q-head block selection [B, H, NQ, k]."""
    b, h, nq, _ = sel_heads.shape
    out = np.full((b, h, s, s), -1, np.int32)
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                first = (i // BLOCK) * BLOCK
                chosen = [j for kb in sorted(set(sel_heads[bi, hi, i // BLOCK].tolist()))
                          for j in range(kb * BLOCK, (kb + 1) * BLOCK) if j < first]
                keys = chosen + list(range(first, i + 1))
                out[bi, hi, i, : len(keys)] = keys
    return out


def max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def run(seed=0, verbose=True, reuse_layers=2):
    """The anchor layer, ``reuse_layers`` reuse layers and their checks; returns the max errors and the work
    counts of a reuse layer (the tests call this)."""
    rng = np.random.default_rng(seed)
    say = print if verbose else (lambda *a, **k: None)
    bshd = lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 2, 1, 3))  # noqa: E731

    def layer_inputs():
        f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
        return f32(1, HEADS, SEQ, HEAD_DIM), f32(1, KV_HEADS, SEQ, HEAD_DIM), f32(1, KV_HEADS, SEQ, HEAD_DIM)

    # Anchor layer: dense causal attention with our kernel; the LSE feeds the selection.
    q, k, v = layer_inputs()
    causal = static_layout(seqattn.CausalMask(), SEQ, block_q=BLOCK, block_kv=BLOCK)
    a_out, a_lse = flash_attention(q, k, v, causal, return_lse=True, interpret=True)
    e_out, _ = seqattn.attention(bshd(q), bshd(k), bshd(v), seqattn.CausalMask())
    err_anchor = max_err(a_out, bshd(e_out))
    assert err_anchor < TOL, err_anchor
    sel = np.asarray(jax.jit(anchor_selection)(q, k, a_lse))  # [1, G, NQ, TOP_TILES]
    say(f"Kascade: {SEQ} tokens, {HEADS} heads in {KV_HEADS} KV groups, blocks {BLOCK}, top-{TOP_TILES} kv blocks "
        f"per q block")
    say(f"  anchor (dense causal) vs seqattn.attention (CausalMask): max |out| err {err_anchor:.2e}")
    say(f"  anchor selection, group 0, per q block: {sel[0, 0].tolist()}")

    # Reuse layers: the selection through the head map, one row per q head (its group's anchor group).
    sel_heads = sel[:, np.repeat(HEAD_MAP, HEADS // KV_HEADS)]  # [1, H, NQ, k]
    build = jax.jit(lambda t: topk_tile_layout(t, q_len=SEQ, kv_len=SEQ, block_q=BLOCK, block_kv=BLOCK))(sel_heads)
    assert not bool(build.overflow) and not bool(build.invalid)
    layout = jax.tree_util.tree_map(np.asarray, build.layout)
    validate(layout)
    tokens = reuse_tokens(sel_heads, SEQ)
    mask = seqattn.PerHeadMask([seqattn.TopKMask(tokens[:, h], SEQ) for h in range(HEADS)])
    allowed = seqattn.to_dense(mask)
    assert np.array_equal(dense_from_layout(layout), allowed), "layout != the reuse rule"

    errs = []
    for layer in range(reuse_layers):
        q, k, v = layer_inputs()
        out, lse = flash_attention(q, k, v, build.layout, return_lse=True, interpret=True)
        r_out, r_lse = seqattn.attention(bshd(q), bshd(k), bshd(v), mask)
        errs.append((max_err(out, bshd(r_out)), max_err(lse, r_lse)))
        assert max(errs[-1]) < TOL, errs[-1]
        say(f"  reuse layer {layer + 1} vs seqattn.attention (PerHeadMask of TopKMask): max |out| err "
            f"{errs[-1][0]:.2e}, max |lse| err {errs[-1][1]:.2e}")
    nq = SEQ // BLOCK
    say(f"  reuse layout: {int(layout.q_count.sum())} listed tiles over {HEADS} heads of {HEADS * nq * nq} "
        f"({HEADS * nq * (nq + 1) // 2} causal); equals the rule's dense mask")

    ours = layout_forward_work(layout, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, itemsize=4)
    info = splash.mask_info(mask, BLOCK, BLOCK, q_len=SEQ, kv_len=SEQ, heads=HEADS)
    theirs = splash_forward_work(info, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_q=BLOCK,
                                 block_kv=BLOCK, itemsize=4)
    say("forward work of a reuse layer (counts from the metadata, not TPU time; float32 bytes):")
    say(f"  {'':16s}{'grid steps':>12s}{'computed':>10s}{'K/V DMAs':>10s}{'mask DMAs':>11s}{'HBM bytes':>12s}")
    for name, w in (("seqattn.pallas", ours), ("Splash", theirs)):
        say(f"  {name:16s}{w.grid_steps:12d}{w.computed:10d}{w.kv_fetches:10d}{w.mask_fetches:11d}{w.hbm_bytes:12d}")
    return dict(anchor=err_anchor, reuse=max(e[0] for e in errs), reuse_lse=max(e[1] for e in errs), ours=ours,
                splash=theirs)


def main():
    run()


if __name__ == "__main__":
    main()
