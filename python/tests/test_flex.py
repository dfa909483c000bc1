"""Flex BlockMask parity: seqattn.torch.block_mask against torch's create_block_mask.

Element by element, all eight block arrays (partial and full, kv and q side),
for the same pattern written as a flex mask_mod: causal (both alignments),
sliding window, documents, prefix-LM; lengths that are not multiples of the
block size; B/H broadcast. Then flex_attention runs with our BlockMask and
with torch's and must agree.
"""

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as fa

import seqattn
import seqattn.torch as st

ARRAYS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


def assert_same_block_mask(ours, theirs):
    assert tuple(ours.BLOCK_SIZE) == tuple(theirs.BLOCK_SIZE)
    assert tuple(ours.seq_lengths) == tuple(theirs.seq_lengths)
    for name in ARRAYS:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a is None) == (b is None), name
        if b is None:
            continue
        assert a.dtype == b.dtype == torch.int32, name
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs torch {tuple(b.shape)}"
        assert torch.equal(a, b), name


def documents(rng, batch, n):
    ids = np.zeros((batch, n), np.int32)
    for b in range(batch):
        t, doc = 0, 1
        while t < n:
            length = int(rng.integers(1, n // 4 + 2))
            ids[b, t : t + length] = doc
            t += length
            doc += 1
    return ids


def cases():
    """(name, seqattn mask, torch mask_mod, B, H, Q_LEN, KV_LEN)."""
    rng = np.random.default_rng(4)
    out = []
    for q_len, kv_len in ((256, 256), (300, 300), (200, 333), (333, 200), (1, 130)):
        off = kv_len - q_len
        out.append(("causal", seqattn.CausalMask(), lambda b, h, q, kv: kv <= q, 2, 3, q_len, kv_len))
        out.append(("causal_br", seqattn.CausalMask("bottom_right"),
                    lambda b, h, q, kv, off=off: kv <= q + off, None, None, q_len, kv_len))
        out.append(("window", seqattn.SlidingWindowMask(70, 0), lambda b, h, q, kv: (kv <= q) & (q - kv <= 70), 1, 2,
                    q_len, kv_len))
        out.append(("window_2sided", seqattn.SlidingWindowMask(40, 20, "bottom_right"),
                    lambda b, h, q, kv, off=off: (kv - q - off >= -40) & (kv - q - off <= 20), 2, None, q_len, kv_len))
        out.append(("prefix_lm", seqattn.PrefixLMMask(90), lambda b, h, q, kv: (kv < 90) | (kv <= q), 1, 1, q_len,
                    kv_len))
        if q_len == kv_len:
            ids = documents(rng, 2, q_len)
            doc = torch.from_numpy(ids)
            out.append(("documents", seqattn.DocumentMask(ids, inner=seqattn.CausalMask()),
                        lambda b, h, q, kv, doc=doc: (doc[b, q] == doc[b, kv]) & (kv <= q), 2, 2, q_len, kv_len))
            out.append(("documents_window", seqattn.DocumentMask(ids, inner=seqattn.SlidingWindowMask(16, 0)),
                        lambda b, h, q, kv, doc=doc: (doc[b, q] == doc[b, kv]) & (kv <= q) & (q - kv <= 16), 2, 1,
                        q_len, kv_len))
    return out


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[5]}x{c[6]}" for c in CASES])
@pytest.mark.parametrize("block", [128, (64, 32)], ids=["b128", "b64x32"])
def test_block_mask_matches_create_block_mask(case, block):
    name, mask, mask_mod, B, H, q_len, kv_len = case
    theirs = fa.create_block_mask(mask_mod, B, H, q_len, kv_len, device="cpu", BLOCK_SIZE=block)
    ours = st.block_mask(mask, B, H, q_len, kv_len, BLOCK_SIZE=block)
    assert isinstance(ours, fa.BlockMask)
    assert_same_block_mask(ours, theirs)
    # Our mask_mod is the same predicate, element by element.
    want = fa.create_mask(mask_mod, B, H, q_len, kv_len, device="cpu")
    got = fa.create_mask(ours.mask_mod, B, H, q_len, kv_len, device="cpu")
    assert torch.equal(got, want)


def test_without_separate_full_blocks():
    mask_mod = lambda b, h, q, kv: kv <= q  # noqa: E731
    theirs = fa.create_block_mask(mask_mod, 1, 1, 500, 500, device="cpu", separate_full_blocks=False)
    ours = st.block_mask(seqattn.CausalMask(), 1, 1, 500, 500, separate_full_blocks=False)
    assert ours.full_kv_num_blocks is None
    assert_same_block_mask(ours, theirs)


def test_per_head_and_kinds_flex_has_no_builder_for():
    # Per-head masks and top-k / multi-item: compared against create_block_mask of a dense lookup.
    rng = np.random.default_rng(2)
    n = 260
    idx = np.stack([rng.choice(n, size=5, replace=False) for _ in range(n)]).astype(np.int32)
    masks = [
        seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(30, 0), seqattn.FullMask()]),
        seqattn.TopKMask(idx[None], n),
        seqattn.MultiItemMask(np.array([5] * 40 + [1] + [7] * 100 + [1] + [8] * 117 + [1]), 1),
    ]
    for m in masks:
        H = 3 if m.heads == 3 else 1
        dense = torch.from_numpy(m.to_dense(n, n, heads=H))
        lookup = lambda b, h, q, kv, d=dense: d[b, h, q, kv]  # noqa: E731
        theirs = fa.create_block_mask(lookup, 1, H, n, n, device="cpu", BLOCK_SIZE=(64, 128))
        assert_same_block_mask(st.block_mask(m, 1, H, n, n, BLOCK_SIZE=(64, 128)), theirs)


