"""seqattn.tpu: tile classes from traced segment ids (block_classes) and tokens (multi_item_classes), against
the C++ BlockMask classes and the dense mask, on random inputs; jit, vmap, TPU export, no [S, S] temporaries."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import seqattn  # noqa: E402
from seqattn import tpu  # noqa: E402

INT32_MAX = 2**31 - 1


def inners():
    out = [None, seqattn.FullMask()]
    for a in ("top_left", "bottom_right"):
        out += [
            seqattn.CausalMask(a),
            seqattn.SlidingWindowMask(3, 0, a),
            seqattn.SlidingWindowMask(2, 5, a),
            seqattn.SlidingWindowMask(-1, 2, a),
            seqattn.SlidingWindowMask(4, -1, a),
            seqattn.SlidingWindowMask(0, 0, a),
            seqattn.ChunkedCausalMask(4, a),
            seqattn.ChunkedCausalMask(1, a),
            seqattn.PrefixLMMask(5, a),
            seqattn.PrefixLMMask(0, a),
        ]
    return out


INNERS = inners()


def lay_out(rng, s, ids, pos_start):
    """A row of s tokens holding runs of `ids` in order (as many as fit), padding anywhere.

    Run lengths favour 1 and 2 tokens; a run's positions count up from pos_start(). Padding
    positions are garbage (never read)."""
    row = np.zeros(s, np.int32)
    pos = rng.integers(-7, 1000, s).astype(np.int32)
    t = 0
    for v in ids:
        if t < s and rng.random() < 0.3:
            t += int(rng.integers(1, 4))  # padding before / between runs
        if t >= s:
            break
        n = min(s - t, int(rng.choice([1, 1, 2, 2, 3, 4, 6, 9, 17, 40])))
        first = pos_start(n)
        row[t:t + n] = v
        pos[t:t + n] = first + np.arange(n)
        t += n
    return row, pos


def segment_ids(rng, s):
    """The ids of a row: increasing with gaps from a start >= 1 (what TE accepts), sometimes near INT32_MAX,
    sometimes in any order (what DocumentLayout accepts)."""
    start = int(rng.choice([1, 1, 2, 5, INT32_MAX - 4 * s - 10]))
    ids = start + np.cumsum(rng.integers(1, 3, s + 1)) - 1
    if rng.random() < 0.3:
        ids = rng.permutation(ids)
    return [int(v) for v in ids]


def pos_start_fn(rng):
    def start(n):
        r = rng.random()
        if r < 0.5:
            return 0
        if r < 0.9:
            return int(rng.integers(1, 12))
        return INT32_MAX - n + 1 - int(rng.integers(0, 3))  # the last position at (or near) INT32_MAX
    return start


def random_batch(rng, rows, s):
    ids = np.zeros((rows, s), np.int32)
    pos = np.zeros((rows, s), np.int32)
    for r in range(rows):
        style = rng.integers(0, 10)
        if style == 0:  # all padding
            continue
        if style == 1:  # one segment over the whole row
            v = int(rng.integers(1, 9))
            ids[r], pos[r] = v, int(rng.integers(0, 4)) + np.arange(s)
            continue
        if style == 2:  # 1-token segments, some separated by padding
            row_ids = segment_ids(rng, s)
            for t in range(s):
                if rng.random() < 0.7:
                    ids[r, t], pos[r, t] = row_ids[t], int(rng.integers(0, 5))
            continue
        ids[r], pos[r] = lay_out(rng, s, segment_ids(rng, s), pos_start_fn(rng))
    return ids, pos


def kv_batch(rng, q_ids, s_kv):
    """Key rows whose ids pair with some of the query row's ids (in any order), plus ids of their own."""
    rows = q_ids.shape[0]
    ids = np.zeros((rows, s_kv), np.int32)
    pos = np.zeros((rows, s_kv), np.int32)
    for r in range(rows):
        own = [int(v) for v in np.unique(q_ids[r][q_ids[r] > 0])]
        pick = [v for v in own if rng.random() < 0.8]
        extra = [int(v) for v in rng.integers(1, INT32_MAX, 3) if int(v) not in own]
        pool = pick + extra
        if rng.random() < 0.5:
            pool = [int(v) for v in rng.permutation(pool)]
        elif rng.random() < 0.5:
            pool = sorted(pool)
        ids[r], pos[r] = lay_out(rng, s_kv, pool, pos_start_fn(rng))
    return ids, pos


