import numpy as np
import pytest

import seqattn
import oracles as O


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(out, lse, want_out, want_lse, atol=2e-5):
    np.testing.assert_allclose(out, want_out, atol=atol, rtol=1e-4)
    finite = np.isfinite(want_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=atol * 10, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64, 72, 80])
def test_bshd_random_shapes_masks_gqa(rng, head_dim):
    for trial in range(4):
        b, sq, skv = rng.integers(1, 3), rng.integers(1, 150), rng.integers(1, 150)
        hkv = int(rng.choice([1, 2]))
        hq = hkv * int(rng.choice([1, 2, 4]))
        dv = head_dim if trial % 2 else 40
        q, k, v = randn(rng, b, sq, hq, head_dim), randn(rng, b, skv, hkv, head_dim), randn(rng, b, skv, hkv, dv)
        mask = [seqattn.FullMask(), seqattn.CausalMask("bottom_right"),
                seqattn.SlidingWindowMask(9, 3) & seqattn.CausalMask(), seqattn.ChunkedCausalMask(32)][trial]
        out, lse = seqattn.attention(q, k, v, mask, threads=2)
        assert out.shape == (b, sq, hq, dv) and out.dtype == np.float32
        assert lse.shape == (b, hq, sq) and lse.dtype == np.float32
        allowed = mask.to_dense(int(sq), int(skv), batch=int(b))
        want_out, want_lse = O.attention(q, k, v, allowed)
        check(out, lse, want_out, want_lse)


def test_scale_softcap_sinks(rng):
    q, k, v = randn(rng, 1, 33, 2, 32), randn(rng, 1, 40, 2, 32), randn(rng, 1, 40, 2, 32)
    out, lse = seqattn.attention(q, k, v, seqattn.CausalMask(), scale=0.3, softcap=5.0)
    want_out, want_lse = O.attention(q, k, v, O.causal(33, 40), scale=0.3, softcap=5.0)
    check(out, lse, want_out, want_lse)
    # Sinks: an extra logit per head in every row's denominator, with no value.
    sinks = np.array([0.5, -1.0], np.float32)
    out, lse = seqattn.attention(q, k, v, sinks=sinks)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(32)
    full = np.concatenate([s, np.broadcast_to(sinks[None, :, None, None], s.shape[:3] + (1,))], -1)
    want_lse = np.log(np.exp(full).sum(-1))
    p = np.exp(s - want_lse[..., None])
    np.testing.assert_allclose(lse, want_lse, atol=1e-4)
    np.testing.assert_allclose(out, np.einsum("bhqk,bkhd->bqhd", p, v), atol=2e-5)


def test_document_segments_empty_segments_and_fully_masked_rows(rng):
    ids = np.array([[1, 1, 1, 0, 0, 2, 2, 3, 3, 3, 3, 0]], np.int32)
    pos = np.array([[0, 1, 2, 0, 0, 0, 1, 0, 1, 2, 3, 0]], np.int32)
    q, k, v = randn(rng, 1, 12, 4, 24), randn(rng, 1, 12, 2, 24), randn(rng, 1, 12, 2, 24)
    out, lse = seqattn.attention(q, k, v, seqattn.CausalMask(), segment_ids=ids, positions=pos)
    allowed = O.document(ids[0], ids[0], pos[0], pos[0], lambda i, j, n, m: j <= i)[None, None]
    want_out, want_lse = O.attention(q, k, v, allowed)
    check(out, lse, want_out, want_lse)
    # Padding rows attend to nothing: out 0 and lse -inf (not the mean of v, not NaN).
    assert np.all(out[0, ids[0] == 0] == 0) and np.all(np.isneginf(lse[0][:, ids[0] == 0]))


def test_thd_matches_per_segment_bshd(rng):
    # Segments of lengths 5, 0 (empty), 17, 1 with gaps between them, GQA 4/2, head dim 80.
    lens, gaps = [5, 0, 17, 1], [2, 0, 3, 1]
    offsets, cursor = [], 0
    for n, g in zip(lens, gaps):
        cursor += g
        offsets.append(cursor)
        cursor += n
    total = cursor + 2
    q, k, v = randn(rng, total, 4, 80), randn(rng, total, 2, 80), randn(rng, total, 2, 80)
    # Offsets with gaps are not a cumsum of lengths: the segment table directly.
    seg = seqattn._core._Segments(np.array(offsets, np.int32), np.array(lens, np.int32),
                                  np.array(offsets, np.int32), np.array(lens, np.int32))
    plan = seqattn._core._plan(q.shape, k.shape, v.shape, seqattn.CausalMask(), seg, False, 2)
    out, lse = seqattn._core.attention_forward_f32(q, k, v, plan, float("nan"), 0.0, None, None)
    assert out.shape == (total, 4, 80) and lse.shape == (4, total)
    covered = np.zeros(total, bool)
    for o, n in zip(offsets, lens):
        covered[o:o + n] = True
        if n == 0:
            continue
        want_out, want_lse = O.attention(q[None, o:o + n], k[None, o:o + n], v[None, o:o + n], O.causal(n, n))
        check(out[o:o + n], lse[:, o:o + n], want_out[0], want_lse[0])
    assert np.all(out[~covered] == 0) and np.all(np.isneginf(lse[:, ~covered]))


