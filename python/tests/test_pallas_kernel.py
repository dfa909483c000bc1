"""seqattn's Pallas flash attention (seqattn.pallas.kernel): values in interpret mode, lowering for TPU.

Values: output, LSE and every gradient (q, k, v, sinks) against a float64 NumPy reference on the dense mask the
layout describes (``dense_from_layout``, the segment-id predicate included), and against the C++ engine on the same
mask. Work: the grid steps that computed equal the layout's listed blocks. Lowering: ``jax.export`` for TPU with
``interpret=False`` runs the real Pallas-to-Mosaic lowering of the three kernels for every configuration.
Interpret mode is slow: shapes stay at 2-4 heads and a few hundred tokens.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import seqattn  # noqa: E402
from seqattn.pallas import dense_from_layout, layout_from_dense, validate  # noqa: E402
from seqattn.pallas.kernel import attention, flash_attention, grid_steps, window  # noqa: E402
from seqattn.pallas.layout import PREDICATE_TILE, BlockLayout, fetch_indices  # noqa: E402

BLOCK = 128


# ---------------------------------------------------------------------------------------------------------------
# float64 reference


def reference(q, k, v, allowed, do, dlse, *, scale=None, softcap=None, sinks=None, pv=False):
    """out, lse, dq, dk, dv, dsinks of the engine's semantics in float64. allowed [B, Hm, Sq, Skv]. ``pv``: also
    each row's sum_j p_ij |v_j| [B, H, Sq, D] (the bf16 error bound's scale)."""
    q, k, v, do, dlse = (np.asarray(x, np.float64) for x in (q, k, v, do, dlse))
    h, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    kr, vr = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
    scale = 1 / np.sqrt(d) if scale is None else scale
    x = scale * np.einsum("bhqd,bhkd->bhqk", q, kr)
    t = np.tanh(x / softcap) if softcap else None
    s = softcap * t if softcap else x
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None])
    m_safe = np.where(np.isfinite(m), m, 0.0)
    total = np.exp(s - m_safe[..., None]).sum(-1)
    if sinks is not None:
        total += np.exp(np.asarray(sinks, np.float64)[None, :, None] - m_safe)
    lse = np.where(total > 0, m_safe + np.log(np.where(total > 0, total, 1)), -np.inf)
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)
    p = np.where(allowed, np.exp(s - lse_safe[..., None]), 0.0)
    out = np.einsum("bhqk,bhkd->bhqd", p, vr)
    dp = np.einsum("bhqd,bhkd->bhqk", do, vr)
    delta = (do * out).sum(-1) - dlse
    ds = p * (dp - delta[..., None])
    if softcap:
        ds = ds * (1 - t * t)
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, kr)
    group = lambda a: a.reshape(a.shape[0], hkv, h // hkv, *a.shape[2:]).sum(2)  # noqa: E731
    dk = group(scale * np.einsum("bhqk,bhqd->bhkd", ds, q))
    dv = group(np.einsum("bhqk,bhqd->bhkd", p, do))
    dsinks = None
    if sinks is not None:
        dsinks = -(np.exp(np.asarray(sinks, np.float64)[None, :, None] - lse) * delta).sum((0, 2))
    if pv:
        return out, lse, dq, dk, dv, dsinks, np.einsum("bhqk,bhkd->bhqd", p, np.abs(vr))
    return out, lse, dq, dk, dv, dsinks


def run(q, k, v, layout, do, dlse, **kw):
    """flash_attention in interpret mode: (out, lse) and the gradients (dq, dk, dv[, dsinks]) for (do, dlse)."""
    sinks = kw.pop("sinks", None)

    def f(q, k, v, *sinks):
        return flash_attention(q, k, v, layout, sinks=sinks[0] if sinks else None, return_lse=True, interpret=True,
                               **kw)

    args = (q, k, v) + (() if sinks is None else (jnp.asarray(sinks, jnp.float32),))
    (out, lse), vjp = jax.vjp(f, *args)
    return out, lse, vjp((jnp.asarray(do, out.dtype), jnp.asarray(dlse, jnp.float32)))


def operands(rng, b, h, hkv, sq, skv, d, dtype=np.float32):
    q = rng.standard_normal((b, h, sq, d))
    k = rng.standard_normal((b, hkv, skv, d))
    v = rng.standard_normal((b, hkv, skv, d))
    do = rng.standard_normal((b, h, sq, d))
    dlse = rng.standard_normal((b, h, sq))
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(do), dlse.astype(np.float32)


BF16_U = 2.0**-8  # bf16's unit roundoff (8 significand bits)


def check(rng, layout, q, k, v, do, dlse, *, predicate=None, **kw):
    """Kernel vs float64 reference on the layout's dense mask (on the same, possibly bf16-rounded, inputs), element
    by element.

    fp32: 2e-4 (fp32 accumulation over a few hundred keys). bf16 inputs: the kernel multiplies bf16 operands exactly
    into fp32 and accumulates in fp32, so its logits and LSE are the fp32 kernel's (fp32 tolerance); its rounding
    steps are p cast to bf16 before ``p @ v`` (at most u = 2^-8 of each p_ij, so u * sum_j p_ij |v_j| per output
    element) and the output cast (u * |out|): the output bound is u * (sum_j p_ij |v_j| + |out|) per element.
    Gradients round ds / p to bf16 and read the bf16 output through delta; they compare per head, relative to the
    head's largest value, within 8u."""
    allowed = dense_from_layout(layout, predicate=predicate)
    out, lse, grads = run(q, k, v, layout, do, dlse, **kw)
    f32 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)  # noqa: E731
    ref = reference(f32(q), f32(k), f32(v), allowed, f32(do), dlse, scale=kw.get("scale"), softcap=kw.get("softcap"),
                    sinks=kw.get("sinks"), pv=True)
    bf16 = q.dtype == jnp.bfloat16
    tol = dict(rtol=2e-4, atol=2e-4)
    lse = np.asarray(lse)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref[1]))  # fully masked rows: -inf exactly
    finite = np.isfinite(ref[1])
    np.testing.assert_allclose(lse[finite], ref[1][finite], **tol)
    if bf16:
        bound = BF16_U * (ref[6] + np.abs(ref[0])) + 1e-6
        err = np.abs(f32(out) - ref[0])
        assert np.all(err <= bound), f"out: worst error / bound {np.max(err / bound):.3g}"
    else:
        np.testing.assert_allclose(f32(out), ref[0], **tol)
    assert np.all(f32(out)[~finite] == 0.0)
    grad_tol = dict(rtol=8 * BF16_U, atol=8 * BF16_U) if bf16 else tol
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, ref[2:6]):
        # Gradients sum many terms: compare relative to their size, per head (one head's large values must not
        # hide another's errors).
        axes = tuple(range(2, want.ndim))
        scale = np.maximum(1.0, np.abs(want).max(axis=axes, keepdims=True)) if axes else np.maximum(1.0, np.abs(want))
        np.testing.assert_allclose(f32(got) / scale, want / scale, err_msg=name, **grad_tol)
    return allowed, out, lse


