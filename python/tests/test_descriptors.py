import numpy as np
import pytest

import seqattn
from oracles import random_segments, te_reference

MASKS = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"]


@pytest.mark.parametrize("mask_type", MASKS)
def test_thd_self_attention_matches_te_reference(rng, mask_type):
    for _ in range(20):
        b, t, m = rng.integers(1, 4), rng.integers(1, 24), rng.integers(1, 5)
        ids, pos = random_segments(rng, b, t, m)
        got = seqattn.get_seqlens_and_offsets(ids, pos, mask_type, seqattn.QKVLayout.THD_THD_THD,
                                              max_segments_per_seq=m)
        want = te_reference(ids, ids, pos, pos, mask_type, "thd", m)
        for g, w, name in zip(got, want, ["q_seqlens", "kv_seqlens", "q_offsets", "kv_offsets"]):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} for ids {ids.tolist()} pos {pos.tolist()}")


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
def test_thd_cross_attention_matches_te_reference(rng, mask_type):
    for _ in range(20):
        b, m = rng.integers(1, 3), rng.integers(1, 4)
        q_ids, q_pos = random_segments(rng, b, rng.integers(1, 20), m)
        kv_ids, kv_pos = random_segments(rng, b, rng.integers(1, 20), m)
        desc = seqattn.SequenceDescriptor.from_segment_ids_and_pos((q_ids, kv_ids), (q_pos, kv_pos))
        got = desc.get_seqlens_and_offsets(mask_type, seqattn.SeqLayout.thd, (-1, -1), m)
        want = te_reference(q_ids, kv_ids, q_pos, kv_pos, mask_type, "thd", m)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("mask_type", MASKS)
def test_bshd_matches_te_reference(rng, mask_type):
    for _ in range(10):
        b, t = rng.integers(1, 4), rng.integers(1, 16)
        lens = rng.integers(0, t + 1, size=b)
        ids = (np.arange(t)[None, :] < lens[:, None]).astype(np.int64)  # int64 in: converted, values fit
        pos = np.broadcast_to(np.arange(t), (b, t))
        got = seqattn.get_seqlens_and_offsets(ids, pos, mask_type, "bshd")
        want = te_reference(ids, ids, pos, pos, mask_type, "bshd", 1)
        np.testing.assert_array_equal(got.q_seqlens, want[0])
        np.testing.assert_array_equal(got.kv_seqlens, want[1])
        assert got.q_offsets.shape == (0,)


def test_vmapped_leading_dims_broadcast_positions(rng):
    e, b, t, m = 3, 2, 12, 3
    rows = [random_segments(rng, b, t, m, shift_pos=False)[0] for _ in range(e)]
    ids = np.stack(rows)  # (E, B, T)
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()  # (B, T): unbatched, as under vmap
    got = seqattn.get_seqlens_and_offsets(ids, pos, "padding_causal", "thd", max_segments_per_seq=m)
    assert got.q_seqlens.shape == (e, b, m) and got.q_offsets.shape == (e, b, m + 1)
    # Each vmapped slice equals the call on that slice alone.
    for i in range(e):
        one = seqattn.get_seqlens_and_offsets(ids[i], pos, "padding_causal", "thd", max_segments_per_seq=m)
        for g, w in zip(got, one):
            np.testing.assert_array_equal(g[i], w)


def test_te_style_enums_and_unpacking():
    ids = np.array([[1, 1, 2, 2, 2, 0]], np.int32)
    pos = np.array([[0, 1, 0, 1, 2, 0]], np.int32)
    desc = seqattn.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    by_enum = desc.get_seqlens_and_offsets(seqattn.AttnMaskType.padding_causal, seqattn.SeqLayout.thd,
                                           max_segments_per_seq=2)
    by_name = desc.get_seqlens_and_offsets("causal_padding", seqattn.QKVLayout.T3HD, max_segments_per_seq=2)
    q_len, kv_len, q_off, kv_off = by_name
    np.testing.assert_array_equal(q_len, [[2, 3]])
    np.testing.assert_array_equal(q_off, [[0, 2, -1]])
    for a, b in zip(by_enum, by_name):
        np.testing.assert_array_equal(a, b)
    assert by_name.seq_len == (6, 6)
    assert seqattn.QKVLayout.THD_T2HD.is_thd() and not seqattn.QKVLayout.BS3HD.is_thd()