def test_seqattn_block_mask_input():
    bm = seqattn.CausalMask().block_mask(300, block_size=(128, 128))
    theirs = fa.create_block_mask(lambda b, h, q, kv: kv <= q, 1, 1, 300, 300, device="cpu")
    assert_same_block_mask(st.block_mask(bm, 1, 1), theirs)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_runs_with_our_block_mask():
    torch.manual_seed(0)
    B, H, n, d = 2, 2, 300, 16
    ids = documents(np.random.default_rng(7), B, n)
    doc = torch.from_numpy(ids)
    mask_mod = lambda b, h, q, kv: (doc[b, q] == doc[b, kv]) & (kv <= q)  # noqa: E731
    ours = st.block_mask(seqattn.DocumentMask(ids, inner=seqattn.CausalMask()), B, H, n, n)
    theirs = fa.create_block_mask(mask_mod, B, H, n, n, device="cpu")
    q, k, v = (torch.randn(B, H, n, d) for _ in range(3))
    out_ours = fa.flex_attention(q, k, v, block_mask=ours)
    out_theirs = fa.flex_attention(q, k, v, block_mask=theirs)
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-5, atol=1e-5)
    # And both equal plain softmax attention under the dense mask.
    allowed = fa.create_mask(mask_mod, B, H, n, n, device="cpu")
    s = (q @ k.transpose(-1, -2)) / d**0.5
    ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(out_ours, ref, rtol=1e-4, atol=1e-4)


def test_errors_name_the_shapes():
    ids = np.ones((2, 128), np.int32)
    with pytest.raises(ValueError, match="has 2 sequences, which neither equals B=3"):
        st.block_mask(seqattn.DocumentMask(ids), 3, 1)
    with pytest.raises(ValueError, match="Q_LEN is required"):
        st.block_mask(seqattn.CausalMask(), 1, 1)


def test_block_size_of_the_wrong_form_names_the_argument():
    for bad in [(128,), (64, 64, 64), "128", (64.5, 64)]:
        with pytest.raises(ValueError, match=r"block_mask: BLOCK_SIZE must be an int or a pair \(block_q, block_kv\)"):
            st.block_mask(seqattn.CausalMask(), 1, 1, 256, 256, BLOCK_SIZE=bad)


@pytest.mark.parametrize("B", [2, 3])
def test_prefix_lm_with_one_prefix_per_sequence(B):
    prefix = np.array([3, 200, 129][:B], np.int32)
    lengths = torch.from_numpy(prefix)
    mask_mod = lambda b, h, q, kv: (kv < lengths[b]) | (kv <= q)  # noqa: E731
    theirs = fa.create_block_mask(mask_mod, B, 2, 256, 256, device="cpu", BLOCK_SIZE=(64, 32))
    ours = st.block_mask(seqattn.PrefixLMMask(prefix), B, 2, 256, 256, BLOCK_SIZE=(64, 32))
    assert_same_block_mask(ours, theirs)
    got = fa.create_mask(ours.mask_mod, B, 2, 256, 256, device="cpu")
    assert torch.equal(got, fa.create_mask(mask_mod, B, 2, 256, 256, device="cpu"))
    with pytest.raises(ValueError, match=f"has {B} sequences, which neither equals B=4"):
        st.block_mask(seqattn.PrefixLMMask(prefix), 4, 1, 256, 256)
