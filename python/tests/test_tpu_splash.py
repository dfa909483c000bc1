"""seqattn.tpu.splash_attention / splash_mask_info: Splash fed by MaskInfo built from traced segment ids.

Values and gradients in Pallas interpret mode against a float64 reference and against Splash with the segment
ids alone (every causal tile visited); the traced MaskInfo against JAX's own ``_process_mask`` of each row's
dense mask; the blocks computed against the C++ BlockMask; TPU lowering (real Mosaic) of every configuration.
"""

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi  # noqa: E402

import oracles  # noqa: E402
import seqattn  # noqa: E402
from seqattn import tpu  # noqa: E402


def packed_ids(rng, s, docs, padding):
    """[S] TE ids: `docs` documents of random lengths (1-token ones likely), ids not starting at 1, then
    `padding` zeros at the end."""
    body = s - padding
    cuts = np.sort(rng.choice(np.arange(1, body), size=docs - 1, replace=False)) if docs > 1 else []
    ids = np.zeros(s, np.int32)
    first = int(rng.integers(1, 50))
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, body])):
        ids[a:b] = first + 3 * i
    return ids


def batch_ids(rng, s):
    """Two rows of S = 512: trailing padding longer than a block, and padding between documents covering a
    whole 128-block, with a 1-token document."""
    gap = packed_ids(rng, s, 5, 0)
    after = gap[400:]
    after[after == gap[249]] = 2000  # a document the gap cuts continues under another id
    gap[250:400] = 0
    after = gap[101:]
    after[after == gap[100]] = 1001  # the tail of token 100's document becomes its own one
    gap[100] = 1000  # a 1-token document
    return np.stack([packed_ids(rng, s, 7, 150), gap])


def dense_allowed(ids, mask, heads):
    """[B, Hm, S, S] bool: the document mask with `mask` inside each document (C++ to_dense per row)."""
    rows = []
    for row in ids:
        m = seqattn.DocumentMask(row[None, :], inner=mask)
        d = np.asarray(m.to_dense(len(row), len(row)))  # [1, H or 1, S, S]
        rows.append(np.broadcast_to(d[0], (heads,) + d.shape[-2:]))
    return np.stack(rows)


MASKS = {
    "causal": seqattn.CausalMask(),
    "full": seqattn.FullMask(),
    "window": seqattn.SlidingWindowMask(100, 20),
    "per_head": seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(70, 0, "bottom_right"),
                                     seqattn.FullMask(), seqattn.SlidingWindowMask(-1, 30)]),
}


def bhsd(x):
    return np.swapaxes(np.asarray(x, np.float64), 1, 2)


