"""seqattn.pallas.builders: BlockLayouts built under jit (documents, DSA top-k tokens, Kascade top-k tiles).

Each builder's layout, brought to the host, must pass ``validate``, describe element by element the mask built
independently (the C++ DocumentMask / TopKMask through ``seqattn.to_dense``, and a NumPy formula), through its
query-major lists and through its key-major lists alike, and list exactly the non-empty tiles, full ones as
full, as the host reference ``layout_from_dense`` does. Plus: jit (one trace for new values), vmap, the overflow
and invalid flags, and ValueErrors naming the argument and its shape. Shapes are small and not multiples of the
blocks.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import checkify  # noqa: E402

import seqattn  # noqa: E402
from seqattn.pallas import builders as B  # noqa: E402
from seqattn.pallas import layout as L  # noqa: E402


def jb(builder, **kw):
    """builder under jit: array arguments traced, the others static (eager JAX compiles every op on its first
    use at a new shape, which makes it slower than one compilation of the whole builder)."""
    arrays = {k: v for k, v in kw.items() if isinstance(v, (np.ndarray, jax.Array))}
    static = {k: v for k, v in kw.items() if k not in arrays}
    return jax.jit(lambda a: builder(**a, **static))(arrays)


def host(build):
    return jax.tree_util.tree_map(np.asarray, build.layout)


def dense_from_kv_lists(lay, predicate=None):
    """The mask the key-major lists describe (dense_from_layout reads the q-major ones by default)."""
    return L.dense_from_layout(lay, predicate=predicate, key_major=True)


def entries(lay, prefix):
    """Per row, the listed (block, tile code) pairs."""
    start, count = getattr(lay, f"{prefix}_start"), getattr(lay, f"{prefix}_count")
    col = lay.q_kv if prefix == "q" else lay.kv_q
    tile = getattr(lay, f"{prefix}_tile")
    return [[(int(col[e]), int(tile[e])) for e in range(start[r], start[r] + count[r])] for r in range(len(start))]


def check_layout(build, want, predicate=None, edge=None):
    """validate, both lists against the dense mask `want` [B, Hm, Q, K], and the tiles listed against the host
    reference: the same blocks, full where it says full (except `edge(q_block, kv_block)` tiles, which a
    predicate layout must not call full) and nowhere else."""
    assert not bool(build.overflow)
    lay = host(build)
    L.validate(lay)
    for prefix in ("q", "kv"):  # the device's fetch indices are the host rule's
        np.testing.assert_array_equal(getattr(lay, f"{prefix}_fetch"), L.fetch_indices(getattr(lay, f"{prefix}_tile")))
    np.testing.assert_array_equal(L.dense_from_layout(lay, predicate=predicate), want)
    np.testing.assert_array_equal(dense_from_kv_lists(lay, predicate=predicate), want)
    ref = L.layout_from_dense(want, block_q=lay.shape.block_q, block_kv=lay.shape.block_kv)
    for prefix in ("q", "kv"):
        got, exp = entries(lay, prefix), entries(ref, prefix)
        n_rows = lay.shape.num_q_blocks if prefix == "q" else lay.shape.num_kv_blocks
        for r, (g, x) in enumerate(zip(got, exp)):
            assert [c for c, _ in g] == [c for c, _ in x], (prefix, r, g, x)
            for (c, tg), (_, tx) in zip(g, x):
                blocks = (r % n_rows, c) if prefix == "q" else (c, r % n_rows)
                if edge is not None and edge(*blocks):
                    assert tg != L.FULL_TILE, (prefix, r, c)
                else:
                    assert (tg == L.FULL_TILE) == (tx == L.FULL_TILE), (prefix, r, c, tg, tx)
    return lay


# --- documents ----------------------------------------------------------------------------------------------------

def documents(rng, b, s, pad=True):
    """ids, positions [b, s]: runs of increasing ids, random lengths and first positions, padding between."""
    ids = np.zeros((b, s), np.int32)
    pos = np.zeros((b, s), np.int32)
    for r in range(b):
        t, nxt = 0, int(rng.integers(1, 4))
        while t < s:
            if pad and rng.random() < 0.25:
                t += int(rng.integers(1, 4))
                continue
            n = int(rng.integers(1, 9))
            ids[r, t:t + n] = nxt
            pos[r, t:t + n] = int(rng.integers(0, 4)) + np.arange(min(n, s - t))
            nxt += int(rng.integers(1, 3))
            t += n
    return ids, pos


def inner_allows(mask, qp, kp):
    d = qp[:, :, None] - kp[:, None, :]  # q_pos - kv_pos
    if mask is None or mask.kind == "full":
        return np.ones(d.shape, bool)
    if mask.kind == "causal":
        return d >= 0
    return ((mask.left < 0) | (d <= mask.left)) & ((mask.right < 0) | (-d <= mask.right))


def doc_predicate(q_ids, kv_ids, qp, kp, mask):
    """The kernel's predicate, in NumPy: ids equal and non-zero, inner mask on positions."""
    same = (q_ids[:, :, None] == kv_ids[:, None, :]) & (q_ids[:, :, None] != 0)
    return same & inner_allows(mask, qp, kp)