def tile_classes_from_dense(dense, bq, bkv, lengths=None):
    """int8 [B, H, nq, nkv] classes from a bool [B, H, Q, KV] mask: the definition. Row b's tiles end at
    lengths[b] (default: Q and KV), tiles past it are 0."""
    b, h, q, kv = dense.shape
    nq, nkv = -(-q // bq), -(-kv // bkv)
    lq = np.full(b, q) if lengths is None else np.asarray(lengths)
    lkv = np.full(b, kv) if lengths is None else np.asarray(lengths)
    inside = (np.arange(nq * bq)[None, None, :, None] < lq[:, None, None, None]) & (
        np.arange(nkv * bkv)[None, None, None, :] < lkv[:, None, None, None])
    d = np.zeros((b, h, nq * bq, nkv * bkv), bool)
    d[:, :, :q, :kv] = dense
    d &= inside
    blocks = lambda x: x.reshape(x.shape[0], x.shape[1], nq, bq, nkv, bkv).swapaxes(3, 4).reshape(  # noqa: E731
        x.shape[0], x.shape[1], nq, nkv, -1)
    any_ = blocks(d).any(-1)
    all_ = blocks(d | ~inside).all(-1) & blocks(inside).any(-1)
    return np.where(all_, 2, np.where(any_, 1, 0)).astype(np.int8)


# (S_q, S_kv, block size): short last blocks, 1x1 tiles, blocks larger than the sequence. Few distinct
# sequence lengths: JAX compiles each operation once per shape, which is most of these tests' time.
SELF_SHAPES = [(1, 1, (1, 1)), (70, 70, (8, 16)), (70, 70, (16, 8)), (45, 45, (1, 1)), (45, 45, (7, 5)),
               (5, 5, (8, 8))]
CROSS_SHAPES = [(70, 70, (8, 16)), (45, 70, (8, 16)), (70, 45, (3, 4)), (1, 70, (2, 2)), (45, 1, (1, 1))]
ROWS = 24


def check(ids, pos, inner, block, kv_ids=None, kv_pos=None, dense_check=True):
    kw = {} if kv_ids is None else {"kv_segment_ids": kv_ids, "kv_segment_pos": kv_pos}
    doc = seqattn.DocumentMask(ids, pos, inner, **kw)
    want = doc.block_mask(block_size=block).classes()
    got = tpu.block_classes(ids, pos, kv_segment_ids=kv_ids, kv_positions=kv_pos, inner=inner, block_size=block)
    assert got.dtype == jnp.int8
    got = np.asarray(got)
    assert got.shape == want.shape
    if not np.array_equal(got, want):
        r = int(np.argwhere((got != want).any(axis=(1, 2, 3)))[0, 0])
        pytest.fail(
            f"{inner!r} block {block}, row {r}:\nids {ids[r].tolist()}\n"
            f"pos {None if pos is None else pos[r].tolist()}\n"
            f"kv_ids {None if kv_ids is None else kv_ids[r].tolist()}\n"
            f"kv_pos {None if kv_pos is None else kv_pos[r].tolist()}\nwant\n{want[r, 0]}\ngot\n{got[r, 0]}"
        )
    if dense_check:  # the C++ classes are exact: they agree with the dense mask
        np.testing.assert_array_equal(want, tile_classes_from_dense(doc.to_dense(), *block))
    return got


@pytest.mark.parametrize("shape", SELF_SHAPES, ids=[f"{s[0]}-b{s[2][0]}x{s[2][1]}" for s in SELF_SHAPES])
def test_self_attention_matches_cpp(rng, shape):
    s, _, block = shape
    seen = np.zeros(3, np.int64)
    for k, inner in enumerate(INNERS):
        ids, pos = random_batch(rng, ROWS, s)
        for use_pos in (True, False):
            got = check(ids, pos if use_pos else None, inner, block, dense_check=k % 4 == 0)
            seen += np.bincount(got.ravel(), minlength=3)
    if s > 1:  # the random rows reach every class (1 x 1 tiles are never partial)
        assert seen[0] > 0 and seen[2] > 0 and (seen[1] > 0) == (block != (1, 1)), seen


@pytest.mark.parametrize("shape", CROSS_SHAPES, ids=[f"{s[0]}x{s[1]}-b{s[2][0]}x{s[2][1]}" for s in CROSS_SHAPES])
def test_cross_attention_matches_cpp(rng, shape):
    s_q, s_kv, block = shape
    for k, inner in enumerate(INNERS):
        ids, pos = random_batch(rng, ROWS, s_q)
        kv_ids, kv_pos = kv_batch(rng, ids, s_kv)
        modes = ((pos, kv_pos), (None, None)) if k % 2 else ((pos, None), (None, kv_pos))
        for q_pos, k_pos in modes:
            check(ids, q_pos, inner, block, kv_ids, k_pos, dense_check=k % 4 == 0)


def test_hand_written_rows(rng):
    rows = np.array([
        [0, 0, 3, 3, 3, 0, 7, 9, 9, 9, 9, 9, 0, 4, 4, 4],   # ids not starting at 1, padding anywhere
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],   # one document
        [0] * 16,                                            # padding only
        [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],  # 1-token documents
    ], np.int32)
    row_pos = np.array([
        [9, 9, 4, 5, 6, -1, 0, 2, 3, 4, 5, 6, 9, 0, 1, 2],
        list(range(100, 116)),
        list(range(16)),
        [0] * 16,
    ], np.int32)
    # In a batch of the tests' usual shape (JAX compiles per shape): the rows, then padding, then random rows.
    ids, pos = random_batch(rng, ROWS, 45)
    ids[:4], pos[:4] = 0, 0
    ids[:4, :16], pos[:4, :16] = rows, row_pos
    for inner in INNERS:
        for block in ((7, 5), (1, 1)):
            check(ids, pos, inner, block)
            check(ids, None, inner, block)


