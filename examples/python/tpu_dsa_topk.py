"""DeepSeek-V3.2 sparse attention (DSA) on seqattn's Pallas TPU kernel: indexer top-k -> layout -> attention.

  python examples/python/tpu_dsa_topk.py

One jitted step, all on the device side (here: the CPU, the kernel in Pallas interpret mode):
  1. the lightning indexer scores every (query, key) pair, ``score[i, j] = Σ_h ReLU(q_h[i]·k[j]) w_h[i]``
     (docs/semantics/multi-item-topk-kascade.md §B.2; the indexer's RoPE is left out, it changes the scores,
     not the path), causal pairs only, and ``lax.top_k`` picks k keys per query (§B.3: masked keys tie at the
     mask value and are dropped again after the selection, so early rows keep every key they may see);
  2. ``seqattn.pallas.topk_token_layout`` scatters the selection into the kernel's BlockLayout (no host trip);
  3. ``flash_attention`` runs over the listed blocks, each partial tile with its own stored bits.
Checks: the layout against ``seqattn.TopKMask`` of the same indices (its dense mask, element by element), and
the output and LSE against the C++ engine (``seqattn.attention`` with that TopKMask) on the same q, k, v.
Then the forward work against Splash on the same mask (``seqattn.splash.mask_info`` of the TopKMask).
"""

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import seqattn
from seqattn import splash
from seqattn.pallas import dense_from_layout, topk_token_layout, validate
from seqattn.pallas.kernel import flash_attention
from seqattn.pallas.traffic import layout_forward_work, splash_forward_work

BLOCK = 128
SEQ, TOPK = 640, 96  # keys > k, so the selection is real (§B.6: s <= k would bypass it)
HEADS, KV_HEADS, HEAD_DIM = 4, 1, 64  # MQA, as DSA's attention shares its latent K/V
IDX_HEADS, IDX_DIM, MODEL = 4, 32, 96  # the indexer's heads and head dim, the model width
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE
TOL = 1e-4


def indexer_topk(x, wq, wk, ww, k):
    """int32 [B, S, k]: each query's top-k keys by the indexer score, -1 where a row has fewer allowed keys."""
    s = x.shape[1]
    q = jnp.einsum("bte,ehd->bthd", x, wq)
    key = jnp.einsum("bse,ed->bsd", x, wk)  # one indexer key per token, shared by the indexer heads
    w = jnp.einsum("bte,eh->bth", x, ww) * (IDX_HEADS ** -0.5 * IDX_DIM ** -0.5)
    score = jnp.einsum("bth,bths->bts", w, jax.nn.relu(jnp.einsum("bthd,bsd->bths", q, key)))
    causal = jnp.tril(jnp.ones((s, s), bool))
    # Masked scores become exactly the mask value, so they tie and top_k takes the lowest such indices; the
    # second application of the mask (MaxText's "mask + A") drops them again.
    score = jnp.where(causal, score, MASK_VALUE)
    _, idx = lax.top_k(score, k)
    return jnp.where(jnp.take_along_axis(jnp.broadcast_to(causal, score.shape), idx, axis=-1), idx, -1)


@jax.jit
def dsa_step(x, wq, wk, ww, q, k, v):
    """Indexer, layout and sparse attention in one jitted function (the layout never leaves the device)."""
    idx = indexer_topk(x, wq, wk, ww, TOPK)
    build = topk_token_layout(idx, kv_len=SEQ, block_q=BLOCK, block_kv=BLOCK)
    out, lse = flash_attention(q, k, v, build.layout, return_lse=True, interpret=True)
    return out, lse, idx, build


def max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def run(seed=0, verbose=True):
    """One DSA step and its checks; returns the max errors and the work counts (the tests call this)."""
    rng = np.random.default_rng(seed)
    say = print if verbose else (lambda *a, **k: None)
    f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    x = f32(1, SEQ, MODEL)
    wq, wk, ww = f32(MODEL, IDX_HEADS, IDX_DIM) * 0.2, f32(MODEL, IDX_DIM) * 0.2, f32(MODEL, IDX_HEADS)
    q, k, v = f32(1, HEADS, SEQ, HEAD_DIM), f32(1, KV_HEADS, SEQ, HEAD_DIM), f32(1, KV_HEADS, SEQ, HEAD_DIM)

    out, lse, idx, build = dsa_step(x, wq, wk, ww, q, k, v)
    assert not bool(build.overflow) and not bool(build.invalid)
    idx = np.asarray(idx)
    layout = jax.tree_util.tree_map(np.asarray, build.layout)
    validate(layout)
    mask = seqattn.TopKMask(idx, SEQ)
    allowed = seqattn.to_dense(mask)
    assert np.array_equal(dense_from_layout(layout), allowed), "layout != TopKMask"

    bshd = lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 2, 1, 3))  # noqa: E731
    e_out, e_lse = seqattn.attention(bshd(q), bshd(k), bshd(v), mask)
    err_out, err_lse = max_err(out, bshd(e_out)), max_err(lse, e_lse)
    assert err_out < TOL and err_lse < TOL, (err_out, err_lse)
    nq, nk = layout.shape.num_q_blocks, layout.shape.num_kv_blocks
    say(f"DSA: {SEQ} tokens, top-{TOPK} keys per query ({int((idx >= 0).sum())} selected pairs of "
        f"{SEQ * (SEQ + 1) // 2} causal), {HEADS} heads on {KV_HEADS} kv head, blocks {BLOCK}")
    say(f"  layout: {int(layout.q_count.sum())} listed tiles of {nq * nk} ({nq * (nq + 1) // 2} causal), "
        f"{int((layout.q_tile >= 0).sum())} with stored bits; equals TopKMask's dense mask")
    say(f"  vs seqattn.attention (TopKMask): max |out| err {err_out:.2e}, max |lse| err {err_lse:.2e}")

    ours = layout_forward_work(layout, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, itemsize=4)
    info = splash.mask_info(mask, BLOCK, BLOCK, q_len=SEQ, kv_len=SEQ, heads=HEADS)
    theirs = splash_forward_work(info, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_q=BLOCK,
                                 block_kv=BLOCK, itemsize=4)
    say("forward work (counts from the metadata, not TPU time; float32 bytes):")
    say(f"  {'':16s}{'grid steps':>12s}{'computed':>10s}{'K/V DMAs':>10s}{'mask DMAs':>11s}{'HBM bytes':>12s}")
    for name, w in (("seqattn.pallas", ours), ("Splash", theirs)):
        say(f"  {name:16s}{w.grid_steps:12d}{w.computed:10d}{w.kv_fetches:10d}{w.mask_fetches:11d}{w.hbm_bytes:12d}")
    return dict(out=err_out, lse=err_lse, ours=ours, splash=theirs)


def main():
    run()


if __name__ == "__main__":
    main()
