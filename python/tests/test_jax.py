import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import seqattn  # noqa: E402
import seqattn.jax as sj  # noqa: E402

if not seqattn._core.has_xla_ffi:
    pytest.fail("seqattn was built without the XLA FFI handlers although jax is installed", pytrace=False)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def reference(q, k, v, allowed):
    """jax.nn.dot_product_attention with a dense mask [B, 1 or H, Sq, Skv] (BTNH layout, GQA)."""
    return jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(allowed), implementation="xla")


@pytest.mark.parametrize("head_dim", [32, 72, 80])
def test_jit_matches_dot_product_attention(rng, head_dim):
    q, k, v = randn(rng, 2, 37, 4, head_dim), randn(rng, 2, 45, 2, head_dim), randn(rng, 2, 45, 2, head_dim)
    for mask in [None, seqattn.CausalMask("bottom_right"), seqattn.SlidingWindowMask(6, 2)]:
        fn = jax.jit(lambda q, k, v, mask=mask: sj.attention(q, k, v, mask))
        out = fn(q, k, v)
        allowed = (mask or seqattn.FullMask()).to_dense(37, 45, batch=2)
        np.testing.assert_allclose(out, reference(q, k, v, allowed), atol=2e-5, rtol=1e-4)


def test_segment_ids_and_positions_traced(rng):
    ids = np.array([[1, 1, 1, 2, 2, 2, 2, 3], [1, 1, 2, 2, 2, 2, 2, 2]], np.int32)
    pos = np.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 1, 2, 3, 4, 5]], np.int32)
    q, k, v = randn(rng, 2, 8, 2, 16), randn(rng, 2, 8, 2, 16), randn(rng, 2, 8, 2, 16)
    fn = jax.jit(lambda q, k, v, i, p: sj.attention(q, k, v, seqattn.CausalMask(), segment_ids=i, positions=p))
    out = fn(q, k, v, ids, pos)
    allowed = seqattn.DocumentMask(ids, pos, seqattn.CausalMask()).to_dense()
    np.testing.assert_allclose(out, reference(q, k, v, allowed), atol=2e-5)
    # Other ids, same compiled function: the ids are data, not part of the computation.
    ids2 = np.array([[1] * 8, [1, 1, 1, 1, 2, 2, 2, 2]], np.int32)
    pos2 = np.array([list(range(8)), [0, 1, 2, 3, 0, 1, 2, 3]], np.int32)
    out2 = fn(q, k, v, ids2, pos2)
    allowed2 = seqattn.DocumentMask(ids2, pos2, seqattn.CausalMask()).to_dense()
    np.testing.assert_allclose(out2, reference(q, k, v, allowed2), atol=2e-5)


def test_a_jitted_step_plans_once_per_shape_pass_and_ids(rng):
    mask = seqattn.CausalMask() & seqattn.SlidingWindowMask(5, 0)  # a mask no other test registers
    step = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(sj.attention(q, k, v, mask) ** 2), argnums=(0, 1, 2)))
    plans, hits = seqattn._core._ffi_plan_cache_stats()
    results = []
    for _ in range(3):  # new values each step, the same shapes
        q, k, v = randn(rng, 2, 19, 2, 16), randn(rng, 2, 19, 2, 16), randn(rng, 2, 19, 2, 16)
        results.append((jax.block_until_ready(step(q, k, v)), (q, k, v)))
    plans_after, hits_after = seqattn._core._ffi_plan_cache_stats()
    assert plans_after - plans == 2  # the forward plan and the backward one, each made once
    assert hits_after - hits == 4
    # The cached plans give what a fresh one-call run gives.
    (loss, grads), (q, k, v) = results[-1]
    out = seqattn.attention(np.asarray(q), np.asarray(k), np.asarray(v), mask, threads=0)[0]
    np.testing.assert_allclose(loss, np.sum(out.astype(np.float64) ** 2), rtol=1e-5)
    # With segment ids: the mask's plan, refined by each call's ids (nothing planned); a mask that knows where a
    # sequence starts (prefix-LM) sees each document's positions: planned once per distinct ids instead.
    first = np.array([[1] * 10 + [2] * 9, [1] * 19], np.int32)
    second = np.array([[1] * 4 + [2] * 15, [1] * 19], np.int32)
    prefix = seqattn.PrefixLMMask(3)
    for m, counts in ((mask, (0, 0, 0)), (prefix, (1, 0, 1))):
        fn = jax.jit(lambda q, k, v, i, m=m: sj.attention(q, k, v, m, segment_ids=i))
        jax.block_until_ready(fn(q, k, v, np.zeros_like(first)))  # the static plan, and a plan over padding ids
        for ids, new_plans in zip((first, first, second), counts):
            before = seqattn._core._ffi_plan_cache_stats()[0]
            out = jax.block_until_ready(fn(q, k, v, ids))
            assert seqattn._core._ffi_plan_cache_stats()[0] - before == new_plans
            want = seqattn.attention(*(np.asarray(x) for x in (q, k, v)), m, segment_ids=ids, threads=0)[0]
            np.testing.assert_array_equal(np.asarray(out), want)
            allowed = seqattn.DocumentMask(ids, None, m).to_dense()
            np.testing.assert_allclose(np.asarray(out), reference(q, k, v, allowed), atol=2e-5)