def np_run_positions(ids):
    out = np.zeros_like(ids)
    for r in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            out[r, t] = out[r, t - 1] + 1 if ids[r, t] == ids[r, t - 1] else 0
    return out


DOC_MASKS = [None, seqattn.FullMask(), seqattn.CausalMask(), seqattn.CausalMask("bottom_right"),
             seqattn.SlidingWindowMask(3, 0), seqattn.SlidingWindowMask(2, 5), seqattn.SlidingWindowMask(-1, 2),
             seqattn.SlidingWindowMask(4, -1, "bottom_right")]


@pytest.mark.parametrize("mask", DOC_MASKS, ids=lambda m: repr(m))
@pytest.mark.parametrize("blocks", [(4, 3), (5, 16)])
@pytest.mark.parametrize("with_positions", [False, True])
def test_document_layout_self_attention(rng, mask, blocks, with_positions):
    s = 37
    ids, pos = documents(rng, 2, s)
    positions = pos if with_positions else None
    build = jb(B.document_layout, segment_ids=ids, positions=positions, mask=mask, block_q=blocks[0],
               block_kv=blocks[1])
    want = seqattn.to_dense(seqattn.DocumentMask(ids, positions, mask))
    qp = pos if with_positions else np_run_positions(ids)
    # The C++ mask, the NumPy predicate on full rows and the layout under that predicate all agree.
    np.testing.assert_array_equal(want[:, 0], doc_predicate(ids, ids, qp, qp, mask))
    np.testing.assert_array_equal(np.asarray(B.run_positions(ids)), np_run_positions(ids))
    nq, nk = -(-s // blocks[0]), -(-s // blocks[1])
    edge = lambda qb, kb: (s % blocks[0] and qb == nq - 1) or (s % blocks[1] and kb == nk - 1)  # noqa: E731
    lay = check_layout(build, want, doc_predicate(ids, ids, qp, qp, mask), edge)
    assert set(np.unique(lay.q_tile)) <= {L.FULL_TILE, L.PREDICATE_TILE}


@pytest.mark.parametrize("mask", [seqattn.CausalMask(), seqattn.SlidingWindowMask(2, 1), None], ids=repr)
@pytest.mark.parametrize("with_positions", [False, True])
def test_document_layout_cross_attention(rng, mask, with_positions):
    """Distinct kv runs (a KV cache per document): ids paired by value, positions line the runs up."""
    b, s_q, s_kv = 2, 19, 30
    q_ids, q_pos = np.zeros((b, s_q), np.int32), np.zeros((b, s_q), np.int32)
    kv_ids, kv_pos = np.zeros((b, s_kv), np.int32), np.zeros((b, s_kv), np.int32)
    for r in range(b):
        tq = tk = 0
        for d in range(1, 9):
            nq_, nk_ = int(rng.integers(1, 5)), int(rng.integers(1, 8))
            if tq + nq_ > s_q or tk + nk_ > s_kv:
                break
            q_ids[r, tq:tq + nq_] = d
            kv_ids[r, tk:tk + nk_] = d
            kv_pos[r, tk:tk + nk_] = np.arange(nk_)
            q_pos[r, tq:tq + nq_] = nk_ - nq_ + np.arange(nq_) if nk_ >= nq_ else np.arange(nq_)
            tq, tk = tq + nq_, tk + nk_ + int(rng.integers(0, 2))
    if not with_positions:  # local coordinates are then the offsets in the runs, and so are the kernel's
        q_pos, kv_pos = np_run_positions(q_ids), np_run_positions(kv_ids)
    given = (q_pos, kv_pos) if with_positions else (None, None)
    build = jb(B.document_layout, segment_ids=q_ids, positions=given[0], mask=mask, block_q=4, block_kv=6,
               kv_segment_ids=kv_ids, kv_positions=given[1])
    want = seqattn.to_dense(seqattn.DocumentMask(q_ids, given[0], mask, kv_segment_ids=kv_ids,
                                                 kv_segment_pos=given[1]))
    pred = doc_predicate(q_ids, kv_ids, q_pos, kv_pos, mask)
    np.testing.assert_array_equal(want[:, 0], pred)
    check_layout(build, want, pred, edge=lambda qb, kb: qb == 4)  # 19 = 4 * 4 + 3; 30 = 5 * 6: kv blocks whole


def test_document_layout_width_bound_and_overflow(rng):
    ids, _ = documents(rng, 1, 40, pad=False)
    ids[:] = 1  # one causal document: q block i lists i + 1 kv blocks
    default = jb(B.document_layout, segment_ids=ids, mask=seqattn.CausalMask(), block_q=8, block_kv=8)
    assert not bool(default.overflow) and default.layout.shape.q_width == 5
    tight = jb(B.document_layout, segment_ids=ids, mask=seqattn.CausalMask(), block_q=8, block_kv=8, q_width=3,
               kv_width=5)
    assert bool(tight.overflow)
    lay = host(tight)
    L.validate(lay)  # still a well-formed layout, just missing blocks
    assert lay.q_count.tolist() == [1, 2, 3, 3, 3]
    # The tiles left out of the q lists are left out of the kv lists too.
    got = L.dense_from_layout(lay, predicate=np.tril(np.ones((40, 40), bool))[None])
    np.testing.assert_array_equal(got, dense_from_kv_lists(lay, predicate=np.tril(np.ones((40, 40), bool))[None]))
    enough = jb(B.document_layout, segment_ids=ids, mask=seqattn.CausalMask(), block_q=8, block_kv=8, q_width=5)
    assert not bool(enough.overflow)
    # Key-major overflow: kv block 0 is needed by all 5 q blocks; the ones it drops leave the q lists as well.
    kv_tight = host(jb(B.document_layout, segment_ids=ids, mask=seqattn.CausalMask(), block_q=8, block_kv=8,
                       kv_width=2))
    L.validate(kv_tight)
    assert kv_tight.kv_count.tolist() == [2, 2, 2, 2, 1] and kv_tight.q_count.tolist() == [1, 2, 2, 2, 2]
    np.testing.assert_array_equal(L.dense_from_layout(kv_tight, predicate=np.tril(np.ones((40, 40), bool))[None]),
                                  dense_from_kv_lists(kv_tight, predicate=np.tril(np.ones((40, 40), bool))[None]))


@pytest.mark.parametrize("mask, match", [
    (seqattn.ChunkedCausalMask(4), "cannot be applied by the kernel's predicate"),
    (seqattn.PrefixLMMask(3), "cannot be applied"),
    (seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.FullMask()]), "one mask for every head"),
])
def test_document_layout_refuses_masks_the_predicate_cannot_apply(mask, match):
    with pytest.raises(ValueError, match=match):
        B.document_layout(np.ones((1, 8), np.int32), mask=mask, block_q=4, block_kv=4)


