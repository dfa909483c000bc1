import numpy as np
import pytest

import seqattn
import oracles as O


def dense(mask, *args, **kw):
    d = mask.to_dense(*args, **kw)
    assert d.dtype == bool
    return d


def ragged(rng, batch=3, max_len=40):
    q = rng.integers(0, max_len, size=batch)
    kv = rng.integers(0, max_len, size=batch)
    return [int(x) for x in q], [int(x) for x in kv]


STRUCTURAL = [
    (lambda a: seqattn.CausalMask(a), lambda q, k, a: O.causal(q, k, a)),
    (lambda a: seqattn.SlidingWindowMask(5, 2, a), lambda q, k, a: O.window(q, k, 5, 2, a)),
    (lambda a: seqattn.SlidingWindowMask(-1, 3, a), lambda q, k, a: O.window(q, k, -1, 3, a)),
    (lambda a: seqattn.ChunkedCausalMask(7, a), lambda q, k, a: O.chunked(q, k, 7, a)),
    (lambda a: seqattn.PrefixLMMask(6, a), lambda q, k, a: O.prefix_lm(q, k, 6, a)),
]


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("case", range(len(STRUCTURAL)))
def test_structural_to_dense_matches_predicates_on_ragged_batches(rng, case, alignment):
    make, oracle = STRUCTURAL[case]
    mask = make(alignment)
    for _ in range(5):
        qs, kvs = ragged(rng)
        d = dense(mask, lengths=(qs, kvs))
        assert d.shape == (3, 1, max(qs), max(kvs))
        for b, (q, k) in enumerate(zip(qs, kvs)):
            np.testing.assert_array_equal(d[b, 0, :q, :k], oracle(q, k, alignment), err_msg=f"{mask!r} ({q}, {k})")
            assert not d[b, 0, q:, :].any() and not d[b, 0, :, k:].any()


def test_full_and_composition(rng):
    q, k = 23, 31
    causal, win, chunk = O.causal(q, k), O.window(q, k, 4, 4), O.chunked(q, k, 5)
    c, w, ch = seqattn.CausalMask(), seqattn.SlidingWindowMask(4, 4), seqattn.ChunkedCausalMask(5)
    np.testing.assert_array_equal(dense(seqattn.FullMask(), q, k)[0, 0], np.ones((q, k), bool))
    np.testing.assert_array_equal(dense(c & w, q, k)[0, 0], causal & win)
    np.testing.assert_array_equal(dense(c | ~w, q, k)[0, 0], causal | ~win)
    np.testing.assert_array_equal(dense(~(ch | w) & c, q, k)[0, 0], ~(chunk | win) & causal)
    assert repr(c & w) == "(CausalMask() & SlidingWindowMask(4, 4))"
    assert isinstance(c & w, seqattn.Mask) and isinstance(c, seqattn.CausalMask)


def test_prefix_lm_per_sequence():
    m = seqattn.PrefixLMMask(np.array([0, 3, 9]))
    d = dense(m, 10, batch=3)
    for b, p in enumerate([0, 3, 9]):
        np.testing.assert_array_equal(d[b, 0], O.prefix_lm(10, 10, p))


def test_document_mask_from_segment_ids_and_positions(rng):
    for _ in range(10):
        ids, pos = O.random_segments(rng, 2, 24, 4)
        for inner, pred in [
            (None, None),
            (seqattn.CausalMask(), lambda i, j, n, m: j <= i),
            (seqattn.SlidingWindowMask(2, 0), lambda i, j, n, m: i - 2 <= j <= i),
            (seqattn.CausalMask("bottom_right"), lambda i, j, n, m: j <= i + (m - n)),
        ]:
            mask = seqattn.DocumentMask(ids, pos, inner)
            d = dense(mask)  # the mask's own lengths: (2, 24)
            assert d.shape == (2, 1, 24, 24)
            for b in range(2):
                want = O.document(ids[b], ids[b], pos[b], pos[b], pred)
                np.testing.assert_array_equal(d[b, 0], want, err_msg=f"{mask!r} ids {ids[b]} pos {pos[b]}")