def test_thd_from_cu_seqlens_segment_ids_and_packed_segments(rng):
    ids = np.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 2, 2]], np.int32)
    pos = np.array([[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]], np.int32)
    q, k, v = randn(rng, 12, 2, 16), randn(rng, 12, 2, 16), randn(rng, 12, 2, 16)
    packed = seqattn.pack_segments(seqattn.get_seqlens_and_offsets(ids, pos, "padding_causal", "thd",
                                                                   max_segments_per_seq=2))
    a = seqattn.attention(q, k, v, seqattn.CausalMask(), segments=packed)
    b = seqattn.attention(q, k, v, seqattn.CausalMask(), segment_ids=ids)  # [rows, S]: rows back to back
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    # Rows 0..4 as three cu_seqlens segments (no padding before token 5).
    c = seqattn.attention(q[:5], k[:5], v[:5], seqattn.CausalMask(), cu_seqlens=np.array([0, 3, 5]))
    np.testing.assert_array_equal(c[0], a[0][:5])
    # The same as the BSHD document mask over the packed rows.
    d_out, _ = seqattn.attention(q.reshape(2, 6, 2, 16), k.reshape(2, 6, 2, 16), v.reshape(2, 6, 2, 16),
                                 seqattn.CausalMask(), segment_ids=ids, positions=pos)
    np.testing.assert_allclose(d_out.reshape(12, 2, 16), a[0], atol=1e-6)


def test_bf16_storage(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = randn(rng, 2, 40, 2, 64), randn(rng, 2, 50, 1, 64), randn(rng, 2, 50, 1, 64)
    bf = [x.astype(ml_dtypes.bfloat16) for x in (q, k, v)]
    out, lse = seqattn.attention(*bf, seqattn.CausalMask("bottom_right"))
    assert out.dtype == ml_dtypes.bfloat16
    want_out, want_lse = O.attention(*[x.astype(np.float32) for x in bf], O.causal(40, 50, "bottom_right"))
    np.testing.assert_allclose(out.astype(np.float32), want_out, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3)


def test_strided_inputs_are_not_copied_and_agree(rng):
    qkv = randn(rng, 2, 30, 3, 4, 32)  # a packed QKV tensor: q/k/v are strided views
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out, lse = seqattn.attention(q, k, v, seqattn.CausalMask())
    ref_out, ref_lse = seqattn.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), seqattn.CausalMask())
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


def test_threads_give_identical_results_and_backward_matches_finite_differences(rng):
    q, k, v = randn(rng, 1, 20, 2, 16), randn(rng, 1, 20, 1, 16), randn(rng, 1, 20, 1, 16)
    mask = seqattn.SlidingWindowMask(5, 0)
    one = seqattn.attention(q, k, v, mask, threads=1)
    two = seqattn.attention(q, k, v, mask, threads=2)
    np.testing.assert_array_equal(one[0], two[0])
    out, lse = one
    dout = randn(rng, *out.shape)
    dq, dk, dv = seqattn.attention_backward(q, k, v, out, lse, dout, mask)
    # Loss = sum(out * dout); its gradient by central differences in float64 on the oracle.
    allowed = mask.to_dense(20)

    def loss(qq, kk, vv):
        return float((O.attention(qq, kk, vv, allowed)[0] * dout).sum())

    for grad, idx, which in [(dq, (0, 7, 1, 3), 0), (dk, (0, 4, 0, 9), 1), (dv, (0, 12, 0, 2), 2)]:
        args = [q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)]
        eps = 1e-4
        args[which][idx] += eps
        hi = loss(*args)
        args[which][idx] -= 2 * eps
        lo = loss(*args)
        assert abs(grad[idx] - (hi - lo) / (2 * eps)) < 2e-3, (which, idx)


def test_attention_errors_are_value_errors(rng):
    q, k, v = randn(rng, 1, 8, 4, 16), randn(rng, 1, 8, 3, 16), randn(rng, 1, 8, 3, 16)
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of key/value heads \(3\)"):
        seqattn.attention(q, k, v)
    with pytest.raises(ValueError, match="expected float32 or bfloat16"):
        seqattn.attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="mask must be a seqattn.Mask"):
        seqattn.attention(q, q, q, mask="causal")
    with pytest.raises(ValueError, match=r"attention: the segment ids have \(q 5, kv 5\) tokens per row but sequence 0 "
                                         r"of the inputs has \(q 8, kv 8\)"):
        seqattn.attention(q, q, q, segment_ids=np.ones((1, 5), np.int32))
    with pytest.raises(ValueError, match="give exactly one of segment_ids, cu_seqlens or segments"):
        seqattn.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match=r"SegmentTable: segment 1 covers query tokens \[4, 12\) outside \[0, 8\)"):
        seqattn.attention(q[0], q[0], q[0], cu_seqlens=np.array([0, 4, 12]))
    with pytest.raises(ValueError, match="threads must be >= 0"):
        seqattn.attention(q, q, q, threads=-1)


@pytest.mark.parametrize("threads", [2**32 + 1, 2**70])
def test_threads_beyond_int_range_are_value_errors(rng, threads):
    q = randn(rng, 1, 8, 2, 16)
    message = rf"attention: threads must be at most 4096 \(limits::kMaxThreads\), got {threads}"
    with pytest.raises(ValueError, match=message):
        seqattn.attention(q, q, q, threads=threads)
    with pytest.raises(ValueError, match=message):
        seqattn.attention_backward(q, q, q, q, np.zeros((1, 2, 8), np.float32), q, threads=threads)
