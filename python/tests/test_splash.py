"""Splash MaskInfo parity: seqattn.splash against JAX's own _process_mask (CPU).

Every array of MaskInfo (values and dtype) for every mask kind Splash has, the
forward and the dK/dV pass, with head and q-sequence sharding, plus the pair
_process_mask returns (the in-kernel mask_function) and the kernel
construction path, and the kernel itself run in Pallas interpret mode on the CPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi

import oracles
import seqattn
from seqattn import splash

FIELDS = ("data_next", "mask_next", "block_mask", "partial_mask_blocks", "q_sequence")


def assert_same_info(got, want):
    for field in FIELDS:
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None) == (w is None), f"{field}: seqattn {g is None and 'None' or 'array'}, jax {w is None and 'None' or 'array'}"
        if w is None:
            continue
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"{field}: dtype {g.dtype} vs jax {w.dtype}"
        assert g.shape == w.shape, f"{field}: shape {g.shape} vs jax {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=field)


def cases():
    """(name, jax multi-head mask, seqattn mask, q_len, kv_len, heads)."""
    rng = np.random.default_rng(9)
    out = []
    for q_len, kv_len in ((256, 256), (128, 384), (384, 128)):
        shape = (q_len, kv_len)
        out.append(("full", [sm.FullMask(shape)], seqattn.FullMask(), shape))
        out.append(("causal", [sm.CausalMask(shape)], seqattn.CausalMask(), shape))
        off = kv_len - q_len
        out.append(("causal_bottom_right", [sm.CausalMask(shape, offset=off)], seqattn.CausalMask("bottom_right"), shape))
        if off >= 0:
            # Splash's offset as a window's right side (top-left): kv <= q + 40.
            out.append(("causal_offset", [sm.CausalMask(shape, offset=40)], seqattn.SlidingWindowMask(-1, 40), shape))
        for left, right in ((64, 0), (100, 30), (None, 16), (48, None)):
            sl = -1 if left is None else left
            sr = -1 if right is None else right
            out.append((f"local_{left}_{right}", [sm.LocalMask(shape, (left, right), offset=0)],
                        seqattn.SlidingWindowMask(sl, sr), shape))
            out.append((f"local_{left}_{right}_br", [sm.LocalMask(shape, (left, right), offset=off)],
                        seqattn.SlidingWindowMask(sl, sr, "bottom_right"), shape))
        for chunk in (32, 100, 128):
            out.append((f"chunked_{chunk}", [sm.ChunkedCausalMask(shape, chunk)], seqattn.ChunkedCausalMask(chunk), shape))
        dense = rng.random(shape) < 0.3
        out.append(("numpy_random", [sm.NumpyMask(dense)], seqattn.DenseMask(dense), shape))
        if q_len == kv_len:
            ids = oracles.document_pattern(rng, q_len)
            doc = (ids[:, None] == ids[None, :]) & (np.arange(q_len)[:, None] >= np.arange(q_len)[None, :])
            out.append(("numpy_documents", [sm.NumpyMask(doc)],
                        seqattn.DocumentMask(ids[None, :], inner=seqattn.CausalMask()), shape))
    # Different masks per head (MultiHeadMask), some shared, so shards see one or several.
    shape = (256, 256)
    heads = [sm.CausalMask(shape), sm.CausalMask(shape), sm.LocalMask(shape, (64, 0), 0),
             sm.LocalMask(shape, (64, 0), 0)]
    ours = [seqattn.CausalMask(), seqattn.CausalMask(), seqattn.SlidingWindowMask(64, 0),
            seqattn.SlidingWindowMask(64, 0)]
    out.append(("per_head_pairs", heads, seqattn.PerHeadMask(ours), shape))
    order = [0, 2, 1, 3]
    out.append(("per_head_mixed", [heads[i] for i in order], seqattn.PerHeadMask([ours[i] for i in order]), shape))
    dense = [rng.random(shape) < p for p in (0.2, 0.5)]
    out.append(("per_head_numpy", [sm.NumpyMask(d) for d in dense] + [sm.FullMask(shape), sm.NumpyMask(dense[0])],
                seqattn.PerHeadMask([seqattn.DenseMask(d) for d in dense] + [seqattn.FullMask(),
                                                                              seqattn.DenseMask(dense[0])]), shape))
    return out


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[3][0]}x{c[3][1]}" for c in CASES])
@pytest.mark.parametrize("is_dkv", [False, True], ids=["fwd", "dkv"])
def test_mask_info_matches_process_mask(case, is_dkv):
    name, jax_masks, ours, (q_len, kv_len) = case
    n_heads = 4 if len(jax_masks) == 1 else len(jax_masks)
    multi = sm.MultiHeadMask(tuple(jax_masks * n_heads if len(jax_masks) == 1 else jax_masks))
    compared = 0
    for block in ((128, 128), (64, 128), (128, 64)):
        for head_shards in (1, 2, 4):
            for q_seq_shards in (1, 2):
                if (q_len // q_seq_shards) % block[0]:
                    continue
                kw = dict(downcast_smem_data=True, head_shards=head_shards, q_seq_shards=q_seq_shards)
                try:
                    want, want_fn = smi._process_mask(multi, block, is_dkv, **kw)
                except (AssertionError, ValueError) as e:
                    # Upstream limits (a q shard with no tile, no partial tile with q shards): seqattn either
                    # raises too or returns what the arrays mean; compare only where jax answers.
                    print(f"jax raised for {name} {block} {kw}: {type(e).__name__}")
                    continue
                got, got_fn = splash.process_mask(ours, block, is_dkv, q_len=q_len, kv_len=kv_len, heads=n_heads,
                                                  **kw)
                assert_same_info(got, want)
                assert (got_fn is None) == (want_fn is None), name
                if want_fn is not None:
                    qi = np.arange(q_len)[:, None]
                    ki = np.arange(kv_len)[None, :]
                    np.testing.assert_array_equal(got_fn(qi, ki), want_fn(qi, ki))
                compared += 1
    assert compared >= 6


@pytest.mark.parametrize("is_dkv", [False, True], ids=["fwd", "dkv"])
def test_no_shrink_and_no_downcast(is_dkv):
    shape = (512, 512)
    multi = sm.MultiHeadMask((sm.LocalMask(shape, (100, 0), 0),) * 2)
    for shrink in (False, True):
        for downcast in (False, True):
            want, _ = smi._process_mask(multi, (64, 64), is_dkv, downcast_smem_data=downcast, shrink_grid=shrink,
                                        q_seq_shards=2)
            got = splash.mask_info(seqattn.SlidingWindowMask(100, 0), 64, 64, q_len=512, heads=2, is_dkv=is_dkv,
                                   downcast_smem_data=downcast, shrink_grid=shrink, q_seq_shards=2)
            assert_same_info(got, want)


def test_int16_dtypes_on_long_masks():
    # 40 000 / 8 = 5000 kv blocks: data_next needs int16, mask_next (one tile per distinct pattern) too for dense.
    shape = (64, 40000)
    rng = np.random.default_rng(3)
    dense = rng.random(shape) < 0.5
    multi = sm.MultiHeadMask((sm.NumpyMask(dense),))
    want, _ = smi._process_mask(multi, (64, 8), False)
    got = splash.mask_info(seqattn.DenseMask(dense), 64, 8)
    assert_same_info(got, want)
    assert got.data_next.dtype == np.int16


def test_document_window_and_kinds_splash_lacks_match_numpy_masks():
    # Splash has no document + window, prefix-LM or multi-item class: seqattn must equal Splash's NumpyMask
    # of the same dense pattern.
    rng = np.random.default_rng(1)
    n = 512
    ids = oracles.document_pattern(rng, n)
    masks = [
        seqattn.DocumentMask(ids[None, :], inner=seqattn.SlidingWindowMask(40, 0)),
        seqattn.PrefixLMMask(200),
        seqattn.MultiItemMask(np.array([5] * 100 + [1] + [7] * 150 + [1] + [8] * 130 + [1] + [9] * 128 + [1]), 1),
    ]
    for m in masks:
        dense = m.to_dense(n, n)[0, 0]
        assert dense.shape == (n, n)
        for is_dkv in (False, True):
            want, _ = smi._process_mask(sm.MultiHeadMask((sm.NumpyMask(dense),) * 2), (128, 128), is_dkv,
                                        head_shards=2)
            got, fn = splash.process_mask(m, (128, 128), is_dkv, q_len=n, kv_len=n, heads=2, head_shards=2)
            assert fn is None
            assert_same_info(got, want)


def test_block_mask_input_and_batch_index():
    ids = np.array([[1] * 128 + [2] * 128, [1] * 256], np.int32)
    m = seqattn.DocumentMask(ids, inner=seqattn.CausalMask())
    bm = m.block_mask(block_size=(64, 64), heads=2)
    for b in range(2):
        doc = (ids[b][:, None] == ids[b][None, :]) & np.tri(256, dtype=bool)
        want, _ = smi._process_mask(sm.MultiHeadMask((sm.NumpyMask(doc),) * 2), (64, 64), False)
        assert_same_info(splash.mask_info(bm, 64, 64, heads=2, batch_index=b), want)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"block shape \(128, 128\) must divide the mask shape \(200, 256\)"):
        splash.mask_info(seqattn.CausalMask(), 128, 128, q_len=200, kv_len=256)
    with pytest.raises(ValueError, match="head_shards=3 must be positive and divide heads=4"):
        splash.mask_info(seqattn.CausalMask(), 128, 128, q_len=256, heads=4, head_shards=3)
    with pytest.raises(ValueError, match="holds 2 sequences"):
        splash.mask_info(seqattn.DocumentMask(np.ones((2, 128), np.int32)), 128, 128)


def test_make_splash_kernel_builds_from_seqattn_mask_info():
    bs = sk.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128, block_kv_dkv=128,
                       block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
    kernel = splash.make_splash_kernel(seqattn.CausalMask(), bs, q_len=512, heads=2)
    ref = sk.make_splash_mha(sm.MultiHeadMask((sm.CausalMask((512, 512)),) * 2), block_sizes=bs, head_shards=1,
                             q_seq_shards=1)
    assert isinstance(kernel, sk.SplashAttentionKernel)
    for ours, theirs in ((kernel.fwd_mask_info, ref.fwd_mask_info), (kernel.dq_mask_info, ref.dq_mask_info),
                         (kernel.dkv_mask_info, ref.dkv_mask_info)):
        assert_same_info(splash.NumpyMaskInfo(*[None if x is None else np.asarray(x) for x in ours]),
                         smi.MaskInfo(*theirs))
    assert kernel.kwargs["mask_function"] is not None
    assert set(kernel.kwargs) == set(ref.kwargs)


def test_splash_kernel_runs_with_seqattn_mask_info_in_interpret_mode():
    # The Pallas TPU kernel in interpret mode (on the CPU) reads our MaskInfo: stored deduplicated tiles
    # (documents + window, a kind Splash lacks) and an in-kernel mask (causal). Splash does not scale the
    # logits, so the reference uses scale 1.
    n, heads, d = 256, 2, 128
    ids = np.repeat(np.array([1, 2, 3], np.int32), [100, 90, 66])
    masks = [seqattn.DocumentMask(ids[None, :], inner=seqattn.SlidingWindowMask(40, 0)), seqattn.CausalMask()]
    bs = sk.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(kk, (heads, n, d), jnp.float32) for kk in keys)
    for m in masks:
        kernel = splash.make_splash_kernel(m, bs, q_len=n, heads=heads, interpret=True)
        out = np.asarray(kernel(q, k, v))
        allowed = m.to_dense(n, n)[0, 0]
        s = np.einsum("hqd,hkd->hqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
        s = np.where(allowed[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("hqk,hkd->hqd", p / p.sum(-1, keepdims=True), np.asarray(v, np.float64))
        np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3)