def random_mask(rng, b, hm, sq, skv, density=0.6):
    allowed = rng.random((b, hm, sq, skv)) < density
    allowed[:, :, :, :BLOCK] |= rng.random((b, hm, sq, 1)) < 0.5  # some full tiles
    return allowed


def causal(b, hm, sq, skv, offset=0):
    return np.broadcast_to(np.tril(np.ones((sq, skv), bool), offset), (b, hm, sq, skv)).copy()


def as_predicate_only(layout):
    """The layout with every partial tile turned into -2 (its mask is the kernel's predicate alone)."""
    q_tile = np.where(np.asarray(layout.q_tile) >= 0, PREDICATE_TILE, layout.q_tile).astype(np.int32)
    kv_tile = np.where(np.asarray(layout.kv_tile) >= 0, PREDICATE_TILE, layout.kv_tile).astype(np.int32)
    return layout._replace(q_tile=q_tile, q_fetch=fetch_indices(q_tile), kv_tile=kv_tile,
                           kv_fetch=fetch_indices(kv_tile))


def documents(rng, b, s, n_docs):
    """Segment ids [b, s] (contiguous documents, ids from 1) and positions restarting at each document."""
    ids, pos = np.zeros((b, s), np.int32), np.zeros((b, s), np.int32)
    for i in range(b):
        cuts = np.sort(rng.choice(np.arange(1, s), n_docs - 1, replace=False))
        ids[i] = np.searchsorted(cuts, np.arange(s), side="right") + 1
        starts = np.concatenate([[0], cuts])
        pos[i] = np.arange(s) - starts[ids[i] - 1]
    return ids, pos


def inner_mask(ids, pos, inner):
    same = ids[:, :, None] == ids[:, None, :]
    qp, kp = pos[:, :, None], pos[:, None, :]
    if inner == "causal":
        return same & (qp >= kp)
    if inner == "full":
        return same
    _, left, right = inner
    return same & (kp >= qp - left) & (kp <= qp + right)