def test_document_layout_bad_arguments():
    ids = np.ones((2, 8), np.int32)
    with pytest.raises(ValueError, match=r"bottom-right aligned.*self-attention only"):
        B.document_layout(ids, mask=seqattn.CausalMask("bottom_right"), block_q=4, block_kv=4,
                          kv_segment_ids=np.ones((2, 6), np.int32))
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[batch, S\].*got \(8,\)"):
        B.document_layout(ids[0], block_q=4, block_kv=4)
    with pytest.raises(ValueError, match=r"segment_ids must hold integers, got dtype float32 of shape \(2, 8\)"):
        B.document_layout(ids.astype(np.float32), block_q=4, block_kv=4)
    with pytest.raises(ValueError, match=r"kv_segment_ids must have shape \[2, S_kv\].*got \(3, 8\)"):
        B.document_layout(ids, block_q=4, block_kv=4, kv_segment_ids=np.ones((3, 8), np.int32))
    with pytest.raises(ValueError, match="block_kv must be a positive int, got 0"):
        B.document_layout(ids, block_q=4, block_kv=0)
    with pytest.raises(ValueError, match="q_width must be a positive int"):
        B.document_layout(ids, block_q=4, block_kv=4, q_width=0)
    with pytest.raises(ValueError, match="mask must be a seqattn mask"):
        B.document_layout(ids, mask="causal", block_q=4, block_kv=4)