def test_fully_masked_rows_are_zero(rng):
    ids = np.array([[1, 1, 0, 0, 2, 2]], np.int32)
    q = randn(rng, 1, 6, 2, 8)
    out = jax.jit(lambda q, i: sj.attention(q, q, q, segment_ids=i))(q, ids)
    assert np.all(np.asarray(out)[0, 2:4] == 0)
    allowed = seqattn.DocumentMask(ids).to_dense()
    keep = ids[0] != 0
    np.testing.assert_allclose(np.asarray(out)[:, keep], np.asarray(reference(q, q, q, allowed))[:, keep], atol=2e-5)


def test_vmap(rng):
    q, k, v = randn(rng, 3, 2, 20, 2, 16), randn(rng, 3, 2, 20, 1, 16), randn(rng, 3, 2, 20, 1, 16)
    mask = seqattn.CausalMask()
    batched = jax.jit(jax.vmap(lambda q, k, v: sj.attention(q, k, v, mask)))(q, k, v)
    for i in range(3):
        np.testing.assert_allclose(batched[i], sj.attention(q[i], k[i], v[i], mask), atol=1e-6)
    # Unbatched k/v (in_axes None) are broadcast.
    half = jax.vmap(lambda q: sj.attention(q, k[0], v[0], mask))(q)
    np.testing.assert_allclose(half[1], sj.attention(q[1], k[0], v[0], mask), atol=1e-6)


def test_grad_matches_dot_product_attention(rng):
    q, k, v = randn(rng, 2, 24, 4, 32), randn(rng, 2, 24, 2, 32), randn(rng, 2, 24, 2, 32)
    w = randn(rng, 2, 24, 4, 32)
    mask = seqattn.CausalMask() & seqattn.SlidingWindowMask(7, 0)
    allowed = mask.to_dense(24, batch=2)

    def ours(q, k, v):
        return jnp.sum(sj.attention(q, k, v, mask) * w)

    def theirs(q, k, v):
        return jnp.sum(reference(q, k, v, allowed) * w)

    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(theirs, argnums=(0, 1, 2))(q, k, v)
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, atol=1e-4, rtol=1e-3)


def test_bf16_and_lse(rng):
    q = jnp.asarray(randn(rng, 1, 16, 2, 32), jnp.bfloat16)
    out, lse = sj.attention(q, q, q, seqattn.CausalMask(), return_lse=True)
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32 and lse.shape == (1, 2, 16)
    ref_out, ref_lse = seqattn.attention(np.asarray(q), np.asarray(q), np.asarray(q), seqattn.CausalMask())
    np.testing.assert_array_equal(np.asarray(out).view(np.uint16), ref_out.view(np.uint16))
    np.testing.assert_array_equal(np.asarray(lse), ref_lse)


def test_errors(rng):
    q = randn(rng, 1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"segment_ids must have shape \(1, 8\)"):
        sj.attention(q, q, q, segment_ids=np.ones((1, 7), np.int32))
    with pytest.raises(ValueError, match="all be float32 or all bfloat16"):
        sj.attention(q.astype(np.float16), q, q)
    with pytest.raises(ValueError, match="mask must be a seqattn.Mask"):
        sj.attention(q, q, q, "causal")
    with pytest.raises(Exception, match="is not one contiguous run"):
        jax.block_until_ready(sj.attention(q, q, q, segment_ids=np.array([[1, 2, 1, 1, 1, 1, 1, 1]], np.int32)))