# ---------------------------------------------------------------------------------------------------------------
# values (interpret mode)


def test_random_per_head_mask_with_empty_rows_f32(rng):
    """Per-head random masks (stored bits) with both q heads on one kv head, sizes not multiples of the block, fully
    masked rows and a fully masked q block (count 0), an LSE cotangent."""
    b, h, sq, skv, d = 1, 2, 300, 260, 64
    allowed = random_mask(rng, b, h, sq, skv)
    allowed[:, :, 7] = False  # one empty row inside a block
    allowed[:, 1, 256:] = False  # head 1's last q block lists nothing
    allowed[:, 0, :, 128:256] = True  # head 0: a column of full tiles
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    validate(layout)
    assert np.asarray(layout.q_count).min() == 0
    check(rng, layout, *operands(rng, b, h, 1, sq, skv, d))


def test_bf16_gqa_window_softcap_sinks_head_dim_128(rng):
    b, h, hkv, s, d = 1, 4, 2, 200, 128
    qi, ki = np.arange(s)[:, None], np.arange(s)[None, :]
    allowed = np.broadcast_to((ki <= qi) & (ki > qi - 100), (b, 1, s, s))
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    sinks = rng.standard_normal(h).astype(np.float32)
    check(rng, layout, *operands(rng, b, h, hkv, s, s, d, jnp.bfloat16), softcap=3.0, sinks=sinks, scale=0.2)


def test_sinks_on_fully_masked_rows_give_the_sink_as_lse_head_dim_256(rng):
    b, h, s, d = 1, 2, 200, 256
    allowed = causal(b, 1, s, s)
    allowed[:, :, 130:140] = False
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    sinks = np.array([0.5, -1.0], np.float32)
    q, k, v, do, dlse = operands(rng, b, h, 2, s, s, d)
    _, out, lse = check(rng, layout, q, k, v, do, dlse, sinks=sinks)
    np.testing.assert_array_equal(np.asarray(lse)[0, :, 135], sinks)
    assert np.all(np.asarray(out)[0, :, 130:140] == 0)


def test_documents_predicate_only_tiles_gqa(rng, inner="causal"):
    """-2 tiles: the element mask is the segment-id predicate (documents, causal at reset positions) alone. (The
    window over reset positions: test_thd_window_agrees_with_the_cpu_engine.)"""
    b, h, hkv, s, d = 2, 2, 1, 280, 64
    ids, pos = documents(rng, b, s, 4)
    pred = inner_mask(ids, pos, inner)
    layout = as_predicate_only(layout_from_dense(pred[:, None], block_q=BLOCK, block_kv=BLOCK))
    assert np.any(np.asarray(layout.q_tile) == PREDICATE_TILE)
    allowed, _, _ = check(rng, layout, *operands(rng, b, h, hkv, s, s, d), predicate=pred,
                    segment_ids=(ids, ids), positions=(pos, pos), inner=inner)
    np.testing.assert_array_equal(allowed[:, 0], pred)  # the layout and predicate together are the document mask


def test_stored_bits_and_predicate_compose_with_window(rng):
    """Stored bits AND ids AND a window over token indices (no positions given); q and kv lengths differ; a head
    dim (72) that is no multiple of the lanes."""
    b, h, sq, skv, d = 1, 1, 200, 300, 72
    ids_q, ids_kv = np.ones((b, sq), np.int32), np.ones((b, skv), np.int32)
    ids_q[:, 150:], ids_kv[:, 220:] = 2, 2
    bits = random_mask(rng, b, 1, sq, skv, density=0.8)
    layout = layout_from_dense(bits, block_q=BLOCK, block_kv=BLOCK)
    qi, ki = np.arange(sq)[:, None], np.arange(skv)[None, :]
    pred = (ids_q[:, :, None] == ids_kv[:, None, :]) & (ki >= qi - 40) & (ki <= qi + 90)
    check(rng, layout, *operands(rng, b, h, h, sq, skv, d), predicate=pred, segment_ids=(ids_q, ids_kv),
          inner=window(40, 90))