def test_document_mask_without_positions_and_cross(rng):
    q_ids = np.array([[1, 1, 1, 2, 2, 0]])
    kv_ids = np.array([[1, 1, 2, 2, 2, 2, 0, 0]])
    mask = seqattn.DocumentMask(q_ids, None, seqattn.CausalMask(), kv_segment_ids=kv_ids)
    want = O.document(q_ids[0], kv_ids[0], None, None, lambda i, j, n, m: j <= i)
    np.testing.assert_array_equal(dense(mask)[0, 0], want)


def test_multi_item_matches_sglang_rule():
    a = np.array([10, 11, 99, 21, 22, 99, 31, 99])
    b = np.array([10, 99, 21, 99, 99, 31, 32, 99])
    mask = seqattn.MultiItemMask([a, b], 99)
    d = dense(mask)
    np.testing.assert_array_equal(d[0, 0], O.multi_item(a, 99))
    np.testing.assert_array_equal(d[1, 0], O.multi_item(b, 99))


def test_topk_dense_per_head(rng):
    t, s, k = 9, 20, 4
    idx = np.stack([rng.permutation(s)[:k] for _ in range(2 * t)]).reshape(2, t, k)
    idx[0, 3, 1] = -1
    d = dense(seqattn.TopKMask(idx, s))
    want = np.zeros((2, t, s), bool)
    for b in range(2):
        for q in range(t):
            want[b, q, [i for i in idx[b, q] if i >= 0]] = True
    np.testing.assert_array_equal(d[:, 0], want)

    values = rng.random((2, 3, 7, 9)) < 0.5
    np.testing.assert_array_equal(dense(seqattn.DenseMask(values)), values[:, :, :, :])
    np.testing.assert_array_equal(dense(seqattn.DenseMask(values), lengths=([7, 4], [9, 5]))[1, :, :4, :5],
                                  values[1, :, :4, :5])

    per_head = seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(1, 1), seqattn.FullMask()])
    d = dense(per_head, 8)
    assert d.shape == (1, 3, 8, 8)
    np.testing.assert_array_equal(d[0, 0], O.causal(8, 8))
    np.testing.assert_array_equal(d[0, 1], O.window(8, 8, 1, 1))
    assert d[0, 2].all()


def test_additive_and_packed_bits(rng):
    m = seqattn.CausalMask() & ~seqattn.SlidingWindowMask(2, 0)
    qs, kvs = [5, 13, 0], [9, 13, 4]
    d = dense(m, lengths=(qs, kvs), heads=2)
    add = m.to_additive(lengths=(qs, kvs), heads=2)
    assert add.dtype == np.float32
    np.testing.assert_array_equal(add, np.where(d, 0.0, seqattn.DEFAULT_MASK_VALUE).astype(np.float32))
    bits, indptr = m.pack_bits(lengths=(qs, kvs), heads=2)
    # FlashInfer: per (sequence, head) the row-major q x kv matrix, little bit order, byte padded.
    want, ptr = [], [0]
    for b in range(3):
        for h in range(2):
            seg = np.packbits(d[b, h, : qs[b], : kvs[b]].reshape(-1), bitorder="little")
            want.append(seg)
            ptr.append(ptr[-1] + seg.size)
    np.testing.assert_array_equal(bits, np.concatenate(want))
    np.testing.assert_array_equal(indptr, ptr)


def classify(tile):
    return 0 if not tile.any() else (2 if tile.all() else 1)