@pytest.mark.parametrize("name,dtype,hq,hkv,d,blocks", [
    ("causal", jnp.float32, 2, 2, 128, (128, 128)),
    ("per_head", jnp.float32, 4, 2, 64, (256, 128)),
    ("window", jnp.bfloat16, 2, 1, 128, (128, 256)),
    ("full", jnp.float32, 2, 2, 128, (128, 128)),
])
def test_values_and_gradients_match_reference_and_splash_with_ids_alone(rng, name, dtype, hq, hkv, d, blocks):
    b, s = 2, 512
    mask = MASKS[name]
    bq, bkv = blocks
    bs = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bkv, block_kv_dkv=bq,
                       block_kv_dkv_compute=bq, block_q_dq=bq, block_kv_dq=bkv)
    ids = batch_ids(rng, s)
    q = (rng.standard_normal((b, hq, s, d)) * 0.3).astype(np.float32)
    k = rng.standard_normal((b, hkv, s, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, s, d)).astype(np.float32)
    w = rng.standard_normal((b, hq, s, d)).astype(np.float32)
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))

    def ours(q, k, v, ids):
        out = tpu.splash_attention(q, k, v, ids, mask=mask, block_sizes=bs, interpret=True)
        return jnp.sum(out.astype(jnp.float32) * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True))(q, k, v, ids)

    heads = mask.heads or 1
    allowed = dense_allowed(ids, mask, heads)
    as64 = lambda x: np.swapaxes(np.asarray(jnp.asarray(x, jnp.float32), np.float64), 1, 2)  # noqa: E731 BSHD
    ref, _ = oracles.attention(as64(q), as64(k), as64(v), allowed, scale=1.0)
    dq, dk, dv = oracles.attention_grads(as64(q), as64(k), as64(v), allowed, np.swapaxes(w, 1, 2), scale=1.0)
    tol = 2e-2 if dtype == jnp.bfloat16 else 2e-4
    np.testing.assert_allclose(bhsd(out.astype(jnp.float32)), ref, atol=tol, rtol=tol)
    padding = np.broadcast_to((ids == 0)[:, None, :, None], out.shape)
    assert np.all(np.asarray(out, np.float32)[padding] == 0)
    gtol = 8e-2 if dtype == jnp.bfloat16 else 1e-3
    for got, want, what in ((grads[0], dq, "dq"), (grads[1], dk, "dk"), (grads[2], dv, "dv")):
        got = bhsd(jnp.asarray(got, jnp.float32))
        assert np.all(np.isfinite(got)), what
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, atol=gtol * scale, rtol=gtol, err_msg=what)

    # Splash with the segment ids alone (the static mask's MaskInfo: every tile of the static mask visited)
    # gives the same values on the rows that are not padding.
    if mask.kind == "per_head":
        return
    splash_mask = {"causal": sm.CausalMask((s, s)), "full": sm.FullMask((s, s)),
                   "window": sm.LocalMask((s, s), (100, 20), 0)}[name]
    kernel = sk.make_splash_mha(sm.MultiHeadMask([splash_mask] * hq), block_sizes=bs, head_shards=1,
                                q_seq_shards=1, interpret=True)
    alone = jax.vmap(lambda q, k, v, i: kernel(q, k, v, segment_ids=sk.SegmentIds(i, i)))(q, k, v, ids)
    real = np.broadcast_to((ids != 0)[:, None, :, None], out.shape)
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(alone, np.float32)[real],
                               atol=tol / 2, rtol=tol / 2)


def test_next_active_is_a_scan_with_wrap_around(rng):
    step = jax.jit(tpu._next_active)
    for n in (1, 2, 7, 64):
        for density in (0.0, 0.1, 0.5, 1.0):
            active = rng.random(n) < density
            coord = rng.integers(0, 100, n).astype(np.int32)
            on = np.flatnonzero(active)
            want = [coord[next((a for a in on if a >= i), on[0])] if len(on) else 0 for i in range(n)]
            np.testing.assert_array_equal(np.asarray(step(jnp.asarray(active), jnp.asarray(coord))),
                                          want)


def jax_process_mask(dense, block, is_dkv):
    """JAX's own MaskInfo of a dense [H, S, S] mask (a NumpyMask per head), grid not shrunk."""
    multi = sm.MultiHeadMask([sm.NumpyMask(h) for h in dense])
    info, _ = smi._process_mask(multi, block, is_dkv, shrink_grid=False)
    return info


@pytest.mark.parametrize("name", ["causal", "window", "per_head"])
@pytest.mark.parametrize("is_dkv", [False, True])
def test_traced_mask_info_is_what_process_mask_gives_each_rows_dense_mask(rng, name, is_dkv):
    s, block = 1024, (256, 128)
    mask = MASKS[name]
    ids = np.stack([packed_ids(rng, s, 9, 0), packed_ids(rng, s, 1, 0), packed_ids(rng, s, 30, 0)])
    bs = sk.BlockSizes(block_q=block[0], block_kv=block[1], block_q_dkv=block[0], block_kv_dkv=block[1],
                       block_q_dq=block[0], block_kv_dq=block[1])
    meta = jax.jit(lambda i: tpu.splash_mask_info(i, mask=mask, block_sizes=bs))(ids)
    info = meta.dkv if is_dkv else meta.forward
    heads = mask.heads or 1
    allowed = dense_allowed(ids, mask, heads)
    for r in range(len(ids)):
        want = jax_process_mask(allowed[r], block, is_dkv)
        np.testing.assert_array_equal(np.asarray(info.block_mask[r]), want.block_mask, err_msg=f"row {r}")
        np.testing.assert_array_equal(np.asarray(info.data_next[r]), want.data_next, err_msg=f"row {r}")
        if info.mask_next is None:
            continue
        # Partial blocks are numbered differently (ours are the static mask's plus an all-ones block): compare
        # the element masks the two MaskInfos give every partial tile.
        ours = np.asarray(info.partial_mask_blocks)[np.asarray(info.mask_next[r], np.int64)]
        theirs = want.partial_mask_blocks[want.mask_next.astype(np.int64)]
        partial = want.block_mask == 1
        tile_ids = np.broadcast_to(np.asarray(ids[r]), (s,))
        for h, i, j in zip(*np.nonzero(partial)):
            q0, k0 = i * block[0], j * block[1]  # [h, q-block, kv-block] in both passes
            seg = tile_ids[q0:q0 + block[0], None] == tile_ids[None, k0:k0 + block[1]]
            mine = ours[h, i, j] & (seg.T if is_dkv else seg)
            np.testing.assert_array_equal(mine, theirs[h, i, j], err_msg=f"row {r} tile {(h, i, j)}")