def test_paged_kv_with_shuffled_page_table(rng):
    """K/V in 128-token pages read through a shuffled table, a ragged batch: sequence 1 holds 170 of the 300 keys,
    the rest of its pages are stale (NaN) and must not reach any result; one page belongs to no sequence (its
    gradient is 0)."""
    b, h, hkv, sq, skv, d = 2, 2, 1, 200, 300, 64
    kv_lens = [skv, 170]
    per_seq = 3
    n_pages = b * per_seq + 1
    table = rng.permutation(n_pages)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
    unused = np.setdiff1d(np.arange(n_pages), table)
    allowed = causal(b, 1, sq, skv, offset=skv - sq)  # a prefix-extended causal mask
    allowed[1, :, :, kv_lens[1]:] = False
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    q, k, v, do, dlse = operands(rng, b, h, hkv, sq, skv, d)
    pad = per_seq * BLOCK - skv

    def to_pages(x):  # [B, Hkv, Skv, D] -> [pages, Hkv, page, D] through the table, stale keys NaN
        x = np.pad(np.asarray(x), ((0, 0), (0, 0), (0, pad), (0, 0)), constant_values=np.nan)
        x[1, :, kv_lens[1]:] = np.nan
        pages = np.full((n_pages, hkv, BLOCK, d), np.nan, np.float32)
        pages[table.reshape(-1)] = x.reshape(b, hkv, per_seq, BLOCK, d).transpose(0, 2, 1, 3, 4).reshape(-1, hkv,
                                                                                                        BLOCK, d)
        return jnp.asarray(pages)

    out, lse, (dq, dkp, dvp) = run(q, to_pages(k), to_pages(v), layout, do, dlse, page_table=jnp.asarray(table))
    ref = reference(q, k, v, allowed, do, dlse)
    np.testing.assert_allclose(np.asarray(out), ref[0], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.asarray(lse), ref[1], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.asarray(dq), ref[2], rtol=2e-4, atol=2e-4)
    for got, want in ((dkp, ref[3]), (dvp, ref[4])):
        got = np.asarray(got)
        assert np.all(got[unused] == 0)
        seq = got[table.reshape(-1)].reshape(b, per_seq, hkv, BLOCK, d).transpose(0, 2, 1, 3, 4)
        seq = seq.reshape(b, hkv, per_seq * BLOCK, d)
        np.testing.assert_allclose(seq[:, :, :skv], want, rtol=2e-4, atol=2e-4)
        assert np.all(seq[:, :, skv:] == 0) and np.all(seq[1, :, kv_lens[1]:] == 0)  # keys past a sequence: none


def test_agrees_with_the_cpu_engine(rng):
    """The same DenseMask through seqattn.attention / attention_backward (BSHD) and through the kernel."""
    b, h, hkv, sq, skv, d = 1, 2, 1, 200, 230, 64
    allowed = random_mask(rng, b, h, sq, skv)
    allowed[:, :, 3] = False
    q, k, v, do, _ = operands(rng, b, h, hkv, sq, skv, d)
    sinks = np.array([0.3, -0.2], np.float32)
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    bshd = lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 2, 1, 3))  # noqa: E731
    mask = seqattn.DenseMask(allowed)
    e_out, e_lse = seqattn.attention(bshd(q), bshd(k), bshd(v), mask, softcap=5.0, sinks=sinks)
    out, lse = flash_attention(q, k, v, layout, softcap=5.0, sinks=sinks, return_lse=True, interpret=True)
    np.testing.assert_allclose(np.asarray(out), bshd(e_out), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), e_lse, rtol=1e-5, atol=1e-5)
    # Without sinks, through the BSHD entry point on BSHD arrays (the engine's layout in and out), with gradients.
    e_out, e_lse = seqattn.attention(bshd(q), bshd(k), bshd(v), mask, softcap=5.0)
    e_dq, e_dk, e_dv = seqattn.attention_backward(bshd(q), bshd(k), bshd(v), e_out, e_lse, bshd(do), mask, softcap=5.0)

    def f(q, k, v):
        return attention(q, k, v, layout, qkv_layout="bshd", softcap=5.0, return_lse=True, interpret=True)

    (out, lse), vjp = jax.vjp(f, *(jnp.asarray(bshd(a)) for a in (q, k, v)))
    np.testing.assert_allclose(np.asarray(out), e_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), e_lse, rtol=1e-5, atol=1e-5)
    grads = vjp((jnp.asarray(bshd(do)), jnp.zeros((b, h, sq), jnp.float32)))
    for name, got, want in zip(("dq", "dk", "dv"), grads, (e_dq, e_dk, e_dv)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_predicate_agrees_with_the_cpu_engine_document_mask(rng):
    """The kernel's segment-id predicate (-2 tiles, causal at positions) means what the engine's DocumentMask means,
    id 0 included: a padding tail (id 0) inside a partial tile attends to nothing, itself included. Same output
    and LSE."""
    b, h, s, d = 2, 2, 260, 64
    ids, pos = documents(rng, b, s, 3)
    ids[:, 230:] = 0  # padding inside the last (partial) tile
    dense = np.asarray(seqattn.to_dense(seqattn.DocumentMask(ids, pos, seqattn.CausalMask()), s, s), bool)
    dense = dense.reshape(b, 1, s, s)
    assert not dense[:, :, 230:].any() and not dense[:, :, :, 230:].any()
    layout = as_predicate_only(layout_from_dense(dense, block_q=BLOCK, block_kv=BLOCK))
    q, k, v, _, _ = operands(rng, b, h, h, s, s, d)
    bshd = lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 2, 1, 3))  # noqa: E731
    e_out, e_lse = seqattn.attention(bshd(q), bshd(k), bshd(v), seqattn.DocumentMask(ids, pos, seqattn.CausalMask()))
    out, lse = flash_attention(q, k, v, layout, segment_ids=(ids, ids), positions=(pos, pos), inner="causal",
                               return_lse=True, interpret=True)
    np.testing.assert_allclose(np.asarray(out), bshd(e_out), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), e_lse, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(out)[:, :, 230:] == 0) and np.all(np.isneginf(np.asarray(lse)[:, :, 230:]))


