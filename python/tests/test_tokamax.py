"""seqattn.splash's tokamax ("Splash 2.0") export against tokamax's own _process_mask and kernel (interpret mode).

Every MaskInfo array (values and dtype) for the forward and the dK/dV pass, with the active-block grid and
the dense one, for every mask kind tokamax computes (its computable masks and NumpyMask) and kinds it lacks;
then tokamax's kernel run on seqattn's MaskInfo against a float64 reference, forward and gradients.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tokamax")
import jax.numpy as jnp  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as tk  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask as tm  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask_info as tmi  # noqa: E402

import oracles  # noqa: E402
import seqattn  # noqa: E402
from seqattn import splash  # noqa: E402

FIELDS = tmi.MaskInfo._fields


def assert_same_info(got, want, what):
    for field in FIELDS:
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None) == (w is None), f"{what} {field}: seqattn {g is None}, tokamax {w is None} (None?)"
        if w is None:
            continue
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{what} {field}: dtype {g.dtype} vs tokamax {w.dtype}"
        assert g.shape == w.shape, f"{what} {field}: shape {g.shape} vs tokamax {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what} {field}")


def cases():
    """(name, tokamax mask, seqattn mask, (q_len, kv_len))."""
    rng = np.random.default_rng(11)
    out = []
    for shape in ((256, 256), (128, 384), (384, 128)):
        q_len, kv_len = shape
        off = kv_len - q_len
        out += [
            ("full", tm.FullMask(shape), seqattn.FullMask()),
            ("causal", tm.CausalMask(shape), seqattn.CausalMask()),
            ("causal_bottom_right", tm.CausalMask(shape, offset=off), seqattn.CausalMask("bottom_right")),
            ("local_64_0", tm.LocalMask(shape, (64, 0), offset=0), seqattn.SlidingWindowMask(64, 0)),
            ("local_100_30_br", tm.LocalMask(shape, (100, 30), offset=off),
             seqattn.SlidingWindowMask(100, 30, "bottom_right")),
            ("local_none_16", tm.LocalMask(shape, (None, 16), offset=0), seqattn.SlidingWindowMask(-1, 16)),
            ("chunked_100", tm.ChunkedCausalMask(shape, 100), seqattn.ChunkedCausalMask(100)),
        ]
        dense = rng.random(shape) < 0.3
        out.append(("numpy_random", tm.NumpyMask(dense), seqattn.DenseMask(dense)))
        late = np.ones(shape, bool)
        late[:10, :7] = False  # one partial tile, then only full ones: mask_next wraps around to it
        out.append(("numpy_one_partial_first", tm.NumpyMask(late), seqattn.DenseMask(late)))
        if q_len == kv_len:
            ids = oracles.document_pattern(rng, q_len)
            inner = seqattn.SlidingWindowMask(40, 0)
            ours = seqattn.DocumentMask(ids[None, :], inner=inner)
            out.append(("documents_window", tm.NumpyMask(np.asarray(ours.to_dense(q_len, kv_len))[0, 0]), ours))
            prefix = seqattn.PrefixLMMask(70)
            out.append(("prefix_lm", tm.NumpyMask(np.asarray(prefix.to_dense(q_len, kv_len))[0, 0]), prefix))
    return [(name, theirs, ours, theirs.shape) for name, theirs, ours in out]


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[3][0]}x{c[3][1]}" for c in CASES])
@pytest.mark.parametrize("is_dkv", [False, True], ids=["fwd", "dkv"])
def test_mask_info_matches_tokamax_process_mask(case, is_dkv):
    name, theirs, ours, (q_len, kv_len) = case
    for block in ((128, 128), (64, 128), (128, 64)):
        for dynamic in (True, False):
            for downcast in (True, False):
                kw = dict(downcast_smem_data=downcast, return_dynamic_grid=dynamic)
                want, want_fn = tmi._process_mask(theirs, block, is_dkv, **kw)
                got, got_fn = splash.tokamax_mask_info(ours, block, is_dkv, q_len=q_len, kv_len=kv_len, **kw)
                assert_same_info(got, want, f"{name} {block} {kw}")
                assert (got_fn is None) == (want_fn is None), name
                if want_fn is not None:
                    qi, ki = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
                    np.testing.assert_array_equal(got_fn(qi, ki), want_fn(qi, ki))


def test_a_mask_with_several_heads_is_refused():
    with pytest.raises(ValueError, match="one mask for every head.*2 heads"):
        splash.tokamax_mask_info(seqattn.PerHeadMask([seqattn.CausalMask()] * 2), (128, 128), q_len=256)


@pytest.mark.parametrize("name", ["causal", "documents_window", "prefix_lm"])
def test_tokamax_kernel_runs_on_seqattn_mask_info(name):
    """tokamax's kernel in interpret mode on seqattn's MaskInfo (computed and stored partial tiles), forward
    and gradients against float64; tokamax does not scale the logits, so the reference uses scale 1."""
    _, _, ours, (s, _) = next(c for c in CASES if c[0] == name and c[3] == (256, 256))
    heads, d = 2, 128
    config = tk.SplashConfig(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128, block_kv_dkv=128,
                             block_kv_dkv_compute=128, interpret=True)
    kernel = splash.make_tokamax_kernel(ours, config, q_len=s)
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    q = jax.random.normal(keys[0], (heads, s, d), jnp.float32) * 0.3
    k, v, w = (jax.random.normal(kk, (heads, s, d), jnp.float32) for kk in keys[1:])
    out, grads = jax.value_and_grad(lambda q, k, v: jnp.sum(kernel(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    allowed = np.asarray(ours.to_dense(s, s))[0]  # [1, S, S]
    bshd = lambda x: np.swapaxes(np.asarray(x, np.float64), 0, 1)[None]  # noqa: E731
    ref, _ = oracles.attention(bshd(q), bshd(k), bshd(v), allowed[None], scale=1.0)
    dq, dk, dv = oracles.attention_grads(bshd(q), bshd(k), bshd(v), allowed[None], bshd(w), scale=1.0)
    np.testing.assert_allclose(float(out), float(np.sum(ref * bshd(w))), rtol=1e-4)
    for got, want, what in ((grads[0], dq, "dq"), (grads[1], dk, "dk"), (grads[2], dv, "dv")):
        np.testing.assert_allclose(bshd(got), want, atol=2e-3, rtol=2e-3, err_msg=what)