def test_blocks_computed_are_the_blockmask_tiles(rng):
    """The grid steps that compute are the non-empty tiles of the C++ BlockMask of that row (with its
    classes; the forward pass also visits each padding token's own tile), a subset of the tiles Splash visits with the segment ids alone (the ratio of the
    two counts is bench/python/bench_tpu_metadata.py's)."""
    s, block = 8192, 512
    ids = np.stack([packed_ids(rng, s, 16, 0), packed_ids(rng, s, 16, 300)])
    mask = seqattn.CausalMask()
    bs = sk.BlockSizes(block_q=block, block_kv=block, block_q_dkv=block, block_kv_dkv=block, block_q_dq=block,
                       block_kv_dq=block)
    meta = jax.jit(lambda i: tpu.splash_mask_info(i, mask=mask, block_sizes=bs))(ids)
    static = smi._process_mask(sm.MultiHeadMask([sm.CausalMask((s, s))]), (block, block), False, shrink_grid=False)[0]
    for r, row in enumerate(ids):
        classes = np.asarray(seqattn.DocumentMask(row[None, :], inner=mask).block_mask(block_size=(block, block)).classes())
        padding = np.zeros(classes.shape[2:], bool)
        for t in np.flatnonzero(row == 0):
            padding[t // block, t // block] = True
        want = np.where((classes[0, 0] == 0) & padding, 1, classes[0, 0])
        got = np.asarray(meta.forward.block_mask[r, 0])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.asarray(meta.dkv.block_mask[r, 0]), classes[0, 0])
        got = got != 0
        assert not np.any(got & (static.block_mask[0] == 0))  # a subset of Splash's tiles with the ids alone


def test_errors_name_the_argument():
    ids = np.ones((1, 512), np.int32)
    q = jnp.zeros((1, 2, 512, 128), jnp.float32)
    with pytest.raises(ValueError, match="ChunkedCausalMask.*own coordinates"):
        tpu.splash_mask_info(ids, mask=seqattn.ChunkedCausalMask(64))
    with pytest.raises(ValueError, match="head 1"):
        tpu.splash_mask_info(ids, mask=seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.PrefixLMMask(3)]))
    with pytest.raises(ValueError, match=r"multiple of the forward block sizes \(128, 128\)"):
        tpu.splash_mask_info(np.ones((1, 500), np.int32))
    with pytest.raises(ValueError, match=r"k \[B, Hkv, S, D\].*'k': \(1, 2, 256, 128\)"):
        tpu.splash_attention(q, jnp.zeros((1, 2, 256, 128)), q, ids)
    with pytest.raises(ValueError, match="3 heads"):
        tpu.splash_attention(q, jnp.zeros((1, 3, 512, 128)), jnp.zeros((1, 3, 512, 128)), ids)
    with pytest.raises(ValueError, match="mask=.* has 3 heads; q has 2"):
        tpu.splash_attention(q, q, q, ids, mask=seqattn.PerHeadMask([seqattn.CausalMask()] * 3))


