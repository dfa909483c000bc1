"""seqattn.plan: plan once, run many times; THD segment ids parsed by the engine's one parser."""

import numpy as np
import pytest

import seqattn
import oracles as O


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_a_plan_runs_like_the_one_call_api_forward_and_backward(rng):
    b, sq, skv, hq, hkv, d = 2, 77, 90, 4, 2, 72
    q, k, v = randn(rng, b, sq, hq, d), randn(rng, b, skv, hkv, d), randn(rng, b, skv, hkv, 40)
    mask = seqattn.CausalMask("bottom_right") & seqattn.SlidingWindowMask(30, 0)
    p = seqattn.plan(q.shape, k.shape, v.shape, mask, backward=True, threads=2)
    assert p.backward and p.threads == 2
    assert "BSHD, 2 sequences of (q 77, kv 90), 4 heads over 2 kv heads, dk 72, dv 40" in repr(p)
    for _ in range(2):  # new values, the same plan
        q, k, v = randn(rng, b, sq, hq, d), randn(rng, b, skv, hkv, d), randn(rng, b, skv, hkv, 40)
        out, lse = seqattn.attention(q, k, v, plan=p)
        assert_same((out, lse), seqattn.attention(q, k, v, mask, threads=2))
        want_out, want_lse = O.attention(q, k, v, mask.to_dense(sq, skv, batch=b))
        np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=1e-4)
        dout = randn(rng, *out.shape)
        grads = seqattn.attention_backward(q, k, v, out, lse, dout, plan=p)
        assert_same(grads, seqattn.attention_backward(q, k, v, out, lse, dout, mask, threads=2))
        assert_same(grads, seqattn.attention_backward(q, k, v, out, lse, dout, plan=p, threads=1))


def test_plans_with_segment_ids_and_thd_segments(rng):
    ids = np.array([[1, 1, 1, 2, 2, 0, 3], [1, 2, 2, 2, 2, 2, 2]], np.int32)
    q, k, v = randn(rng, 2, 7, 2, 16), randn(rng, 2, 7, 2, 16), randn(rng, 2, 7, 2, 16)
    p = seqattn.plan(q, k, v, seqattn.CausalMask(), segment_ids=ids)
    assert not p.backward
    assert_same(seqattn.attention(q, k, v, plan=p), seqattn.attention(q, k, v, seqattn.CausalMask(), segment_ids=ids))
    flat = [x.reshape(14, 2, 16) for x in (q, k, v)]
    cu = np.array([0, 3, 5, 8, 14], np.int32)
    p = seqattn.plan(*flat, seqattn.CausalMask(), cu_seqlens=cu, backward=True)
    out, lse = seqattn.attention(*flat, plan=p)
    assert_same((out, lse), seqattn.attention(*flat, seqattn.CausalMask(), cu_seqlens=cu))
    dout = randn(rng, *out.shape)
    assert_same(seqattn.attention_backward(*flat, out, lse, dout, plan=p),
                seqattn.attention_backward(*flat, out, lse, dout, seqattn.CausalMask(), cu_seqlens=cu))


def test_plan_errors_name_the_plan_and_the_inputs(rng):
    q = randn(rng, 1, 8, 2, 16)
    p = seqattn.plan(q, q, q, seqattn.CausalMask())
    with pytest.raises(ValueError, match=r"attention: the plan was made for BSHD, 1 sequence of \(q 8, kv 8\).* but "
                                         r"the inputs are BSHD, 1 sequence of \(q 9, kv 9\)"):
        r = randn(rng, 1, 9, 2, 16)
        seqattn.attention(r, r, r, plan=p)
    with pytest.raises(ValueError, match="the plan already holds the mask and the segments; got mask"):
        seqattn.attention(q, q, q, seqattn.CausalMask(), segment_ids=np.ones((1, 8), np.int32), plan=p)
    held = seqattn.plan(q, q, q, seqattn.CausalMask(), segment_ids=np.ones((1, 8), np.int32))
    with pytest.raises(ValueError, match=r"the plan already holds segment ids \(seqattn.plan\(..., segment_ids=\)\)"):
        seqattn.attention(q, q, q, segment_ids=np.ones((1, 8), np.int32), plan=held)
    with pytest.raises(ValueError, match=r"attention: the segment ids have 2 rows but the inputs have batch 1"):
        seqattn.attention(q, q, q, segment_ids=np.ones((2, 8), np.int32), plan=p)
    with pytest.raises(ValueError, match=r"\(q 7, kv 7\) tokens per row but sequence 0 of the inputs has "
                                         r"\(q 8, kv 8\)"):
        seqattn.attention(q, q, q, segment_ids=np.ones((1, 7), np.int32), plan=p)
    with pytest.raises(ValueError, match=r"is negative"):
        seqattn.attention(q, q, q, segment_ids=np.array([[1, 1, -2, 2, 2, 2, 2, 2]], np.int32), plan=p)
    with pytest.raises(ValueError, match="positions given without segment_ids"):
        seqattn.attention(q, q, q, positions=np.zeros((1, 8), np.int32), plan=p)
    with pytest.raises(ValueError, match="plan must be a seqattn.Plan"):
        seqattn.attention(q, q, q, plan="causal")
    with pytest.raises(ValueError, match=r"the plan was made for the BSHD layout \(q of rank 4\), got q of shape"):
        seqattn.attention(q[0], q[0], q[0], plan=p)
    out, lse = seqattn.attention(q, q, q, plan=p)
    with pytest.raises(ValueError, match=r"forward pass only; make it with seqattn.plan\(..., backward=True\)"):
        seqattn.attention_backward(q, q, q, out, lse, out, plan=p)
    with pytest.raises(ValueError, match="plan: q must be an array or a shape"):
        seqattn.plan(None, q, q)
    with pytest.raises(ValueError, match=r"query heads \(2\) must be a multiple of key/value heads \(3\)"):
        seqattn.plan((1, 8, 2, 16), (1, 8, 3, 16), (1, 8, 3, 16))
    with pytest.raises(ValueError, match="threads must be >= 0"):
        seqattn.plan(q, q, q, threads=-1)