def test_hidden_garbage_never_reaches_a_result(rng):
    """The engine's NaN policy: a value the mask hides is never read into a result. Key 5 (in range, inside a
    partial tile) is hidden from every query and holds NaN in K and V; query 7 sees no key and holds NaN in q and
    dO. Every output, LSE and gradient must be the reference's on clean inputs (hidden rows get 0 gradient)."""
    b, h, s, d = 1, 1, 256, 64
    allowed = causal(b, 1, s, s)
    allowed[:, :, :, 5] = False
    allowed[:, :, 7] = False
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    q, k, v, do, dlse = operands(rng, b, h, h, s, s, d)
    dlse[:, :, 7] = 0.0
    ref = reference(q, k, v, allowed, do, dlse)
    dirty = lambda a, i: jnp.asarray(a).at[:, :, i].set(jnp.nan)  # noqa: E731
    out, lse, (dq, dk, dv) = run(dirty(q, 7), dirty(k, 5), dirty(v, 5), layout, dirty(do, 7), dlse)
    for name, got, want in (("out", out, ref[0]), ("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        got = np.asarray(got)
        assert not np.isnan(got).any(), f"{name}: NaN in rows {np.unique(np.nonzero(np.isnan(got))[2])}"
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=name)
    np.testing.assert_array_equal(np.asarray(lse)[:, :, 7], -np.inf)
    assert np.all(np.asarray(dk)[:, :, 5] == 0) and np.all(np.asarray(dq)[:, :, 7] == 0)


def test_thd_window_agrees_with_the_cpu_engine(rng):
    """Ragged THD through ``attention(qkv_layout="thd", cu_seqlens=...)``: three packed sequences and a padding
    tail, a sliding window in each sequence's own coordinates, MQA; output, LSE and dQ / dK / dV against the
    engine on the same THD arrays, element by element."""
    from seqattn.pallas import static_layout

    t, h, hkv, d = 300, 2, 1, 64
    cu = np.array([0, 90, 250, 280], np.int32)  # tokens 280.. belong to no sequence
    mask = seqattn.SlidingWindowMask(40, 0)
    layout = static_layout(mask, t, cu_seqlens=cu, block_q=BLOCK, block_kv=BLOCK)
    q, k, v, do = (rng.standard_normal((t, n, d)).astype(np.float32) for n in (h, hkv, hkv, h))
    e_out, e_lse = seqattn.attention(q, k, v, mask, cu_seqlens=cu)
    e_dq, e_dk, e_dv = seqattn.attention_backward(q, k, v, e_out, e_lse, do, mask, cu_seqlens=cu)

    def f(q, k, v):
        return attention(q, k, v, layout, qkv_layout="thd", cu_seqlens=jnp.asarray(cu), inner=window(40, 0),
                         return_lse=True, interpret=True)

    (out, lse), vjp = jax.vjp(f, *(jnp.asarray(a) for a in (q, k, v)))
    np.testing.assert_allclose(np.asarray(out), e_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), e_lse, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(("dq", "dk", "dv"), vjp((jnp.asarray(do), jnp.zeros((h, t), jnp.float32))),
                               (e_dq, e_dk, e_dv)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_decode_bottom_right_positions_per_head_masks_mqa(rng):
    """Decode: 8 queries at the end of 300 keys (q_len < one block), bottom-right causal through positions, and
    per-head stored bits (head 1 also a 100-key window) over one kv head."""
    b, h, sq, skv, d = 1, 2, 8, 300, 64
    q_pos = (skv - sq + np.arange(sq, dtype=np.int32))[None]
    kv_pos = np.arange(skv, dtype=np.int32)[None]
    pred = q_pos[:, :, None] >= kv_pos[:, None, :]  # [b, sq, skv]
    bits = np.ones((b, h, sq, skv), bool)
    bits[:, 1] = kv_pos[:, None, :] > q_pos[:, :, None] - 100
    layout = layout_from_dense(bits & pred[:, None], block_q=BLOCK, block_kv=BLOCK)
    check(rng, layout, *operands(rng, b, h, 1, sq, skv, d), predicate=pred, positions=(q_pos, kv_pos),
          inner="causal")


def test_grid_steps_equal_the_listed_blocks(rng):
    """Every pass computes exactly the listed blocks: forward and dQ one step per q-major entry of (b, h's mask row,
    q block); dK/dV one per key-major entry of each q head of the kv head's group."""
    b, h, hkv, sq, skv, d = 2, 4, 2, 300, 260, 64
    allowed = random_mask(rng, b, h, sq, skv, density=0.3)
    allowed[:, :, :, 128:256] &= rng.random((b, h, 1, 1)) < 0.5  # some heads skip the middle kv block
    allowed[0, 1] = False  # a head with no block at all
    layout = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    q, k, v, do, _ = operands(rng, b, h, hkv, sq, skv, d)
    steps = grid_steps(q, k, v, layout, do=do, interpret=True)
    nq, nk = layout.shape.num_q_blocks, layout.shape.num_kv_blocks
    q_count = np.asarray(layout.q_count).reshape(b, h, nq)
    kv_count = np.asarray(layout.kv_count).reshape(b, hkv, h // hkv, nk).sum(2)
    np.testing.assert_array_equal(np.asarray(steps["forward"]), q_count)
    np.testing.assert_array_equal(np.asarray(steps["dq"]), q_count)
    np.testing.assert_array_equal(np.asarray(steps["dkv"]), kv_count)
    assert q_count.sum() < b * h * nq * nk  # the test means something: blocks were skipped


def strided(layout, rng):
    """The layout as a traced builder lays it out: row r at entries r * width .., slots past a row's count filled
    with random (valid) junk the kernel must never use."""
    s = layout.shape
    fields = {}
    for prefix, col, width, n_cols in (("q", "kv", s.q_width, s.num_kv_blocks), ("kv", "q", s.kv_width,
                                                                                 s.num_q_blocks)):
        start, count = np.asarray(getattr(layout, f"{prefix}_start")), np.asarray(getattr(layout, f"{prefix}_count"))
        n_tiles = np.asarray(getattr(layout, f"{prefix}_tiles")).shape[0]
        n = start.size * width
        out = {"col": rng.integers(0, n_cols, n), "tile": rng.integers(PREDICATE_TILE, n_tiles, n),
               "fetch": rng.integers(0, n_tiles, n)}
        for name, src in (("col", col), ("tile", "tile"), ("fetch", "fetch")):
            a = np.asarray(getattr(layout, f"{prefix}_{src}"))
            for r in range(start.size):
                out[name][r * width: r * width + count[r]] = a[start[r]: start[r] + count[r]]
        strided_start = np.arange(start.size) * width
        last = np.maximum.accumulate(np.where(count > 0, strided_start + count - 1, -1))
        before = np.concatenate([[-1], last[:-1]])  # an empty row repeats the last entry listed before it
        fields.update({f"{prefix}_start": np.where(count > 0, strided_start, np.maximum(before, 0)).astype(np.int32),
                       f"{prefix}_{col}": out["col"].astype(np.int32), f"{prefix}_tile": out["tile"].astype(np.int32),
                       f"{prefix}_fetch": out["fetch"].astype(np.int32)})
    return layout._replace(**fields)


def test_fixed_stride_layout_with_junk_past_the_counts(rng):
    """Rows at a fixed stride (a traced builder's form) whose unused slots hold junk give the compact layout's
    results bit for bit: the kernels read nothing past a row's count."""
    b, h, hkv, sq, skv, d = 1, 2, 1, 300, 260, 64
    allowed = random_mask(rng, b, h, sq, skv, density=0.4)
    keep = np.array([[[1, 0, 1], [0, 1, 1], [0, 0, 0]], [[1, 0, 1], [0, 0, 1], [1, 0, 0]]], bool)  # [h, NQ, NK]
    allowed &= np.repeat(np.repeat(keep, BLOCK, 1), BLOCK, 2)[None, :, :sq, :skv]
    compact = layout_from_dense(allowed, block_q=BLOCK, block_kv=BLOCK)
    junk = strided(compact, rng)
    validate(junk)
    for prefix, width in (("q", compact.shape.q_width), ("kv", compact.shape.kv_width)):
        count = np.asarray(getattr(compact, f"{prefix}_count"))
        assert count.min() == 0 and count.max() == width and width > 1  # junk slots, empty rows, full rows
    q, k, v, do, dlse = operands(rng, b, h, hkv, sq, skv, d)
    want = run(q, k, v, compact, do, dlse, softcap=4.0)
    got = run(q, k, v, junk, do, dlse, softcap=4.0)
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_under_jit_with_traced_layout(rng):
    """The layout's arrays may be traced (a device-side builder under jit): same values as with host arrays."""
    b, h, s, d = 1, 2, 200, 64
    layout = layout_from_dense(causal(b, 1, s, s), block_q=BLOCK, block_kv=BLOCK)
    q, k, v, _, _ = operands(rng, b, h, h, s, s, d)
    f = jax.jit(lambda q, k, v, lay: flash_attention(q, k, v, lay, interpret=True))
    np.testing.assert_array_equal(np.asarray(f(q, k, v, layout)),
                                  np.asarray(flash_attention(q, k, v, layout, interpret=True)))


# ---------------------------------------------------------------------------------------------------------------
# bad input: ValueError naming the argument, before any work


def test_bad_input_raises_value_error():
    layout = layout_from_dense(causal(1, 1, 256, 256), block_q=BLOCK, block_kv=BLOCK)
    q = jnp.zeros((1, 2, 256, 64), jnp.float32)
    kv = jnp.zeros((1, 1, 256, 64), jnp.float32)
    cases = [
        (dict(q=q[0]), "q must be"),
        (dict(k=jnp.zeros((1, 1, 256, 64), jnp.bfloat16)), "share float32 or bfloat16"),
        (dict(q=jnp.zeros((1, 2, 256, 32)), k=jnp.zeros((1, 1, 256, 32)), v=jnp.zeros((1, 1, 256, 32))), "head dim"),
        (dict(q=jnp.zeros((1, 3, 256, 64)), k=jnp.zeros((1, 2, 256, 64)), v=jnp.zeros((1, 2, 256, 64))),
         "multiple of kv heads"),
        (dict(k=jnp.zeros((1, 1, 200, 64)), v=jnp.zeros((1, 1, 200, 64))), "kv_len"),
        (dict(layout=layout_from_dense(causal(1, 1, 256, 256), block_q=64, block_kv=BLOCK)), "block_q"),
        (dict(layout="causal"), "layout must be"),
        (dict(sinks=jnp.zeros(3)), "sinks must be"),
        (dict(segment_ids=(np.zeros((1, 256), np.int32),)), "segment_ids must be a pair"),
        (dict(positions=(np.zeros((1, 256), np.int32), np.zeros((1, 200), np.int32))), "positions must be"),
        (dict(inner="sliding"), "inner must be"),
        (dict(softcap=-1.0), "softcap"),
        (dict(page_table=np.zeros((1, 2), np.int32)), "page size"),
        (dict(page_table=np.zeros((2, 2), np.int32)), "page_table must be"),
        (dict(layout=layout._replace(q_count=layout.q_count[:1])), "layout.q_count"),
        (dict(layout=layout._replace(kv_tiles=layout.q_tiles[:, :64])), "layout.kv_tiles"),
    ]
    big = jnp.zeros((1, 1, 1024, 256), jnp.float32)
    full = layout_from_dense(np.ones((1, 1, 1024, 1024), bool), block_q=1024, block_kv=1024)  # no tile to dedup
    cases.append((dict(q=big, k=big, v=big, layout=full), "block_q=1024, block_kv=1024"))
    for change, message in cases:
        args = dict(q=q, k=kv, v=kv, layout=layout)
        args.update(change)
        with pytest.raises(ValueError, match=message):
            flash_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("layout"), **args)
    for name in ("scale", "softcap"):  # static floats: a traced one is refused by name
        with pytest.raises(ValueError, match=f"{name} must be a static Python float"):
            jax.jit(lambda x: flash_attention(q, kv, kv, layout, interpret=True, **{name: x}))(0.5)
    bshd = jnp.zeros((1, 256, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        attention(bshd, bshd, bshd, layout, qkv_layout="bshd", cu_seqlens=[0, 256])
    with pytest.raises(ValueError, match="qkv_layout must be"):
        attention(bshd, bshd, bshd, layout, qkv_layout="sbhd")


# ---------------------------------------------------------------------------------------------------------------
# the TPU lowering gate: forward, dQ and dK/dV of every configuration lower with real Mosaic (nothing runs)

S_EXPORT = 1024


def _export_layout(block_q, block_kv, mask_heads, batch, sq=S_EXPORT, skv=S_EXPORT):
    qi, ki = np.arange(sq)[:, None] + (skv - sq), np.arange(skv)[None, :]  # bottom-right: decode / extend
    allowed = np.broadcast_to((ki <= qi) & (ki > qi - 300), (batch, mask_heads, sq, skv))
    layout = layout_from_dense(allowed, block_q=block_q, block_kv=block_kv)
    # Traced layout arrays, as a device-side builder under jit gives them.
    return BlockLayout(*(jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in layout.arrays()),
                       layout.shape)


# (dtype, head dim, q heads, kv heads, (block_q, block_kv), options): every dtype, head dim 64/128/256, MHA / GQA /
# MQA, blocks 128/256/512, paged K/V, the predicate (ids, positions, causal / window), softcap, sinks, per-head masks.
EXPORT_CONFIGS = [
    ("float32", 64, 2, 2, (128, 128), ()),
    ("bfloat16", 128, 4, 2, (256, 512), ("softcap", "sinks")),
    ("float32", 256, 4, 1, (512, 256), ("ids", "causal")),
    ("bfloat16", 64, 4, 4, (128, 256), ("ids", "positions", "window", "per_head")),
    ("bfloat16", 128, 4, 1, (512, 128), ("paged",)),
    ("float32", 128, 2, 1, (256, 256), ("paged", "ids", "positions", "causal", "softcap", "sinks")),
    ("bfloat16", 256, 2, 2, (512, 512), ("sinks", "per_head")),
    ("float32", 72, 2, 2, (128, 128), ("softcap",)),
    ("bfloat16", 128, 4, 2, (128, 128), ("ragged", "ids", "positions", "causal")),  # 200 queries x 300 keys
    ("bfloat16", 128, 4, 1, (128, 256), ("decode", "positions", "causal", "paged")),  # 8 queries x 1024 keys
]


@pytest.mark.parametrize("config", EXPORT_CONFIGS,
                         ids=lambda c: f"{c[0]}-d{c[1]}-{c[2]}x{c[3]}-{c[4][0]}x{c[4][1]}-{'+'.join(c[5]) or 'plain'}")
def test_exports_for_tpu(config):
    dtype, d, h, hkv, (bq, bkv), opts = config
    batch = 2
    dtype = jnp.dtype(dtype)
    sq, skv = (200, 300) if "ragged" in opts else (8, S_EXPORT) if "decode" in opts else (S_EXPORT, S_EXPORT)
    layout = _export_layout(bq, bkv, h if "per_head" in opts else 1, batch, sq, skv)
    kv_shape = (batch * -(-skv // bkv) + 3, hkv, bkv, d) if "paged" in opts else (batch, hkv, skv, d)
    ids_q, ids_kv = jax.ShapeDtypeStruct((batch, sq), jnp.int32), jax.ShapeDtypeStruct((batch, skv), jnp.int32)
    inner = "causal" if "causal" in opts else window(128, 0) if "window" in opts else "full"

    def loss(q, k, v, sinks, layout, ids_q, ids_kv, pos_q, pos_kv, table):
        out, lse = flash_attention(
            q, k, v, layout, softcap=20.0 if "softcap" in opts else None, sinks=sinks if "sinks" in opts else None,
            segment_ids=(ids_q, ids_kv) if "ids" in opts else None,
            positions=(pos_q, pos_kv) if "positions" in opts else None,
            inner=inner, page_table=table if "paged" in opts else None, return_lse=True)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    args = (jax.ShapeDtypeStruct((batch, h, sq, d), dtype), jax.ShapeDtypeStruct(kv_shape, dtype),
            jax.ShapeDtypeStruct(kv_shape, dtype), jax.ShapeDtypeStruct((h,), jnp.float32), layout, ids_q, ids_kv,
            ids_q, ids_kv, jax.ShapeDtypeStruct((batch, -(-skv // bkv)), jnp.int32))
    exported = jax.export.export(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))), platforms=["tpu"])(*args)
    text = exported.mlir_module()
    assert exported.platforms == ("tpu",)
    assert text.count("tpu_custom_call") == 3  # forward, dQ, dK/dV
    for name in ("seqattn_flash_fwd", "seqattn_flash_dq", "seqattn_flash_dkv"):
        assert name in text