def test_extreme_parameters_and_positions(rng):
    """Window sides, chunks and prefixes past int32, positions up to INT32_MAX: no overflow."""
    s = 45
    big = [
        seqattn.SlidingWindowMask(2**62, 2**63 - 1),
        seqattn.SlidingWindowMask(2**31, 3, "bottom_right"),
        seqattn.SlidingWindowMask(3, 2**31 + 5),
        seqattn.SlidingWindowMask(2**31 - 1, 2**31 - 1, "bottom_right"),
        seqattn.ChunkedCausalMask(2**40),
        seqattn.ChunkedCausalMask(2**31 - 1, "bottom_right"),
        seqattn.ChunkedCausalMask(2**31),
        seqattn.PrefixLMMask(2**40),
        seqattn.PrefixLMMask(2**31 - 1, "bottom_right"),
        seqattn.PrefixLMMask(2**31 - 3),
    ]
    for inner in big:
        ids, _ = random_batch(rng, ROWS, s)
        pos = np.zeros_like(ids)
        for r in range(ROWS):  # every run ends at INT32_MAX, or starts at 0 (half the rows)
            for v in np.unique(ids[r][ids[r] > 0]):
                where = np.flatnonzero(ids[r] == v)
                first = INT32_MAX - len(where) + 1 if r % 2 else 0
                pos[r, where] = first + np.arange(len(where))
        kv_ids, _ = kv_batch(rng, ids, s)
        kv_pos = np.zeros_like(kv_ids)
        for r in range(ROWS):
            for v in np.unique(kv_ids[r][kv_ids[r] > 0]):
                where = np.flatnonzero(kv_ids[r] == v)
                kv_pos[r, where] = (INT32_MAX - len(where) + 1 if r % 3 else 0) + np.arange(len(where))
        check(ids, pos, inner, (4, 8))
        check(ids, pos, inner, (4, 8), kv_ids, kv_pos)