@pytest.mark.parametrize("name,blocks", [("causal", (128, 128)), ("window", (256, 128))])
def test_tokamax_on_traced_metadata_matches_reference(rng, name, blocks):
    """tokamax's dynamic-grid Splash on seqattn.tpu.tokamax_mask_info (interpret mode): values and gradients
    against float64, the listed tiles against the C++ BlockMask."""
    tk = pytest.importorskip("tokamax._src.ops.experimental.tpu.splash_attention.splash_attention_kernel")
    b, hq, hkv, s, d = 2, 2, 1, 512, 128
    mask = MASKS[name]
    bq, bkv = blocks
    config = tk.SplashConfig(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                             block_kv_dkv_compute=bkv)
    ids = batch_ids(rng, s)
    q = jnp.asarray(rng.standard_normal((b, hq, s, d)) * 0.3, jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, hkv, s, d)), jnp.float32) for _ in range(2))
    w = rng.standard_normal((b, hq, s, d)).astype(np.float32)

    def ours(q, k, v, ids):
        out = tpu.splash_attention(q, k, v, ids, mask=mask, block_sizes=config, interpret=True,
                                   implementation="tokamax")
        return jnp.sum(out * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True))(q, k, v, ids)
    allowed = dense_allowed(ids, mask, 1)
    as64 = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    ref, _ = oracles.attention(as64(q), as64(k), as64(v), allowed, scale=1.0)
    dq, dk, dv = oracles.attention_grads(as64(q), as64(k), as64(v), allowed, np.swapaxes(w, 1, 2), scale=1.0)
    np.testing.assert_allclose(bhsd(out), ref, atol=2e-4, rtol=2e-4)
    for got, want, what in ((grads[0], dq, "dq"), (grads[1], dk, "dk"), (grads[2], dv, "dv")):
        np.testing.assert_allclose(bhsd(got), want, atol=1e-3 * max(1.0, np.abs(want).max()), rtol=1e-3,
                                   err_msg=what)

    meta = jax.jit(lambda i: tpu.tokamax_mask_info(i, mask=mask, config=config))(ids)
    dense_dkv = jax.jit(lambda i: tpu.tokamax_mask_info(i, mask=mask, config=config).dkv)(ids)
    dynamic = dataclasses.replace(config, dq_reduction_steps=3)
    meta = meta._replace(dkv=jax.jit(lambda i: tpu.tokamax_mask_info(i, mask=mask, config=dynamic).dkv)(ids))
    for r, row in enumerate(ids):
        classes = np.asarray(seqattn.DocumentMask(row[None, :], inner=mask).block_mask(
            block_size=(bq, bkv)).classes())[0, 0]
        count = int(meta.dkv.num_active_blocks[r, 0])
        listed = np.zeros_like(classes)
        rows, cols = np.asarray(meta.dkv.active_rows[r, :count]), np.asarray(meta.dkv.active_cols[r, :count])
        listed[cols, rows] = np.asarray(meta.dkv.block_mask[r, :count])
        extension = ~(classes != 0).any(axis=0)  # kv-blocks no query sees: visited at q-block 0, class 0
        np.testing.assert_array_equal(listed, classes)
        assert count == int((classes != 0).sum() + extension.sum())
        assert np.all(np.diff(rows * classes.shape[0] + cols) > 0)  # kv-block-major order
        np.testing.assert_array_equal(np.asarray(dense_dkv.block_mask[r]), classes.T.ravel())  # the dense grid
        assert dense_dkv.active_rows is None
        fwd_count = int(meta.forward.num_active_blocks[r, 0])
        fwd_rows = np.asarray(meta.forward.active_rows[r, :fwd_count])
        fwd_cols = np.asarray(meta.forward.active_cols[r, :fwd_count])
        padding = np.zeros(classes.shape, bool)  # the forward pass also visits a padding token's own tile
        for t in np.flatnonzero(row == 0):
            padding[t // bq, t // bkv] = True
        np.testing.assert_array_equal(np.stack([fwd_rows, fwd_cols], 1), np.argwhere((classes != 0) | padding))