def test_int64_segment_ids_are_range_checked_not_truncated(rng):
    q = randn(rng, 1, 4, 1, 8)
    # 1 and 2^32 + 1 are different documents: truncated to int32 they would be one.
    ids = np.array([[1, 1, 2**32 + 1, 2**32 + 1]], np.int64)
    with pytest.raises(ValueError, match=r"segment_ids: values in \[1, 4294967297\] do not fit int32"):
        sj.attention(q, q, q, segment_ids=ids)
    with pytest.raises(ValueError, match=r"positions: values in \[-4294967296, 0\] do not fit int32"):
        sj.attention(q, q, q, segment_ids=np.ones((1, 4), np.int32),
                     positions=np.array([[0, 0, 0, -(2**32)]], np.int64))
    # Values that fit are converted exactly.
    got = sj.attention(q, q, q, segment_ids=np.array([[1, 1, 2, 2]], np.int64))
    np.testing.assert_array_equal(got, sj.attention(q, q, q, segment_ids=np.array([[1, 1, 2, 2]], np.int32)))


def test_wide_traced_segment_ids_are_refused_at_trace_time(rng):
    q = randn(rng, 1, 4, 1, 8)
    with jax.enable_x64(True):
        fn = jax.jit(lambda q, i: sj.attention(q, q, q, segment_ids=i))
        with pytest.raises(ValueError, match="segment_ids: int64 ids inside jit cannot be range-checked"):
            fn(q, np.array([[1, 1, 2**32 + 1, 2**32 + 1]], np.int64))


@pytest.mark.parametrize("threads", [2**32 + 1, -1, 4097, 2**70])
def test_threads_out_of_range(rng, threads):
    q = randn(rng, 1, 4, 1, 8)
    with pytest.raises(ValueError, match=f"attention: threads must be .*got {threads}"):
        sj.attention(q, q, q, threads=threads)


@pytest.mark.parametrize(
    "case, message",
    [
        ("heads", r"attention: query heads \(1\) must be a multiple of key/value heads \(2\)"),
        ("scale", "attention: scale must be finite, got inf"),
        ("softcap", r"attention: softcap must be finite and >= 0 \(0 disables it\), got -1"),
        ("threads", r"attention: threads must be at most 4096 \(limits::kMaxThreads\), got 5000"),
        ("mask", r"DenseMask: sequence 0 has lengths \(4, 4\) but values have shape \(3, 3\)"),
    ],
)
def test_engine_errors_under_jit_are_value_errors_at_trace_time(rng, case, message):
    q, kv = randn(rng, 1, 4, 1, 8), randn(rng, 1, 4, 2, 8)
    k = kv if case == "heads" else q
    kw = {"scale": {"scale": float("inf")}, "softcap": {"softcap": -1.0}, "threads": {"threads": 5000}}.get(case, {})
    mask = seqattn.DenseMask(np.ones((3, 3), bool)) if case == "mask" else None
    fn = jax.jit(lambda q, k: sj.attention(q, k, k, mask, **kw))
    with pytest.raises(ValueError, match=message):
        fn(q, k)


@pytest.mark.parametrize(
    "case, message",
    [
        # kv_segment_ids default to segment_ids: keys longer than the queries cannot have them.
        ("kv_ids_default", r"DocumentMask: sequence 0 has lengths \(4, 6\) but the segment ids have T_q=4, T_kv=4"),
        # kv_positions default to positions: the same, for the positions.
        ("kv_positions_default", r"DocumentLayout: kv_segment_pos trailing shape must match kv_segment_ids"),
        # The mask inside the document mask is checked against the lengths too.
        ("inner_mask", r"DenseMask: sequence 0 has lengths \(4, 6\) but values have shape \(3, 3\)"),
        # A mask of 3 sequences for a batch of 2: no vmap can make the batches agree.
        ("mask_batch", r"DocumentMask: the layout has 3 rows .* but the batch has 2"),
    ],
)
def test_segment_and_mask_mismatches_are_value_errors_at_trace_time(rng, case, message):
    batch = 2 if case == "mask_batch" else 1
    q, k = randn(rng, batch, 4, 1, 8), randn(rng, batch, 6, 1, 8)
    ids, kv_ids = np.ones((batch, 4), np.int32), np.ones((batch, 6), np.int32)
    mask, kw = None, {"segment_ids": ids}
    if case == "kv_positions_default":
        kw.update(kv_segment_ids=kv_ids, positions=np.arange(4, dtype=np.int32)[None])
    elif case == "inner_mask":
        mask = seqattn.DenseMask(np.ones((3, 3), bool))
        kw["kv_segment_ids"] = kv_ids
    elif case == "mask_batch":
        mask = seqattn.DocumentMask(np.ones((3, 4), np.int32), kv_segment_ids=np.ones((3, 6), np.int32))
        kw = {}
    fn = jax.jit(lambda q, k: sj.attention(q, k, k, mask, **kw))
    with pytest.raises(ValueError, match=message):
        fn(q, k)
    with pytest.raises(ValueError, match=message):  # and without jit
        sj.attention(q, k, k, mask, **kw)