def test_block_mask_tiles_match_dense(rng):
    ids, pos = O.random_segments(rng, 2, 50, 4)
    masks = [
        seqattn.CausalMask(),
        seqattn.SlidingWindowMask(7, 0) | seqattn.ChunkedCausalMask(16),
        seqattn.DocumentMask(ids, pos, seqattn.CausalMask()),
        seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(3, 3)]),
    ]
    for mask in masks:
        lengths = mask.lengths or ([50, 37], [50, 45])
        heads = mask.heads or 1
        bq, bk = int(rng.integers(2, 12)), int(rng.integers(2, 70))
        bm = mask.block_mask(lengths=lengths, block_size=(bq, bk), heads=heads)
        d = dense(mask, lengths=lengths, heads=heads)
        classes, ids_of = bm.classes(), bm.partial_tile_ids()
        bits = bm.tile_bits()
        flex = bm.flex_arrays()
        assert bm.block_size == (bq, bk)
        for b in range(2):
            q_len, kv_len = lengths[0][b], lengths[1][b]
            for h in range(heads):
                hb = 0 if bm.heads == 1 else h
                for qb in range(-(-q_len // bq)):
                    partial, full = [], []
                    for kb in range(-(-kv_len // bk)):
                        tile = d[b, h, qb * bq:min(q_len, (qb + 1) * bq), kb * bk:min(kv_len, (kb + 1) * bk)]
                        c = classify(tile)
                        assert classes[b, hb, qb, kb] == c, f"{mask!r} tile ({b}, {h}, {qb}, {kb})"
                        if c == 1:
                            partial.append(kb)
                            pattern = bits[ids_of[b, hb, qb, kb]]
                            np.testing.assert_array_equal(pattern[: tile.shape[0], : tile.shape[1]], tile)
                            assert not pattern[tile.shape[0]:, :].any() and not pattern[:, tile.shape[1]:].any()
                        elif c == 2:
                            full.append(kb)
                    assert flex["kv_num_blocks"][b, hb, qb] == len(partial)
                    assert flex["full_kv_num_blocks"][b, hb, qb] == len(full)
                    np.testing.assert_array_equal(flex["kv_indices"][b, hb, qb, : len(partial)], partial)
                    np.testing.assert_array_equal(flex["full_kv_indices"][b, hb, qb, : len(full)], full)
        assert bm.num_full_tiles == int((classes == 2).sum())
        assert bm.num_partial_tiles == int((classes == 1).sum())


def test_block_mask_head_invariant_and_transposed():
    bm = seqattn.CausalMask().block_mask(256, heads=8, block_size=(64, 64))
    assert bm.heads == 1 and bm.num_distinct_partial_tiles == 1
    t = bm.transposed()
    np.testing.assert_array_equal(t.classes()[0, 0], bm.classes()[0, 0].T)
    assert bm.allowed(0, 5, 100, 99) and not bm.allowed(0, 5, 99, 100)
    assert "BlockMask(batch=1, heads=1" in repr(bm)


def test_ascii_and_svg():
    text = seqattn.to_ascii(seqattn.CausalMask(), 4)
    rows = [r for r in text.splitlines() if r.strip()]
    assert rows[-4:] == ["#...", "##..", "###.", "####"] or rows[:4] == ["#...", "##..", "###.", "####"], text
    svg = seqattn.CausalMask()._repr_svg_()
    assert svg.lstrip().startswith("<svg") and svg.rstrip().endswith("</svg>")
    bm = seqattn.SlidingWindowMask(8, 0).block_mask(64, block_size=(16, 16))
    assert bm._repr_svg_().lstrip().startswith("<svg")
    assert len([r for r in bm.to_ascii().splitlines() if r.strip()]) >= 4


def test_mask_errors_are_value_errors():
    with pytest.raises(ValueError, match="has no lengths of its own; pass q_len"):
        seqattn.CausalMask().to_dense()
    with pytest.raises(ValueError, match="ChunkedCausalMask: chunk must be positive, got 0"):
        seqattn.ChunkedCausalMask(0)
    with pytest.raises(ValueError, match=r"is not one contiguous run"):
        seqattn.DocumentMask(np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="PerHeadMask: 2 masks but attention has 3 heads"):
        seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.FullMask()]).to_dense(4, heads=3)
    with pytest.raises(ValueError, match="block sizes must be positive"):
        seqattn.CausalMask().block_mask(8, block_size=(0, 4))
    with pytest.raises(ValueError, match="DocumentMask: sequence 0 has lengths"):
        seqattn.DocumentMask(np.array([[1, 1, 1]])).to_dense(5)
    with pytest.raises(ValueError, match="alignment"):
        seqattn.CausalMask("diagonal")
    with pytest.raises(ValueError, match="expected a seqattn.Mask"):
        seqattn.to_dense(np.ones((2, 2)))
    with pytest.raises(ValueError, match="out of range|outside|repeated|>= kv_len|must be"):
        seqattn.TopKMask(np.array([[[0, 5]]]), 4)


# ---- read-only parameter properties (what seqattn.tpu reads) -----------------------------------

ALIGNMENTS = [("top_left", seqattn.Alignment.top_left), ("bottom_right", seqattn.Alignment.bottom_right),
              (seqattn.Alignment.bottom_right, seqattn.Alignment.bottom_right)]


@pytest.mark.parametrize("given,alignment", ALIGNMENTS)
def test_structural_masks_expose_their_constructor_arguments(given, alignment):
    m = seqattn.CausalMask(given)
    assert (m.kind, m.alignment) == ("causal", alignment)
    assert seqattn.CausalMask().alignment == seqattn.Alignment.top_left
    for left, right in [(5, 2), (-1, 3), (0, -1), (128, 0)]:
        m = seqattn.SlidingWindowMask(left, right, given)
        assert (m.kind, m.left, m.right, m.alignment) == ("sliding_window", left, right, alignment)
    m = seqattn.SlidingWindowMask(7)
    assert (m.left, m.right, m.alignment) == (7, 0, seqattn.Alignment.top_left)
    for chunk in [1, 7, 4096]:
        m = seqattn.ChunkedCausalMask(chunk, given)
        assert (m.kind, m.chunk, m.alignment) == ("chunked_causal", chunk, alignment)
    for prefix in [0, 6, 1000]:
        m = seqattn.PrefixLMMask(prefix, given)
        assert (m.kind, m.prefix, m.prefix_lengths, m.alignment) == ("prefix_lm", prefix, None, alignment)
    m = seqattn.PrefixLMMask(np.array([3, 0, 9], np.int32), alignment=given)
    assert (m.prefix, m.prefix_lengths, m.alignment) == (None, [3, 0, 9], alignment)
    assert seqattn.FullMask().kind == "full"


def test_mask_properties_are_read_only():
    m = seqattn.SlidingWindowMask(5, 2)
    for name, value in [("left", 1), ("right", 1), ("alignment", seqattn.Alignment.bottom_right)]:
        with pytest.raises(AttributeError):
            setattr(m, name, value)
    with pytest.raises(AttributeError):
        seqattn.ChunkedCausalMask(4).chunk = 8
    with pytest.raises(AttributeError):
        seqattn.PrefixLMMask(4).prefix = 8


def test_per_head_mask_exposes_its_masks():
    heads = [seqattn.CausalMask("bottom_right"), seqattn.SlidingWindowMask(4, 0), seqattn.ChunkedCausalMask(3),
             seqattn.PrefixLMMask(2)]
    m = seqattn.PerHeadMask(heads)
    assert m.kind == "per_head"
    assert isinstance(m.masks, tuple) and len(m.masks) == 4
    assert all(got is want for got, want in zip(m.masks, heads))
    assert m.masks[1].left == 4 and m.masks[2].chunk == 3 and m.masks[3].prefix == 2
    assert m.masks[0].alignment == seqattn.Alignment.bottom_right
    nested = seqattn.PerHeadMask((m, seqattn.FullMask()))
    assert nested.masks[0].masks[1].left == 4
    del heads
    assert m.masks[2].chunk == 3  # the masks live as long as the PerHeadMask