def test_jit_vmap_and_leading_dims(rng):
    inner = seqattn.SlidingWindowMask(5, 0, "bottom_right")
    ids, pos = random_batch(rng, 3 * 8, 50)
    e_ids, e_pos = ids.reshape(3, 8, 50), pos.reshape(3, 8, 50)
    want = seqattn.DocumentMask(e_ids, e_pos, inner).block_mask(block_size=(8, 16)).classes()
    fn = jax.jit(lambda i, p: tpu.block_classes(i, p, inner=inner, block_size=(8, 16)))
    assert fn(e_ids, e_pos).shape == (3, 8, 1, 7, 4)
    np.testing.assert_array_equal(np.asarray(fn(e_ids, e_pos)).reshape(want.shape), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(fn)(e_ids, e_pos)).reshape(want.shape), want)
    # Positions of shape [B, S] broadcast over the leading dim, as DocumentMask broadcasts them: the same
    # runs in every leading row, some of them turned into padding.
    b_ids = np.stack([ids[:8]] * 3)
    for e in (1, 2):
        for r in range(8):
            for v in np.unique(b_ids[e, r][b_ids[e, r] > 0]):
                if rng.random() < 0.4:
                    b_ids[e, r][b_ids[e, r] == v] = 0
    want_b = seqattn.DocumentMask(b_ids, pos[:8], inner).block_mask(block_size=(8, 16)).classes()
    shared = np.broadcast_to(pos[:8], (3, 8, 50))
    np.testing.assert_array_equal(np.asarray(fn(b_ids, pos[:8])).reshape(want_b.shape), want_b)
    np.testing.assert_array_equal(np.asarray(fn(b_ids, shared)).reshape(want_b.shape), want_b)
    # Cross attention under jit and vmap; one compiled function, new ids each call.
    cross = jax.jit(jax.vmap(lambda i, p, ki, kp: tpu.block_classes(i, p, kv_segment_ids=ki, kv_positions=kp,
                                                                    inner=inner, block_size=(8, 16))))
    for _ in range(3):
        ids, pos = random_batch(rng, 8, 50)
        kv_ids, kv_pos = kv_batch(rng, ids, 50)
        want = seqattn.DocumentMask(ids, pos, inner, kv_segment_ids=kv_ids, kv_segment_pos=kv_pos).block_mask(
            block_size=(8, 16)).classes()
        np.testing.assert_array_equal(np.asarray(cross(ids, pos, kv_ids, kv_pos)), want)


