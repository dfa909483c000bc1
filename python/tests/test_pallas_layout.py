"""seqattn.pallas.static_layout (the C++ Tpu policy) against the dense reference builder.

For random masks of every kind -- structural, compositions, per-head, documents, top-k, multi-item, dense -- on
ragged BSHD batches with padding and on packed THD streams, block sizes that do not divide the lengths, and empty
sequences: the layout equals ``layout_from_dense`` of the mask's dense form (same rows and entries; tiles equal
by content), and ``validate`` accepts it. Errors are ValueErrors naming the argument.
"""

import numpy as np
import pytest

import seqattn
import seqattn.pallas as sp
import oracles as O


def _alignment(rng):
    return "top_left" if rng.random() < 0.5 else "bottom_right"


def _structural(rng):
    a = _alignment(rng)
    return [
        lambda: seqattn.CausalMask(a),
        lambda: seqattn.SlidingWindowMask(int(rng.integers(-1, 60)), int(rng.integers(-1, 20)), a),
        lambda: seqattn.ChunkedCausalMask(int(rng.integers(1, 50)), a),
        lambda: seqattn.PrefixLMMask(int(rng.integers(0, 80)), a),
        lambda: seqattn.FullMask(),
    ][int(rng.integers(0, 5))]()


def _random_mask(rng, max_len):
    """A mask of a random kind and its own (q_lens, kv_lens) when it is built from data, else None."""
    batch = int(rng.integers(1, 4))
    kind = int(rng.integers(0, 9))
    if kind <= 1:
        return _structural(rng), None
    if kind == 2:
        a, b, c = _structural(rng), _structural(rng), _structural(rng)
        return [a & b, a | ~b, ~a, (a | b) & ~c][int(rng.integers(0, 4))], None
    if kind == 3:
        return seqattn.PerHeadMask([_structural(rng) for _ in range(int(rng.integers(1, 5)))]), None
    if kind == 4:
        t = int(rng.integers(1, max_len))
        ids, pos = O.random_segments(rng, batch, t, 5, shift_pos=False)
        inner = [None, seqattn.CausalMask(), seqattn.SlidingWindowMask(int(rng.integers(0, 30)), 0)][
            int(rng.integers(0, 3))]
        mask = seqattn.DocumentMask(ids, None, inner)
        if rng.random() < 0.3:
            mask = mask & seqattn.SlidingWindowMask(int(rng.integers(0, 40)), 0)
        return mask, ([t] * batch, [t] * batch)
    if kind == 5:
        t, s, k = int(rng.integers(1, max_len)), int(rng.integers(1, max_len)), int(rng.integers(1, 12))
        idx = np.stack([rng.permutation(max(s, k))[:k] for _ in range(batch * t)]).reshape(batch, t, k)
        idx = np.where((idx >= s) | (rng.random(idx.shape) < 0.2), -1, idx)
        mask = seqattn.TopKMask(idx, s)
        if rng.random() < 0.3:
            mask = mask | seqattn.CausalMask("bottom_right")
        return mask, ([t] * batch, [s] * batch)
    if kind == 6:
        seqs = []
        for _ in range(batch):
            items = [int(rng.integers(0, max_len // 8)) for _ in range(int(rng.integers(1, 5)))]
            tokens = list(range(10, 10 + int(rng.integers(1, max_len // 3))))
            for n in items:
                tokens += [99] + list(range(20, 20 + n))
            seqs.append(np.array(tokens + [99]))
        lens = [len(s) for s in seqs]
        return seqattn.MultiItemMask(seqs, 99), (lens, lens)
    if kind == 7:
        q, kv = int(rng.integers(1, max_len)), int(rng.integers(1, max_len))
        heads = int(rng.integers(1, 4))
        values = rng.random((batch, heads, q, kv)) < rng.choice([0.05, 0.5, 0.95])
        return seqattn.DenseMask(values), ([q] * batch, [kv] * batch)
    return seqattn.CausalMask(_alignment(rng)) & seqattn.SlidingWindowMask(int(rng.integers(0, 90)), 0), None


def _ragged(rng, max_len):
    batch = int(rng.integers(1, 4))
    q = [int(x) for x in rng.integers(0, max_len, size=batch)]
    kv = [int(x) for x in rng.integers(0, max_len, size=batch)]
    return q, kv


def _per_sequence_dense(mask, q_lens, kv_lens, heads):
    """[B, heads, max q, max kv] (at least 1 x 1 so that it can be indexed)."""
    d = mask.to_dense(lengths=(q_lens, kv_lens), heads=heads)
    return d


def _fit_heads(dense, mask_heads):
    if mask_heads == 1:
        assert (dense == dense[:, :1]).all(), "a one-head layout for a head-dependent mask"
        return dense[:, :1]
    return dense


def _assert_same_layout(got, want, what):
    assert got.shape == want.shape, what
    sp.validate(got)
    for prefix, other in (("q", "kv"), ("kv", "q")):
        for field in ("start", "count", other):
            np.testing.assert_array_equal(getattr(got, f"{prefix}_{field}"), getattr(want, f"{prefix}_{field}"),
                                          err_msg=f"{what}: {prefix}_{field}")
        g_tile, w_tile = getattr(got, f"{prefix}_tile"), getattr(want, f"{prefix}_tile")
        g_tiles, w_tiles = getattr(got, f"{prefix}_tiles"), getattr(want, f"{prefix}_tiles")
        g_fetch, w_fetch = getattr(got, f"{prefix}_fetch"), getattr(want, f"{prefix}_fetch")
        assert g_tile.dtype == np.int32 and g_tiles.dtype == np.int8, what
        assert g_tiles.shape == w_tiles.shape, f"{what}: {prefix}_tiles {g_tiles.shape} vs {w_tiles.shape}"
        np.testing.assert_array_equal(g_tile < 0, w_tile < 0, err_msg=f"{what}: {prefix}_tile kinds")
        np.testing.assert_array_equal(g_tile == -1, w_tile == -1, err_msg=f"{what}: {prefix}_tile kinds")
        seen_partial = False
        for e in range(g_tile.size):
            if g_tile[e] >= 0:
                seen_partial = True
                np.testing.assert_array_equal(g_tiles[g_tile[e]], w_tiles[w_tile[e]], err_msg=f"{what}: {prefix} {e}")
            if seen_partial:
                np.testing.assert_array_equal(g_tiles[g_fetch[e]], w_tiles[w_fetch[e]],
                                              err_msg=f"{what}: {prefix}_fetch {e}")
            else:
                assert g_fetch[e] == 0 and w_fetch[e] == 0, f"{what}: {prefix}_fetch {e}"


BLOCKS = [(8, 8), (16, 32), (32, 16), (24, 40), (64, 64), (128, 128)]


def test_bshd_layouts_of_random_masks_match_the_dense_reference(rng):
    for case in range(60):
        mask, own = _random_mask(rng, 150)
        q_lens, kv_lens = own if own is not None else _ragged(rng, 150)
        heads = mask.heads or int(rng.integers(1, 4))
        bq, bk = BLOCKS[int(rng.integers(0, len(BLOCKS)))]
        q_len = max(1, max(q_lens)) + int(rng.integers(0, 2)) * int(rng.integers(0, 2 * bq))
        kv_len = max(1, max(kv_lens)) + int(rng.integers(0, 2)) * int(rng.integers(0, 2 * bk))
        what = f"case {case}: {mask!r}, lengths {q_lens} / {kv_lens}, padded ({q_len}, {kv_len}), block ({bq}, {bk})"
        got = sp.static_layout(mask, q_len, kv_len, heads=heads, block_q=bq, block_kv=bk, q_lens=q_lens,
                               kv_lens=kv_lens)
        d = _per_sequence_dense(mask, q_lens, kv_lens, heads)
        padded = np.zeros((len(q_lens), heads, q_len, kv_len), bool)
        padded[:, :, : d.shape[2], : d.shape[3]] = d
        want = sp.layout_from_dense(_fit_heads(padded, got.shape.mask_heads), block_q=bq, block_kv=bk)
        _assert_same_layout(got, want, what)
        np.testing.assert_array_equal(sp.dense_from_layout(got), _fit_heads(padded, got.shape.mask_heads),
                                      err_msg=what)


def test_thd_layouts_pack_each_sequence_in_its_own_coordinates(rng):
    for case in range(60):
        mask, own = _random_mask(rng, 100)
        q_lens, kv_lens = own if own is not None else _ragged(rng, 100)
        heads = mask.heads or int(rng.integers(1, 4))
        bq, bk = BLOCKS[int(rng.integers(0, len(BLOCKS)))]
        cu_q, cu_kv = np.cumsum([0] + q_lens), np.cumsum([0] + kv_lens)
        q_len = max(1, int(cu_q[-1]) + int(rng.integers(0, 2)) * int(rng.integers(0, 100)))
        kv_len = max(1, int(cu_kv[-1]) + int(rng.integers(0, 2)) * int(rng.integers(0, 100)))
        what = f"case {case}: {mask!r}, THD {q_lens} / {kv_lens} in ({q_len}, {kv_len}), block ({bq}, {bk})"
        got = sp.static_layout(mask, q_len, kv_len, heads=heads, block_q=bq, block_kv=bk, cu_seqlens=cu_q,
                               cu_seqlens_kv=cu_kv)
        d = _per_sequence_dense(mask, q_lens, kv_lens, heads)
        stream = np.zeros((1, heads, q_len, kv_len), bool)
        for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
            stream[0, :, cu_q[b]: cu_q[b] + ql, cu_kv[b]: cu_kv[b] + kl] = d[b, :, :ql, :kl]
        want = sp.layout_from_dense(_fit_heads(stream, got.shape.mask_heads), block_q=bq, block_kv=bk)
        _assert_same_layout(got, want, what)


def test_causal_layout_of_a_long_sequence_lists_the_lower_triangle():
    lay = sp.static_layout(seqattn.CausalMask(), 4096, heads=8, block_q=128, block_kv=128)
    n = 4096 // 128
    assert lay.shape == sp.LayoutShape(1, 1, 4096, 4096, 128, 128, n, n)
    np.testing.assert_array_equal(lay.q_count, np.arange(1, n + 1))
    np.testing.assert_array_equal(lay.kv_count, np.arange(n, 0, -1))
    assert lay.q_tiles.shape == (1, 128, 128)  # one diagonal tile, shared by every row
    np.testing.assert_array_equal(lay.q_tiles[0], np.tril(np.ones((128, 128), np.int8)))
    np.testing.assert_array_equal(lay.kv_tiles[0], np.triu(np.ones((128, 128), np.int8)))
    sp.validate(lay)


def test_same_lengths_default_batch_and_kv_lens():
    lay = sp.static_layout(seqattn.FullMask(), 40, q_lens=[40, 10])
    assert lay.shape.batch == 2 and lay.shape.kv_len == 40
    np.testing.assert_array_equal(lay.q_count, [1, 1])
    # The second sequence's 10 x 10 corner is a partial tile: a full one would claim the padding.
    assert lay.q_tile.tolist() == [0, 1]
    assert int(lay.q_tiles[1].sum()) == 100


def test_page_table_checks_the_block_table_and_zeroes_unread_entries():
    table = np.array([[7, 3, -1, -1], [2, 5, 6, 1], [4, -1, -1, -1]])
    got = sp.page_table(table, [200, 512, 1], num_pages=8, block_kv=128)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[7, 3, 0, 0], [2, 5, 6, 1], [4, 0, 0, 0]])
    with pytest.raises(ValueError, match="page_size must equal block_kv"):
        sp.page_table(table, [200, 512, 1], num_pages=8, block_kv=128, page_size=64)
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\] = 7"):
        sp.page_table(table, [200, 512, 1], num_pages=7, block_kv=128)
    with pytest.raises(ValueError, match=r"kv_lens\[2\] = 129 must lie|block_table\[2\]\[1\] = -1"):
        sp.page_table(table, [200, 512, 129], num_pages=8, block_kv=128)
    with pytest.raises(ValueError, match=r"kv_lens must have shape \[3\]"):
        sp.page_table(table, [200, 512], num_pages=8, block_kv=128)
    with pytest.raises(ValueError, match="page_table: num_pages must be >= 1"):
        sp.page_table(table, [200, 512, 1], num_pages=0, block_kv=128)


@pytest.mark.parametrize("call, match", [
    (lambda: sp.static_layout("causal", 8), "mask must be a seqattn.Mask"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 0), "q_len must be >= 1"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, 2.5), "kv_len must be an int"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, block_q=0), "block_q must be >= 1"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, block_kv=1 << 17), "block_kv"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, heads=0), "heads must be >= 1"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, q_lens=[5, 9]), r"q_lens\[1\] = 9 must lie in \[0, q_len = 8\]"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, q_lens=[5, 6], kv_lens=[5]), "kv_lens must have one length"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, q_lens=[[5]]), "q_lens must be one-dimensional"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, q_lens=[1.5]), "q_lens: expected an integer array"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, cu_seqlens=[1, 4]), "cu_seqlens_q must start at 0"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, cu_seqlens=[0, 5, 3]), "cu_seqlens_q must be non-decreasing"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 16, cu_seqlens=[0, 4, 20]), "past q_len = 16"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, cu_seqlens=[0, 4], cu_seqlens_kv=[0, 2, 4]), "cu_seqlens_kv"),
    (lambda: sp.static_layout(seqattn.CausalMask(), 8, batch=2, cu_seqlens=[0, 4]), "batch must be 1"),
    (lambda: sp.static_layout(seqattn.PerHeadMask([seqattn.CausalMask()] * 2), 8, heads=3), "heads"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