def traced_once(fn, inputs):
    """fn under jit on each input of the same shape: the builds, and how many times it traced."""
    traces = []

    def body(x):
        traces.append(1)
        return fn(x)

    jitted = jax.jit(body)
    return [jitted(x) for x in inputs], len(traces)


def same_layout(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a.layout.shape == b.layout.shape


def test_document_layout_jit_traces_once_and_vmaps(rng):
    inputs = [documents(rng, 2, 29)[0] for _ in range(3)]
    fn = lambda i: B.document_layout(i, mask=seqattn.CausalMask(), block_q=4, block_kv=8)  # noqa: E731
    builds, n = traced_once(fn, inputs)
    assert n == 1
    for ids, build in zip(inputs, builds):
        pred = doc_predicate(ids, ids, np_run_positions(ids), np_run_positions(ids), seqattn.CausalMask())
        check_layout(build, seqattn.to_dense(seqattn.DocumentMask(ids, None, seqattn.CausalMask())), pred,
                     edge=lambda qb, kb: qb == 7 or kb == 3)
    stacked = jax.jit(jax.vmap(fn))(jnp.stack(inputs))
    for v, build in enumerate(builds):
        same_layout(jax.tree_util.tree_map(lambda x, v=v: x[v], stacked), build)


# --- DSA: top-k tokens --------------------------------------------------------------------------------------------

def topk_indices(rng, lead, t, s, k, fill=0.2):
    """int32 [*lead, t, k]: distinct keys per row in random order, some -1 (padding)."""
    n = int(np.prod(lead)) * t
    out = np.stack([rng.permutation(s)[:k] for _ in range(n)]).astype(np.int32)
    out[rng.random(out.shape) < fill] = -1
    return out.reshape(*lead, t, k)


def topk_dense(idx, s):
    """NumPy: [B, Hm, t, s] from indices [B, Hm, t, k] (valid ones only)."""
    out = np.zeros(idx.shape[:-1] + (s,), bool)
    for pos in np.ndindex(*idx.shape[:-1]):
        keys = [int(j) for j in idx[pos] if 0 <= j < s]
        out[pos + (keys,)] = True
    return out


@pytest.mark.parametrize("t, s, k, blocks", [(13, 29, 5, (4, 8)), (9, 9, 9, (2, 2)), (16, 40, 3, (8, 5)),
                                             (7, 50, 12, (3, 16))])
def test_topk_token_layout_matches_topk_mask(rng, t, s, k, blocks):
    idx = topk_indices(rng, (2,), t, s, k)
    if k == s:  # every key of some rows: full tiles appear
        idx[0, :4] = np.arange(s)
    build = jb(B.topk_token_layout, indices=idx, kv_len=s, block_q=blocks[0], block_kv=blocks[1])
    want = seqattn.to_dense(seqattn.TopKMask(idx, s))
    np.testing.assert_array_equal(want[:, 0], topk_dense(idx[:, None], s)[:, 0])
    assert not bool(build.invalid)
    lay = check_layout(build, want)
    if k == s:
        assert (lay.q_tile == L.FULL_TILE).any()


def test_topk_token_layout_per_head(rng):
    idx = topk_indices(rng, (2, 3), 10, 23, 4)
    build = jb(B.topk_token_layout, indices=idx, kv_len=23, block_q=4, block_kv=4)
    assert build.layout.shape.mask_heads == 3
    want = seqattn.to_dense(seqattn.TopKMask(idx.reshape(6, 10, 4), 23)).reshape(2, 3, 10, 23)
    np.testing.assert_array_equal(want, topk_dense(idx, 23))
    check_layout(build, want)


def test_topk_token_layout_flags_what_the_cpp_rejects(rng):
    idx = topk_indices(rng, (1,), 6, 20, 4, fill=0.0)
    ok = jb(B.topk_token_layout, indices=idx, kv_len=20, block_q=4, block_kv=4)
    assert not bool(ok.invalid)
    for bad_value in (20, -2, 1000):
        bad = idx.copy()
        bad[0, 2, 1] = bad_value
        with pytest.raises(ValueError, match="outside"):
            seqattn.TopKMask(bad, 20).to_dense()  # what the C++ says
        build = jb(B.topk_token_layout, indices=bad, kv_len=20, block_q=4, block_kv=4)
        assert bool(build.invalid)
        check_layout(build, topk_dense(bad[:, None], 20))  # the bad index ignored
    rep = idx.copy()
    rep[0, 3, 2] = rep[0, 3, 0]
    with pytest.raises(ValueError, match="repeats"):
        seqattn.TopKMask(rep, 20).to_dense()
    build = jb(B.topk_token_layout, indices=rep, kv_len=20, block_q=4, block_kv=4)
    assert bool(build.invalid)
    check_layout(build, topk_dense(rep[:, None], 20))  # the repeat counted once


def test_topk_token_layout_overflow_is_flagged_and_checkable(rng):
    idx = topk_indices(rng, (1,), 8, 64, 6, fill=0.0)
    want = topk_dense(idx[:, None], 64)
    need = int(max((want[0, 0, r:r + 4].reshape(4, 8, 8).any(axis=(0, 2))).sum() for r in (0, 4)))
    assert need > 2
    exact = jb(B.topk_token_layout, indices=idx, kv_len=64, block_q=4, block_kv=8, max_tiles=need)
    assert not bool(exact.overflow)
    check_layout(exact, want)
    tight = jb(B.topk_token_layout, indices=idx, kv_len=64, block_q=4, block_kv=8, max_tiles=need - 1)
    assert bool(tight.overflow)
    lay = host(tight)
    L.validate(lay)
    got = L.dense_from_layout(lay)
    assert (got <= want).all() and (got != want).any()  # a subset, and the flag says it is one
    np.testing.assert_array_equal(got, dense_from_kv_lists(lay))
    assert lay.q_tiles.shape == (2 * (need - 1), 4, 8)  # the bound sizes the stored tiles

    f = checkify.checkify(jax.jit(lambda i: B.checked(B.topk_token_layout(i, kv_len=64, block_q=4, block_kv=8,
                                                                            max_tiles=need - 1))))
    err, _ = f(idx)
    with pytest.raises(checkify.JaxRuntimeError, match="more blocks than a static bound allows"):
        err.throw()
    g = checkify.checkify(jax.jit(lambda i: B.checked(B.topk_token_layout(i, kv_len=64, block_q=4, block_kv=8))))
    err, _ = g(idx)
    err.throw()  # no error


def test_topk_token_layout_max_stored_tiles(rng):
    idx = topk_indices(rng, (2,), 10, 33, 3)
    want = topk_dense(idx[:, None], 33)
    listed = len(L.layout_from_dense(want, block_q=4, block_kv=4).q_kv)  # (no dummy entry: tiles are listed)
    exact = jb(B.topk_token_layout, indices=idx, kv_len=33, block_q=4, block_kv=4, max_stored_tiles=listed)
    assert np.asarray(exact.layout.q_tiles).shape == (listed, 4, 4)
    check_layout(exact, want)
    short = jb(B.topk_token_layout, indices=idx, kv_len=33, block_q=4, block_kv=4, max_stored_tiles=listed - 3)
    assert bool(short.overflow)
    lay = host(short)
    L.validate(lay)
    got = L.dense_from_layout(lay)
    assert (got <= want).all() and (got != want).any()
    np.testing.assert_array_equal(got, dense_from_kv_lists(lay))
    assert int(lay.q_count.sum()) == listed - 3  # the first tiles in q-major order keep their storage


def test_topk_token_layout_jit_traces_once_and_vmaps(rng):
    inputs = [topk_indices(rng, (2,), 11, 30, 4) for _ in range(3)]
    fn = lambda i: B.topk_token_layout(i, kv_len=30, block_q=4, block_kv=8)  # noqa: E731
    builds, n = traced_once(fn, inputs)
    assert n == 1
    for idx, build in zip(inputs, builds):
        check_layout(build, topk_dense(idx[:, None], 30))
    stacked = jax.jit(jax.vmap(fn))(jnp.stack(inputs))
    for v, build in enumerate(builds):
        same_layout(jax.tree_util.tree_map(lambda x, v=v: x[v], stacked), build)


def test_topk_token_layout_bad_arguments():
    with pytest.raises(ValueError, match=r"indices must have shape \[batch, q_len, k\].*got \(5, 3\)"):
        B.topk_token_layout(np.zeros((5, 3), np.int32), kv_len=8, block_q=4, block_kv=4)
    with pytest.raises(ValueError, match=r"indices must have shape .*got \(1, 0, 3\)"):
        B.topk_token_layout(np.zeros((1, 0, 3), np.int32), kv_len=8, block_q=4, block_kv=4)
    with pytest.raises(ValueError, match=r"indices must hold integers, got dtype float64 of shape \(1, 5, 3\)"):
        B.topk_token_layout(np.zeros((1, 5, 3)), kv_len=8, block_q=4, block_kv=4)
    with pytest.raises(ValueError, match="kv_len must be a positive int, got 0"):
        B.topk_token_layout(np.zeros((1, 5, 3), np.int32), kv_len=0, block_q=4, block_kv=4)
    with pytest.raises(ValueError, match="max_tiles must be a positive int"):
        B.topk_token_layout(np.zeros((1, 5, 3), np.int32), kv_len=8, block_q=4, block_kv=4, max_tiles=-1)
    with pytest.raises(ValueError, match="max_stored_tiles must be a positive int, got 0"):
        B.topk_token_layout(np.zeros((1, 5, 3), np.int32), kv_len=8, block_q=4, block_kv=4, max_stored_tiles=0)


# --- Kascade: top-k tiles -----------------------------------------------------------------------------------------

def kascade_dense(sel, q_len, kv_len, bq, bkv):
    """NumPy, element by element: query i sees key j iff j <= p and (j >= fp(tile) or block(j) selected)."""
    b, hm = sel.shape[:2]
    out = np.zeros((b, hm, q_len, kv_len), bool)
    start = kv_len - q_len
    for bb, h, i, j in np.ndindex(b, hm, q_len, kv_len):
        p, fp = start + i, start + (i // bq) * bq
        chosen = j // bkv in {int(x) for x in sel[bb, h, i // bq] if x >= 0}
        out[bb, h, i, j] = j <= p and (j >= fp or chosen)
    return out


def tile_selection(rng, lead, nq, nk, k):
    """Selections as an anchor leaves them: any blocks (future ones too), some -1, some repeats."""
    sel = rng.integers(-1, nk, size=(*lead, nq, k)).astype(np.int32)
    sel[..., -1] = sel[..., 0]
    return sel


@pytest.mark.parametrize("q_len, kv_len, blocks, k", [(16, 16, (4, 4), 2), (13, 29, (4, 4), 3), (11, 20, (3, 5), 2),
                                                      (10, 10, (5, 2), 4), (7, 40, (8, 8), 3)])
def test_topk_tile_layout_matches_the_kascade_rule(rng, q_len, kv_len, blocks, k):
    bq, bkv = blocks
    nq, nk = -(-q_len // bq), -(-kv_len // bkv)
    sel = tile_selection(rng, (2, 2), nq, nk, k)
    build = jb(B.topk_tile_layout, tile_indices=sel, q_len=q_len, kv_len=kv_len, block_q=bq, block_kv=bkv)
    assert not bool(build.invalid)
    want = kascade_dense(sel, q_len, kv_len, bq, bkv)
    check_layout(build, want)


def test_topk_tile_layout_is_the_fork_rule_when_blocks_align(rng):
    """Aligned blocks: (selected U diagonal block) AND token-causal (spec C.3 path B), and TV-C2's tile sets."""
    n, bsz = 6, 4
    sel = tile_selection(rng, (1, 3), n, n, 2)
    build = jb(B.topk_tile_layout, tile_indices=sel, q_len=n * bsz, kv_len=n * bsz, block_q=bsz, block_kv=bsz)
    want = np.zeros((1, 3, n * bsz, n * bsz), bool)
    for h, i, j in np.ndindex(3, n * bsz, n * bsz):
        blocks = {int(x) for x in sel[0, h, i // bsz] if x >= 0} | {i // bsz}
        want[0, h, i, j] = j <= i and j // bsz in blocks
    check_layout(build, want)
    # TV-C2: S = 8, tile 2; q-tile 3 selected [0, 3] -> keys {0, 1, 6, 7} for the query at 7; q-tile 0
    # selected [0, 1] -> {0} after the block-causal cut.
    tv = np.array([[[0, 1], [0, -1], [0, -1], [0, 3]]], np.int32)
    got = L.dense_from_layout(host(jb(B.topk_tile_layout, tile_indices=tv, q_len=8, kv_len=8, block_q=2, block_kv=2)))
    assert np.flatnonzero(got[0, 0, 7]).tolist() == [0, 1, 6, 7]
    assert np.flatnonzero(got[0, 0, 1]).tolist() == [0, 1] and np.flatnonzero(got[0, 0, 0]).tolist() == [0]


def test_topk_tile_layout_stores_few_tiles_and_flags_bad_blocks(rng):
    sel = tile_selection(rng, (1,), 16, 16, 4)
    lay = host(jb(B.topk_tile_layout, tile_indices=sel, q_len=128, kv_len=128, block_q=8, block_kv=8))
    assert lay.q_tiles.shape[0] == 1  # aligned: the causal diagonal tile is the only partial one
    bad = sel.copy()
    bad[0, 5, 1] = 16
    build = jb(B.topk_tile_layout, tile_indices=bad, q_len=128, kv_len=128, block_q=8, block_kv=8)
    assert bool(build.invalid)
    check_layout(build, kascade_dense(bad[:, None], 128, 128, 8, 8))  # ignored
    tight = jb(B.topk_tile_layout, tile_indices=sel, q_len=128, kv_len=128, block_q=8, block_kv=8, q_width=2)
    assert bool(tight.overflow)
    L.validate(host(tight))


def test_topk_tile_layout_jit_traces_once_and_vmaps(rng):
    inputs = [tile_selection(rng, (2,), 4, 5, 3) for _ in range(3)]
    fn = lambda s: B.topk_tile_layout(s, q_len=14, kv_len=18, block_q=4, block_kv=4)  # noqa: E731
    builds, n = traced_once(fn, inputs)
    assert n == 1
    for sel, build in zip(inputs, builds):
        check_layout(build, kascade_dense(sel[:, None], 14, 18, 4, 4))
    stacked = jax.jit(jax.vmap(fn))(jnp.stack(inputs))
    for v, build in enumerate(builds):
        same_layout(jax.tree_util.tree_map(lambda x, v=v: x[v], stacked), build)


def test_topk_tile_layout_bad_arguments():
    sel = np.zeros((1, 4, 2), np.int32)
    with pytest.raises(ValueError, match=r"tile_indices \(1, 1, 4, 2\) must have NQ = .* = 3 q blocks"):
        jb(B.topk_tile_layout, tile_indices=sel, q_len=12, kv_len=12, block_q=5, block_kv=4)
    with pytest.raises(ValueError, match=r"q_len \(20\) must not exceed kv_len \(12\)"):
        jb(B.topk_tile_layout, tile_indices=sel, q_len=20, kv_len=12, block_q=5, block_kv=4)
    with pytest.raises(ValueError, match=r"tile_indices must have shape \[batch, NQ, k\].*got \(4, 2\)"):
        B.topk_tile_layout(sel[0], q_len=16, kv_len=16, block_q=4, block_kv=4)
    with pytest.raises(ValueError, match="block_q must be a positive int, got 2.5"):
        jb(B.topk_tile_layout, tile_indices=sel, q_len=16, kv_len=16, block_q=2.5, block_kv=4)