def _avals(jaxpr):
    """Every variable's abstract value in a jaxpr and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        for v in list(eqn.invars) + list(eqn.outvars):
            if hasattr(v, "aval") and hasattr(v.aval, "shape"):
                yield v.aval
        for p in eqn.params.values():
            for q in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(q, "jaxpr", q)
                if hasattr(inner, "eqns"):
                    yield from _avals(inner)


@pytest.mark.parametrize("cross", [False, True])
def test_no_quadratic_temporaries(cross):
    s, b = 8192, (128, 128)
    ids = jax.ShapeDtypeStruct((2, s), jnp.int32)
    kw = {"kv_segment_ids": ids, "kv_positions": ids} if cross else {}
    for inner in (seqattn.CausalMask(), seqattn.SlidingWindowMask(1024, 0, "bottom_right"),
                  seqattn.ChunkedCausalMask(512)):
        fn = lambda i, p, **k: tpu.block_classes(i, p, inner=inner, block_size=b, **k)  # noqa: E731
        jaxpr = jax.make_jaxpr(fn)(ids, ids, **kw)
        sizes = [int(np.prod(a.shape)) for a in _avals(jaxpr.jaxpr)]
        assert sizes, "no intermediates found"
        tiles = 2 * (s // b[0]) * (s // b[1] + 1)
        # Per-token arrays (a few per row, 2 x [2, S] for the scatter), per-tile arrays; nothing near [S, block].
        assert max(sizes) <= max(2 * 2 * s, tiles), (inner, max(sizes))
        assert max(sizes) < s * b[1] // 4


def test_errors():
    ids = np.ones((2, 8), np.int32)
    with pytest.raises(ValueError, match=r"inner=\(CausalMask\(\) & SlidingWindowMask\(3, 0\)\).*not supported"):
        tpu.block_classes(ids, inner=seqattn.CausalMask() & seqattn.SlidingWindowMask(3))
    with pytest.raises(ValueError, match="prefix length per sequence is not supported"):
        tpu.block_classes(ids, inner=seqattn.PrefixLMMask(np.array([1, 2])))
    with pytest.raises(ValueError, match="inner must be a seqattn mask"):
        tpu.block_classes(ids, inner="causal")
    with pytest.raises(ValueError, match=r"block_size must be positive, got \(0, 8\)"):
        tpu.block_classes(ids, block_size=(0, 8))
    with pytest.raises(ValueError, match="block_size must be an int or a pair"):
        tpu.block_classes(ids, block_size=(8, 8, 8))
    with pytest.raises(ValueError, match=r"segment_ids \(2, 8\) and kv_segment_ids \(3, 8\) must agree"):
        tpu.block_classes(ids, kv_segment_ids=np.ones((3, 8), np.int32))
    with pytest.raises(ValueError, match="kv_positions given without kv_segment_ids"):
        tpu.block_classes(ids, kv_positions=ids)
    with pytest.raises(ValueError, match=r"positions of shape \(2, 7\) must match segment_ids \(2, 8\)"):
        tpu.block_classes(ids, np.zeros((2, 7), np.int32))
    with pytest.raises(ValueError, match=r"segment_ids must hold integers, got dtype float32 of shape \(2, 8\)"):
        tpu.block_classes(ids.astype(np.float32))
    with pytest.raises(ValueError, match=r"segment_ids of shape \(2, 8\) holds values outside int32"):
        tpu.block_classes(ids.astype(np.int64) << 40)
    # In range: wider and narrower integer types are accepted.
    wide = np.ones((ROWS, 45), np.int64)
    np.testing.assert_array_equal(tpu.block_classes(wide, block_size=(7, 5)),
                                  tpu.block_classes(wide.astype(np.uint8), block_size=(7, 5)))
    assert tpu.block_classes(np.zeros((2, 0), np.int32), block_size=4).shape == (2, 1, 0, 0)


def multi_item_request(rng, delimiter):
    """Tokens of one request: query ‖ d ‖ item_1 ‖ d ‖ … ‖ d, empty items included."""
    def words(k):
        w = rng.integers(0, 50, k).astype(np.int32)
        return np.where(w == delimiter, delimiter + 1, w)
    parts = [words(int(rng.integers(1, 9))), [delimiter]]
    for _ in range(int(rng.integers(1, 7))):
        parts += [words(int(rng.choice([0, 0, 1, 2, 3, 5, 8, 13]))), [delimiter]]
    return np.concatenate(parts).astype(np.int32)


def multi_item_batch(rng, rows, s, delimiter):
    """[rows, s] tokens and lengths: requests padded with tokens that include the delimiter (never read)."""
    reqs = []
    while len(reqs) < rows:
        r = multi_item_request(rng, delimiter)
        if len(r) <= s:
            reqs.append(r)
    tokens = rng.integers(0, 50, (rows, s)).astype(np.int32)
    tokens[rng.random((rows, s)) < 0.2] = delimiter
    for i, r in enumerate(reqs):
        tokens[i, :len(r)] = r
    return tokens, np.array([len(r) for r in reqs], np.int32), reqs


def padded_classes(want, nq, nkv):
    out = np.zeros(want.shape[:2] + (nq, nkv), np.int8)
    out[:, :, :want.shape[2], :want.shape[3]] = want
    return out


@pytest.mark.parametrize("block", [(8, 16), (16, 8), (1, 1), (3, 5), (64, 64)])
def test_multi_item_matches_cpp(rng, block):
    s = 70
    fn = jax.jit(lambda t, n, d: tpu.multi_item_classes(t, d, lengths=n, block_size=block))
    nq, nkv = -(-s // block[0]), -(-s // block[1])
    seen = np.zeros(3, np.int64)
    for delimiter in (99, 0, 7):
        tokens, lengths, reqs = multi_item_batch(rng, ROWS, s, delimiter)
        mask = seqattn.MultiItemMask(reqs, delimiter)
        want = padded_classes(mask.block_mask(block_size=block).classes(), nq, nkv)
        # Past a shorter request's blocks the C++ pads with 0 too: check against the dense definition.
        np.testing.assert_array_equal(
            want, padded_classes(tile_classes_from_dense(mask.to_dense(), *block, lengths), nq, nkv))
        got = np.asarray(fn(tokens, lengths, jnp.int32(delimiter)))
        np.testing.assert_array_equal(got, want, err_msg=f"delimiter {delimiter}, block {block}")
        seen += np.bincount(got.ravel(), minlength=3)
    # TV-A2 (docs/semantics/multi-item-topk-kascade.md): rows that are exactly the request (lengths=None), a
    # static delimiter.
    r = np.array([10, 99, 21, 99, 99, 31, 32, 99], np.int32)
    np.testing.assert_array_equal(np.asarray(tpu.multi_item_classes(r[None], 99, block_size=block)),
                                  seqattn.MultiItemMask([r], 99).block_mask(block_size=block).classes())
    if max(block) <= 16:  # the random requests reach every class (1 x 1 tiles are never partial)
        assert seen[0] > 0 and seen[2] > 0 and (seen[1] > 0) == (block != (1, 1)), seen


def test_multi_item_rows_that_are_not_requests_are_causal(rng):
    d = 99
    rows = [
        np.array([1, 2, 3, 4, 5, 6], np.int32),        # no delimiter
        np.array([1, 2, 99, 4, 5, 6], np.int32),       # one delimiter
        np.array([99, 2, 99, 4, 5, 99], np.int32),     # empty query
        np.array([1, 99, 3, 99, 5, 6], np.int32),      # does not end with the delimiter
    ]
    for r in rows:
        with pytest.raises(ValueError):  # the C++ rejects each of them
            seqattn.MultiItemMask([r], d)
    # Requests of 6 tokens in rows of 70 (padding holds delimiters, never read).
    tokens = np.full((ROWS, 70), d, np.int32)
    for i in range(ROWS):
        tokens[i, :6] = rows[i % 4]
    lengths = np.full(ROWS, 6, np.int32)
    for block in ((8, 16), (1, 1)):
        got = np.asarray(tpu.multi_item_classes(tokens, d, lengths=lengths, block_size=block))
        want = seqattn.CausalMask().block_mask(6, batch=ROWS, block_size=block).classes()
        np.testing.assert_array_equal(got, padded_classes(want, *got.shape[2:]))
    # Length 0: nothing.
    assert not np.asarray(tpu.multi_item_classes(tokens, d, lengths=0 * lengths, block_size=(8, 16))).any()


def test_multi_item_vmap_leading_dims_and_temporaries(rng):
    tokens, lengths, reqs = multi_item_batch(rng, ROWS, 70, 99)
    want = seqattn.MultiItemMask(reqs, 99).block_mask(block_size=(8, 16)).classes()
    want = padded_classes(want, 9, 5).reshape(3, 8, 1, 9, 5)
    fn = jax.jit(jax.vmap(lambda t, n: tpu.multi_item_classes(t, 99, lengths=n, block_size=(8, 16))))
    np.testing.assert_array_equal(np.asarray(fn(tokens.reshape(3, 8, 70), lengths.reshape(3, 8))), want)
    np.testing.assert_array_equal(
        np.asarray(tpu.multi_item_classes(tokens.reshape(3, 8, 70), 99, lengths=lengths.reshape(3, 8),
                                          block_size=(8, 16))), want)
    s = 8192
    jaxpr = jax.make_jaxpr(lambda t, n: tpu.multi_item_classes(t, 99, lengths=n, block_size=(128, 128)))(
        jax.ShapeDtypeStruct((2, s), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32))
    sizes = [int(np.prod(a.shape)) for a in _avals(jaxpr.jaxpr)]
    assert max(sizes) <= 4 * 2 * s, max(sizes)  # four range ends per row for one scatter, per-tile arrays


def test_multi_item_errors():
    with pytest.raises(ValueError, match=r"lengths of shape \(3,\) must have tokens' leading shape \(2,\)"):
        tpu.multi_item_classes(np.ones((2, 8), np.int32), 9, lengths=np.ones(3, np.int32))
    with pytest.raises(ValueError, match="delimiter must be a scalar"):
        tpu.multi_item_classes(np.ones((2, 8), np.int32), np.ones(2, np.int32))
    with pytest.raises(ValueError, match="delimiter 4294967296 is outside int32"):
        tpu.multi_item_classes(np.ones((2, 8), np.int32), 2**32)
    with pytest.raises(ValueError, match="block_size must be positive"):
        tpu.multi_item_classes(np.ones((2, 8), np.int32), 9, block_size=(8, -1))


def test_grid_too_large_for_int32_indices():
    ids = jax.ShapeDtypeStruct((64, 2**20), jnp.int32)
    with pytest.raises(ValueError, match=r"block_classes: 64 rows of 1048576 x 1048576 tiles exceed"):
        jax.eval_shape(lambda i: tpu.block_classes(i, block_size=1), ids)
    with pytest.raises(ValueError, match=r"multi_item_classes: 64 rows of 1048576 x 1048576 tiles exceed"):
        jax.eval_shape(lambda i: tpu.multi_item_classes(i, 9, block_size=1), ids)


def test_per_head_masks(rng):
    heads = seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(3, 0, "bottom_right"),
                                 seqattn.CausalMask(), seqattn.PrefixLMMask(4), seqattn.ChunkedCausalMask(5),
                                 seqattn.FullMask()])
    for block in ((7, 5), (1, 1)):  # the shapes of other tests (JAX compiles per shape)
        ids, pos = random_batch(rng, ROWS, 45)
        got = check(ids, pos, heads, block)
        assert got.shape[1] == 6
        np.testing.assert_array_equal(got[:, 0], got[:, 2])  # one computation, one result
    kv_ids, kv_pos = kv_batch(rng, ids, 70)
    check(ids, None, heads, (8, 16), kv_ids, kv_pos)
    one = seqattn.PerHeadMask([seqattn.SlidingWindowMask(-1, 2)])
    check(*random_batch(rng, ROWS, 45), one, (7, 5))
    for bad, what in ((seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.CausalMask() & seqattn.FullMask()]), "inner"),
                      (seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.PrefixLMMask(np.array([1]))]), "head 1")):
        with pytest.raises(ValueError, match=what):
            tpu.block_classes(np.ones((1, 8), np.int32), inner=bad)


def test_exports_for_tpu():
    """The builders lower for TPU (jax.export, no TPU needed) to plain StableHLO: no custom call, nothing that
    needs the host. What XLA:TPU then compiles is not checked here."""
    ids = jax.ShapeDtypeStruct((4, 8192), jnp.int32)
    cases = [
        (lambda i, p: tpu.block_classes(i, p, inner=seqattn.SlidingWindowMask(1024, 0, "bottom_right"),
                                        block_size=512), (ids, ids)),
        (lambda i, p: tpu.block_classes(i, p, kv_segment_ids=i, kv_positions=p, inner=seqattn.ChunkedCausalMask(256),
                                        block_size=(512, 1024)), (ids, ids)),
        (lambda t, n: tpu.multi_item_classes(t, 99, lengths=n, block_size=512),
         (ids, jax.ShapeDtypeStruct((4,), jnp.int32))),
    ]
    for fn, args in cases:
        exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
        assert exported.platforms == ("tpu",)
        assert "custom_call" not in exported.mlir_module()