def test_thd_segment_ids_rows_and_the_parsers_rules(rng):
    ids = np.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 2, 2]], np.int32)
    q, k, v = randn(rng, 12, 2, 16), randn(rng, 12, 2, 16), randn(rng, 12, 2, 16)
    rows = seqattn.attention(q, k, v, seqattn.CausalMask(), segment_ids=ids)
    cu = seqattn.attention(q, k, v, seqattn.CausalMask(), cu_seqlens=np.array([0, 3, 5, 5, 6, 6, 7, 12]))
    # Token 5 is padding in the ids (0 / -inf) and an empty-looking gap is a
    # segment of its own in cu_seqlens: compare the covered tokens.
    covered = ids.reshape(-1) != 0
    np.testing.assert_array_equal(rows[0][covered], cu[0][covered])
    assert np.all(rows[0][~covered] == 0) and np.all(np.isneginf(rows[1][:, ~covered]))
    # Flattened, id 1 comes back after its run ended: rule R4 of the one parser.
    with pytest.raises(ValueError, match=r"segment_ids row 0 of shape \(1, 12\): segment 1 is not one contiguous run "
                                         r"\(tokens 0 and 6\)"):
        seqattn.attention(q, k, v, segment_ids=ids.reshape(-1))
    with pytest.raises(ValueError, match=r"segment_ids\[0, 2\] = -3 is negative"):
        seqattn.attention(q, k, v, segment_ids=np.array([1, 1, -3] + [2] * 9, np.int32))
    with pytest.raises(ValueError, match=r"must list the same segments in the same order, got \[1, 2\] and \[2, 1\] "
                                         r"in row 0"):
        seqattn.attention(q, k, v, segment_ids=np.array([1] * 6 + [2] * 6, np.int32),
                          kv_segment_ids=np.array([2] * 6 + [1] * 6, np.int32))
    with pytest.raises(ValueError, match=r"THD segment_ids must have one id per token, as \[T\] or \[rows, S\] with "
                                         r"rows \* S = T = 12, got shape \(3, 5\)"):
        seqattn.attention(q, k, v, segment_ids=np.ones((3, 5), np.int32))


def document_ids(rng, batch, n, gaps):
    """[batch, n] ids of packed documents (random lengths), padding runs between some when ``gaps``."""
    ids = np.zeros((batch, n), np.int32)
    for b in range(batch):
        t, doc = 0, 1
        while t < n:
            length = int(rng.integers(1, n // 3 + 2))
            if not (gaps and rng.random() < 0.25):
                ids[b, t:t + length] = doc
                doc += 1
            t += length
    return ids


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_segment_ids_per_call_refine_the_plan_of_the_mask(rng, dtype):
    """plan(mask) once, then each call's ids: the document mask of those ids, forward and backward."""
    b, s, hq, hkv, d = 2, 150, 4, 2, 72
    masks = [seqattn.CausalMask(), seqattn.SlidingWindowMask(20, 3), seqattn.FullMask(),
             seqattn.CausalMask() & ~seqattn.SlidingWindowMask(4, 0),
             seqattn.PrefixLMMask(9)]  # the last plans the document mask of each call's ids
    for mask in masks:
        p = seqattn.plan((b, s, hq, d), (b, s, hkv, d), (b, s, hkv, d), mask, backward=True, threads=2)
        for gaps in (False, True):
            ids = document_ids(rng, b, s, gaps)
            q, k, v, dout = randn(rng, b, s, hq, d), randn(rng, b, s, hkv, d), randn(rng, b, s, hkv, d), \
                randn(rng, b, s, hq, d)
            if dtype == "bf16":
                import ml_dtypes
                q, k, v, dout = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v, dout))
            out, lse = seqattn.attention(q, k, v, plan=p, segment_ids=ids)
            allowed = seqattn.DocumentMask(ids, None, mask).to_dense()
            f64 = [np.asarray(x, np.float64) for x in (q, k, v, dout)]
            want_out, want_lse = O.attention(*f64[:3], allowed)
            tol = dict(atol=2e-5, rtol=1e-4) if dtype == "f32" else dict(atol=3e-2, rtol=3e-2)
            np.testing.assert_allclose(np.asarray(out, np.float64), want_out, **tol)
            np.testing.assert_allclose(lse, want_lse, **tol)
            # The one-call API takes the same route: bitwise the same.
            assert_same((out, lse), seqattn.attention(q, k, v, mask, segment_ids=ids, threads=2))
            grads = seqattn.attention_backward(q, k, v, out, lse, dout, plan=p, segment_ids=ids)
            want = O.attention_grads(*f64[:3], allowed, f64[3])
            gtol = dict(atol=1e-4, rtol=1e-3) if dtype == "f32" else dict(atol=6e-2, rtol=6e-2)
            for g, w in zip(grads, want):
                np.testing.assert_allclose(np.asarray(g, np.float64), w, **gtol)
            assert_same(grads, seqattn.attention_backward(q, k, v, out, lse, dout, plan=p, segment_ids=ids,
                                                          threads=1))