def naive_pack(q_lens, q_offs, seq_len):
    """TE's post-processing (§2.8): positive lengths to the front (0 fill), offsets made global."""
    rows = q_lens.reshape(-1, q_lens.shape[-1])
    offs = q_offs.reshape(-1, q_offs.shape[-1])
    lens, starts = [], []
    for r in range(len(rows)):
        lens += [int(x) for x in rows[r] if x > 0]
        starts += [int(o) + r * seq_len for o in offs[r] if o >= 0][: sum(1 for x in rows[r] if x > 0)]
    n = len(lens)
    total = rows.size
    packed_lens = np.array(lens + [0] * (total - n), np.int32)
    packed_offs = np.array(starts + [len(rows) * seq_len] * (offs.size - n), np.int32)
    cu = np.concatenate(([0], np.cumsum(packed_lens))).astype(np.int32)
    return n, packed_lens, packed_offs, cu


def test_pack_segments_matches_naive_packing(rng):
    for _ in range(20):
        b, t, m = rng.integers(1, 4), rng.integers(1, 20), rng.integers(1, 4)
        ids, pos = random_segments(rng, b, t, m)
        d = seqattn.get_seqlens_and_offsets(ids, pos, "padding_causal", "thd", max_segments_per_seq=m)
        p = seqattn.pack_segments(d)
        n, lens, offs, cu = naive_pack(d.q_seqlens, d.q_offsets, t)
        assert p.num_segments == n
        np.testing.assert_array_equal(p.q_seqlens.reshape(-1), lens)
        np.testing.assert_array_equal(p.q_offsets.reshape(-1), offs)
        np.testing.assert_array_equal(p.q_cu_seqlens, cu)
        assert p.total_tokens == (b * t, b * t)


def test_from_seqlens_and_offsets_round_trip():
    lens = np.array([[2, 3, -1], [4, -1, -1]], np.int32)
    offs = np.array([[0, 2, -1, -1], [1, -1, -1, -1]], np.int32)
    d = seqattn.SequenceDescriptor.from_seqlens_and_offsets(lens, offs).get_seqlens_and_offsets("padding", "thd")
    p = seqattn.pack_segments(d, seq_len=6)
    np.testing.assert_array_equal(p.q_cu_seqlens, [0, 2, 5, 9, 9, 9, 9])
    np.testing.assert_array_equal(p.q_offsets.reshape(-1)[:3], [0, 2, 7])


def test_errors_are_value_errors_with_the_message():
    ids = np.array([[1, 1, 2, 1]], np.int32)  # segment 1 is not one run
    pos = np.array([[0, 1, 0, 2]], np.int32)
    with pytest.raises(ValueError, match="segment"):
        seqattn.get_seqlens_and_offsets(ids, pos, "padding", "thd", max_segments_per_seq=2)
    with pytest.raises(ValueError, match='Unsupported attn_mask_type="causal_sideways"'):
        seqattn.get_seqlens_and_offsets(ids, pos, "causal_sideways", "thd")
    with pytest.raises(ValueError, match="segment_pos is required"):
        seqattn.SequenceDescriptor.from_segment_ids_and_pos(ids)
    with pytest.raises(ValueError, match="do not fit int32"):
        seqattn.get_seqlens_and_offsets(np.array([[2**40]]), np.array([[0]]), "padding", "thd")
    with pytest.raises(ValueError, match="expected an integer array"):
        seqattn.get_seqlens_and_offsets(np.array([[1.0]]), np.array([[0]]), "padding", "thd")
    with pytest.raises(ValueError, match="max_segments_per_seq must be >= 1, got 0"):
        seqattn.get_seqlens_and_offsets(np.array([[1]]), np.array([[0]]), "padding", "thd", max_segments_per_seq=0)
    # The message is exactly C++'s: compare against a second spelling of the same failure.
    with pytest.raises(ValueError) as a:
        seqattn.pack_segments(seqattn.SequenceDescriptor.from_seqlens(np.array([3], np.int32))
                              .get_seqlens_and_offsets("padding", "bshd"))
    assert "pass seq_len" in str(a.value)