def test_masks_with_their_own_batch_under_vmap_are_not_refused_while_tracing(rng):
    # Under vmap the engine sees the vmapped dims folded into the batch: a mask
    # of 2 sequences fits a traced batch of 1 vmapped twice.
    q = randn(rng, 2, 1, 4, 1, 8)
    ids = np.array([[1, 1, 2, 2], [1, 1, 1, 1]], np.int32)
    doc = seqattn.DocumentMask(ids)
    prefix = seqattn.PrefixLMMask(np.array([1, 3], np.int32))
    for mask, kw in [(doc, {}), (prefix, {"segment_ids": np.ones((1, 4), np.int32)}), (prefix, {})]:
        got = jax.jit(jax.vmap(lambda q: sj.attention(q, q, q, mask, **kw)))(q)
        allowed = mask.to_dense() if mask is doc else mask.to_dense(4, 4, batch=2)
        for i in range(2):
            np.testing.assert_allclose(got[i], reference(q[i], q[i], q[i], allowed[i:i + 1]), atol=2e-5)


def test_an_eager_call_checks_a_masks_own_batch_exactly(rng):
    # Called on concrete arrays no vmap can enlarge the batch, so a mask of 2
    # sequences for a batch of 1 is a ValueError, not the compiled call's
    # JaxRuntimeError (found by the atheris target).
    q = randn(rng, 1, 4, 1, 8)
    prefix = seqattn.PrefixLMMask(np.array([1, 3], np.int32))
    with pytest.raises(ValueError, match=r"PrefixLMMask: prefix_lengths has shape \(2,\) but the batch has 1"):
        sj.attention(q, q, q, prefix)


def test_malformed_concrete_segment_ids_are_value_errors(rng):
    # Ids known while tracing (NumPy arrays, or JAX arrays outside jit) are
    # checked then; only traced ids reach the engine unchecked.
    q = randn(rng, 1, 5, 1, 8)
    ids = np.array([[1, 2, 2, 1, 3]], np.int32)
    with pytest.raises(ValueError, match=r"q_segment_ids row 0 of shape \(1, 5\): segment 1 is not one contiguous run"):
        sj.attention(q, q, q, segment_ids=ids)
    with pytest.raises(ValueError, match=r"segment 1 is not one contiguous run"):
        jax.jit(lambda q: sj.attention(q, q, q, segment_ids=ids))(q)
    with pytest.raises(ValueError, match=r"kv_segment_pos\[0, 0\] = -4 is negative"):
        sj.attention(q, q, q, segment_ids=np.ones((1, 5), np.int32), kv_segment_ids=np.ones((1, 5), np.int32),
                     kv_positions=np.array([[-4, -3, -2, -1, 0]], np.int32))
    with pytest.raises(Exception, match="is not one contiguous run"):
        jax.block_until_ready(jax.jit(lambda q, i: sj.attention(q, q, q, segment_ids=i))(q, ids))


def test_the_installed_jaxlib_implements_the_ffi_api_seqattn_was_built_against():
    runtime = sj._runtime_ffi_api_version()
    assert runtime is not None, "could not read XLA_FFI_API_MAJOR / MINOR from jaxlib's c_api.h"
    built = seqattn._core.xla_ffi_api_version
    assert runtime[0] == built[0] and runtime[1] >= built[1]
    sj._check_ffi_api(built, runtime)


@pytest.mark.parametrize("built,runtime", [((0, 3), (0, 3)), ((0, 3), (0, 4)), ((0, 1), (0, 3))])
def test_ffi_api_check_accepts_a_runtime_at_least_as_new(built, runtime):
    sj._check_ffi_api(built, runtime, "0.10.2")


@pytest.mark.parametrize(
    "built,runtime,message",
    [((0, 3), (0, 2), "FFI API 0.3 \\(jaxlib 0.10.2\\).*FFI API 0.2, which is older; upgrade jax"),
     ((1, 0), (0, 9), "FFI API 1.0.*FFI API 0.9, which is older"),
     ((0, 3), (1, 0), "incompatible major version")],
)
def test_ffi_api_check_refuses_an_older_or_incompatible_runtime(built, runtime, message):
    with pytest.raises(ImportError, match=message):
        sj._check_ffi_api(built, runtime, "0.10.2")


def test_ffi_api_check_is_silent_when_a_version_is_unknown():
    sj._check_ffi_api(None, (0, 3))
    sj._check_ffi_api((0, 3), None)
