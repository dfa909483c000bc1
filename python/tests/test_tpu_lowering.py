"""The TPU lowering gate: every TPU kernel configuration the package builds is lowered with real Mosaic.

``jax.export.export(jax.jit(f), platforms=["tpu"])`` runs the TPU lowering of each ``pallas_call`` with
``interpret=False`` on this CPU machine: an in-kernel gather or any other construct Mosaic rejects fails here
as it would on a TPU (shown by a deliberately gathering kernel). Values are checked elsewhere (interpret mode:
test_splash.py, test_tpu_splash.py); nothing here runs.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # noqa: E402

import seqattn  # noqa: E402
from seqattn import splash, tpu  # noqa: E402

S = 1024


def export_for_tpu(fn, *args):
    exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
    text = exported.mlir_module()
    assert exported.platforms == ("tpu",)
    return text


def block_sizes(bq, bkv):
    return sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                         block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)


def static_masks():
    ids = np.repeat(np.arange(1, 6, dtype=np.int32), [300, 200, 224, 100, 200])
    tokens = np.array([5] * 200 + [0] + ([7] * 99 + [0]) * 8 + [9] * 23, np.int32)[:S]
    tokens[-1] = 0
    return {
        "causal": seqattn.CausalMask(),  # Splash computes it in the kernel (mask_function)
        "documents+window": seqattn.DocumentMask(ids[None], inner=seqattn.SlidingWindowMask(128, 0)),  # stored tiles
        "multi_item": seqattn.MultiItemMask([tokens], 0),
    }


# (dtype, head dim, q heads, kv heads, blocks): every dtype, head dim and head grouping at least once.
CONFIGS = [
    (jnp.bfloat16, 128, 4, 4, (512, 512)),
    (jnp.bfloat16, 64, 4, 1, (256, 512)),
    (jnp.float32, 256, 4, 2, (256, 256)),
    (jnp.float32, 128, 2, 2, (128, 128)),
]


def operands(dtype, d, hq, hkv, batch=()):
    return (jax.ShapeDtypeStruct(batch + (hq, S, d), dtype), jax.ShapeDtypeStruct(batch + (hkv, S, d), dtype),
            jax.ShapeDtypeStruct(batch + (hkv, S, d), dtype))


def loss_and_grads(attend):
    return jax.value_and_grad(lambda q, k, v, *rest: jnp.sum(attend(q, k, v, *rest).astype(jnp.float32)),
                              argnums=(0, 1, 2))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{jnp.dtype(c[0]).name}-d{c[1]}-{c[2]}x{c[3]}-{c[4]}")
@pytest.mark.parametrize("name", list(static_masks()))
def test_splash_with_static_seqattn_metadata_lowers(name, config):
    dtype, d, hq, hkv, blocks = config
    mask = static_masks()[name]
    kernel = splash.make_splash_kernel(mask, block_sizes(*blocks), q_len=S, heads=hq)
    text = export_for_tpu(loss_and_grads(kernel), *operands(dtype, d, hq, hkv))
    assert text.count("tpu_custom_call") == 3  # forward, dQ, dK/dV


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{jnp.dtype(c[0]).name}-d{c[1]}-{c[2]}x{c[3]}-{c[4]}")
def test_splash_with_traced_metadata_lowers(config):
    dtype, d, hq, hkv, blocks = config
    mask = seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.SlidingWindowMask(200, 0)] * (hq // 2))

    def attend(q, k, v, ids):
        return tpu.splash_attention(q, k, v, ids, mask=mask, block_sizes=block_sizes(*blocks))

    text = export_for_tpu(loss_and_grads(attend), *operands(dtype, d, hq, hkv, (2,)),
                          jax.ShapeDtypeStruct((2, S), jnp.int32))
    assert text.count("tpu_custom_call") == 3


def test_the_gate_catches_an_in_kernel_gather():
    """The seed-000 bug class: a kernel that indexes with a vector (a gather) cannot lower for TPU."""

    def gathering(ids_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + ids_ref[lax.iota(jnp.int32, 8)][0]

    def scalar(ids_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + ids_ref[3]

    def call(body):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i, ids: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, ids: (0, 0)))
        return lambda ids, x: pl.pallas_call(body, grid_spec=spec,
                                             out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(ids, x)

    args = (jax.ShapeDtypeStruct((16,), jnp.int32), jax.ShapeDtypeStruct((8, 128), jnp.float32))
    assert "tpu_custom_call" in export_for_tpu(call(scalar), *args)
    with pytest.raises(Exception, match="Cannot do int indexing on TPU"):
        export_for_tpu(call(gathering), *args)


def test_tokamax_static_and_traced_lower():
    tk = pytest.importorskip("tokamax._src.ops.experimental.tpu.splash_attention.splash_attention_kernel")
    config = tk.SplashConfig(block_q=256, block_kv=256, block_kv_compute=256, block_q_dkv=256, block_kv_dkv=256,
                             block_kv_dkv_compute=256)
    for name, mask in static_masks().items():
        kernel = splash.make_tokamax_kernel(mask, config, q_len=S)
        for dtype, d in ((jnp.bfloat16, 128), (jnp.float32, 64)):
            assert "tpu_custom_call" in export_for_tpu(loss_and_grads(kernel), *operands(dtype, d, 2, 2))

    def attend(q, k, v, ids):
        return tpu.splash_attention(q, k, v, ids, mask=seqattn.SlidingWindowMask(300, 0), block_sizes=config,
                                    implementation="tokamax")

    for dtype, d, hkv in ((jnp.bfloat16, 256, 1), (jnp.float32, 128, 2)):
        text = export_for_tpu(loss_and_grads(attend), *operands(dtype, d, 2, hkv, (2,)),
                              jax.ShapeDtypeStruct((2, S), jnp.int32))
        assert "tpu_custom_call" in text
